// Layer normalisation (llmc/kernels/layernorm.cuh): the forward with its saved mean and
// rstd, the fused residual + layernorm forward, and the backward into
// pre-filled gradients; the reference backward itself against central
// differences of the reference forward.
#include "llmc/kernels/layernorm.cuh"
#include "test/kernels/kernel_test.h"

// Reference forward of one row in double; mean/rstd from the row itself.
static void ln_row_ref(const double* x, const double* w, const double* b, int C, double* y, double* mu, double* rs) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
    *mu = m;
    *rs = r;
}

// Reference backward of one row (derivation in llmc/kernels/layernorm.cuh, re-derived here):
// y = xhat w + b, xhat = (x - mu) rs. With g = dy w, d xhat_j / d x_i = rs (delta_ij - 1/C - xhat_i xhat_j / C), so
// dx_i = sum_j g_j d xhat_j / d x_i = rs (g_i - mean(g) - xhat_i mean(g xhat)).
static void ln_row_bwd_ref(const double* x, const double* w, const double* dy, double mu, double rs, int C, double* dx,
                           double* dw, double* db) {
    double mg = 0, mgx = 0;
    for (int c = 0; c < C; c++) {
        const double xh = (x[c] - mu) * rs;
        mg += dy[c] * w[c];
        mgx += dy[c] * w[c] * xh;
        dw[c] += dy[c] * xh;
        db[c] += dy[c];
    }
    mg /= C;
    mgx /= C;
    for (int c = 0; c < C; c++) {
        const double xh = (x[c] - mu) * rs;
        dx[c] += rs * (dy[c] * w[c] - mg - xh * mgx);
    }
}

