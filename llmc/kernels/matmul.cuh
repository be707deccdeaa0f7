// Linear layers through cuBLASLt, with the bias, GELU and bias-gradient work
// in cuBLASLt's epilogues where the library has an algorithm for them, and the
// hand-written kernels (gelu.cuh, the deterministic column sum below) elsewhere.
//
// Row-major shapes, PyTorch's Linear layout (weight is [out, in]):
//   forward   out(N, OC)   = inp(N, IC) @ weight(OC, IC)^T + bias(OC)
//   backward  dinp(N, IC)  = dout(N, OC) @ weight(OC, IC)          (overwritten)
//             dweight(OC, IC) += dout(N, OC)^T @ inp(N, IC)        (fp32, accumulated)
//             dbias(OC)       += sum over rows of dout(N, OC)      (fp32, accumulated)
// Weight gradients go straight into the persistent fp32 gradient buffer with
// beta = 1, so the A microbatches of one optimizer step add up there without
// any bf16 rounding of the running sum.
#pragma once
#include <cublasLt.h>

#include <map>
#include <optional>
#include <tuple>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/gelu.cuh"

// Errors throw llmc::Error, like cudaCheck.
inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        llmc::fail(std::string("cuBLASLt: ") + cublasLtGetStatusString(status) + " (" + file + ":" +
                   std::to_string(line) + ")");
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

constexpr size_t CUBLASLT_WORKSPACE_BYTES = 32 << 20;
static cublasLtHandle_t cublaslt_handle = nullptr;
static void* cublaslt_workspace = nullptr;

inline void matmul_setup() {
    if (cublaslt_handle) return;
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cudaCheck(cudaMalloc(&cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
}
inline void matmul_teardown() {
    if (!cublaslt_handle) return;
    cudaCheck(cudaFree(cublaslt_workspace));
    cublasCheck(cublasLtDestroy(cublaslt_handle));
    cublaslt_handle = nullptr;
}

constexpr cudaDataType_t FLOATX_CUDA_TYPE = sizeof(floatX) == 4 ? CUDA_R_32F : CUDA_R_16BF;

// The alignment cuBLASLt's preferences take for a pointer: the largest power of
// two up to 256 that divides its address (algorithms with wider loads need it).
inline uint32_t pointer_alignment(const void* p) {
    uint32_t alignment = 256;
    while (alignment > 1 && reinterpret_cast<uintptr_t>(p) % alignment) alignment /= 2;
    return alignment;
}

// What cuBLASLt does after the product (cublasLt.h's epilogues), column-major:
//   DEFAULT        D = T                  T = op(A) op(B) + beta D
//   BIAS           D = T + bias           bias: m, D's type
//   GELU_AUX_BIAS  aux = T + bias, D = gelu(aux)          aux: m x n floatX, ld m
//   DGELU          D = T * gelu'(aux)                      (aux: the forward's pre-GELU)
//   BGRADB         D = T, bias[j] = sum over k of op(B)[:, j]   (bias: n, D's type; overwritten)
struct Epilogue {
    cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    const void* aux = nullptr;
};

// cuBLASLt's first choice of algorithm for a matmul of these descriptors
// (C's layout is D's), within the workspace, for A, B, C and D aligned to
// aligns[0..3] bytes: its status, and found = 0 where it has none.
inline cublasStatus_t cublaslt_best_algorithm(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t layout_a,
                                              cublasLtMatrixLayout_t layout_b, cublasLtMatrixLayout_t layout_d,
                                              const uint32_t aligns[4], cublasLtMatmulHeuristicResult_t* heuristic,
                                              int* found) {
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, align_attrs[i], &aligns[i], sizeof(aligns[i])));
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, layout_a, layout_b, layout_d,
                                                                 layout_d, preference, 1, heuristic, found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    return status;
}

