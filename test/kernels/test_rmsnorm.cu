// RMS normalisation (llmc/kernels/rmsnorm.cuh): the forward with its saved rstd, the
// fused residual + rmsnorm forward, and the backward into pre-filled
// gradients; the reference backward itself against central differences of the
// reference forward. Each bound is also shown able to fail: the same metric
// rejects a layernorm's output (the mean subtracted) and a backward that
// treats rstd as a constant.
//
// Bounds: out and dinp are one rounding to floatX of a value computed in fp32
// from the same floatX inputs as the reference, so TOL_X (kernel_test.h);
// rstd and dweight are fp32 sums, TOL_F32. Measured, bf16 build: out 1.9e-3 to
// 2.8e-3, dinp 2.0e-3 to 3.4e-3 (one rounding: at most bf16's unit roundoff
// 2^-8 = 3.9e-3), rstd and dweight 4e-8 to 4e-7; fp32 build: out and dinp about 1e-7.
#include "llmc/kernels/rmsnorm.cuh"
#include "test/kernels/kernel_test.h"

constexpr double RMS_EPS = 1e-5;

// Reference forward of one row in double. centered: subtract the row mean
// first (a layernorm without bias), the planted wrong formula.
static void rms_row_ref(const double* x, const double* w, int C, double* y, double* rs, bool centered = false) {
    double m = 0, s = 0;
    if (centered) {
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
    }
    for (int c = 0; c < C; c++) s += (x[c] - m) * (x[c] - m);
    const double r = 1.0 / std::sqrt(s / C + RMS_EPS);
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c];
    *rs = r;
}

// Reference backward of one row, re-derived: y_j = x_j rs w_j, rs = (mean(x^2) + eps)^(-1/2),
// d rs / d x_i = -rs^3 x_i / C, so with g = dy w and xhat = x rs:
// dx_i = rs g_i - (rs^3 x_i / C) sum_j g_j x_j = rs (g_i - xhat_i mean(g xhat)).
// rstd_const: drop the second term (rs taken as a constant), the planted wrong gradient.
static void rms_row_bwd_ref(const double* x, const double* w, const double* dy, double rs, int C, double* dx,
                            double* dw, bool rstd_const = false) {
    double mgx = 0;
    for (int c = 0; c < C; c++) {
        const double xh = x[c] * rs;
        mgx += dy[c] * w[c] * xh;
        dw[c] += dy[c] * xh;
    }
    mgx = rstd_const ? 0.0 : mgx / C;
    for (int c = 0; c < C; c++) dx[c] += rs * (dy[c] * w[c] - x[c] * rs * mgx);
}

static void test_rmsnorm_reference_gradient() {
    g_rng.seed(11);
    const int C = 40;
    std::vector<double> x = dbl(randf(C, -2, 3)), w = dbl(randf(C, 0.5f, 1.5f));
    const std::vector<double> dy = dbl(randf(C, -1, 1));
    std::vector<double> y(C), dx(C, 0.0), dw(C, 0.0), fd(C);
    double rs;
    rms_row_ref(x.data(), w.data(), C, y.data(), &rs);
    rms_row_bwd_ref(x.data(), w.data(), dy.data(), rs, C, dx.data(), dw.data());
    auto loss = [&]() {
        double r, L = 0;
        rms_row_ref(x.data(), w.data(), C, y.data(), &r);
        for (int c = 0; c < C; c++) L += dy[c] * y[c];
        return L;
    };
    const double h = 1e-5;
    for (int c = 0; c < C; c++) {
        const double x0 = x[c];
        x[c] = x0 + h;
        const double up = loss();
        x[c] = x0 - h;
        const double down = loss();
        x[c] = x0;
        fd[c] = (up - down) / (2 * h);
    }
    const double e = norm_err(dx, fd);
    CHECK(e < 1e-7, "rmsnorm reference dx matches central differences of the forward (norm err %.2e)", e);
}

