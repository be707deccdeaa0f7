// GELU, tanh approximation (as GPT-2), elementwise forward and in-place backward.
// Memory-bound: each thread moves 16 bytes per access (8 bf16; see Packed in
// cuda_common.h), and the inputs are read once (streaming loads).
#pragma once
#include "llmc/kernels/cuda_common.h"

constexpr float GELU_SCALE = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float GELU_CUBE = 0.044715f;

// tanh(u) = 1 - 2 / (1 + e^(2u)): one exponential and one fast division
// (__fdividef: no IEEE slow path on a GPU; 2 / inf gives 0), exact at the
// limits (tanh = 1 or -1) and within a few 1e-7 elsewhere.
__device__ inline float tanh_from_exp(float u) { return 1.0f - __fdividef(2.0f, 1.0f + expf(2.0f * u)); }

// out = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ inline float gelu(float x) {
    const float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return 0.5f * x * (1.0f + tanh_from_exp(u));
}
// d(gelu)/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
__device__ inline float gelu_grad(float x) {
    const float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    const float th = tanh_from_exp(u);
    const float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

// N elements per access (PACK128 or 1); n is a multiple of N.
template <int N>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    const BlockChunk chunk = block_chunk(n / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const Packed<floatX, N> x = load_packed_streaming<N>(inp + k * N);
        Packed<floatX, N> y;
#pragma unroll
        for (int e = 0; e < N; e++) y.v[e] = from_float<floatX>(gelu(to_float(x.v[e])));
        store_packed(out + k * N, y);
    }
}

// d[i] = d[i] * gelu'(inp[i]), in place (each element read then written by one thread).
template <int N>
__global__ void gelu_backward_inplace_kernel(floatX* d_in_out, const floatX* inp, size_t n) {
    const BlockChunk chunk = block_chunk(n / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const Packed<floatX, N> x = load_packed_streaming<N>(inp + k * N);
        Packed<floatX, N> d = load_packed<N>(d_in_out + k * N);
#pragma unroll
        for (int e = 0; e < N; e++) d.v[e] = from_float<floatX>(to_float(d.v[e]) * gelu_grad(to_float(x.v[e])));
        store_packed(d_in_out + k * N, d);
    }
}

inline void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    const int block = 256;
    with_pack_width<floatX>(pack_width<floatX>(n, out, inp), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        gelu_forward_kernel<P><<<chunked_grid_blocks(n / P, block), block, 0, stream>>>(out, inp, n);
    });
    cudaCheck(cudaGetLastError());
}

inline void gelu_backward_inplace(floatX* d_in_out, const floatX* inp, size_t n, cudaStream_t stream) {
    const int block = 256;
    with_pack_width<floatX>(pack_width<floatX>(n, d_in_out, inp), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        gelu_backward_inplace_kernel<P><<<chunked_grid_blocks(n / P, block), block, 0, stream>>>(d_in_out, inp, n);
    });
    cudaCheck(cudaGetLastError());
}
