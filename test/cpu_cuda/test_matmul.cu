// Linear layers (llmc/matmul.cuh) against plain C++ in double: the forward with
// its bias epilogue, the input gradient, the fp32 weight gradient accumulated
// with beta = 1, and the deterministic bias-gradient column sum.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/matmul.cuh"
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

    // Determinism of the bias column sum: the same bits on a rerun.
    std::vector<float> first = to_host(d_db, OC);
    CUDA_OK(cudaMemcpy(d_db, h_db0.data(), OC * sizeof(float), cudaMemcpyHostToDevice));
    bias_backward(d_db, scratch, d_dout, N, OC, 0);
    bias_backward(d_db, scratch, d_dout, N, OC, 0);
    std::vector<float> second = to_host(d_db, OC);
    CHECK(memcmp(first.data(), second.data(), OC * sizeof(float)) == 0, "bias gradient bitwise reproducible N=%d OC=%d", N, OC);

    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_b, (void*)d_dout, (void*)d_dw, (void*)d_db, (void*)d_out,
                    (void*)d_dinp, (void*)scratch})
        CUDA_OK(cudaFree(p));
}

int main() {
    matmul_setup();
    std::mt19937 rng(42);
    check_shape(1, 8, 8, rng);
    check_shape(37, 40, 24, rng);
    check_shape(256, 64, 192, rng);
    check_shape(5000, 16, 33, rng);  // many row chunks, ragged column block
    matmul_teardown();
    return test_summary("test_matmul");
}
