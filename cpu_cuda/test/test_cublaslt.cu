// cuBLASLt tests: cublasLtMatmul against a naive fp64 matmul on the host.
// Portable: only the public CUDA runtime and cuBLASLt API, so the same file
// checks the CPU runtime's cpu_cuda/cublaslt.cpp (make test) and the real
// cuBLASLt on a GPU (nvcc ... -lcublasLt).
//
// Covered: every layout (transA x transB in N/T); A/B/C/D types fp32/fp32,
// bf16/bf16 and bf16 inputs with fp32 C/D; alpha/beta (beta 0 with C full of
// NaN, beta 1 accumulating in place with C == D, a general alpha and beta,
// alpha 0 with beta 0.5);
// non-square shapes with ld > rows; strided batches; the epilogues BIAS, GELU,
// GELU_BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU and BGRADB, each in every layout on
// the CPU runtime (on a GPU in llm.c's layout); and combinations that must be
// refused. Elements between rows and ld must be left untouched. On the CPU
// runtime, bf16 operands run on the CPU's bf16 units where it has them
// (deterministic, fp32 accumulation), and otherwise give bitwise the fp32
// result of the widened operands.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#ifdef CPUCUDA
#include "cpucuda.h"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "test/test_util.h"

// Aborts on an unexpected cuBLASLt error in the set-up of a case.
#define LT_OK(call)                                                                                         \
    do {                                                                                                    \
        cublasStatus_t s_ = (call);                                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
            printf("FAIL %s returned %s at %s:%d\n", #call, cublasLtGetStatusName(s_), __FILE__, __LINE__); \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

static const size_t kWorkspaceBytes = 4 << 20;
static cublasLtHandle_t g_lt;
static void* g_workspace;

// --- host-side matrices ------------------------------------------------------------------

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand() {  // uniform in [-1, 1)
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static bool is_bf16(cudaDataType_t t) { return t == CUDA_R_16BF; }
static const char* type_name(cudaDataType_t t) { return is_bf16(t) ? "bf16" : "f32"; }
static size_t type_size(cudaDataType_t t) { return is_bf16(t) ? 2 : 4; }

// The value v stored in type t and read back.
static double round_to(cudaDataType_t t, double v) {
    if (is_bf16(t)) return (double)__bfloat162float(__float2bfloat16((float)v));
    return (double)(float)v;
}

// ld > rows in every case: bf16 leading dimensions are kept multiples of 8
// elements (16 bytes) so the GPU's vectorised kernels apply; fp32 ones are odd.
static int64_t ld_for(cudaDataType_t t, int rows) { return is_bf16(t) ? (rows + 1 + 7) / 8 * 8 : rows + 3; }

enum Fill { kRandom, kNaN, kSentinel };
static const double kSentinelValue = 1000.0;  // exact in bf16 and fp32

// A column-major rows x cols matrix (batch of them, `stride` elements apart),
// mirrored on the host as doubles holding exactly the stored values.
struct Matrix {
    cudaDataType_t type;
    int rows, cols, batch;
    int64_t ld, stride;
    std::vector<double> h;
    void* d = nullptr;

    double& at(int b, int i, int j) { return h[b * stride + j * ld + i]; }
    double at(int b, int i, int j) const { return h[b * stride + j * ld + i]; }
    bool in_matrix(size_t idx) const {  // false for the padding between rows and ld, or between batches
        int64_t r = (int64_t)idx % stride;
        return r < ld * cols && r % ld < rows;
    }
};

static void upload(Matrix& M) {
    size_t n = M.h.size();
    std::vector<unsigned char> raw(n * type_size(M.type));
    for (size_t i = 0; i < n; i++) {
        if (is_bf16(M.type)) ((__nv_bfloat16*)raw.data())[i] = __float2bfloat16((float)M.h[i]);
        else ((float*)raw.data())[i] = (float)M.h[i];
    }
    CUDA_OK(cudaMemcpy(M.d, raw.data(), raw.size(), cudaMemcpyHostToDevice));
}

static std::vector<double> download(const Matrix& M) {
    size_t n = M.h.size();
    std::vector<unsigned char> raw(n * type_size(M.type));
    CUDA_OK(cudaMemcpy(raw.data(), M.d, raw.size(), cudaMemcpyDeviceToHost));
    std::vector<double> out(n);
    for (size_t i = 0; i < n; i++)
        out[i] = is_bf16(M.type) ? (double)__bfloat162float(((__nv_bfloat16*)raw.data())[i])
                                 : (double)((float*)raw.data())[i];
    return out;
}

static Matrix make_matrix(cudaDataType_t t, int rows, int cols, int batch, Fill fill, double scale = 1.0,
                          int64_t ld = 0) {
    Matrix M;
    M.type = t;
    M.rows = rows;
    M.cols = cols;
    M.batch = batch;
    M.ld = ld ? ld : ld_for(t, rows);
    M.stride = M.ld * cols + (batch > 1 ? 8 : 0);  // batches apart, with a gap
    M.h.resize(M.stride * batch);
    for (double& v : M.h) v = fill == kRandom ? round_to(t, scale * urand()) : fill == kNaN ? NAN : kSentinelValue;
    CUDA_OK(cudaMalloc(&M.d, M.h.size() * type_size(t)));
    upload(M);
    return M;
}

static void free_matrix(Matrix& M) {
    CUDA_OK(cudaFree(M.d));
    M.d = nullptr;
}

// --- running one cublasLtMatmul the way llm.c does ----------------------------------------

struct Epilogue {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void* bias = nullptr;
    bool set_bias_type = false;
    cudaDataType_t bias_type = CUDA_R_32F;
    void* aux = nullptr;
    int64_t aux_ld = 0;
};

struct Options {  // unusual settings, for the refusal cases
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = CUDA_R_32F;
    bool row_order = false;
    bool device_pointer_mode = false;
};

struct LtResult {
    cublasStatus_t heuristic = CUBLAS_STATUS_SUCCESS, matmul = CUBLAS_STATUS_SUCCESS;
    int returned = 0;
    bool algo_ok = false;  // the heuristic offered a usable algorithm
};

static cublasLtMatrixLayout_t make_layout(const Matrix& M, const Options& o) {
    cublasLtMatrixLayout_t l;
    LT_OK(cublasLtMatrixLayoutCreate(&l, M.type, M.rows, M.cols, M.ld));
    if (M.batch > 1) {
        int32_t count = M.batch;
        int64_t stride = M.stride;
        LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        LT_OK(
            cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    if (o.row_order) {
        int32_t order = CUBLASLT_ORDER_ROW;
        LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
    }
    return l;
}

// D = epilogue(alpha op(A) op(B) + beta C); C may be the same Matrix as D.
// With run_anyway, cublasLtMatmul is also called (algo NULL) when the heuristic
// offers nothing, to check that it refuses too.
static LtResult lt_matmul(bool ta, bool tb, float alpha, const Matrix& A, const Matrix& B, float beta, const Matrix& C,
                          Matrix& D, const Epilogue& e = Epilogue(), const Options& o = Options(),
                          bool run_anyway = false) {
    cublasLtMatmulDesc_t desc;
    LT_OK(cublasLtMatmulDescCreate(&desc, o.compute, o.scale));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (o.device_pointer_mode) {
        int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
    }
    if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.epilogue, sizeof(e.epilogue)));
    if (e.bias) LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
    if (e.set_bias_type)
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &e.bias_type,
                                             sizeof(e.bias_type)));
    if (e.aux) {
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.aux_ld, sizeof(e.aux_ld)));
    }
    cublasLtMatrixLayout_t la = make_layout(A, o), lb = make_layout(B, o), lc = make_layout(C, o),
                           ld = make_layout(D, o);
    cublasLtMatmulPreference_t pref;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));

    LtResult r;
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof(heur));
    r.heuristic = cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, lc, ld, pref, 1, &heur, &r.returned);
    r.algo_ok = r.heuristic == CUBLAS_STATUS_SUCCESS && r.returned == 1 && heur.state == CUBLAS_STATUS_SUCCESS &&
                heur.workspaceSize <= kWorkspaceBytes;
    if (r.algo_ok || run_anyway) {
        const float alpha_v = alpha, beta_v = beta;
        r.matmul = cublasLtMatmul(g_lt, desc, &alpha_v, A.d, la, B.d, lb, &beta_v, C.d, lc, D.d, ld,
                                  r.algo_ok ? &heur.algo : nullptr, g_workspace, kWorkspaceBytes, 0);
        CUDA_OK(cudaDeviceSynchronize());
    }
    LT_OK(cublasLtMatmulPreferenceDestroy(pref));
    for (cublasLtMatrixLayout_t l : {la, lb, lc, ld}) LT_OK(cublasLtMatrixLayoutDestroy(l));
    LT_OK(cublasLtMatmulDescDestroy(desc));
    return r;
}

