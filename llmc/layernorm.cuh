// LayerNorm over the last dimension (C) of N rows, eps = 1e-5: forward, the
// forward fused with the residual add, and a deterministic backward.
// mean and rstd are saved as fp32, one per row, for the backward.
#pragma once
#include "llmc/cuda_common.h"

constexpr float LAYERNORM_EPS = 1e-5f;

// ---------------------------------------------------------------------------
// Forward, one row x[0..C) per warp (lane l takes c = l, l+32, ...):
//   mean = (1/C) sum_c x[c]
//   var  = (1/C) sum_c (x[c] - mean)^2          (two passes: no cancellation)
//   rstd = 1 / sqrt(var + eps)
//   out[c] = (x[c] - mean) * rstd * weight[c] + bias[c]
// Each lane only reads the elements it owns, so a row this same lane has just
// written (the fused residual) is read back without any synchronisation.
__device__ inline void layernorm_row_warp(floatX* out, float* mean, float* rstd, const floatX* x,
                                          const floatX* weight, const floatX* bias, int row, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) sum += to_float(x[c]);
    const float mu = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        const float d = to_float(x[c]) - mu;
        sq += d * d;
    }
    const float rs = rsqrtf(warp_reduce_sum(sq) / C + LAYERNORM_EPS);
    for (int c = lane; c < C; c += WARP_SIZE) {
        const float xhat = (to_float(x[c]) - mu) * rs;
        out[c] = from_float<floatX>(xhat * to_float(weight[c]) + to_float(bias[c]));
    }
    if (lane == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = rs;
    }
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;  // the whole warp leaves together
    const size_t off = (size_t)row * C;
    layernorm_row_warp(out + off, mean, rstd, inp + off, weight, bias, row, C);
}

// residual[c] = round_floatX(inp1[c] + inp2[c]) (stored), then
// out = layernorm(residual) from the stored, rounded values, so the forward
// sees exactly the residual stream that the backward will see.
__global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                        const floatX* inp1, const floatX* inp2,
                                                        const floatX* weight, const floatX* bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const size_t off = (size_t)row * C;
    for (int c = lane; c < C; c += WARP_SIZE)
        residual[off + c] = from_float<floatX>(to_float(inp1[off + c]) + to_float(inp2[off + c]));
    layernorm_row_warp(out + off, mean, rstd, residual + off, weight, bias, row, C);
}

// mean and rstd may be null (inference: nothing saved for a backward).
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    layernorm_forward_kernel<<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    cudaCheck(cudaGetLastError());
}

inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    fused_residual_layernorm_forward_kernel<<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(
        residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Backward. With xhat = (x - mean) * rstd, y = xhat * w + b, and g = dy * w:
//   dL/dxhat[c] = g[c]
//   dL/dx[c]    = rstd * (g[c] - (1/C) sum_j g[j] - xhat[c] * (1/C) sum_j g[j] xhat[j])
//   dL/dw[c]    = sum_rows dy[c] * xhat[c]
//   dL/db[c]    = sum_rows dy[c]
// (the two row means come from differentiating mean and rstd through x).
//
// Determinism without atomics, two stages:
//   1. G = min(N, LAYERNORM_BWD_MAX_BLOCKS) blocks; block k takes rows k, k+G, ...
//      one row at a time, threads striding over c. Thread i owns the columns
//      c = i + j*blockDim in a shared-memory accumulator of dw and db, so no two
//      threads ever touch the same slot. The two row sums use a block reduction.
//      At the end each block writes its partial dw|db (2*C floats) to scratch.
//   2. One thread per column sums the G partials in block order and adds the
//      result to dweight / dbias.
constexpr int LAYERNORM_BWD_MAX_BLOCKS = 1024;

inline int layernorm_backward_blocks(int N) { return N < LAYERNORM_BWD_MAX_BLOCKS ? N : LAYERNORM_BWD_MAX_BLOCKS; }

inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)layernorm_backward_blocks(N) * 2 * C;
}

