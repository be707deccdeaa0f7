// Tests of llmc/data/dataloader.h (the llm.c shard reader) and llmc/data/markov_corpus.h
// (the built-in corpus with a known loss floor).
//
// Bad inputs throw llmc::Error "<file or pattern>: <problem>". They are run in
// child processes (this program, re-executed with --child ..., whose main is
// llmc::run_main like a tool's): each must exit with EXIT_FAILURE and print
// exactly one line `error: <file or pattern>: <problem>` on stderr. A few run in
// this process too, to see that the call throws and the loader can be freed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/data/dataloader.h"
#include "llmc/data/markov_corpus.h"
#include "test/host/host_util.h"
#include "test/test_util.h"

// Child processes exit with live allocations on purpose (a throw mid-way); no leak report there.
static bool g_child_mode = false;
extern "C" int __lsan_is_turned_off() { return g_child_mode ? 1 : 0; }

static std::string g_dir;  // temporary folder of this run

// ---------------------------------------------------------------------------
// shard writing

struct ShardSpec {
    int32_t magic = DATALOADER_MAGIC_U16, version = DATALOADER_VERSION_U16;
    bool set_ntok = false;       // header[2] = ntok instead of the real count
    int32_t ntok = 0;
    long extra_bytes = 0;        // > 0: garbage appended; < 0: bytes cut off the end
    uint64_t run_id = 0;         // != 0: marked as shard run_number of a prepro run of run_shards train shards
    int32_t run_shards = 0, run_number = 0;
};

static void write_shard(const std::string& path, const std::vector<uint32_t>& toks, int token_size,
                        ShardSpec spec = ShardSpec()) {
    if (token_size == 4 && spec.magic == DATALOADER_MAGIC_U16) {
        spec.magic = DATALOADER_MAGIC_U32;
        spec.version = DATALOADER_VERSION_U32;
    }
    int32_t h[256];
    memset(h, 0, sizeof(h));
    h[0] = spec.magic;
    h[1] = spec.version;
    h[2] = spec.set_ntok ? spec.ntok : (int32_t)toks.size();
    if (spec.run_id) dataloader_set_run(h, spec.run_id, spec.run_shards, spec.run_number);
    std::vector<unsigned char> bytes(sizeof(h));
    memcpy(bytes.data(), h, sizeof(h));
    for (uint32_t t : toks) {
        if (token_size == 2) {
            uint16_t v = (uint16_t)t;
            bytes.insert(bytes.end(), (unsigned char*)&v, (unsigned char*)&v + 2);
        } else bytes.insert(bytes.end(), (unsigned char*)&t, (unsigned char*)&t + 4);
    }
    if (spec.extra_bytes > 0) bytes.insert(bytes.end(), (size_t)spec.extra_bytes, (unsigned char)0xAB);
    if (spec.extra_bytes < 0) bytes.resize(bytes.size() - (size_t)(-spec.extra_bytes));
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) {
        perror(path.c_str());
        exit(2);
    }
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
}

// Shard k of a test dataset: token at position p is k*4096 + p (unique, < 60000 for k < 14).
static std::vector<uint32_t> shard_tokens(int k, int n) {
    std::vector<uint32_t> v(n);
    for (int p = 0; p < n; p++) v[p] = (uint32_t)(k * 4096 + p);
    return v;
}

static const int kVocab = 60000;

// A dataset folder with shards of the given token counts; returns the glob pattern.
static std::string make_dataset(const std::string& name, const std::vector<int>& sizes, int token_size = 2) {
    std::string d = g_dir + "/" + name;
    mkdir(d.c_str(), 0755);
    for (size_t k = 0; k < sizes.size(); k++) {
        char p[64];
        snprintf(p, sizeof(p), "/shard_%06zu.bin", k);
        write_shard(d + p, shard_tokens((int)k, sizes[k]), token_size);
    }
    return d + "/shard_*.bin";
}

// The sequences of one epoch without shuffle: (shard, j) in stream order.
static std::vector<std::pair<int, int>> reference_stream(const std::vector<int>& sizes, int T) {
    std::vector<std::pair<int, int>> s;
    for (size_t k = 0; k < sizes.size(); k++)
        for (int j = 0; sizes[k] >= 1 && j < (sizes[k] - 1) / T; j++) s.push_back({(int)k, j});
    return s;
}

// One batch: inputs then targets, B*T each.
static std::vector<int> take(DataLoader& L) {
    dataloader_next_batch(&L);
    size_t n = (size_t)L.B * L.T;
    std::vector<int> v(L.inputs, L.inputs + n);
    v.insert(v.end(), L.targets, L.targets + n);
    return v;
}

// The sequences of a batch as (inputs[T], targets[T]) rows.
static std::vector<std::vector<int>> rows(const std::vector<int>& batch, int B, int T) {
    std::vector<std::vector<int>> r(B);
    for (int b = 0; b < B; b++) {
        r[b].assign(batch.begin() + (size_t)b * T, batch.begin() + (size_t)b * T + T);
        r[b].insert(r[b].end(), batch.begin() + (size_t)B * T + (size_t)b * T,
                    batch.begin() + (size_t)B * T + (size_t)b * T + T);
    }
    return r;
}

// Sequence identity from its first input token: (shard, j).
static std::pair<int, int> seq_id(int first_token, int T) { return {first_token / 4096, (first_token % 4096) / T}; }

// Does a row hold exactly sequence (k, j): inputs k*4096 + j*T + t, targets + 1?
static bool row_is(const std::vector<int>& row, int k, int j, int T) {
    for (int t = 0; t < T; t++)
        if (row[t] != k * 4096 + j * T + t || row[T + t] != k * 4096 + j * T + t + 1) return false;
    return true;
}

// ---------------------------------------------------------------------------
// child processes

struct ChildResult {
    int status = -1;  // exit code, or -1 when killed by a signal
    std::string err;
    int lines = 0;
};

static ChildResult run_child(const std::vector<std::string>& args) {
    int pfd[2];
    if (pipe(pfd) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1);
        std::vector<char*> argv;
        std::string self = "/proc/self/exe";
        argv.push_back((char*)self.c_str());
        std::string flag = "--child";
        argv.push_back((char*)flag.c_str());
        for (const std::string& a : args) argv.push_back((char*)a.c_str());
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(pfd[1]);
    ChildResult r;
    char buf[4096];
    ssize_t n;
    while ((n = read(pfd[0], buf, sizeof(buf))) > 0) r.err.append(buf, (size_t)n);
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    for (char c : r.err) r.lines += (c == '\n');
    return r;
}

