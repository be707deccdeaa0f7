// run_log.h: a training run's logs, main.log (llm.c's format) and main.jsonl
// (header-only host C++; the trainer writes them on rank 0 into -o).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/error.h"
#include "llmc/formats/regular_file.h"

// One log file, appended to record by record. A record reaches the file in one
// write(), whole, or not at all (a short write is cut back off), so neither a
// kill nor a full disk tears a line. A record that cannot be written (ENOSPC,
// EIO, a file-size limit) is kept and written, in order, before the next one
// when the disk has room again; the first failure is one warning line, and
// records still unwritten when the run ends are its error. The file is opened
// as every file a run writes (open_regular_file_for_writing): not through a
// symbolic link, only if it is a regular file, never waiting on a FIFO.
class LogFile {
  public:
    void open(const std::string& path, bool append) {
        path_ = path;
        std::string why;
        fd_ = open_regular_file_for_writing(path.c_str(), O_WRONLY | O_APPEND | (append ? 0 : O_TRUNC), &why);
        if (fd_ < 0) refuse(path, why);
    }
    [[noreturn]] static void refuse(const std::string& path, const std::string& why) {
        llmc::fail(path + ": " + why + " (cannot write the run's log there)");
    }
    void write(std::string record) {
        if (fd_ < 0) return;
        if (pending_.size() < MAX_PENDING) pending_.push_back(std::move(record));
        else dropped_++;
        flush();
    }
    // Writes what is pending; throws when records are left unwritten.
    void close() {
        if (fd_ < 0) return;
        flush();
        ::close(fd_);
        fd_ = -1;
        if (!pending_.empty() || dropped_ > 0)
            llmc::failf("%s: %zu record(s) could not be written (%s); the checkpoints are not affected", path_.c_str(),
                        pending_.size() + dropped_, strerror(errno_));
    }

  private:
    static constexpr size_t MAX_PENDING = 1 << 16;  // records held for a full disk (a few MB)
    void flush() {
        while (!pending_.empty()) {
            const std::string& r = pending_.front();
            struct stat st;
            const off_t before = fstat(fd_, &st) == 0 ? st.st_size : -1;
            const ssize_t n = ::write(fd_, r.data(), r.size());
            if (n == (ssize_t)r.size()) {
                pending_.pop_front();
                continue;
            }
            errno_ = n < 0 ? errno : ENOSPC;  // (a short write is a full disk or a size limit)
            if (n > 0 && before >= 0 && ftruncate(fd_, before) != 0) {
                // the torn piece stays: end it, so the next record starts a line of its own
                if (::write(fd_, "\n", 1) != 1) {}
            }
            if (!warned_)
                fprintf(stderr, "warning: %s: cannot write (%s); its records are kept and written once it can be\n",
                        path_.c_str(), strerror(errno_));
            warned_ = true;
            return;
        }
    }
    std::string path_;
    int fd_ = -1;
    std::deque<std::string> pending_;
    size_t dropped_ = 0;
    int errno_ = 0;
    bool warned_ = false;
};

// main.log (llm.c's format) and main.jsonl (one object per event), rank 0,
// through LogFile. A resume from step S first cuts both back to what came
// before S's evaluation: the steps up to S and the evaluations before S (the
// run logs S's evaluation again), and drops a last line without its newline.
struct RunLog {
    LogFile log, jsonl;
    void open(const char* dir, int resumed_step) {
        for (auto [file, name] : {std::pair<LogFile*, const char*>{&log, "main.log"}, {&jsonl, "main.jsonl"}}) {
            const std::string path = std::string(dir) + "/" + name;
            if (resumed_step >= 0) cut_back(path, resumed_step);
            file->open(path, resumed_step >= 0);
        }
    }
    void close() {
        log.close();
        jsonl.close();
    }
    // An evaluation after `step` steps: main.log "s:<step> <tag>:<value>",
    // main.jsonl {"step": step, "<key>": value}.
    void record(int step, const char* tag, const char* key, double value) {
        log.write(format("s:%d %s:%f\n", step, tag, value));
        jsonl.write(format("{\"step\": %d, \"%s\": %.9g}\n", step, key, value));
    }
    // The training record of step step + 1 (of 1..steps, as stdout numbers it;
    // main.log keeps llm.c's numbering from 0).
    void train_record(int step, float loss, float norm, float lr, long tokens, double util, float ms,
                      double tok_per_s) {
        log.write(format("s:%d trl:%f\n", step, loss));
        jsonl.write(format("{\"step\": %d, \"loss\": %.9g, \"norm\": %.9g, \"lr\": %.9g, \"tokens_per_step\": %ld, "
                           "\"util\": %.4f, \"ms\": %.3f, \"tok_per_s\": %.1f}\n",
                           step + 1, loss, norm, lr, tokens, util, ms, tok_per_s));
    }
    __attribute__((format(printf, 1, 2))) static std::string format(const char* f, ...) {
        char line[512];
        va_list args;
        va_start(args, f);
        const int n = vsnprintf(line, sizeof line, f, args);
        va_end(args);
        return std::string(line, n < 0 ? 0 : std::min((size_t)n, sizeof line - 1));
    }
    // Whether a line of either log comes before the evaluation of step S. A
    // train record logs the step it completed (main.log: that step - 1).
    static bool before(const std::string& line, int S) {
        int step = -1;
        if (sscanf(line.c_str(), "s:%d ", &step) == 1) return step < S;
        if (sscanf(line.c_str(), "{\"step\": %d,", &step) == 1)
            return line.find("\"loss\"") != std::string::npos ? step <= S : step < S;
        return false;
    }
    static void cut_back(const std::string& path, int S) {
        std::string text, kept, why;
        struct stat st;
        if (lstat(path.c_str(), &st) != 0) return;  // no log yet
        if (S_ISLNK(st.st_mode)) LogFile::refuse(path, SYMBOLIC_LINK_NOT_FOLLOWED);
        if (!read_regular_file(path.c_str(), &text, SIZE_MAX, &why)) LogFile::refuse(path, why);
        for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            const std::string line = text.substr(pos, nl + 1 - pos);
            if (before(line, S)) kept += line;
        }
        write_file_atomic(path, [&](FILE* f) { return fwrite(kept.data(), 1, kept.size(), f) == kept.size(); });
    }
};
