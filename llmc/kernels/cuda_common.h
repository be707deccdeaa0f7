// What every kernel header shares: the activation precision (floatX), error
// checks, warp and block reductions, stochastic rounding and launch sizing.
// Builds unchanged with nvcc and with the CUDA-on-CPU runtime (cpu_cuda).
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "llmc/error.h"
#include "llmc/kernels/ptx.cuh"

// Activations and weights are bf16 by default; `make PRECISION=FP32` builds an
// all-fp32 trainer for tight comparison against the reference. Master weights,
// gradients and optimizer state are fp32 in both.
#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif

constexpr int WARP_SIZE = 32;
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// ---------------------------------------------------------------------------
// Errors throw llmc::Error naming the call's file and line (llmc/error.h), for
// the program's main to print. Host code only, on the thread that calls the
// CUDA API (the CPU runtime's worker threads never call it: an exception
// leaving a thread would end the process without the error line).
inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess)
        llmc::fail(std::string("CUDA: ") + cudaGetErrorString(err) + " (" + file + ":" + std::to_string(line) + ")");
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

// ---------------------------------------------------------------------------
// Conversions that read the same for float and bf16.
__device__ __host__ inline float to_float(float x) { return x; }
__device__ __host__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __host__ inline T from_float(float x);
template <> __device__ __host__ inline float from_float<float>(float x) { return x; }
template <> __device__ __host__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return cvt_rn_bf16(x); }

// ---------------------------------------------------------------------------
// Reductions. Every lane of the warp (or thread of the block) takes part and
// gets the result; the order of additions is fixed, so results are bitwise
// reproducible run to run.
//
// A warp reduction is cg::reduce over the warp as a tile of 32: on a GPU the
// xor butterfly v = op(v, shfl_xor(v, offset)), offset = 16, 8, 4, 2, 1 (an
// 8-byte value: two SHFLs a step); where a warp's lanes run one after another
// (the CPU runtime) the warp meets once per reduction instead of five times,
// for the same butterfly and the same bits.
template <class T, class Op>
__device__ inline T warp_reduce(T v, Op op) {
    return cooperative_groups::reduce(
        cooperative_groups::tiled_partition<WARP_SIZE>(cooperative_groups::this_thread_block()), v, op);
}
struct SumOfPairs {  // (x, y) + (x', y') component by component
    __device__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};
__device__ inline float warp_reduce_sum(float v) { return warp_reduce(v, cooperative_groups::plus<float>()); }
// warp_reduce_sum of v.x and of v.y at once: bitwise two reductions over floats
__device__ inline float2 warp_reduce_sum_pair(float2 v) { return warp_reduce(v, SumOfPairs()); }

// Block-wide sum for blockDim.x a multiple of 32 (at most 1024). Uses a
// 32-float shared scratch; safe to call repeatedly in one kernel.
__device__ inline float block_reduce_sum(float v) {
    __shared__ float warp_sums[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    v = warp_reduce_sum(v);
    __syncthreads();  // an earlier call may still be reading warp_sums
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = lane < num_warps ? warp_sums[lane] : 0.0f;
    return warp_reduce_sum(v);
}

// ---------------------------------------------------------------------------
// Stochastic rounding of fp32 to bf16: add 16 random bits below bf16's last
// mantissa bit, then truncate. Unbiased: E[round(x)] = x, so many small AdamW
// updates are not lost to round-to-nearest. The randomness is a hash of
// (element index, seed): reproducible, and different every step.
__device__ __host__ inline uint32_t hash_u32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
// The 16 noise bits of element `index`, given hash_u32(seed) (loop-invariant).
__device__ __host__ inline uint32_t stochastic_noise16(uint32_t index, uint32_t seed_hash) {
    return hash_u32(index ^ seed_hash) & 0xFFFFu;
}
// The bf16 bits (in the low 16 bits) of the float with bits `bits`, given 16
// random bits. bf16 keeps the top 16 bits: add the noise below them, then
// truncate. NaN and infinity pass through unchanged; a mask rather than a
// branch keeps their noise out, so that the CPU build vectorizes the loops.
__device__ inline uint32_t stochastic_round_bits(uint32_t bits, uint32_t random16) {
    const uint32_t finite_mask = 0u - (uint32_t)((bits & 0x7F800000u) != 0x7F800000u);
    return (bits + (random16 & finite_mask)) >> 16;
}
__device__ inline void stochastic_round(float in, __nv_bfloat16* out, uint32_t index, uint32_t seed) {
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)stochastic_round_bits(__float_as_uint(in), stochastic_noise16(index, hash_u32(seed)));
    *out = __nv_bfloat16(raw);
}
__device__ inline void stochastic_round(float in, float* out, uint32_t, uint32_t) { *out = in; }

// ---------------------------------------------------------------------------
// Elementwise loops over n elements: block b owns one contiguous chunk and its
// threads step through it blockDim.x apart,
//     const BlockChunk chunk = block_chunk(n);
//     for (size_t i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) ...
// Neighbouring threads touch neighbouring addresses (coalesced on a GPU), and
// a block never leaves its chunk, which keeps the CPU runtime (where a thread
// runs its whole loop before the next one starts) in cache; a grid-wide stride
// would send every thread across the whole array. A kernel takes its chunk
// first and has no early return (to do nothing, it runs its loop over no
// element): where a block's threads run as one loop (the CPU runtime), the
// compiler computes once per block only what every thread reaches (after a
// return that a thread may take, the chunk's two 64-bit divisions are paid per
// thread, even when the source takes the chunk before the return).
struct BlockChunk {
    size_t begin, end;
};
__device__ inline BlockChunk block_chunk(size_t n) {
    const size_t per_block = CEIL_DIV(CEIL_DIV(n, (size_t)gridDim.x), (size_t)blockDim.x) * blockDim.x;
    const size_t begin = (size_t)blockIdx.x * per_block;
    const size_t end = begin + per_block;
    return BlockChunk{begin < n ? begin : n, end < n ? end : n};
}