static bool ran_ok(const LtResult& r) { return r.algo_ok && r.matmul == CUBLAS_STATUS_SUCCESS; }

// --- the fp64 reference -------------------------------------------------------------------

static double gelu(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_grad(double x) {
    double s = sqrt(2.0 / M_PI), t = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// Expected values of a logical m x n (x batch) result, with the magnitude that
// bounds its rounding error (sum of |terms|).
struct Expected {
    int m, n, batch;
    std::vector<double> v, mag;
    explicit Expected(int m_, int n_, int b_) : m(m_), n(n_), batch(b_), v(m_ * n_ * b_), mag(m_ * n_ * b_) {}
    size_t idx(int b, int i, int j) const { return ((size_t)b * n + j) * m + i; }
};

// alpha op(A) op(B) + beta C, before any epilogue. C is read before the call.
static Expected reference(bool ta, bool tb, double alpha, const Matrix& A, const Matrix& B, double beta,
                          const Matrix& C_before, int m, int n, int k, int batch) {
    Expected e(m, n, batch);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double sum = 0, mag = 0;
                for (int l = 0; l < k; l++) {
                    double p = (ta ? A.at(b, l, i) : A.at(b, i, l)) * (tb ? B.at(b, j, l) : B.at(b, l, j));
                    sum += p;
                    mag += fabs(p);
                }
                double v = alpha * sum, g = fabs(alpha) * mag;
                if (beta != 0) {
                    v += beta * C_before.at(b, i, j);
                    g += fabs(beta * C_before.at(b, i, j));
                }
                e.v[e.idx(b, i, j)] = v;
                e.mag[e.idx(b, i, j)] = g;
            }
    return e;
}

// Relative tolerance of a stored result: fp32 accumulation, plus the final
// rounding when the output is bf16.
static double tol_for(cudaDataType_t out) { return is_bf16(out) ? 1.0 / 128 : 1e-5; }
// The GPU evaluates tanh with a hardware approximation (~5e-4 relative), so
// GELU results in fp32 are held to that there; the CPU uses libm's tanhf.
#ifdef CPUCUDA
static const double kGeluTolF32 = 1e-5;
#else
static const double kGeluTolF32 = 2e-3;
#endif
static double gelu_tol_for(cudaDataType_t out) { return is_bf16(out) ? 1.0 / 128 : kGeluTolF32; }

// Compares D (downloaded) with the expectation: returns the worst
// |got - want| / (tol (mag + |want|)) (<= 1 passes, NaN counts as infinite) and
// checks that every element outside the logical matrices kept its old value.
static double compare(const Matrix& D, const std::vector<double>& got, const std::vector<double>& before,
                      const Expected& e, double tol, bool* padding_ok) {
    double worst = 0;
    *padding_ok = true;
    for (int b = 0; b < e.batch; b++)
        for (int j = 0; j < e.n; j++)
            for (int i = 0; i < e.m; i++) {
                double g = got[b * D.stride + j * D.ld + i], w = e.v[e.idx(b, i, j)];
                double r = fabs(g - w) / (tol * (e.mag[e.idx(b, i, j)] + fabs(w)) + 1e-300);
                if (!(r <= worst)) worst = std::isnan(r) ? INFINITY : r;
            }
    for (size_t idx = 0; idx < got.size(); idx++) {
        if (D.in_matrix(idx)) continue;
        bool same = got[idx] == before[idx] || (std::isnan(got[idx]) && std::isnan(before[idx]));
        if (!same) *padding_ok = false;
    }
    return worst;
}

struct TypeCombo {
    cudaDataType_t ab, cd;
};
static const TypeCombo kCombos[] = {{CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};

static void combo_name(char* buf, size_t n, TypeCombo c) {
    snprintf(buf, n, "%s*%s->%s", type_name(c.ab), type_name(c.ab), type_name(c.cd));
}

// --- plain matmuls: every layout, type combination and alpha/beta ---------------------------

enum Scenario { kBeta0NaN, kBeta1InPlace, kGeneral, kAlpha0 };  // kAlpha0: D = beta C alone

static void test_plain(TypeCombo tc, bool ta, bool tb, int batch, Scenario sc) {
    const int m = 13, n = 11, k = 17;
    float alpha = sc == kGeneral ? -0.75f : sc == kAlpha0 ? 0.0f : (batch > 1 ? 0.5f : 1.0f);
    float beta = sc == kBeta0NaN ? 0.0f : sc == kBeta1InPlace ? 1.0f : 0.5f;
    Matrix A = make_matrix(tc.ab, ta ? k : m, ta ? m : k, batch, kRandom);
    Matrix B = make_matrix(tc.ab, tb ? n : k, tb ? k : n, batch, kRandom);
    Matrix D = make_matrix(tc.cd, m, n, batch, sc == kBeta1InPlace ? kRandom : kSentinel);
    Matrix C = make_matrix(tc.cd, m, n, batch, sc == kBeta0NaN ? kNaN : kRandom);
    const Matrix& Cuse = sc == kBeta1InPlace ? D : C;
    Expected want = reference(ta, tb, alpha, A, B, beta, Cuse, m, n, k, batch);
    std::vector<double> before = D.h;

    LtResult r = lt_matmul(ta, tb, alpha, A, B, beta, Cuse, D);
    bool pad_ok = false;
    double worst = ran_ok(r) ? compare(D, download(D), before, want, tol_for(tc.cd), &pad_ok) : INFINITY;

    char types[64];
    combo_name(types, sizeof types, tc);
    const char* what = sc == kBeta0NaN ? "beta=0 (C all NaN)" : sc == kBeta1InPlace ? "beta=1 (C == D)" : "beta=0.5";
    CHECK(ran_ok(r) && worst <= 1.0 && pad_ok,
          "matmul %s %c%c m=%d n=%d k=%d batch=%d alpha=%g %s: heuristic %s (%d), matmul %s, worst err/tol %.3g%s",
          types, ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, batch, alpha, what, cublasLtGetStatusName(r.heuristic),
          r.returned, cublasLtGetStatusName(r.matmul), worst, pad_ok ? "" : ", padding overwritten");
    for (Matrix* M : {&A, &B, &C, &D}) free_matrix(*M);
}

// bf16 output rounding: with small integer inputs the fp32 accumulation is
// exact, and sums beyond 8 significant bits (ties included) must come out
// exactly as round-to-nearest-even of the exact value.
static void test_bf16_rounding() {
    const int m = 16, n = 16, k = 16;
    Matrix A = make_matrix(CUDA_R_16BF, m, k, 1, kRandom);
    Matrix B = make_matrix(CUDA_R_16BF, k, n, 1, kRandom);
    for (Matrix* M : {&A, &B}) {
        for (double& v : M->h) v = std::round(15 * urand());
        upload(*M);
    }
    Matrix C = make_matrix(CUDA_R_16BF, m, n, 1, kNaN);
    Matrix D = make_matrix(CUDA_R_16BF, m, n, 1, kSentinel);
    Expected want = reference(false, false, 1.0, A, B, 0.0, C, m, n, k, 1);
    LtResult r = lt_matmul(false, false, 1.0f, A, B, 0.0f, C, D);
    int wrong = 0, rounded = 0;
    if (ran_ok(r)) {
        std::vector<double> got = download(D);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double exact = want.v[want.idx(0, i, j)], expect = round_to(CUDA_R_16BF, exact);
                if (got[j * D.ld + i] != expect) wrong++;
                if (expect != exact) rounded++;
            }
    }
    CHECK(ran_ok(r) && wrong == 0 && rounded > 0,
          "bf16 output is the round-to-nearest-even of the exact sum: %d of %d wrong (%d needed rounding)", wrong,
          m * n, rounded);
    for (Matrix* M : {&A, &B, &C, &D}) free_matrix(*M);
}

// --- epilogues ---------------------------------------------------------------------------

static void report_vector(bool ok, const char* what, double worst, const char* label) {
    CHECK(ok && worst <= 1.0, "  %s %s: worst err/tol %.3g", label, what, worst);
}

static const char* layout_name(bool ta, bool tb) {
    static const char* names[4] = {"NN", "NT", "TN", "TT"};
    return names[ta * 2 + tb];
}
// Every epilogue runs in every layout and type combination on the CPU runtime
// (which emulates them all). On a GPU only what the trainer uses is checked:
// the BIAS epilogue in the forward's layout (TN), with the inputs' type as the
// output's (bf16 -> bf16, fp32 -> fp32). Which other combinations real
// cuBLASLt supports depends on the types and the architecture, and a refusal
// there is not a bug of this project.
static bool epilogue_tested(TypeCombo tc, bool ta, bool tb, cublasLtEpilogue_t epi, bool llmc_ta, bool llmc_tb) {
#ifdef CPUCUDA
    (void)tc, (void)ta, (void)tb, (void)epi, (void)llmc_ta, (void)llmc_tb;
    return true;
#else
    return epi == CUBLASLT_EPILOGUE_BIAS && tc.ab == tc.cd && ta == llmc_ta && tb == llmc_tb;
#endif
}
static Matrix make_op_a(TypeCombo tc, bool ta, int m, int k) {
    return make_matrix(tc.ab, ta ? k : m, ta ? m : k, 1, kRandom);
}
static Matrix make_op_b(TypeCombo tc, bool tb, int k, int n) {
    return make_matrix(tc.ab, tb ? n : k, tb ? k : n, 1, kRandom);
}

// Forward epilogues BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS (llm.c's
// forward pass uses layout TN: weights transposed, op(A) = A^T, op(B) = B).
static void test_forward_epilogue(TypeCombo tc, bool ta, bool tb, cublasLtEpilogue_t epi, const char* epi_name) {
    const int m = 16, n = 12, k = 20;
    bool has_bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                    epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool has_gelu = epi != CUBLASLT_EPILOGUE_BIAS;
    bool has_aux = epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    Matrix A = make_op_a(tc, ta, m, k);
    Matrix B = make_op_b(tc, tb, k, n);
    Matrix C = make_matrix(tc.cd, m, n, 1, kNaN);
    Matrix D = make_matrix(tc.cd, m, n, 1, kSentinel);
    // Bias: D's type (the documented default; the BIAS case also sets it explicitly, as llm.c does).
    Matrix bias = make_matrix(tc.cd, m, 1, 1, kRandom);
    Matrix aux = make_matrix(tc.cd, m, n, 1, kSentinel, 1.0, 24);  // aux ld 24 > m, a multiple of 8

    Epilogue e;
    e.epilogue = epi;
    if (has_bias) e.bias = bias.d;
    if (epi == CUBLASLT_EPILOGUE_BIAS) {
        e.set_bias_type = true;
        e.bias_type = tc.cd;
    }
    if (has_aux) {
        e.aux = aux.d;
        e.aux_ld = aux.ld;
    }
    Expected pre = reference(ta, tb, 1.0, A, B, 0.0, C, m, n, k, 1);
    Expected out = pre;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            size_t x = pre.idx(0, i, j);
            if (has_bias) {
                pre.v[x] += bias.at(0, i, 0);
                pre.mag[x] += fabs(bias.at(0, i, 0));
            }
            out.v[x] = has_gelu ? gelu(pre.v[x]) : pre.v[x];
            out.mag[x] = has_gelu ? 2 * pre.mag[x] : pre.mag[x];  // |gelu'| < 1.13
        }
    std::vector<double> d_before = D.h, aux_before = aux.h;

    LtResult r = lt_matmul(ta, tb, 1.0f, A, B, 0.0f, C, D, e);
    bool pad_ok = false;
    double worst = INFINITY;
    if (ran_ok(r))
        worst = compare(D, download(D), d_before, out, has_gelu ? gelu_tol_for(tc.cd) : tol_for(tc.cd), &pad_ok);
    char label[128], types[64];
    combo_name(types, sizeof types, tc);
    snprintf(label, sizeof label, "epilogue %s %s %s m=%d n=%d k=%d", epi_name, types, layout_name(ta, tb), m, n, k);
    CHECK(ran_ok(r) && worst <= 1.0 && pad_ok, "%s: heuristic %s (%d), matmul %s, D worst err/tol %.3g%s", label,
          cublasLtGetStatusName(r.heuristic), r.returned, cublasLtGetStatusName(r.matmul), worst,
          pad_ok ? "" : ", padding overwritten");
    if (has_aux) {
        bool aux_pad_ok = false;
        double aux_worst = ran_ok(r) ? compare(aux, download(aux), aux_before, pre, tol_for(tc.cd), &aux_pad_ok)
                                     : INFINITY;
        report_vector(ran_ok(r) && aux_pad_ok, "aux = pre-activation", aux_worst, label);
    }
    for (Matrix* M : {&A, &B, &C, &D, &bias, &aux}) free_matrix(*M);
}

