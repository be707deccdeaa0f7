// LayerNorm over the last dimension (C) of N rows, eps = 1e-5: forward, the
// forward fused with the residual add, and a deterministic backward.
// mean and rstd are saved as fp32, one per row, for the backward.
#pragma once
#include "llmc/kernels/cuda_common.h"

constexpr float LAYERNORM_EPS = 1e-5f;

// ---------------------------------------------------------------------------
// Forward, one row x[0..C) per warp; lane l takes the N-element packs l, l+32, ...
// (N = 8 bf16: 16-byte accesses; 1 where C or a pointer does not allow them):
//   mean = (1/C) sum_c x[c]
//   var  = (1/C) sum_c (x[c] - mean)^2          (two passes: no cancellation)
//   rstd = 1 / sqrt(var + eps)
//   out[c] = (x[c] - mean) * rstd * weight[c] + bias[c]
// Each lane only reads the elements it owns, so a row this same lane has just
// written (the fused residual) is read back without any synchronisation; the
// second and third reads of a row hit the cache.
template <int N>
__device__ inline void layernorm_row_warp(floatX* out, float* mean, float* rstd, const floatX* x, const floatX* weight,
                                          const floatX* bias, int row, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    float sum = 0.0f;
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<floatX, N> xv = load_packed<N>(x + c);
#pragma unroll
        for (int e = 0; e < N; e++) sum += to_float(xv.v[e]);
    }
    const float mu = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<floatX, N> xv = load_packed<N>(x + c);
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float d = to_float(xv.v[e]) - mu;
            sq += d * d;
        }
    }
    const float rs = rsqrtf(warp_reduce_sum(sq) / C + LAYERNORM_EPS);
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        const Packed<floatX, N> xv = load_packed<N>(x + c), w = load_packed<N>(weight + c),
                                b = load_packed<N>(bias + c);
        Packed<floatX, N> o;
#pragma unroll
        for (int e = 0; e < N; e++)
            o.v[e] = from_float<floatX>((to_float(xv.v[e]) - mu) * rs * to_float(w.v[e]) + to_float(b.v[e]));
        store_packed(out + c, o);
    }
    if (lane == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = rs;
    }
}

template <int N>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                         const floatX* bias, int rows, int C) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // the whole warp leaves together
    const size_t off = (size_t)row * C;
    layernorm_row_warp<N>(out + off, mean, rstd, inp + off, weight, bias, row, C);
}

// residual[c] = round_floatX(inp1[c] + inp2[c]) (stored), then
// out = layernorm(residual) from the stored, rounded values, so the forward
// sees exactly the residual stream that the backward will see.
template <int N>
__global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                        const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                        const floatX* bias, int rows, int C) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;
    const size_t off = (size_t)row * C;
    add_row_warp<N>(residual + off, inp1 + off, inp2 + off, C);
    layernorm_row_warp<N>(out + off, mean, rstd, residual + off, weight, bias, row, C);
}

// mean and rstd may be null (inference: nothing saved for a backward).
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    with_pack_width<floatX>(pack_width<floatX>(C, out, inp, weight, bias), [&](auto pack) {
        layernorm_forward_kernel<decltype(pack)::value>
            <<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    });
    cudaCheck(cudaGetLastError());
}

inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / WARP_SIZE;
    if (N <= 0) return;
    with_pack_width<floatX>(pack_width<floatX>(C, residual, out, inp1, inp2, weight, bias), [&](auto pack) {
        fused_residual_layernorm_forward_kernel<decltype(pack)::value>
            <<<CEIL_DIV(N, rows_per_block), block, 0, stream>>>(residual, out, mean, rstd, inp1, inp2, weight, bias, N,
                                                                C);
    });
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
//   1. G blocks of W warps, a row per warp at a time: warp w of block k takes
//      rows k*W + w, then G*W further on, ...; lanes own the N-element packs
//      lane*N, lane*N + 32N, ... of a row (16-byte accesses). The two row sums
//      are warp reductions, so rows need no block barrier. Each warp adds
//      dy * xhat and dy of its rows into its own slice of shared memory (2*C
//      floats): no two threads ever touch the same slot. At the end the block
//      adds its W slices in warp order and writes its partial dw|db (2*C
//      floats) to scratch.
//   2. One thread per column sums the G partials in block order and adds the
//      result to dweight / dbias.
constexpr int LAYERNORM_BWD_MAX_BLOCKS = 1024;

