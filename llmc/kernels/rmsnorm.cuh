// RMSNorm over the last dimension (C) of N rows (Llama's normalisation: no
// mean is subtracted, no bias is added): forward, the forward fused with the
// residual add, and a deterministic backward. rstd is saved as fp32, one per
// row, for the backward. eps is a parameter (the model config's rms_norm_eps).
// The structure is layernorm.cuh's: see there for the thread layout.
#pragma once
#include "llmc/kernels/cuda_common.h"

// ---------------------------------------------------------------------------
// Forward, one row x[0..C) per warp; lane l takes the N-element packs l, l+32, ...
// (N = 8 bf16: 16-byte accesses; 1 where C or a pointer does not allow them):
//   rstd   = 1 / sqrt((1/C) sum_c x[c]^2 + eps)
//   out[c] = x[c] * rstd * weight[c]
// Each lane only reads the elements it owns, so a row this same lane has just
// written (the fused residual) is read back without any synchronisation; the
// second read of a row hits the cache.
template <int N>
__device__ inline void rmsnorm_row_warp(floatX* out, float* rstd, const floatX* x, const floatX* weight, int row, int C,
                                        float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    float sq = 0.0f;
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<floatX, N> xv = load_packed<N>(x + c);
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float v = to_float(xv.v[e]);
            sq += v * v;
        }
    }
    const float rs = rsqrtf(warp_reduce_sum(sq) / C + eps);
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<floatX, N> xv = load_packed<N>(x + c), w = load_packed<N>(weight + c);
        Packed<floatX, N> o;
#pragma unroll
        for (int e = 0; e < N; e++) o.v[e] = from_float<floatX>(to_float(xv.v[e]) * rs * to_float(w.v[e]));
        store_packed(out + c, o);
    }
    if (lane == 0 && rstd) rstd[row] = rs;
}

template <int N>
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int rows,
                                       int C, float eps) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // the whole warp leaves together
    const size_t off = (size_t)row * C;
    rmsnorm_row_warp<N>(out + off, rstd, inp + off, weight, row, C, eps);
}

// residual[c] = round_floatX(inp1[c] + inp2[c]) (stored), then
// out = rmsnorm(residual) from the stored, rounded values, so the forward
// sees exactly the residual stream that the backward will see.
template <int N>
__global__ void fused_residual_rmsnorm_forward_kernel(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                                      const floatX* inp2, const floatX* weight, int rows, int C,
                                                      float eps) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;
    const size_t off = (size_t)row * C;
    add_row_warp<N>(residual + off, inp1 + off, inp2 + off, C);
    rmsnorm_row_warp<N>(out + off, rstd, residual + off, weight, row, C, eps);
}

// rstd may be null (inference: nothing saved for a backward).
inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C, float eps,
                            cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    with_pack_width<floatX>(pack_width<floatX>(C, out, inp, weight), [&](auto pack) {
        rmsnorm_forward_kernel<decltype(pack)::value>
            <<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
    });
    cudaCheck(cudaGetLastError());
}

inline void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                           const floatX* inp2, const floatX* weight, int N, int C, float eps,
                                           cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    with_pack_width<floatX>(pack_width<floatX>(C, residual, out, inp1, inp2, weight), [&](auto pack) {
        fused_residual_rmsnorm_forward_kernel<decltype(pack)::value>
            <<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
    });
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Backward. With xhat = x * rstd, y = xhat * w, and g = dy * w:
//   d xhat_j / d x_i = rstd (delta_ij - xhat_i xhat_j / C)
//   dL/dx[c] = rstd * (g[c] - xhat[c] * (1/C) sum_j g[j] xhat[j])
//   dL/dw[c] = sum_rows dy[c] * xhat[c]
// (layernorm's formula without the mean terms).
//
// Determinism without atomics, layernorm_backward's two stages with one
// accumulator per column instead of two:
//   1. G blocks of W warps, a row per warp at a time (warp w of block k takes
//      rows k*W + w, then G*W further on, ...). Each warp adds dy * xhat of its
//      rows into its own slice of shared memory (C floats): no two threads
//      ever touch the same slot. At the end the block adds its W slices in
//      warp order and writes its partial dw (C floats) to scratch.
//   2. One thread per column sums the G partials in block order and adds the
//      result to dweight.
constexpr int RMSNORM_BWD_MAX_BLOCKS = 1024;

