// Data loader for llm.c token shards (header-only host C++).
//
// Shard format (llm.c): a header of 256 int32 (1024 bytes), then the tokens.
//   header[0] = 20240520, header[1] = 1: uint16 tokens
//   header[0] = 20240801, header[1] = 7: uint32 tokens (llm.c's llama3 branch)
//   header[2] = number of tokens n; the file is exactly 1024 + n * token_size bytes.
// Writers (dataloader_write_shard, prepro) use uint16 while every id of the
// vocabulary fits (V <= 65536), else uint32; the loader reads both, mixed.
// Slots [248, 253) tie the shards of one prepro run together (llm.c's files
// leave them zero and llm.c's readers ignore them; other slots are left to
// other writers, e.g. llmc/data/markov_corpus.h):
//   header[248] = DATALOADER_RUN_MARKER; without it the shard has no run id
//   header[249..250] = the run id, low word first, non-zero (prepro: a hash of
//                      the run's tokens and sharding, so equal ids mean equal shards)
//   header[251] = N, the number of train shards of the run (0: it wrote a val shard only)
//   header[252] = this shard's number: 0 the val shard, 1..N the train shards
// The shards one pattern matches must agree (dataloader_check_runs_): every one
// without a run id, or all of one run, each number once; and a glob that matches
// a train shard of a run must match all N of them (a pattern that names one
// file is that file alone). Else the pattern mixes runs (stale shards of an
// earlier run) or misses a shard, and init throws naming the files.
//
// The stream of sequences. A shard of n tokens holds floor((n-1)/T) sequences;
// sequence j is tokens [j*T, j*T+T+1): its first T tokens are the inputs, its
// last T the targets. One epoch is the sequences of every shard, shards in
// name order; with shuffle on, the order of each shard's sequences is permuted
// by a permutation that depends only on (seed, epoch, shard index), so every
// rank sees the same one. The stream repeats forever, epoch after epoch.
// Batch k on rank r of N takes the sequences [k*N*B + r*B, k*N*B + r*B + B) of
// that stream (counting from the position of the last reset or restore).
// Hence: without shuffle and with one shard a batch is B*T+1 consecutive
// tokens (as in llm.c); the ranks' batches k together are what one process
// with B' = N*B reads as its batch k; and the data of one optimizer step
// (A batches on each of N ranks) depends only on B*N*A.
//
// With DataPacking::Slots a sequence is one document instead (a "slot"):
// document j of a shard runs from its j-th document start (a token doc_token,
// which begins a document: GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>;
// or the shard's first token) to the next one, which is its last target; it is
// cut at T + 1 tokens, and the rest of the slot holds inputs doc_token with
// targets -1 (masked: no loss, no gradient). Shards are scanned for their
// document starts at init. Everything above holds with documents in place of
// sequences.
//
// The next batch is read by a background thread while the current one is
// used; results do not depend on its timing. Token ids are checked against
// vocab_size when a shard is first used (one scan of that shard, in the
// background thread); a bad id is reported by the call that would return the
// first batch reading that shard (dataloader_init for the first batch).
//
// Errors throw llmc::Error "<file or pattern>: <problem>" (llmc/error.h); a
// loader whose call threw can still be freed.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/error.h"
#include "llmc/rand.h"
#include "llmc/formats/regular_file.h"

#define DATALOADER_MAGIC_U16 20240520
#define DATALOADER_VERSION_U16 1
#define DATALOADER_MAGIC_U32 20240801
#define DATALOADER_VERSION_U32 7
#define DATALOADER_HEADER_INTS 256
#define DATALOADER_HEADER_BYTES (DATALOADER_HEADER_INTS * 4)
#define DATALOADER_RUN_SLOT 248           // header[248..252]: the prepro run (see above)
#define DATALOADER_RUN_MARKER 0x314E5552  // "RUN1" in little-endian bytes
#define DATALOADER_POSITION_MAGIC 0x44504F53u  // "SOPD"
#define DATALOADER_POSITION_VERSION 1u

struct DataLoaderImpl;

enum class DataPacking { Packed, Slots };
// The packings' names (--packing), in DataPacking's order; null-terminated.
inline constexpr const char* DATA_PACKING_NAMES[] = {"packed", "slots", nullptr};

struct DataLoader {
    // configuration, as given to dataloader_init
    int B, T;
    int process_rank, num_processes;
    int vocab_size;        // token ids must be < vocab_size (no check when <= 0)
    bool shuffle;
    uint64_t seed;
    DataPacking packing;
    int doc_token;         // Slots: the token that starts a document; -1: none (Packed)
    // the data
    size_t num_shards;
    size_t num_tokens;     // total over shards
    size_t num_sequences;  // sequences in one epoch: sum over shards of floor((n-1)/T) (Slots: of documents)
    // the batch: host arrays of B*T each, valid after dataloader_next_batch.
    // The pointers stay the same for the loader's lifetime.
    int* inputs;
    int* targets;
    uint64_t epoch;        // epoch of the first sequence of this rank's last batch
    DataLoaderImpl* impl;  // internal state (the struct may be moved by value; use and free one copy)
};

