// rand.h: splitmix64, the one integer mixer behind every seeded stream of the
// project: the initial weights, the stochastic-rounding seeds, the sampler,
// the data order and the built-in corpus. It is counter-based: draw i of a
// stream is splitmix64(start + i x the golden-ratio increment), so a value does
// not depend on the order of generation, and every seed (0 included) gives a
// full-period, well-mixed stream. dev/train_gpt2.py has the same function.
#pragma once
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
