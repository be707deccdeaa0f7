// Checkpoint files of a training run (header-only host C++, no CUDA, no MPI).
//
// A checkpoint of step S in folder dir is (llm.c's names):
//   dir/model_%08d.bin          the model, llm.c's model format (written by the trainer)
//   dir/state_%08d_%05d.bin     the training state of each rank (this file)
//   dir/DONE_%08d               empty; written only after every rank's files are durable,
//                               so a checkpoint is complete exactly when its DONE exists
//
// Training-state file (one per rank), little-endian. A header of 256 int32:
//   [0] = 20240527 (magic)     [1] = 1 (version)      [2] = num_processes   [3] = rank
//   [4] = 1 (master weights present)                  [5] = shuffle flag
//   [10] = step                [11] = zero_stage
//   [12..13] = n, the fp32 elements in each of m / v / master of this rank (uint64: low, high)
//   [14..15] = total number of model parameters (uint64: low, high)
//   [16] = bytes of the trailing extra blob; every other slot 0.
// Then m (n floats), v (n floats), master (n floats), then the extra blob (opaque to this
// file: the trainer keeps its data-loader position and other small state there).
// The file is exactly 1024 + 3*4*n + extra bytes.
//
// Every file is written through path.tmp: write, fflush, fsync, close, rename onto path,
// fsync the folder. A reader therefore sees the old file or the whole new one, never a
// partial one, and after a crash at most a stale *.tmp is left (see
// checkpoint_remove_stale_temps).
//
// Functions report failure by returning false with a one-line reason (naming the file) in
// *error (which may be null); none of them exits.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian and written from memory as is");
#endif

#define CHECKPOINT_STATE_MAGIC 20240527
#define CHECKPOINT_STATE_VERSION 1
#define CHECKPOINT_HEADER_INTS 256
#define CHECKPOINT_HEADER_BYTES (CHECKPOINT_HEADER_INTS * 4)

// ---------------------------------------------------------------------------
// durable atomic writes

inline void checkpoint_set_error_(std::string* error, const std::string& msg) {
    if (error) *error = msg;
}

// fsync of a folder, so that a rename or unlink in it survives a power loss.
inline bool fsync_directory(const std::string& dir) {
    int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    // Some filesystems cannot fsync a folder (EINVAL); there is nothing more to do there.
    if (rc != 0 && e != EINVAL && e != ENOTSUP) {
        errno = e;
        return false;
    }
    return true;
}

