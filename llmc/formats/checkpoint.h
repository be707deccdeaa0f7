// Checkpoint files of a training run (header-only host C++, no CUDA, no MPI).
//
// A checkpoint of step S in folder dir is (llm.c's names):
//   dir/model_%08d.bin          the model, llm.c's model format (below); or, for a family
//                               whose model is a folder of files (Llama 3: Hugging Face's
//   dir/model_%08d/             config.json and model.safetensors), that folder
//   dir/state_%08d_%05d.bin     the training state of each rank (this file)
//   dir/DONE_%08d               written only after every rank's files are durable, so a
//                               checkpoint is complete exactly when its DONE exists
//   dir/WRITING_%08d            written before any other file of the step and removed after
//                               its DONE: the step's files and temporaries are the run's
//   dir/train.lock              the pid of the one trainer that writes into dir, which holds
//                               an flock on dir (FolderLock below)
//
// DONE_%08d (llm.c writes it empty and only tests that it exists) is text here:
//   gpt-trainer checkpoint 1
//   run <the run id: 16 hex digits>
//   file <name> <bytes> <xxh64 of the bytes, 16 hex digits>     one line per file of the checkpoint
// (a file of the model's folder as model_%08d/<file>)
// so a resume can check each file before trusting it, and a run prunes only its own
// checkpoints. A resume trusts a DONE only when it lists the model and every rank's state
// file of its step (checkpoint_done_covers); an empty DONE (llm.c's) vouches for nothing a
// resume could check, and has no owner, so it is never pruned either. WRITING_%08d is a
// DONE's first two lines: the run that is writing the step.
//
// What a run deletes in dir (see "what a run may delete" below): only what a DONE or a
// WRITING of its run id vouches for; anything else in its way is an error naming it, and
// then nothing is deleted.
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
// checkpoint_remove_unfinished). A model folder is written whole the same way: its files
// into a fresh folder path.tmp, which is then renamed onto path (write_folder_atomic).
//
// Errors follow llmc/error.h: a write or read that fails throws llmc::Error, one line
// naming the file. Two checks return false with the reason in *why instead, because their
// callers branch on the outcome (a resume falls back to an older checkpoint, a prune keeps
// what it cannot prove its own): checkpoint_read_done and checkpoint_verify_files. So does
// fsync_directory, whose "cannot" the cleanups here shrug off.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/error.h"
#include "llmc/formats/regular_file.h"

#define XXH_INLINE_ALL  // header-only use of Debian's libxxhash-dev: nothing to link
#include <xxhash.h>

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

// fsync of a folder, so that a rename or unlink in it survives a power loss; false (errno
// set) when it cannot: an outcome, since only write_file_atomic needs it to succeed.
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
// is then in place and whole, but its durability is not known, so that throws too.
//
// The temporary is created exclusively and never through a symbolic link (O_EXCL, O_NOFOLLOW):
// a link planted at path.tmp is removed, not written through, and a leftover path.tmp of a
// killed run (a name of this file's own) is replaced. The rename replaces a link at path
// itself, never its target.
inline FILE* create_temp_file_(const std::string& tmp) {
    std::string why;
    FILE* f = fopen_regular_file_for_writing(tmp.c_str(), O_WRONLY | O_EXCL, &why);
    if (!f && errno == EEXIST && unlink(tmp.c_str()) == 0)
        f = fopen_regular_file_for_writing(tmp.c_str(), O_WRONLY | O_EXCL, &why);
    // (a temporary left empty by a failure after its creation is a stale one: the next run removes it)
    if (!f) llmc::fail(tmp + ": cannot create (" + why + ")");
    return f;
}

inline void write_file_atomic(const std::string& path, const std::function<bool(FILE*)>& write_body) {
    const std::string tmp = path + ".tmp";
    FILE* f = create_temp_file_(tmp);
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
        llmc::fail(path + ": " + what + " (" + (e ? strerror(e) : "the writer reported a failure") + ")");
    }
    const std::string dir = checkpoint_parent_dir_(path);
    if (!fsync_directory(dir))
        llmc::fail(path + ": written, but fsync of the folder " + dir + " failed (" + strerror(errno) + ")");
}

// One file of a checkpoint as its DONE lists it.
struct CheckpointFile {
    std::string name;  // inside the checkpoint's folder
    uint64_t bytes = 0;
    uint64_t xxh64 = 0;
};

// Writes through FILE* f and keeps the size and XXH64 of everything written.
class HashingWriter {
  public:
    explicit HashingWriter(FILE* f) : f_(f) { XXH64_reset(&state_, 0); }
    bool put(const void* p, size_t elem, size_t count) {
        // (an empty part may come with a null pointer, which fwrite must not see)
        if (count == 0) return true;
        if (fwrite(p, elem, count, f_) != count) return false;
        XXH64_update(&state_, p, elem * count);
        bytes_ += elem * count;
        return true;
    }
    uint64_t bytes() const { return bytes_; }
    uint64_t digest() const { return XXH64_digest(&state_); }

  private:
    FILE* f_;
    XXH64_state_t state_;
    uint64_t bytes_ = 0;
};

// write_file_atomic through a HashingWriter; returns the file's name, size and hash.
inline CheckpointFile write_file_hashed(const std::string& path,
                                        const std::function<bool(HashingWriter&)>& write_body) {
    uint64_t bytes = 0, digest = 0;
    write_file_atomic(path, [&](FILE* f) {
        HashingWriter w(f);
        const bool body = write_body(w);
        bytes = w.bytes();
        digest = w.digest();
        return body;
    });
    return CheckpointFile{path.substr(path.find_last_of('/') + 1), bytes, digest};
}

// Removes what is at path without following a symbolic link: a link or file is unlinked; a
// folder (one this run wrote, or whose entries checkpoint_owned_ checked: files only) loses its
// entries, each unlinked (never followed; a subfolder makes the rmdir fail), then is removed.
// True when nothing is left at path.
inline bool remove_written_folder_(const std::string& path) {
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) return errno == ENOENT;
    if (!S_ISDIR(st.st_mode)) return unlink(path.c_str()) == 0;
    DIR* d = opendir(path.c_str());
    if (!d) return false;
    while (struct dirent* e = readdir(d))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    return rmdir(path.c_str()) == 0;
}