// DGELU (llm.c's backward pass uses layout NN): D = (alpha op(A) op(B)) * gelu'(aux).
static void test_dgelu(TypeCombo tc, bool ta, bool tb) {
    const int m = 16, n = 12, k = 20;
    const float alpha = 0.75f;
    Matrix A = make_op_a(tc, ta, m, k);
    Matrix B = make_op_b(tc, tb, k, n);
    Matrix C = make_matrix(tc.cd, m, n, 1, kNaN);
    Matrix D = make_matrix(tc.cd, m, n, 1, kSentinel);
    Matrix aux = make_matrix(tc.cd, m, n, 1, kRandom, 3.0, 24);  // pre-activations in [-3, 3)
    Epilogue e;
    e.epilogue = CUBLASLT_EPILOGUE_DGELU;
    e.aux = aux.d;
    e.aux_ld = aux.ld;
    Expected want = reference(ta, tb, alpha, A, B, 0.0, C, m, n, k, 1);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            size_t x = want.idx(0, i, j);
            double g = gelu_grad(aux.at(0, i, j));
            want.v[x] *= g;
            want.mag[x] *= fabs(g) + 1;
        }
    std::vector<double> before = D.h, aux_before = aux.h;
    LtResult r = lt_matmul(ta, tb, alpha, A, B, 0.0f, C, D, e);
    bool pad_ok = false;
    double worst = ran_ok(r) ? compare(D, download(D), before, want, gelu_tol_for(tc.cd), &pad_ok) : INFINITY;
    bool aux_unchanged = ran_ok(r) && download(aux) == aux_before;
    char types[64];
    combo_name(types, sizeof types, tc);
    CHECK(ran_ok(r) && worst <= 1.0 && pad_ok && aux_unchanged,
          "epilogue DGELU %s %s m=%d n=%d k=%d alpha=%g: heuristic %s (%d), matmul %s, D worst err/tol %.3g%s%s", types,
          layout_name(ta, tb), m, n, k, alpha, cublasLtGetStatusName(r.heuristic), r.returned,
          cublasLtGetStatusName(r.matmul), worst, pad_ok ? "" : ", padding overwritten",
          aux_unchanged ? "" : ", aux modified");
    for (Matrix* M : {&A, &B, &C, &D, &aux}) free_matrix(*M);
}