// Child modes:
//   load PATTERN B T VOCAB NBATCHES      init, then NBATCHES batches
//   restore PATTERN T1 T2                position of a T1 loader restored into a T2 loader
//   slots PATTERN VOCAB DOC_TOKEN        init with one document per slot
//   write PATH VOCAB ID                  dataloader_write_shard of the one token ID
//   markov DIR VOCAB                     markov_corpus_write with small counts
static int child_main(int argc, char** argv) {
    g_child_mode = true;
    std::string mode = argc > 2 ? argv[2] : "";
    if (mode == "load" && argc == 8) {
        DataLoader L;
        dataloader_init(&L, argv[3], atoi(argv[4]), atoi(argv[5]), 0, 1, atoi(argv[6]), false, 0);
        for (int i = 0; i < atoi(argv[7]); i++) dataloader_next_batch(&L);
        dataloader_free(&L);
        return 0;
    }
    if (mode == "restore" && argc == 6) {
        DataLoader a, b;
        dataloader_init(&a, argv[3], 1, atoi(argv[4]), 0, 1, kVocab, false, 0);
        dataloader_init(&b, argv[3], 1, atoi(argv[5]), 0, 1, kVocab, false, 0);
        dataloader_restore(&b, dataloader_position(&a));
        dataloader_free(&a);
        dataloader_free(&b);
        return 0;
    }
    if (mode == "restore-packed-into-slots" && argc == 4) {
        DataLoader a, b;
        dataloader_init(&a, argv[3], 1, 4, 0, 1, kVocab, false, 0);
        dataloader_init(&b, argv[3], 1, 4, 0, 1, kVocab, false, 0, DataPacking::Slots, kVocab - 1);
        dataloader_restore(&b, dataloader_position(&a));
        return 0;
    }
    if (mode == "slots" && argc == 6) {  // slots PATTERN VOCAB DOC_TOKEN
        DataLoader L;
        dataloader_init(&L, argv[3], 1, 4, 0, 1, atoi(argv[4]), false, 0, DataPacking::Slots, atoi(argv[5]));
        dataloader_free(&L);
        return 0;
    }
    if (mode == "write" && argc == 6) {  // write PATH VOCAB ID: a shard of the one token ID
        const uint32_t id = (uint32_t)strtoul(argv[5], nullptr, 10);
        dataloader_write_shard(argv[3], &id, 1, atoi(argv[4]));
        return 0;
    }
    if (mode == "markov" && argc == 5) {
        markov_corpus_write(argv[3], 1, 1000, 1000, atoi(argv[4]));
        return 0;
    }
    fprintf(stderr, "bad child arguments\n");
    return 3;
}

static void expect_error(const char* what, const std::vector<std::string>& args,
                         const std::vector<std::string>& needles) {
    ChildResult r = run_child(args);
    bool ok = r.status == EXIT_FAILURE && r.lines == 1 && r.err.rfind("error: ", 0) == 0;
    for (const std::string& n : needles) ok = ok && r.err.find(n) != std::string::npos;
    std::string shown = r.err;
    while (!shown.empty() && shown.back() == '\n') shown.pop_back();
    CHECK(ok, "bad input, %s: exit %d, one stderr line: %s", what, r.status, shown.c_str());
}

// ---------------------------------------------------------------------------
// dataloader tests

static void test_single_shard_consecutive() {
    const int B = 4, T = 8, n = 3 * B * T + 1 + 5;  // 12 sequences: 3 batches an epoch, 5 tokens unused
    std::string pat = make_dataset("one", {n});
    DataLoader L;
    dataloader_init(&L, pat.c_str(), B, T, 0, 1, kVocab, false, 0);
    bool ok = L.num_tokens == (size_t)n && L.num_sequences == 12 && L.num_shards == 1;
    bool epochs_ok = true;
    for (int k = 0; k < 9; k++) {
        dataloader_next_batch(&L);
        int base = (k % 3) * B * T;
        for (int i = 0; i < B * T; i++) ok = ok && L.inputs[i] == base + i && L.targets[i] == base + i + 1;
        epochs_ok = epochs_ok && L.epoch == (uint64_t)(k / 3);
    }
    CHECK(ok, "(i) no shuffle, one shard: batch k is the B*T+1 consecutive tokens from (k mod 3)*B*T, over 3 epochs");
    CHECK(epochs_ok, "epoch counter follows the stream (3 batches an epoch)");
    dataloader_reset(&L);
    dataloader_next_batch(&L);
    ok = true;
    for (int i = 0; i < B * T; i++) ok = ok && L.inputs[i] == i && L.targets[i] == i + 1;
    CHECK(ok && L.epoch == 0, "reset: the next batch is batch 0 again");
    dataloader_free(&L);
}

static void test_reference_stream() {
    // leftover tokens, a shard without a whole sequence, an empty shard
    const int T = 8;
    const std::vector<int> sizes = {T * 5 + 1, T * 3 + 4, 2, 0, T * 7 + 1};
    std::string pat = make_dataset("ref", sizes);
    auto ref = reference_stream(sizes, T);
    const int B = 3, N = 2;
    bool ok = true;
    for (int r = 0; r < N; r++) {
        DataLoader L;
        dataloader_init(&L, pat.c_str(), B, T, r, N, kVocab, false, 0);
        ok = ok && L.num_sequences == ref.size() && L.num_shards == sizes.size();
        for (int k = 0; k < 12; k++) {  // 72 sequences: several epochs of 15, wrapping mid-batch
            auto rw = rows(take(L), B, T);
            for (int b = 0; b < B; b++) {
                auto id = ref[((size_t)k * N * B + (size_t)r * B + b) % ref.size()];
                ok = ok && row_is(rw[b], id.first, id.second, T);
            }
        }
        dataloader_free(&L);
    }
    CHECK(ok, "no shuffle, 5 shards (leftovers, a 2-token and an empty shard), 2 ranks: batch k on rank r is sequences "
              "[k*N*B + r*B, +B) of the stream, wrapping over epochs");
}

static void test_union_over_ranks(bool shuffle) {
    const int T = 8, B = 2, N = 3;
    const std::vector<int> sizes = {T * 9 + 1, T * 4 + 3, T * 11 + 1};
    std::string pat = make_dataset(shuffle ? "union_s" : "union", sizes);
    DataLoader single;
    dataloader_init(&single, pat.c_str(), N * B, T, 0, 1, kVocab, shuffle, 42);
    std::vector<DataLoader> ranks(N);
    for (int r = 0; r < N; r++) dataloader_init(&ranks[r], pat.c_str(), B, T, r, N, kVocab, shuffle, 42);
    bool ok = true;
    for (int k = 0; k < 20; k++) {
        auto want = rows(take(single), N * B, T);
        for (int r = 0; r < N; r++) {
            auto got = rows(take(ranks[r]), B, T);
            for (int b = 0; b < B; b++) ok = ok && got[b] == want[(size_t)r * B + b];
        }
    }
    for (int r = 0; r < N; r++) dataloader_free(&ranks[r]);
    dataloader_free(&single);
    CHECK(ok,
          "(ii) shuffle %s: ranks 0..2 of B=2 together read, in order, what one process with B=6 reads (20 batches)",
          shuffle ? "on" : "off");
}

// The sequences of optimizer step s for a (B, N, A) split, in rank-major order of reading.
static std::vector<std::vector<std::vector<int>>> steps_of(const std::string& pat, int T, int B, int N, int A,
                                                           bool shuffle, int nsteps) {
    std::vector<std::vector<std::vector<int>>> out(nsteps);
    for (int r = 0; r < N; r++) {
        DataLoader L;
        dataloader_init(&L, pat.c_str(), B, T, r, N, kVocab, shuffle, 7);
        for (int s = 0; s < nsteps; s++)
            for (int a = 0; a < A; a++)
                for (auto& row : rows(take(L), B, T)) out[s].push_back(row);
        dataloader_free(&L);
    }
    return out;
}

