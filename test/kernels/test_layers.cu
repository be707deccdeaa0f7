// Layer kernels (encoder, layernorm, gelu, classifier, global norm, AdamW)
// against plain C++ references in double. Portable: runs on the CPU runtime and
// on a GPU.
//
// Error metrics (stated per check):
//   norm    max_i |got_i - ref_i| / max_i |ref_i|       (one number per tensor)
//   rel     max_i |got_i - ref_i| / max(|ref_i|, floor)  (elementwise, max_rel_diff)
// Tolerances:
//   TOL_F32  1e-5 for everything the kernels compute and store in fp32 (mean, rstd,
//            losses, weight gradients, norms, optimizer state), in both builds:
//            the inputs are the same floatX values in kernel and reference.
//   TOL_X    what one rounding to floatX costs, for floatX outputs (activations,
//            dinp, dlogits, dgelu): 1e-5 under ENABLE_FP32; 2^-7 under bf16, twice
//            bf16's unit roundoff 2^-8 (8 significant bits), which bounds
//            |round(x) - x| / |x| and so both metrics for one rounding.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/adamw.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "test/test_device.h"

#if defined(ENABLE_FP32)
constexpr double TOL_X = 1e-5;
#else
constexpr double TOL_X = 1.0 / 128;
#endif
constexpr double TOL_F32 = 1e-5;

static cudaStream_t g_stream;
static std::mt19937 g_rng;

// --- helpers ------------------------------------------------------------------------------
static std::vector<float> randf(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(g_rng);
    return v;
}
static std::vector<floatX> randx(size_t n, float lo, float hi) {
    std::vector<float> f = randf(n, lo, hi);
    std::vector<floatX> v(n);
    for (size_t i = 0; i < n; i++) v[i] = from_float<floatX>(f[i]);
    return v;
}
template <class T>
static std::vector<double> dbl(const std::vector<T>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); i++) d[i] = (double)to_float(v[i]);
    return d;
}
static double norm_err(const std::vector<double>& got, const std::vector<double>& ref) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        scale = std::max(scale, std::fabs(ref[i]));
        const double d = std::fabs(got[i] - ref[i]);
        if (!(d <= worst)) worst = d;  // NaN stays
    }
    return worst / std::max(scale, 1e-30);
}
template <class T>
static bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Device buffers of one test case, freed together.
struct Dev {
    std::vector<void*> ptrs;
    template <class T> T* up(const std::vector<T>& h) { T* d = to_device(h); ptrs.push_back(d); return d; }
    template <class T> T* alloc(size_t n) {
        T* d = nullptr;
        CUDA_OK(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)));
        ptrs.push_back(d);
        return d;
    }
    template <class T> void put(T* d, const std::vector<T>& h) {
        CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Dev() { for (void* p : ptrs) cudaFree(p); }
};

