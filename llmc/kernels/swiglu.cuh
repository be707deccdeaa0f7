// SwiGLU, Llama's MLP activation, elementwise forward and backward:
//   out = silu(gate) * up,   silu(g) = g * sigmoid(g)
//
// Input layout: the output of ONE fused matmul with the gate and up
// projections stacked, W = [W_gate; W_up] (2F x C), so each row of N rows is
// [gate (F) | up (F)]: inp is (N, 2F), out is (N, F). The two halves of a row
// are two contiguous runs, so every access stays 16 bytes wide, and importing
// transformers' gate_proj and up_proj is a concatenation of the two matrices.
// Memory-bound: each thread moves 16 bytes per access (8 bf16; see Packed in
// cuda_common.h).
#pragma once
#include "llmc/kernels/cuda_common.h"

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// N elements per access (PACK128 or 1); F is a multiple of N. Element k of the
// (N, F) output: row k / F, column k % F; its gate at row * 2F + column, its up F further.
template <int N>
__global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, size_t rows, int F) {
    const BlockChunk chunk = block_chunk(rows * F / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const size_t row = k * N / F, col = k * N % F;
        const floatX* g_at = inp + row * 2 * F + col;
        const Packed<floatX, N> g = load_packed_streaming<N>(g_at), u = load_packed_streaming<N>(g_at + F);
        Packed<floatX, N> y;
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float gf = to_float(g.v[e]);
            y.v[e] = from_float<floatX>(gf * sigmoid(gf) * to_float(u.v[e]));
        }
        store_packed(out + k * N, y);
    }
}

// With s = sigmoid(g):
//   d silu(g) / dg = s + g s (1 - s) = s (1 + g (1 - s))
//   dgate = dout * up * s (1 + g (1 - s))
//   dup   = dout * silu(g)
// dinp is (N, 2F) like inp, and may be inp: each element is read and then
// written by one thread (the activation's storage holds its own gradient).
template <int N>
__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* dout, const floatX* inp, size_t rows, int F) {
    const BlockChunk chunk = block_chunk(rows * F / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const size_t row = k * N / F, col = k * N % F, at = row * 2 * F + col;
        const Packed<floatX, N> g = load_packed<N>(inp + at), u = load_packed<N>(inp + at + F);
        const Packed<floatX, N> dy = load_packed_streaming<N>(dout + k * N);
        Packed<floatX, N> dg, du;
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float gf = to_float(g.v[e]), s = sigmoid(gf), d = to_float(dy.v[e]);
            dg.v[e] = from_float<floatX>(d * to_float(u.v[e]) * s * (1.0f + gf * (1.0f - s)));
            du.v[e] = from_float<floatX>(d * gf * s);
        }
        // Stored by pack index, so that the compiler sees the 16-byte alignment: through
        // store_packed(dinp + at + F, ...) nvcc 13 drops it for one of the two stores and
        // emits eight 2-byte stores (dev/sass_report.py's STG16 column). at and F are multiples of N.
        Packed<floatX, N>* packs = reinterpret_cast<Packed<floatX, N>*>(dinp);
        packs[at / N] = dg;
        packs[(at + F) / N] = du;
    }
}

// out (rows, F) = silu(inp[:, :F]) * inp[:, F:], inp (rows, 2F).
inline void swiglu_forward(floatX* out, const floatX* inp, size_t rows, int F, cudaStream_t stream) {
    if (F <= 0) llmc::failf("swiglu: hidden size %d must be positive", F);
    const int block = 256;
    with_pack_width<floatX>(pack_width<floatX>(F, out, inp), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        swiglu_forward_kernel<P><<<chunked_grid_blocks(rows * F / P, block), block, 0, stream>>>(out, inp, rows, F);
    });
    cudaCheck(cudaGetLastError());
}

// dinp (rows, 2F) = [dgate | dup] from dout (rows, F) and inp (rows, 2F); dinp may be inp.
inline void swiglu_backward(floatX* dinp, const floatX* dout, const floatX* inp, size_t rows, int F,
                            cudaStream_t stream) {
    if (F <= 0) llmc::failf("swiglu: hidden size %d must be positive", F);
    const int block = 256;
    with_pack_width<floatX>(pack_width<floatX>(F, dinp, dout, inp), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        swiglu_backward_kernel<P>
            <<<chunked_grid_blocks(rows * F / P, block), block, 0, stream>>>(dinp, dout, inp, rows, F);
    });
    cudaCheck(cudaGetLastError());
}