// Writes the folder path whole: write_files writes every file into the fresh folder path.tmp
// (each through write_file_atomic, so each is durable) and returns them; then path.tmp is
// renamed onto path. Neither path nor path.tmp may exist: what is there is not removed (the
// caller removes what it can prove its own, checkpoint_clear_step), it is an error. A crash
// leaves path.tmp (not a name a reader takes), or the whole new folder. On failure path.tmp
// (this call's) is removed. Returns the files, named <folder>/<file>.
inline std::vector<CheckpointFile> write_folder_atomic(
    const std::string& path, const std::function<std::vector<CheckpointFile>(const std::string& tmp)>& write_files) {
    const std::string tmp = path + ".tmp";
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) llmc::fail(path + ": already exists; not replaced");
    if (mkdir(tmp.c_str(), 0755) != 0)
        llmc::fail(tmp + ": cannot create the folder (" +
                   (errno == EEXIST ? std::string("something is already there; not replaced") : strerror(errno)) + ")");
    std::vector<CheckpointFile> files;
    try {
        files = write_files(tmp);
    } catch (...) {
        remove_written_folder_(tmp);
        throw;
    }
    const bool taken = lstat(path.c_str(), &st) == 0;  // (a rename would replace an empty folder)
    if (taken || rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = taken ? EEXIST : errno;
        remove_written_folder_(tmp);
        llmc::fail(path + ": cannot rename " + tmp + " into place (" + strerror(e) + ")");
    }
    const std::string dir = checkpoint_parent_dir_(path);
    if (!fsync_directory(dir))
        llmc::fail(path + ": written, but fsync of the folder " + dir + " failed (" + strerror(errno) + ")");
    const std::string folder = path.substr(path.find_last_of('/') + 1);
    for (CheckpointFile& f : files) f.name = folder + "/" + f.name;
    return files;
}

// ---------------------------------------------------------------------------
// names

// The model of step's checkpoint: llm.c's file model_%08d.bin, or the folder model_%08d of a
// family whose model is a folder of files.
inline std::string checkpoint_model_path(const std::string& dir, int step, bool folder = false) {
    char name[64];
    snprintf(name, sizeof(name), folder ? "/model_%08d" : "/model_%08d.bin", step);
    return dir + name;
}
// The names a DONE lists for that model: model_%08d.bin, or model_%08d/<file> for each of
// folder_files (none: the one file).
inline std::vector<std::string> checkpoint_model_names(int step, const std::vector<std::string>& folder_files) {
    const std::string model = checkpoint_model_path("", step, !folder_files.empty()).substr(1);
    if (folder_files.empty()) return {model};
    std::vector<std::string> names;
    for (const std::string& f : folder_files) names.push_back(model + "/" + f);
    return names;
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
inline std::string checkpoint_writing_path(const std::string& dir, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/WRITING_%08d", step);
    return dir + name;
}

// ---------------------------------------------------------------------------
// model file (llm.c's format), little-endian:
//   256 x int32 header: [0] = 20240326 (magic), [1] = 3 (fp32 weights) or 5 (bf16),
//   [2] = maxT, [3] = V, [4] = L, [5] = NH, [6] = C, [7] = Vp, every other slot 0;
//   then the n weights, the parameter tensors in order (train_gpt.cu's PARAMETERS):
//   exactly 1024 + n x 4 (or 2) bytes.

constexpr int MODEL_MAGIC = 20240326, MODEL_VERSION_FP32 = 3, MODEL_VERSION_BF16 = 5;

struct ModelFileHeader {
    int version;
    int max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size;
};

inline size_t model_file_weight_bytes_(int version) { return version == MODEL_VERSION_BF16 ? 2 : 4; }

// Opens a model file and reads its header (magic and version checked).
inline FILE* model_file_open(const std::string& path, ModelFileHeader* h) {
    std::string why;
    FILE* f = fopen_regular_file(path.c_str(), &why);
    if (!f) llmc::fail(path + ": cannot open the model file (" + why + ")");
    int32_t header[CHECKPOINT_HEADER_INTS];
    std::string problem;
    if (fread(header, 4, CHECKPOINT_HEADER_INTS, f) != CHECKPOINT_HEADER_INTS) problem = "truncated model file header";
    else if (header[0] != MODEL_MAGIC)
        problem = "not a model file (magic " + std::to_string(header[0]) + ", expected " + std::to_string(MODEL_MAGIC) +
                  ")";
    else if (header[1] != MODEL_VERSION_FP32 && header[1] != MODEL_VERSION_BF16)
        problem = "unsupported model file version " + std::to_string(header[1]) + " (3 = fp32, 5 = bf16)";
    if (!problem.empty()) {
        fclose(f);
        llmc::fail(path + ": " + problem);
    }
    *h = ModelFileHeader{header[1], header[2], header[3], header[4], header[5], header[6], header[7]};
    return f;
}

// Reads the n weights after the header into fp32 (bf16 widened exactly) and closes f;
// the file must hold exactly n of them.
inline std::vector<float> model_file_read_weights(FILE* f, const std::string& path, const ModelFileHeader& h,
                                                  size_t n) {
    const size_t elem = model_file_weight_bytes_(h.version), expected = CHECKPOINT_HEADER_BYTES + n * elem;
    struct stat st;
    std::string problem;
    if (fstat(fileno(f), &st) != 0) problem = std::string("cannot stat (") + strerror(errno) + ")";
    else if ((size_t)st.st_size != expected)
        problem = "file is " + std::to_string((long long)st.st_size) + " bytes, expected " + std::to_string(expected) +
                  " for this model (" + ((size_t)st.st_size < expected ? "truncated" : "trailing data") + ")";
    std::vector<float> weights(problem.empty() ? n : 0);
    if (problem.empty() && elem == 4 && fread(weights.data(), 4, n, f) != n) problem = "read error";
    if (problem.empty() && elem == 2) {
        std::vector<uint16_t> raw(n);
        if (fread(raw.data(), 2, n, f) != n) problem = "read error";
        for (size_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)raw[i] << 16;  // a bf16 is the top half of a float
            memcpy(&weights[i], &bits, 4);
        }
    }
    fclose(f);
    if (!problem.empty()) llmc::fail(path + ": " + problem);
    return weights;
}