// --- encoder -------------------------------------------------------------------------------
static void test_encoder(int B, int T, int C, int V) {
    g_rng.seed(100 + C);
    const int BT = B * T;
    std::vector<int> inp(BT);
    std::uniform_int_distribution<int> tok(0, V - 1);
    for (int p = 0; p < BT; p++) inp[p] = (p % 3 == 0) ? std::min(7, V - 1) : tok(g_rng);  // one token repeats often
    inp[BT - 1] = V - 1;
    const auto wte = randx((size_t)V * C, -1, 1), wpe = randx((size_t)T * C, -1, 1);
    const auto dout = randx((size_t)BT * C, -1, 1);
    const auto dwte0 = randf((size_t)V * C, -0.5f, 0.5f), dwpe0 = randf((size_t)T * C, -0.5f, 0.5f);

    Dev d;
    int* d_inp = d.up(inp);
    floatX *d_wte = d.up(wte), *d_wpe = d.up(wpe), *d_dout = d.up(dout);
    floatX* d_out = d.alloc<floatX>((size_t)BT * C);
    encoder_forward(d_out, d_inp, nullptr, d_wte, d_wpe, B, T, C, g_stream);
    const auto out = dbl(to_host(d_out, (size_t)BT * C));
    std::vector<double> ref((size_t)BT * C);
    for (int p = 0; p < BT; p++)
        for (int c = 0; c < C; c++)
            ref[(size_t)p * C + c] = (double)to_float(wte[(size_t)inp[p] * C + c]) + to_float(wpe[(size_t)(p % T) * C + c]);
    const double e_fwd = norm_err(out, ref);
    CHECK(e_fwd <= TOL_X, "encoder_forward B=%d T=%d C=%d (norm err %.2e <= %.1e)", B, T, C, e_fwd, TOL_X);

    // the plan: a permutation of positions, grouped by ascending token, increasing position inside
    std::vector<int> plan(encoder_backward_plan_ints(B, T), -7);
    const int D = encoder_backward_plan(plan.data(), inp.data(), B, T);
    std::vector<int> sorted = inp;
    std::sort(sorted.begin(), sorted.end());
    const int D_want = (int)(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
    bool layout_ok = D == D_want && plan[BT] == 0 && plan[BT + D] == BT;
    std::vector<int> seen(BT, 0);
    for (int g = 0; g < D && layout_ok; g++) {
        const int tok_g = plan[2 * BT + 1 + g];
        layout_ok &= g == 0 || tok_g > plan[2 * BT + 1 + g - 1];
        for (int k = plan[BT + g]; k < plan[BT + g + 1]; k++) {
            layout_ok &= inp[plan[k]] == tok_g && (k == plan[BT + g] || plan[k] > plan[k - 1]);
            seen[plan[k]]++;
        }
    }
    for (int p = 0; p < BT; p++) layout_ok &= seen[p] == 1;
    CHECK(layout_ok, "encoder plan B=%d T=%d: %d distinct tokens (want %d), groups sorted, each position once", B, T, D, D_want);
    std::vector<int> bad_inp = inp;
    bad_inp[BT / 2] = -1;
    CHECK(encoder_backward_plan(plan.data(), bad_inp.data(), B, T) == -1, "encoder plan rejects a negative token id");
    encoder_backward_plan(plan.data(), inp.data(), B, T);

    int* d_plan = d.up(plan);
    float *d_dwte = d.up(dwte0), *d_dwpe = d.up(dwpe0);
    encoder_backward(d_dwte, d_dwpe, d_dout, d_plan, D, nullptr, 0, B, T, C, g_stream);
    const auto dwte = to_host(d_dwte, dwte0.size()), dwpe = to_host(d_dwpe, dwpe0.size());
    std::vector<double> rwte = dbl(dwte0), rwpe = dbl(dwpe0);
    for (int p = 0; p < BT; p++)
        for (int c = 0; c < C; c++) {
            const double g = to_float(dout[(size_t)p * C + c]);
            rwte[(size_t)inp[p] * C + c] += g;
            rwpe[(size_t)(p % T) * C + c] += g;
        }
    const double e_wte = norm_err(dbl(dwte), rwte), e_wpe = norm_err(dbl(dwpe), rwpe);
    CHECK(e_wte <= TOL_F32, "encoder_backward dwte += (pre-filled, norm err %.2e <= %.0e)", e_wte, TOL_F32);
    CHECK(e_wpe <= TOL_F32, "encoder_backward dwpe += (pre-filled, norm err %.2e <= %.0e)", e_wpe, TOL_F32);
    // rows of tokens that never occur are untouched
    bool untouched = true;
    for (int v = 0; v < V; v++)
        if (!std::binary_search(sorted.begin(), sorted.begin() + D_want, v))
            untouched &= memcmp(&dwte[(size_t)v * C], &dwte0[(size_t)v * C], C * sizeof(float)) == 0;
    CHECK(untouched, "encoder_backward leaves rows of absent tokens bitwise unchanged");
    d.put(d_dwte, dwte0);
    d.put(d_dwpe, dwpe0);
    encoder_backward(d_dwte, d_dwpe, d_dout, d_plan, D, nullptr, 0, B, T, C, g_stream);
    CHECK(same_bits(dwte, to_host(d_dwte, dwte0.size())) && same_bits(dwpe, to_host(d_dwpe, dwpe0.size())),
          "encoder_backward twice: bitwise identical");

    // Position ids that restart (documents of 1..6 tokens): wpe[pos] in the
    // forward, dwpe summed per position id through the position plan.
    std::vector<int> pos(BT);
    for (int p = 0, len = 0, start = 0; p < BT; p++) {
        if (p % T == 0 || p - start >= len) start = p, len = 1 + (int)(g_rng() % 6);
        pos[p] = p - start;
    }
    int* d_pos = d.up(pos);
    encoder_forward(d_out, d_inp, d_pos, d_wte, d_wpe, B, T, C, g_stream);
    for (int p = 0; p < BT; p++)
        for (int c = 0; c < C; c++)
            ref[(size_t)p * C + c] = (double)to_float(wte[(size_t)inp[p] * C + c]) + to_float(wpe[(size_t)pos[p] * C + c]);
    const double e_pos = norm_err(dbl(to_host(d_out, (size_t)BT * C)), ref);
    CHECK(e_pos <= TOL_X, "encoder_forward with position ids B=%d T=%d C=%d (norm err %.2e <= %.1e)", B, T, C, e_pos, TOL_X);
    std::vector<int> pos_plan(encoder_backward_plan_ints(B, T));
    const int P = encoder_backward_plan(pos_plan.data(), pos.data(), B, T);
    int* d_pos_plan = d.up(pos_plan);
    d.put(d_dwte, dwte0);
    d.put(d_dwpe, dwpe0);
    encoder_backward(d_dwte, d_dwpe, d_dout, d_plan, D, d_pos_plan, P, B, T, C, g_stream);
    rwpe = dbl(dwpe0);
    for (int p = 0; p < BT; p++)
        for (int c = 0; c < C; c++) rwpe[(size_t)pos[p] * C + c] += to_float(dout[(size_t)p * C + c]);
    const double e_pwpe = norm_err(dbl(to_host(d_dwpe, dwpe0.size())), rwpe);
    CHECK(e_pwpe <= TOL_F32 && same_bits(dwte, to_host(d_dwte, dwte0.size())),
          "encoder_backward with position ids: dwpe per id (norm err %.2e <= %.0e), dwte unchanged", e_pwpe, TOL_F32);
}

// --- layernorm -----------------------------------------------------------------------------
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

// Reference backward of one row (derivation in llmc/layernorm.cuh, re-derived here):
// y = xhat w + b, xhat = (x - mu) rs. With g = dy w, d xhat_j / d x_i = rs (delta_ij - 1/C - xhat_i xhat_j / C), so
// dx_i = sum_j g_j d xhat_j / d x_i = rs (g_i - mean(g) - xhat_i mean(g xhat)).
static void ln_row_bwd_ref(const double* x, const double* w, const double* dy, double mu, double rs, int C,
                           double* dx, double* dw, double* db) {
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
static double mean_err(const std::vector<float>& mean, const std::vector<double>& ref, const std::vector<double>& rstd) {
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
    for (int r = 0; r < N; r++) ln_row_ref(&x[(size_t)r * C], wd.data(), bd.data(), C, &yref[(size_t)r * C], &mref[r], &rref[r]);
    const double e_out = norm_err(out, yref), e_m = mean_err(mean, mref, rref), e_r = max_rel_diff(rstd.data(), rref.data(), N);
    CHECK(e_out <= TOL_X, "layernorm_forward N=%d C=%d out (norm err %.2e <= %.1e)", N, C, e_out, TOL_X);
    CHECK(e_m <= TOL_F32 && e_r <= TOL_F32, "layernorm_forward N=%d C=%d mean (err in row stds %.2e), rstd (rel err %.2e) <= %.0e",
          N, C, e_m, e_r, TOL_F32);

    // fused residual: the residual is exactly the rounded sum; the norm is of that rounded residual
    fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_inp, d_inp2, d_w, d_b, N, C, g_stream);
    const auto res = to_host(d_res, NC);
    std::vector<floatX> res_want(NC);
    for (size_t i = 0; i < NC; i++) res_want[i] = from_float<floatX>(to_float(inp[i]) + to_float(inp2[i]));
    CHECK(same_bits(res, res_want), "fused_residual_layernorm_forward N=%d C=%d residual = round(inp1 + inp2), bitwise", N, C);
    const auto fout = dbl(to_host(d_out, NC));
    const auto fmean = to_host(d_mean, N), frstd = to_host(d_rstd, N);
    const auto xr = dbl(res_want);
    for (int r = 0; r < N; r++) ln_row_ref(&xr[(size_t)r * C], wd.data(), bd.data(), C, &yref[(size_t)r * C], &mref[r], &rref[r]);
    const double f_out = norm_err(fout, yref), f_m = mean_err(fmean, mref, rref),
                 f_r = max_rel_diff(frstd.data(), rref.data(), N);
    CHECK(f_out <= TOL_X && f_m <= TOL_F32 && f_r <= TOL_F32,
          "fused_residual_layernorm_forward N=%d C=%d out, mean, rstd of the rounded residual (%.2e, %.2e, %.2e)", N, C, f_out, f_m, f_r);

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
    CHECK(e_dw <= TOL_F32 && e_db <= TOL_F32, "layernorm_backward N=%d C=%d dweight +=, dbias += (norm err %.2e, %.2e <= %.0e)",
          N, C, e_dw, e_db, TOL_F32);
    d.put(d_dinp, dinp0);
    d.put(d_dw, dw0);
    d.put(d_db, db0);
    layernorm_backward(d_dinp, d_dw, d_db, d_scratch, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, g_stream);
    CHECK(same_bits(dinp, to_host(d_dinp, NC)) && same_bits(dw, to_host(d_dw, C)) && same_bits(db, to_host(d_db, C)),
          "layernorm_backward N=%d C=%d twice: bitwise identical", N, C);
}

// --- gelu ----------------------------------------------------------------------------------
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

// --- classifier ----------------------------------------------------------------------------
static void test_classifier(int N, int V, int Vp, std::vector<int> masked_rows) {
    g_rng.seed(400 + V);
    std::vector<floatX> logits = randx((size_t)N * Vp, -4, 4);
    for (int r = 0; r < N; r++)
        for (int c = V; c < Vp; c++) logits[(size_t)r * Vp + c] = from_float<floatX>(1000.0f);  // padding must be ignored
    if (N > 2)  // a row far above exp's fp32 range: needs the max subtracted
        for (int c = 0; c < V; c++) logits[(size_t)2 * Vp + c] = from_float<floatX>(to_float(logits[(size_t)2 * Vp + c]) + 100.0f);
    std::vector<int> targets(N);
    std::uniform_int_distribution<int> tok(0, V - 1);
    for (int r = 0; r < N; r++) targets[r] = tok(g_rng);
    targets[0] = V - 1;
    for (int r : masked_rows) targets[r] = -1;
    const int unmasked = N - (int)masked_rows.size();
    const float dloss = 1.0f / (3.0f * unmasked);  // as if the global batch were 3 such microbatches

    std::vector<double> lref(N, 0.0), gref((size_t)N * Vp, 0.0);
    for (int r = 0; r < N; r++) {
        if (targets[r] < 0) continue;
        const floatX* x = &logits[(size_t)r * Vp];
        double m = -1e300, s = 0;
        for (int c = 0; c < V; c++) m = std::max(m, (double)to_float(x[c]));
        for (int c = 0; c < V; c++) s += std::exp(to_float(x[c]) - m);
        lref[r] = std::log(s) + m - to_float(x[targets[r]]);
        for (int c = 0; c < V; c++)
            gref[(size_t)r * Vp + c] = dloss * (std::exp(to_float(x[c]) - m) / s - (c == targets[r] ? 1.0 : 0.0));
    }

    Dev d;
    floatX* d_logits = d.up(logits);
    int* d_t = d.up(targets);
    float* d_loss = d.alloc<float>(N);
    // losses only: logits stay as they are
    fused_classifier(d_logits, d_loss, d_t, dloss, N, V, Vp, false, g_stream);
    const auto loss_only = to_host(d_loss, N);
    CHECK(same_bits(to_host(d_logits, logits.size()), logits), "fused_classifier N=%d V=%d Vp=%d without dlogits leaves logits unchanged", N, V, Vp);
    // losses and dlogits in place
    fused_classifier(d_logits, d_loss, d_t, dloss, N, V, Vp, true, g_stream);
    const auto loss = to_host(d_loss, N);
    const auto dl = to_host(d_logits, logits.size());
    const double el = max_rel_diff(loss.data(), lref.data(), N, 1e-3);
    CHECK(el <= TOL_F32 && same_bits(loss, loss_only), "fused_classifier N=%d V=%d Vp=%d losses (rel err %.2e <= %.0e, floor 1e-3; same with and without dlogits)",
          N, V, Vp, el, TOL_F32);
    const auto dld = dbl(dl);
    const double eg = max_rel_diff(dld.data(), gref.data(), dld.size(), 1e-6 * dloss);
    CHECK(eg <= TOL_X, "fused_classifier N=%d V=%d Vp=%d dlogits = dloss (softmax - onehot) (rel err %.2e <= %.1e, floor 1e-6 dloss)",
          N, V, Vp, eg, TOL_X);
    bool pad_zero = true, masked_zero = true;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < Vp; c++) {
            const float v = to_float(dl[(size_t)r * Vp + c]);
            if (c >= V) pad_zero &= v == 0.0f;
            if (targets[r] < 0) masked_zero &= v == 0.0f;
        }
    for (int r : masked_rows) masked_zero &= loss[r] == 0.0f;
    CHECK(pad_zero, "fused_classifier V=%d Vp=%d: padded columns of dlogits are 0", V, Vp);
    CHECK(masked_zero, "fused_classifier V=%d: %zu masked rows have loss 0 and all-zero dlogits", V, masked_rows.size());
    d.put(d_logits, logits);
    fused_classifier(d_logits, d_loss, d_t, dloss, N, V, Vp, true, g_stream);
    CHECK(same_bits(to_host(d_logits, logits.size()), dl) && same_bits(to_host(d_loss, N), loss),
          "fused_classifier V=%d twice: bitwise identical", V);
}

