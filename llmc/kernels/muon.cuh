// Muon for the 2-D weight matrices: SGD with Nesterov momentum whose update is
// orthogonalised by a Newton-Schulz iteration, on fp32 master weights, then the
// floatX copy the model computes with. Source: Keller Jordan, "Muon: An
// optimizer for hidden layers in neural networks" (kellerjordan.github.io/posts/muon)
// and modded-nanogpt's Muon (github.com/KellerJordan/modded-nanogpt); docs/muon.md
// states the algorithm and what it costs.
//
// For count same-shaped matrices stored back to back (a [count, rows, cols]
// tensor, each row-major [out, in] like PyTorch's Linear):
//   g    = grads * clip             clip = *grad_scale (global_norm.cuh's grad_scale)
//   m    = mu m + g                 momentum (fp32, kept)
//   u    = g + mu m                 Nesterov: the step looks ahead along m
//   O    = NS5(u)                   floatX, below
//   p    = master (1 - lr wd) - lr sqrt(max(1, rows / cols)) O
//   master = p;  params = stochastic_round(p; index index_offset + i, seed)
// The scale sqrt(max(1, rows/cols)) is modded-nanogpt's (Keller Jordan's); Moonshot's
// Muon uses 0.2 sqrt(max(rows, cols)) to match AdamW's update size instead (not this).
// A NaN *grad_scale (a non-finite gradient norm) leaves weights, master and
// momentum as they were, as adamw_update does.
#pragma once
#include <cmath>
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/matmul.cuh"

// Newton-Schulz quintic (Keller Jordan's zeropower_via_newtonschulz5): with
//   X = u / (||u||_F + 1e-7)            all singular values <= 1
// and, on the smaller Gram side (X^T when rows > cols, so A is min(rows, cols)^2),
//   A = X X^T,  B = b A + c A A,  X = a X + B X          5 times
// each step maps every singular value s of X to a s + b s^3 + c s^5, which pushes
// s in (0, 1] towards 1 (the coefficients make the slope at 0 large, 3.4445, at
// the price of ending in roughly [0.7, 1.2] rather than at 1): O ~ U V^T for u = U S V^T.
// Operands floatX (bf16, as Keller Jordan's runs), fp32 accumulation, each
// product rounded to floatX once.
constexpr float MUON_NS_A = 3.4445f, MUON_NS_B = -4.7750f, MUON_NS_C = 2.0315f;
constexpr int MUON_NS_STEPS = 5;
constexpr float MUON_NS_EPS = 1e-7f;
constexpr int MUON_BLOCK = 256;
constexpr int MUON_NORM_MAX_PARTS = 64;  // blocks per matrix of the norm's first stage

// The number of norm partials per matrix: a function of the size alone, so the
// sum's order (and result) is the same every run.
inline int muon_norm_parts(size_t per_matrix) {
    const size_t parts = CEIL_DIV(per_matrix, (size_t)MUON_BLOCK * 32);
    return (int)(parts < 1 ? 1 : parts > MUON_NORM_MAX_PARTS ? MUON_NORM_MAX_PARTS : parts);
}

// The scratch one muon_update of count rows x cols matrices needs, in bytes:
// two floatX copies of the matrices (the iteration's ping-pong), two floatX
// Grams min(rows, cols)^2 each (A and B), and the norm partials. Regions start
// 256-byte aligned, as cuBLASLt's fastest algorithms want.
struct MuonScratch {
    floatX *x0, *x1, *a, *b;
    float* partials;
};
inline size_t muon_align(size_t bytes) { return CEIL_DIV(bytes, (size_t)256) * 256; }
inline MuonScratch muon_scratch_layout(void* base, int count, int rows, int cols, size_t* total_bytes) {
    const size_t s = (size_t)(rows < cols ? rows : cols), per = (size_t)rows * cols;
    const size_t x_bytes = muon_align((size_t)count * per * sizeof(floatX));
    const size_t gram_bytes = muon_align((size_t)count * s * s * sizeof(floatX));
    const size_t partial_bytes = muon_align((size_t)count * muon_norm_parts(per) * sizeof(float));
    char* p = static_cast<char*>(base);
    MuonScratch out{};
    if (p) {
        out.x0 = reinterpret_cast<floatX*>(p);
        out.x1 = reinterpret_cast<floatX*>(p + x_bytes);
        out.a = reinterpret_cast<floatX*>(p + 2 * x_bytes);
        out.b = reinterpret_cast<floatX*>(p + 2 * x_bytes + gram_bytes);
        out.partials = reinterpret_cast<float*>(p + 2 * x_bytes + 2 * gram_bytes);
    }
    *total_bytes = 2 * x_bytes + 2 * gram_bytes + partial_bytes;
    return out;
}
inline size_t muon_scratch_bytes(int rows, int cols, int count = 1) {
    size_t total = 0;
    muon_scratch_layout(nullptr, count, rows, cols, &total);
    return total;
}

