// Linear layers (llmc/kernels/matmul.cuh) against plain C++ in double: the forward with
// its bias epilogue, the input gradient, the fp32 weight gradient accumulated
// with beta = 1, the bias gradient (BGRADB epilogue, and the deterministic
// column-sum kernel), and the Linear + GELU passes fused into cuBLASLt's
// epilogues (GELU_AUX_BIAS, DGELU) and not.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/kernels/matmul.cuh"
#include "test/test_device.h"

#if defined(ENABLE_FP32)
static const double TOL = 1e-5;
#else
static const double TOL = 1e-2;  // bf16 outputs: 8 mantissa bits
#endif

// Rounds through floatX so both sides see identical inputs.
static std::vector<floatX> random_floatx(size_t n, std::mt19937& rng, std::vector<double>* exact) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<floatX> v(n);
    exact->resize(n);
    for (size_t i = 0; i < n; i++) {
        v[i] = from_float<floatX>(dist(rng));
        (*exact)[i] = to_float(v[i]);
    }
    return v;
}

// max |a - b| / max |b|: errors relative to the tensor's scale.
template <class T>
static double scaled_err(const std::vector<T>& got, const std::vector<double>& want) {
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); i++) scale = std::fmax(scale, std::fabs(want[i]));
    for (size_t i = 0; i < want.size(); i++) {
        double d = std::fabs((double)to_float(got[i]) - want[i]);
        if (!(d <= worst)) worst = d;
    }
    return worst / scale;
}

static void check_shape(int N, int IC, int OC, std::mt19937& rng) {
    std::vector<double> inp, w, b, dout;
    auto h_inp = random_floatx((size_t)N * IC, rng, &inp);
    auto h_w = random_floatx((size_t)OC * IC, rng, &w);
    auto h_b = random_floatx(OC, rng, &b);
    auto h_dout = random_floatx((size_t)N * OC, rng, &dout);
    std::vector<float> h_dw0((size_t)OC * IC), h_db0(OC);
    for (auto& x : h_dw0) x = 0.25f;
    for (auto& x : h_db0) x = -0.5f;

    floatX *d_inp = to_device(h_inp), *d_w = to_device(h_w), *d_b = to_device(h_b), *d_dout = to_device(h_dout);
    float *d_dw = to_device(h_dw0), *d_db = to_device(h_db0);
    floatX *d_out, *d_dinp;
    float* scratch;
    CUDA_OK(cudaMalloc(&d_out, (size_t)N * OC * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_dinp, (size_t)N * IC * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&scratch, bias_backward_scratch_floats(OC) * sizeof(float)));

    matmul_forward(d_out, d_inp, d_w, d_b, N, IC, OC, 0);
    // Twice: the weight and bias gradients must accumulate (0.25 + 2 * dW).
    matmul_backward(d_dinp, d_dw, d_db, scratch, d_dout, d_inp, d_w, N, IC, OC, 0);
    matmul_backward(d_dinp, d_dw, d_db, scratch, d_dout, d_inp, d_w, N, IC, OC, 0);
    CUDA_OK(cudaDeviceSynchronize());

    std::vector<double> out((size_t)N * OC), dinp((size_t)N * IC), dw((size_t)OC * IC), db(OC);
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int i = 0; i < IC; i++) s += inp[(size_t)r * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)r * OC + o] = s;
        }
    for (int r = 0; r < N; r++)
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += dout[(size_t)r * OC + o] * w[(size_t)o * IC + i];
            dinp[(size_t)r * IC + i] = s;
        }
    for (int o = 0; o < OC; o++) {
        double sb = 0;
        for (int r = 0; r < N; r++) sb += dout[(size_t)r * OC + o];
        db[o] = -0.5 + 2 * sb;
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int r = 0; r < N; r++) s += dout[(size_t)r * OC + o] * inp[(size_t)r * IC + i];
            dw[(size_t)o * IC + i] = 0.25 + 2 * s;
        }
    }
    double e_out = scaled_err(to_host(d_out, out.size()), out);
    double e_dinp = scaled_err(to_host(d_dinp, dinp.size()), dinp);
    double e_dw = scaled_err(to_host(d_dw, dw.size()), dw);
    double e_db = scaled_err(to_host(d_db, db.size()), db);
    CHECK(e_out <= TOL, "forward with bias N=%d IC=%d OC=%d: err %.2e", N, IC, OC, e_out);
    CHECK(e_dinp <= TOL, "input gradient N=%d IC=%d OC=%d: err %.2e", N, IC, OC, e_dinp);
    // fp32 accumulation: tight even in the bf16 build (inputs are exact).
    CHECK(e_dw <= 1e-5, "weight gradient accumulated in fp32 N=%d IC=%d OC=%d: err %.2e", N, IC, OC, e_dw);
    CHECK(e_db <= 1e-5, "bias gradient accumulated N=%d OC=%d: err %.2e", N, OC, e_db);

    // The hand-written bias column sum (used where cuBLASLt has no BGRADB
    // algorithm): the same values, and the same bits on a rerun.
    std::vector<float> kernel_db[2];
    for (auto& result : kernel_db) {
        CUDA_OK(cudaMemcpy(d_db, h_db0.data(), OC * sizeof(float), cudaMemcpyHostToDevice));
        bias_backward(d_db, scratch, d_dout, N, OC, 0);
        bias_backward(d_db, scratch, d_dout, N, OC, 0);
        result = to_host(d_db, OC);
    }
    const double e_kernel = scaled_err(kernel_db[0], db);
    CHECK(e_kernel <= 1e-5, "bias_backward kernel N=%d OC=%d: err %.2e", N, OC, e_kernel);
    CHECK(memcmp(kernel_db[0].data(), kernel_db[1].data(), OC * sizeof(float)) == 0,
          "bias_backward kernel bitwise reproducible N=%d OC=%d", N, OC);

    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_b, (void*)d_dout, (void*)d_dw, (void*)d_db, (void*)d_out,
                    (void*)d_dinp, (void*)scratch})
        CUDA_OK(cudaFree(p));
}