// Writes a model file through path.tmp (see the top of this file); n weights of the
// version's size (4 or 2 bytes each) at weights; returns its name, size and hash.
inline CheckpointFile model_file_write(const std::string& path, const ModelFileHeader& h, const void* weights,
                                       size_t n) {
    int32_t header[CHECKPOINT_HEADER_INTS] = {MODEL_MAGIC,  h.version,   h.max_seq_len, h.vocab_size,
                                              h.num_layers, h.num_heads, h.channels,    h.padded_vocab_size};
    return write_file_hashed(path, [&](HashingWriter& w) {
        return w.put(header, 4, CHECKPOINT_HEADER_INTS) && w.put(weights, model_file_weight_bytes_(h.version), n);
    });
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

// Writes a training-state file (a header that cannot be written is refused before any
// file is touched); returns its name, size and hash.
inline CheckpointFile state_write(const std::string& path, const TrainingStateHeader& h, const float* m, const float* v,
                                  const float* master, const void* extra) {
    uint64_t size;
    const char* bad = nullptr;
    if (h.num_processes < 1 || h.rank < 0 || h.rank >= h.num_processes) bad = "rank out of range";
    else if (h.step < 0) bad = "negative step";
    else if (h.extra_bytes > (uint32_t)INT32_MAX) bad = "extra blob too large";
    else if (!checkpoint_state_size_(h, &size)) bad = "element count too large";
    else if (h.shard_elements > 0 && (!m || !v || !master)) bad = "missing optimizer array";
    else if (h.extra_bytes > 0 && !extra) bad = "missing extra blob";
    if (bad) llmc::fail(path + ": cannot write the training state: " + bad);
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
    return write_file_hashed(path, [&](HashingWriter& w) {
        return w.put(hd, 4, CHECKPOINT_HEADER_INTS) && w.put(m, 4, n) && w.put(v, 4, n) && w.put(master, 4, n) &&
               w.put(extra, 1, h.extra_bytes);
    });
}

// Opens a training-state file, reads and checks its header (magic, version, sane fields,
// exact size) and returns the file positioned at the body.
inline FILE* checkpoint_state_open_(const std::string& path, TrainingStateHeader* h) {
    std::string why;
    FILE* f = fopen_regular_file(path.c_str(), &why);
    if (!f) llmc::fail(path + ": cannot open the training state (" + why + ")");
    auto fail = [&](const std::string& msg) {
        fclose(f);
        llmc::fail(path + ": " + msg);
    };
    struct stat st;
    if (fstat(fileno(f), &st) != 0) fail(std::string("cannot stat (") + strerror(errno) + ")");
    const uint64_t actual = (uint64_t)st.st_size;
    int32_t hd[CHECKPOINT_HEADER_INTS];
    if (actual < 4 || fread(hd, 4, 1, f) != 1) fail("not a training state file (" + std::to_string(actual) + " bytes)");
    if (hd[0] != CHECKPOINT_STATE_MAGIC)
        fail("not a training state file (magic " + std::to_string(hd[0]) + ", expected " +
             std::to_string(CHECKPOINT_STATE_MAGIC) + ")");
    if (actual < CHECKPOINT_HEADER_BYTES ||
        fread(hd + 1, 4, CHECKPOINT_HEADER_INTS - 1, f) != CHECKPOINT_HEADER_INTS - 1)
        fail("truncated: " + std::to_string(actual) + " bytes, shorter than the " +
             std::to_string(CHECKPOINT_HEADER_BYTES) + "-byte header");
    if (hd[1] != CHECKPOINT_STATE_VERSION)
        fail("unsupported training state version " + std::to_string(hd[1]) + " (expected " +
             std::to_string(CHECKPOINT_STATE_VERSION) + ")");
    if (hd[4] != 1) fail("no master weights in the training state (header[4] = " + std::to_string(hd[4]) + ")");
    TrainingStateHeader r;
    r.num_processes = hd[2];
    r.rank = hd[3];
    r.shuffle = hd[5];
    r.step = hd[10];
    r.zero_stage = hd[11];
    r.shard_elements = (uint64_t)(uint32_t)hd[12] | ((uint64_t)(uint32_t)hd[13] << 32);
    r.num_parameters = (uint64_t)(uint32_t)hd[14] | ((uint64_t)(uint32_t)hd[15] << 32);
    if (hd[16] < 0) fail("bad header: extra blob of " + std::to_string(hd[16]) + " bytes");
    r.extra_bytes = (uint32_t)hd[16];
    if (r.num_processes < 1 || r.rank < 0 || r.rank >= r.num_processes)
        fail("bad header: rank " + std::to_string(r.rank) + " of " + std::to_string(r.num_processes) + " processes");
    if (r.step < 0) fail("bad header: step " + std::to_string(r.step));
    uint64_t expected;
    if (!checkpoint_state_size_(r, &expected))
        fail("bad header: " + std::to_string(r.shard_elements) + " elements per array");
    if (actual < expected)
        fail("truncated: " + std::to_string(actual) + " bytes, expected " + std::to_string(expected));
    if (actual > expected)
        fail("wrong size: " + std::to_string(actual) + " bytes, expected " + std::to_string(expected) +
             " (trailing data)");
    *h = r;
    return f;
}

// Whether path is llm.c's training state (its magic and version, but none of the sizes this
// format keeps in slots 12..16, which llm.c leaves 0): a message can then say what it is.
inline bool state_file_is_llmc(const std::string& path) {
    std::string why;
    const int fd = open_regular_file(path.c_str(), &why);
    if (fd < 0) return false;
    int32_t h[CHECKPOINT_HEADER_INTS];
    const bool whole = pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h;
    close(fd);
    return whole && h[0] == CHECKPOINT_STATE_MAGIC && h[1] == 1 && h[12] == 0 && h[13] == 0 && h[14] == 0 &&
           h[15] == 0 && h[16] == 0;
}

inline TrainingStateHeader state_read_header(const std::string& path) {
    TrainingStateHeader h;
    fclose(checkpoint_state_open_(path, &h));
    return h;
}

// ZeRO-1, 2 and 3 keep the same shard of the optimizer state (ZeRO-2 only
// stages the gradient differently, ZeRO-3 the layers' weights too), so a state
// file of one resumes the others.
inline bool same_shard_layout(int saved_stage, int stage) { return (saved_stage >= 1) == (stage >= 1); }

// Reads the body into m, v, master (shard_elements floats each) and extra (extra_bytes);
// a null pointer skips that part. The file must have been saved with `expected`'s
// num_processes, rank, step, zero_stage, shard_elements, num_parameters and extra_bytes.
inline void state_read(const std::string& path, const TrainingStateHeader& expected, float* m, float* v, float* master,
                       void* extra) {
    TrainingStateHeader h;
    FILE* f = checkpoint_state_open_(path, &h);
    auto I = [](uint64_t x) { return std::to_string(x); };
    std::string mismatch;
    if (h.num_processes != expected.num_processes)
        mismatch = "saved with " + I(h.num_processes) + " processes, this run has " + I(expected.num_processes);
    else if (h.rank != expected.rank) mismatch = "saved by rank " + I(h.rank) + ", this is rank " + I(expected.rank);
    else if (h.step != expected.step) mismatch = "saved at step " + I(h.step) + ", expected step " + I(expected.step);
    else if (!same_shard_layout(h.zero_stage, expected.zero_stage))
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
        llmc::fail(path + ": does not match this run: " + mismatch);
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
    if (!ok)
        llmc::fail(path + ": reading the training state failed (" +
                   (e ? strerror(e) : "file shorter than its header says") + ")");
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

// The complete checkpoints' steps, newest first.
inline std::vector<int> checkpoint_complete_steps(const std::string& dir) {
    std::vector<int> steps = checkpoint_done_steps_(dir);
    std::reverse(steps.begin(), steps.end());
    return steps;
}

// The step of a checkpoint file name (DONE_, WRITING_, model_ file or folder, state_ of any
// rank), else -1.
inline int checkpoint_file_step_(const std::string& name) {
    int s = checkpoint_parse_step_(name.c_str(), "DONE_", "");
    if (s < 0) s = checkpoint_parse_step_(name.c_str(), "WRITING_", "");
    if (s < 0) s = checkpoint_parse_step_(name.c_str(), "model_", ".bin");
    if (s < 0) s = checkpoint_parse_step_(name.c_str(), "model_", "");
    if (s < 0 && name.size() == 24 && name[14] == '_' && name.compare(20, 4, ".bin") == 0 &&
        std::all_of(name.begin() + 15, name.begin() + 20, [](char c) { return c >= '0' && c <= '9'; }))
        s = checkpoint_parse_step_(name.substr(0, 14).c_str(), "state_", "");
    return s;
}

// The steps that have any checkpoint file (complete or not), ascending, without repeats.
inline std::vector<int> checkpoint_steps_with_files(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        int s = checkpoint_file_step_(name);
        if (s >= 0) steps.push_back(s);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// ---------------------------------------------------------------------------
// the DONE marker (see the top of this file)

constexpr const char* CHECKPOINT_DONE_TITLE = "gpt-trainer checkpoint 1";

struct DoneRecord {
    std::string run_id;                 // empty: llm.c's empty DONE
    std::vector<CheckpointFile> files;  // what it vouches for
};

// Writes a DONE (or, without files, a WRITING) marker at path.
inline void checkpoint_write_marker_(const std::string& path, const DoneRecord& record) {
    return write_file_atomic(path, [&](FILE* f) {
        bool ok = fprintf(f, "%s\nrun %s\n", CHECKPOINT_DONE_TITLE, record.run_id.c_str()) > 0;
        for (const CheckpointFile& c : record.files)
            ok = ok && fprintf(f, "file %s %llu %016llx\n", c.name.c_str(), (unsigned long long)c.bytes,
                               (unsigned long long)c.xxh64) > 0;
        return ok;
    });
}

// Marks step's checkpoint complete. Call only once every rank's files are durable.
inline void checkpoint_write_done(const std::string& dir, int step, const DoneRecord& record) {
    checkpoint_write_marker_(checkpoint_done_path(dir, step), record);
}

// A name a DONE may list: a file of the checkpoint's folder, or a file of a model folder in
// it (<folder>/<file>); neither part empty, "." or "..".
inline bool checkpoint_listed_name_ok_(const std::string& name) {
    const size_t slash = name.find('/');
    const std::string parts[] = {name.substr(0, slash), slash == std::string::npos ? "" : name.substr(slash + 1)};
    for (int i = 0; i < (slash == std::string::npos ? 1 : 2); i++)
        if (parts[i].empty() || parts[i] == "." || parts[i] == ".." || parts[i].find('/') != std::string::npos)
            return false;
    return true;
}

// Reads the DONE (or WRITING) marker at path into *record; false with the reason in *why when
// it cannot be read or is damaged (returned, not thrown: see the top of this file).
inline bool checkpoint_read_marker_(const std::string& path, DoneRecord* record, std::string* why) {
    std::string text, reason;
    if (!read_regular_file(path.c_str(), &text, 1 << 20, &reason)) {
        *why = path + ": cannot read (" + reason + ")";
        return false;
    }
    *record = DoneRecord{};
    if (text.empty()) return true;  // llm.c's
    std::vector<std::string> lines;
    for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
        nl = text.find('\n', pos);
        if (nl == std::string::npos) {
            *why = path + ": damaged (its last line is not whole)";
            return false;
        }
        lines.push_back(text.substr(pos, nl - pos));
    }
    if (lines.size() < 2 || lines[0] != CHECKPOINT_DONE_TITLE || lines[1].compare(0, 4, "run ") != 0 ||
        lines[1].size() != 20) {
        *why = path + ": not a DONE marker of this trainer (" + llmc::quote_for_error(lines[0].substr(0, 40)) + ")";
        return false;
    }
    record->run_id = lines[1].substr(4);
    for (size_t i = 2; i < lines.size(); i++) {
        char name[256];
        unsigned long long bytes, hash;
        int used = 0;
        if (sscanf(lines[i].c_str(), "file %255s %llu %16llx%n", name, &bytes, &hash, &used) != 3 ||
            used != (int)lines[i].size() || !checkpoint_listed_name_ok_(name)) {
            *why = path + ": damaged line " + std::to_string(i + 1);
            return false;
        }
        record->files.push_back(CheckpointFile{name, bytes, hash});
    }
    return true;
}
inline bool checkpoint_read_done(const std::string& dir, int step, DoneRecord* record, std::string* why) {
    return checkpoint_read_marker_(checkpoint_done_path(dir, step), record, why);
}

// Whether a DONE of step `step` vouches for a whole checkpoint of num_processes ranks: it lists
// exactly this step's model (its file, or each of its folder's folder_files) and the state
// file of every rank, nothing else. A DONE that lists less (llm.c's empty one, one without
// file lines) would vouch for files nobody checks; one copied from another step lists that
// step's names. False with the reason in *why.
inline bool checkpoint_done_covers(const DoneRecord& record, int step, int num_processes,
                                   const std::vector<std::string>& folder_files, std::string* why) {
    const std::string done = checkpoint_done_path("", step).substr(1);
    if (record.files.empty()) {
        *why = done + (record.run_id.empty() ? " is empty (llm.c's marker)" : " lists no file") +
               ": it vouches for no file of this checkpoint, so none can be checked";
        return false;
    }
    std::vector<std::string> expected = checkpoint_model_names(step, folder_files);
    for (int r = 0; r < num_processes; r++) expected.push_back(checkpoint_state_path("", step, r).substr(1));
    std::vector<std::string> listed;
    for (const CheckpointFile& f : record.files) listed.push_back(f.name);
    std::sort(expected.begin(), expected.end());
    std::sort(listed.begin(), listed.end());
    if (listed == expected) return true;
    std::string missing, extra;
    for (const std::string& name : expected)
        if (!std::binary_search(listed.begin(), listed.end(), name)) {
            missing = name;
            break;
        }
    for (const std::string& name : listed)
        if (!std::binary_search(expected.begin(), expected.end(), name)) {
            extra = name;
            break;
        }
    if (!missing.empty()) *why = done + " does not list " + missing;
    else if (!extra.empty())
        *why = done + " lists " + extra + ", not a file of this checkpoint of " + std::to_string(num_processes) +
               " rank(s)";
    else *why = done + " lists a file twice";
    return false;
}

// How many ranks' state files a DONE lists (the process count of the run that saved it).
inline int checkpoint_done_ranks(const DoneRecord& record) {
    int n = 0;
    for (const CheckpointFile& f : record.files)
        n += checkpoint_file_step_(f.name) >= 0 && f.name.rfind("state_", 0) == 0;
    return n;
}

// Opens dir/name for reading (name: <file> or <folder>/<file>) without following a symbolic
// link at the folder or the file; -1 with the reason in *why.
inline int checkpoint_open_listed_(const std::string& dir, const std::string& name, std::string* why) {
    const size_t slash = name.find('/');
    const int nofollow = O_RDONLY | O_NOFOLLOW | O_CLOEXEC;
    const std::string folder = slash == std::string::npos ? dir : dir + "/" + name.substr(0, slash);
    const int dfd =
        open(folder.c_str(), slash == std::string::npos ? O_RDONLY | O_DIRECTORY | O_CLOEXEC : nofollow | O_DIRECTORY);
    const int fd = dfd < 0 ? -1 : openat(dfd, name.substr(slash + 1).c_str(), nofollow | O_NONBLOCK);
    const int e = errno;
    if (dfd >= 0) close(dfd);
    if (fd < 0) {
        struct stat st;
        const std::string at = dfd < 0 ? folder : dir + "/" + name;
        const bool link = lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
        *why = at + ": " + (link ? "a symbolic link, not followed" : strerror(e));
    }
    return fd;
}

// Checks every file the record lists: a regular file of the listed size and hash, no
// symbolic link followed; false with the first problem in *why (returned, not thrown: see the
// top of this file).
inline bool checkpoint_verify_files(const std::string& dir, const DoneRecord& record, std::string* why) {
    std::vector<char> buf(1 << 20);
    for (const CheckpointFile& c : record.files) {
        const std::string path = dir + "/" + c.name;
        const int fd = checkpoint_open_listed_(dir, c.name, why);
        if (fd < 0) return false;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            *why = path + ": not a regular file";
            close(fd);
            return false;
        }
        if ((uint64_t)st.st_size != c.bytes) {
            close(fd);
            *why = path + ": " + std::to_string(st.st_size) + " bytes, its DONE says " + std::to_string(c.bytes);
            return false;
        }
        XXH64_state_t h;
        XXH64_reset(&h, 0);
        ssize_t got;
        while ((got = read(fd, buf.data(), buf.size())) > 0) XXH64_update(&h, buf.data(), (size_t)got);
        const int e = errno;
        close(fd);
        if (got < 0) {
            *why = path + ": read failed (" + strerror(e) + ")";
            return false;
        }
        if (XXH64_digest(&h) != c.xxh64) {
            *why = path + ": checksum differs from its DONE's (the file is damaged or from another checkpoint)";
            return false;
        }
    }
    return true;
}

// A fresh run id: 16 hex digits from the kernel's random source.
inline std::string checkpoint_new_run_id() {
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &x, sizeof x) != (ssize_t)sizeof x) x = ((uint64_t)getpid() << 32) ^ (uint64_t)time(nullptr);
    if (fd >= 0) close(fd);
    char id[17];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)x);
    return id;
}