static void test_splits(bool shuffle) {
    const int T = 4;
    const std::vector<int> sizes = {T * 17 + 1, T * 10 + 2, T * 13 + 1};  // 40 sequences: steps cross shards and epochs
    std::string pat = make_dataset(shuffle ? "split_s" : "split", sizes);
    const int nsteps = 7;
    // B*N*A = 12
    auto base = steps_of(pat, T, 12, 1, 1, shuffle, nsteps);
    const int splits[][3] = {{6, 1, 2}, {4, 3, 1}, {2, 3, 2}, {1, 4, 3}, {3, 2, 2}, {1, 12, 1}, {1, 1, 12}};
    for (auto& sp : splits) {
        auto got = steps_of(pat, T, sp[0], sp[1], sp[2], shuffle, nsteps);
        bool same_set = true;
        for (int s = 0; s < nsteps; s++) {
            auto a = got[s], b = base[s];
            std::sort(a.begin(), a.end());
            std::sort(b.begin(), b.end());
            same_set = same_set && a == b && a.size() == 12;
        }
        CHECK(same_set,
              "(iii) shuffle %s: each of 7 optimizer steps of B=%d N=%d A=%d consumes the same 12 sequences as B=12 "
              "N=1 A=1",
              shuffle ? "on" : "off", sp[0], sp[1], sp[2]);
    }
    // B=8 N=1 A=1 against B=4 N=1 A=2: the same sequences in the same order
    auto b8 = steps_of(pat, T, 8, 1, 1, shuffle, nsteps);
    auto b4 = steps_of(pat, T, 4, 1, 2, shuffle, nsteps);
    CHECK(b8 == b4, "(iii) shuffle %s: B=8 A=1 and B=4 A=2 read the same sequences in the same order, step by step",
          shuffle ? "on" : "off");
}

static void test_permutation() {
    bool ok = true;
    for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 100ull, 1000ull, 4097ull, 65536ull}) {
        std::vector<char> seen(n, 0);
        for (uint64_t j = 0; j < n; j++) {
            uint64_t x = dataloader_permute_(j, n, 12345 + n);
            if (x >= n || seen[x]) ok = false;
            else seen[x] = 1;
        }
    }
    CHECK(ok, "the keyed permutation is a bijection of [0, n) for n = 1, 2, 3, 5, 17, 100, 1000, 4097, 65536");
}

static void test_shuffle() {
    const int T = 8, B = 2, N = 4;
    const std::vector<int> sizes = {T * 10 + 1, T * 6 + 1};  // 16 sequences: 2 steps of N*B = 8 per epoch
    std::string pat = make_dataset("shuf", sizes);
    auto run = [&](uint64_t seed, int epochs) {  // stream order over `epochs` epochs, gathered from all ranks
        std::vector<std::pair<int, int>> order(16 * epochs);
        for (int r = 0; r < N; r++) {
            DataLoader L;
            dataloader_init(&L, pat.c_str(), B, T, r, N, kVocab, true, seed);
            for (int k = 0; k < 2 * epochs; k++) {
                auto rw = rows(take(L), B, T);
                for (int b = 0; b < B; b++) {
                    auto id = seq_id(rw[b][0], T);
                    order[(size_t)k * N * B + (size_t)r * B + b] = id;
                    if (!row_is(rw[b], id.first, id.second, T)) order[(size_t)k * N * B + r * B + b] = {-1, -1};
                }
            }
            dataloader_free(&L);
        }
        return order;
    };
    auto o = run(99, 3);
    bool cover = true, shard_order = true;
    std::vector<std::vector<std::pair<int, int>>> ep(3);
    for (int e = 0; e < 3; e++) {
        ep[e].assign(o.begin() + e * 16, o.begin() + e * 16 + 16);
        auto sorted = ep[e];
        std::sort(sorted.begin(), sorted.end());
        cover = cover && sorted == reference_stream(sizes, T);
        for (int i = 0; i < 16; i++) shard_order = shard_order && ep[e][i].first == (i < 10 ? 0 : 1);
    }
    CHECK(cover,
          "shuffle, 4 ranks: every epoch (3) reads each sequence exactly once over all ranks (disjoint, complete)");
    CHECK(shard_order, "shuffle permutes within a shard: shard 0's sequences come before shard 1's in every epoch");
    CHECK(ep[0] != reference_stream(sizes, T), "shuffle changes the order (epoch 0 is not the sorted order)");
    CHECK(ep[0] != ep[1] && ep[1] != ep[2] && ep[0] != ep[2], "each epoch has its own order");
    bool same_seed = run(99, 1) == ep[0], other_seed = run(100, 1) != ep[0];
    CHECK(same_seed, "same seed, same order");
    CHECK(other_seed, "another seed, another order");
}

static void test_position(bool shuffle) {
    const int T = 8, B = 3, N = 2, r = 1;
    const std::vector<int> sizes = {T * 10 + 1, T * 5 + 5, T * 8 + 1};  // 23 sequences: shard and epoch crossings
    std::string pat = make_dataset(shuffle ? "pos_s" : "pos", sizes);
    std::string posfile = g_dir + "/position.bin";
    for (int k : {0, 1, 2, 4, 7, 13}) {  // 6 sequences a step: mid-shard, shard boundaries, epochs 2 and 3
        DataLoader a;
        dataloader_init(&a, pat.c_str(), B, T, r, N, kVocab, shuffle, 5);
        for (int i = 0; i < k; i++) dataloader_next_batch(&a);
        DataLoaderPosition p = dataloader_position(&a);
        FILE* f = fopen(posfile.c_str(), "wb");
        fwrite(&p, sizeof(p), 1, f);
        fclose(f);
        std::vector<std::vector<int>> want;
        for (int i = 0; i < 10; i++) want.push_back(take(a));
        DataLoaderPosition q;
        memset(&q, 0xFF, sizeof(q));
        f = fopen(posfile.c_str(), "rb");
        bool read_ok = fread(&q, sizeof(q), 1, f) == 1;
        fclose(f);
        DataLoader b;
        dataloader_init(&b, pat.c_str(), B, T, r, N, kVocab, shuffle, 5);
        for (int i = 0; i < 3; i++) dataloader_next_batch(&b);  // elsewhere in the stream first
        dataloader_restore(&b, q);
        bool same = read_ok;
        for (int i = 0; i < 10; i++) same = same && take(b) == want[i];
        dataloader_restore(&a, p);  // rewind the original loader too
        for (int i = 0; i < 10; i++) same = same && take(a) == want[i];
        CHECK(same,
              "position after %d batches (shuffle %s, rank 1 of 2) saved to a file and restored into a new loader "
              "and the old one: the next 10 batches are identical",
              k, shuffle ? "on" : "off");
        dataloader_free(&a);
        dataloader_free(&b);
    }
    // a position restored under another split continues the same global stream
    DataLoader two[2], one;
    for (int rr = 0; rr < 2; rr++) dataloader_init(&two[rr], pat.c_str(), 2, T, rr, 2, kVocab, shuffle, 5);
    dataloader_init(&one, pat.c_str(), 4, T, 0, 1, kVocab, shuffle, 5);
    for (int i = 0; i < 5; i++) {
        dataloader_next_batch(&two[0]);
        dataloader_next_batch(&two[1]);
    }
    dataloader_restore(&one, dataloader_position(&two[0]));
    bool ok = true;
    for (int i = 0; i < 8; i++) {
        auto w = rows(take(one), 4, T);
        auto g0 = rows(take(two[0]), 2, T), g1 = rows(take(two[1]), 2, T);
        ok = ok && w[0] == g0[0] && w[1] == g0[1] && w[2] == g1[0] && w[3] == g1[1];
    }
    CHECK(
        ok,
        "a position saved by B=2 on 2 ranks, restored into B=4 on one process, continues the same stream (shuffle %s)",
        shuffle ? "on" : "off");
    for (auto& l : two) dataloader_free(&l);
    dataloader_free(&one);
}

