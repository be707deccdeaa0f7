// The built-in training corpus: documents drawn from a random sparse
// first-order Markov chain, so the best achievable loss is known exactly
// (header-only host C++).
//
// The chain. Ids 0..V-1; EOT = V-1 is the start state and ends documents.
//   - every other state s has MARKOV_SUCCESSORS distinct successors among the
//     non-EOT ids, with random probabilities, and goes to EOT with probability
//     MARKOV_EOT_WEIGHT / 2^20 = 1/64 (documents of geometric length, mean 63
//     tokens before the EOT);
//   - EOT has MARKOV_START_SUCCESSORS successors (the first token of a
//     document), never EOT itself.
// Every probability is an integer multiple of 2^-20, and sampling uses integer
// arithmetic only, so the same seed gives the same tokens on any machine.
//
// Files (llm.c uint16 shards, magic DATALOADER_MAGIC_U16, version 1):
//   <dir>/markov_val_000000.bin    val split   (its own random stream)
//   <dir>/markov_train_000001.bin  train split (its own random stream)
//   <dir>/markov_floor.txt         the parameters and floors, one `key value` a line
// Each shard starts with EOT. Spare header slots (int32 indices):
//   [3]      vocab size V (ids 0..V-1)
//   [4]      MARKOV_MARKER (0x31564B4D, "MKV1" in little-endian bytes)
//   [5..6]   floor of this shard: the mean over its target positions t=1..n-1 of
//            H(P(. | token[t-1])) in nats, a double's bit pattern (low word in [5])
//   [7..8]   entropy rate of the chain under its stationary distribution (nats/token), same encoding
//   [9]      EOT id (V-1)
//   [10]     generator version (MARKOV_GENERATOR_VERSION)
//   [11..12] seed (low 32 bits in [11])
//   [13]     successors per non-EOT state
//   [14]     split: 0 val, 1 train
//   [15..16] mean over the target positions of -log P(token[t] | token[t-1]) under the
//            true chain (the loss the optimal predictor actually gets here), same encoding
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/data/dataloader.h"  // DATALOADER_MAGIC_U16, dataloader_shard_header
#include "llmc/error.h"
#include "llmc/rand.h"
#include "llmc/formats/regular_file.h"

#define MARKOV_MARKER 0x31564B4D
#define MARKOV_GENERATOR_VERSION 1
#define MARKOV_SUCCESSORS 4
#define MARKOV_START_SUCCESSORS 16
#define MARKOV_WEIGHT_BITS 20
#define MARKOV_WEIGHT_TOTAL (1u << MARKOV_WEIGHT_BITS)
#define MARKOV_EOT_WEIGHT (MARKOV_WEIGHT_TOTAL / 64)
#define MARKOV_MIN_VOCAB 32
#define MARKOV_MAX_VOCAB 65536

// Defaults for the trainer.
#define MARKOV_DEFAULT_SEED 1337ull
#define MARKOV_DEFAULT_VOCAB 256
#define MARKOV_DEFAULT_TRAIN_TOKENS ((size_t)2 * 1024 * 1024 + 1)
#define MARKOV_DEFAULT_VAL_TOKENS ((size_t)64 * 1024 + 1)

struct MarkovChain {
    int vocab_size;
    int eot;
    // state s: successors next[offset[s] .. offset[s+1]) in increasing order,
    // with integer weights summing to MARKOV_WEIGHT_TOTAL
    std::vector<int> offset;
    std::vector<int> next;
    std::vector<uint32_t> weight;
};

// What a corpus shard's header records.
struct MarkovShardInfo {
    int vocab_size;
    int eot;
    int generator_version;
    int successors;
    int split;  // 0 val, 1 train
    uint64_t seed;
    uint64_t num_tokens;
    double floor;         // mean of H(P(.|previous token)) over the target positions
    double entropy_rate;  // stationary entropy rate of the chain
    double true_nll;      // mean -log P(token | previous) under the chain
};

struct MarkovRng {
    uint64_t s;
    uint64_t next() { return splitmix64_next(&s); }
    uint64_t below(uint64_t n) {  // uniform in [0, n), n > 0, without modulo bias
        uint64_t limit = ~0ull - (~0ull % n);
        for (;;) {
            uint64_t x = next();
            if (x < limit) return x % n;
        }
    }
};

// Errors (bad parameters, a folder or file that cannot be written) throw llmc::Error.
[[noreturn]] inline void markov_fail_(const std::string& where, const std::string& what) {
    llmc::fail(where + ": " + what);
}