// Where the stream stands: plain fixed-size fields, written to a file as is.
// next_sequence is the index in the global stream (counting over epochs) of
// the first sequence of the next step (rank 0's first sequence of the batch
// the next dataloader_next_batch returns). A position can be restored into a
// loader over the same data with the same T, shuffle and seed; B and the
// number of processes may differ (the stream then continues from that
// sequence with the new split).
struct DataLoaderPosition {
    uint32_t magic;          // DATALOADER_POSITION_MAGIC
    uint32_t version;        // DATALOADER_POSITION_VERSION
    uint64_t next_sequence;
    uint64_t num_sequences;  // per epoch: identifies the data with num_tokens
    uint64_t num_tokens;
    uint64_t seed;
    int32_t T;
    int32_t shuffle;
    int32_t B;               // as saved (informational)
    int32_t num_processes;   // as saved (informational)
};
static_assert(sizeof(DataLoaderPosition) == 56, "DataLoaderPosition must have no padding");

// ---------------------------------------------------------------------------
// implementation

struct DataLoaderShard {
    std::string path;
    int token_size;       // 2 or 4
    uint64_t ntok;
    uint64_t nseq;        // floor((ntok-1)/T); Slots: documents
    std::vector<uint64_t> doc_starts;  // Slots: token offset of each document's first token
    uint64_t first_seq;   // index of its first sequence within an epoch
    bool validated;       // token ids checked (worker thread only)
    uint64_t run_id = 0;  // the prepro run that wrote it; 0: none (header[248..252])
    int32_t run_shards = 0, run_number = 0;  // N train shards of that run; this one's number, 0..N
};

struct DataLoaderImpl {
    std::string pattern;
    // a copy of the configuration, so that the worker never reads the DataLoader
    // itself (which the caller may copy or move)
    int B = 0, T = 0, rank = 0, nproc = 1, vocab_size = 0, doc_token = -1;
    bool shuffle = false;
    uint64_t seed = 0;
    DataPacking packing = DataPacking::Packed;
    uint64_t num_sequences = 0;
    std::vector<DataLoaderShard> shards;  // every matching file, in name order
    uint64_t cursor = 0;                  // global index of the next step's first sequence
    // prefetch: the worker fills stage_* with the batch of step `job_cursor`
    std::thread worker;
    std::mutex mu;
    std::condition_variable cv;
    bool job_pending = false;  // a job is requested or running
    bool job_done = false;     // stage_* holds the batch of job_cursor (or error is set)
    bool quit = false;
    uint64_t job_cursor = 0;
    std::string error;         // set by the worker: the message of the llmc::Error to throw
    std::vector<int> stage_inputs, stage_targets;
    // worker-only state
    int fd = -1;
    size_t fd_shard = (size_t)-1;
    std::vector<unsigned char> buf;
};

[[noreturn]] inline void dataloader_fail_(const std::string& where, const std::string& what) {
    llmc::fail(where + ": " + what);
}