// One document per slot: documents start at token kVocab - 1 (and at a
// shard's first token); a slot holds one document through the next start (its
// last target), cut at T + 1 tokens, padded with kVocab - 1 inputs and -1 targets.
static void test_slots() {
    const int E = kVocab - 1, T = 4, P = E;
    const std::string d = g_dir + "/slots";
    mkdir(d.c_str(), 0755);
    write_shard(d + "/a.bin", {(uint32_t)E, 1, 2, 3, (uint32_t)E, 11, 12, (uint32_t)E, 21, 22, 23, 24, 25, 26}, 2);
    write_shard(d + "/b.bin", {31, 32, (uint32_t)E, 41}, 4);  // a shard that does not start with a document start
    const std::string pat = d + "/*.bin";
    const std::vector<std::vector<int>> want = {
        {E, 1, 2, 3, 1, 2, 3, E},  // exactly T + 1 tokens through the next start
        {E, 11, 12, P, 11, 12, E, -1},  // shorter: padded
        {E, 21, 22, 23, 21, 22, 23, 24},  // longer: cut at T + 1 tokens
        {31, 32, P, P, 32, E, -1, -1},  // the second shard's first document has no start token
        {E, P, P, P, 41, -1, -1, -1},  // the last document of the data: no next start
    };
    DataLoader L;
    dataloader_init(&L, pat.c_str(), 1, T, 0, 1, kVocab, false, 1, DataPacking::Slots, E);
    bool ok = L.num_sequences == want.size();
    for (int epoch = 0; epoch < 2; epoch++)
        for (const auto& w : want) ok = ok && rows(take(L), 1, T)[0] == w;
    CHECK(ok, "slots: 5 documents in 2 shards give one slot each (exact, padded, cut, no start token, last), twice");
    dataloader_free(&L);
    // the stream of slots splits over ranks and restores from a position as the packed stream does
    DataLoader two[2], one;
    for (int r = 0; r < 2; r++)
        dataloader_init(&two[r], pat.c_str(), 1, T, r, 2, kVocab, true, 3, DataPacking::Slots, E);
    dataloader_init(&one, pat.c_str(), 2, T, 0, 1, kVocab, true, 3, DataPacking::Slots, E);
    dataloader_next_batch(&two[0]);
    dataloader_next_batch(&two[1]);
    dataloader_restore(&one, dataloader_position(&two[0]));
    bool same = true;
    for (int i = 0; i < 6; i++) {
        const auto w = rows(take(one), 2, T), g0 = rows(take(two[0]), 1, T), g1 = rows(take(two[1]), 1, T);
        same = same && w[0] == g0[0] && w[1] == g1[0];
    }
    CHECK(same, "slots, shuffled: 2 ranks of B=1 read what one process of B=2 reads, from a restored position");
    for (auto& l : two) dataloader_free(&l);
    dataloader_free(&one);
    // a packed position does not restore into a slots loader over the same data (another stream)
    expect_error("slots: a packed position is refused", {"restore-packed-into-slots", pat},
                 {"cannot restore the data position"});
}

// Slots over uint32 shards whose document-start token is not V-1 and not a
// uint16 (Llama 3's <|begin_of_text|> = 128000 of V = 128256): documents start
// at that token, the padding is that token, and V-1 (128255, here inside a
// document) starts nothing. The token is checked against the vocabulary.
static void test_slots_doc_token() {
    const int V = 128256, B = 1, T = 4;
    const uint32_t S = 128000, X = (uint32_t)V - 1;
    const std::string d = g_dir + "/slots_u32";
    mkdir(d.c_str(), 0755);
    const std::vector<uint32_t> toks = {S, 70001, X, 70003, S, 9, 128001, S, 5};
    dataloader_write_shard(d + "/a.bin", toks.data(), toks.size(), V);
    const int s = (int)S, x = (int)X;
    const std::vector<std::vector<int>> want = {
        {s, 70001, x, 70003, 70001, x, 70003, s},  // X inside a document: no start
        {s, 9, 128001, s, 9, 128001, s, -1},  // <|end_of_text|> ends it; padded with S
        {s, s, s, s, 5, -1, -1, -1},  // the last document: S 5, padded
    };
    DataLoader L;
    dataloader_init(&L, (d + "/a.bin").c_str(), B, T, 0, 1, V, false, 0, DataPacking::Slots, (int)S);
    bool ok = L.num_sequences == want.size() && L.doc_token == (int)S;
    for (const auto& w : want) ok = ok && rows(take(L), B, T)[0] == w;
    dataloader_free(&L);
    CHECK(ok, "slots on a uint32 shard: documents start at token 128000 (not V-1), padding 128000");
    CHECK(dataloader_count_sequences((d + "/a.bin").c_str(), T, DataPacking::Slots, (int)X) == 2,
          "slots with V-1 as the document start instead: 2 documents (the shard's first token and the one V-1)");
    expect_error("slots without a document-start token", {"slots", d + "/a.bin", std::to_string(V), "-1"},
                 {"one document per slot needs the token that starts a document", "got -1"});
    expect_error("slots with a document-start token >= V",
                 {"slots", d + "/a.bin", std::to_string(V), std::to_string(V)}, {"[0, vocab_size 128256): got 128256"});
}

// dataloader_write_shard: uint16 while the vocabulary's ids fit (V <= 65536:
// llm.c's bytes, unchanged), uint32 above; what it writes reads back.
static void test_write_shard() {
    const std::string d = g_dir + "/write";
    mkdir(d.c_str(), 0755);
    struct Case {
        int V;
        int token_size;
        std::vector<uint32_t> toks;
    };
    const std::vector<Case> cases = {{50257, 2, {50256, 1, 2, 50255, 7}},
                                     {65536, 2, {65535, 0, 1, 65534, 3}},
                                     {65537, 4, {65536, 0, 1, 65535, 3}},
                                     {128256, 4, {128000, 70000, 1, 128255, 128001}}};
    for (const Case& c : cases) {
        const std::string p = d + "/v" + std::to_string(c.V) + ".bin";
        dataloader_write_shard(p, c.toks.data(), c.toks.size(), c.V);
        std::vector<unsigned char> bytes;
        FILE* f = fopen(p.c_str(), "rb");
        for (int ch; f && (ch = fgetc(f)) != EOF;) bytes.push_back((unsigned char)ch);
        if (f) fclose(f);
        int32_t h[3] = {0, 0, 0};
        if (bytes.size() >= 12) memcpy(h, bytes.data(), 12);
        const bool wide = c.token_size == 4;
        bool ok = bytes.size() == DATALOADER_HEADER_BYTES + c.toks.size() * c.token_size &&
                  h[0] == (wide ? 20240801 : 20240520) && h[1] == (wide ? 7 : 1) && h[2] == (int32_t)c.toks.size() &&
                  dataloader_token_size(c.V) == c.token_size;
        for (size_t i = 0; ok && i < c.toks.size(); i++) {
            uint32_t v = 0;
            memcpy(&v, &bytes[DATALOADER_HEADER_BYTES + i * c.token_size], c.token_size);  // little-endian host
            ok = v == c.toks[i];
        }
        DataLoader L;
        dataloader_init(&L, p.c_str(), 1, 4, 0, 1, c.V, false, 0);
        dataloader_next_batch(&L);
        for (int t = 0; t < 4; t++) ok = ok && L.inputs[t] == (int)c.toks[t] && L.targets[t] == (int)c.toks[t + 1];
        dataloader_free(&L);
        CHECK(ok, "write_shard V=%d: uint%d shard (magic %d, version %d, %zu bytes), read back by the loader", c.V,
              8 * c.token_size, h[0], h[1], bytes.size());
    }
    expect_error("a uint16 shard refuses id 65536", {"write", d + "/x.bin", "65536", "65536"},
                 {"token id 65536 does not fit a uint16 shard"});
}

