// Squared L2 norm of the gradient, deterministic (two stages with a fixed
// reduction order, no atomics, no host sync), and the clip factor the
// optimizers scale the gradient by.
#pragma once
#include "llmc/kernels/cuda_common.h"

constexpr int GLOBAL_NORM_BLOCK = 256;
constexpr int GLOBAL_NORM_MAX_BLOCKS = 1024;  // enough to fill a GPU; also the scratch size

inline size_t global_norm_scratch_floats() { return GLOBAL_NORM_MAX_BLOCKS; }

// Stage 1: partial[b] = sum over block b's part of g[i]^2. Each warp owns one
// contiguous segment of `steps` x 32 packs of N elements; at step s lane l
// takes pack s * 32 + l of it, so a warp reads 32 neighbouring packs at once
// (coalesced on a GPU). A thread keeps N sums, one per element of its packs
// (independent: the CPU adds them as one vector), adds them in element order,
// and the block reduction sums the threads. Where a thread runs its loop
// before the next one starts (the CPU runtime), the first lane of a warp walks
// the segment 512 bytes at a time, a stride the prefetchers follow, and the
// other 31 find it in cache (a grid-wide or block-wide stride would be a new
// page every step).
template <int N>
__global__ void global_norm_partial_kernel(float* partial, const float* grads, size_t n, size_t steps) {
    const size_t packs = n / N, segment = steps * WARP_SIZE;
    const size_t warp = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const size_t begin = warp * segment, end = begin + segment < packs ? begin + segment : packs;
    Packed<float, N> sums;
#pragma unroll
    for (int e = 0; e < N; e++) sums.v[e] = 0.0f;
    for (size_t k = begin + threadIdx.x % WARP_SIZE; k < end; k += WARP_SIZE) {
        const Packed<float, N> g = load_packed_streaming<N>(grads + k * N);
#pragma unroll
        for (int e = 0; e < N; e++) sums.v[e] += g.v[e] * g.v[e];
    }
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < N; e++) sum += sums.v[e];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Stage 2, one block: *norm_squared = sum_k partial[k] (thread t takes k = t, t+256, ...).
__global__ void global_norm_final_kernel(float* norm_squared, const float* partial, int num_partials) {
    float sum = 0.0f;
    for (int k = threadIdx.x; k < num_partials; k += blockDim.x) sum += partial[k];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *norm_squared = sum;
}

// *norm_squared = sum_i grads[i]^2 (overwritten). scratch: global_norm_scratch_floats() floats.
// The grid and each warp's segment depend only on n, so the result is bitwise
// the same every run, on any device.
inline void global_norm_squared(float* norm_squared, float* scratch, const float* grads, size_t n,
                                cudaStream_t stream) {
    const int warps_per_block = GLOBAL_NORM_BLOCK / WARP_SIZE;
    with_pack_width<float>(pack_width<float>(n, grads), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        const size_t packs = n / P, needed = CEIL_DIV(packs, (size_t)GLOBAL_NORM_BLOCK);
        const int blocks = (int)std::max<size_t>(1, std::min(needed, (size_t)GLOBAL_NORM_MAX_BLOCKS));
        const size_t steps = std::max<size_t>(1, CEIL_DIV(packs, (size_t)blocks * warps_per_block * WARP_SIZE));
        global_norm_partial_kernel<P><<<blocks, GLOBAL_NORM_BLOCK, 0, stream>>>(scratch, grads, n, steps);
        cudaCheck(cudaGetLastError());
        global_norm_final_kernel<<<1, GLOBAL_NORM_BLOCK, 0, stream>>>(norm_squared, scratch, blocks);
        cudaCheck(cudaGetLastError());
    });
}

// What an optimizer kernel scales its gradient by: the factor grad_scale
// wrote (null: 1, no clipping). Not finite (NaN) on a skipped step.
__device__ inline float read_grad_scale(const float* grad_scale) { return grad_scale ? *grad_scale : 1.0f; }

// *scale = min(1, grad_clip / (sqrt(*norm_squared) + 1e-6))   (1 when grad_clip <= 0)
// and NaN when the norm is not finite (an overflow, a bad batch): the
// optimizers then leave every weight and moment as it was. One thread, once
// per step, after the norm is complete (summed over the ranks where they hold
// shards): every optimizer thread reads the one factor, rather than each
// taking the square root and the division again.
__global__ void grad_scale_kernel(float* scale, const float* norm_squared, float grad_clip) {
    const float ns = *norm_squared;
    float clip = 1.0f;
    if (grad_clip > 0.0f) clip = fminf(1.0f, grad_clip / (sqrtf(ns) + 1e-6f));
    *scale = isfinite(ns) ? clip : NAN;
}
inline void grad_scale(float* scale, const float* norm_squared, float grad_clip, cudaStream_t stream) {
    grad_scale_kernel<<<1, 1, 0, stream>>>(scale, norm_squared, grad_clip);
    cudaCheck(cudaGetLastError());
}
