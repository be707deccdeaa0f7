// cuda_runtime.h for the CUDA-on-CPU runtime (see ../README.md).
//
// Stands in front of the toolkit's cuda_runtime.h on the CPU build's include
// path. The runtime API itself (cudaMalloc, cudaStream_t, cudaDeviceProp, ...)
// is the toolkit's own declaration in cuda_runtime_api.h, implemented by
// runtime.cpp; bf16/half/vector types are the toolkit's host code. This file
// adds what nvcc would provide to kernel code: the execution-space keywords,
// threadIdx & co., barriers, warp collectives, atomics and intrinsics.
#pragma once

#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>
#include <vector_functions.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#define CPUCUDA_RUNTIME 1

// --- execution-space keywords --------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __constant__
#undef __managed__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
// cudapp.py turns `extern __shared__ T x[];` into a pointer to the block's
// dynamic shared memory and every other `__shared__` into `static thread_local`:
// a worker thread runs one block at a time, so thread-local storage is exactly
// per-block storage shared by the block's fibers.
#define __shared__ __cpucuda_shared__

namespace cpucuda {

// One GPU thread: a fiber. The scheduler (runtime.cpp) owns the rest.
struct ThreadCtx {
    uint3 tid;       // threadIdx
    unsigned lane;   // linear thread index % 32
    unsigned warp;   // linear thread index / 32
};
// Per worker (OS) thread: the block it is running.
struct BlockCtx {
    uint3 block_idx;
    uint3 block_dim;
    uint3 grid_dim;
};
extern __thread ThreadCtx* tls_thread;
extern __thread BlockCtx tls_block;

// Base of the running block's dynamic shared memory (fixed per worker thread).
void* dynamic_shared_memory();

// Block barrier. `pred` feeds __syncthreads_count/and/or; returns the count of
// threads with a non-zero pred.
int block_barrier(int pred);

// Warp collectives. Each lane deposits a 64-bit value; when every lane named in
// `mask` has arrived at the same kind of collective, each lane gets its result.
enum class WarpOp : int { Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, Wide, TileReduce };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width);
// cg::reduce over a tile of `width` lanes (`mask`: the tile's lanes;
// cooperative_groups.h): each lane passes a pointer to its value and operator;
// once every lane of the tile has arrived, `fn` runs once with io[0..width) of
// the tile's lanes in lane order and leaves each lane's result in its io. One
// meeting of the tile where the shuffle butterfly it replaces takes log2(width).
using TileReduceFn = void (*)(void* const* io, unsigned width);
void tile_reduce(TileReduceFn fn, void* io, unsigned mask, int width);
// Makes `thread` the running GPU thread (tls_thread) for what the scheduler
// runs on a lane's behalf (a cg::reduce operator). Out of line: in the
// racecheck build a store to the thread-local slot from instrumented kernel
// code would read as a race between the lanes.
void run_as(ThreadCtx* thread);
// A `.sync.aligned` warp-wide instruction (mma.sync, ldmatrix; cpucuda_ptx.h):
// each lane passes a pointer to its own operands and results; once all 32
// lanes have arrived at the same instruction, `fn` runs once with io[lane] of
// every lane, and returns nullptr or what is wrong (reported as a failure).
using WarpWideFn = const char* (*)(void* const* io);
void warp_wide(const char* name, WarpWideFn fn, void* io);
// cp.async (cpucuda_ptx.h): queue a copy, close a commit group, wait until at
// most `pending` groups are in flight.
void cp_async(void* dst, const void* src, unsigned bytes);
void cp_async_commit();
void cp_async_wait(int pending);
unsigned active_mask();

[[noreturn]] void device_trap(const char* what);

// --- kernel launch ------------------------------------------------------------
// `k<<<g, b, s, st>>>(args...)` is rewritten by cudapp.py into
// `(::cpucuda::Launcher("k", g, b, s, st) % [=](auto... a) { k(a...); })(args...)`.
// The arguments are copied once (as CUDA does); every GPU thread calls the
// lambda with its own copies, so template kernels deduce as under nvcc.
struct LaunchSpec {
    const char* name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    // cudapp.py found that the kernel's threads never meet (no barrier, warp
    // operation, warp-wide instruction, cp.async or shared memory is reachable
    // from its body): a block's threads may run as a plain loop, no fibers.
    bool threads_never_meet = false;
};
// A kernel and its arguments, type-erased. `copy`/`destroy` let a deferred
// stream (CPUCUDA_STREAMS=deferred) keep the launch until it runs.
struct KernelClosure {
    void (*run_thread)(void* data);  // one GPU thread: the kernel on copies of the arguments
    void* data;
    void* (*copy)(const void* data);
    void (*destroy)(void* data);
    // The threads `order[0..n)`, one after another, each to completion: the
    // kernel inlined into a loop (LaunchSpec::threads_never_meet; null otherwise).
    void (*run_threads)(void* data, ThreadCtx* const* order, unsigned n);
};
void launch(const LaunchSpec& spec, const KernelClosure& kernel);