static void test_uint32() {
    const int T = 8, B = 2;
    std::string d = g_dir + "/u32";
    mkdir(d.c_str(), 0755);
    std::vector<uint32_t> t0(T * 4 + 1), t1(T * 3 + 1);
    for (size_t i = 0; i < t0.size(); i++) t0[i] = 100000 + (uint32_t)i * 7;  // ids above 65535
    for (size_t i = 0; i < t1.size(); i++) t1[i] = (uint32_t)i;
    write_shard(d + "/a.bin", t0, 4);
    write_shard(d + "/b.bin", t1, 2);  // uint16 and uint32 shards may be mixed
    DataLoader L;
    dataloader_init(&L, (d + "/*.bin").c_str(), B, T, 0, 1, 200000, false, 0);
    bool ok = L.num_tokens == t0.size() + t1.size() && L.num_sequences == 7;
    // stream: a.0 a.1 | a.2 a.3 | b.0 b.1 | b.2 a.0
    const int want[8][2] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {0, 0}};
    for (int k = 0; k < 4; k++) {
        dataloader_next_batch(&L);
        for (int b = 0; b < B; b++) {
            const std::vector<uint32_t>& src = want[k * 2 + b][0] == 0 ? t0 : t1;
            int j = want[k * 2 + b][1];
            for (int t = 0; t < T; t++)
                ok = ok && L.inputs[b * T + t] == (int)src[j * T + t] &&
                     L.targets[b * T + t] == (int)src[j * T + t + 1];
        }
    }
    dataloader_free(&L);
    CHECK(ok, "uint32 shards (ids above 65535) mixed with a uint16 shard read correctly");
}

static void test_large_offsets() {
    // A sparse uint32 shard of 1.2e9 tokens (4.8 GB, nothing written but its header and
    // tail): the last sequences lie beyond 4 GiB.
    std::string d = g_dir + "/big";
    mkdir(d.c_str(), 0755);
    std::string path = d + "/big.bin";
    const uint64_t ntok = 1200000000ull;
    const int T = 16, B = 2;
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    int32_t h[256] = {DATALOADER_MAGIC_U32, DATALOADER_VERSION_U32, (int32_t)ntok};
    bool made = fd >= 0 && pwrite(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
                ftruncate(fd, (off_t)(1024 + ntok * 4)) == 0;
    const uint64_t tail = 4 * T;  // the last 4T tokens are tail_token(i)
    auto tail_token = [&](uint64_t i) { return (uint32_t)(1 + i % 50000); };
    std::vector<uint32_t> tv(tail);
    for (uint64_t i = 0; i < tail; i++) tv[i] = tail_token(ntok - tail + i);
    made = made && pwrite(fd, tv.data(), tail * 4, (off_t)(1024 + (ntok - tail) * 4)) == (ssize_t)(tail * 4);
    if (fd >= 0) close(fd);
    if (!made) {
        printf("SKIP shards beyond 4 GiB: cannot make a sparse file in %s\n", d.c_str());
        unlink(path.c_str());
        return;
    }
    DataLoader L;
    dataloader_init(&L, path.c_str(), B, T, 0, 1, 0, false, 0);  // vocab_size 0: no scan of the 4.8 GB
    const uint64_t S = (ntok - 1) / T;
    bool ok = L.num_tokens == ntok && L.num_sequences == S;
    DataLoaderPosition p = dataloader_position(&L);
    p.next_sequence = S - 2;  // the last two sequences of the shard
    dataloader_restore(&L, p);
    dataloader_next_batch(&L);
    auto tok = [&](uint64_t i) { return i >= ntok - tail ? tail_token(i) : 0u; };
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            uint64_t i = (S - 2 + b) * T + t;
            ok = ok && L.inputs[b * T + t] == (int)tok(i) && L.targets[b * T + t] == (int)tok(i + 1);
        }
    dataloader_next_batch(&L);  // wraps to the start: zeros
    for (int i = 0; i < B * T; i++) ok = ok && L.inputs[i] == 0;
    dataloader_free(&L);
    unlink(path.c_str());
    CHECK(ok, "a sparse 4.8 GB uint32 shard: the last sequences (byte offsets beyond 4 GiB) read correctly, then the "
              "stream wraps");
}

static void test_prefetch_and_large_batches() {
    // Many batches through the background thread against the reference, with the
    // consumer sometimes slower and sometimes faster than the reader.
    const int T = 32, B = 16;
    const std::vector<int> sizes = {T * 200 + 1, T * 50 + 1};
    std::string pat = make_dataset("pf", sizes);
    auto ref = reference_stream(sizes, T);
    DataLoader L;
    dataloader_init(&L, pat.c_str(), B, T, 0, 1, kVocab, false, 0);
    bool ok = true;
    for (int k = 0; k < 60; k++) {
        if (k % 7 == 0) usleep(2000);
        auto rw = rows(take(L), B, T);
        for (int b = 0; b < B; b++) {
            auto id = ref[((size_t)k * B + b) % ref.size()];
            ok = ok && row_is(rw[b], id.first, id.second, T);
        }
    }
    dataloader_free(&L);
    CHECK(ok, "60 prefetched batches of B=16 T=32 over 4 epochs match the reference stream");
}

// Two shards in d/laterbad whose second holds token 70000 at offset 64 (found
// only when the stream reaches it); returns the folder.
static std::string later_bad_shards(const std::string& d) {
    const std::string dd = d + "/laterbad";
    mkdir(dd.c_str(), 0755);
    write_shard(dd + "/a.bin", shard_tokens(0, 65), 2);
    auto t = shard_tokens(1, 65);
    t[64] = 70000;
    write_shard(dd + "/b.bin", t, 4);
    return dd;
}