// ---------------------------------------------------------------------------
// Momentum: m = mu m + g, u = g + mu m (g clipped as at the top), u rounded to
// floatX for the iteration. When the step is skipped (a non-finite norm) u is
// written as 0, so the iteration that follows reads defined values, and m stays.
template <int N>
__global__ void muon_momentum_kernel(floatX* __restrict__ u, float* __restrict__ m, const float* __restrict__ grads,
                                     size_t n, float mu, const float* grad_scale) {
    const BlockChunk chunk = block_chunk(n / N);
    const float clip = read_grad_scale(grad_scale);
    const bool skip = !isfinite(clip);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const size_t i = k * N;
        Packed<floatX, N> out;
        if (skip) {
#pragma unroll
            for (int e = 0; e < N; e++) out.v[e] = from_float<floatX>(0.0f);
            store_packed(u + i, out);
            continue;
        }
        const Packed<float, N> g = load_packed_streaming<N>(grads + i);
        Packed<float, N> mi = load_packed<N>(m + i);
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float ge = g.v[e] * clip;
            mi.v[e] = mu * mi.v[e] + ge;
            out.v[e] = from_float<floatX>(ge + mu * mi.v[e]);
        }
        store_packed(m + i, mi);
        store_packed(u + i, out);
    }
}

// ||x_b||_F^2 of each matrix b, stage 1: block (p, b) sums the squares of part p
// of matrix b (fp32, thread t taking elements t, t + blockDim.x, ... of the part).
__global__ void muon_norm_partial_kernel(float* partials, const floatX* x, size_t per_matrix, int parts) {
    const size_t per_part = CEIL_DIV(per_matrix, (size_t)parts);
    const size_t begin = blockIdx.x * per_part, end = begin + per_part < per_matrix ? begin + per_part : per_matrix;
    const floatX* xb = x + blockIdx.y * per_matrix;
    float sum = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float v = to_float(xb[i]);
        sum += v * v;
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.y * parts + blockIdx.x] = sum;
}

// Stage 2, in place: x_b = x_b / (||x_b||_F + eps), the norm summed from matrix
// b's partials in part order by every thread (parts <= 64: cheaper than a sync).
__global__ void muon_normalize_kernel(floatX* x, const float* partials, size_t per_matrix, int parts, float eps) {
    const float* pb = partials + blockIdx.y * parts;
    float sum = 0.0f;
    for (int p = 0; p < parts; p++) sum += pb[p];
    const float inv = 1.0f / (sqrtf(sum) + eps);
    floatX* xb = x + blockIdx.y * per_matrix;
    const BlockChunk chunk = block_chunk(per_matrix);
    for (size_t i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x)
        xb[i] = from_float<floatX>(to_float(xb[i]) * inv);
}