// The chain of a seed and vocabulary size.
inline MarkovChain markov_chain_build(uint64_t seed, int vocab_size) {
    MarkovChain c;
    c.vocab_size = vocab_size;
    c.eot = vocab_size - 1;
    MarkovRng rng{seed ^ 0x4D41524B4F56ull};
    const int V = vocab_size, nonEot = V - 1;
    c.offset.push_back(0);
    for (int s = 0; s < V; s++) {
        const bool start = (s == c.eot);
        const int k = start ? MARKOV_START_SUCCESSORS : MARKOV_SUCCESSORS;
        const uint32_t budget = start ? MARKOV_WEIGHT_TOTAL : MARKOV_WEIGHT_TOTAL - MARKOV_EOT_WEIGHT;
        // k distinct successors among the non-EOT ids
        std::vector<int> succ;
        while ((int)succ.size() < k) {
            int x = (int)rng.below((uint64_t)nonEot);
            bool dup = false;
            for (int y : succ) dup |= (y == x);
            if (!dup) succ.push_back(x);
        }
        for (int i = 1; i < k; i++)  // insertion sort: increasing ids
            for (int j = i; j > 0 && succ[j - 1] > succ[j]; j--) std::swap(succ[j - 1], succ[j]);
        // raw weights: the product of two uniform 16-bit numbers (skewed towards small)
        std::vector<uint64_t> raw(k);
        uint64_t sum = 0;
        for (int i = 0; i < k; i++) {
            uint64_t r = rng.next();
            raw[i] = 1 + (((r & 0xFFFF) * ((r >> 16) & 0xFFFF)) >> 16);
            sum += raw[i];
        }
        std::vector<uint32_t> w(k);
        uint32_t used = 0;
        int biggest = 0;
        for (int i = 0; i < k; i++) {
            w[i] = (uint32_t)((uint64_t)budget * raw[i] / sum);
            used += w[i];
            if (raw[i] > raw[biggest]) biggest = i;
        }
        w[biggest] += budget - used;  // exact total
        for (int i = 0; i < k; i++) {
            c.next.push_back(succ[i]);
            c.weight.push_back(w[i]);
        }
        if (!start) {
            c.next.push_back(c.eot);
            c.weight.push_back(MARKOV_EOT_WEIGHT);
        }
        c.offset.push_back((int)c.next.size());
    }
    return c;
}

// H(P(. | s)) in nats for every state s.
inline std::vector<double> markov_state_entropies(const MarkovChain& c) {
    std::vector<double> h(c.vocab_size, 0.0);
    for (int s = 0; s < c.vocab_size; s++)
        for (int i = c.offset[s]; i < c.offset[s + 1]; i++) {
            double p = (double)c.weight[i] / MARKOV_WEIGHT_TOTAL;
            h[s] -= p * std::log(p);
        }
    return h;
}

// The stationary distribution (reached from EOT): power iteration on the lazy
// chain (I + P) / 2, which converges for any chain.
inline std::vector<double> markov_stationary(const MarkovChain& c) {
    const int V = c.vocab_size;
    std::vector<double> pi(V, 0.0), nx(V);
    pi[c.eot] = 1.0;
    for (int it = 0; it < 100000; it++) {
        for (int s = 0; s < V; s++) nx[s] = 0.5 * pi[s];
        for (int s = 0; s < V; s++)
            for (int i = c.offset[s]; i < c.offset[s + 1]; i++)
                nx[c.next[i]] += 0.5 * pi[s] * ((double)c.weight[i] / MARKOV_WEIGHT_TOTAL);
        double diff = 0;
        for (int s = 0; s < V; s++) diff += std::fabs(nx[s] - pi[s]);
        pi.swap(nx);
        if (diff < 1e-15) break;
    }
    return pi;
}

inline double markov_entropy_rate(const MarkovChain& c) {
    std::vector<double> h = markov_state_entropies(c), pi = markov_stationary(c);
    double r = 0;
    for (int s = 0; s < c.vocab_size; s++) r += pi[s] * h[s];
    return r;
}