static void test_accumulate_loss(int N) {
    g_rng.seed(500 + N);
    const auto losses = randf(N, 0, 11);
    Dev d;
    float* d_losses = d.up(losses);
    float* d_sum = d.up(std::vector<float>{1.5f});
    const float scale = 0.25f;
    accumulate_loss(d_sum, d_losses, N, scale, g_stream);
    accumulate_loss(d_sum, d_losses, N, scale, g_stream);
    const float got = to_host(d_sum, 1)[0];
    double want = 0;
    for (float l : losses) want += l;
    want = 1.5 + 2 * scale * want;
    const double e = std::fabs(got - want) / want;
    CHECK(e <= TOL_F32, "accumulate_loss N=%d twice onto 1.5 (rel err %.2e <= %.0e)", N, e, TOL_F32);
    d.put(d_sum, std::vector<float>{1.5f});
    accumulate_loss(d_sum, d_losses, N, scale, g_stream);
    accumulate_loss(d_sum, d_losses, N, scale, g_stream);
    const float again = to_host(d_sum, 1)[0];
    CHECK(memcmp(&got, &again, 4) == 0, "accumulate_loss N=%d: bitwise identical rerun", N);
}

// --- global norm ---------------------------------------------------------------------------
static void test_global_norm(size_t n) {
    g_rng.seed(600 + (unsigned)n);
    const auto g = randf(n, -1, 1);
    Dev d;
    float* d_g = d.up(g);
    float* d_norm = d.up(std::vector<float>{12345.0f});
    float* d_scratch = d.alloc<float>(global_norm_scratch_floats());
    global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
    const float got = to_host(d_norm, 1)[0];
    double want = 0;
    for (float x : g) want += (double)x * x;
    const double e = std::fabs(got - want) / want;
    CHECK(e <= TOL_F32, "global_norm_squared n=%zu overwrites (rel err %.2e <= %.0e)", n, e, TOL_F32);
    global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
    const float again = to_host(d_norm, 1)[0];
    CHECK(memcmp(&got, &again, 4) == 0, "global_norm_squared n=%zu: bitwise identical rerun", n);
}