// The update: p = master (1 - lr wd) - lr scale O, master = p, params =
// stochastic_round(p), as adamw_kernel writes its results; nothing when the
// step is skipped.
template <int N>
__global__ void muon_apply_kernel(floatX* __restrict__ params, float* __restrict__ master, const floatX* __restrict__ o,
                                  size_t n, float decay, float step, const float* grad_scale, uint32_t seed,
                                  size_t index_offset) {
    const BlockChunk chunk = block_chunk(n / N);
    // a skipped step: the loop runs over no element (not a return: see block_chunk)
    const size_t end = isfinite(read_grad_scale(grad_scale)) ? chunk.end : chunk.begin;
    for (size_t k = chunk.begin + threadIdx.x; k < end; k += blockDim.x) {
        const size_t i = k * N;
        const Packed<floatX, N> oi = load_packed<N>(o + i);
        Packed<float, N> p = load_packed<N>(master + i);
        Packed<floatX, N> w;
#pragma unroll
        for (int e = 0; e < N; e++) {
            p.v[e] = p.v[e] * decay - step * to_float(oi.v[e]);
            stochastic_round(p.v[e], &w.v[e], (uint32_t)(index_offset + i + e), seed);  // exact when floatX is float
        }
        store_packed(master + i, p);
        store_packed(params + i, w);
    }
}