static void test_errors() {
    std::string d = g_dir + "/bad";
    mkdir(d.c_str(), 0755);
    auto tok = shard_tokens(0, 100);
    auto shard = [&](const char* name, ShardSpec s, const std::vector<uint32_t>& t, int ts = 2) {
        std::string p = d + "/" + name;
        write_shard(p, t, ts, s);
        return p;
    };
    ShardSpec s;
    s.magic = 12345;
    std::string p = shard("magic.bin", s, tok);
    expect_error("wrong magic", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "wrong magic 12345"});
    s = ShardSpec();
    s.version = 2;
    p = shard("version.bin", s, tok);
    expect_error("wrong version", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "wrong version 2"});
    s = ShardSpec();
    s.magic = DATALOADER_MAGIC_U32;
    s.version = 1;
    p = shard("version32.bin", s, tok);
    expect_error("uint32 magic with version 1", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "wrong version 1"});
    s = ShardSpec();
    s.extra_bytes = -50;
    p = shard("truncated.bin", s, tok);
    expect_error("truncated tokens", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "truncated", "100 tokens"});
    {
        p = d + "/short_header.bin";
        FILE* f = fopen(p.c_str(), "wb");
        int32_t h[25] = {DATALOADER_MAGIC_U16, 1, 5};
        fwrite(h, sizeof(h), 1, f);
        fclose(f);
        expect_error("truncated header (100 bytes)", {"load", p, "2", "8", "60000", "1"},
                     {p + ": ", "truncated", "100 bytes"});
        p = d + "/empty.bin";
        fclose(fopen(p.c_str(), "wb"));
        expect_error("empty file", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "truncated", "0 bytes"});
    }
    s = ShardSpec();
    s.extra_bytes = 3;
    p = shard("longer.bin", s, tok);
    expect_error("size mismatch (3 bytes too many)", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "size mismatch"});
    s = ShardSpec();
    s.set_ntok = true;
    s.ntok = 90;
    p = shard("count.bin", s, tok);
    expect_error("size mismatch (header count below the data)", {"load", p, "2", "8", "60000", "1"},
                 {p + ": ", "size mismatch"});
    s = ShardSpec();
    s.set_ntok = true;
    s.ntok = -5;
    p = shard("negative.bin", s, tok);
    expect_error("negative token count", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "negative token count"});
    {
        p = d + "/garbage.bin";
        FILE* f = fopen(p.c_str(), "wb");
        uint64_t x = 88172645463325252ull;
        for (int i = 0; i < 5000; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            fputc((int)(x & 0xFF), f);
        }
        fclose(f);
        expect_error("garbage file", {"load", p, "2", "8", "60000", "1"}, {p + ": ", "wrong magic"});
    }
    p = shard("few.bin", ShardSpec(), shard_tokens(0, 32));
    expect_error("B*T tokens, one short of B*T+1", {"load", p, "4", "8", "60000", "1"},
                 {p + ": ", "too few tokens: 32 in 1 shard(s), need at least B*T+1 = 33"});
    {
        std::string dd = d + "/fewseq";
        mkdir(dd.c_str(), 0755);
        for (int k = 0; k < 3; k++)  // 3 x 12 tokens >= B*T+1 = 33, but one sequence each
            write_shard(dd + "/" + std::to_string(k) + ".bin", shard_tokens(k, 12), 2);
        expect_error("enough tokens but fewer sequences than B", {"load", dd + "/*.bin", "4", "8", "60000", "1"},
                     {dd + "/*.bin: ", "too few sequences", "hold 3 sequences", "need at least B = 4"});
    }
    auto badtok = shard_tokens(0, 100);
    badtok[17] = 60001;
    p = shard("badtoken.bin", ShardSpec(), badtok);
    expect_error("token id >= vocab_size", {"load", p, "2", "8", "60000", "1"},
                 {p + ": ", "token id 60001 at token offset 17 (byte offset 1058) is >= vocab_size 60000"});
    {
        const std::string dd = later_bad_shards(d);
        expect_error("token id >= vocab_size in the second shard (found when the stream reaches it)",
                     {"load", dd + "/*.bin", "2", "8", "60000", "10"},
                     {dd + "/b.bin: ", "token id 70000 at token offset 64"});
    }
    expect_error("no file matches the glob", {"load", d + "/nothing_*.bin", "2", "8", "60000", "1"},
                 {d + "/nothing_*.bin: no file matches"});
    {
        std::string dd = d + "/withdir";
        mkdir(dd.c_str(), 0755);
        mkdir((dd + "/x.bin").c_str(), 0755);
        expect_error("a folder matching the glob", {"load", dd + "/*.bin", "2", "8", "60000", "1"},
                     {dd + "/x.bin: not a regular file"});
    }
    std::string good = make_dataset("restore_bad", {200});
    expect_error("restoring a position saved with another T", {"restore", good, "8", "4"},
                 {good + ": cannot restore the data position", "T=8", "T=4"});
    expect_error("markov corpus with vocab_size 8", {"markov", g_dir + "/mk_bad", "8"},
                 {"vocab_size 8 is not in [32, 65536]"});
    // and a good one through the same path
    ChildResult r = run_child({"load", good, "2", "8", "60000", "5"});
    CHECK(r.status == 0 && r.err.empty(), "the child helper itself succeeds on a good shard (exit %d)", r.status);
}

// The same errors in this process: llmc::Error from the call, nothing printed,
// no exit; a loader whose batch threw is still freed (its worker stopped).
static void test_errors_throw() {
    std::string d = g_dir + "/throw";
    mkdir(d.c_str(), 0755);
    ShardSpec s;
    s.magic = 12345;
    std::string p = d + "/magic.bin";
    write_shard(p, shard_tokens(0, 100), 2, s);
    DataLoader L;
    std::string e = error_of([&] { dataloader_init(&L, p.c_str(), 2, 8, 0, 1, 60000, false, 0); });
    CHECK(e.rfind(p + ": ", 0) == 0 && contains_all(e, {"wrong magic 12345"}),
          "dataloader_init on a bad shard throws llmc::Error naming it: %s", e.c_str());
    auto badtok = shard_tokens(0, 100);
    badtok[17] = 60001;
    p = d + "/badtoken.bin";
    write_shard(p, badtok, 2);
    e = error_of([&] { dataloader_init(&L, p.c_str(), 2, 8, 0, 1, 60000, false, 0); });
    CHECK(e.rfind(p + ": token id 60001", 0) == 0,
          "a bad token found by the loader's thread in the first batch: dataloader_init throws it: %s", e.c_str());
    {
        const std::string dd = later_bad_shards(d);
        dataloader_init(&L, (dd + "/*.bin").c_str(), 2, 8, 0, 1, 60000, false, 0);
        e = error_of([&] {
            for (int i = 0; i < 10; i++) dataloader_next_batch(&L);
        });
        const std::string again = error_of([&] { dataloader_next_batch(&L); });
        dataloader_free(&L);
        CHECK(e.rfind(dd + "/b.bin: token id 70000", 0) == 0 && again == e && L.impl == nullptr,
              "a bad token in the second shard: dataloader_next_batch throws (again when called again), then free: %s",
              e.c_str());
    }
    e = error_of([&] { dataloader_find_shards((d + "/nothing_*.bin").c_str()); });
    CHECK(e == d + "/nothing_*.bin: no file matches", "dataloader_find_shards throws when nothing matches: %s",
          e.c_str());
    e = error_of([&] { markov_corpus_write((g_dir + "/mk_throw").c_str(), 1, 1000, 1000, 8); });
    CHECK(e.rfind(g_dir + "/mk_throw: ", 0) == 0 && contains_all(e, {"vocab_size 8 is not in [32, 65536]"}),
          "markov_corpus_write with vocab_size 8 throws llmc::Error naming the folder: %s", e.c_str());
}

