// cuBLASLt on the CPU: the subset of the real cuBLASLt C API (declared in the
// toolkit's <cublasLt.h>, used unchanged) that llm.c-style trainers need,
// computed with OpenBLAS on host memory. In this runtime cudaMalloc returns
// host pointers; a matmul is stream work like a kernel (internal.h).
//
// The math (column-major, like cuBLASLt), per batch:
//   T = alpha * op(A) * op(B) + beta * C        op(A): m x k, op(B): k x n, C, D: m x n
//   D = epilogue(T)
// with the epilogues
//   DEFAULT        D = T
//   BIAS           D = T + bias                  (bias: length m, added to every column)
//   GELU           D = gelu(T)
//   GELU_BIAS      D = gelu(T + bias)
//   GELU_AUX       aux = T,        D = gelu(T)
//   GELU_AUX_BIAS  aux = T + bias, D = gelu(T + bias)
//   DGELU          D = T * gelu'(aux)            (aux: the pre-activation of the forward pass)
//   BGRADB         D = T, and bias[j] = sum_l op(B)[l][j], j < n (the sum over the k dimension)
// where gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation.
// beta == 0 never reads C (C may hold garbage or NaN); C may alias D.
// The product is accumulated in fp32 (cblas_sgemm); bf16 inputs are converted
// exactly to fp32 first, or, on a CPU with bf16 instructions, multiplied as
// they are by oneDNN (bf16_matmul.cpp); outputs are rounded once with
// __float2bfloat16 (round to nearest even, as on the device).
//
// Choices taken from the cuBLASLt documentation (the comments in cublasLt.h of
// CUDA 13 and the cuBLAS guide):
//  - BIAS_DATA_TYPE default: "Bias vector elements are the same type as the
//    elements of output matrix (Dtype)" (the exceptions are IMMA/int8 and fp8
//    kernels, which are not supported here). The bias gradient of BGRADB is
//    "the same type as the output elements". So the default is D's type; an
//    explicit CUDA_R_32F or CUDA_R_16BF is also accepted.
//  - EPILOGUE_AUX_DATA_TYPE default: the type of D ("GELU input matrix elements
//    type is the same as the type of elements of the output matrix", the
//    exceptions being fp8). An explicit CUDA_R_32F or CUDA_R_16BF is accepted.
//  - BGRADB: "Bias gradient based on the input matrix B. The bias size
//    corresponds to the number of columns of the matrix D. The reduction happens
//    over the GEMM's k dimension." It is an output: the vector is overwritten,
//    not accumulated, and it is not scaled by alpha (it is the plain sum of op(B)).
//  - GELU: the docs only say "x := GELU(x)". We use the tanh approximation, the
//    form cuBLASLt's GELU epilogues are used for in llm.c and Transformer Engine;
//    gelu' is its exact derivative.
//  - DGELU is applied to the full result alpha*op(A)op(B) + beta*C.
//  - EPILOGUE_AUX_LD must be >= m and a multiple of 8 (as documented), else
//    CUBLAS_STATUS_INVALID_VALUE.
//
// Supported subset (anything else is CUBLAS_STATUS_NOT_SUPPORTED, never a guess):
//  - A, B: both CUDA_R_32F or both CUDA_R_16BF; C, D: the same type as each other;
//    32F inputs need 32F C/D, 16BF inputs allow 16BF or 32F C/D.
//  - compute type CUBLAS_COMPUTE_32F (also _PEDANTIC, _FAST_TF32, _FAST_16BF,
//    _FAST_16F, all computed in full fp32); scale type CUDA_R_32F; alpha and
//    beta are host floats (CUBLASLT_POINTER_MODE_HOST).
//  - TRANSA/TRANSB CUBLAS_OP_N or CUBLAS_OP_T; TRANSC N; fill mode FULL.
//  - layouts: CUBLASLT_ORDER_COL, strided batches (BATCH_COUNT equal for A, B,
//    C and D; STRIDED_BATCH_OFFSET per layout, in elements, may be 0), no planar
//    complex, no pointer-array batches.
//  - epilogues listed above, only with batch count 1.
//  - the scale/amax pointers, scale modes, fp8 fast accumulation and emulation
//    descriptor attributes are accepted only at their defaults (NULL / 0).
// Dimension mismatches between the layouts and the ops, or ld < rows, give
// CUBLAS_STATUS_INVALID_VALUE. Unknown attributes give CUBLAS_STATUS_NOT_SUPPORTED.
// cublasLtMatmulAlgoGetHeuristic returns one algorithm (workspace 0) for a
// supported problem, and the status above with 0 results otherwise.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "cpucuda.h"
#include "cpucuda_ptx.h"
#include "internal.h"

// The epilogue's loops (finish_block) are compiled twice, for the build's
// target and for AVX2 (AVX2_CODE), and run as AVX2 where the CPU has it: the
// same operations, 8 floats to a register. Not FMA: nothing is fused, so both
// give the same bits (cpucuda::set_matmul_vector_code switches to the portable
// copy for the tests that compare them).
#if defined(__x86_64__) && defined(__GNUC__)
#define CPUCUDA_MATMUL_AVX2 1
#define AVX2_CODE __attribute__((target("avx2")))
#endif

// The handle type is a pointer to this (declared, not defined, by cublasLt.h).
struct cublasLtContext {
    uint64_t magic;
};