static void test_rmsnorm(int N, int C) {
    g_rng.seed(400 + N * 7 + C);
    const size_t NC = (size_t)N * C;
    // an offset mean, so that subtracting it (the planted layernorm) changes the output
    const auto inp = randx(NC, -1, 3), inp2 = randx(NC, -1, 1);
    const auto w = randx(C, 0.5f, 1.5f);
    // dout partly along inp: then sum_j g_j xhat_j (what rstd's own gradient brings) is of the
    // row's size, not a random sum's square root, and dropping it is seen at every C
    auto dout = randx(NC, -1, 1);
    for (size_t i = 0; i < NC; i++) dout[i] = from_float<floatX>(to_float(dout[i]) + 0.25f * to_float(inp[i]));
    const auto dinp0 = randx(NC, -0.5f, 0.5f);
    const auto dw0 = randf(C, -1, 1);
    const float eps = (float)RMS_EPS;

    Dev d;
    floatX *d_inp = d.up(inp), *d_inp2 = d.up(inp2), *d_w = d.up(w), *d_dout = d.up(dout);
    floatX *d_out = d.alloc<floatX>(NC), *d_res = d.alloc<floatX>(NC);
    float* d_rstd = d.alloc<float>(N);

    // forward
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, eps, g_stream);
    const auto out = dbl(to_host(d_out, NC));
    const auto rstd = to_host(d_rstd, N);
    const auto x = dbl(inp), wd = dbl(w);
    std::vector<double> yref(NC), rref(N), ywrong(NC), rwrong(N);
    for (int r = 0; r < N; r++) {
        rms_row_ref(&x[(size_t)r * C], wd.data(), C, &yref[(size_t)r * C], &rref[r]);
        rms_row_ref(&x[(size_t)r * C], wd.data(), C, &ywrong[(size_t)r * C], &rwrong[r], true);
    }
    const double e_out = norm_err(out, yref), e_r = max_rel_diff(rstd.data(), rref.data(), N);
    CHECK(e_out <= TOL_X, "rmsnorm_forward N=%d C=%d out (norm err %.2e <= %.1e)", N, C, e_out, TOL_X);
    CHECK(e_r <= TOL_F32, "rmsnorm_forward N=%d C=%d rstd (rel err %.2e <= %.0e)", N, C, e_r, TOL_F32);
    const double e_planted = norm_err(out, ywrong);
    CHECK(e_planted > TOL_X, "rmsnorm_forward N=%d C=%d: the bound rejects a layernorm's output (norm err %.2e > %.1e)",
          N, C, e_planted, TOL_X);

    // fused residual: the residual is exactly the rounded sum; the norm is of that rounded residual
    fused_residual_rmsnorm_forward(d_res, d_out, d_rstd, d_inp, d_inp2, d_w, N, C, eps, g_stream);
    const auto res = to_host(d_res, NC);
    std::vector<floatX> res_want(NC);
    for (size_t i = 0; i < NC; i++) res_want[i] = from_float<floatX>(to_float(inp[i]) + to_float(inp2[i]));
    CHECK(same_bits(res, res_want), "fused_residual_rmsnorm_forward N=%d C=%d residual = round(inp1 + inp2), bitwise",
          N, C);
    const auto fout = dbl(to_host(d_out, NC));
    const auto frstd = to_host(d_rstd, N);
    const auto xr = dbl(res_want);
    for (int r = 0; r < N; r++) rms_row_ref(&xr[(size_t)r * C], wd.data(), C, &yref[(size_t)r * C], &rref[r]);
    const double f_out = norm_err(fout, yref), f_r = max_rel_diff(frstd.data(), rref.data(), N);
    CHECK(f_out <= TOL_X && f_r <= TOL_F32,
          "fused_residual_rmsnorm_forward N=%d C=%d out, rstd of the rounded residual (%.2e, %.2e)", N, C, f_out, f_r);

    // backward, from the plain forward's saved rstd, into pre-filled gradients
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, eps, g_stream);
    floatX* d_dinp = d.up(dinp0);
    float* d_dw = d.up(dw0);
    float* d_scratch = d.alloc<float>(rmsnorm_backward_scratch_floats(N, C));
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_inp, d_w, d_rstd, N, C, g_stream);
    const auto dinp = to_host(d_dinp, NC);
    const auto dw = to_host(d_dw, C);
    std::vector<double> rdx = dbl(dinp0), rdw = dbl(dw0), wdx = dbl(dinp0), wdw = dbl(dw0);
    const auto dyd = dbl(dout);
    for (int r = 0; r < N; r++) {
        const size_t o = (size_t)r * C;
        rms_row_bwd_ref(&x[o], wd.data(), &dyd[o], rstd[r], C, &rdx[o], rdw.data());
        rms_row_bwd_ref(&x[o], wd.data(), &dyd[o], rstd[r], C, &wdx[o], wdw.data(), true);
    }
    const double e_dx = norm_err(dbl(dinp), rdx), e_dw = norm_err(dbl(dw), rdw);
    CHECK(e_dx <= TOL_X, "rmsnorm_backward N=%d C=%d dinp += (norm err %.2e <= %.1e)", N, C, e_dx, TOL_X);
    CHECK(e_dw <= TOL_F32, "rmsnorm_backward N=%d C=%d dweight += (norm err %.2e <= %.0e)", N, C, e_dw, TOL_F32);
    const double e_dx_planted = norm_err(dbl(dinp), wdx);
    CHECK(e_dx_planted > TOL_X,
          "rmsnorm_backward N=%d C=%d: the bound rejects dinp with rstd taken as a constant (norm err %.2e > %.1e)", N,
          C, e_dx_planted, TOL_X);
    d.put(d_dinp, dinp0);
    d.put(d_dw, dw0);
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_inp, d_w, d_rstd, N, C, g_stream);
    CHECK(same_bits(dinp, to_host(d_dinp, NC)) && same_bits(dw, to_host(d_dw, C)),
          "rmsnorm_backward N=%d C=%d twice: bitwise identical", N, C);
}

int main() {
    kernel_test_begin("test_rmsnorm");
    TEST_CASE(test_rmsnorm_reference_gradient());
    TEST_CASE(test_rmsnorm(37, 40));
    TEST_CASE(test_rmsnorm(1, 768));
    TEST_CASE(test_rmsnorm(37, 768));
    TEST_CASE(test_rmsnorm(600, 40));       // more rows than backward blocks: rows per block > 1
    TEST_CASE(test_rmsnorm(3, 4096));       // 4 warps x C floats of shared memory > 48 KiB: the opt-in path
    TEST_CASE(test_rmsnorm(2, 12400));      // C over 6400: one warp per backward block, still over 48 KiB
    TEST_CASE(test_rmsnorm(9, 36));         // C not a multiple of 8: one element per access
    return kernel_test_end("test_rmsnorm");
}
