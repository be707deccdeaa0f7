// HellaSwag multiple-choice eval in llm.c's format (header-only host C++).
//
// File format (written by data/hellaswag.cpp, the same as llm.c's):
//   header: 256 int32; [0] = 20240522 (magic), [1] = 1 (version), [2] = number
//   of examples, [3] = the longest example in bytes (what a reader's buffer needs).
//   then per example, uint16s: 65535 (delimiter), the example's length in bytes
//   (all of its uint16s, these two included), its index, the label (0..3), the
//   number of endings (4), the context length in tokens, the context tokens,
//   then per ending its length in tokens and its tokens.
//
// How an example is scored (llm.c's acc_norm): each of the 4 endings becomes one
// row of T tokens, context + ending, padded with EOT. The targets are the next
// tokens only where the position predicts a token of the ending; everywhere else
// they are -1, which the classifier treats as masked (loss 0, no gradient). The
// prediction is the ending with the lowest mean per-token loss over its own
// tokens: the mean, not the sum, so that long endings are not penalised for
// their length.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/error.h"
#include "llmc/formats/regular_file.h"

#define HELLASWAG_MAGIC 20240522
#define HELLASWAG_VERSION 1
#define HELLASWAG_HEADER_INTS 256
#define HELLASWAG_HEADER_BYTES (HELLASWAG_HEADER_INTS * 4)
#define HELLASWAG_DELIMITER 65535
#define HELLASWAG_ENDINGS 4

struct HellaSwagExample {
    int index, label;
    std::vector<int> context;
    std::vector<std::vector<int>> endings;  // HELLASWAG_ENDINGS of them, none empty
};

// Reads and validates a whole eval file; throws llmc::Error "<path>: <problem>".
inline std::vector<HellaSwagExample> hellaswag_load(const std::string& path) {
    auto error = [&](const std::string& what) { return llmc::Error(path + ": " + what); };
    // The whole file at once: the validation file is ~2.5 MB, and having it all
    // lets every length be checked against what is really there.
    std::string why;
    FILE* f = fopen_regular_file(path.c_str(), &why);
    if (!f) throw error("cannot open: " + why);
    std::vector<unsigned char> bytes;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + got);
    const bool read_error = ferror(f) != 0;
    fclose(f);
    if (read_error) throw error("read error");

    if (bytes.size() < (size_t)HELLASWAG_HEADER_BYTES)
        throw error("only " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                    std::to_string(HELLASWAG_HEADER_BYTES) + "-byte header");
    int32_t h[HELLASWAG_HEADER_INTS];
    memcpy(h, bytes.data(), HELLASWAG_HEADER_BYTES);
    if (h[0] != HELLASWAG_MAGIC)
        throw error("bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(HELLASWAG_MAGIC) +
                    "; not a HellaSwag eval file)");
    if (h[1] != HELLASWAG_VERSION)
        throw error("unsupported version " + std::to_string(h[1]) + " (expected " + std::to_string(HELLASWAG_VERSION) +
                    ")");
    const int64_t num_examples = h[2], longest = h[3];
    if (num_examples < 0) throw error("negative example count " + std::to_string(num_examples) + " in the header");
    if ((bytes.size() - HELLASWAG_HEADER_BYTES) % 2 != 0)
        throw error("odd number of bytes after the header (" + std::to_string(bytes.size()) + " bytes in all)");

    const size_t n = (bytes.size() - HELLASWAG_HEADER_BYTES) / 2;
    std::vector<uint16_t> u(n);
    if (n) memcpy(u.data(), bytes.data() + HELLASWAG_HEADER_BYTES, n * 2);
    // positions are reported as byte offsets in the file, which is what a hex dump shows
    auto at = [](size_t p) { return "at byte " + std::to_string(HELLASWAG_HEADER_BYTES + 2 * p); };

    std::vector<HellaSwagExample> exs;
    // an example is at least 15 uint16s: never trust a corrupt count for the reservation
    exs.reserve(std::min<size_t>((size_t)num_examples, n / 15));
    size_t p = 0;
    for (int64_t e = 0; e < num_examples; e++) {
        const std::string which = "example " + std::to_string(e) + " ";
        const size_t start = p;
        if (p + 6 > n)
            throw error(which + at(p) + ": file ends inside the example header (header says " +
                        std::to_string(num_examples) + " examples)");
        if (u[p] != HELLASWAG_DELIMITER)
            throw error(which + at(p) + ": delimiter " + std::to_string(u[p]) + ", expected 65535");
        const size_t ex_bytes = u[p + 1];
        HellaSwagExample ex;
        ex.index = u[p + 2];
        ex.label = u[p + 3];
        const int num_endings = u[p + 4];
        const size_t ctx_len = u[p + 5];
        p += 6;
        if (ex.label >= HELLASWAG_ENDINGS)
            throw error(which + at(start) + ": label " + std::to_string(ex.label) + " is not 0..3");
        if (num_endings != HELLASWAG_ENDINGS)
            throw error(which + at(start) + ": " + std::to_string(num_endings) + " endings, expected 4");
        if (ctx_len == 0) throw error(which + at(start) + ": empty context");
        // the example's own length field bounds it: nothing may run past it
        const size_t end = start + ex_bytes / 2;
        if (ex_bytes % 2 != 0 || ex_bytes < 12)
            throw error(which + at(start) + ": length field " + std::to_string(ex_bytes) + " bytes is not valid");
        if (end > n)
            throw error(which + at(start) + ": length " + std::to_string(ex_bytes) +
                        " bytes runs past the end of the file");
        if (p + ctx_len > end)
            throw error(which + at(start) + ": context of " + std::to_string(ctx_len) +
                        " tokens runs past the example's length field");
        ex.context.assign(u.begin() + p, u.begin() + p + ctx_len);
        p += ctx_len;
        for (int k = 0; k < HELLASWAG_ENDINGS; k++) {
            if (p + 1 > end)
                throw error(which + at(start) + ": ending " + std::to_string(k) +
                            " runs past the example's length field");
            const size_t len = u[p++];
            if (len == 0) throw error(which + at(start) + ": ending " + std::to_string(k) + " is empty");
            if (p + len > end)
                throw error(which + at(start) + ": ending " + std::to_string(k) + " of " + std::to_string(len) +
                            " tokens runs past the example's length field");
            ex.endings.emplace_back(u.begin() + p, u.begin() + p + len);
            p += len;
        }
        if (p != end)
            throw error(which + at(start) + ": length field says " + std::to_string(ex_bytes) + " bytes, content is " +
                        std::to_string((p - start) * 2));
        // A reader sizing its buffer from header[3] (llm.c does) would overrun on this one.
        if ((int64_t)ex_bytes > longest)
            throw error(which + at(start) + ": " + std::to_string(ex_bytes) +
                        " bytes, longer than the header's longest (" + std::to_string(longest) + ")");
        exs.push_back(std::move(ex));
    }
    if (p != n)
        throw error(std::to_string(2 * (n - p)) + " bytes after the last of the header's " +
                    std::to_string(num_examples) + " examples");
    return exs;
}