// ---------------------------------------------------------------------------
// what a run may delete
//
// A run deletes only what its run id vouches for: the DONE of a step and the files it lists
// (a model folder with them, when it holds nothing else), and every name a checkpoint of a
// step writes (model, each rank's state, DONE, WRITING, and their .tmp) while that step has
// a WRITING of the run (a write the run began and did not finish). Anything else where the
// run must write, or inside a folder it would remove, is an error naming it, raised before
// anything is deleted; a link is removed as a name, never followed.

// Who vouches for the names of a step: a DONE and a WRITING of run_id. A WRITING is whole in
// its temporary before the rename that puts it in place, so a whole WRITING_%08d.tmp of the
// run vouches too (a crash at that rename); an empty one (a crash before its one write) holds
// nothing, so it may go, but vouches for nothing.
struct StepOwner {
    bool writing = false, done = false;
    bool empty_writing_tmp = false;
    DoneRecord record;  // the DONE's (done)
};

// Whether the marker at path is whole and of run_id (one that cannot be read vouches for nothing).
inline bool checkpoint_marker_of_(const std::string& path, const std::string& run_id) {
    DoneRecord r;
    std::string why;
    return !run_id.empty() && checkpoint_read_marker_(path, &r, &why) && r.run_id == run_id;
}

inline StepOwner checkpoint_step_owner_(const std::string& dir, int step, const std::string& run_id) {
    StepOwner o;
    const std::string writing = checkpoint_writing_path(dir, step), tmp = writing + ".tmp";
    struct stat st;
    o.writing = checkpoint_marker_of_(writing, run_id) ||
                (lstat(writing.c_str(), &st) != 0 && checkpoint_marker_of_(tmp, run_id));
    o.empty_writing_tmp = lstat(tmp.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0;
    std::string why;
    o.done = !run_id.empty() && checkpoint_read_done(dir, step, &o.record, &why) && o.record.run_id == run_id;
    return o;
}

inline bool checkpoint_is_tmp_(const std::string& name) {
    return name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
}

// The names in dir that a checkpoint of step writes, with their temporaries: the model (the
// file model_%08d.bin, or with folder_files the folder model_%08d), every rank's state, DONE,
// WRITING. Sorted, so that DONE_ comes first.
inline std::vector<std::string> checkpoint_step_names_(const std::string& dir, int step,
                                                       const std::vector<std::string>& folder_files) {
    std::vector<std::string> names;
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        const std::string base = checkpoint_is_tmp_(name) ? name.substr(0, name.size() - 4) : name;
        if (checkpoint_file_step_(base) != step) continue;
        const bool model_file = checkpoint_parse_step_(base.c_str(), "model_", ".bin") >= 0;
        const bool model_folder = checkpoint_parse_step_(base.c_str(), "model_", "") >= 0;
        if ((model_file && !folder_files.empty()) || (model_folder && folder_files.empty())) continue;  // not ours
        names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
}

// Whether a file of the model folder `folder` (a name in dir) is the run's: listed by the
// DONE, or, under a WRITING, one of folder_files or its temporary.
inline bool checkpoint_folder_entry_owned_(const std::string& folder, const std::string& entry, const StepOwner& o,
                                           const std::vector<std::string>& folder_files) {
    const std::string tmpless = checkpoint_is_tmp_(entry) ? entry.substr(0, entry.size() - 4) : entry;
    if (o.writing && std::find(folder_files.begin(), folder_files.end(), tmpless) != folder_files.end()) return true;
    if (!o.done || checkpoint_is_tmp_(folder)) return false;
    for (const CheckpointFile& f : o.record.files)
        if (f.name == folder + "/" + entry) return true;
    return false;
}

// Whether name (in dir, of a step whose owner is o) may be deleted; if not, *why names what
// is not the run's. A name that is not there is the run's (nothing to delete).
inline bool checkpoint_owned_(const std::string& dir, const std::string& name, const StepOwner& o,
                              const std::vector<std::string>& folder_files, std::string* why) {
    const std::string path = dir + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) return errno == ENOENT;
    *why = path + " is not a file this run wrote";
    const std::string base = checkpoint_is_tmp_(name) ? name.substr(0, name.size() - 4) : name;
    const bool folder = checkpoint_parse_step_(base.c_str(), "model_", "") >= 0;
    if (S_ISDIR(st.st_mode) != folder) return false;  // (a file where the run writes a folder, or the reverse)
    if (checkpoint_parse_step_(name.c_str(), "DONE_", "") >= 0) return o.done;
    if (checkpoint_parse_step_(name.c_str(), "WRITING_", "") >= 0) return o.writing;
    if (checkpoint_parse_step_(name.c_str(), "WRITING_", ".tmp") >= 0 && o.empty_writing_tmp) return true;
    if (!folder) {
        if (o.writing) return true;
        if (!o.done || checkpoint_is_tmp_(name)) return false;
        for (const CheckpointFile& f : o.record.files)
            if (f.name == name) return true;
        return false;
    }
    if (!o.writing && !(o.done && !checkpoint_is_tmp_(name))) return false;
    for (const std::string& entry : checkpoint_list_dir_(path)) {
        struct stat es;
        const std::string at = path + "/" + entry;
        if (lstat(at.c_str(), &es) != 0 || S_ISDIR(es.st_mode) ||
            !checkpoint_folder_entry_owned_(name, entry, o, folder_files)) {
            *why = at + " is not a file this run wrote";
            return false;
        }
    }
    return true;
}