// The shards of one pattern come from one prepro run (header[248..252]): runs
// mixed, a run mixed with plain shards, a missing or doubled shard are refused
// naming the files; a whole run, a run's val shard alone, a shard named alone and
// plain llm.c shards load.
static void test_runs() {
    const std::string d = g_dir + "/runs";
    mkdir(d.c_str(), 0755);
    // prefix `name`: the val shard and train shards `numbers` of run `id` with `n` train shards
    auto run = [&](const std::string& name, uint64_t id, int n, const std::vector<int>& numbers) {
        for (int k : numbers) {
            ShardSpec s;
            s.run_id = id;
            s.run_shards = n;
            s.run_number = k;
            char f[64];
            snprintf(f, sizeof f, "_%s_%06d.bin", k == 0 ? "val" : "train", k);
            write_shard(d + "/" + name + f, shard_tokens(k, 100), 2, s);
        }
        return d + "/" + name;
    };
    auto init_error = [&](const std::string& pattern) {
        return error_of([&] {
            DataLoader L;
            dataloader_init(&L, pattern.c_str(), 2, 8, 0, 1, kVocab, false, 0);
            dataloader_free(&L);
        });
    };
    const uint64_t A = 0x1111222233334444ull, B = 0x5555666677778888ull;
    std::string x = run("whole", A, 3, {0, 1, 2, 3});
    std::string e = init_error(x + "_train_*.bin") + " | " + init_error(x + "_val_*.bin") + " | " +
                    init_error(x + "_*.bin") + " | " + init_error(x + "_train_000002.bin");
    CHECK(e == "NO ERROR | NO ERROR | NO ERROR | NO ERROR",
          "one prepro run's shards load: its train glob, its val shard, both, one shard named alone (%s)", e.c_str());
    x = run("mixed", A, 3, {1, 2, 3});
    run("mixed", B, 1, {1});  // a later run wrote fewer shards: 2 and 3 are stale
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_000002.bin: written by prepro run 1111222233334444, another run than " + x +
                      "_train_000001.bin (5555666677778888)",
                  0) == 0 &&
              contains_all(e, {"--replace"}),
          "a glob mixing two prepro runs' shards is refused naming both files: %s", e.c_str());
    x = run("plain", A, 2, {1, 2});
    write_shard(x + "_train_000003.bin", shard_tokens(3, 100), 2);  // another writer's (no run id)
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_000003.bin: has no prepro run id, but " + x +
                      "_train_000001.bin was written by prepro run 1111222233334444",
                  0) == 0,
          "a glob mixing a prepro run's shards with a shard without run id is refused naming both: %s", e.c_str());
    x = run("gap", A, 3, {1, 3});
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_*.bin: misses train shard 2 of the 3 of prepro run 1111222233334444", 0) == 0,
          "a glob missing a middle shard of the run is refused: %s", e.c_str());
    x = run("last", A, 3, {1, 2});
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_*.bin: misses train shard 3 of the 3", 0) == 0,
          "a glob missing the run's last shard is refused: %s", e.c_str());
    x = run("copy", A, 2, {1, 2});
    write_file(x + "_train_000001 copy.bin", read_file(x + "_train_000001.bin"));
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_000001.bin: is shard 1 of prepro run 1111222233334444, and so is " + x +
                      "_train_000001 copy.bin",
                  0) == 0,
          "a glob matching a shard and its copy is refused: %s", e.c_str());
    x = run("badslots", A, -1, {1});
    e = init_error(x + "_train_*.bin");
    CHECK(e.rfind(x + "_train_000001.bin: bad prepro run slots in the header", 0) == 0,
          "a shard with the run marker and a negative shard count is refused: %s", e.c_str());
    e = init_error(make_dataset("runs_plain", {100, 100, 100}));
    CHECK(e == "NO ERROR", "llm.c shards (header[3..255] zero) load, without run ids (%s)", e.c_str());
}

// ---------------------------------------------------------------------------
// Markov corpus tests

static std::vector<uint16_t> read_tokens(const std::string& path) {
    std::vector<uint16_t> t;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return t;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 1024, SEEK_SET);
    if (size > 1024) {
        t.resize((size_t)(size - 1024) / 2);
        if (fread(t.data(), 2, t.size(), f) != t.size()) t.clear();
    }
    fclose(f);
    return t;
}

static double floor_file_value(const std::string& text, const std::string& key) {
    size_t at = text.find("\n" + key + " ");
    if (at == std::string::npos) return NAN;
    return strtod(text.c_str() + at + key.size() + 2, nullptr);
}