// ---------------------------------------------------------------------------
// 128-bit accesses: N consecutive elements moved as one load or store. With
// N = 16 / sizeof(T) (8 bf16, 4 float) a GPU issues one LDG.128 / STG.128 per
// thread instead of N narrow ones. Kernels take N as a template parameter;
// launchers pick it with pack_width(), falling back to 1 where a pointer or the
// length does not allow 16-byte accesses, so every size stays correct.
template <class T, int N>
struct alignas(sizeof(T) * N) Packed {
    T v[N];
};
template <class T>
constexpr int PACK128 = 16 / (int)sizeof(T);

// Plain load / store, and a streaming load (__ldcs: the data is read once, so
// it should not push reused data out of the caches).
template <int N, class T>
__device__ inline Packed<T, N> load_packed(const T* p) {
    return *reinterpret_cast<const Packed<T, N>*>(p);
}
template <int N, class T>
__device__ inline void store_packed(T* p, const Packed<T, N>& x) {
    *reinterpret_cast<Packed<T, N>*>(p) = x;
}
template <int N, class T>
__device__ inline Packed<T, N> load_packed_streaming(const T* p) {
    if constexpr (sizeof(Packed<T, N>) == 16) {
        const int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
        Packed<T, N> x;
        memcpy(&x, &raw, 16);
        return x;
    } else {
        return load_packed<N>(p);
    }
}

// N consecutive elements (indices index, index + 1, ...) rounded as
// stochastic_round rounds each. The bits are read in whole words and the
// results gathered as one array of halves, so that the CPU build keeps them in
// vector registers: the hash and the rounding 4 lanes at a time, the gather a
// few unpacks (a word-by-word gather of shifted halves compiles to scalar
// extracts; N narrow stores read back as one wide load would stall its store
// forwarding).
template <class T, int N>
__device__ inline Packed<T, N> stochastic_round_packed(const Packed<float, N>& in, uint32_t index, uint32_t seed) {
    if constexpr (std::is_same_v<T, float>) {
        return in;
    } else {
        static_assert(std::is_same_v<T, __nv_bfloat16> && N * sizeof(T) <= 16);
        const uint32_t seed_hash = hash_u32(seed);
        uint32_t bits[N];
        memcpy(bits, &in, sizeof(bits));
#pragma unroll
        for (int e = 0; e < N; e++)
            bits[e] = stochastic_round_bits(bits[e], stochastic_noise16(index + (uint32_t)e, seed_hash));
        uint16_t halves[N];
#pragma unroll
        for (int e = 0; e < N; e++) halves[e] = (uint16_t)bits[e];
        Packed<T, N> out;
        memcpy(&out, halves, sizeof(out));
        return out;
    }
}

// The residual add of the fused norms: row = a + b, rounded to T as stored,
// by the lanes of one warp, each taking every 32nd N-element pack of the row.
template <int N, class T>
__device__ inline void add_row_warp(T* row, const T* a, const T* b, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<T, N> x = load_packed_streaming<N>(a + c), y = load_packed_streaming<N>(b + c);
        Packed<T, N> r;
#pragma unroll
        for (int e = 0; e < N; e++) r.v[e] = from_float<T>(to_float(x.v[e]) + to_float(y.v[e]));
        store_packed(row + c, r);
    }
}

// Whether every pointer is a multiple of `bytes`.
template <class... Ptrs>
inline bool aligned_to(size_t bytes, const Ptrs*... ptrs) {
    return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}
// PACK128<T> if n is a multiple of it and every pointer is 16-byte aligned, else 1.
template <class T, class... Ptrs>
inline int pack_width(size_t n, const Ptrs*... ptrs) {
    return aligned_to(16, ptrs...) && n % PACK128<T> == 0 ? PACK128<T> : 1;
}
// Calls f(std::integral_constant<int, N>()) with N = width (PACK128<T> or 1, from
// pack_width): the launchers' one switch between the two instantiations.
template <class T, class F>
inline void with_pack_width(int width, F f) {
    if (width == PACK128<T>) f(std::integral_constant<int, PACK128<T>>());
    else f(std::integral_constant<int, 1>());
}

// ---------------------------------------------------------------------------
// An attribute of the current device, asked once.
inline int device_attribute(cudaDeviceAttr attr) {
    static std::map<int, int> known;
    const auto [it, fresh] = known.try_emplace((int)attr, 0);
    if (fresh) {
        int device = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&it->second, attr, device));
    }
    return it->second;
}
// Launch sizing for block-chunked loops: a block per blockDim items, so a thread
// takes one item (past INT_MAX blocks, more). A GPU starts the blocks past one
// wave as earlier ones finish. Where a thread runs its whole loop before the
// next thread starts (the CPU runtime), a thread's second item lies blockDim
// items ahead, and every array's walk would become interleaved streams; with
// one item a block's threads walk each array in address order, and the runtime
// hands each worker runs of consecutive blocks (work_on in cpu_cuda/runtime.cpp),
// so the prefetcher follows one stream per array. Which block takes an item
// never changes what is computed for it: these kernels treat every item alone.
inline int chunked_grid_blocks(size_t n, int block_size) {
    return (int)std::max<size_t>(1, std::min(CEIL_DIV(n, (size_t)block_size), (size_t)INT_MAX));
}