// Fails naming the first of names (in dir) that is not the run's.
inline void checkpoint_check_owned_(const std::string& dir, const std::vector<std::string>& names, const StepOwner& o,
                                    const std::vector<std::string>& folder_files) {
    for (const std::string& name : names) {
        std::string why;
        if (!checkpoint_owned_(dir, name, o, folder_files, &why))
            llmc::fail(why + "; remove or move it (nothing was deleted)");
    }
}

// Deletes names (in dir, each checked with checkpoint_owned_): a DONE first, durably, so that
// a crash in between never leaves a DONE whose files are gone; a folder's files, then the folder.
inline void checkpoint_remove_owned_(const std::string& dir, const std::vector<std::string>& names) {
    const auto done = [](const std::string& name) { return checkpoint_parse_step_(name.c_str(), "DONE_", "") >= 0; };
    for (const std::string& name : names)
        if (done(name)) unlink((dir + "/" + name).c_str());
    fsync_directory(dir);
    for (const std::string& name : names) {
        if (done(name)) continue;
        const std::string path = dir + "/" + name;
        struct stat st;
        if (lstat(path.c_str(), &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) remove_written_folder_(path);  // (its entries were checked: files only)
        else unlink(path.c_str());
    }
    fsync_directory(dir);
}

// Before rank 0 writes step's checkpoint: fails naming what is in the way and not the run's
// (nothing deleted); else marks the step WRITING (durably, before any file of it changes)
// and deletes what the step held (a stale DONE first: it must never vouch for files being
// rewritten). What a crash leaves from here on is the run's by the WRITING.
inline void checkpoint_clear_step(const std::string& dir, int step, const std::string& run_id,
                                  const std::vector<std::string>& folder_files) {
    const StepOwner o = checkpoint_step_owner_(dir, step, run_id);
    std::vector<std::string> names = checkpoint_step_names_(dir, step, folder_files);
    checkpoint_check_owned_(dir, names, o, folder_files);
    const std::string writing = checkpoint_writing_path("", step).substr(1);
    names.erase(std::remove(names.begin(), names.end(), writing), names.end());
    struct stat st;  // (a WRITING_%08d.tmp of the run, or an empty one, is replaced)
    if (lstat(checkpoint_writing_path(dir, step).c_str(), &st) != 0)
        checkpoint_write_marker_(checkpoint_writing_path(dir, step), DoneRecord{run_id, {}});
    checkpoint_remove_owned_(dir, names);
}

// After step's DONE: the step is no longer being written.
inline void checkpoint_finish_step(const std::string& dir, int step) {
    if (unlink(checkpoint_writing_path(dir, step).c_str()) == 0) fsync_directory(dir);
}

// Deletes what the writes of run_id that a crash interrupted left (the steps with a WRITING
// of the run): a step with a DONE loses only its temporaries, one without its files too;
// then the WRITING goes. Fails naming what is not the run's, before deleting anything.
inline void checkpoint_remove_unfinished(const std::string& dir, const std::string& run_id,
                                         const std::vector<std::string>& folder_files) {
    std::vector<std::pair<int, std::vector<std::string>>> doomed;
    for (int step : checkpoint_steps_with_files(dir)) {
        const StepOwner o = checkpoint_step_owner_(dir, step, run_id);
        if (!o.writing) continue;
        struct stat st;
        const bool done = lstat(checkpoint_done_path(dir, step).c_str(), &st) == 0;
        const std::string markers[] = {checkpoint_done_path("", step).substr(1),
                                       checkpoint_writing_path("", step).substr(1)};
        std::vector<std::string> names;
        for (const std::string& name : checkpoint_step_names_(dir, step, folder_files))
            if (name != markers[0] && name != markers[1] && (!done || checkpoint_is_tmp_(name))) names.push_back(name);
        checkpoint_check_owned_(dir, names, o, folder_files);
        doomed.push_back({step, names});
    }
    for (const auto& d : doomed) {
        checkpoint_remove_owned_(dir, d.second);
        checkpoint_finish_step(dir, d.first);
    }
}

// The run whose interrupted writes dir holds (every whole WRITING, or its temporary, names
// it), else "": a resume that finds no complete checkpoint continues that run, so that it may
// delete what the run left.
inline std::string checkpoint_unfinished_run_id(const std::string& dir) {
    std::string id;
    for (const std::string& name : checkpoint_list_dir_(dir)) {
        DoneRecord r;
        std::string why;
        if (checkpoint_parse_step_(name.c_str(), "WRITING_", "") < 0 &&
            checkpoint_parse_step_(name.c_str(), "WRITING_", ".tmp") < 0)
            continue;
        if (!checkpoint_read_marker_(dir + "/" + name, &r, &why) || r.run_id.empty()) continue;  // vouches for nothing
        if (!id.empty() && r.run_id != id) return "";
        id = r.run_id;
    }
    return id;
}

// The names that deleting the checkpoints of steps, each of run run_id by its DONE, removes:
// the DONE and the files it lists (a model folder with them), nothing else. Fails naming what
// is not the run's (a user's file in a listed model folder, a folder where the DONE lists a
// file) before anything is deleted.
inline std::vector<std::string> checkpoint_check_prunable_(const std::string& dir, const std::vector<int>& steps,
                                                           const std::string& run_id) {
    std::vector<std::string> names;
    for (int s : steps) {
        const StepOwner o = checkpoint_step_owner_(dir, s, run_id);
        std::vector<std::string> mine = {checkpoint_done_path("", s).substr(1)};
        for (const CheckpointFile& f : o.record.files) mine.push_back(f.name.substr(0, f.name.find('/')));
        std::sort(mine.begin(), mine.end());
        mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
        StepOwner by_done = o;  // (what a WRITING vouches for is not pruned)
        by_done.writing = by_done.empty_writing_tmp = false;
        checkpoint_check_owned_(dir, mine, by_done, {});
        names.insert(names.end(), mine.begin(), mine.end());
    }
    return names;
}
// Deletes them (pruning).
inline void checkpoint_delete_steps_(const std::string& dir, const std::vector<int>& steps, const std::string& run_id) {
    checkpoint_remove_owned_(dir, checkpoint_check_prunable_(dir, steps, run_id));
}

// Keeps the newest keep_last trusted checkpoints of run run_id and deletes its checkpoints
// older than those (keep_last <= 0: keep all). `proven` are the steps this process wrote or
// resumed from after checking every file against its DONE. Trusted are those, and the run's
// checkpoints older than the first of them (a resume takes the newest that passes its checks,
// so nothing older was found wanting). Not trusted is a DONE of the run newer than the
// checkpoint resumed from that this process did not write: one the resume skipped as damaged.
// Counted among the newest kept, it would make pruning delete the good ones in its favour.
// What is not provably the run's (another run's DONE, llm.c's empty one, an unreadable one)
// and what is newer than the oldest kept is never deleted; of a pruned step only its DONE and
// the files it lists go (checkpoint_delete_steps_: anything else in a listed model folder is
// an error, nothing deleted). Files without a DONE are not pruned (a write of the run that a
// crash interrupted is checkpoint_remove_unfinished's).
inline void checkpoint_prune(const std::string& dir, int keep_last, const std::string& run_id,
                             std::vector<int> proven) {
    const std::vector<int> done = checkpoint_done_steps_(dir);
    std::sort(proven.begin(), proven.end());
    std::vector<int> own, trusted;
    for (int s : done) {
        DoneRecord r;
        std::string why;  // a DONE that cannot be read is not provably the run's: kept
        if (run_id.empty() || !checkpoint_read_done(dir, s, &r, &why) || r.run_id != run_id) continue;
        own.push_back(s);
        if (std::binary_search(proven.begin(), proven.end(), s) || (!proven.empty() && s < proven.front()))
            trusted.push_back(s);
    }
    std::vector<int> doomed;
    if (keep_last > 0 && (int)trusted.size() > keep_last) {
        const int oldest_kept = trusted[trusted.size() - keep_last];
        for (int s : own)
            if (s < oldest_kept) doomed.push_back(s);
    }
    checkpoint_delete_steps_(dir, doomed, run_id);
}

// At a resume's start, once the run knows its steps: fails naming the first entry the run
// will meet and may not delete, so that the error comes before any training, not at the
// checkpoint that meets it: a name that the checkpoint of a step it writes after `resumed`
// (every `every` steps and the last) writes, that is not the run's; and, when the run prunes
// (keep_last > 0), an entry not the run's in what pruning one of the run's checkpoints up to
// `resumed` would delete. (A stop for a signal writes a checkpoint at any step: what is in
// the way there is found then, one error naming it.)
inline void checkpoint_check_ahead(const std::string& dir, int resumed, int last, int every, int keep_last,
                                   const std::string& run_id, const std::vector<std::string>& folder_files) {
    for (int step : checkpoint_steps_with_files(dir))
        if (step > resumed && step <= last && (step == last || (every > 0 && step % every == 0)))
            checkpoint_check_owned_(dir, checkpoint_step_names_(dir, step, folder_files),
                                    checkpoint_step_owner_(dir, step, run_id), folder_files);
    if (keep_last <= 0) return;
    std::vector<int> own;
    for (int s : checkpoint_done_steps_(dir)) {
        DoneRecord r;
        std::string why;
        if (s <= resumed && checkpoint_read_done(dir, s, &r, &why) && r.run_id == run_id) own.push_back(s);
    }
    checkpoint_check_prunable_(dir, own, run_id);
}

// ---------------------------------------------------------------------------
// the folder's one writer

constexpr const char* CHECKPOINT_LOCK_NAME = "train.lock";

// The lock of a run's folder, held until the process exits (its fds stay open). The lock
// is an flock on the folder itself, so that removing or replacing the name train.lock lets
// no second trainer in; train.lock (flock'ed too) holds the holder's pid for the message a
// second trainer gets. Where the filesystem cannot flock a folder (NFS emulates flock with
// byte-range locks, which need a file open for writing) the lock is train.lock's alone, and
// checkpoint_check_lock makes sure before each checkpoint that the name is still that file.
struct FolderLock {
    std::string dir;
    bool on_folder = false;  // the folder itself is locked
    int dir_fd = -1, file_fd = -1;
    dev_t dev = 0;  // train.lock's identity
    ino_t ino = 0;
};

// The lock is held by another process: the error names its pid (from train.lock).
[[noreturn]] inline void checkpoint_lock_held_(const std::string& dir, const std::string& path) {
    char pid[32] = {0};
    ssize_t n = 0;
    const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = pread(fd, pid, sizeof pid - 1, 0);
    if (fd >= 0) close(fd);
    while (n > 0 && (pid[n - 1] == '\n' || pid[n - 1] == ' ')) pid[--n] = '\0';
    llmc::fail(dir + ": another trainer is writing into this folder (pid " + (n > 0 ? pid : "unknown") + ", holding " +
               path + ")");
}

// Creates (never through a link) and flocks dir/train.lock, writes this pid into it.
inline void checkpoint_lock_file_(FolderLock* lock) {
    const std::string path = lock->dir + "/" + CHECKPOINT_LOCK_NAME;
    std::string why;
    const int fd = open_regular_file_for_writing(path.c_str(), O_RDWR, &why);
    if (fd < 0) llmc::fail(path + ": cannot create the lock file (" + why + ")");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        close(fd);
        llmc::fail(path + ": cannot create the lock file (" + strerror(e) + ")");
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) checkpoint_lock_held_(lock->dir, path);
        llmc::fail(path + ": cannot lock (" + strerror(e) + ")");
    }
    const std::string me = std::to_string(getpid()) + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != (ssize_t)me.size()) {
        const int e = errno;
        close(fd);
        llmc::fail(path + ": cannot write the lock file (" + strerror(e) + ")");
    }
    if (lock->file_fd >= 0) close(lock->file_fd);
    lock->file_fd = fd;
    lock->dev = st.st_dev;
    lock->ino = st.st_ino;
}

