// What the CUDA-on-CPU runtime offers beyond the CUDA API: its checking modes
// and its counters. Tests include it under `#ifdef CPUCUDA` (the CPU build
// defines CPUCUDA); GPU builds never see it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cpucuda {

// Order in which a block's threads run between barriers and collectives.
// Forward (the default) is deterministic; Reverse and Random change the order
// so that a kernel whose result depends on it gives a different answer.
// Set from the environment as CPUCUDA_SCHEDULE=forward|reverse|random:SEED.
enum class Schedule { Forward, Reverse, Random };
void set_schedule(Schedule s, uint64_t seed = 0);
Schedule get_schedule();

// Device memory of the virtual device (cudaMalloc'd bytes).
struct MemoryStats {
    size_t in_use;       // bytes allocated now
    size_t peak;         // most bytes allocated at once since start / reset
    size_t total;        // the virtual device's size (CPUCUDA_DEVICE_MEMORY_MB)
    size_t allocations;  // live allocations
};
MemoryStats memory_stats();
void reset_peak_memory();

// The message of the most recent kernel failure (divergent barrier, mismatched
// warp collective), as printed on stderr; empty if none.
const char* last_kernel_failure();

}  // namespace cpucuda