static void test_markov() {
    const uint64_t seed = 7;
    const int V = 256;
    const size_t ntrain = 300001, nval = 20001;
    std::string A = g_dir + "/mk/a", Bd = g_dir + "/mk/b", C = g_dir + "/mk/c";
    markov_corpus_write(A.c_str(), seed, ntrain, nval, V);
    markov_corpus_write(Bd.c_str(), seed, ntrain, nval, V);
    markov_corpus_write(C.c_str(), seed + 1, ntrain, nval, V);
    std::string aval = markov_corpus_val_path(A.c_str()), atrain = markov_corpus_train_path(A.c_str());
    CHECK(aval == A + "/markov_val_000000.bin" && atrain == A + "/markov_train_000001.bin", "corpus file names");
    bool same = true;
    for (auto f : {"/markov_val_000000.bin", "/markov_train_000001.bin", "/markov_floor.txt"})
        same = same && !read_file(A + f).empty() && read_file(A + f) == read_file(Bd + f);
    CHECK(same, "markov corpus: the same seed writes byte-identical shards and floor file");
    CHECK(read_file(A + "/markov_val_000000.bin") != read_file(C + "/markov_val_000000.bin"),
          "markov corpus: another seed writes other data");

    // header slots
    int32_t h[256];
    {
        FILE* f = fopen(aval.c_str(), "rb");
        bool ok = f && fread(h, sizeof(h), 1, f) == 1;
        if (f) fclose(f);
        CHECK(ok && h[0] == 20240520 && h[1] == 1 && h[2] == (int32_t)nval && h[3] == V && h[4] == MARKOV_MARKER &&
                  h[9] == V - 1 && h[10] == MARKOV_GENERATOR_VERSION && h[11] == (int32_t)seed && h[12] == 0 &&
                  h[13] == MARKOV_SUCCESSORS && h[14] == 0,
              "val header: magic, version, count, [3]=vocab, [4]=marker, [9]=EOT, [10]=version, [11..12]=seed, [13]=K, "
              "[14]=split");
    }
    MarkovShardInfo vi, ti;
    bool ok = markov_corpus_info(aval.c_str(), &vi) && markov_corpus_info(atrain.c_str(), &ti);
    CHECK(ok && vi.split == 0 && ti.split == 1 && ti.num_tokens == ntrain && vi.num_tokens == nval && ti.eot == V - 1 &&
              vi.entropy_rate == ti.entropy_rate && vi.seed == seed,
          "markov_corpus_info reads both shards (splits, counts, EOT, seed, one entropy rate)");
    double fl = 0;
    int fv = 0;
    CHECK(markov_corpus_floor(aval.c_str(), &fl, &fv) && fl == vi.floor && fv == V,
          "markov_corpus_floor returns the val floor %.6f and vocab %d", fl, fv);
    std::string ftxt = read_file(markov_corpus_floor_path(A.c_str()));
    CHECK(floor_file_value(ftxt, "val_floor") == vi.floor && floor_file_value(ftxt, "train_floor") == ti.floor &&
              floor_file_value(ftxt, "entropy_rate") == vi.entropy_rate && floor_file_value(ftxt, "vocab_size") == V,
          "markov_floor.txt holds the same floors, entropy rate and vocab as the headers (full precision)");

    // the data: valid shards, EOT first, ids < V
    auto vt = read_tokens(aval), tt = read_tokens(atrain);
    bool valid = vt.size() == nval && tt.size() == ntrain && vt[0] == V - 1 && tt[0] == V - 1;
    for (auto t : vt) valid = valid && t < V;
    for (auto t : tt) valid = valid && t < V;
    CHECK(valid, "shards start with EOT and hold only ids < V");
    {
        DataLoader L;
        dataloader_init(&L, aval.c_str(), 8, 64, 0, 1, V, true, 1);
        for (int i = 0; i < 5; i++) dataloader_next_batch(&L);
        dataloader_free(&L);
        dataloader_init(&L, (A + "/markov_train_*.bin").c_str(), 8, 64, 0, 1, V, true, 1);
        for (int i = 0; i < 5; i++) dataloader_next_batch(&L);
        dataloader_free(&L);
        CHECK(true, "the dataloader reads both corpus shards with vocab_size = V");
    }

    // Independent recomputation of the floors from the generator's probabilities.
    MarkovChain c = markov_chain_build(seed, V);
    std::map<std::pair<int, int>, double> P;
    std::vector<long double> H(V, 0.0L);
    bool sums = true;
    for (int s = 0; s < V; s++) {
        long double tot = 0;
        for (int i = c.offset[s]; i < c.offset[s + 1]; i++) {
            long double p = (long double)c.weight[i] / (long double)(1u << 20);
            P[{s, c.next[i]}] = (double)p;
            H[s] -= p * logl(p);
            tot += p;
        }
        sums = sums && tot == 1.0L;
    }
    CHECK(sums, "every state's successor probabilities sum to exactly 1");
    auto floor_of = [&](const std::vector<uint16_t>& t) {
        long double acc = 0;
        for (size_t i = t.size() - 1; i >= 1; i--) acc += H[t[i - 1]];  // other order, other precision
        return (double)(acc / (long double)(t.size() - 1));
    };
    double vfl = floor_of(vt), tfl = floor_of(tt);
    CHECK(std::fabs(vfl - vi.floor) < 1e-12 && std::fabs(tfl - ti.floor) < 1e-12,
          "floors match a recomputation from the chain's probabilities: val %.12f vs %.12f, train %.12f vs %.12f",
          vi.floor, vfl, ti.floor, tfl);

    // The data follows the chain: only its transitions occur, at its frequencies.
    std::vector<std::map<int, long>> cnt(V);
    std::vector<long> visits(V, 0);
    bool only_chain = true;
    for (size_t i = 1; i < tt.size(); i++) {
        cnt[tt[i - 1]][tt[i]]++;
        visits[tt[i - 1]]++;
        only_chain = only_chain && P.count({tt[i - 1], tt[i]});
    }
    CHECK(only_chain, "every transition in the train shard has positive probability in the chain");
    bool freq_ok = true;
    int checked = 0;
    double worst = 0;
    long double plugin = 0, rate_emp = 0;
    for (int s = 0; s < V; s++) {
        if (visits[s] == 0) continue;
        long double hs = 0;
        for (auto& kv : cnt[s]) {
            long double q = (long double)kv.second / visits[s];
            hs -= q * logl(q);
        }
        plugin += hs * visits[s];
        rate_emp += H[s] * visits[s];
        if (visits[s] < 500) continue;
        for (int i = c.offset[s]; i < c.offset[s + 1]; i++) {
            double p = (double)c.weight[i] / (1u << 20);
            double q = cnt[s].count(c.next[i]) ? (double)cnt[s][c.next[i]] / visits[s] : 0.0;
            double z = std::fabs(q - p) / std::sqrt(p * (1 - p) / visits[s]);
            worst = std::max(worst, z);
            freq_ok = freq_ok && z < 6;
        }
        checked++;
    }
    CHECK(freq_ok && checked > 50,
          "transition frequencies of %d well-visited states match the chain (worst %.2f sigma)", checked, worst);
    double plug = (double)(plugin / (tt.size() - 1)), remp = (double)(rate_emp / (tt.size() - 1));
    CHECK(std::fabs(plug - ti.floor) < 0.01,
          "conditional entropy estimated from transition counts %.4f ~ train floor %.4f", plug, ti.floor);
    CHECK(std::fabs(remp - vi.entropy_rate) < 0.01 && std::fabs(vi.floor - vi.entropy_rate) < 0.05,
          "entropy rate %.4f ~ its estimate from visit frequencies %.4f and ~ the val floor %.4f", vi.entropy_rate,
          remp, vi.floor);
    double nll = 0;
    for (size_t i = 1; i < vt.size(); i++) nll -= std::log(P[{vt[i - 1], vt[i]}]);
    nll /= (double)(vt.size() - 1);
    CHECK(std::fabs(nll - vi.true_nll) < 1e-9, "recorded true-chain loss on val %.6f = recomputed %.6f", vi.true_nll,
          nll);
    CHECK(vi.floor > 0.5 && vi.floor < std::log((double)V) - 3,
          "the floor %.3f nats is far below the uniform loss %.3f", vi.floor, std::log((double)V));
    long docs = 0;
    for (auto t : tt) docs += (t == V - 1);
    double mean_len = (double)ntrain / docs;
    CHECK(mean_len > 50 && mean_len < 80,
          "documents: %ld EOTs in the train shard, mean length %.1f tokens (expected ~64)", docs, mean_len);

    // reuse and regeneration
    struct stat s1, s2, s3;
    stat(aval.c_str(), &s1);
    markov_corpus_write(A.c_str(), seed, ntrain, nval, V);
    stat(aval.c_str(), &s2);
    CHECK(s1.st_ino == s2.st_ino, "writing again with the same parameters reuses the files");
    markov_corpus_write(A.c_str(), seed, ntrain, nval + 100, V);
    stat(aval.c_str(), &s3);
    MarkovShardInfo v2;
    CHECK(s3.st_ino != s1.st_ino && markov_corpus_info(aval.c_str(), &v2) && v2.num_tokens == nval + 100 &&
              read_tokens(aval).size() == nval + 100 &&
              floor_file_value(read_file(markov_corpus_floor_path(A.c_str())), "val_tokens") == nval + 100,
          "other parameters regenerate the files");
    auto vt2 = read_tokens(aval);
    CHECK(std::equal(vt.begin(), vt.end(), vt2.begin()),
          "the val split of a seed is a prefix-stable stream (longer split, same start)");
    if (truncate(atrain.c_str(), 5000) == 0) {
        markov_corpus_write(A.c_str(), seed, ntrain, nval + 100, V);
        CHECK(read_tokens(atrain) == tt, "a damaged shard is regenerated");
    }
    std::string leftovers;
    for (auto dd : {A, Bd, C}) {
        std::string cmd = "ls " + dd + " | grep -c tmp > /dev/null";
        if (system(cmd.c_str()) == 0) leftovers += dd + " ";
    }
    CHECK(leftovers.empty(), "no temporary files left behind %s", leftovers.c_str());
    // not a corpus shard
    std::string plain = g_dir + "/plain.bin";
    write_shard(plain, shard_tokens(0, 50), 2);
    CHECK(!markov_corpus_floor(plain.c_str(), &fl, &fv) &&
              !markov_corpus_floor((g_dir + "/nope.bin").c_str(), &fl, &fv),
          "markov_corpus_floor is false on a plain shard and on a missing file");
    // default parameters (smaller counts): a sensible floor
    std::string D = g_dir + "/mk/default";
    markov_corpus_write(D.c_str(), MARKOV_DEFAULT_SEED, 20001, 20001, MARKOV_DEFAULT_VOCAB);
    MarkovShardInfo di;
    CHECK(markov_corpus_info(markov_corpus_val_path(D.c_str()).c_str(), &di) && di.vocab_size == MARKOV_DEFAULT_VOCAB &&
              di.entropy_rate > 0.8 && di.entropy_rate < 1.5,
          "default chain (V=%d): entropy rate %.4f nats/token", di.vocab_size, di.entropy_rate);
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--child") == 0) return llmc::run_main(child_main, argc, argv);
    char tmpl[] = "/tmp/test_dataloader.XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 2;
    }
    g_dir = tmpl;

    test_single_shard_consecutive();
    test_reference_stream();
    test_union_over_ranks(false);
    test_union_over_ranks(true);
    test_splits(false);
    test_splits(true);
    test_permutation();
    test_shuffle();
    test_position(false);
    test_position(true);
    test_slots();
    test_slots_doc_token();
    test_write_shard();
    test_uint32();
    test_large_offsets();
    test_prefetch_and_large_batches();
    test_errors();
    test_errors_throw();
    test_runs();
    test_markov();

    std::string cmd = "rm -rf '" + g_dir + "'";
    if (system(cmd.c_str()) != 0) printf("note: could not remove %s\n", g_dir.c_str());
    return test_summary("test_dataloader");
}
