// What the CUDA-on-CPU runtime offers beyond the CUDA API: its checking modes
// and its counters. Tests include it under `#ifdef CPUCUDA` (the CPU build
// defines CPUCUDA); GPU builds never see it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cpucuda {

// Order in which a block's threads run between barriers and collectives.
// Forward (the default) is deterministic; Reverse and Random change the order
// so that a kernel whose result depends on it gives a different answer.
// Set from the environment as CPUCUDA_SCHEDULE=forward|reverse|random:SEED.
enum class Schedule { Forward, Reverse, Random };
void set_schedule(Schedule s, uint64_t seed = 0);
Schedule get_schedule();

// How streams execute. Sync (the default): work runs when issued. Deferred:
// work on a created stream runs only when something needs it, and then only
// what it depends on, so a missing cudaStreamWaitEvent between streams shows as
// wrong results. Set from the environment as CPUCUDA_STREAMS=sync|deferred.
enum class StreamMode { Sync, Deferred };
void set_stream_mode(StreamMode m);  // waits for the device first
StreamMode get_stream_mode();

// Kernels whose threads never meet (cudapp.py marks their launches) run a
// block's threads as a plain loop instead of fibers, in the schedule's order,
// with bitwise the same results. Off: every kernel runs on fibers (for tests
// that compare both; CPUCUDA_THREAD_LOOPS=0). loop_launches() counts the
// launches that ran as loops.
void set_thread_loops(bool on);
uint64_t loop_launches();

// mma.sync's emulation runs vector code (AVX2 and FMA) where the CPU has it,
// with bitwise the same results as its portable code. Off: the portable code
// (for tests that compare both). Returns whether the vector code runs now.
bool set_mma_vector_code(bool on);

// cuBLASLt's epilogues (bias, GELU, its gradient, the rounding to bf16) run
// as AVX2 code where the CPU has it, with bitwise the same results as their
// portable code. Off: the portable code (for tests that compare both).
// Returns whether the AVX2 code runs now.
bool set_matmul_vector_code(bool on);

// cuBLASLt's bf16 matmuls run on the CPU's bf16 dot-product units (oneDNN's
// matmul on AVX512-BF16 or AMX) where the CPU has them: fp32 accumulation, a
// different order of sums than sgemm. Off, or on a CPU without them: the bf16
// operands are widened exactly to fp32 for sgemm, giving bitwise the fp32
// matmul of the widened operands. Set from the environment as
// CPUCUDA_NATIVE_BF16=0|1 (default 1). Returns whether the native products run now.
bool set_native_bf16_matmul(bool on);

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

// Wall time per kernel (by name) and for cuBLASLt matmuls ("cublasLtMatmul"),
// collected while profiling is on: CPUCUDA_PROFILE=1 turns it on and prints
// the table at exit; set_profiling() does so from a program. Sorted by time.
struct ProfileEntry {
    std::string name;
    long calls;
    double seconds;
};
void set_profiling(bool on);
std::vector<ProfileEntry> profile();
void reset_profile();

}  // namespace cpucuda