// The folder holding path ("." for a bare name).
inline std::string checkpoint_parent_dir_(const std::string& path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// Writes path through path.tmp (see the top of this file). write_body writes the content to
// the open file and returns false on failure. On failure the temporary file is removed and
// an existing path is untouched, except if only the final folder fsync fails: the new file
// is then in place and whole, but its durability is not known, so false is returned too.
inline bool write_file_atomic(const std::string& path, const std::function<bool(FILE*)>& write_body,
                              std::string* error) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) {
        checkpoint_set_error_(error, tmp + ": cannot create (" + strerror(errno) + ")");
        return false;
    }
    std::string what;
    int e = 0;
    errno = 0;
    if (!write_body(f)) {
        e = errno ? errno : (ferror(f) ? EIO : 0);
        what = "write failed";
    } else if (fflush(f) != 0) {
        e = errno;
        what = "write failed";
    } else if (fsync(fileno(f)) != 0) {
        e = errno;
        what = "fsync failed";
    }
    // close in every case; a failing close can still be a lost write
    if (fclose(f) != 0 && what.empty()) {
        e = errno;
        what = "close failed";
    }
    if (what.empty() && rename(tmp.c_str(), path.c_str()) != 0) {
        e = errno;
        what = "cannot rename " + tmp + " into place";
    }
    if (!what.empty()) {
        unlink(tmp.c_str());
        checkpoint_set_error_(error, path + ": " + what + " (" +
                                         (e ? strerror(e) : "the writer reported a failure") + ")");
        return false;
    }
    const std::string dir = checkpoint_parent_dir_(path);
    if (!fsync_directory(dir)) {
        checkpoint_set_error_(error, path + ": written, but fsync of the folder " + dir + " failed (" +
                                         strerror(errno) + ")");
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// names

inline std::string checkpoint_model_path(const std::string& dir, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/model_%08d.bin", step);
    return dir + name;
}
inline std::string checkpoint_state_path(const std::string& dir, int step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08d_%05d.bin", step, rank);
    return dir + name;
}
inline std::string checkpoint_done_path(const std::string& dir, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/DONE_%08d", step);
    return dir + name;
}

// ---------------------------------------------------------------------------
// training-state file

struct TrainingStateHeader {
    int num_processes, rank, shuffle, step, zero_stage;
    uint64_t shard_elements;  // n: fp32 elements in each of m, v, master of this rank
    uint64_t num_parameters;  // of the whole model
    uint32_t extra_bytes;     // size of the trailing blob
};

// The exact file size for a header, or false if it does not fit in 64 bits.
inline bool checkpoint_state_size_(const TrainingStateHeader& h, uint64_t* size) {
    const uint64_t fixed = (uint64_t)CHECKPOINT_HEADER_BYTES + h.extra_bytes;
    if (h.shard_elements > (UINT64_MAX - fixed) / 12) return false;
    *size = fixed + 12 * h.shard_elements;
    return true;
}

inline bool state_write(const std::string& path, const TrainingStateHeader& h, const float* m,
                        const float* v, const float* master, const void* extra, std::string* error) {
    uint64_t size;
    const char* bad = nullptr;
    if (h.num_processes < 1 || h.rank < 0 || h.rank >= h.num_processes) bad = "rank out of range";
    else if (h.step < 0) bad = "negative step";
    else if (h.extra_bytes > (uint32_t)INT32_MAX) bad = "extra blob too large";
    else if (!checkpoint_state_size_(h, &size)) bad = "element count too large";
    else if (h.shard_elements > 0 && (!m || !v || !master)) bad = "missing optimizer array";
    else if (h.extra_bytes > 0 && !extra) bad = "missing extra blob";
    if (bad) {
        checkpoint_set_error_(error, path + ": cannot write the training state: " + bad);
        return false;
    }
    int32_t hd[CHECKPOINT_HEADER_INTS];
    memset(hd, 0, sizeof(hd));
    hd[0] = CHECKPOINT_STATE_MAGIC;
    hd[1] = CHECKPOINT_STATE_VERSION;
    hd[2] = h.num_processes;
    hd[3] = h.rank;
    hd[4] = 1;
    hd[5] = h.shuffle;
    hd[10] = h.step;
    hd[11] = h.zero_stage;
    hd[12] = (int32_t)(uint32_t)(h.shard_elements & 0xFFFFFFFFu);
    hd[13] = (int32_t)(uint32_t)(h.shard_elements >> 32);
    hd[14] = (int32_t)(uint32_t)(h.num_parameters & 0xFFFFFFFFu);
    hd[15] = (int32_t)(uint32_t)(h.num_parameters >> 32);
    hd[16] = (int32_t)h.extra_bytes;
    const size_t n = (size_t)h.shard_elements;
    return write_file_atomic(
        path,
        [&](FILE* f) {
            // (an empty part may come with a null pointer, which fwrite must not see)
            auto put = [f](const void* p, size_t elem, size_t count) {
                return count == 0 || fwrite(p, elem, count, f) == count;
            };
            return put(hd, 4, CHECKPOINT_HEADER_INTS) && put(m, 4, n) && put(v, 4, n) && put(master, 4, n) &&
                   put(extra, 1, h.extra_bytes);
        },
        error);
}

// Opens a training-state file, reads and checks its header (magic, version, sane fields,
// exact size) and returns the file positioned at the body; null with *error on failure.
inline FILE* checkpoint_state_open_(const std::string& path, TrainingStateHeader* h, std::string* error) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        checkpoint_set_error_(error, path + ": cannot open the training state (" + strerror(errno) + ")");
        return nullptr;
    }
    auto fail = [&](const std::string& msg) -> FILE* {
        fclose(f);
        checkpoint_set_error_(error, path + ": " + msg);
        return nullptr;
    };
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return fail(std::string("cannot stat (") + strerror(errno) + ")");
    const uint64_t actual = (uint64_t)st.st_size;
    int32_t hd[CHECKPOINT_HEADER_INTS];
    if (actual < 4 || fread(hd, 4, 1, f) != 1)
        return fail("not a training state file (" + std::to_string(actual) + " bytes)");
    if (hd[0] != CHECKPOINT_STATE_MAGIC)
        return fail("not a training state file (magic " + std::to_string(hd[0]) + ", expected " +
                    std::to_string(CHECKPOINT_STATE_MAGIC) + ")");
    if (actual < CHECKPOINT_HEADER_BYTES || fread(hd + 1, 4, CHECKPOINT_HEADER_INTS - 1, f) != CHECKPOINT_HEADER_INTS - 1)
        return fail("truncated: " + std::to_string(actual) + " bytes, shorter than the " +
                    std::to_string(CHECKPOINT_HEADER_BYTES) + "-byte header");
    if (hd[1] != CHECKPOINT_STATE_VERSION)
        return fail("unsupported training state version " + std::to_string(hd[1]) + " (expected " +
                    std::to_string(CHECKPOINT_STATE_VERSION) + ")");
    if (hd[4] != 1) return fail("no master weights in the training state (header[4] = " + std::to_string(hd[4]) + ")");
    TrainingStateHeader r;
    r.num_processes = hd[2];
    r.rank = hd[3];
    r.shuffle = hd[5];
    r.step = hd[10];
    r.zero_stage = hd[11];
    r.shard_elements = (uint64_t)(uint32_t)hd[12] | ((uint64_t)(uint32_t)hd[13] << 32);
    r.num_parameters = (uint64_t)(uint32_t)hd[14] | ((uint64_t)(uint32_t)hd[15] << 32);
    if (hd[16] < 0) return fail("bad header: extra blob of " + std::to_string(hd[16]) + " bytes");
    r.extra_bytes = (uint32_t)hd[16];
    if (r.num_processes < 1 || r.rank < 0 || r.rank >= r.num_processes)
        return fail("bad header: rank " + std::to_string(r.rank) + " of " + std::to_string(r.num_processes) +
                    " processes");
    if (r.step < 0) return fail("bad header: step " + std::to_string(r.step));
    uint64_t expected;
    if (!checkpoint_state_size_(r, &expected))
        return fail("bad header: " + std::to_string(r.shard_elements) + " elements per array");
    if (actual < expected)
        return fail("truncated: " + std::to_string(actual) + " bytes, expected " + std::to_string(expected));
    if (actual > expected)
        return fail("wrong size: " + std::to_string(actual) + " bytes, expected " + std::to_string(expected) +
                    " (trailing data)");
    *h = r;
    return f;
}