// Takes dir's lock (not waiting); when another process has it, the error names its pid.
// lock_folder false: only train.lock, as on a filesystem that cannot lock a folder (tests).
inline FolderLock checkpoint_lock_dir(const std::string& dir, bool lock_folder = true) {
    FolderLock lock;
    lock.dir = dir;
    lock.dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock.dir_fd < 0) llmc::fail(dir + ": cannot open the folder (" + strerror(errno) + ")");
    if (lock_folder) {
        if (flock(lock.dir_fd, LOCK_EX | LOCK_NB) == 0) lock.on_folder = true;
        else if (errno == EWOULDBLOCK) {
            close(lock.dir_fd);
            checkpoint_lock_held_(dir, dir + "/" + CHECKPOINT_LOCK_NAME);
        }
    }
    try {
        checkpoint_lock_file_(&lock);
    } catch (...) {
        close(lock.dir_fd);
        throw;
    }
    return lock;
}

// Before a checkpoint: the lock still keeps every other trainer out. With the folder locked,
// a removed train.lock is only re-created (for the pid in a second trainer's message); with
// train.lock alone, a name that is no longer that file means a second trainer can have taken
// the lock, so nothing more may be written here.
inline void checkpoint_check_lock(FolderLock* lock) {
    if (lock->file_fd < 0) return;
    const std::string path = lock->dir + "/" + CHECKPOINT_LOCK_NAME;
    struct stat st;
    const int rc = lstat(path.c_str(), &st);
    const bool gone = rc != 0 && errno == ENOENT;
    if (rc == 0 && st.st_dev == lock->dev && st.st_ino == lock->ino) return;
    if (!lock->on_folder)
        llmc::fail(path + ": removed or replaced during the run, so another trainer may be writing into " + lock->dir +
                   "; no checkpoint written (the earlier ones are kept)");
    if (gone) checkpoint_lock_file_(lock);
}

// A training run's checkpoint folder (-o), as the rank that writes DONE markers keeps it.
struct CheckpointFolder {
    std::string dir;
    std::string run_id;  // the owner of the checkpoints this run writes
    int keep_last = 0;  // -nk: prune to the newest this many (0: keep all)
    std::vector<int> proven;  // the checkpoints this run wrote, and the one it resumed from
    // the files of the model's folder (none: the model is one file)
    std::vector<std::string> folder_files;
    FolderLock lock;  // held by rank 0
};