// BGRADB (llm.c's weight gradient uses layout NT), accumulating D in place
// (beta = 1, C == D): bias[j] = sum over k of op(B)[l][j], written over
// whatever the bias buffer held (it starts as NaN).
static void test_bgradb(TypeCombo tc, bool ta, bool tb) {
    const int m = 16, n = 12, k = 20;
    Matrix A = make_op_a(tc, ta, m, k);
    Matrix B = make_op_b(tc, tb, k, n);
    Matrix D = make_matrix(tc.cd, m, n, 1, kRandom);
    Matrix dbias = make_matrix(tc.cd, n, 1, 1, kNaN);
    Epilogue e;
    e.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    e.bias = dbias.d;
    Expected want = reference(ta, tb, 1.0, A, B, 1.0, D, m, n, k, 1);
    Expected want_bias(n, 1, 1);
    for (int j = 0; j < n; j++) {
        for (int l = 0; l < k; l++) {
            const double b = tb ? B.at(0, j, l) : B.at(0, l, j);  // op(B)[l][j]
            want_bias.v[j] += b;
            want_bias.mag[j] += fabs(b);
        }
    }
    std::vector<double> before = D.h, bias_before = dbias.h;
    LtResult r = lt_matmul(ta, tb, 1.0f, A, B, 1.0f, D, D, e);
    bool pad_ok = false, bias_pad_ok = false;
    double worst = ran_ok(r) ? compare(D, download(D), before, want, tol_for(tc.cd), &pad_ok) : INFINITY;
    double bias_worst =
        ran_ok(r) ? compare(dbias, download(dbias), bias_before, want_bias, tol_for(tc.cd), &bias_pad_ok) : INFINITY;
    char label[128], types[64];
    combo_name(types, sizeof types, tc);
    snprintf(label, sizeof label, "epilogue BGRADB %s %s m=%d n=%d k=%d beta=1 (C == D)", types, layout_name(ta, tb), m,
             n, k);
    CHECK(ran_ok(r) && worst <= 1.0 && pad_ok, "%s: heuristic %s (%d), matmul %s, D worst err/tol %.3g%s", label,
          cublasLtGetStatusName(r.heuristic), r.returned, cublasLtGetStatusName(r.matmul), worst,
          pad_ok ? "" : ", padding overwritten");
    report_vector(ran_ok(r) && bias_pad_ok, "bias gradient = column sums of op(B), overwritten", bias_worst, label);
    for (Matrix* M : {&A, &B, &D, &dbias}) free_matrix(*M);
}

#ifdef CPUCUDA
// --- bf16 operands, bitwise (CPU runtime) -------------------------------------------------
// The CPU runtime widens bf16 operands exactly to fp32 (each slice task its own
// part of the split operand) and multiplies them with the same sgemm calls, cut
// into the same slices, as fp32 operands. So a bf16 matmul must give bitwise
// the result of the fp32 matmul of the widened operands (C, bias and aux
// widened too), its outputs rounded to bf16 with __float2bfloat16. The shapes
// are big enough to be cut into several slices, and odd, so that the slices
// come out uneven.

// M's values in type t (bf16 values are exact in fp32), with t's leading dimension (or ld).
static Matrix widened(const Matrix& M, cudaDataType_t t, int64_t ld = 0) {
    Matrix W = make_matrix(t, M.rows, M.cols, M.batch, kSentinel, 1.0, ld);
    for (int b = 0; b < M.batch; b++)
        for (int j = 0; j < M.cols; j++)
            for (int i = 0; i < M.rows; i++) W.at(b, i, j) = M.at(b, i, j);
    upload(W);
    return W;
}

