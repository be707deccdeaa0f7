// Fused AdamW step for one parameter tensor, with gradient-norm clipping
// folded in. Follows torch.optim.AdamW's single-tensor arithmetic on fp32
// master weights, then writes the floatX copy the model computes with.
#pragma once
#include <cmath>
#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/global_norm.cuh"

// g     = grads[i] * clip          clip = *grad_scale (global_norm.cuh's grad_scale)
// p     = master[i] * (1 - lr * weight_decay)          decoupled weight decay
// m     = m + (1 - beta1) (g - m)                      torch's lerp
// v     = beta2 v + (1 - beta2) g^2
// p     = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
//         step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)
// master[i] = p;  params[i] = stochastic_round(p; index index_offset + i, seed)
// The clip factor is read from device memory here, so the optimizer never
// waits for the norm on the host; a NaN factor (a non-finite norm) skips the
// step. The scalars that depend only on the hyperparameters are computed in
// double on the host, as torch does in Python.
// N consecutive elements per thread (adamw_pack_width): a 16-byte pack of the
// floatX weights where n and the pointers allow (8 bf16, whose fp32 state is
// two 16-byte accesses per array; 4 floats), else 4, else 1. The arithmetic
// per element is the same for every N, so the result does not depend on it.
template <int N>
__global__ void adamw_kernel(floatX* __restrict__ params, float* __restrict__ master, const float* __restrict__ grads,
                             float* __restrict__ m, float* __restrict__ v, size_t n, float decay, float one_minus_beta1,
                             float beta2, float one_minus_beta2, float eps, float step_size, float bc2_sqrt,
                             const float* grad_scale, uint32_t seed, size_t index_offset) {
    const BlockChunk chunk = block_chunk(n / N);
    const float clip = read_grad_scale(grad_scale);
    // a non-finite gradient (an overflow, a bad batch) leaves the weights and
    // moments as they were (the trainer then stops, or skips the step): the
    // loop runs over no element. Not a return: see block_chunk.
    const size_t end = isfinite(clip) ? chunk.end : chunk.begin;
    for (size_t k = chunk.begin + threadIdx.x; k < end; k += blockDim.x) {
        const size_t i = k * N;
        const Packed<float, N> g = load_packed_streaming<N>(grads + i);
        Packed<float, N> p = load_packed<N>(master + i), mi = load_packed<N>(m + i), vi = load_packed<N>(v + i);
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float ge = g.v[e] * clip;
            mi.v[e] = mi.v[e] + one_minus_beta1 * (ge - mi.v[e]);
            vi.v[e] = beta2 * vi.v[e] + one_minus_beta2 * ge * ge;
            const float denom = sqrtf(vi.v[e]) / bc2_sqrt + eps;
            const float decayed = p.v[e] * decay;
            p.v[e] = decayed - step_size * (mi.v[e] / denom);
        }
        // all N rounded at once, after the arithmetic; exact when floatX is float
        const Packed<floatX, N> w = stochastic_round_packed<floatX>(p, (uint32_t)(index_offset + i), seed);
        store_packed(m + i, mi);
        store_packed(v + i, vi);
        store_packed(master + i, p);
        store_packed(params + i, w);
    }
}

// Elements per thread of adamw_kernel: the widest of a 16-byte pack of the
// weights (PACK128<floatX>) and 4 that n and the arrays' alignment allow (each
// array aligned to its N elements), else 1.
inline int adamw_pack_width(size_t n, const floatX* params, const float* master, const float* grads, const float* m,
                            const float* v) {
    for (const int N : {PACK128<floatX>, 4})
        if (n % N == 0 && aligned_to(N * sizeof(floatX), params) && aligned_to(N * sizeof(float), master, grads, m, v))
            return N;
    return 1;
}

// t: the step number, from 1. grad_scale: device pointer to the clip factor
// (grad_scale in global_norm.cuh; null: 1); when it holds NaN nothing is
// updated. seed: should differ per step and per tensor, since the
// rounding noise is a hash of (index within the tensor, seed). index_offset:
// where element 0 of this call sits in its tensor, so that updating a tensor
// in pieces (a ZeRO-1 shard) rounds exactly as updating it whole.
inline void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                         uint32_t seed, size_t index_offset, cudaStream_t stream) {
    if (n == 0) return;
    const double bias_correction1 = 1.0 - std::pow((double)beta1, t);
    const double bias_correction2 = 1.0 - std::pow((double)beta2, t);
    const float step_size = (float)((double)lr / bias_correction1);
    const float bc2_sqrt = (float)std::sqrt(bias_correction2);
    const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    const int block = 256;
    const float one_minus_beta1 = (float)(1.0 - (double)beta1), one_minus_beta2 = (float)(1.0 - (double)beta2);
    auto launch = [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        adamw_kernel<P><<<chunked_grid_blocks(n / P, block), block, 0, stream>>>(
            params, master, grads, m, v, n, decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt,
            grad_scale, seed, index_offset);
    };
    const int width = adamw_pack_width(n, params, master, grads, m, v);
    if constexpr (PACK128<floatX> > 4)
        if (width == PACK128<floatX>) launch(std::integral_constant<int, PACK128<floatX>>());
    if (width == 4) launch(std::integral_constant<int, 4>());
    if (width == 1) launch(std::integral_constant<int, 1>());
    cudaCheck(cudaGetLastError());
}