inline std::string dataloader_fmt_(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string dataloader_fmt_(const char* fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    return std::string(tmp);
}

// A pseudo-random permutation of [0, n) keyed by `key`, evaluated at j without
// storing it: a 6-round balanced Feistel network on the smallest even number
// of bits covering n, with cycle walking back into [0, n).
inline uint64_t dataloader_permute_(uint64_t j, uint64_t n, uint64_t key) {
    if (n <= 1) return j;
    int bits = 2;
    while (bits < 64 && (1ull << bits) < n) bits++;
    if (bits & 1) bits++;
    const int half = bits / 2;
    const uint64_t mask = (1ull << half) - 1;
    uint64_t x = j;
    do {
        uint64_t L = x >> half, R = x & mask;
        for (int round = 0; round < 6; round++) {
            uint64_t f = splitmix64(key ^ splitmix64(R + ((uint64_t)round << 56))) & mask;
            uint64_t nl = R;
            R = L ^ f;
            L = nl;
        }
        x = (L << half) | R;
    } while (x >= n);
    return x;
}

// Reads exactly `count` bytes at `offset`; false on error or end of file.
inline bool dataloader_pread_all_(int fd, void* dst, size_t count, uint64_t offset) {
    unsigned char* p = (unsigned char*)dst;
    while (count > 0) {
        ssize_t got = pread(fd, p, count, (off_t)offset);
        if (got < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (got == 0) {
            errno = EIO;
            return false;
        }
        p += got;
        count -= (size_t)got;
        offset += (uint64_t)got;
    }
    return true;
}

// Opens a shard and checks its header and size (main thread, at init).
inline DataLoaderShard dataloader_open_shard_(const std::string& path, int T) {
    DataLoaderShard s;
    s.path = path;
    std::string why;
    int fd = open_regular_file(path.c_str(), &why);
    if (fd < 0) dataloader_fail_(path, why == NOT_A_REGULAR_FILE ? why : "cannot open: " + why);
    struct stat st;
    uint64_t size = 0;
    int32_t header[DATALOADER_HEADER_INTS];
    std::string problem;  // thrown once the file is closed
    if (fstat(fd, &st) != 0) problem = dataloader_fmt_("cannot stat: %s", strerror(errno));
    else if (!S_ISREG(st.st_mode)) problem = "not a regular file";
    else if ((size = (uint64_t)st.st_size) < DATALOADER_HEADER_BYTES)
        problem = dataloader_fmt_("truncated: %llu bytes, less than the %d-byte header", (unsigned long long)size,
                                  DATALOADER_HEADER_BYTES);
    else if (!dataloader_pread_all_(fd, header, sizeof(header), 0))
        problem = dataloader_fmt_("cannot read the header: %s", strerror(errno));
    close(fd);
    if (!problem.empty()) dataloader_fail_(path, problem);
    if (header[0] == DATALOADER_MAGIC_U16) {
        if (header[1] != DATALOADER_VERSION_U16)
            dataloader_fail_(path, dataloader_fmt_("wrong version %d for magic %d (expected %d: uint16 tokens)",
                                                   header[1], header[0], DATALOADER_VERSION_U16));
        s.token_size = 2;
    } else if (header[0] == DATALOADER_MAGIC_U32) {
        if (header[1] != DATALOADER_VERSION_U32)
            dataloader_fail_(path, dataloader_fmt_("wrong version %d for magic %d (expected %d: uint32 tokens)",
                                                   header[1], header[0], DATALOADER_VERSION_U32));
        s.token_size = 4;
    } else {
        dataloader_fail_(path, dataloader_fmt_("wrong magic %d (expected %d or %d): not a token shard", header[0],
                                               DATALOADER_MAGIC_U16, DATALOADER_MAGIC_U32));
    }
    if (header[2] < 0) dataloader_fail_(path, dataloader_fmt_("negative token count %d in the header", header[2]));
    s.ntok = (uint64_t)(uint32_t)header[2];
    uint64_t expected = DATALOADER_HEADER_BYTES + s.ntok * (uint64_t)s.token_size;
    if (size < expected)
        dataloader_fail_(
            path, dataloader_fmt_("truncated: the header says %llu tokens (%llu bytes) but the file has %llu bytes",
                                  (unsigned long long)s.ntok, (unsigned long long)expected, (unsigned long long)size));
    if (size > expected)
        dataloader_fail_(
            path, dataloader_fmt_("size mismatch: the header says %llu tokens (%llu bytes) but the file has %llu bytes",
                                  (unsigned long long)s.ntok, (unsigned long long)expected, (unsigned long long)size));
    if (header[DATALOADER_RUN_SLOT] == DATALOADER_RUN_MARKER) {
        s.run_id = (uint64_t)(uint32_t)header[DATALOADER_RUN_SLOT + 1] |
                   ((uint64_t)(uint32_t)header[DATALOADER_RUN_SLOT + 2] << 32);
        s.run_shards = header[DATALOADER_RUN_SLOT + 3];
        s.run_number = header[DATALOADER_RUN_SLOT + 4];
        if (s.run_id == 0 || s.run_shards < 0 || s.run_number < 0 || s.run_number > s.run_shards)
            dataloader_fail_(path, dataloader_fmt_("bad prepro run slots in the header: run id %016llx, shard %d of "
                                                   "%d train shards (header[248..252])",
                                                   (unsigned long long)s.run_id, s.run_number, s.run_shards));
    }
    s.nseq = s.ntok >= 1 ? (s.ntok - 1) / (uint64_t)T : 0;
    s.first_seq = 0;
    s.validated = false;
    return s;
}

// Slots: the offsets at which the shard's documents start: 0, and every other
// token `doc_token` (main thread, at init).
// Every token of the shard open as fd, in order, in chunks of 2^20:
// visit(offset, id) until it returns false. False only on a read error (errno).
template <class Visit>
inline bool dataloader_scan_tokens_(int fd, const DataLoaderShard& s, std::vector<unsigned char>& buf, Visit visit) {
    const size_t chunk_tokens = 1 << 20;
    buf.resize(chunk_tokens * 4);
    for (uint64_t t0 = 0; t0 < s.ntok; t0 += chunk_tokens) {
        const size_t cnt = (size_t)std::min<uint64_t>(chunk_tokens, s.ntok - t0);
        if (!dataloader_pread_all_(fd, buf.data(), cnt * s.token_size, DATALOADER_HEADER_BYTES + t0 * s.token_size))
            return false;
        for (size_t i = 0; i < cnt; i++) {
            uint32_t id;
            if (s.token_size == 2) {
                uint16_t v;
                memcpy(&v, &buf[i * 2], 2);
                id = v;
            } else memcpy(&id, &buf[i * 4], 4);
            if (!visit(t0 + i, id)) return true;
        }
    }
    return true;
}

inline std::vector<uint64_t> dataloader_document_starts_(const DataLoaderShard& s, uint32_t doc_token) {
    std::vector<uint64_t> starts;
    std::string why;
    const int fd = open_regular_file(s.path.c_str(), &why);
    if (fd < 0) dataloader_fail_(s.path, "cannot open: " + why);
    std::vector<unsigned char> buf;
    const bool read = dataloader_scan_tokens_(fd, s, buf, [&](uint64_t k, uint32_t id) {
        if (k == 0 || id == doc_token) starts.push_back(k);
        return true;
    });
    const int read_errno = errno;
    close(fd);
    if (!read) dataloader_fail_(s.path, dataloader_fmt_("cannot read: %s", strerror(read_errno)));
    return starts;
}

// Worker: makes impl->fd the open file of shard `si`; "" or an error message
// (the worker thread never throws: its errors reach the caller's thread as text).
inline std::string dataloader_use_shard_(DataLoaderImpl* im, size_t si, int vocab_size) {
    DataLoaderShard& s = im->shards[si];
    if (im->fd_shard != si) {
        if (im->fd >= 0) close(im->fd);
        im->fd_shard = (size_t)-1;
        std::string why;
        im->fd = open_regular_file(s.path.c_str(), &why);
        if (im->fd < 0) return s.path + ": cannot open: " + why;
        im->fd_shard = si;
    }
    if (!s.validated) {
        if (vocab_size > 0) {
            std::string bad;
            const bool read = dataloader_scan_tokens_(im->fd, s, im->buf, [&](uint64_t k, uint32_t id) {
                if (id < (uint32_t)vocab_size) return true;
                bad = dataloader_fmt_("token id %u at token offset %llu (byte offset %llu) is >= vocab_size %d", id,
                                      (unsigned long long)k,
                                      (unsigned long long)(DATALOADER_HEADER_BYTES + k * (uint64_t)s.token_size),
                                      vocab_size);
                return false;
            });
            if (!read) return s.path + ": cannot read: " + strerror(errno);
            if (!bad.empty()) return s.path + ": " + bad;
        }
        s.validated = true;
    }
    return "";
}

// Worker: fills stage_* with this rank's batch of the step starting at global
// sequence `cursor`. Returns "" or an error message.
inline std::string dataloader_fill_(DataLoaderImpl* im, uint64_t cursor) {
    const int B = im->B, T = im->T;
    const uint64_t S = im->num_sequences;
    std::vector<unsigned char> seqbuf((size_t)(T + 1) * 4);
    for (int b = 0; b < B; b++) {
        uint64_t g = cursor + (uint64_t)im->rank * B + (uint64_t)b;
        uint64_t epoch = g / S, i = g % S;
        // the shard holding epoch-local sequence i: last shard with first_seq <= i and nseq > 0
        size_t lo = 0, hi = im->shards.size();  // find the last shard with first_seq <= i
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (im->shards[mid].first_seq <= i) lo = mid;
            else hi = mid;
        }
        while (im->shards[lo].nseq == 0 || i >= im->shards[lo].first_seq + im->shards[lo].nseq)
            lo++;  // skip empty shards
        const DataLoaderShard& s = im->shards[lo];
        uint64_t j = i - s.first_seq;
        if (im->shuffle) {
            uint64_t key = splitmix64(splitmix64(im->seed ^ 0x53485546464C45ull) ^ splitmix64(epoch)) ^
                           splitmix64((uint64_t)lo * SPLITMIX64_INCREMENT + 0x1234567ull);
            j = dataloader_permute_(j, s.nseq, key);
        }
        std::string err = dataloader_use_shard_(im, lo, im->vocab_size);
        if (!err.empty()) return err;
        // tokens [first, first + n) of the shard; `real` of them are inputs with a target
        uint64_t first = j * (uint64_t)T;
        int n = T + 1, real = T;
        if (im->packing == DataPacking::Slots) {
            first = s.doc_starts[j];
            const uint64_t next = j + 1 < s.nseq ? s.doc_starts[j + 1] + 1 : s.ntok;  // through the next start
            n = (int)std::min<uint64_t>(next - first, (uint64_t)T + 1);
            real = n - 1;
        }
        uint64_t off = DATALOADER_HEADER_BYTES + first * (uint64_t)s.token_size;
        if (!dataloader_pread_all_(im->fd, seqbuf.data(), (size_t)n * s.token_size, off))
            return s.path + ": cannot read: " + strerror(errno);
        int* in = im->stage_inputs.data() + (size_t)b * T;
        int* tg = im->stage_targets.data() + (size_t)b * T;
        for (int t = 0; t < n; t++) {
            uint32_t id;
            if (s.token_size == 2) {
                uint16_t v;
                memcpy(&v, &seqbuf[(size_t)t * 2], 2);
                id = v;
            } else memcpy(&id, &seqbuf[(size_t)t * 4], 4);
            if (t < real) in[t] = (int)id;
            if (t > 0) tg[t - 1] = (int)id;
        }
        for (int t = real; t < T; t++) {  // the slot's padding
            in[t] = im->doc_token;
            tg[t] = -1;
        }
    }
    return "";
}

inline void dataloader_worker_(DataLoaderImpl* im) {
    std::unique_lock<std::mutex> lock(im->mu);
    for (;;) {
        im->cv.wait(lock, [&] { return im->quit || (im->job_pending && !im->job_done); });
        if (im->quit) break;
        uint64_t cursor = im->job_cursor;
        lock.unlock();
        std::string err = dataloader_fill_(im, cursor);
        lock.lock();
        im->error = err;
        im->job_done = true;
        im->cv.notify_all();
    }
}

// Waits for the job in flight (if any) to finish; the lock must be held.
inline void dataloader_wait_idle_(DataLoaderImpl* im, std::unique_lock<std::mutex>& lock) {
    im->cv.wait(lock, [&] { return !im->job_pending || im->job_done; });
}

// Asks the worker for the batch of the step starting at `cursor`.
inline void dataloader_request_(DataLoaderImpl* im, uint64_t cursor) {
    std::unique_lock<std::mutex> lock(im->mu);
    dataloader_wait_idle_(im, lock);
    im->job_cursor = cursor;
    im->job_pending = true;
    im->job_done = false;
    im->error.clear();
    im->cv.notify_all();
}

// The shard files of a pattern, in byte order (whatever the locale); throws when
// none matches. A pattern that names an existing file is that file, so a
// path with glob characters in it ([, ], *, ?) works as it is.
inline std::vector<std::string> dataloader_find_shards(const char* pattern) {
    struct stat st;
    if (stat(pattern, &st) == 0) return {pattern};
    std::vector<std::string> paths;
    glob_t g;
    memset(&g, 0, sizeof(g));
    int rc = glob(pattern, GLOB_NOSORT, nullptr, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        dataloader_fail_(pattern, "no file matches");
    }
    if (rc != 0) {
        globfree(&g);
        dataloader_fail_(pattern, rc == GLOB_NOSPACE ? "glob: out of memory" : "glob: read error");
    }
    for (size_t i = 0; i < g.gl_pathc; i++) paths.push_back(g.gl_pathv[i]);
    globfree(&g);
    std::sort(paths.begin(), paths.end());
    return paths;
}

// Waits for the requested batch; throws the worker's error.
inline void dataloader_wait_ready_(DataLoaderImpl* im) {
    std::unique_lock<std::mutex> lock(im->mu);
    im->cv.wait(lock, [&] { return im->job_pending && im->job_done; });
    if (!im->error.empty()) llmc::fail(im->error);
}

// The shards pattern matched (opened) come from one prepro run, or none has a
// run id: a run's shards mixed with another writer's are stale shards of an
// earlier run (or foreign ones), which the checks of token ids cannot tell when
// the ids are below the vocabulary size. A glob must also match every train
// shard of the run, each once (a pattern that names one file takes it alone).
inline void dataloader_check_runs_(const std::string& pattern, const std::vector<DataLoaderShard>& shards) {
    const DataLoaderShard* run = nullptr;    // the first shard with a run id
    const DataLoaderShard* plain = nullptr;  // the first shard without
    for (const DataLoaderShard& s : shards) {
        if (s.run_id && !run) run = &s;
        if (!s.run_id && !plain) plain = &s;
    }
    if (!run) return;
    const std::string hint = "; the shards of one pattern must come from one prepro run (re-run prepro with --replace, "
                             "or remove the stale shards)";
    if (plain)
        dataloader_fail_(plain->path, dataloader_fmt_("has no prepro run id, but %s was written by prepro run %016llx",
                                                      run->path.c_str(), (unsigned long long)run->run_id) +
                                          hint);
    std::vector<std::pair<int32_t, const DataLoaderShard*>> numbers;  // (shard number, shard)
    for (const DataLoaderShard& s : shards) {
        if (s.run_id != run->run_id)
            dataloader_fail_(s.path, dataloader_fmt_("written by prepro run %016llx, another run than %s (%016llx)",
                                                     (unsigned long long)s.run_id, run->path.c_str(),
                                                     (unsigned long long)run->run_id) +
                                         hint);
        if (s.run_shards != run->run_shards)
            dataloader_fail_(s.path, dataloader_fmt_("says prepro run %016llx wrote %d train shards, %s says %d",
                                                     (unsigned long long)s.run_id, s.run_shards, run->path.c_str(),
                                                     run->run_shards));
        numbers.push_back({s.run_number, &s});
    }
    std::sort(numbers.begin(), numbers.end());
    for (size_t i = 1; i < numbers.size(); i++)
        if (numbers[i].first == numbers[i - 1].first)
            dataloader_fail_(numbers[i].second->path,
                             dataloader_fmt_("is shard %d of prepro run %016llx, and so is %s (a copy?)",
                                             numbers[i].first, (unsigned long long)run->run_id,
                                             numbers[i - 1].second->path.c_str()));
    const bool literal = shards.size() == 1 && shards[0].path == pattern;
    const DataLoaderShard* train = numbers.back().first >= 1 ? numbers.back().second : nullptr;
    if (literal || !train) return;
    int32_t want = 1;  // the train numbers, sorted and distinct, must be 1..N
    for (const auto& n : numbers) {
        if (n.first == 0) continue;
        if (n.first != want) break;
        want++;
    }
    if (want <= run->run_shards)
        dataloader_fail_(pattern,
                         dataloader_fmt_("misses train shard %d of the %d of prepro run %016llx (%s is one "
                                         "of them): a pattern must match every train shard of the run",
                                         want, run->run_shards, (unsigned long long)run->run_id, train->path.c_str()));
}

// The shards of paths with their sequences (packed: floor((n-1)/T) of a shard of n
// tokens; slots: one per document) and where each shard's first sequence is.
inline std::vector<DataLoaderShard> dataloader_open_shards_(const std::string& pattern,
                                                            const std::vector<std::string>& paths, int T,
                                                            DataPacking packing, int doc_token) {
    std::vector<DataLoaderShard> shards;
    for (const std::string& p : paths) shards.push_back(dataloader_open_shard_(p, T));
    dataloader_check_runs_(pattern, shards);
    uint64_t total_seq = 0;
    for (DataLoaderShard& s : shards) {
        if (packing == DataPacking::Slots) {
            s.doc_starts = dataloader_document_starts_(s, (uint32_t)doc_token);
            s.nseq = s.doc_starts.size();
        }
        s.first_seq = total_seq;
        total_seq += s.nseq;
    }
    return shards;
}

// How many sequences of T tokens the shards of pattern hold (as the loader counts
// them): a loader of batch B needs at least B. Slots: documents start at doc_token.
inline uint64_t dataloader_count_sequences(const char* pattern, int T, DataPacking packing = DataPacking::Packed,
                                           int doc_token = -1) {
    uint64_t total = 0;
    for (const DataLoaderShard& s :
         dataloader_open_shards_(pattern, dataloader_find_shards(pattern), T, packing, doc_token))
        total += s.nseq;
    return total;
}

inline void dataloader_free(DataLoader* loader);

// Slots: documents start at doc_token, in [0, vocab_size).
inline void dataloader_init(DataLoader* loader, const char* pattern, int B, int T, int process_rank, int num_processes,
                            int vocab_size, bool shuffle, uint64_t seed, DataPacking packing = DataPacking::Packed,
                            int doc_token = -1) {
    const std::string where = pattern ? pattern : "(null)";
    if (!pattern) dataloader_fail_(where, "no shard pattern given");
    if (B <= 0 || T <= 0)
        dataloader_fail_(where, dataloader_fmt_("batch size B=%d and sequence length T=%d must be positive", B, T));
    if (num_processes <= 0 || process_rank < 0 || process_rank >= num_processes)
        dataloader_fail_(where, dataloader_fmt_("process rank %d is not in [0, %d)", process_rank, num_processes));
    if (packing == DataPacking::Slots && (doc_token < 0 || (vocab_size > 0 && doc_token >= vocab_size)))
        dataloader_fail_(where, dataloader_fmt_("one document per slot needs the token that starts a document, in "
                                                "[0, vocab_size %d): got %d",
                                                vocab_size, doc_token));

    const std::vector<std::string> paths = dataloader_find_shards(pattern);
    std::vector<DataLoaderShard> shards = dataloader_open_shards_(where, paths, T, packing, doc_token);
    uint64_t total_tok = 0, total_seq = 0;
    for (const DataLoaderShard& s : shards) {
        total_tok += s.ntok;
        total_seq += s.nseq;
    }
    const uint64_t need = (uint64_t)B * (uint64_t)T + 1;
    if (packing == DataPacking::Packed && total_tok < need)
        dataloader_fail_(
            where, dataloader_fmt_("too few tokens: %llu in %zu shard(s), need at least B*T+1 = %llu (B=%d, T=%d)",
                                   (unsigned long long)total_tok, paths.size(), (unsigned long long)need, B, T));
    if (total_seq < (uint64_t)B && packing == DataPacking::Slots)
        dataloader_fail_(where, dataloader_fmt_("too few documents: the %zu shard(s) hold %llu, need at least B = %d "
                                                "(one per slot)",
                                                paths.size(), (unsigned long long)total_seq, B));
    if (total_seq < (uint64_t)B)
        dataloader_fail_(where,
                         dataloader_fmt_("too few sequences: the %zu shard(s) hold %llu sequences of T+1 = %d tokens "
                                         "(a shard of n tokens holds floor((n-1)/T)), need at least B = %d",
                                         paths.size(), (unsigned long long)total_seq, T + 1, B));

    DataLoaderImpl* im = new DataLoaderImpl();
    im->pattern = where;
    im->shards = std::move(shards);
    loader->B = B;
    loader->T = T;
    loader->process_rank = process_rank;
    loader->num_processes = num_processes;
    loader->vocab_size = vocab_size;
    loader->shuffle = shuffle;
    loader->seed = seed;
    loader->packing = packing;
    loader->doc_token = packing == DataPacking::Slots ? doc_token : -1;
    loader->num_shards = im->shards.size();
    loader->num_tokens = (size_t)total_tok;
    loader->num_sequences = (size_t)total_seq;
    loader->inputs = (int*)calloc((size_t)B * T, sizeof(int));
    loader->targets = (int*)calloc((size_t)B * T, sizeof(int));
    loader->epoch = 0;
    loader->impl = im;
    im->stage_inputs.assign((size_t)B * T, 0);
    im->stage_targets.assign((size_t)B * T, 0);
    im->B = B;
    im->T = T;
    im->rank = process_rank;
    im->nproc = num_processes;
    im->vocab_size = vocab_size;
    im->shuffle = shuffle;
    im->seed = seed;
    im->packing = packing;
    im->doc_token = loader->doc_token;
    im->num_sequences = total_seq;
    im->cursor = 0;
    im->worker = std::thread(dataloader_worker_, im);
    dataloader_request_(im, 0);
    try {
        dataloader_wait_ready_(im);  // errors in the first batch's shard show here
    } catch (...) {
        dataloader_free(loader);  // the worker is stopped before the error leaves
        throw;
    }
}

inline void dataloader_next_batch(DataLoader* loader) {
    DataLoaderImpl* im = loader->impl;
    dataloader_wait_ready_(im);
    const size_t n = (size_t)loader->B * loader->T;
    memcpy(loader->inputs, im->stage_inputs.data(), n * sizeof(int));
    memcpy(loader->targets, im->stage_targets.data(), n * sizeof(int));
    loader->epoch = (im->cursor + (uint64_t)loader->process_rank * loader->B) / loader->num_sequences;
    im->cursor += (uint64_t)loader->num_processes * loader->B;
    dataloader_request_(im, im->cursor);
}

inline void dataloader_reset(DataLoader* loader) {
    DataLoaderImpl* im = loader->impl;
    im->cursor = 0;
    loader->epoch = 0;
    dataloader_request_(im, 0);
}

inline DataLoaderPosition dataloader_position(const DataLoader* loader) {
    DataLoaderPosition p;
    memset(&p, 0, sizeof(p));
    p.magic = DATALOADER_POSITION_MAGIC;
    p.version = DATALOADER_POSITION_VERSION;
    p.next_sequence = loader->impl->cursor;
    p.num_sequences = loader->num_sequences;
    p.num_tokens = loader->num_tokens;
    p.seed = loader->seed;
    p.T = loader->T;
    p.shuffle = loader->shuffle ? 1 : 0;
    p.B = loader->B;
    p.num_processes = loader->num_processes;
    return p;
}

inline void dataloader_restore(DataLoader* loader, const DataLoaderPosition& p) {
    DataLoaderImpl* im = loader->impl;
    const std::string& where = im->pattern;
    if (p.magic != DATALOADER_POSITION_MAGIC || p.version != DATALOADER_POSITION_VERSION)
        dataloader_fail_(
            where, dataloader_fmt_("cannot restore the data position: not a position record (magic 0x%08x, version %u)",
                                   p.magic, p.version));
    if (p.T != loader->T || p.num_sequences != loader->num_sequences || p.num_tokens != loader->num_tokens)
        dataloader_fail_(where,
                         dataloader_fmt_("cannot restore the data position: it was saved for T=%d over %llu tokens "
                                         "(%llu sequences), this loader has T=%d over %llu tokens (%llu sequences)",
                                         p.T, (unsigned long long)p.num_tokens, (unsigned long long)p.num_sequences,
                                         loader->T, (unsigned long long)loader->num_tokens,
                                         (unsigned long long)loader->num_sequences));
    if ((p.shuffle != 0) != loader->shuffle || (loader->shuffle && p.seed != loader->seed))
        dataloader_fail_(where,
                         dataloader_fmt_("cannot restore the data position: it was saved with shuffle=%d seed=%llu, "
                                         "this loader has shuffle=%d seed=%llu",
                                         p.shuffle, (unsigned long long)p.seed, loader->shuffle ? 1 : 0,
                                         (unsigned long long)loader->seed));
    im->cursor = p.next_sequence;
    loader->epoch = p.next_sequence / loader->num_sequences;
    dataloader_request_(im, im->cursor);
}

inline void dataloader_free(DataLoader* loader) {
    DataLoaderImpl* im = loader->impl;
    if (!im) return;
    {
        std::unique_lock<std::mutex> lock(im->mu);
        dataloader_wait_idle_(im, lock);
        im->quit = true;
        im->cv.notify_all();
    }
    if (im->worker.joinable()) im->worker.join();
    if (im->fd >= 0) close(im->fd);
    delete im;
    free(loader->inputs);
    free(loader->targets);
    loader->inputs = loader->targets = nullptr;
    loader->impl = nullptr;
}

// ---------------------------------------------------------------------------
// writing shards

// The bytes per token of a shard for a vocabulary of vocab_size ids: 2 while
// every id (< vocab_size) fits a uint16, else 4 (llm.c's uint32 variant).
inline int dataloader_token_size(int vocab_size) { return vocab_size > 65536 ? 4 : 2; }

// The 1024-byte header of a shard of ntok tokens of token_size bytes (2 or 4);
// the spare slots [3, 256) are zero.
inline void dataloader_shard_header(int32_t header[DATALOADER_HEADER_INTS], int token_size, uint64_t ntok) {
    if ((token_size != 2 && token_size != 4) || ntok > (uint64_t)INT32_MAX)
        llmc::fail(
            dataloader_fmt_("internal: a shard of %llu tokens of %d bytes", (unsigned long long)ntok, token_size));
    memset(header, 0, DATALOADER_HEADER_BYTES);
    header[0] = token_size == 2 ? DATALOADER_MAGIC_U16 : DATALOADER_MAGIC_U32;
    header[1] = token_size == 2 ? DATALOADER_VERSION_U16 : DATALOADER_VERSION_U32;
    header[2] = (int32_t)ntok;
}

// The tokens as a shard's data: n little-endian ids of token_size bytes; an id
// that does not fit throws (a uint16 shard cannot hold 65536).
inline void dataloader_pack_tokens(const uint32_t* tokens, size_t n, int token_size, std::vector<unsigned char>* out) {
    out->resize(n * (size_t)token_size);
    for (size_t i = 0; i < n; i++) {
        if (token_size == 2) {
            if (tokens[i] > 0xFFFFu) llmc::fail(dataloader_fmt_("token id %u does not fit a uint16 shard", tokens[i]));
            const uint16_t v = (uint16_t)tokens[i];
            memcpy(out->data() + i * 2, &v, 2);
        } else {
            memcpy(out->data() + i * 4, &tokens[i], 4);
        }
    }
}

// Marks a shard's header as shard `number` (0: val, 1..train_shards: train) of
// the prepro run run_id (non-zero) that wrote train_shards train shards.
inline void dataloader_set_run(int32_t header[DATALOADER_HEADER_INTS], uint64_t run_id, int32_t train_shards,
                               int32_t number) {
    header[DATALOADER_RUN_SLOT] = DATALOADER_RUN_MARKER;
    header[DATALOADER_RUN_SLOT + 1] = (int32_t)(uint32_t)(run_id & 0xFFFFFFFFu);
    header[DATALOADER_RUN_SLOT + 2] = (int32_t)(uint32_t)(run_id >> 32);
    header[DATALOADER_RUN_SLOT + 3] = train_shards;
    header[DATALOADER_RUN_SLOT + 4] = number;
}

// Writes a whole shard (header and tokens) of ids < vocab_size to path, in
// the width the vocabulary needs (dataloader_token_size).
inline void dataloader_write_shard(const std::string& path, const uint32_t* tokens, size_t n, int vocab_size) {
    const int token_size = dataloader_token_size(vocab_size);
    int32_t header[DATALOADER_HEADER_INTS];
    dataloader_shard_header(header, token_size, n);
    std::vector<unsigned char> data;
    dataloader_pack_tokens(tokens, n, token_size, &data);
    std::string why;
    FILE* f = fopen_regular_file_for_writing(path.c_str(), O_WRONLY | O_TRUNC, &why);
    if (!f) dataloader_fail_(path, "cannot create: " + why);
    bool ok = fwrite(header, 1, sizeof(header), f) == sizeof(header);
    ok = ok && fwrite(data.data(), 1, data.size(), f) == data.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok) dataloader_fail_(path, dataloader_fmt_("write failed: %s", strerror(errno)));
}