// ---------------------------------------------------------------------------
// Column-major D = alpha op(A) op(B) + beta C over `batch` strided batches
// (strides in elements), all floatX, fp32 accumulation; C may be D. matmul.cuh's
// matmul_cublaslt has alpha = 1 and C = D, which B = b A + c A A and
// X = a X + B X cannot use, so this is its plain (no epilogue) batched sibling,
// on the same handle, workspace and choice of algorithm (matmul_setup,
// cublaslt_best_algorithm), asked for once per problem and reused.
inline void muon_gemm(floatX* d, const floatX* c, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a,
                      bool trans_b, float alpha, float beta, int batch, int64_t stride_a, int64_t stride_b,
                      int64_t stride_cd, cudaStream_t stream) {
    // a batch's pointer is only as aligned as both the base and the stride allow
    auto align = [](const void* p, int64_t stride) {
        const uint32_t base = pointer_alignment(p);
        const uint32_t step = pointer_alignment(reinterpret_cast<const void*>((uintptr_t)stride * sizeof(floatX)));
        return base < step ? base : step;
    };
    const uint32_t align_a = align(a, stride_a), align_b = align(b, stride_b);
    const uint32_t align_c = align(c, stride_cd), align_d = align(d, stride_cd);
    using Key =
        std::tuple<int, int, int, bool, bool, int, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, uint32_t>;
    static std::map<Key, cublasLtMatmulAlgo_t> algorithms;
    const Key key{m, n, k, trans_a, trans_b, batch, stride_a, stride_b, stride_cd, align_a, align_b, align_c, align_d};

    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    auto layout = [&](int rows, int cols, int64_t stride) {
        cublasLtMatrixLayout_t l;
        cublasCheck(cublasLtMatrixLayoutCreate(&l, FLOATX_CUDA_TYPE, rows, cols, rows));
        if (batch > 1) {
            const int32_t count = batch;
            cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
        }
        return l;
    };
    cublasLtMatrixLayout_t layout_a = layout(trans_a ? k : m, trans_a ? m : k, stride_a);
    cublasLtMatrixLayout_t layout_b = layout(trans_b ? n : k, trans_b ? k : n, stride_b);
    cublasLtMatrixLayout_t layout_d = layout(m, n, stride_cd);

    auto found = algorithms.find(key);
    if (found == algorithms.end()) {
        const uint32_t aligns[4] = {align_a, align_b, align_c, align_d};
        cublasLtMatmulHeuristicResult_t heuristic;
        int returned = 0;
        cublasCheck(cublaslt_best_algorithm(desc, layout_a, layout_b, layout_d, aligns, &heuristic, &returned));
        if (returned == 0)
            llmc::fail("cuBLASLt: no algorithm for the Newton-Schulz matmul m=" + std::to_string(m) +
                       " n=" + std::to_string(n) + " k=" + std::to_string(k) + " batch=" + std::to_string(batch));
        found = algorithms.emplace(key, heuristic.algo).first;
    }
    cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, c, layout_d, d, layout_d,
                               &found->second, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// The iteration on the count matrices in x (row-major rows x cols each,
// normalised), MUON_NS_STEPS times, all matrices of a step in one batched
// matmul. Returns the buffer holding the result (x or spare). A row-major
// R x C matrix X is the column-major C x R matrix Y = X^T, so
//   rows <= cols (Gram X X^T, s = rows):  A = Y^T Y,  Y' = a Y + Y B^T
//   rows >  cols (Gram X^T X, s = cols):  A = Y Y^T,  Y' = a Y + B Y
// (Y' = X'^T in both; no matrix is ever transposed in memory).
inline floatX* muon_newton_schulz(floatX* x, floatX* spare, floatX* gram_a, floatX* gram_b, int count, int rows,
                                  int cols, cudaStream_t stream) {
    const bool wide = rows <= cols;
    const int s = wide ? rows : cols;
    const int64_t per = (int64_t)rows * cols, per_gram = (int64_t)s * s;
    for (int step = 0; step < MUON_NS_STEPS; step++) {
        if (wide)
            muon_gemm(gram_a, gram_a, x, x, s, s, cols, true, false, 1.0f, 0.0f, count, per, per, per_gram, stream);
        else muon_gemm(gram_a, gram_a, x, x, s, s, rows, false, true, 1.0f, 0.0f, count, per, per, per_gram, stream);
        muon_gemm(gram_b, gram_a, gram_a, gram_a, s, s, s, false, false, MUON_NS_C, MUON_NS_B, count, per_gram,
                  per_gram, per_gram, stream);
        if (wide)
            muon_gemm(spare, x, x, gram_b, cols, rows, rows, false, true, 1.0f, MUON_NS_A, count, per, per_gram, per,
                      stream);
        else
            muon_gemm(spare, x, gram_b, x, cols, rows, cols, false, false, 1.0f, MUON_NS_A, count, per_gram, per, per,
                      stream);
        std::swap(x, spare);
    }
    return x;
}

// One Muon step of count same-shaped rows x cols matrices stored back to back
// (params, master, grads, momentum: count * rows * cols elements each).
// lr, weight_decay, mu (0.95 in Keller Jordan's Muon) and grad_scale (device
// pointer to the clip factor, null: 1) as at the top of the file; seed and
// index_offset (where element 0 of this call sits in its tensor) as in
// adamw_update. scratch: muon_scratch_bytes(rows, cols, count)
// bytes of device memory, 256-byte aligned (cudaMalloc's are). matmul_setup()
// must have run. Deterministic: fixed reduction orders, no atomics.
inline void muon_update(floatX* params, float* master, const float* grads, float* momentum, int count, int rows,
                        int cols, float lr, float weight_decay, float mu, const float* grad_scale, uint32_t seed,
                        size_t index_offset, void* scratch, cudaStream_t stream) {
    if (count <= 0 || rows <= 0 || cols <= 0) return;
    size_t scratch_bytes = 0;
    const MuonScratch ws = muon_scratch_layout(scratch, count, rows, cols, &scratch_bytes);
    const size_t per = (size_t)rows * cols, n = per * count;
    with_pack_width<float>(pack_width<float>(n, grads, momentum, ws.x0), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        muon_momentum_kernel<P><<<chunked_grid_blocks(n / P, MUON_BLOCK), MUON_BLOCK, 0, stream>>>(
            ws.x0, momentum, grads, n, mu, grad_scale);
    });
    cudaCheck(cudaGetLastError());
    const int parts = muon_norm_parts(per);
    muon_norm_partial_kernel<<<dim3(parts, count), MUON_BLOCK, 0, stream>>>(ws.partials, ws.x0, per, parts);
    cudaCheck(cudaGetLastError());
    muon_normalize_kernel<<<dim3(parts, count), MUON_BLOCK, 0, stream>>>(ws.x0, ws.partials, per, parts, MUON_NS_EPS);
    cudaCheck(cudaGetLastError());
    const floatX* o = muon_newton_schulz(ws.x0, ws.x1, ws.a, ws.b, count, rows, cols, stream);
    const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    const float step = (float)((double)lr * std::sqrt(std::fmax(1.0, (double)rows / cols)));
    with_pack_width<float>(pack_width<float>(n, params, master, o), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        muon_apply_kernel<P><<<chunked_grid_blocks(n / P, MUON_BLOCK), MUON_BLOCK, 0, stream>>>(
            params, master, o, n, decay, step, grad_scale, seed, index_offset);
    });
    cudaCheck(cudaGetLastError());
}