static double gelu_ref(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1 + std::tanh(u));
}
static double gelu_grad_ref(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// pre = inp @ w^T + b, out = gelu(pre); then the backward of the next Linear
// (weight w2: OC -> IC2) through the GELU: dpre = (dout2 @ w2) * gelu'(pre).
// Both with the epilogues (fuse) and with the kernels; the references use the
// device's own pre (so the two halves are checked separately).
static void check_gelu_shape(int N, int IC, int OC, bool fuse, std::mt19937& rng) {
    const int OC2 = 24;
    std::vector<double> inp, w, b, w2, dout2;
    auto h_inp = random_floatx((size_t)N * IC, rng, &inp);
    auto h_w = random_floatx((size_t)OC * IC, rng, &w);
    auto h_b = random_floatx(OC, rng, &b);
    auto h_w2 = random_floatx((size_t)OC2 * OC, rng, &w2);
    auto h_dout2 = random_floatx((size_t)N * OC2, rng, &dout2);
    floatX *d_inp = to_device(h_inp), *d_w = to_device(h_w), *d_b = to_device(h_b), *d_w2 = to_device(h_w2),
           *d_dout2 = to_device(h_dout2);
    floatX *d_pre, *d_out, *d_dpre;
    float *d_dw2, *d_db2, *scratch;
    CUDA_OK(cudaMalloc(&d_pre, (size_t)N * OC * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_out, (size_t)N * OC * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_dpre, (size_t)N * OC * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_dw2, (size_t)OC2 * OC * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_db2, OC2 * sizeof(float)));
    CUDA_OK(cudaMalloc(&scratch, bias_backward_scratch_floats(OC2) * sizeof(float)));
    CUDA_OK(cudaMemset(d_dw2, 0, (size_t)OC2 * OC * sizeof(float)));
    CUDA_OK(cudaMemset(d_db2, 0, OC2 * sizeof(float)));

    matmul_forward_gelu(d_out, d_pre, d_inp, d_w, d_b, N, IC, OC, fuse, 0);
    matmul_backward_gelu(d_dpre, d_dw2, d_db2, scratch, d_dout2, d_out, d_pre, d_w2, N, OC, OC2, fuse, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<floatX> pre_dev = to_host(d_pre, (size_t)N * OC);

    std::vector<double> pre((size_t)N * OC), out((size_t)N * OC), dpre((size_t)N * OC), dw2((size_t)OC2 * OC);
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int i = 0; i < IC; i++) s += inp[(size_t)r * IC + i] * w[(size_t)o * IC + i];
            pre[(size_t)r * OC + o] = s;
            out[(size_t)r * OC + o] = gelu_ref(to_float(pre_dev[(size_t)r * OC + o]));
        }
    const std::vector<floatX> out_dev = to_host(d_out, out.size());
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int j = 0; j < OC2; j++) s += dout2[(size_t)r * OC2 + j] * w2[(size_t)j * OC + o];
            dpre[(size_t)r * OC + o] = s * gelu_grad_ref(to_float(pre_dev[(size_t)r * OC + o]));
        }
    for (int j = 0; j < OC2; j++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int r = 0; r < N; r++) s += dout2[(size_t)r * OC2 + j] * to_float(out_dev[(size_t)r * OC + o]);
            dw2[(size_t)j * OC + o] = s;
        }
    const char* how = fuse ? "cuBLASLt epilogues" : "kernels";
    const double e_pre = scaled_err(pre_dev, pre), e_out = scaled_err(out_dev, out);
    const double e_dpre = scaled_err(to_host(d_dpre, dpre.size()), dpre),
                 e_dw2 = scaled_err(to_host(d_dw2, dw2.size()), dw2);
    CHECK(e_pre <= TOL, "Linear + GELU (%s) N=%d IC=%d OC=%d: pre-GELU err %.2e", how, N, IC, OC, e_pre);
    CHECK(e_out <= TOL, "Linear + GELU (%s) N=%d IC=%d OC=%d: gelu(pre) err %.2e", how, N, IC, OC, e_out);
    CHECK(e_dpre <= TOL, "backward through GELU (%s) N=%d OC=%d: (dout @ w) * gelu'(pre) err %.2e", how, N, OC, e_dpre);
    CHECK(e_dw2 <= 1e-5, "backward through GELU (%s) N=%d OC=%d: weight gradient from gelu(pre) err %.2e", how, N, OC,
          e_dw2);
    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_b, (void*)d_w2, (void*)d_dout2, (void*)d_pre, (void*)d_out,
                    (void*)d_dpre, (void*)d_dw2, (void*)d_db2, (void*)scratch})
        CUDA_OK(cudaFree(p));
}

