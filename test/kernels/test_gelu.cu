// The tanh-approximated GELU (llmc/kernels/gelu.cuh): forward and the in-place backward,
// on special values and on sizes past the bounded grid.
#include "llmc/kernels/gelu.cuh"
#include "test/kernels/kernel_test.h"

static void test_gelu(size_t n) {
    g_rng.seed(300);
    auto inp = randx(n, -6, 6);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 10.0f, -10.0f, 1e-3f};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && k < n; k++) inp[k] = from_float<floatX>(special[k]);
    const auto dout = randx(n, -1, 1);
    Dev d;
    floatX *d_inp = d.up(inp), *d_d = d.up(dout), *d_out = d.alloc<floatX>(n);
    gelu_forward(d_out, d_inp, n, g_stream);
    gelu_backward_inplace(d_d, d_inp, n, g_stream);
    const auto out = dbl(to_host(d_out, n)), dd = dbl(to_host(d_d, n));
    std::vector<double> rf(n), rb(n);
    const double k = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < n; i++) {
        const double x = to_float(inp[i]), u = k * (x + 0.044715 * x * x * x), th = std::tanh(u);
        rf[i] = 0.5 * x * (1 + th);
        rb[i] = to_float(dout[i]) * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x));
    }
    const double ef = norm_err(out, rf), eb = norm_err(dd, rb);
    CHECK(ef <= TOL_X, "gelu_forward n=%zu (norm err %.2e <= %.1e)", n, ef, TOL_X);
    CHECK(eb <= TOL_X, "gelu_backward_inplace n=%zu (norm err %.2e <= %.1e)", n, eb, TOL_X);
}

int main() {
    kernel_test_begin("test_gelu");
    TEST_CASE(test_gelu(1037));
    TEST_CASE(test_gelu(200003));             // more elements than the bounded grid has threads
    TEST_CASE(test_gelu(200008));             // a multiple of 8: 16-byte accesses (bf16)
    return kernel_test_end("test_gelu");
}