// Warps per block: 4, or 1 where four slices of 2*C floats would not fit in
// 100 KB of shared memory (C over 3200).
inline int layernorm_backward_warps(int C) { return 4 * 2 * (size_t)C * sizeof(float) <= 100 * 1024 ? 4 : 1; }
inline int layernorm_backward_blocks(int N, int C) {
    const int needed = CEIL_DIV(N, layernorm_backward_warps(C));
    return needed < LAYERNORM_BWD_MAX_BLOCKS ? needed : LAYERNORM_BWD_MAX_BLOCKS;
}

inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)layernorm_backward_blocks(N, C) * 2 * C;
}

template <int N>
__global__ void layernorm_backward_kernel(floatX* dinp, float* scratch, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int rows, int C) {
    extern __shared__ float ln_bwd_smem[];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    float* dw_acc = ln_bwd_smem + (size_t)warp * 2 * C;  // this warp's slice: dw [C] | db [C]
    float* db_acc = dw_acc + C;
    for (int c = lane; c < 2 * C; c += WARP_SIZE) dw_acc[c] = 0.0f;
    __syncwarp();  // zeroed by other lanes than the ones that accumulate
    for (int row = blockIdx.x * warps + warp; row < rows; row += gridDim.x * warps) {
        const size_t off = (size_t)row * C;
        const float mu = mean[row], rs = rstd[row];
        float sum_g = 0.0f, sum_g_xhat = 0.0f;
        for (int c = lane * N; c < C; c += WARP_SIZE * N) {
            const Packed<floatX, N> dy = load_packed<N>(dout + off + c), x = load_packed<N>(inp + off + c);
            const Packed<floatX, N> w = load_packed<N>(weight + c);
#pragma unroll
            for (int e = 0; e < N; e++) {
                const float dye = to_float(dy.v[e]), xhat = (to_float(x.v[e]) - mu) * rs;
                const float g = dye * to_float(w.v[e]);
                sum_g += g;
                sum_g_xhat += g * xhat;
                dw_acc[c + e] += dye * xhat;
                db_acc[c + e] += dye;
            }
        }
        const float2 sums = warp_reduce_sum_pair(make_float2(sum_g, sum_g_xhat));
        const float mean_g = sums.x / C, mean_g_xhat = sums.y / C;
        for (int c = lane * N; c < C; c += WARP_SIZE * N) {  // the row again, from the cache
            const Packed<floatX, N> dy = load_packed<N>(dout + off + c), x = load_packed<N>(inp + off + c);
            const Packed<floatX, N> w = load_packed<N>(weight + c);
            Packed<floatX, N> dx = load_packed<N>(dinp + off + c);
#pragma unroll
            for (int e = 0; e < N; e++) {
                const float xhat = (to_float(x.v[e]) - mu) * rs, g = to_float(dy.v[e]) * to_float(w.v[e]);
                // accumulate into the residual's gradient
                dx.v[e] = from_float<floatX>(to_float(dx.v[e]) + rs * (g - mean_g - xhat * mean_g_xhat));
            }
            store_packed(dinp + off + c, dx);
        }
    }
    __syncthreads();
    float* partial = scratch + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float total = 0.0f;
        for (int k = 0; k < warps; k++) total += ln_bwd_smem[(size_t)k * 2 * C + c];
        partial[c] = total;
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
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream) {
    if (N <= 0) return;
    const int G = layernorm_backward_blocks(N, C), warps = layernorm_backward_warps(C);
    const size_t smem = (size_t)warps * 2 * C * sizeof(float);
    with_pack_width<floatX>(pack_width<floatX>(C, dinp, dout, inp, weight), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        // shared memory over the default 48 KiB needs an opt-in (cudaFuncSetAttribute takes the kernel by name)
        if (smem > 48 * 1024)
            cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
        layernorm_backward_kernel<P>
            <<<G, warps * WARP_SIZE, smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    });
    cudaCheck(cudaGetLastError());
    layernorm_backward_finish_kernel<<<chunked_grid_blocks(2 * (size_t)C, 256), 256, 0, stream>>>(dweight, dbias,
                                                                                                  scratch, G, C);
    cudaCheck(cudaGetLastError());
}
