// SwiGLU (llmc/kernels/swiglu.cuh): the forward out = silu(gate) * up on the fused
// [gate | up] rows, and the backward into dgate | dup, out of place and in
// place, on special values and on sizes past the bounded grid; the reference
// gradient itself against central differences. Each bound is also shown able
// to fail: the same metric rejects the halves swapped (silu(up) * gate).
//
// Bounds: every output is one rounding to floatX of a product computed in fp32
// from the same floatX inputs as the reference (expf within 2 ulp): TOL_X
// (kernel_test.h). Measured: 6e-4 to 3.5e-3 of the tensor's largest value in
// the bf16 build (one rounding: at most 2^-8 = 3.9e-3), 2e-8 to 4e-7 in the fp32 build.
#include "llmc/kernels/swiglu.cuh"
#include "test/kernels/kernel_test.h"

static double silu_ref(double g) { return g / (1.0 + std::exp(-g)); }
static double silu_grad_ref(double g) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    return s * (1.0 + g * (1.0 - s));
}

static void test_swiglu_reference_gradient() {
    double worst = 0;
    for (double g = -12; g <= 12; g += 0.37) {
        const double h = 1e-6, fd = (silu_ref(g + h) - silu_ref(g - h)) / (2 * h);
        worst = std::max(worst, std::fabs(fd - silu_grad_ref(g)));
    }
    CHECK(worst < 1e-8, "silu reference gradient matches central differences on [-12, 12] (max abs err %.1e)", worst);
}

// Reference of one (rows, 2F) input: out (rows, F), and dinp (rows, 2F) from dout.
// swapped: the halves taken the other way round (the planted wrong layout).
static void swiglu_ref(const std::vector<double>& x, const std::vector<double>& dy, size_t rows, int F,
                       std::vector<double>& out, std::vector<double>& dx, bool swapped = false) {
    out.assign(rows * F, 0.0);
    dx.assign(rows * 2 * F, 0.0);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < F; c++) {
            const size_t gi = r * 2 * F + c + (swapped ? F : 0), ui = r * 2 * F + c + (swapped ? 0 : F);
            const double g = x[gi], u = x[ui], d = dy[r * F + c];
            out[r * F + c] = silu_ref(g) * u;
            dx[gi] = d * u * silu_grad_ref(g);
            dx[ui] = d * silu_ref(g);
        }
}

static void test_swiglu(size_t rows, int F) {
    g_rng.seed(600 + rows + F);
    const size_t n = rows * F;
    auto inp = randx(2 * n, -6, 6);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 30.0f, -30.0f, 1e-3f, -90.0f};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && k < (size_t)F; k++)
        inp[k] = from_float<floatX>(special[k]);
    const auto dout = randx(n, -1, 1);
    Dev d;
    floatX *d_inp = d.up(inp), *d_dout = d.up(dout), *d_out = d.alloc<floatX>(n), *d_dinp = d.alloc<floatX>(2 * n);
    swiglu_forward(d_out, d_inp, rows, F, g_stream);
    swiglu_backward(d_dinp, d_dout, d_inp, rows, F, g_stream);
    const auto out = to_host(d_out, n), dinp = to_host(d_dinp, 2 * n);
    std::vector<double> rout, rdx, wout, wdx;
    swiglu_ref(dbl(inp), dbl(dout), rows, F, rout, rdx);
    swiglu_ref(dbl(inp), dbl(dout), rows, F, wout, wdx, true);
    // dgate and dup apart: each has its own scale
    std::vector<double> dg, du, rdg, rdu;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < F; c++) {
            dg.push_back(to_float(dinp[r * 2 * F + c]));
            du.push_back(to_float(dinp[r * 2 * F + F + c]));
            rdg.push_back(rdx[r * 2 * F + c]);
            rdu.push_back(rdx[r * 2 * F + F + c]);
        }
    const double ef = norm_err(dbl(out), rout), eg = norm_err(dg, rdg), eu = norm_err(du, rdu);
    CHECK(ef <= TOL_X, "swiglu_forward rows=%zu F=%d (norm err %.2e <= %.1e)", rows, F, ef, TOL_X);
    CHECK(eg <= TOL_X && eu <= TOL_X, "swiglu_backward rows=%zu F=%d dgate, dup (norm err %.2e, %.2e <= %.1e)", rows, F,
          eg, eu, TOL_X);
    const double wf = norm_err(dbl(out), wout), wb = norm_err(dbl(dinp), wdx);
    CHECK(wf > TOL_X && wb > TOL_X,
          "swiglu rows=%zu F=%d: the bound rejects gate and up swapped (norm err %.2e, %.2e > %.1e)", rows, F, wf, wb,
          TOL_X);

    // in place: the gradient overwrites the activation it is computed from
    swiglu_backward(d_inp, d_dout, d_inp, rows, F, g_stream);
    CHECK(same_bits(to_host(d_inp, 2 * n), dinp),
          "swiglu_backward rows=%zu F=%d in place (dinp = inp): bitwise as out of place", rows, F);
}

int main() {
    kernel_test_begin("test_swiglu");
    TEST_CASE(test_swiglu_reference_gradient());
    TEST_CASE(test_swiglu(37, 40));
    TEST_CASE(test_swiglu(3, 11008 / 4));     // Llama-like hidden size
    TEST_CASE(test_swiglu(250, 800));         // more packs than the bounded grid has threads
    TEST_CASE(test_swiglu(7, 36));            // F not a multiple of 8: one element per access
    return kernel_test_end("test_swiglu");
}
