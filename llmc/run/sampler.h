// Sampling the next token from one row of logits (header-only host C++, no CUDA).
//
// The generator is splitmix64 (llmc/rand.h): a 64-bit counter run through an integer mixer.
// It uses only 64-bit integer arithmetic, so a given seed gives the same stream
// on every compiler and platform (std::mt19937 is portable too, but the
// std::*_distribution classes built on it are not; we use none of them).
//
// sample_token:
//   temperature <= 0 (or NaN): greedy argmax; ties go to the lowest id. No draw.
//   otherwise: softmax(logits / temperature) over the candidates, one draw.
//   top_k <= 0 or >= vocab_size: every id is a candidate; otherwise the top_k
//   largest logits are, ties at the cut broken in favour of the lower id.
// Only logits[0, vocab_size) are read: the caller passes the real vocabulary
// size (50257 for GPT-2), not the padded one, so padded columns never win.
// NaN and -inf logits are never sampled (probability 0); when no candidate
// has any other value the result is the greedy one (the lowest id of the -inf
// logits, or 0 when every logit is NaN).
//
// The probabilities are computed in double with the maximum subtracted (so
// exp never overflows) and the draw is a 53-bit double, so tokens with
// probabilities far below float resolution are still drawn at their rate.
// The one thing not bit-identical across platforms is exp() itself (libm
// implementations may differ in the last ulp); that can change a sample only
// when the draw lands within ~1e-16 of a cumulative-probability boundary.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/rand.h"

struct SamplerRng {
    uint64_t state;
};

inline SamplerRng sampler_rng(uint64_t seed) { return SamplerRng{seed}; }

inline uint64_t rng_next(SamplerRng* rng) { return splitmix64_next(&rng->state); }

// The top 24 bits: every value k / 2^24 is exact in a float, so the result is
// in [0, 1) with 1 itself impossible (no rounding up).
inline float rng_uniform(SamplerRng* rng) { return (float)(rng_next(rng) >> 40) * (1.0f / 16777216.0f); }

// The top 53 bits, likewise exact in a double: [0, 1).
inline double rng_uniform_double(SamplerRng* rng) { return (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0); }

// Index of the largest of logits[0, n); the lowest index among equals. NaN
// compares false and so never replaces a number; all-NaN gives 0.
inline int sampler_argmax(const float* logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
    return best;
}

// Returns a token id in [0, vocab_size), or -1 when vocab_size <= 0 or logits is null.
inline int sample_token(const float* logits, int vocab_size, float temperature, int top_k, SamplerRng* rng) {
    if (!logits || vocab_size <= 0) return -1;
    if (!(temperature > 0.0f)) return sampler_argmax(logits, vocab_size);

    // The candidates, in the order the cumulative walk visits them. Without
    // truncation that is id order (no sort at all); with top-k it is the
    // (logit descending, id ascending) order, a strict total order once NaN is
    // ranked below everything, so the result does not depend on the sort's
    // stability or on the standard library.
    std::vector<int> cand;
    const bool truncate = top_k > 0 && top_k < vocab_size;
    if (truncate) {
        cand.resize(vocab_size);
        for (int i = 0; i < vocab_size; i++) cand[i] = i;
        auto before = [logits](int a, int b) {
            const float x = logits[a], y = logits[b];
            const bool xn = std::isnan(x), yn = std::isnan(y);
            if (xn != yn) return yn;  // numbers before NaN
            if (!xn && x != y) return x > y;
            return a < b;
        };
        std::partial_sort(cand.begin(), cand.begin() + top_k, cand.end(), before);
        cand.resize(top_k);
    }
    const int n = truncate ? top_k : vocab_size;
    auto id_at = [&](int j) { return truncate ? cand[j] : j; };

    // max over the candidates (NaN skipped); -inf when there is no number at all
    double mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float x = logits[id_at(j)];
        if (x > mx) mx = x;
    }
    // One draw whatever the outcome, so the generator advances the same way
    // for every row (a generation's stream does not depend on the logits).
    const double draw = rng_uniform_double(rng);
    if (mx == -INFINITY) return sampler_argmax(logits, vocab_size);  // nothing but -inf and NaN

    // Unnormalised probabilities exp((x - max) / T). The max itself gets exactly
    // 1, which also covers +inf logits (inf - inf would be NaN). Anything that
    // is not a positive number (NaN logits; -inf * 0 when T = inf) gets 0.
    std::vector<double> p(n);
    double sum = 0.0;
    const double inv_t = 1.0 / (double)temperature;
    for (int j = 0; j < n; j++) {
        const float x = logits[id_at(j)];
        double w = (double)x == mx ? 1.0 : std::exp(((double)x - mx) * inv_t);
        if (!(w > 0.0)) w = 0.0;
        p[j] = w;
        sum += w;
    }
    const double u = draw * sum;  // sum >= 1: the max contributes 1
    double cum = 0.0;
    int last = -1;
    for (int j = 0; j < n; j++) {
        if (p[j] <= 0.0) continue;
        cum += p[j];
        last = j;
        if (u < cum) return id_at(j);
    }
    // u can reach the rounded total when the sum's rounding differs from the
    // running sum's: the last candidate with mass takes it.
    return id_at(last);
}