// Warps per block: 4, or 1 where four slices of C floats would not fit in
// 100 KB of shared memory (C over 6400).
inline int rmsnorm_backward_warps(int C) { return 4 * (size_t)C * sizeof(float) <= 100 * 1024 ? 4 : 1; }
inline int rmsnorm_backward_blocks(int N, int C) {
    const int needed = CEIL_DIV(N, rmsnorm_backward_warps(C));
    return needed < RMSNORM_BWD_MAX_BLOCKS ? needed : RMSNORM_BWD_MAX_BLOCKS;
}

inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return (size_t)rmsnorm_backward_blocks(N, C) * C; }

template <int N>
__global__ void rmsnorm_backward_kernel(floatX* dinp, float* scratch, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* rstd, int rows, int C) {
    extern __shared__ float rms_bwd_smem[];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    float* dw_acc = rms_bwd_smem + (size_t)warp * C;  // this warp's slice
    for (int c = lane; c < C; c += WARP_SIZE) dw_acc[c] = 0.0f;
    __syncwarp();  // zeroed by other lanes than the ones that accumulate
    for (int row = blockIdx.x * warps + warp; row < rows; row += gridDim.x * warps) {
        const size_t off = (size_t)row * C;
        const float rs = rstd[row];
        float sum_g_xhat = 0.0f;
        for (int c = lane * N; c < C; c += WARP_SIZE * N) {
            const Packed<floatX, N> dy = load_packed<N>(dout + off + c), x = load_packed<N>(inp + off + c);
            const Packed<floatX, N> w = load_packed<N>(weight + c);
#pragma unroll
            for (int e = 0; e < N; e++) {
                const float dye = to_float(dy.v[e]), xhat = to_float(x.v[e]) * rs;
                sum_g_xhat += dye * to_float(w.v[e]) * xhat;
                dw_acc[c + e] += dye * xhat;
            }
        }
        const float mean_g_xhat = warp_reduce_sum(sum_g_xhat) / C;
        for (int c = lane * N; c < C; c += WARP_SIZE * N) {  // the row again, from the cache
            const Packed<floatX, N> dy = load_packed<N>(dout + off + c), x = load_packed<N>(inp + off + c);
            const Packed<floatX, N> w = load_packed<N>(weight + c);
            Packed<floatX, N> dx = load_packed<N>(dinp + off + c);
#pragma unroll
            for (int e = 0; e < N; e++) {
                const float xhat = to_float(x.v[e]) * rs, g = to_float(dy.v[e]) * to_float(w.v[e]);
                // accumulate into the residual's gradient
                dx.v[e] = from_float<floatX>(to_float(dx.v[e]) + rs * (g - xhat * mean_g_xhat));
            }
            store_packed(dinp + off + c, dx);
        }
    }
    __syncthreads();
    float* partial = scratch + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float total = 0.0f;
        for (int k = 0; k < warps; k++) total += rms_bwd_smem[(size_t)k * C + c];
        partial[c] = total;
    }
}

// c in [0, C): dweight[c] += sum over blocks k = 0..G-1 of scratch[k][c].
__global__ void rmsnorm_backward_finish_kernel(float* dweight, const float* scratch, int G, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float total = 0.0f;
        for (int k = 0; k < G; k++) total += scratch[(size_t)k * C + c];
        dweight[c] += total;
    }
}

// dinp and dweight are accumulated into (+=). scratch: rmsnorm_backward_scratch_floats(N, C)
// floats, contents ignored.
inline void rmsnorm_backward(floatX* dinp, float* dweight, float* scratch, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    if (N <= 0) return;
    const int G = rmsnorm_backward_blocks(N, C), warps = rmsnorm_backward_warps(C);
    const size_t smem = (size_t)warps * C * sizeof(float);
    with_pack_width<floatX>(pack_width<floatX>(C, dinp, dout, inp, weight), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        // shared memory over the default 48 KiB needs an opt-in (cudaFuncSetAttribute takes the kernel by name)
        if (smem > 48 * 1024)
            cudaCheck(cudaFuncSetAttribute(rmsnorm_backward_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
        rmsnorm_backward_kernel<P>
            <<<G, warps * WARP_SIZE, smem, stream>>>(dinp, scratch, dout, inp, weight, rstd, N, C);
    });
    cudaCheck(cudaGetLastError());
    rmsnorm_backward_finish_kernel<<<chunked_grid_blocks((size_t)C, 256), 256, 0, stream>>>(dweight, scratch, G, C);
    cudaCheck(cudaGetLastError());
}
