// run_log.h: a training run's logs, main.log (llm.c's format) and main.jsonl
// (header-only host C++; the trainer writes them on rank 0 into -o).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <sys/stat.h>

#include "llmc/checkpoint.h"
#include "llmc/error.h"
#include "llmc/regular_file.h"

// main.log (llm.c's format) and main.jsonl (one object per event), rank 0.
// Line-buffered: every record reaches the file in one write, whole, so a kill
// never tears one. A resume from step S first cuts both back to what came
// before S's evaluation: the steps up to S and the evaluations before S (the
// run logs S's evaluation again), and drops a last line without its newline.
struct RunLog {
    FILE* log = nullptr;
    FILE* jsonl = nullptr;
    void open(const char* dir, int resumed_step) {
        for (auto [file, name] : {std::pair<FILE**, const char*>{&log, "main.log"}, {&jsonl, "main.jsonl"}}) {
            const std::string path = std::string(dir) + "/" + name;
            if (resumed_step >= 0) cut_back(path, resumed_step);
            *file = fopen(path.c_str(), resumed_step >= 0 ? "a" : "w");
            if (!*file) llmc::fail(path + ": cannot write (" + strerror(errno) + ")");
            setvbuf(*file, nullptr, _IOLBF, 1 << 16);
        }
    }
    void close() {
        if (log) fclose(log);
        if (jsonl) fclose(jsonl);
    }
    // An evaluation after `step` steps: main.log "s:<step> <tag>:<value>",
    // main.jsonl {"step": step, "<key>": value}.
    void record(int step, const char* tag, const char* key, double value) {
        if (log) fprintf(log, "s:%d %s:%f\n", step, tag, value);
        if (jsonl) fprintf(jsonl, "{\"step\": %d, \"%s\": %.9g}\n", step, key, value);
    }
    // The training record of step step + 1 (of 1..steps, as stdout numbers it;
    // main.log keeps llm.c's numbering from 0).
    void train_record(int step, float loss, float norm, float lr, long tokens, double util, float ms, double tok_per_s) {
        if (log) fprintf(log, "s:%d trl:%f\n", step, loss);
        if (jsonl)
            fprintf(jsonl, "{\"step\": %d, \"loss\": %.9g, \"norm\": %.9g, \"lr\": %.9g, \"tokens_per_step\": %ld, "
                    "\"util\": %.4f, \"ms\": %.3f, \"tok_per_s\": %.1f}\n", step + 1, loss, norm, lr, tokens,
                    util, ms, tok_per_s);
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
        if (stat(path.c_str(), &st) != 0) return;  // no log yet
        if (!read_regular_file(path.c_str(), &text, SIZE_MAX, &why)) llmc::fail(path + ": cannot read (" + why + ")");
        for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            const std::string line = text.substr(pos, nl + 1 - pos);
            if (before(line, S)) kept += line;
        }
        write_file_atomic(path, [&](FILE* f) { return fwrite(kept.data(), 1, kept.size(), f) == kept.size(); });
    }
};