// The stored bits of M's logical elements, an fp32 one rounded to bf16 first when `as` is bf16.
static std::vector<uint32_t> stored_bits(const Matrix& M, cudaDataType_t as) {
    std::vector<unsigned char> raw(M.h.size() * type_size(M.type));
    CUDA_OK(cudaMemcpy(raw.data(), M.d, raw.size(), cudaMemcpyDeviceToHost));
    std::vector<uint32_t> bits;
    for (int b = 0; b < M.batch; b++)
        for (int j = 0; j < M.cols; j++)
            for (int i = 0; i < M.rows; i++) {
                const size_t idx = b * M.stride + j * M.ld + i;
                uint32_t v = 0;
                if (is_bf16(M.type)) {
                    memcpy(&v, raw.data() + 2 * idx, 2);
                } else if (is_bf16(as)) {
                    float f;
                    memcpy(&f, raw.data() + 4 * idx, 4);
                    const __nv_bfloat16 h = __float2bfloat16(f);
                    memcpy(&v, &h, 2);
                } else {
                    memcpy(&v, raw.data() + 4 * idx, 4);
                }
                bits.push_back(v);
            }
    return bits;
}

static int bits_differing(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    int n = a.size() == b.size() ? 0 : -1;
    for (size_t i = 0; n >= 0 && i < a.size(); i++) n += a[i] != b[i];
    return n;
}

// One bf16 matmul against its fp32 twin. along_m: m is the long side (the
// product is cut along m), else n is. cd: D's type (bf16, or fp32 as for
// llm.c's weight gradient).
static void test_bf16_as_f32(bool along_m, bool ta, bool tb, cublasLtEpilogue_t epi, const char* epi_name,
                             cudaDataType_t cd, int batch) {
    const int m = along_m ? 1000 : 37, n = along_m ? 37 : 1000, k = 1111;
    const bool bgradb = epi == CUBLASLT_EPILOGUE_BGRADB, dgelu = epi == CUBLASLT_EPILOGUE_DGELU;
    // An fp32 D with no element-wise epilogue gets beta C added inside sgemm
    // (fused into its last step), a bf16 one afterwards: the same sum, but
    // rounded differently, so those bf16 cases leave C out.
    const bool c_in_sgemm = epi == CUBLASLT_EPILOGUE_DEFAULT || bgradb;
    const float alpha = 0.75f, beta = c_in_sgemm && is_bf16(cd) ? 0.0f : 0.5f;
    const bool has_bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                          epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_out = epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const int64_t aux_ld = (m + 7) / 8 * 8;
    Matrix A = make_matrix(CUDA_R_16BF, ta ? k : m, ta ? m : k, batch, kRandom);
    Matrix B = make_matrix(CUDA_R_16BF, tb ? n : k, tb ? k : n, batch, kRandom);
    Matrix C = make_matrix(cd, m, n, batch, kRandom);
    Matrix D = make_matrix(cd, m, n, batch, kSentinel);
    Matrix bias = make_matrix(cd, bgradb ? n : m, 1, 1, bgradb ? kNaN : kRandom);
    Matrix aux = make_matrix(cd, m, n, 1, dgelu ? kRandom : kSentinel, 3.0, aux_ld);
    Matrix A32 = widened(A, CUDA_R_32F), B32 = widened(B, CUDA_R_32F), C32 = widened(C, CUDA_R_32F);
    Matrix D32 = widened(D, CUDA_R_32F), bias32 = widened(bias, CUDA_R_32F), aux32 = widened(aux, CUDA_R_32F, aux_ld);
    Epilogue e, e32;
    e.epilogue = e32.epilogue = epi;
    if (has_bias || bgradb) e.bias = bias.d, e32.bias = bias32.d;
    if (aux_out || dgelu) e.aux = aux.d, e32.aux = aux32.d, e.aux_ld = e32.aux_ld = aux_ld;
    LtResult r = lt_matmul(ta, tb, alpha, A, B, beta, C, D, e);
    LtResult r32 = lt_matmul(ta, tb, alpha, A32, B32, beta, C32, D32, e32);
    const bool ran = ran_ok(r) && ran_ok(r32);
    int d_diff = -1, aux_diff = 0, bias_diff = 0;
    if (ran) {
        d_diff = bits_differing(stored_bits(D, cd), stored_bits(D32, cd));
        if (aux_out) aux_diff = bits_differing(stored_bits(aux, cd), stored_bits(aux32, cd));
        if (bgradb) bias_diff = bits_differing(stored_bits(bias, cd), stored_bits(bias32, cd));
    }
    CHECK(ran && d_diff == 0 && aux_diff == 0 && bias_diff == 0,
          "bf16*bf16->%s %s %s m=%d n=%d k=%d batch=%d alpha=%g beta=%g is bitwise the fp32 matmul of the widened "
          "operands: D elements differing %d, aux %d, bias %d",
          type_name(cd), epi_name, layout_name(ta, tb), m, n, k, batch, alpha, beta, d_diff, aux_diff, bias_diff);
    for (Matrix* M : {&A, &B, &C, &D, &bias, &aux, &A32, &B32, &C32, &D32, &bias32, &aux32}) free_matrix(*M);
}

