// Squared L2 norm of the gradient, deterministic (two stages with a fixed
// reduction order, no atomics, no host sync), and the clip factor the
// optimizers scale the gradient by.
#pragma once
#include "llmc/kernels/cuda_common.h"

constexpr int GLOBAL_NORM_BLOCK = 256;
constexpr int GLOBAL_NORM_MAX_BLOCKS = 1024;  // enough to fill a GPU; also the scratch size

inline size_t global_norm_scratch_floats() { return GLOBAL_NORM_MAX_BLOCKS; }

// Stage 1: partial[k] = sum over this block's chunk of g[i]^2
// (fp32 per thread, then the block reduction).
// N consecutive elements per thread (16-byte loads where n and the pointer allow).
template <int N>
__global__ void global_norm_partial_kernel(float* partial, const float* grads, size_t n) {
    float sum = 0.0f;
    const BlockChunk chunk = block_chunk(n / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const Packed<float, N> g = load_packed_streaming<N>(grads + k * N);
#pragma unroll
        for (int e = 0; e < N; e++) sum += g.v[e] * g.v[e];
    }
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
// The number of blocks depends only on n, so the result is bitwise the same every run.
inline void global_norm_squared(float* norm_squared, float* scratch, const float* grads, size_t n,
                                cudaStream_t stream) {
    const size_t needed = CEIL_DIV(n, (size_t)GLOBAL_NORM_BLOCK);
    const int blocks =
        (int)(needed < (size_t)GLOBAL_NORM_MAX_BLOCKS ? (needed > 0 ? needed : 1) : GLOBAL_NORM_MAX_BLOCKS);
    with_pack_width<float>(pack_width<float>(n, grads), [&](auto pack) {
        global_norm_partial_kernel<decltype(pack)::value><<<blocks, GLOBAL_NORM_BLOCK, 0, stream>>>(scratch, grads, n);
    });
    cudaCheck(cudaGetLastError());
    global_norm_final_kernel<<<1, GLOBAL_NORM_BLOCK, 0, stream>>>(norm_squared, scratch, blocks);
    cudaCheck(cudaGetLastError());
}

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