// Sums two values over the block in one round of barriers (blockDim.x a
// multiple of 32); every thread gets both totals.
__device__ inline float2 block_reduce_sum2(float a, float b) {
    __shared__ float2 warp_sums[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    a = warp_reduce_sum(a);
    b = warp_reduce_sum(b);
    __syncthreads();  // the previous row's reduction may still be reading warp_sums
    if (lane == 0) warp_sums[warp] = make_float2(a, b);
    __syncthreads();
    const float2 v = lane < num_warps ? warp_sums[lane] : make_float2(0.0f, 0.0f);
    return make_float2(warp_reduce_sum(v.x), warp_reduce_sum(v.y));
}

__global__ void layernorm_backward_kernel(floatX* dinp, float* scratch, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float ln_bwd_smem[];
    float* dw_acc = ln_bwd_smem;      // [C]
    float* db_acc = ln_bwd_smem + C;  // [C]
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        dw_acc[c] = 0.0f;
        db_acc[c] = 0.0f;
    }
    for (int row = blockIdx.x; row < N; row += gridDim.x) {  // same trip count for every thread of the block
        const size_t off = (size_t)row * C;
        const float mu = mean[row], rs = rstd[row];
        float sum_g = 0.0f, sum_g_xhat = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float dy = to_float(dout[off + c]);
            const float xhat = (to_float(inp[off + c]) - mu) * rs;
            const float g = dy * to_float(weight[c]);
            sum_g += g;
            sum_g_xhat += g * xhat;
            dw_acc[c] += dy * xhat;
            db_acc[c] += dy;
        }
        const float2 sums = block_reduce_sum2(sum_g, sum_g_xhat);
        const float mean_g = sums.x / C, mean_g_xhat = sums.y / C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float dy = to_float(dout[off + c]);
            const float xhat = (to_float(inp[off + c]) - mu) * rs;
            const float g = dy * to_float(weight[c]);
            const float dx = rs * (g - mean_g - xhat * mean_g_xhat);
            dinp[off + c] = from_float<floatX>(to_float(dinp[off + c]) + dx);  // accumulate into the residual grad
        }
    }
    float* partial = scratch + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        partial[c] = dw_acc[c];
        partial[C + c] = db_acc[c];
    }
}

// j in [0, 2C): total = sum over blocks k = 0..G-1 of scratch[k][j];
// dweight[j] += total (j < C), dbias[j - C] += total (j >= C).
__global__ void layernorm_backward_finish_kernel(float* dweight, float* dbias, const float* scratch, int G, int C) {
    const int twoC = 2 * C;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < twoC; j += gridDim.x * blockDim.x) {
        float total = 0.0f;
        for (int k = 0; k < G; k++) total += scratch[(size_t)k * twoC + j];
        if (j < C) dweight[j] += total;
        else dbias[j - C] += total;
    }
}

// scratch: layernorm_backward_scratch_floats(N, C) floats, contents ignored.
inline void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                               int N, int C, cudaStream_t stream) {
    if (N <= 0) return;
    const int G = layernorm_backward_blocks(N);
    // 64 threads, a dozen columns each (C = 768): enough to stream a row, and
    // few enough that the two block reductions per row stay cheap
    const int block = C >= 64 ? 64 : CEIL_DIV(C, WARP_SIZE) * WARP_SIZE;
    const size_t smem = 2 * (size_t)C * sizeof(float);
    if (smem > 48 * 1024)  // large C: opt in to more than the default 48 KiB
        cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    layernorm_backward_kernel<<<G, block, smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    cudaCheck(cudaGetLastError());
    layernorm_backward_finish_kernel<<<chunked_grid_blocks(2 * (size_t)C, 256), 256, 0, stream>>>(dweight, dbias, scratch, G, C);
    cudaCheck(cudaGetLastError());
}