// --- AdamW ---------------------------------------------------------------------------------
// Bits of the bf16 values just below and above |p| (toward zero / away from zero).
static bool is_neighbour(float p, floatX q) {
#if defined(ENABLE_FP32)
    return memcmp(&p, &q, 4) == 0;
#else
    uint32_t u;
    memcpy(&u, &p, 4);
    uint16_t qb;
    memcpy(&qb, &q, 2);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)((u >> 16) + 1);
    return qb == lo || ((u & 0xFFFFu) != 0 && qb == hi);
#endif
}

static void test_adamw(size_t n, float weight_decay, float clip_mode) {
    // clip_mode: 0 disables clipping (grad_clip = 0, no norm pointer), > 0 sets grad_clip to clip_mode * norm
    g_rng.seed(700 + (unsigned)n + (unsigned)(weight_decay * 100) + (unsigned)(clip_mode * 10));
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    std::vector<float> master = randf(n, -0.05f, 0.05f), m(n, 0.0f), v(n, 0.0f);
    std::vector<floatX> params(n);
    for (size_t i = 0; i < n; i++) params[i] = from_float<floatX>(master[i]);
    Dev d;
    floatX* d_params = d.up(params);
    float *d_master = d.up(master), *d_m = d.up(m), *d_v = d.up(v), *d_g = d.alloc<float>(n);
    float *d_norm = d.alloc<float>(1), *d_scratch = d.alloc<float>(global_norm_scratch_floats());
    const int steps[] = {1, 2, 3, 1000};
    for (int t : steps) {
        const auto g = randf(n, -0.5f, 0.5f);
        d.put(d_g, g);
        global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
        const float ns = to_host(d_norm, 1)[0];
        const float grad_clip = clip_mode > 0 ? clip_mode * std::sqrt(ns) : 0.0f;
        adamw_update(d_params, d_master, d_g, d_m, d_v, n, lr, beta1, beta2, eps, weight_decay, t, grad_clip,
                     clip_mode > 0 ? d_norm : nullptr, 1000u + t, 0, g_stream);
        // reference: one step in double from the state the device started this step from
        const double clip = grad_clip > 0 ? std::min(1.0, grad_clip / (std::sqrt((double)ns) + 1e-6)) : 1.0;
        const double bc1 = 1 - std::pow((double)beta1, t), bc2 = 1 - std::pow((double)beta2, t);
        std::vector<double> rp(n), rm(n), rv(n), rdelta(n), delta(n);
        const auto nm = to_host(d_master, n), nmm = to_host(d_m, n), nv = to_host(d_v, n);
        const auto np = to_host(d_params, n);
        for (size_t i = 0; i < n; i++) {
            const double gi = g[i] * clip;
            double p = master[i] * (1 - (double)lr * weight_decay);
            rm[i] = m[i] + (1 - (double)beta1) * (gi - m[i]);
            rv[i] = beta2 * (double)v[i] + (1 - (double)beta2) * gi * gi;
            p -= (lr / bc1) * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
            rp[i] = p;
            rdelta[i] = p - master[i];
            delta[i] = (double)nm[i] - master[i];
        }
        const double e_p = max_rel_diff(nm.data(), rp.data(), n, lr), e_d = norm_err(delta, rdelta);  // floor: one update's size
        const double e_m = norm_err(dbl(nmm), rm), e_v = norm_err(dbl(nv), rv);
        int not_neighbour = 0;
        for (size_t i = 0; i < n; i++) not_neighbour += !is_neighbour(nm[i], np[i]);
        CHECK(e_p <= TOL_F32 && e_d <= TOL_F32 && e_m <= TOL_F32 && e_v <= TOL_F32 && not_neighbour == 0,
              "adamw_update n=%zu t=%d wd=%.1f clip %s: master (rel %.1e, floor lr; update norm %.1e), m (%.1e), v (%.1e) <= %.0e; "
              "params a neighbour of master (%d not)",
              n, t, weight_decay, clip_mode == 0 ? "disabled" : clip < 1 ? "active" : "inactive", e_p, e_d, e_m, e_v,
              TOL_F32, not_neighbour);
        master = nm;
        m = nmm;
        v = nv;
    }
}