// Tokens of one split: EOT, then the chain's walk from EOT.
inline void markov_generate(const MarkovChain& c, uint64_t seed, int split, size_t ntok, uint16_t* out) {
    MarkovRng rng{seed * 0x2545F4914F6CDD1Dull + 0x5350 + (uint64_t)split * SPLITMIX64_INCREMENT};
    rng.next();
    int s = c.eot;
    for (size_t t = 0; t < ntok; t++) {
        if (t > 0) {
            uint32_t r = (uint32_t)(rng.next() >> (64 - MARKOV_WEIGHT_BITS));
            int i = c.offset[s];
            while (r >= c.weight[i]) {
                r -= c.weight[i];
                i++;
            }
            s = c.next[i];
        }
        out[t] = (uint16_t)s;
    }
}

inline std::string markov_corpus_val_path(const char* dir) { return std::string(dir) + "/markov_val_000000.bin"; }
inline std::string markov_corpus_train_path(const char* dir) { return std::string(dir) + "/markov_train_000001.bin"; }
inline std::string markov_corpus_floor_path(const char* dir) { return std::string(dir) + "/markov_floor.txt"; }

inline void markov_put_double_(int32_t* slots, double v) {
    uint64_t b;
    memcpy(&b, &v, 8);
    slots[0] = (int32_t)(uint32_t)(b & 0xFFFFFFFFu);
    slots[1] = (int32_t)(uint32_t)(b >> 32);
}
inline double markov_get_double_(const int32_t* slots) {
    uint64_t b = (uint64_t)(uint32_t)slots[0] | ((uint64_t)(uint32_t)slots[1] << 32);
    double v;
    memcpy(&v, &b, 8);
    return v;
}

// Reads a corpus shard's header: false when the file cannot be read, is not a
// uint16 shard of the right size, or does not carry the corpus marker (not an
// error: the trainer asks of any validation shard whether it has a floor).
inline bool markov_corpus_info(const char* shard_path, MarkovShardInfo* info) {
    std::string why;
    int fd = open_regular_file(shard_path, &why);
    if (fd < 0) return false;
    int32_t h[256];
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h);
    close(fd);
    if (!ok || h[0] != DATALOADER_MAGIC_U16 || h[1] != 1 || h[4] != MARKOV_MARKER || h[2] < 0) return false;
    if ((uint64_t)st.st_size != 1024 + 2 * (uint64_t)h[2]) return false;
    info->num_tokens = (uint64_t)h[2];
    info->vocab_size = h[3];
    info->floor = markov_get_double_(h + 5);
    info->entropy_rate = markov_get_double_(h + 7);
    info->eot = h[9];
    info->generator_version = h[10];
    info->seed = (uint64_t)(uint32_t)h[11] | ((uint64_t)(uint32_t)h[12] << 32);
    info->successors = h[13];
    info->split = h[14];
    info->true_nll = markov_get_double_(h + 15);
    return true;
}

// The floor recorded in a corpus shard (nats/token) and its vocabulary size.
inline bool markov_corpus_floor(const char* shard_path, double* floor, int* vocab_size) {
    MarkovShardInfo info;
    if (!markov_corpus_info(shard_path, &info)) return false;
    if (floor) *floor = info.floor;
    if (vocab_size) *vocab_size = info.vocab_size;
    return true;
}

// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
inline void markov_write_atomic_(const std::string& path, const void* data, size_t bytes) {
    std::string tmp = path + ".tmp." + std::to_string((long)getpid());
    std::string why;
    FILE* f = fopen_regular_file_for_writing(tmp.c_str(), O_WRONLY | O_TRUNC, &why);
    if (!f) markov_fail_(tmp, "cannot create: " + why);
    bool ok = fwrite(data, 1, bytes, f) == bytes;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        unlink(tmp.c_str());
        markov_fail_(tmp, std::string("write failed: ") + strerror(errno));
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        unlink(tmp.c_str());
        markov_fail_(path, std::string("cannot rename the temporary file into place: ") + strerror(e));
    }
}