template <class Fn, class... Args>
struct BoundLaunch {
    Fn fn;
    std::tuple<Args...> args;
    static void run_thread(void* self) {
        auto* b = static_cast<BoundLaunch*>(self);
        std::apply(b->fn, b->args);  // by value: each thread gets its own copies
    }
    // flatten: the kernel is inlined into the loop, and the arguments are locals
    // that no store of the kernel can reach, so what a thread computes from
    // them and from blockIdx/blockDim/gridDim alone (its chunk of a
    // grid-stride loop, with its 64-bit divisions) is computed once per block.
    __attribute__((flatten)) static void run_threads(void* self, ThreadCtx* const* order, unsigned n) {
        auto* b = static_cast<BoundLaunch*>(self);
        const Fn fn = b->fn;
        const std::tuple<Args...> args = b->args;
        for (unsigned i = 0; i < n; i++) {
            tls_thread = order[i];
            std::apply(fn, args);
        }
    }
    static void* copy(const void* self) { return new BoundLaunch(*static_cast<const BoundLaunch*>(self)); }
    static void destroy(void* self) { delete static_cast<BoundLaunch*>(self); }
};

// Launcher<true> (written `.threads_never_meet()` by cudapp.py, see LaunchSpec)
// also compiles the block loop; a kernel that may meet its neighbours gets
// none, which keeps the inlined copy out of its compile time and its binary.
template <bool NeverMeet>
struct Launcher {
    LaunchSpec spec;
    Launcher(const char* name, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
        : spec{name, grid, block, smem, stream, NeverMeet} {}
    Launcher<true> threads_never_meet() const { return {spec.name, spec.grid, spec.block, spec.smem, spec.stream}; }
    template <class Fn>
    struct WithKernel {
        LaunchSpec spec;
        Fn fn;
        template <class... A>
        void operator()(A&&... a) {
            using Bound = BoundLaunch<Fn, std::decay_t<A>...>;
            Bound b{fn, {std::forward<A>(a)...}};
            KernelClosure k{&Bound::run_thread, &b, &Bound::copy, &Bound::destroy, nullptr};
            if constexpr (NeverMeet) k.run_threads = &Bound::run_threads;
            launch(spec, k);
        }
    };
    template <class Fn>
    WithKernel<Fn> operator%(Fn fn) const {
        return {spec, fn};
    }
};
Launcher(const char*, dim3, dim3) -> Launcher<false>;
Launcher(const char*, dim3, dim3, size_t) -> Launcher<false>;
Launcher(const char*, dim3, dim3, size_t, cudaStream_t) -> Launcher<false>;

// Base name of a kernel expression ("ns::k<T, 4>" -> "k"): the key under which
// cudaFuncSetAttribute and launches meet.
std::string kernel_base_name(const char* expr);
cudaError_t func_set_attribute(const char* expr_and_args, cudaFuncAttribute attr, int value);

}  // namespace cpucuda

// cudaFuncSetAttribute(kernel, attr, value): recorded under the kernel's name.
#define cudaFuncSetAttribute(...) ::cpucuda::func_set_attribute_call(#__VA_ARGS__, __VA_ARGS__)
namespace cpucuda {
template <class F>
cudaError_t func_set_attribute_call(const char* text, F*, cudaFuncAttribute attr, int value) {
    return func_set_attribute(text, attr, value);
}
}  // namespace cpucuda

// --- built-in variables --------------------------------------------------------
#define threadIdx (::cpucuda::tls_thread->tid)
#define blockIdx (::cpucuda::tls_block.block_idx)
#define blockDim (::cpucuda::tls_block.block_dim)
#define gridDim (::cpucuda::tls_block.grid_dim)
static constexpr int warpSize = 32;