// Stochastic rounding through the optimizer: with lr = 0 the master value is
// only rounded to floatX. Many roundings of one value average back to it, and
// each is one of its two bf16 neighbours.
static void test_stochastic_rounding() {
    const size_t n = 65536;
    const float values[] = {1.0f + 0.3f / 128, -0.7f - 0.001f, 3.14159265f};
    Dev d;
    floatX* d_params = d.alloc<floatX>(n);
    float *d_master = d.alloc<float>(n), *d_m = d.up(std::vector<float>(n, 0.0f)), *d_v = d.up(std::vector<float>(n, 0.0f));
    float* d_g = d.up(std::vector<float>(n, 0.0f));
    for (float x : values) {
        for (uint32_t seed : {1u, 77u}) {
            d.put(d_master, std::vector<float>(n, x));
            adamw_update(d_params, d_master, d_g, d_m, d_v, n, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 0.0f, nullptr, seed, 0, g_stream);
            const auto p = to_host(d_params, n);
            double mean = 0;
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                mean += to_float(p[i]);
                bad += !is_neighbour(x, p[i]);
            }
            mean /= n;
#if defined(ENABLE_FP32)
            const double ulp = 0;
#else
            const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);  // bf16 spacing at x
#endif
            const double e = std::fabs(mean - x);
            CHECK(bad == 0 && e <= 0.01 * ulp, "stochastic rounding of %.7g (seed %u) over %zu elements: mean off by %.3g ulp (<= 0.01), "
                  "%d results not a neighbour", x, seed, n, ulp > 0 ? e / ulp : e, bad);
        }
    }
}