inline void markov_mkdirs_(const char* dir) {
    std::string p(dir);
    for (size_t i = 1; i <= p.size(); i++) {
        if (i == p.size() || p[i] == '/') {
            std::string sub = p.substr(0, i);
            if (mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST)
                markov_fail_(sub, std::string("cannot create the folder: ") + strerror(errno));
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) markov_fail_(dir, "not a folder");
}

inline bool markov_shard_matches_(const std::string& path, uint64_t seed, size_t ntok, int V, int split) {
    MarkovShardInfo info;
    return markov_corpus_info(path.c_str(), &info) && info.seed == seed && info.num_tokens == ntok &&
           info.vocab_size == V && info.eot == V - 1 && info.split == split &&
           info.generator_version == MARKOV_GENERATOR_VERSION && info.successors == MARKOV_SUCCESSORS;
}

// Writes the corpus (val and train shards and markov_floor.txt) into `dir`,
// creating it; reuses the files already there when they were written with the
// same parameters. Safe for several processes at once (each writes its own
// temporary files and renames them into place; the contents are identical).
inline void markov_corpus_write(const char* dir, uint64_t seed, size_t train_tokens, size_t val_tokens,
                                int vocab_size) {
    if (vocab_size < MARKOV_MIN_VOCAB || vocab_size > MARKOV_MAX_VOCAB)
        markov_fail_(dir, "markov corpus: vocab_size " + std::to_string(vocab_size) + " is not in [" +
                              std::to_string(MARKOV_MIN_VOCAB) + ", " + std::to_string(MARKOV_MAX_VOCAB) + "]");
    if (train_tokens < 2 || val_tokens < 2 || train_tokens > 0x7FFFFFFF || val_tokens > 0x7FFFFFFF)
        markov_fail_(dir, "markov corpus: token counts must be in [2, 2^31-1] (train " + std::to_string(train_tokens) +
                              ", val " + std::to_string(val_tokens) + ")");
    markov_mkdirs_(dir);
    const std::string paths[2] = {markov_corpus_val_path(dir), markov_corpus_train_path(dir)};
    const size_t counts[2] = {val_tokens, train_tokens};
    struct stat st;
    if (markov_shard_matches_(paths[0], seed, val_tokens, vocab_size, 0) &&
        markov_shard_matches_(paths[1], seed, train_tokens, vocab_size, 1) &&
        stat(markov_corpus_floor_path(dir).c_str(), &st) == 0)
        return;

    MarkovChain chain = markov_chain_build(seed, vocab_size);
    std::vector<double> h = markov_state_entropies(chain);
    const double rate = markov_entropy_rate(chain);
    double floors[2], nlls[2];
    for (int split = 0; split < 2; split++) {
        const size_t n = counts[split];
        std::vector<uint16_t> data(512 + n);  // 1024-byte header, then the tokens
        int32_t header[DATALOADER_HEADER_INTS];
        dataloader_shard_header(header, 2, n);  // [0..2]; the corpus's own slots follow
        uint16_t* tok = data.data() + 512;
        markov_generate(chain, seed, split, n, tok);
        double hsum = 0, nll = 0;
        for (size_t t = 1; t < n; t++) {
            int prev = tok[t - 1];
            hsum += h[prev];
            for (int i = chain.offset[prev]; i < chain.offset[prev + 1]; i++)
                if (chain.next[i] == tok[t]) nll -= std::log((double)chain.weight[i] / MARKOV_WEIGHT_TOTAL);
        }
        floors[split] = hsum / (double)(n - 1);
        nlls[split] = nll / (double)(n - 1);
        header[3] = vocab_size;
        header[4] = MARKOV_MARKER;
        markov_put_double_(header + 5, floors[split]);
        markov_put_double_(header + 7, rate);
        header[9] = chain.eot;
        header[10] = MARKOV_GENERATOR_VERSION;
        header[11] = (int32_t)(uint32_t)(seed & 0xFFFFFFFFu);
        header[12] = (int32_t)(uint32_t)(seed >> 32);
        header[13] = MARKOV_SUCCESSORS;
        header[14] = split;
        markov_put_double_(header + 15, nlls[split]);
        memcpy(data.data(), header, sizeof(header));
        markov_write_atomic_(paths[split], data.data(), data.size() * sizeof(uint16_t));
    }
    char text[2048];
    snprintf(text, sizeof(text),
             "# Markov corpus (llmc/data/markov_corpus.h): floors in nats/token\n"
             "generator_version %d\nseed %llu\nvocab_size %d\neot %d\nsuccessors %d\nstart_successors %d\n"
             "eot_probability %.17g\nval_tokens %zu\ntrain_tokens %zu\n"
             "val_floor %.17g\ntrain_floor %.17g\nentropy_rate %.17g\nval_true_nll %.17g\ntrain_true_nll %.17g\n",
             MARKOV_GENERATOR_VERSION, (unsigned long long)seed, vocab_size, chain.eot, MARKOV_SUCCESSORS,
             MARKOV_START_SUCCESSORS, (double)MARKOV_EOT_WEIGHT / MARKOV_WEIGHT_TOTAL, val_tokens, train_tokens,
             floors[0], floors[1], rate, nlls[0], nlls[1]);
    markov_write_atomic_(markov_corpus_floor_path(dir), text, strlen(text));
}