namespace {

constexpr uint64_t kHandleMagic = 0x63707543624c7448ull;  // "HtLbCupc"
constexpr uint32_t kLayoutMagic = 0x4c61796fu;
constexpr uint32_t kDescMagic = 0x44657363u;
constexpr uint32_t kPrefMagic = 0x50726566u;
constexpr uint64_t kAlgoMagic = 0x416c676f43505521ull;

// ---------------------------------------------------------------------------
// Descriptor state, kept inside the opaque structs' data[] arrays (constructed
// there with placement new, so the *Init_internal variants work on storage the
// caller owns and need no destroy).

struct LayoutState {
    uint32_t magic;
    uint32_t type;         // cudaDataType
    int32_t order;         // cublasLtOrder_t
    int32_t batch_count;
    uint32_t batch_mode;   // cublasLtBatchMode_t
    uint64_t rows;
    uint64_t cols;
    int64_t ld;
    int64_t batch_stride;  // elements
    int64_t plane_offset;  // bytes; 0 = not planar complex
};
static_assert(sizeof(LayoutState) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout state too big");

struct DescState {
    uint32_t magic;
    int32_t compute_type;  // cublasComputeType_t
    int32_t scale_type;    // cudaDataType
    int32_t pointer_mode;
    int32_t transa, transb, transc;
    int32_t fill_mode;
    uint32_t epilogue;
    int32_t bias_type;     // -1: D's type
    int32_t aux_type;      // -1: D's type
    int32_t sm_count_target;
    int32_t scale_modes[6];  // A, B, C, D, AUX, D_OUT scale modes
    int8_t fast_accum;
    const void* bias;      // bias input, or bias-gradient output for BGRADB
    void* aux;
    int64_t bias_batch_stride;
    int64_t aux_ld;
    int64_t aux_batch_stride;
    int64_t alpha_vector_batch_stride;
    // Attributes supported only at their default NULL.
    const void* a_scale;
    const void* b_scale;
    const void* c_scale;
    const void* d_scale;
    void* amax_d;
    void* aux_scale;
    void* aux_amax;
    void* d_out_scale;
    cublasLtEmulationDesc_t emulation;
};
static_assert(sizeof(DescState) <= sizeof(cublasLtMatmulDescOpaque_t), "matmul desc state too big");

struct PrefState {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t min_align[4];  // A, B, C, D
    float max_waves;
    uint64_t impl_mask;
};
static_assert(sizeof(PrefState) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference state too big");

template <class State, class Opaque>
State* state_of(Opaque* p, uint32_t magic) {
    if (p == nullptr) return nullptr;
    State* s = reinterpret_cast<State*>(p->data);
    return s->magic == magic ? s : nullptr;
}
LayoutState* layout_of(cublasLtMatrixLayout_t p) { return state_of<LayoutState>(p, kLayoutMagic); }
DescState* desc_of(cublasLtMatmulDesc_t p) { return state_of<DescState>(p, kDescMagic); }
PrefState* pref_of(cublasLtMatmulPreference_t p) { return state_of<PrefState>(p, kPrefMagic); }

void init_layout(cublasLtMatrixLayoutOpaque_t* p, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    memset(p->data, 0, sizeof(p->data));
    LayoutState* s = new (p->data) LayoutState{};
    s->magic = kLayoutMagic;
    s->type = (uint32_t)type;
    s->order = CUBLASLT_ORDER_COL;
    s->batch_count = 1;
    s->batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
    s->rows = rows;
    s->cols = cols;
    s->ld = ld;
}

void init_desc(cublasLtMatmulDescOpaque_t* p, cublasComputeType_t compute, cudaDataType_t scale) {
    memset(p->data, 0, sizeof(p->data));
    DescState* s = new (p->data) DescState{};
    s->magic = kDescMagic;
    s->compute_type = compute;
    s->scale_type = scale;
    s->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    s->transa = s->transb = s->transc = CUBLAS_OP_N;
    s->fill_mode = CUBLAS_FILL_MODE_FULL;
    s->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    s->bias_type = -1;
    s->aux_type = -1;
}

void init_pref(cublasLtMatmulPreferenceOpaque_t* p) {
    memset(p->data, 0, sizeof(p->data));
    PrefState* s = new (p->data) PrefState{};
    s->magic = kPrefMagic;
    s->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    s->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (uint32_t& a : s->min_align) a = 256;
    s->impl_mask = ~0ull;
}

// ---------------------------------------------------------------------------
// Attribute get/set: every attribute maps to one field of the state; set and
// get copy exactly the field's size (the documented type of the attribute).

struct Field {
    void* ptr;
    size_t size;
};
template <class T>
Field field(T& x) {
    return Field{&x, sizeof(T)};
}

Field layout_field(LayoutState& s, cublasLtMatrixLayoutAttribute_t attr) {
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_TYPE: return field(s.type);
        case CUBLASLT_MATRIX_LAYOUT_ORDER: return field(s.order);
        case CUBLASLT_MATRIX_LAYOUT_ROWS: return field(s.rows);
        case CUBLASLT_MATRIX_LAYOUT_COLS: return field(s.cols);
        case CUBLASLT_MATRIX_LAYOUT_LD: return field(s.ld);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return field(s.batch_count);
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return field(s.batch_stride);
        case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return field(s.plane_offset);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return field(s.batch_mode);
        default: return Field{nullptr, 0};
    }
}

Field desc_field(DescState& s, cublasLtMatmulDescAttributes_t attr) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return field(s.compute_type);
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return field(s.scale_type);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return field(s.pointer_mode);
        case CUBLASLT_MATMUL_DESC_TRANSA: return field(s.transa);
        case CUBLASLT_MATMUL_DESC_TRANSB: return field(s.transb);
        case CUBLASLT_MATMUL_DESC_TRANSC: return field(s.transc);
        case CUBLASLT_MATMUL_DESC_FILL_MODE: return field(s.fill_mode);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return field(s.epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return field(s.bias);
        case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return field(s.bias_batch_stride);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return field(s.aux);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return field(s.aux_ld);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return field(s.aux_batch_stride);
        case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE: return field(s.alpha_vector_batch_stride);
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: return field(s.sm_count_target);
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return field(s.a_scale);
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return field(s.b_scale);
        case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return field(s.c_scale);
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return field(s.d_scale);
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return field(s.amax_d);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return field(s.aux_type);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER: return field(s.aux_scale);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER: return field(s.aux_amax);
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return field(s.fast_accum);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return field(s.bias_type);
        case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return field(s.scale_modes[0]);
        case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return field(s.scale_modes[1]);
        case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return field(s.scale_modes[2]);
        case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return field(s.scale_modes[3]);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE: return field(s.scale_modes[4]);
        case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER: return field(s.d_out_scale);
        case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE: return field(s.scale_modes[5]);
        case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR: return field(s.emulation);
        default: return Field{nullptr, 0};
    }
}

// All preference attributes are hints the CPU can ignore, so any value is accepted.
Field pref_field(PrefState& s, cublasLtMatmulPreferenceAttributes_t attr) {
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return field(s.search_mode);
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return field(s.max_workspace);
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return field(s.reduction_mask);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return field(s.min_align[0]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return field(s.min_align[1]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return field(s.min_align[2]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return field(s.min_align[3]);
        case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return field(s.max_waves);
        case CUBLASLT_MATMUL_PREF_IMPL_MASK: return field(s.impl_mask);
        default: return Field{nullptr, 0};
    }
}

cublasStatus_t set_field(Field f, const void* buf, size_t size) {
    if (f.ptr == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;  // unknown attribute
    if (buf == nullptr || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(f.ptr, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// Semantics of the *GetAttribute functions: sizeInBytes 0 asks for the size.
cublasStatus_t get_field(Field f, void* buf, size_t size, size_t* written) {
    if (f.ptr == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (size == 0) {
        if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
        *written = f.size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == nullptr || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, f.ptr, size);
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------
// Validation: turns descriptors into a Plan, or says why it cannot.

enum EpilogueBits : unsigned {
    kHasBias = 1,  // reads bias[m]
    kGelu = 2,     // D = gelu(pre)
    kAuxOut = 4,   // aux = pre
    kDGelu = 8,    // D = pre * gelu'(aux)
    kBGradB = 16,  // bias[n] = column sums of op(B)
};

// Returns the bit set of a supported epilogue, or -1.
int epilogue_bits(uint32_t epilogue) {
    switch (epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT: return 0;
        case CUBLASLT_EPILOGUE_BIAS: return kHasBias;
        case CUBLASLT_EPILOGUE_GELU: return kGelu;
        case CUBLASLT_EPILOGUE_GELU_BIAS: return kGelu | kHasBias;
        case CUBLASLT_EPILOGUE_GELU_AUX: return kGelu | kAuxOut;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return kGelu | kAuxOut | kHasBias;
        case CUBLASLT_EPILOGUE_DGELU: return kDGelu;
        case CUBLASLT_EPILOGUE_BGRADB: return kBGradB;
        default: return -1;
    }
}

bool is_f32_or_bf16(int64_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

struct Plan {
    int m, n, k;
    int batch;
    bool transa, transb;
    cudaDataType_t ab_type, cd_type, bias_type, aux_type;
    int64_t lda, ldb, ldc, ldd, ld_aux;
    int64_t stride_a, stride_b, stride_c, stride_d;  // elements
    unsigned epi;                                    // EpilogueBits
};

bool compute_type_ok(int32_t ct) {
    return ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC || ct == CUBLAS_COMPUTE_32F_FAST_TF32 ||
           ct == CUBLAS_COMPUTE_32F_FAST_16BF || ct == CUBLAS_COMPUTE_32F_FAST_16F;
}

// Settings of the descriptor that the CPU path does not implement.
cublasStatus_t check_desc_supported(const DescState& d) {
    if (!compute_type_ok(d.compute_type) || d.scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
    bool trans_ok = (d.transa == CUBLAS_OP_N || d.transa == CUBLAS_OP_T) &&
                    (d.transb == CUBLAS_OP_N || d.transb == CUBLAS_OP_T) && d.transc == CUBLAS_OP_N;
    if (!trans_ok || d.fill_mode != CUBLAS_FILL_MODE_FULL) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (epilogue_bits(d.epilogue) < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    bool defaults = d.a_scale == nullptr && d.b_scale == nullptr && d.c_scale == nullptr && d.d_scale == nullptr &&
                    d.amax_d == nullptr && d.aux_scale == nullptr && d.aux_amax == nullptr &&
                    d.d_out_scale == nullptr && d.emulation == nullptr && d.fast_accum == 0 &&
                    d.alpha_vector_batch_stride == 0;
    for (int32_t mode : d.scale_modes) defaults = defaults && mode == 0;
    return defaults ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t check_layout_supported(const LayoutState& l) {
    if (l.order != CUBLASLT_ORDER_COL || l.plane_offset != 0 || l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return is_f32_or_bf16(l.type) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

// The shape of a layout must fit BLAS ints, and ld must cover the rows.
cublasStatus_t check_layout_shape(const LayoutState& l) {
    if (l.rows > (uint64_t)INT_MAX || l.cols > (uint64_t)INT_MAX || l.ld > (int64_t)INT_MAX)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.ld < 1 || l.ld < (int64_t)l.rows || l.batch_count < 1) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t make_plan(const DescState* d, const LayoutState* a, const LayoutState* b, const LayoutState* c,
                         const LayoutState* dl, Plan* p) {
    if (!d || !a || !b || !c || !dl) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = check_desc_supported(*d);
    for (const LayoutState* l : {a, b, c, dl})
        if (st == CUBLAS_STATUS_SUCCESS) st = check_layout_supported(*l);
    if (st != CUBLAS_STATUS_SUCCESS) return st;

    // Types: A == B, C == D; fp32 inputs need fp32 outputs.
    if (a->type != b->type || c->type != dl->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type == CUDA_R_32F && dl->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;

    for (const LayoutState* l : {a, b, c, dl})
        if ((st = check_layout_shape(*l)) != CUBLAS_STATUS_SUCCESS) return st;

    // Shapes: op(A) m x k, op(B) k x n, C and D m x n.
    p->transa = d->transa == CUBLAS_OP_T;
    p->transb = d->transb == CUBLAS_OP_T;
    uint64_t m = dl->rows, n = dl->cols;
    uint64_t k = p->transa ? a->rows : a->cols;
    uint64_t a_m = p->transa ? a->cols : a->rows;
    uint64_t b_k = p->transb ? b->cols : b->rows;
    uint64_t b_n = p->transb ? b->rows : b->cols;
    if (a_m != m || b_k != k || b_n != n || c->rows != m || c->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    p->m = (int)m;
    p->n = (int)n;
    p->k = (int)k;

    // Strided batches: the same count everywhere.
    p->batch = dl->batch_count;
    if (a->batch_count != p->batch || b->batch_count != p->batch || c->batch_count != p->batch)
        return CUBLAS_STATUS_INVALID_VALUE;

    p->ab_type = (cudaDataType_t)a->type;
    p->cd_type = (cudaDataType_t)dl->type;
    p->lda = a->ld;
    p->ldb = b->ld;
    p->ldc = c->ld;
    p->ldd = dl->ld;
    p->stride_a = a->batch_stride;
    p->stride_b = b->batch_stride;
    p->stride_c = c->batch_stride;
    p->stride_d = dl->batch_stride;

    // Epilogue: only unbatched; bias/aux types default to D's type.
    p->epi = (unsigned)epilogue_bits(d->epilogue);
    if (p->epi != 0 && p->batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->bias_type = d->bias_type == -1 ? p->cd_type : (cudaDataType_t)d->bias_type;
    p->aux_type = d->aux_type == -1 ? p->cd_type : (cudaDataType_t)d->aux_type;
    if ((p->epi & (kHasBias | kBGradB)) && !is_f32_or_bf16(p->bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->ld_aux = d->aux_ld;
    if (p->epi & (kAuxOut | kDGelu)) {
        if (!is_f32_or_bf16(p->aux_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (p->ld_aux < (int64_t)m || p->ld_aux < 1 || p->ld_aux % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------
// Compute.
//
// A matmul runs on the runtime's worker pool (cpucuda::parallel_for), one
// batch entry at a time. The product is split along the larger of m and n
// into slices (about two per worker), each one task: it widens its slice of
// the split operand (bf16 only; rows of op(A) or columns of op(B), all of k)
// into a per-worker fp32 copy, runs one single-threaded cblas_sgemm over the
// whole k, and applies the epilogue to its block of the result (a per-worker
// fp32 scratch) while it is still in cache. The other operand is widened once
// beforehand, in column ranges on the pool. An fp32 D with no element-wise
// epilogue is written by sgemm itself. The bias gradient of BGRADB is a
// separate pass, split over columns. OpenBLAS's own threads are switched off
// (openblas_set_num_threads(1)): they spin for a long time after each call
// (sched_yield), taking the cores from the kernels that follow.
// On a CPU with bf16 instructions, bf16 operands skip the widening: each slice
// task runs oneDNN's bf16 matmul on its rows or columns of the stored operands
// into the scratch (native_block_product), and finish_block adds beta * C.
// Bits: the split never cuts k, so each element is one dot product over the
// whole k; but OpenBLAS blocks each call's rows and columns itself and rounds
// an element differently depending on where the call's range ends, so the
// slices (a function of the shape and the number of workers only) are the
// same whatever the operands' type, and bf16 operands give bitwise the fp32
// result of their widened values (test_cublaslt checks it; the native bf16
// products sum in oneDNN's order instead, the same bits on every run). Cutting a slice
// into cache-sized sgemm calls would change the bits, which is why it is not.

// bf16 <-> fp32, exactly as the toolkit's host code (__bfloat162float,
// __float2bfloat16): widening is the bits shifted up; narrowing is
// cpucuda::float_to_bf16_bits (cpucuda_ptx.h, the kernels' cvt.rn.bf16.f32).
// Integer forms the compiler vectorises.
inline float bf16_bits_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
using cpucuda::float_to_bf16_bits;

// Whole arrays of them, dst[i] = f(src[i]), 8 at a time through fixed-size
// arrays: gcc -O2 makes vector code of such a block (it leaves a loop of
// unknown length scalar).
constexpr int kConvertBlock = 8;
template <class In, class Out, class F>
inline void convert_array(const In* src, Out* dst, int64_t n, F f) {
    int64_t i = 0;
    for (; i + kConvertBlock <= n; i += kConvertBlock) {
        In in[kConvertBlock];
        Out out[kConvertBlock];
        memcpy(in, src + i, sizeof(in));
        for (int e = 0; e < kConvertBlock; e++) out[e] = f(in[e]);
        memcpy(dst + i, out, sizeof(out));
    }
    for (; i < n; i++) dst[i] = f(src[i]);
}
inline void widen_bf16(const uint16_t* src, float* dst, int64_t n) { convert_array(src, dst, n, bf16_bits_to_float); }
inline void narrow_bf16(const float* src, uint16_t* dst, int64_t n) { convert_array(src, dst, n, float_to_bf16_bits); }

inline float load(const void* p, cudaDataType_t t, int64_t i) {
    if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
    return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
}

inline void store(void* p, cudaDataType_t t, int64_t i, float v) {
    if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
    else static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v);
}

const void* offset(const void* p, cudaDataType_t t, int64_t elements) {
    return static_cast<const char*>(p) + elements * (int64_t)type_size(t);
}

// The GELU epilogues, 8 values at a time in gcc's vector types (two SSE2
// registers on the build's target, one AVX2 register in finish_block_avx2;
// libm's tanhf is a call per element, and the epilogues of one step's
// fc matmuls evaluate 19 M of them). tanh from exp:
//   tanh(u) = sign(u) (1 - e) / (1 + e),  e = exp(-2|u|)
//   exp(y) = 2^n exp(r),  n = round(y / ln 2),  r = y - n ln 2 (|r| <= ln 2 / 2),
// exp(r) by its Taylor series to r^7 (relative error under 1e-8 there). |u| is
// capped at 40, where e is 1.8e-35, still a normal float, and the quotient
// rounds to 1 as tanhf does. The result is within 3e-7 of tanh (absolute; a
// GELU adds it to 1); NaN stays NaN. Each lane is the same IEEE operations in
// the same order, so the bits do not depend on a value's place in a column.
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));
// Always inlined, into each copy of finish_block, which then evaluates them
// with its own instructions: no vector crosses a call, so gcc's warning that
// returning one by value has an ABI that depends on AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#define VECTOR_INLINE inline __attribute__((always_inline))

VECTOR_INLINE Floats8 tanh8(const Floats8& u) {
    constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, kept in the low bits
    Floats8 a = (Floats8)((Ints8)u & 0x7fffffff);
    a = a < 40.0f ? a : 40.0f;
    const Floats8 y = -2.0f * a;
    const Floats8 shifted = y * kLog2e + kRound;
    const Floats8 n = shifted - kRound;
    const Floats8 r = (y - n * kLn2Hi) - n * kLn2Lo;
    Floats8 p = r * (1.0f / 5040) + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const Floats8 scale = (Floats8)(((Ints8)shifted - 0x4b400000 + 127) << 23);  // 2^n
    const Floats8 e = p * scale;
    const Floats8 t = (1.0f - e) / (1.0f + e);
    const Floats8 signed_t = u < 0.0f ? -t : t;
    return u != u ? u : signed_t;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

VECTOR_INLINE Floats8 gelu8(const Floats8& x) {
    const Floats8 u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    return 0.5f * x * (1.0f + tanh8(u));
}

// d/dx of the tanh-approximated gelu.
VECTOR_INLINE Floats8 gelu_grad8(const Floats8& x) {
    const Floats8 u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    const Floats8 t = tanh8(u);
    const Floats8 sech2 = 1.0f - t * t;
    const Floats8 du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    const Floats8 g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * du;
    return sech2 == 0.0f ? 0.5f * (1.0f + t) : g;  // |x| large: avoids 0 * inf when x^2 overflows
}

// Splits [0, n) into `parts` ranges whose inner boundaries are multiples of `align`.
inline void split_range(int64_t n, int parts, int part, int64_t align, int64_t* begin, int64_t* end) {
    auto at = [&](int q) {
        if (q >= parts) return n;
        int64_t b = (n * q / parts + align - 1) / align * align;
        return b < n ? b : n;
    };
    *begin = at(part);
    *end = at(part + 1);
}

// Enough work per task that waking a worker pays off.
inline int tasks_for(double work, double per_task_min) {
    int w = cpucuda::worker_count();
    int t = (int)std::min<double>(w, std::max(1.0, work / per_task_min));
    return std::max(1, t);
}

// Widens columns [c0, c1) of rows [r0, r0 + rows) of a stored bf16 matrix into dst (compact, ld = rows).
void widen_block(const uint16_t* src, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t c1, float* dst) {
    for (int64_t j = c0; j < c1; j++) widen_bf16(src + j * ld + r0, dst + (j - c0) * rows, rows);
}

// An fp32 view of the block rows [r0, r1) x columns [c0, c1) of a stored matrix: the data itself when it is
// fp32, else a compact (ld = r1 - r0) widened copy in `scratch`, made by the calling thread.
const float* f32_block(const void* p, cudaDataType_t t, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                       std::vector<float>& scratch, int64_t* ld_out) {
    if (t == CUDA_R_32F) {
        *ld_out = ld;
        return static_cast<const float*>(p) + c0 * ld + r0;
    }
    const size_t total = (size_t)((r1 - r0) * (c1 - c0));
    if (scratch.size() < total) scratch.resize(total);
    widen_block(static_cast<const uint16_t*>(p), ld, r0, r1 - r0, c0, c1, scratch.data());
    *ld_out = r1 - r0;
    return scratch.data();
}

// The same for a whole stored rows x cols matrix, widened in column ranges on the worker pool.
const float* f32_whole(const void* p, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                       std::vector<float>& scratch, int64_t* ld_out) {
    if (t == CUDA_R_32F) return f32_block(p, t, ld, 0, rows, 0, cols, scratch, ld_out);
    const size_t total = (size_t)(rows * cols);
    if (scratch.size() < total) scratch.resize(total);
    const int tasks = tasks_for((double)total, 1 << 18);
    cpucuda::parallel_for(tasks, [&](int task) {
        int64_t j0, j1;
        split_range(cols, tasks, task, 1, &j0, &j1);
        widen_block(static_cast<const uint16_t*>(p), ld, 0, rows, j0, j1, scratch.data() + j0 * rows);
    });
    *ld_out = rows;
    return scratch.data();
}

// Rows [i0, i1) of op(A) (all of k), and columns [j0, j1) of op(B), as fp32.
const float* op_a_rows(const Plan& p, const void* A, int64_t i0, int64_t i1, std::vector<float>& scratch, int64_t* ld) {
    return p.transa ? f32_block(A, p.ab_type, p.lda, 0, p.k, i0, i1, scratch, ld)
                    : f32_block(A, p.ab_type, p.lda, i0, i1, 0, p.k, scratch, ld);
}
const float* op_b_cols(const Plan& p, const void* B, int64_t j0, int64_t j1, std::vector<float>& scratch, int64_t* ld) {
    return p.transb ? f32_block(B, p.ab_type, p.ldb, j0, j1, 0, p.k, scratch, ld)
                    : f32_block(B, p.ab_type, p.ldb, 0, p.k, j0, j1, scratch, ld);
}

// How a product is cut (see "Compute." above): along the larger of m and n into slices.
struct Split {
    bool along_m;
    int64_t align;  // inner slice boundaries are multiples of it
    int slices;
};

Split split_for(const Plan& p) {
    Split s;
    s.along_m = p.m >= p.n;
    s.align = s.along_m ? 64 : 16;
    // Two slices per worker, taken as workers come free (a core that is busy
    // elsewhere delays a slice, not half the product), but slices big enough
    // that re-packing the other operand for each stays cheap. A count that
    // the workers do not divide leaves some of them idle for the last slice
    // (3 slices on 2 workers take as long as 4), so it is rounded down to a
    // multiple of the workers.
    const double flops = 2.0 * p.m * p.n * p.k;
    const int workers = cpucuda::worker_count();
    const int max_slices = std::max(1, s.along_m ? p.m / 192 : p.n / 64);
    s.slices = std::min(max_slices, std::min(2 * workers, std::max(1, (int)(flops / 4e6))));
    if (s.slices > workers) s.slices -= s.slices % workers;
    return s;
}

// out (rows i0..i1 x columns j0..j1 of the product, leading dimension ld_out) = alpha op(A) op(B) + beta out
// (beta == 0: out is not read), one single-threaded cblas_sgemm over the whole k. The split operand's block is
// widened into `scratch`; `shared` is the fp32 view of the other one (null when nothing is read).
void block_product(const Plan& p, const Split& s, float alpha, const void* A, const void* B, const float* shared,
                   int64_t ld_shared, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float beta, float* out,
                   int64_t ld_out, std::vector<float>& scratch) {
    const int rows = (int)(i1 - i0), cols = (int)(j1 - j0);
    if (shared == nullptr) {  // k == 0 or alpha == 0: BLAS would not read A, B either
        for (int j = 0; j < cols; j++) {
            float* col = out + (int64_t)j * ld_out;
            for (int i = 0; i < rows; i++) col[i] = beta == 0.0f ? 0.0f : beta * col[i];
        }
        return;
    }
    int64_t lda = ld_shared, ldb = ld_shared;
    const float* a = s.along_m ? op_a_rows(p, A, i0, i1, scratch, &lda) : shared;
    const float* b = s.along_m ? shared : op_b_cols(p, B, j0, j1, scratch, &ldb);
    cblas_sgemm(CblasColMajor, p.transa ? CblasTrans : CblasNoTrans, p.transb ? CblasTrans : CblasNoTrans, rows, cols,
                p.k, alpha, a, (int)lda, b, (int)ldb, beta, out, (int)ld_out);
}

// out (rows i0..i1 x columns j0..j1, leading dimension ld_out) = alpha op(A) op(B) for bf16 A and B, on the
// CPU's bf16 units (bf16_matmul.cpp) straight from the stored operands, nothing widened. A shape oneDNN
// cannot run (none seen) is widened and goes through sgemm instead.
void native_block_product(const Plan& p, float alpha, const void* A, const void* B, int64_t i0, int64_t i1, int64_t j0,
                          int64_t j1, float* out, int64_t ld_out) {
    const int64_t rows = i1 - i0, cols = j1 - j0;
    if (p.k == 0 || alpha == 0.0f) {
        for (int64_t j = 0; j < cols; j++) std::fill(out + j * ld_out, out + j * ld_out + rows, 0.0f);
        return;
    }
    const uint16_t* a = static_cast<const uint16_t*>(A) + (p.transa ? i0 * p.lda : i0);
    const uint16_t* b = static_cast<const uint16_t*>(B) + (p.transb ? j0 : j0 * p.ldb);
    if (cpucuda::native_bf16_product(p.transa, p.transb, rows, cols, p.k, a, p.lda, b, p.ldb, out, ld_out)) {
        if (alpha != 1.0f)
            for (int64_t j = 0; j < cols; j++)
                for (int64_t i = 0; i < rows; i++) out[j * ld_out + i] *= alpha;
        return;
    }
    thread_local std::vector<float> a_buf, b_buf;
    int64_t lda = 0, ldb = 0;
    const float* a32 = op_a_rows(p, A, i0, i1, a_buf, &lda);
    const float* b32 = op_b_cols(p, B, j0, j1, b_buf, &ldb);
    cblas_sgemm(CblasColMajor, p.transa ? CblasTrans : CblasNoTrans, p.transb ? CblasTrans : CblasNoTrans, (int)rows,
                (int)cols, p.k, alpha, a32, (int)lda, b32, (int)ldb, 0.0f, out, (int)ld_out);
}

struct EpilogueArgs {
    const void* bias;  // kHasBias: input
    void* bias_out;    // kBGradB: output
    void* aux;         // kAuxOut: output; kDGelu: input
};

// Column loops of the epilogue, one type each, in blocks of kConvertBlock (as
// convert_array) so that they vectorise: x[i] += scale * s[i], or x[i] += s[i].
inline float as_float(float v) { return v; }
inline float as_float(uint16_t bits) { return bf16_bits_to_float(bits); }
template <bool kScaled, class S>
inline void add_column(float* x, const S* s, float scale, int n) {
    int i = 0;
    for (; i + kConvertBlock <= n; i += kConvertBlock) {
        float a[kConvertBlock];
        S b[kConvertBlock];
        memcpy(a, x + i, sizeof(a));
        memcpy(b, s + i, sizeof(b));
        for (int e = 0; e < kConvertBlock; e++) a[e] += kScaled ? scale * as_float(b[e]) : as_float(b[e]);
        memcpy(x + i, a, sizeof(a));
    }
    for (; i < n; i++) x[i] += kScaled ? scale * as_float(s[i]) : as_float(s[i]);
}
inline void add_scaled(float* x, const void* src, cudaDataType_t t, float scale, int n) {
    if (t == CUDA_R_32F) add_column<true>(x, static_cast<const float*>(src), scale, n);
    else add_column<true>(x, static_cast<const uint16_t*>(src), scale, n);
}
inline void add_plain(float* x, const void* src, cudaDataType_t t, int n) {
    if (t == CUDA_R_32F) add_column<false>(x, static_cast<const float*>(src), 0.0f, n);
    else add_column<false>(x, static_cast<const uint16_t*>(src), 0.0f, n);
}
// x[i] = gelu(x[i]), and x[i] *= gelu'(pre[i]): 8 at a time, the tail of a
// column through a zero-padded block, so that every element takes the same path.
template <class F>
VECTOR_INLINE void in_blocks_of_8(float* x, int n, F f) {  // f(v, i): v = x[i..i+8), updated in place
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        Floats8 v;
        memcpy(&v, x + i, sizeof(v));
        f(v, i);
        memcpy(x + i, &v, sizeof(v));
    }
    if (i < n) {
        Floats8 v = {};
        for (int e = 0; i + e < n; e++) v[e] = x[i + e];
        f(v, i);
        for (int e = 0; i + e < n; e++) x[i + e] = v[e];
    }
}
VECTOR_INLINE void gelu_column(float* x, int n) {
    in_blocks_of_8(x, n, [](Floats8& v, int) __attribute__((always_inline)) { v = gelu8(v); });
}
template <class S>
VECTOR_INLINE void scale_by_gelu_grad(float* x, const S* pre, int n) {
    in_blocks_of_8(x, n, [&](Floats8& v, int i) __attribute__((always_inline)) {
        Floats8 a = {};
        for (int e = 0; e < 8 && i + e < n; e++) a[e] = as_float(pre[i + e]);
        v = v * gelu_grad8(a);
    });
}
inline void store_column(void* dst, cudaDataType_t t, const float* x, int n) {
    if (t == CUDA_R_32F) {
        memcpy(dst, x, (size_t)n * sizeof(float));
    } else {
        narrow_bf16(x, static_cast<uint16_t*>(dst), n);
    }
}

// Which copy of the epilogue's loops runs (see AVX2_CODE).
#ifdef CPUCUDA_MATMUL_AVX2
const bool cpu_has_avx2 = __builtin_cpu_supports("avx2");
#else
const bool cpu_has_avx2 = false;
#endif
std::atomic<bool> avx2_loops{cpu_has_avx2};

// D = epilogue(prod + beta * C) for the block rows i0..i1 x columns j0..j1 of one batch entry, one step at a
// time over a column of prod (the block, leading dimension ld_prod, updated in place); every element goes
// through the same operations in the same order as the formula.
inline __attribute__((always_inline)) void finish_columns(const Plan& p, float* prod, int64_t ld_prod, float beta,
                                                          const void* C, void* D, const EpilogueArgs& e, int64_t i0,
                                                          int64_t i1, int64_t j0, int64_t j1) {
    const int rows = (int)(i1 - i0);
    for (int64_t j = j0; j < j1; j++) {
        float* x = prod + (j - j0) * ld_prod;
        if (beta != 0.0f) add_scaled(x, offset(C, p.cd_type, j * p.ldc + i0), p.cd_type, beta, rows);
        if (p.epi & kHasBias) add_plain(x, offset(e.bias, p.bias_type, i0), p.bias_type, rows);
        if (p.epi & kAuxOut)
            store_column(const_cast<void*>(offset(e.aux, p.aux_type, j * p.ld_aux + i0)), p.aux_type, x, rows);
        if (p.epi & kGelu) gelu_column(x, rows);
        if (p.epi & kDGelu) {
            const void* aux = offset(e.aux, p.aux_type, j * p.ld_aux + i0);
            if (p.aux_type == CUDA_R_32F) scale_by_gelu_grad(x, static_cast<const float*>(aux), rows);
            else scale_by_gelu_grad(x, static_cast<const uint16_t*>(aux), rows);
        }
        store_column(const_cast<void*>(offset(D, p.cd_type, j * p.ldd + i0)), p.cd_type, x, rows);
    }
}
#ifdef CPUCUDA_MATMUL_AVX2
AVX2_CODE void finish_block_avx2(const Plan& p, float* prod, int64_t ld_prod, float beta, const void* C, void* D,
                                 const EpilogueArgs& e, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    finish_columns(p, prod, ld_prod, beta, C, D, e, i0, i1, j0, j1);
}
#endif
// finish_columns as AVX2 code (avx2_loops), else compiled here for the build's target
void finish_block(const Plan& p, float* prod, int64_t ld_prod, float beta, const void* C, void* D,
                  const EpilogueArgs& e, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
#ifdef CPUCUDA_MATMUL_AVX2
    if (avx2_loops.load(std::memory_order_relaxed))
        return finish_block_avx2(p, prod, ld_prod, beta, C, D, e, i0, i1, j0, j1);
#endif
    finish_columns(p, prod, ld_prod, beta, C, D, e, i0, i1, j0, j1);
}

// One batch entry: D = epilogue(alpha op(A) op(B) + beta C). direct: D is fp32 with no per-element epilogue,
// so each sgemm writes D itself (C already copied there); else each slice's product goes to a per-worker
// scratch and finish_block takes it to D. native: bf16 operands multiplied on the CPU's bf16 units.
void compute(const Plan& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
             const EpilogueArgs& e, bool direct, bool native) {
    static const bool single_threaded_blas = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)single_threaded_blas;
    thread_local std::vector<float> shared_buf;
    const Split s = split_for(p);
    int64_t ld_shared = 0;
    const float* shared = nullptr;
    if (p.k > 0 && alpha != 0.0f && !native)
        shared =
            s.along_m
                ? f32_whole(B, p.ab_type, p.transb ? p.n : p.k, p.transb ? p.k : p.n, p.ldb, shared_buf, &ld_shared)
                : f32_whole(A, p.ab_type, p.transa ? p.k : p.m, p.transa ? p.m : p.k, p.lda, shared_buf, &ld_shared);
    cpucuda::parallel_for(s.slices, [&](int slice) {
        thread_local std::vector<float> op_buf, prod_buf;
        int64_t s0, s1;
        split_range(s.along_m ? p.m : p.n, s.slices, slice, s.align, &s0, &s1);
        if (s1 <= s0) return;
        const int64_t i0 = s.along_m ? s0 : 0, i1 = s.along_m ? s1 : p.m;
        const int64_t j0 = s.along_m ? 0 : s0, j1 = s.along_m ? p.n : s1;
        if (direct) {
            float* out = static_cast<float*>(D) + j0 * p.ldd + i0;
            block_product(p, s, alpha, A, B, shared, ld_shared, i0, i1, j0, j1, beta, out, p.ldd, op_buf);
            return;
        }
        const size_t size = (size_t)((i1 - i0) * (j1 - j0));
        if (prod_buf.size() < size) prod_buf.resize(size);
        if (native) native_block_product(p, alpha, A, B, i0, i1, j0, j1, prod_buf.data(), i1 - i0);
        else
            block_product(p, s, alpha, A, B, shared, ld_shared, i0, i1, j0, j1, 0.0f, prod_buf.data(), i1 - i0, op_buf);
        finish_block(p, prod_buf.data(), i1 - i0, beta, C, D, e, i0, i1, j0, j1);
    });
}

// bias_out[j] = sum over l < k of op(B)[l][j], j < n: each in double, in the order of l, whichever worker
// takes column j (B stored transposed is read row by row, a running sum per column).
void bias_grad_b(const Plan& p, const void* B, void* bias_out) {
    const int tasks = tasks_for((double)p.n * p.k, 1 << 18);
    cpucuda::parallel_for(tasks, [&](int task) {
        thread_local std::vector<double> sums;
        int64_t j0, j1;
        split_range(p.n, tasks, task, 1, &j0, &j1);
        sums.assign((size_t)(j1 - j0), 0.0);
        if (p.transb) {
            for (int64_t l = 0; l < p.k; l++)
                for (int64_t j = j0; j < j1; j++) sums[j - j0] += load(B, p.ab_type, l * p.ldb + j);
        } else {
            for (int64_t j = j0; j < j1; j++)
                for (int64_t l = 0; l < p.k; l++) sums[j - j0] += load(B, p.ab_type, j * p.ldb + l);
        }
        for (int64_t j = j0; j < j1; j++) store(bias_out, p.bias_type, j, (float)sums[j - j0]);
    });
}

// D = C (fp32, m x n), column by column; nothing to do when C is D.
void copy_c_to_d(const Plan& p, const float* C, float* D) {
    if (C == D && p.ldc == p.ldd) return;
    for (int j = 0; j < p.n; j++) memcpy(D + (int64_t)j * p.ldd, C + (int64_t)j * p.ldc, (size_t)p.m * sizeof(float));
}

cublasStatus_t run(const Plan& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
                   const EpilogueArgs& e) {
    // fp32 D and no epilogue but the bias gradient: BLAS computes the whole
    // T = alpha * op(A) op(B) + beta * C in D itself (C copied there first).
    // Native bf16 products always go through the scratch, beta * C added after.
    const bool native = p.ab_type == CUDA_R_16BF && cpucuda::native_bf16_on();
    const bool direct = !native && p.cd_type == CUDA_R_32F && (p.epi & ~kBGradB) == 0;
    for (int bi = 0; bi < p.batch; bi++) {
        const void* a = offset(A, p.ab_type, bi * p.stride_a);
        const void* b = offset(B, p.ab_type, bi * p.stride_b);
        const void* c = beta != 0.0f ? offset(C, p.cd_type, bi * p.stride_c) : nullptr;
        void* d = const_cast<void*>(offset(D, p.cd_type, bi * p.stride_d));
        // BGRADB reads B before D is written (D must not alias B anyway).
        if (p.epi & kBGradB) bias_grad_b(p, b, e.bias_out);
        if (direct && beta != 0.0f) copy_c_to_d(p, static_cast<const float*>(c), static_cast<float*>(d));
        compute(p, alpha, a, b, beta, c, d, e, direct, native);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Pointers that the plan will dereference must be set.
cublasStatus_t check_pointers(const Plan& p, const DescState& d, const void* alpha, const void* beta, const void* A,
                              const void* B, const void* C, const void* D) {
    if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    bool reads_ab = p.k > 0 && *static_cast<const float*>(alpha) != 0.0f;
    if (D == nullptr || (reads_ab && (A == nullptr || B == nullptr))) return CUBLAS_STATUS_INVALID_VALUE;
    if (*static_cast<const float*>(beta) != 0.0f && C == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if ((p.epi & (kHasBias | kBGradB)) && d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if ((p.epi & kBGradB) && p.k > 0 && B == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if ((p.epi & (kAuxOut | kDGelu)) && d.aux == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

const char* status_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
        default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char* status_string(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
        default: return "unknown error";
    }
}

}  // namespace

bool cpucuda::set_matmul_vector_code(bool on) {
    avx2_loops = on && cpu_has_avx2;
    return avx2_loops;
}

// ---------------------------------------------------------------------------
// The C API.

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new (std::nothrow) cublasLtContext{kHandleMagic};
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (handle == nullptr || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return status_string(status); }
const char* cublasGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return status_string(status); }

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int* value) {
    if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
        case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
        case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
        case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
        default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

// --- matrix layouts ---

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
    if (layout == nullptr || size < sizeof(LayoutState)) return CUBLAS_STATUS_ALLOC_FAILED;
    init_layout(layout, type, rows, cols, ld);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new (std::nothrow) cublasLtMatrixLayoutOpaque_t;
    if (*layout == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
    init_layout(*layout, type, rows, cols, ld);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    if (layout == nullptr) return CUBLAS_STATUS_SUCCESS;
    if (layout_of(layout) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    layout_of(layout)->magic = 0;
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
    LayoutState* s = layout_of(layout);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(layout_field(*s, attr), buf, size);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* written) {
    LayoutState* s = layout_of(layout);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(layout_field(*s, attr), buf, size, written);
}

// --- matmul descriptors ---

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    if (desc == nullptr || size < sizeof(DescState)) return CUBLAS_STATUS_ALLOC_FAILED;
    init_desc(desc, compute, scale);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
    if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new (std::nothrow) cublasLtMatmulDescOpaque_t;
    if (*desc == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
    init_desc(*desc, compute, scale);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    if (desc == nullptr) return CUBLAS_STATUS_SUCCESS;
    if (desc_of(desc) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    desc_of(desc)->magic = 0;
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    DescState* s = desc_of(desc);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(desc_field(*s, attr), buf, size);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t size, size_t* written) {
    DescState* s = desc_of(desc);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(desc_field(*s, attr), buf, size, written);
}

// --- preferences ---

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
    if (pref == nullptr || size < sizeof(PrefState)) return CUBLAS_STATUS_ALLOC_FAILED;
    init_pref(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
    if (*pref == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
    init_pref(*pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
    if (pref_of(pref) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    pref_of(pref)->magic = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    PrefState* s = pref_of(pref);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(pref_field(*s, attr), buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
    PrefState* s = pref_of(pref);
    if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(pref_field(*s, attr), buf, size, written);
}

// --- heuristic and matmul ---

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
    if (handle == nullptr || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (returned == nullptr || results == nullptr || requested <= 0) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    if (pref != nullptr && pref_of(pref) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    Plan plan;
    cublasStatus_t st =
        make_plan(desc_of(desc), layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc), layout_of(Ddesc), &plan);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(&results[0], 0, sizeof(results[0]));
    results[0].algo.data[0] = kAlgoMagic;
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// algo and workspace are ignored: there is one algorithm and it needs no
// workspace. Arguments are checked now; the product runs in stream order.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSize, cudaStream_t stream) {
    (void)algo;
    (void)workspace;
    (void)workspaceSize;
    if (handle == nullptr || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
    const DescState* d = desc_of(desc);
    Plan plan;
    cublasStatus_t st = make_plan(d, layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc), layout_of(Ddesc), &plan);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    st = check_pointers(plan, *d, alpha, beta, A, B, C, D);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (plan.m == 0 || plan.n == 0) return CUBLAS_STATUS_SUCCESS;
    EpilogueArgs e{d->bias, const_cast<void*>(d->bias), d->aux};
    // alpha and beta are host values read now; the product is stream work.
    const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
    cpucuda::enqueue(stream, [=] {
        const double start = cpucuda::profiling_on() ? cpucuda::profile_clock() : 0;
        run(plan, a, A, B, b, C, D, e);
        if (cpucuda::profiling_on()) cpucuda::profile_add("cublasLtMatmul", cpucuda::profile_clock() - start);
    });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