// Column-major D(m, n) = op(A)(m, k) @ op(B)(k, n) + beta * D, then the epilogue.
// A, B are floatX; D is floatX or fp32 (d_type); fp32 accumulation throughout.
// The algorithm is asked for once per shape, layout, epilogue and pointer
// alignments (the preferences say how aligned A, B, C and D are, so cuBLASLt
// may pick algorithms with 16-byte accesses; the bias and aux pointers' own
// alignment also counts) and reused. Returns false where the library has no
// algorithm for a fused epilogue (the caller then runs its own kernel); a
// plain or BIAS matmul it cannot do is an error.
inline bool matmul_cublaslt(void* d, cudaDataType_t d_type, const floatX* a, const floatX* b, int m, int n, int k,
                            bool trans_a, bool trans_b, float beta, Epilogue epilogue, cudaStream_t stream) {
    const uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_d = pointer_alignment(d);
    using Key = std::tuple<int, int, int, bool, bool, int, int, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
    static std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algorithms;  // nullopt: refused
    const Key key{m,
                  n,
                  k,
                  trans_a,
                  trans_b,
                  (int)epilogue.kind,
                  (int)d_type,
                  align_a,
                  align_b,
                  align_d,
                  epilogue.bias ? pointer_alignment(epilogue.bias) : 0,
                  epilogue.aux ? pointer_alignment(epilogue.aux) : 0};
    auto found_algo = algorithms.find(key);
    if (found_algo != algorithms.end() && !found_algo->second) return false;  // refused before: no descriptors
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.kind, sizeof(epilogue.kind)));
    if (epilogue.bias) {
        const int32_t bias_type = d_type;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias,
                                                   sizeof(epilogue.bias)));
        cublasCheck(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (epilogue.aux) {
        const int64_t aux_ld = m;
        const int32_t aux_type = FLOATX_CUDA_TYPE;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux,
                                                   sizeof(epilogue.aux)));
        cublasCheck(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                   sizeof(aux_type)));
    }
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasCheck(
        cublasLtMatrixLayoutCreate(&layout_a, FLOATX_CUDA_TYPE, trans_a ? k : m, trans_a ? m : k, trans_a ? k : m));
    cublasCheck(
        cublasLtMatrixLayoutCreate(&layout_b, FLOATX_CUDA_TYPE, trans_b ? n : k, trans_b ? k : n, trans_b ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, d_type, m, n, m));

    if (found_algo == algorithms.end()) {
        const uint32_t aligns[4] = {align_a, align_b, align_d, align_d};  // C is D (in place)
        cublasLtMatmulHeuristicResult_t heuristic;
        int found = 0;
        const cublasStatus_t status =
            cublaslt_best_algorithm(desc, layout_a, layout_b, layout_d, aligns, &heuristic, &found);
        const bool fused = epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT && epilogue.kind != CUBLASLT_EPILOGUE_BIAS;
        if (!fused) cublasCheck(status);
        if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
            found_algo = algorithms.emplace(key, heuristic.algo).first;
        } else if (fused) {
            printf("note: cuBLASLt has no algorithm for epilogue %d at m=%d n=%d k=%d (%s); a kernel does that part\n",
                   (int)epilogue.kind, m, n, k, cublasLtGetStatusString(status));
            found_algo = algorithms.emplace(key, std::nullopt).first;
        } else {
            llmc::fail("cuBLASLt: no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k));
        }
    }
    if (found_algo->second) {
        const float alpha = 1.0f;
        cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, d, layout_d, d,
                                   layout_d, &*found_algo->second, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES,
                                   stream));
    }
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return found_algo->second.has_value();
}

// ---------------------------------------------------------------------------
// Bias gradient, stage 1: block (bx, by) sums rows [by*rows_per_chunk, ...) of
// 32 N-column packs (N = 8 bf16: 16-byte loads; 1 where OC or the pointer does
// not allow them). Thread (tx, ty) adds rows ty, ty+8, ... of its pack, then
// the 8 partial sums are added in ty order: a fixed order (the same for any
// N), so the result is bitwise reproducible (no atomics).
constexpr int BIAS_COLS = 32, BIAS_ROW_THREADS = 8, BIAS_MAX_CHUNKS = 64;

template <int N>
__global__ void bias_backward_partial_kernel(float* partials, const floatX* dout, int rows, int OC,
                                             int rows_per_chunk) {
    __shared__ float sums[BIAS_ROW_THREADS][BIAS_COLS * N];
    const int col = (blockIdx.x * BIAS_COLS + threadIdx.x) * N;
    const int row_begin = blockIdx.y * rows_per_chunk;
    const int row_end = min(rows, row_begin + rows_per_chunk);
    float sum[N] = {};
    if (col < OC)
        for (int row = row_begin + threadIdx.y; row < row_end; row += BIAS_ROW_THREADS) {
            const Packed<floatX, N> d = load_packed<N>(dout + (size_t)row * OC + col);
#pragma unroll
            for (int e = 0; e < N; e++) sum[e] += to_float(d.v[e]);
        }
#pragma unroll
    for (int e = 0; e < N; e++) sums[threadIdx.y][threadIdx.x * N + e] = sum[e];
    __syncthreads();
    if (threadIdx.y == 0 && col < OC)
#pragma unroll
        for (int e = 0; e < N; e++) {
            float total = 0.0f;
            for (int i = 0; i < BIAS_ROW_THREADS; i++) total += sums[i][threadIdx.x * N + e];
            partials[(size_t)blockIdx.y * OC + col + e] = total;
        }
}

// Stage 2: dbias[c] += sum of the chunk partials of column c, in chunk order.
__global__ void bias_backward_final_kernel(float* dbias, const float* partials, int num_chunks, int OC) {
    for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < OC; col += gridDim.x * blockDim.x) {
        float total = 0.0f;
        for (int chunk = 0; chunk < num_chunks; chunk++) total += partials[(size_t)chunk * OC + col];
        dbias[col] += total;
    }
}

inline size_t bias_backward_scratch_floats(int OC) { return (size_t)BIAS_MAX_CHUNKS * OC; }

