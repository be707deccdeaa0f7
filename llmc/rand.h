// rand.h: splitmix64, the one integer mixer behind every seeded stream of the
// project: the initial weights, the stochastic-rounding seeds, the sampler,
// the data order and the built-in corpus. It is counter-based: draw i of a
// stream is splitmix64(start + i x the golden-ratio increment), so a value does
// not depend on the order of generation, and every seed (0 included) gives a
// full-period, well-mixed stream. dev/train_gpt2.py has the same function.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

constexpr uint64_t SPLITMIX64_INCREMENT = 0x9E3779B97F4A7C15ull;  // 2^64 / the golden ratio

inline uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + SPLITMIX64_INCREMENT;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The next draw of a stream whose counter is *state.
inline uint64_t splitmix64_next(uint64_t* state) {
    const uint64_t z = splitmix64(*state);
    *state += SPLITMIX64_INCREMENT;
    return z;
}

// A draw of N(0, 1): Box-Muller on draws 2i and 2i+1 of the stream whose
// start is stream_key, in double (dev/train_gpt2.py's normal_fp32 computes the
// same values).
inline double normal_draw(uint64_t stream_key, uint64_t i) {
    const uint64_t h1 = splitmix64(stream_key + 2 * i), h2 = splitmix64(stream_key + 2 * i + 1);
    const double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = (double)(h2 >> 11) * 0x1.0p-53;        // [0, 1)
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// The n initial values of tensor k of a model drawn from `seed`: element i is
// std x normal_draw, rounded once to fp32, a function of (seed, k, i) alone.
inline void fill_normal(float* t, size_t n, double std, uint64_t seed, int k) {
    const uint64_t key = splitmix64(seed * 16 + k);
    for (size_t i = 0; i < n; i++) t[i] = (float)(std * normal_draw(key, i));
}