// --- barriers and memory fences -----------------------------------------------
inline void __syncthreads() { ::cpucuda::block_barrier(0); }
inline int __syncthreads_count(int p) { return ::cpucuda::block_barrier(p != 0); }
inline int __syncthreads_and(int p) {
    return ::cpucuda::block_barrier(p != 0) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int p) { return ::cpucuda::block_barrier(p != 0) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ::cpucuda::warp_collective(::cpucuda::WarpOp::Sync, mask, 0, 0, 32);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline unsigned __activemask() { return ::cpucuda::active_mask(); }
inline void __nanosleep(unsigned) {}
[[noreturn]] inline void __trap() { ::cpucuda::device_trap("__trap() called"); }

// --- warp shuffles, votes -----------------------------------------------------
namespace cpucuda {
template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "shuffles move 1..8-byte trivially copyable values");
    uint64_t b = 0;
    std::memcpy((void*)&b, (const void*)&v, sizeof(T));
    return b;
}
template <class T>
inline T from_bits(uint64_t b) {
    T v;
    std::memcpy((void*)&v, (const void*)&b, sizeof(T));
    return v;
}
}  // namespace cpucuda

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return ::cpucuda::from_bits<T>(
        ::cpucuda::warp_collective(::cpucuda::WarpOp::ShflIdx, mask, ::cpucuda::to_bits(var), src_lane, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::cpucuda::from_bits<T>(
        ::cpucuda::warp_collective(::cpucuda::WarpOp::ShflUp, mask, ::cpucuda::to_bits(var), (int)delta, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::cpucuda::from_bits<T>(
        ::cpucuda::warp_collective(::cpucuda::WarpOp::ShflDown, mask, ::cpucuda::to_bits(var), (int)delta, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return ::cpucuda::from_bits<T>(
        ::cpucuda::warp_collective(::cpucuda::WarpOp::ShflXor, mask, ::cpucuda::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)::cpucuda::warp_collective(::cpucuda::WarpOp::Ballot, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) {
    return (int)::cpucuda::warp_collective(::cpucuda::WarpOp::Any, mask, pred != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int pred) {
    return (int)::cpucuda::warp_collective(::cpucuda::WarpOp::All, mask, pred != 0, 0, 32);
}

// --- atomics (real atomics: blocks run in parallel on several cores) ---------------
namespace cpucuda {
template <class T, class F>
inline T atomic_update(T* addr, F f) {  // CAS loop for what has no native RMW
    static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "atomic width");
    using U = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    U* p = reinterpret_cast<U*>(addr);
    U old_bits = __atomic_load_n(p, __ATOMIC_RELAXED);
    for (;;) {
        T old_val = from_bits<T>(old_bits);
        U new_bits = (U)to_bits<T>(f(old_val));
        if (__atomic_compare_exchange_n(p, &old_bits, new_bits, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return old_val;
    }
}
}  // namespace cpucuda

// Exactly the overloads CUDA declares, so that code nvcc rejects is rejected here.
#define CPUCUDA_ATOMIC_RMW(T, name, builtin) \
    inline T name(T* a, T v) { return builtin(a, v, __ATOMIC_SEQ_CST); }
#define CPUCUDA_ATOMIC_MINMAX(T)                                                \
    inline T atomicMax(T* a, T v) {                                             \
        return ::cpucuda::atomic_update(a, [v](T o) { return o > v ? o : v; }); \
    }                                                                           \
    inline T atomicMin(T* a, T v) {                                             \
        return ::cpucuda::atomic_update(a, [v](T o) { return o < v ? o : v; }); \
    }
#define CPUCUDA_ATOMIC_BITS(T)                           \
    CPUCUDA_ATOMIC_RMW(T, atomicAnd, __atomic_fetch_and) \
    CPUCUDA_ATOMIC_RMW(T, atomicOr, __atomic_fetch_or)   \
    CPUCUDA_ATOMIC_RMW(T, atomicXor, __atomic_fetch_xor)
#define CPUCUDA_ATOMIC_CAS_EXCH(T)                                                                     \
    CPUCUDA_ATOMIC_RMW(T, atomicExch, __atomic_exchange_n)                                             \
    inline T atomicCAS(T* a, T expected, T desired) {                                                  \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
        return expected;                                                                               \
    }
CPUCUDA_ATOMIC_RMW(int, atomicAdd, __atomic_fetch_add)
CPUCUDA_ATOMIC_RMW(int, atomicSub, __atomic_fetch_sub)
CPUCUDA_ATOMIC_MINMAX(int)
CPUCUDA_ATOMIC_BITS(int)
CPUCUDA_ATOMIC_CAS_EXCH(int)
CPUCUDA_ATOMIC_RMW(unsigned int, atomicAdd, __atomic_fetch_add)
CPUCUDA_ATOMIC_RMW(unsigned int, atomicSub, __atomic_fetch_sub)
CPUCUDA_ATOMIC_MINMAX(unsigned int)
CPUCUDA_ATOMIC_BITS(unsigned int)
CPUCUDA_ATOMIC_CAS_EXCH(unsigned int)
CPUCUDA_ATOMIC_RMW(unsigned long long, atomicAdd, __atomic_fetch_add)
CPUCUDA_ATOMIC_MINMAX(unsigned long long)
CPUCUDA_ATOMIC_BITS(unsigned long long)
CPUCUDA_ATOMIC_CAS_EXCH(unsigned long long)
CPUCUDA_ATOMIC_MINMAX(long long)
CPUCUDA_ATOMIC_BITS(long long)
#undef CPUCUDA_ATOMIC_RMW
#undef CPUCUDA_ATOMIC_MINMAX
#undef CPUCUDA_ATOMIC_BITS
#undef CPUCUDA_ATOMIC_CAS_EXCH

inline unsigned short atomicCAS(unsigned short* a, unsigned short expected, unsigned short desired) {
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
inline float atomicAdd(float* a, float v) {
    return ::cpucuda::atomic_update(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double* a, double v) {
    return ::cpucuda::atomic_update(a, [v](double o) { return o + v; });
}
inline float atomicExch(float* a, float v) {
    return ::cpucuda::atomic_update(a, [v](float) { return v; });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
    return ::cpucuda::atomic_update(
        a, [v](__nv_bfloat16 o) { return __float2bfloat16(__bfloat162float(o) + __bfloat162float(v)); });
}
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    return ::cpucuda::atomic_update(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    return ::cpucuda::atomic_update(a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}

// --- cache-hinted loads and stores (plain accesses on the CPU) -------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// --- math intrinsics ------------------------------------------------------------
// The fast-math intrinsics compute the accurate function: results may differ
// from the GPU's approximations in the last bits, never in meaning.
// CUDA's classification functions are global (as C's macros were).
using std::isfinite;
using std::isinf;
using std::isnan;
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline void __sincosf(float x, float* s, float* c) {
    *s = sinf(x);
    *c = cosf(x);
}
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline int __float_as_int(float x) { return ::cpucuda::from_bits<int>(::cpucuda::to_bits(x)); }
inline float __int_as_float(int x) { return ::cpucuda::from_bits<float>(::cpucuda::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return ::cpucuda::from_bits<unsigned>(::cpucuda::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::cpucuda::from_bits<float>(::cpucuda::to_bits(x)); }
inline long long __double_as_longlong(double x) { return ::cpucuda::from_bits<long long>(::cpucuda::to_bits(x)); }
inline double __longlong_as_double(long long x) { return ::cpucuda::from_bits<double>(::cpucuda::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

// CUDA's global min/max overloads for integers and floats.
#define CPUCUDA_MINMAX(T)                            \
    inline T min(T a, T b) { return a < b ? a : b; } \
    inline T max(T a, T b) { return a > b ? a : b; }
CPUCUDA_MINMAX(int)
CPUCUDA_MINMAX(unsigned int)
CPUCUDA_MINMAX(long)
CPUCUDA_MINMAX(unsigned long)
CPUCUDA_MINMAX(long long)
CPUCUDA_MINMAX(unsigned long long)
#undef CPUCUDA_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// --- the C++ conveniences of the toolkit's cuda_runtime.h ---------------------------
template <class T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, T* func, int block_size,
                                                                 size_t dynamic_smem) {
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, (const void*)func, block_size, dynamic_smem);
}

template <class T>
inline cudaError_t cudaMalloc(T** p, size_t size) {
    return cudaMalloc((void**)p, size);
}
template <class T>
inline cudaError_t cudaMallocHost(T** p, size_t size) {
    return cudaMallocHost((void**)p, size);
}
template <class T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t count, size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice) {
    std::memcpy(reinterpret_cast<char*>(&symbol) + offset, src, count);
    return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t count, size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost) {
    std::memcpy(dst, reinterpret_cast<const char*>(&symbol) + offset, count);
    return cudaSuccess;
}