// Every token of every example must be an id the model has (the file holds
// uint16, so up to 65534 can appear); otherwise throws llmc::Error naming the
// file `path` the examples came from and the first offending example.
inline void hellaswag_check_vocab(const std::vector<HellaSwagExample>& exs, int vocab_size, const std::string& path) {
    for (size_t i = 0; i < exs.size(); i++) {
        int worst = -1;
        for (int t : exs[i].context) worst = t > worst ? t : worst;
        for (const auto& e : exs[i].endings)
            for (int t : e) worst = t > worst ? t : worst;
        if (worst >= vocab_size)
            llmc::fail(path + ": example " + std::to_string(i) + ": token " + std::to_string(worst) +
                       " is not below the vocabulary size " + std::to_string(vocab_size));
    }
}

// Rows of T tokens one example takes (one per ending).
inline int hellaswag_rows_needed() { return HELLASWAG_ENDINGS; }

// Fills inputs and targets, hellaswag_rows_needed() rows of T each (row i at
// [i*T, i*T + T)): row i is the context followed by ending i, then eot_token
// up to T. targets[p] is the token at p+1 where that is a token of the ending
// (positions ctx_len-1 .. ctx_len+len_i-2), -1 everywhere else.
// Returns false, writing nothing, when some context + ending is longer than T
// (or the example has an empty context or ending); the caller skips it.
inline bool hellaswag_fill(const HellaSwagExample& ex, int T, int* inputs, int* targets, int eot_token) {
    const size_t c = ex.context.size();
    if (T <= 0 || c == 0 || ex.endings.size() != (size_t)HELLASWAG_ENDINGS) return false;
    for (const auto& e : ex.endings)
        if (e.empty() || c + e.size() > (size_t)T) return false;
    for (int i = 0; i < HELLASWAG_ENDINGS; i++) {
        const std::vector<int>& e = ex.endings[i];
        int* in = inputs + (size_t)i * T;
        int* tg = targets + (size_t)i * T;
        const size_t len = c + e.size();
        for (size_t p = 0; p < (size_t)T; p++) {
            in[p] = p < c ? ex.context[p] : p < len ? e[p - c] : eot_token;
            tg[p] = -1;
        }
        // position p predicts the token at p+1; the ending's tokens are at c .. len-1
        for (size_t p = c - 1; p + 1 < len; p++) tg[p] = e[p + 1 - c];
    }
    return true;
}

// losses: the (4, T) per-token cross-entropy of the rows hellaswag_fill wrote;
// targets: those rows' targets. Returns the ending with the lowest mean loss over
// its unmasked positions (targets != -1; whatever the masked losses are, they
// are ignored), the lowest index among equals. Rows without an unmasked
// position or with a non-finite mean are never chosen; -1 when no row is usable.
inline int hellaswag_predict(const float* losses, const int* targets, int T) {
    int best = -1;
    double best_mean = 0.0;
    for (int i = 0; i < HELLASWAG_ENDINGS; i++) {
        double sum = 0.0;
        int count = 0;
        for (int p = 0; p < T; p++) {
            const size_t k = (size_t)i * T + p;
            if (targets[k] == -1) continue;
            sum += losses[k];
            count++;
        }
        if (count == 0) continue;
        const double mean = sum / count;
        if (!std::isfinite(mean)) continue;
        if (best < 0 || mean < best_mean) {
            best = i;
            best_mean = mean;
        }
    }
    return best;
}