inline bool state_read_header(const std::string& path, TrainingStateHeader* h, std::string* error) {
    FILE* f = checkpoint_state_open_(path, h, error);
    if (!f) return false;
    fclose(f);
    return true;
}

// Reads the body into m, v, master (shard_elements floats each) and extra (extra_bytes);
// a null pointer skips that part. The file must have been saved with `expected`'s
// num_processes, rank, step, zero_stage, shard_elements, num_parameters and extra_bytes.
inline bool state_read(const std::string& path, const TrainingStateHeader& expected, float* m, float* v,
                       float* master, void* extra, std::string* error) {
    TrainingStateHeader h;
    FILE* f = checkpoint_state_open_(path, &h, error);
    if (!f) return false;
    auto I = [](uint64_t x) { return std::to_string(x); };
    std::string mismatch;
    if (h.num_processes != expected.num_processes)
        mismatch = "saved with " + I(h.num_processes) + " processes, this run has " + I(expected.num_processes);
    else if (h.rank != expected.rank)
        mismatch = "saved by rank " + I(h.rank) + ", this is rank " + I(expected.rank);
    else if (h.step != expected.step)
        mismatch = "saved at step " + I(h.step) + ", expected step " + I(expected.step);
    else if (h.zero_stage != expected.zero_stage)
        mismatch = "saved with zero stage " + I(h.zero_stage) + ", this run uses zero stage " + I(expected.zero_stage);
    else if (h.num_parameters != expected.num_parameters)
        mismatch = "saved for a model of " + I(h.num_parameters) + " parameters, this model has " +
                   I(expected.num_parameters);
    else if (h.shard_elements != expected.shard_elements)
        mismatch = "holds " + I(h.shard_elements) + " optimizer elements per array, this run needs " +
                   I(expected.shard_elements);
    else if (h.extra_bytes != expected.extra_bytes)
        mismatch = "extra state of " + I(h.extra_bytes) + " bytes, this run has " + I(expected.extra_bytes);
    if (!mismatch.empty()) {
        fclose(f);
        checkpoint_set_error_(error, path + ": does not match this run: " + mismatch);
        return false;
    }
    const size_t n = (size_t)h.shard_elements;
    bool ok = true;
    for (float* a : {m, v, master}) {
        if (!ok) break;
        if (a && n > 0) ok = fread(a, 4, n, f) == n;
        else ok = fseeko(f, (off_t)n * 4, SEEK_CUR) == 0;
    }
    if (ok && extra && h.extra_bytes > 0) ok = fread(extra, 1, h.extra_bytes, f) == h.extra_bytes;
    int e = ferror(f) ? errno : 0;
    fclose(f);
    if (!ok) {
        checkpoint_set_error_(error, path + ": reading the training state failed (" +
                                         (e ? strerror(e) : "file shorter than its header says") + ")");
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// completeness and rotation

// Parses "<prefix><8 digits><suffix>" exactly; -1 if name is not of that form.
inline int checkpoint_parse_step_(const char* name, const char* prefix, const char* suffix) {
    const size_t np = strlen(prefix), ns = strlen(suffix), len = strlen(name);
    if (len != np + 8 + ns || strncmp(name, prefix, np) != 0 || strcmp(name + np + 8, suffix) != 0) return -1;
    int step = 0;
    for (size_t i = np; i < np + 8; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

// The names in dir (without "." and ".."); empty if it cannot be read.
inline std::vector<std::string> checkpoint_list_dir_(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (!d) return names;
    while (struct dirent* e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    }
    closedir(d);
    return names;
}

// The steps that have a DONE file, ascending.
inline std::vector<int> checkpoint_done_steps_(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        int s = checkpoint_parse_step_(name.c_str(), "DONE_", "");
        if (s >= 0) steps.push_back(s);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The newest complete checkpoint's step, or -1 if there is none (or no such folder).
inline int checkpoint_find_latest(const std::string& dir) {
    std::vector<int> steps = checkpoint_done_steps_(dir);
    return steps.empty() ? -1 : steps.back();
}

// Marks step's checkpoint complete. Call only once every rank's files are durable.
inline bool checkpoint_write_done(const std::string& dir, int step, std::string* error) {
    return write_file_atomic(checkpoint_done_path(dir, step), [](FILE*) { return true; }, error);
}

// Keeps the newest keep_last complete checkpoints and deletes the older complete ones
// (keep_last <= 0: keep all). Checkpoints without DONE (e.g. one being written) and all
// other files are left alone. The DONE files go first, and that is made durable before any
// data file is removed, so a crash here never leaves a DONE whose files are gone.
// State files of ranks >= num_processes of a pruned step (from a run with more processes)
// are removed too.
inline void checkpoint_prune(const std::string& dir, int keep_last, int num_processes) {
    if (keep_last <= 0) return;
    std::vector<int> steps = checkpoint_done_steps_(dir);
    if ((int)steps.size() <= keep_last) return;
    steps.resize(steps.size() - (size_t)keep_last);  // the ones to delete
    for (int s : steps) unlink(checkpoint_done_path(dir, s).c_str());
    fsync_directory(dir);
    for (int s : steps) {
        unlink(checkpoint_model_path(dir, s).c_str());
        for (int r = 0; r < num_processes; r++) unlink(checkpoint_state_path(dir, s, r).c_str());
    }
    // exactly-named state files of those steps for other ranks
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        if (name.size() != 24 || name.compare(0, 6, "state_") != 0 || name[14] != '_' ||
            name.compare(20, 4, ".bin") != 0)
            continue;
        std::string head = name.substr(0, 14);  // "state_" + 8 digits
        int s = checkpoint_parse_step_(head.c_str(), "state_", "");
        bool rank_digits = std::all_of(name.begin() + 15, name.begin() + 20, [](char c) { return c >= '0' && c <= '9'; });
        if (s >= 0 && rank_digits && std::binary_search(steps.begin(), steps.end(), s))
            unlink((dir + "/" + name).c_str());
    }
    fsync_directory(dir);
}

// Deletes the *.tmp files (not folders) that a killed run left in dir.
inline void checkpoint_remove_stale_temps(const std::string& dir) {
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".tmp") != 0) continue;
        const std::string p = dir + "/" + name;
        struct stat st;
        if (lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) unlink(p.c_str());
    }
    fsync_directory(dir);
}