// A tensor updated in pieces (as a ZeRO-1 shard is: each piece with the
// offset of its first element in the tensor) gives bitwise the weights of
// one update of the whole tensor, stochastic rounding included.
static void test_adamw_in_pieces() {
    const size_t n = 10007, cuts[] = {0, 1, 2500, 2501, 7000, n};
    const auto master = randf(n, -1.0f, 1.0f), g = randf(n, -0.5f, 0.5f);
    Dev d;
    floatX *d_whole = d.alloc<floatX>(n), *d_pieces = d.alloc<floatX>(n);
    float *d_g = d.up(g), *d_mw = d.up(master), *d_mp = d.up(master);
    float *d_m1 = d.up(std::vector<float>(n, 0.0f)), *d_v1 = d.up(std::vector<float>(n, 0.0f));
    float *d_m2 = d.up(std::vector<float>(n, 0.0f)), *d_v2 = d.up(std::vector<float>(n, 0.0f));
    adamw_update(d_whole, d_mw, d_g, d_m1, d_v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.0f, nullptr, 99u, 0, g_stream);
    for (int k = 0; k + 1 < 6; k++) {
        const size_t a = cuts[k], len = cuts[k + 1] - a;
        adamw_update(d_pieces + a, d_mp + a, d_g + a, d_m2 + a, d_v2 + a, len, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.0f,
                     nullptr, 99u, a, g_stream);
    }
    const auto w = to_host(d_whole, n), p = to_host(d_pieces, n);
    const auto mw = to_host(d_mw, n), mp = to_host(d_mp, n);
    CHECK(memcmp(w.data(), p.data(), n * sizeof(floatX)) == 0 && memcmp(mw.data(), mp.data(), n * 4) == 0,
          "adamw_update in 5 pieces with index offsets: weights and master bitwise equal to one whole update");
    // a non-finite gradient norm leaves weights, master, m and v untouched
    const auto m_before = to_host(d_m1, n);
    for (float bad : {NAN, INFINITY}) {
        float* d_norm = d.up(std::vector<float>{bad});
        adamw_update(d_whole, d_mw, d_g, d_m1, d_v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 1.0f, d_norm, 7u, 0, g_stream);
        CHECK(memcmp(to_host(d_whole, n).data(), w.data(), n * sizeof(floatX)) == 0 &&
                  memcmp(to_host(d_mw, n).data(), mw.data(), n * 4) == 0 &&
                  memcmp(to_host(d_m1, n).data(), m_before.data(), n * 4) == 0,
              "adamw_update with a %s gradient norm changes nothing", std::isnan(bad) ? "NaN" : "Inf");
    }
}