// The epilogues llm.c's trainer uses, by name (indices 0 and 7 are the ones without an element-wise step).
static const struct {
    cublasLtEpilogue_t e;
    const char* name;
} kEpilogues[] = {{CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT"},   {CUBLASLT_EPILOGUE_BIAS, "BIAS"},
                  {CUBLASLT_EPILOGUE_GELU, "GELU"},         {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"},
                  {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"}, {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"},
                  {CUBLASLT_EPILOGUE_DGELU, "DGELU"},       {CUBLASLT_EPILOGUE_BGRADB, "BGRADB"}};

static void test_bf16_bitwise() {
    const bool native_was_on = cpucuda::set_native_bf16_matmul(false);
    for (int along_m = 0; along_m < 2; along_m++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                for (auto& ep : kEpilogues) test_bf16_as_f32(along_m, ta, tb, ep.e, ep.name, CUDA_R_16BF, 1);
                for (int i : {0, 7})
                    test_bf16_as_f32(along_m, ta, tb, kEpilogues[i].e, kEpilogues[i].name, CUDA_R_32F, 1);
                for (cudaDataType_t cd : {CUDA_R_16BF, CUDA_R_32F})
                    test_bf16_as_f32(along_m, ta, tb, CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT", cd, 3);
            }
    cpucuda::set_native_bf16_matmul(native_was_on);
}

// --- bf16 operands on the CPU's bf16 units (CPU runtime, where the CPU has them) -----------
// The native products (oneDNN on AVX512-BF16 or AMX) sum in their own order,
// in fp32. Over a long k, cut into slices, in every layout: within the fp32
// tolerance of the fp64 reference, the same bits when run again, and, for an
// fp32 D, not the bits of the widened operands' sgemm in some element (else
// the native path did not run: about 30,000 of the 37,000 differ; a bf16 D
// rounds most differences away, so there it is not required). The plain and
// epilogue tests above run the native path too, at small k.
static void test_bf16_native_case(bool along_m, bool ta, bool tb, cudaDataType_t cd) {
    const int m = along_m ? 1000 : 37, n = along_m ? 37 : 1000, k = 1111;
    // beta = 0 for an fp32 D: the widened path then writes sgemm's result as it
    // is, as a native product that fell back to sgemm would, so such a fallback
    // shows as no difference (with beta the two add C at different points).
    const float alpha = 0.75f, beta = is_bf16(cd) ? 0.5f : 0.0f;
    Matrix A = make_matrix(CUDA_R_16BF, ta ? k : m, ta ? m : k, 1, kRandom);
    Matrix B = make_matrix(CUDA_R_16BF, tb ? n : k, tb ? k : n, 1, kRandom);
    Matrix C = make_matrix(cd, m, n, 1, kRandom);
    Matrix D = make_matrix(cd, m, n, 1, kSentinel);
    Expected want = reference(ta, tb, alpha, A, B, beta, C, m, n, k, 1);
    const std::vector<double> before = D.h;
    LtResult r1 = lt_matmul(ta, tb, alpha, A, B, beta, C, D);
    const std::vector<uint32_t> first = stored_bits(D, cd);
    bool pad_ok = false;
    const double worst = ran_ok(r1) ? compare(D, download(D), before, want, tol_for(cd), &pad_ok) : INFINITY;
    upload(D);  // the sentinels back
    LtResult r2 = lt_matmul(ta, tb, alpha, A, B, beta, C, D);
    const int rerun_diff = bits_differing(first, stored_bits(D, cd));
    upload(D);
    cpucuda::set_native_bf16_matmul(false);
    LtResult r3 = lt_matmul(ta, tb, alpha, A, B, beta, C, D);
    cpucuda::set_native_bf16_matmul(true);
    const int widened_diff = bits_differing(first, stored_bits(D, cd));
    const bool native_ran = is_bf16(cd) || widened_diff > 0;
    CHECK(ran_ok(r1) && ran_ok(r2) && ran_ok(r3) && worst <= 1.0 && pad_ok && rerun_diff == 0 && native_ran,
          "bf16 units: bf16*bf16->%s %s m=%d n=%d k=%d: worst err/tol %.3g%s, elements differing from a rerun %d "
          "(want 0), from the widened operands' sgemm %d%s",
          type_name(cd), layout_name(ta, tb), m, n, k, worst, pad_ok ? "" : ", padding overwritten", rerun_diff,
          widened_diff, is_bf16(cd) ? "" : " (want > 0)");
    for (Matrix* M : {&A, &B, &C, &D}) free_matrix(*M);
}

// --- the GELU epilogues over the whole range (CPU runtime) ---------------------------------
// The CPU runtime's GELU epilogues evaluate tanh in vectorised float code
// (cublaslt.cpp, tanh8), within 3e-7 of tanh. With k = 1 and op(B) = 1
// the product is x itself, exactly: GELU gives gelu(x) and DGELU (aux = x,
// product 1) gives gelu'(x), each held to the fp64 formula at a bound that
// follows from that error (4e-7 of tanh, the float rounding of the rest),
// over x in [-12, 12] and the values where the formula's terms overflow or
// vanish; NaN stays NaN, and gelu' of an infinity is its limit.
static std::vector<double> gelu_sweep() {
    std::vector<double> xs;
    for (int i = 0; i <= 2400; i++) xs.push_back(-12.0 + i * 0.01);
    for (double v : {0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4, 1e15, -1e15, 1e30,
                     -1e30, (double)INFINITY, -(double)INFINITY, (double)NAN})
        xs.push_back(v);
    while (xs.size() % 8 != 5) xs.push_back(0.5);  // a column length that leaves a tail of 5 after blocks of 8
    return xs;
}

// The operands whose product is x (k = 1): op(A) the x values (GELU) or ones
// (DGELU, whose aux is x), B = 1; C unused (NaN).
struct SweepOperands {
    Matrix A, B, C, aux;
};
static SweepOperands sweep_operands(const std::vector<double>& xs, bool grad) {
    const int m = (int)xs.size();
    SweepOperands o{make_matrix(CUDA_R_32F, m, 1, 1, kRandom), make_matrix(CUDA_R_32F, 1, 1, 1, kRandom),
                    make_matrix(CUDA_R_32F, m, 1, 1, kNaN),
                    make_matrix(CUDA_R_32F, m, 1, 1, kRandom, 1.0, (m + 7) / 8 * 8)};
    for (int i = 0; i < m; i++) {
        o.A.at(0, i, 0) = grad ? 1.0 : (double)(float)xs[i];
        o.aux.at(0, i, 0) = (double)(float)xs[i];
    }
    o.B.at(0, 0, 0) = 1.0;
    upload(o.A), upload(o.B), upload(o.aux);
    return o;
}

static void test_gelu_epilogue_range(bool grad) {
    const std::vector<double> xs = gelu_sweep();
    const int m = (int)xs.size();
    SweepOperands o = sweep_operands(xs, grad);
    Matrix &A = o.A, &B = o.B, &C = o.C, &aux = o.aux;
    Matrix D = make_matrix(CUDA_R_32F, m, 1, 1, kSentinel);
    Epilogue e;
    e.epilogue = grad ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_GELU;
    if (grad) e.aux = aux.d, e.aux_ld = aux.ld;
    LtResult r = lt_matmul(false, false, 1.0f, A, B, 0.0f, C, D, e);
    const std::vector<double> got = ran_ok(r) ? download(D) : std::vector<double>(m, NAN);
    double worst = 0, worst_x = 0;
    int nan_mismatch = 0;
    for (int i = 0; i < m; i++) {
        const double x = (double)(float)xs[i];
        // gelu'(+-inf): its limits, 1 and 0, where the formula gives inf * 0
        const double want = grad ? (std::isinf(x) ? (x > 0 ? 1.0 : 0.0) : gelu_grad(x)) : gelu(x);
        if (std::isnan(want) || std::isnan(got[i])) {
            nan_mismatch += std::isnan(want) != std::isnan(got[i]);
            continue;
        }
        if (std::isinf(want)) {
            nan_mismatch += got[i] != want;
            continue;
        }
        // d gelu / d tanh = x / 2; d gelu' / d tanh = 1/2 + |x t du| <= 1/2 + 2 |x| (1 + 3 * 0.044715 x^2)
        const double ax = fabs(x), dt = grad ? 0.5 + 2 * ax * (1 + 0.134145 * ax * ax) : 0.5 * ax;
        const double bound = 4e-7 * dt + 4 * 6e-8 * (fabs(want) + (grad ? 1.0 : ax));
        const double rel = fabs(got[i] - want) / bound;
        if (rel > worst) worst = rel, worst_x = x;
    }
    CHECK(ran_ok(r) && worst <= 1.0 && nan_mismatch == 0,
          "epilogue %s over x in [-12, 12] and %d more (the special values, padding): worst err/bound %.3g (at x = "
          "%g), NaN/inf "
          "mismatches %d",
          grad ? "DGELU: gelu'(x)" : "GELU: gelu(x)", m - 2401, worst, worst_x, nan_mismatch);
    for (Matrix* M : {&A, &B, &C, &D, &aux}) free_matrix(*M);
}

// --- the epilogue's AVX2 copy (CPU runtime) -----------------------------------------------
// Where the CPU has AVX2 the epilogues run as AVX2 code (cublaslt.cpp,
// AVX2_CODE), which must give bitwise the results of the portable copy: every
// forward epilogue and DGELU, all bf16 and all fp32, over random products (m not
// a multiple of 8: each column ends in a partial block) and over the GELU
// sweep's values (k = 1, op(B) = 1: the product is x), each run both ways.
static void epilogue_both_ways(const char* what, cublasLtEpilogue_t epi, const Matrix& A, const Matrix& B,
                               const Matrix& C, float beta, const Matrix& bias, Matrix& aux, cudaDataType_t cd) {
    const bool dgelu = epi == CUBLASLT_EPILOGUE_DGELU;
    const bool aux_out = epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool has_bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                          epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    Matrix D = make_matrix(cd, A.rows, B.cols, 1, kSentinel);
    Epilogue e;
    e.epilogue = epi;
    if (has_bias) e.bias = bias.d;
    if (aux_out || dgelu) e.aux = aux.d, e.aux_ld = aux.ld;
    std::vector<uint32_t> d_bits[2], aux_bits[2];
    bool ran = true;
    for (int pass = 0; pass < 2; pass++) {  // pass 0: AVX2, 1: portable
        cpucuda::set_matmul_vector_code(pass == 0);
        upload(D);
        if (aux_out) upload(aux);
        ran = ran_ok(lt_matmul(false, false, 1.0f, A, B, beta, C, D, e)) && ran;
        d_bits[pass] = stored_bits(D, cd);
        if (aux_out) aux_bits[pass] = stored_bits(aux, cd);
    }
    const int d_diff = bits_differing(d_bits[0], d_bits[1]), aux_diff = bits_differing(aux_bits[0], aux_bits[1]);
    std::vector<uint32_t> planted = d_bits[1];
    planted[planted.size() / 2] ^= 1u;  // the comparison sees a one-bit difference
    CHECK(ran && d_diff == 0 && aux_diff == 0 && bits_differing(d_bits[0], planted) == 1,
          "epilogue %s into %s, AVX2 copy bitwise the portable one: D elements differing %d, aux %d", what,
          type_name(cd), d_diff, aux_diff);
    free_matrix(D);
}

static void test_epilogue_vector_code() {
    const bool avx2 = cpucuda::set_matmul_vector_code(true);
    if (!avx2) {
        printf("SKIP the epilogue's AVX2 copy against its portable copy: this CPU has no AVX2\n");
        return;
    }
    const int m = 1003, n = 37, k = 64;
    for (cudaDataType_t cd : {CUDA_R_16BF, CUDA_R_32F}) {
        Matrix A = make_matrix(cd, m, k, 1, kRandom), B = make_matrix(cd, k, n, 1, kRandom);  // bf16 D: bf16 operands
        Matrix C = make_matrix(cd, m, n, 1, kRandom), bias = make_matrix(cd, m, 1, 1, kRandom);
        Matrix aux = make_matrix(cd, m, n, 1, kRandom, 3.0, (m + 7) / 8 * 8);
        for (auto& ep : kEpilogues)  // BGRADB: its bias gradient is no step of finish_block
            if (ep.e != CUBLASLT_EPILOGUE_BGRADB) epilogue_both_ways(ep.name, ep.e, A, B, C, 0.5f, bias, aux, cd);
        for (Matrix* M : {&A, &B, &C, &bias, &aux}) free_matrix(*M);
    }
    // GELU and DGELU of the sweep's values, the special ones included
    const std::vector<double> xs = gelu_sweep();
    const int mx = (int)xs.size();
    for (int grad = 0; grad < 2; grad++) {
        SweepOperands o = sweep_operands(xs, grad);
        Matrix none = make_matrix(CUDA_R_32F, mx, 1, 1, kRandom);  // no bias
        epilogue_both_ways(grad ? "DGELU over the GELU sweep" : "GELU over the GELU sweep",
                           grad ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_GELU, o.A, o.B, o.C, 0.0f, none, o.aux,
                           CUDA_R_32F);
        for (Matrix* M : {&o.A, &o.B, &o.C, &none, &o.aux}) free_matrix(*M);
    }
    cpucuda::set_matmul_vector_code(true);
}

static void test_bf16_native() {
    if (!cpucuda::set_native_bf16_matmul(true)) {
        printf("SKIP bf16 matmuls on the CPU's bf16 units: this CPU has none that oneDNN uses (AVX512-BF16 or AMX)\n");
        return;
    }
    for (int along_m = 0; along_m < 2; along_m++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (cudaDataType_t cd : {CUDA_R_16BF, CUDA_R_32F}) test_bf16_native_case(along_m, ta, tb, cd);
}
#endif

// --- refusals ----------------------------------------------------------------------------

// A combination that must not run: the heuristic offers nothing and
// cublasLtMatmul (algo NULL) fails. On the CPU runtime the status is exactly
// `expected`; the real library may word it differently.
static void expect_refused(const char* what, cublasStatus_t expected, cudaDataType_t ab_a, cudaDataType_t ab_b,
                           cudaDataType_t cd, bool ta = false, bool tb = false, int batch = 1,
                           const Epilogue& e_in = Epilogue(), const Options& o = Options(), int a_ld = 0,
                           int b_rows_delta = 0) {
    const int m = 8, n = 8, k = 8;
    Matrix A = make_matrix(ab_a, ta ? k : m, ta ? m : k, batch, kRandom, 1.0, a_ld);
    Matrix B = make_matrix(ab_b, (tb ? n : k) + b_rows_delta, tb ? k : n, batch, kRandom);
    Matrix C = make_matrix(cd, m, n, batch, kRandom);
    Matrix D = make_matrix(cd, m, n, batch, kSentinel);
    Matrix bias = make_matrix(cd, m, 1, 1, kRandom);
    Matrix aux = make_matrix(cd, m, n, 1, kRandom, 1.0, 8);
    Epilogue e = e_in;
    if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        e.bias = bias.d;
        e.aux = aux.d;
        e.aux_ld = aux.ld;
    }
    LtResult r = lt_matmul(ta, tb, 1.0f, A, B, 0.0f, C, D, e, o, /*run_anyway=*/true);
    bool refused = !r.algo_ok && r.matmul != CUBLAS_STATUS_SUCCESS;
#ifdef CPUCUDA
    refused = refused && r.heuristic == expected && r.returned == 0 && r.matmul == expected;
#endif
    CHECK(refused, "refused: %s: heuristic %s (%d results), matmul %s (expected %s)", what,
          cublasLtGetStatusName(r.heuristic), r.returned, cublasLtGetStatusName(r.matmul),
          cublasLtGetStatusName(expected));
    for (Matrix* M : {&A, &B, &C, &D, &bias, &aux}) free_matrix(*M);
}

static void test_refusals() {
    const cudaDataType_t F = CUDA_R_32F, H = CUDA_R_16BF;
    // Refused by the real cuBLASLt too.
    expect_refused("f32 A/B with bf16 C/D", CUBLAS_STATUS_NOT_SUPPORTED, F, F, H);
    expect_refused("A f32 with B bf16", CUBLAS_STATUS_NOT_SUPPORTED, F, H, F);
    expect_refused("lda < rows of A", CUBLAS_STATUS_INVALID_VALUE, F, F, F, false, false, 1, Epilogue(), Options(),
                   /*a_ld=*/4);
    expect_refused("rows of B != k", CUBLAS_STATUS_INVALID_VALUE, F, F, F, false, false, 1, Epilogue(), Options(), 0,
                   /*b_rows_delta=*/2);
#ifdef CPUCUDA
    // Supported by the real cuBLASLt but not by the CPU runtime, which must say so.
    Epilogue relu;
    relu.epilogue = CUBLASLT_EPILOGUE_RELU;
    expect_refused("CPU runtime: epilogue RELU", CUBLAS_STATUS_NOT_SUPPORTED, H, H, H, true, false, 1, relu);
    Epilogue bgrada;
    bgrada.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    expect_refused("CPU runtime: epilogue BGRADA", CUBLAS_STATUS_NOT_SUPPORTED, H, H, H, false, true, 1, bgrada);
    Epilogue dgelu_bgrad;
    dgelu_bgrad.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    expect_refused("CPU runtime: epilogue DGELU_BGRAD", CUBLAS_STATUS_NOT_SUPPORTED, H, H, H, false, false, 1,
                   dgelu_bgrad);
    Epilogue gelu_aux;
    gelu_aux.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    expect_refused("CPU runtime: epilogue GELU_AUX with batch count 2", CUBLAS_STATUS_NOT_SUPPORTED, H, H, H, true,
                   false, 2, gelu_aux);
    Epilogue bias;
    bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
    expect_refused("CPU runtime: epilogue BIAS with batch count 2", CUBLAS_STATUS_NOT_SUPPORTED, F, F, F, true, false,
                   2, bias);
    expect_refused("CPU runtime: fp16 A/B/C/D", CUBLAS_STATUS_NOT_SUPPORTED, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F);
    Options row;
    row.row_order = true;
    expect_refused("CPU runtime: CUBLASLT_ORDER_ROW", CUBLAS_STATUS_NOT_SUPPORTED, F, F, F, false, false, 1, Epilogue(),
                   row);
    Options dev;
    dev.device_pointer_mode = true;
    expect_refused("CPU runtime: device pointer mode", CUBLAS_STATUS_NOT_SUPPORTED, F, F, F, false, false, 1,
                   Epilogue(), dev);
    Options f64;
    f64.compute = CUBLAS_COMPUTE_64F;
    f64.scale = CUDA_R_64F;
    expect_refused("CPU runtime: compute type 64F", CUBLAS_STATUS_NOT_SUPPORTED, F, F, F, false, false, 1, Epilogue(),
                   f64);
#endif
}

// --- descriptor attributes -----------------------------------------------------------------

static void test_attributes() {
    cublasLtMatmulDesc_t desc;
    LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, got = CUBLAS_OP_N;
    size_t written = 0;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    cublasStatus_t st = cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &got, sizeof(got), &written);
    CHECK(st == CUBLAS_STATUS_SUCCESS && got == CUBLAS_OP_T && written == sizeof(got),
          "attributes: TRANSA set to T reads back as T (%d, %zu bytes)", (int)got, written);
    int64_t too_big = 1;
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &too_big, sizeof(too_big));
    CHECK(st == CUBLAS_STATUS_INVALID_VALUE, "attributes: TRANSA with an 8-byte value is refused (%s)",
          cublasLtGetStatusName(st));
#ifdef CPUCUDA
    int32_t any = 0;
    st = cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)9999, &any, sizeof(any));
    CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED, "attributes: CPU runtime refuses an unknown attribute (%s)",
          cublasLtGetStatusName(st));