inline void bias_backward(float* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    // Chunks of at least 256 rows (32 per thread); at most BIAS_MAX_CHUNKS partials per column.
    const int num_chunks = min(BIAS_MAX_CHUNKS, max(1, N / 256));
    const int rows_per_chunk = CEIL_DIV(N, num_chunks);
    const dim3 block(BIAS_COLS, BIAS_ROW_THREADS);
    with_pack_width<floatX>(pack_width<floatX>(OC, dout), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        bias_backward_partial_kernel<P>
            <<<dim3(CEIL_DIV(OC, BIAS_COLS * P), num_chunks), block, 0, stream>>>(scratch, dout, N, OC, rows_per_chunk);
    });
    cudaCheck(cudaGetLastError());
    bias_backward_final_kernel<<<CEIL_DIV(OC, 256), 256, 0, stream>>>(dbias, scratch, num_chunks, OC);
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// The Linear passes, in row-major terms (see the top of the file). A
// row-major (R, C) matrix is a column-major (C, R) one, so
// out^T = weight^T-as-stored @ inp^T becomes D(OC, N) = A^T(OC, IC) B(IC, N).
inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int IC,
                           int OC, cudaStream_t stream) {
    const Epilogue epilogue{bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias};
    matmul_cublaslt(out, FLOATX_CUDA_TYPE, weight, inp, OC, N, IC, true, false, 0.0f, epilogue, stream);
}

// A Linear followed by GELU: pre_gelu = inp @ weight^T + bias (kept for the
// backward), out = gelu(pre_gelu). fuse_gelu: one matmul writes both
// (GELU_AUX_BIAS); otherwise, or where cuBLASLt has no such algorithm, the
// matmul and then gelu_forward. cuBLASLt's GELU is its own code: the two paths
// agree to bf16 rounding, not bitwise.
inline void matmul_forward_gelu(floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                                const floatX* bias, int N, int IC, int OC, bool fuse_gelu, cudaStream_t stream) {
    const Epilogue epilogue{CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu};
    if (fuse_gelu &&
        matmul_cublaslt(out, FLOATX_CUDA_TYPE, weight, inp, OC, N, IC, true, false, 0.0f, epilogue, stream))
        return;
    matmul_forward(pre_gelu, inp, weight, bias, N, IC, OC, stream);
    gelu_forward(out, pre_gelu, (size_t)N * OC, stream);
}

// The weight half of the backward: dweight += dout^T @ inp, and dbias (may be
// null) += the sum of dout over the N rows. That sum comes from the dweight
// matmul, which reads dout anyway, where cuBLASLt takes BGRADB: into scratch,
// then added (BGRADB overwrites; the gradient buffer accumulates). Elsewhere
// bias_backward makes its own pass over dout.
inline void matmul_backward_weights(float* dweight, float* dbias, float* scratch, const floatX* dout, const floatX* inp,
                                    int N, int IC, int OC, cudaStream_t stream) {
    const Epilogue bgradb{CUBLASLT_EPILOGUE_BGRADB, scratch};
    if (dbias && matmul_cublaslt(dweight, CUDA_R_32F, inp, dout, IC, OC, N, false, true, 1.0f, bgradb, stream)) {
        bias_backward_final_kernel<<<CEIL_DIV(OC, 256), 256, 0, stream>>>(dbias, scratch, 1, OC);  // dbias += scratch
        cudaCheck(cudaGetLastError());
        return;
    }
    matmul_cublaslt(dweight, CUDA_R_32F, inp, dout, IC, OC, N, false, true, 1.0f, Epilogue{}, stream);
    if (dbias) bias_backward(dbias, scratch, dout, N, OC, stream);
}

// dinp may be null (nothing upstream needs it); dbias may be null (no bias).
inline void matmul_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int N, int IC, int OC, cudaStream_t stream) {
    if (dinp) matmul_cublaslt(dinp, FLOATX_CUDA_TYPE, weight, dout, IC, N, OC, false, false, 0.0f, Epilogue{}, stream);
    matmul_backward_weights(dweight, dbias, scratch, dout, inp, N, IC, OC, stream);
}

// The backward of a Linear whose input was inp = gelu(pre_gelu): dinp is the
// gradient w.r.t. pre_gelu, (dout @ weight) * gelu'(pre_gelu). fuse_gelu: in
// the matmul (DGELU); otherwise, or where cuBLASLt has no such algorithm, the
// matmul and then gelu_backward_inplace.
inline void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                                 const floatX* inp, const floatX* pre_gelu, const floatX* weight, int N, int IC, int OC,
                                 bool fuse_gelu, cudaStream_t stream) {
    const Epilogue dgelu{CUBLASLT_EPILOGUE_DGELU, nullptr, pre_gelu};
    if (!fuse_gelu ||
        !matmul_cublaslt(dinp, FLOATX_CUDA_TYPE, weight, dout, IC, N, OC, false, false, 0.0f, dgelu, stream)) {
        matmul_cublaslt(dinp, FLOATX_CUDA_TYPE, weight, dout, IC, N, OC, false, false, 0.0f, Epilogue{}, stream);
        gelu_backward_inplace(dinp, pre_gelu, (size_t)N * IC, stream);
    }
    matmul_backward_weights(dweight, dbias, scratch, dout, inp, N, IC, OC, stream);
}