int main() {
    CUDA_OK(cudaStreamCreate(&g_stream));
    printf("test_layers: floatX = %s, TOL_X = %.2e, TOL_F32 = %.0e\n", PRECISION_NAME, TOL_X, TOL_F32);
    test_encoder(3, 13, 40, 50);
    test_encoder(2, 5, 768, 1000);
    test_encoder(1, 1, 40, 5);
    test_encoder(2, 3, 20, 50);   // C not a multiple of 8: one element per access
    test_layernorm_reference_gradient();
    test_layernorm(37, 40);
    test_layernorm(1, 768);
    test_layernorm(37, 768);
    test_layernorm(600, 40);    // more rows than backward blocks: rows per block > 1
    test_layernorm(3, 6200);    // 2*C floats of shared memory > 48 KiB: the opt-in path
    test_layernorm(9, 36);      // C not a multiple of 8: one element per access
    test_gelu(1037);
    test_gelu(200003);          // more elements than the bounded grid has threads
    test_gelu(200008);          // a multiple of 8: 16-byte accesses (bf16)
    test_classifier(6, 250, 256, {1, 5});
    test_classifier(3, 50257, 50304, {1});
    test_classifier(4, 37, 37, {2});   // Vp not a multiple of 8: one element per access
    test_accumulate_loss(1);
    test_accumulate_loss(3001);
    test_global_norm(1);
    test_global_norm(1000);
    test_global_norm(1000003);
    test_adamw(1037, 0.1f, 0.5f);      // clipping active
    test_adamw(1037, 0.0f, 0.0f);      // clipping disabled, no weight decay
    test_adamw(140001, 0.1f, 1e3f);    // clip above the norm: inactive; grid-stride wraps
    test_adamw(140000, 0.1f, 0.5f);    // a multiple of 4: 16-byte accesses
    test_stochastic_rounding();
    test_adamw_in_pieces();
    CUDA_OK(cudaStreamDestroy(g_stream));
    return test_summary("test_layers");
}