#endif
    LT_OK(cublasLtMatmulDescDestroy(desc));

    cublasLtMatrixLayout_t layout;
    LT_OK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 5, 7, 8));
    uint64_t rows = 0;
    int64_t ld = 0;
    LT_OK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), &written));
    LT_OK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), &written));
    CHECK(rows == 5 && ld == 8, "attributes: layout rows %llu and ld %lld read back", (unsigned long long)rows,
          (long long)ld);
    LT_OK(cublasLtMatrixLayoutDestroy(layout));
}

// Every layout and type combination, each alpha/beta scenario; then strided batches.
static void test_layouts() {
    for (TypeCombo tc : kCombos)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (Scenario sc : {kBeta0NaN, kBeta1InPlace, kGeneral, kAlpha0}) test_plain(tc, ta, tb, 1, sc);
    for (TypeCombo tc : kCombos)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) test_plain(tc, ta, tb, 3, kGeneral);
}

// Every epilogue in every layout and type that this cuBLASLt runs.
static void test_epilogues() {
    struct {
        cublasLtEpilogue_t e;
        const char* name;
    } forward[] = {{CUBLASLT_EPILOGUE_BIAS, "BIAS"},
                   {CUBLASLT_EPILOGUE_GELU, "GELU"},
                   {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"},
                   {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"},
                   {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"}};
    for (TypeCombo tc : kCombos)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                for (auto& f : forward)
                    if (epilogue_tested(tc, ta, tb, f.e, true, false)) test_forward_epilogue(tc, ta, tb, f.e, f.name);
                if (epilogue_tested(tc, ta, tb, CUBLASLT_EPILOGUE_DGELU, false, false)) test_dgelu(tc, ta, tb);
                if (epilogue_tested(tc, ta, tb, CUBLASLT_EPILOGUE_BGRADB, false, true)) test_bgradb(tc, ta, tb);
            }
#ifndef CPUCUDA
    printf("SKIP epilogues GELU*, DGELU, BGRADB and BIAS in other layouts or types: not used by the trainer\n");
#endif
}

int main() {
    LT_OK(cublasLtCreate(&g_lt));
    CUDA_OK(cudaMalloc(&g_workspace, kWorkspaceBytes));
    printf("cuBLASLt version %zu\n", cublasLtGetVersion());
    TEST_CASE(test_layouts());
    TEST_CASE(test_bf16_rounding());
    TEST_CASE(test_epilogues());
#ifdef CPUCUDA
    TEST_CASE(test_bf16_bitwise());
    TEST_CASE(test_bf16_native());
    TEST_CASE(test_gelu_epilogue_range(false));
    TEST_CASE(test_gelu_epilogue_range(true));
    TEST_CASE(test_epilogue_vector_code());
#endif
    TEST_CASE(test_refusals());
    TEST_CASE(test_attributes());
    CUDA_OK(cudaFree(g_workspace));
    LT_OK(cublasLtDestroy(g_lt));
    return test_summary("test_cublaslt");
}