// The fused epilogues the trainer asks for are taken, not silently replaced by
// the kernels: on this runtime always (it implements them); on a GPU the
// result says what the installed cuBLASLt does.
static void check_epilogues_taken() {
    floatX *a, *b, *aux, *out;
    float *d, *bias_grad;
    CUDA_OK(cudaMalloc(&a, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&b, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&aux, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&out, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d, 64 * 64 * sizeof(float)));
    CUDA_OK(cudaMalloc(&bias_grad, 64 * sizeof(float)));
    CUDA_OK(cudaMemset(a, 0, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMemset(b, 0, 64 * 64 * sizeof(floatX)));
    CUDA_OK(cudaMemset(d, 0, 64 * 64 * sizeof(float)));
    const bool gelu_aux_bias = matmul_cublaslt(out, FLOATX_CUDA_TYPE, a, b, 64, 64, 64, true, false, 0.0f,
                                               Epilogue{CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b, aux}, 0);
    const bool dgelu = matmul_cublaslt(out, FLOATX_CUDA_TYPE, a, b, 64, 64, 64, false, false, 0.0f,
                                       Epilogue{CUBLASLT_EPILOGUE_DGELU, nullptr, aux}, 0);
    const bool bgradb = matmul_cublaslt(d, CUDA_R_32F, a, b, 64, 64, 64, false, true, 1.0f,
                                        Epilogue{CUBLASLT_EPILOGUE_BGRADB, bias_grad}, 0);
    CUDA_OK(cudaDeviceSynchronize());
#ifdef CPUCUDA
    CHECK(gelu_aux_bias && dgelu && bgradb, "the CPU runtime's cuBLASLt takes GELU_AUX_BIAS, DGELU and BGRADB");
#else
    printf("INFO cuBLASLt epilogues taken: GELU_AUX_BIAS %s, DGELU %s, BGRADB (fp32 D) %s\n",
           gelu_aux_bias ? "yes" : "no", dgelu ? "yes" : "no", bgradb ? "yes" : "no");
#endif
    for (void* p : {(void*)a, (void*)b, (void*)aux, (void*)out, (void*)d, (void*)bias_grad}) CUDA_OK(cudaFree(p));
}

// The error rule (llmc/error.h): a failed CUDA or cuBLASLt call throws
// llmc::Error naming the call's file and line; nothing is printed, nothing exits.
static void check_errors_throw() {
    std::string cuda = "NO ERROR", cublas = "NO ERROR";
    try {
        cudaCheck(cudaErrorInvalidValue);
    } catch (const llmc::Error& e) {
        cuda = e.what();
    }
    try {
        cublasCheck(CUBLAS_STATUS_INVALID_VALUE);
    } catch (const llmc::Error& e) {
        cublas = e.what();
    }
    CHECK(cuda.rfind("CUDA: ", 0) == 0 && cuda.find("test_matmul.cu:") != std::string::npos,
          "cudaCheck of a failed call throws llmc::Error: %s", cuda.c_str());
    CHECK(cublas.rfind("cuBLASLt: ", 0) == 0 && cublas.find("test_matmul.cu:") != std::string::npos,
          "cublasCheck of a failed call throws llmc::Error: %s", cublas.c_str());
}

int main() {
    check_errors_throw();
    matmul_setup();
    std::mt19937 rng(42);
    TEST_CASE(check_shape(1, 8, 8, rng));
    TEST_CASE(check_shape(37, 40, 24, rng));
    TEST_CASE(check_shape(256, 64, 192, rng));
    TEST_CASE(check_shape(5000, 16, 33, rng));  // many row chunks, ragged column block
    TEST_CASE(check_gelu_shape(40, 32, 64, true, rng));   // fused into cuBLASLt's epilogues
    TEST_CASE(check_gelu_shape(300, 16, 24, true, rng));
    TEST_CASE(check_gelu_shape(40, 32, 64, false, rng));  // separate kernels
    TEST_CASE(check_gelu_shape(300, 16, 24, false, rng));
    TEST_CASE(check_epilogues_taken());
    matmul_teardown();
    return test_summary("test_matmul");
}
