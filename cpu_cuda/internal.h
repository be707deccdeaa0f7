// Shared between the runtime's own files (runtime.cpp, streams.cpp,
// cublaslt.cpp, nccl.cpp); not for programs.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <utility>
#include <vector>

namespace cpucuda {

// The last error of the calling host thread (cudaGetLastError) and kernel
// failures waiting to be returned by the next synchronising call.
cudaError_t record(cudaError_t e);
cudaError_t take_pending();

// Stream execution (streams.cpp).
//   CPUCUDA_STREAMS=sync (default): work runs when it is issued.
//   CPUCUDA_STREAMS=deferred: work issued to a created stream waits in that
//   stream's queue and runs only when something needs it: a synchronisation,
//   an event it must complete, the legacy default stream (which waits for all
//   streams), or an NCCL call that waits on it. What runs is only what the
//   needed work depends on through stream order and cudaStreamWaitEvent, so a
//   missing dependency between streams makes a program compute with stale or
//   unfinished data, and its test fails.
bool streams_deferred();
// Stream-ordered work (kernels, async copies, matmuls).
void enqueue(cudaStream_t stream, std::function<void()> work);
// Work that must run when issued, after exactly what it depends on on its
// stream (NCCL collectives: MPI calls stay in program order on every rank).
void run_after_dependencies(cudaStream_t stream, std::function<void()> work);
void synchronize_stream(cudaStream_t stream);
void synchronize_device();

// Memory tables (runtime.cpp).
bool is_device_ptr(const void* p, size_t n);
bool is_pinned_host_ptr(const void* p, size_t n);

// The worker pool (runtime.cpp): fn(0) .. fn(tasks - 1), spread over the
// worker threads and the caller; returns when all are done. Not from a kernel.
int worker_count();
void parallel_for(int tasks, const std::function<void(int)>& fn);

// bf16 products on the CPU's bf16 units (bf16_matmul.cpp). native_bf16_on():
// they run (the CPU has the units and CPUCUDA_NATIVE_BF16 is not 0).
// native_bf16_product: out (rows x cols, column-major, leading dimension ldo) =
// op(A) op(B) over the whole k, accumulated in fp32, on the calling thread;
// false when oneDNN cannot run the shape (out is then unwritten).
bool native_bf16_on();
bool native_bf16_product(bool ta, bool tb, int64_t rows, int64_t cols, int64_t k, const uint16_t* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, float* out, int64_t ldo);

// Profiling (runtime.cpp): adds one call of `name` taking `seconds`, and a
// clock to measure with. profiling_on() is cheap.
bool profiling_on();
double profile_clock();
void profile_add(const char* name, double seconds);

}  // namespace cpucuda

namespace cpucuda {

// initcheck (CPUCUDA_INITCHECK=1): fresh cudaMalloc memory and every block's
// dynamic shared memory are filled with this 16-bit pattern before use. As
// fp32 (0xFFA0FFA0) and as bf16 (0xFFA0) it is a signalling NaN; as an int, a
// large negative number.
constexpr uint16_t kPoison16 = 0xFFA0;
bool initcheck_on();
void poison(void* p, size_t bytes);

// The thread-local symbols of the executable (its ELF symbol table), as
// offsets in its thread-local block. cudapp makes every static `__shared__` a
// function-local `static thread_local`: a `_ZZ` symbol of a .cu unit (local,
// under a FILE symbol that ends in .cu, or unique, from an inline or template
// function); the project's code has no thread_local of its own.
struct TlsSymbols {
    size_t size = 0;                                  // of the thread-local block
    std::vector<std::pair<uintptr_t, size_t>> shared;  // static __shared__: offset, bytes
    std::vector<uintptr_t> guards;                     // their initialisation guards, sorted
};
const TlsSymbols& tls_symbols();
uintptr_t executable_tls_base();  // of the calling thread

#ifdef CPUCUDA_RACECHECK
// racecheck (racecheck.cpp): what the runtime tells the checker.
namespace race {
// Sync clock of the worker: it ticks at every barrier and warp collective that
// completes; an access is stamped with it.
struct WarpClock {
    uint64_t full = 0;          // the last collective of the whole warp
    uint64_t* pairs = nullptr;  // [lane a * 32 + lane b]: the last one with both in a partial mask
};
struct SyncClock {
    uint64_t clock = 1;
    uint64_t barrier = 0;  // the last __syncthreads that opened
    WarpClock warps[32];
};
struct RaceBlock {
    const char* kernel;
    uint64_t launch;  // launch id + 1
    uint32_t block;   // linear block index
    dim3 block_dim, grid_dim;
    uintptr_t stacks_lo, stacks_hi, dyn_lo, dyn_hi;
    SyncClock* sync;
};
void block_begin(const RaceBlock& b);
void block_end();
// An access of thread `tid` of the running block at instruction `pc`; the
// runtime's own accesses for a kernel (ldmatrix rows, cp.async) come here.
void access_as(uint16_t tid, uintptr_t addr, unsigned size, bool write, uintptr_t pc);
}  // namespace race
// ldmatrix (ptx.cpp): lane `lane` of the warp being released supplied `row`.
void race_ldmatrix_row(unsigned lane, const void* row);
#endif

}  // namespace cpucuda