// The reference backward against central differences of the reference forward.
static void test_layernorm_reference_gradient() {
    g_rng.seed(7);
    const int C = 40;
    std::vector<double> x = dbl(randf(C, -2, 3)), w = dbl(randf(C, 0.5f, 1.5f)), b = dbl(randf(C, -1, 1));
    const std::vector<double> dy = dbl(randf(C, -1, 1));
    std::vector<double> y(C), dx(C, 0.0), dw(C, 0.0), db(C, 0.0), fd(C);
    double mu, rs;
    ln_row_ref(x.data(), w.data(), b.data(), C, y.data(), &mu, &rs);
    ln_row_bwd_ref(x.data(), w.data(), dy.data(), mu, rs, C, dx.data(), dw.data(), db.data());
    auto loss = [&]() {
        double m, r, L = 0;
        ln_row_ref(x.data(), w.data(), b.data(), C, y.data(), &m, &r);
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
    CHECK(e < 1e-7, "layernorm reference dx matches central differences of the forward (norm err %.2e)", e);
}

// A mean's error in units of its row's standard deviation: max_r |mean_r - ref_r| * rstd_r.
static double mean_err(const std::vector<float>& mean, const std::vector<double>& ref,
                       const std::vector<double>& rstd) {
    double worst = 0;
    for (size_t r = 0; r < ref.size(); r++) {
        const double d = std::fabs(mean[r] - ref[r]) * rstd[r];
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static void test_layernorm(int N, int C) {
    g_rng.seed(200 + N * 7 + C);
    const size_t NC = (size_t)N * C;
    const auto inp = randx(NC, -2, 3), inp2 = randx(NC, -1, 1);  // offset mean: exercises the centering
    const auto w = randx(C, 0.5f, 1.5f), b = randx(C, -0.5f, 0.5f);
    const auto dout = randx(NC, -1, 1), dinp0 = randx(NC, -0.5f, 0.5f);
    const auto dw0 = randf(C, -1, 1), db0 = randf(C, -1, 1);

    Dev d;
    floatX *d_inp = d.up(inp), *d_inp2 = d.up(inp2), *d_w = d.up(w), *d_b = d.up(b), *d_dout = d.up(dout);
    floatX *d_out = d.alloc<floatX>(NC), *d_res = d.alloc<floatX>(NC);
    float *d_mean = d.alloc<float>(N), *d_rstd = d.alloc<float>(N);

    // forward
    layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, g_stream);
    const auto out = dbl(to_host(d_out, NC));
    const auto mean = to_host(d_mean, N), rstd = to_host(d_rstd, N);
    const auto x = dbl(inp), wd = dbl(w), bd = dbl(b);
    std::vector<double> yref(NC), mref(N), rref(N);
    for (int r = 0; r < N; r++)
        ln_row_ref(&x[(size_t)r * C], wd.data(), bd.data(), C, &yref[(size_t)r * C], &mref[r], &rref[r]);
    const double e_out = norm_err(out, yref), e_m = mean_err(mean, mref, rref),
                 e_r = max_rel_diff(rstd.data(), rref.data(), N);
    CHECK(e_out <= TOL_X, "layernorm_forward N=%d C=%d out (norm err %.2e <= %.1e)", N, C, e_out, TOL_X);
    CHECK(e_m <= TOL_F32 && e_r <= TOL_F32,
          "layernorm_forward N=%d C=%d mean (err in row stds %.2e), rstd (rel err %.2e) <= %.0e", N, C, e_m, e_r,
          TOL_F32);

    // fused residual: the residual is exactly the rounded sum; the norm is of that rounded residual
    fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_inp, d_inp2, d_w, d_b, N, C, g_stream);
    const auto res = to_host(d_res, NC);
    std::vector<floatX> res_want(NC);
    for (size_t i = 0; i < NC; i++) res_want[i] = from_float<floatX>(to_float(inp[i]) + to_float(inp2[i]));
    CHECK(same_bits(res, res_want), "fused_residual_layernorm_forward N=%d C=%d residual = round(inp1 + inp2), bitwise",
          N, C);
    const auto fout = dbl(to_host(d_out, NC));
    const auto fmean = to_host(d_mean, N), frstd = to_host(d_rstd, N);
    const auto xr = dbl(res_want);
    for (int r = 0; r < N; r++)
        ln_row_ref(&xr[(size_t)r * C], wd.data(), bd.data(), C, &yref[(size_t)r * C], &mref[r], &rref[r]);
    const double f_out = norm_err(fout, yref), f_m = mean_err(fmean, mref, rref),
                 f_r = max_rel_diff(frstd.data(), rref.data(), N);
    CHECK(f_out <= TOL_X && f_m <= TOL_F32 && f_r <= TOL_F32,
          "fused_residual_layernorm_forward N=%d C=%d out, mean, rstd of the rounded residual (%.2e, %.2e, %.2e)", N, C,
          f_out, f_m, f_r);

    // backward, from the plain forward's saved mean/rstd, into pre-filled gradients
    layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, g_stream);
    floatX* d_dinp = d.up(dinp0);
    float *d_dw = d.up(dw0), *d_db = d.up(db0);
    float* d_scratch = d.alloc<float>(layernorm_backward_scratch_floats(N, C));
    layernorm_backward(d_dinp, d_dw, d_db, d_scratch, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, g_stream);
    const auto dinp = to_host(d_dinp, NC);
    const auto dw = to_host(d_dw, C), db = to_host(d_db, C);
    std::vector<double> rdx = dbl(dinp0), rdw = dbl(dw0), rdb = dbl(db0);
    const auto dyd = dbl(dout);
    for (int r = 0; r < N; r++)
        ln_row_bwd_ref(&x[(size_t)r * C], wd.data(), &dyd[(size_t)r * C], mean[r], rstd[r], C, &rdx[(size_t)r * C],
                       rdw.data(), rdb.data());
    const double e_dx = norm_err(dbl(dinp), rdx), e_dw = norm_err(dbl(dw), rdw), e_db = norm_err(dbl(db), rdb);
    CHECK(e_dx <= TOL_X, "layernorm_backward N=%d C=%d dinp += (norm err %.2e <= %.1e)", N, C, e_dx, TOL_X);
    CHECK(e_dw <= TOL_F32 && e_db <= TOL_F32,
          "layernorm_backward N=%d C=%d dweight +=, dbias += (norm err %.2e, %.2e <= %.0e)", N, C, e_dw, e_db, TOL_F32);
    d.put(d_dinp, dinp0);
    d.put(d_dw, dw0);
    d.put(d_db, db0);
    layernorm_backward(d_dinp, d_dw, d_db, d_scratch, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, g_stream);
    CHECK(same_bits(dinp, to_host(d_dinp, NC)) && same_bits(dw, to_host(d_dw, C)) && same_bits(db, to_host(d_db, C)),
          "layernorm_backward N=%d C=%d twice: bitwise identical", N, C);
}

int main() {
    kernel_test_begin("test_layernorm");
    TEST_CASE(test_layernorm_reference_gradient());
    TEST_CASE(test_layernorm(37, 40));
    TEST_CASE(test_layernorm(1, 768));
    TEST_CASE(test_layernorm(37, 768));
    TEST_CASE(test_layernorm(600, 40));       // more rows than backward blocks: rows per block > 1
    TEST_CASE(test_layernorm(3, 6200));       // 2*C floats of shared memory > 48 KiB: the opt-in path
    TEST_CASE(test_layernorm(9, 36));         // C not a multiple of 8: one element per access
    return kernel_test_end("test_layernorm");
}
