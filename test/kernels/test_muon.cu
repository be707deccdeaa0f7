// The Muon update (llmc/kernels/muon.cuh) against one step in double: Nesterov
// momentum, the Newton-Schulz quintic with the same coefficients on the smaller
// Gram side, the shape scale and decoupled weight decay; for square, wide and
// tall matrices, several of one shape in one batched call. Planted mistakes in
// the reference (wrong coefficients, the Gram of one side applied on the other)
// land outside the bound, so the bound can tell them apart; the output's singular values
// lie where NS5 puts them; the scratch holds the iteration (the small-side
// Grams) without a byte past its end; a non-finite gradient norm changes nothing.
#include "llmc/kernels/muon.cuh"
#include "test/kernels/kernel_test.h"

// Bound on ||O_device - O_ref||_F / ||O_ref||_F, O the orthogonalised update.
// bf16: the iteration rounds u, X, A, B and every new X to bf16 (relative error
// up to 2^-9 per element each time), and a step of the iteration multiplies an
// error in X by up to |p'(s)| (p(s) = a s + b s^3 + c s^5: 3.4445 at s = 0, 0.72 at
// 1, 3.9 at 1.2), so five steps of rounding leave errors of several 2^-9, about
// 1e-2: measured 1.2e-2 to 1.5e-2 on these shapes (and
// 1.4e-2 to 1.6e-2 by dev/muon_reference.py's bf16 simulation); 0.03 is twice that.
// fp32: the same arithmetic at 2^-24: measured 0.9e-6 to 2e-6, bound 1e-5 (as TOL_F32).
constexpr double TOL_NS_BF16 = 0.03, TOL_NS_FP32 = 1e-5;
#if defined(ENABLE_FP32)
constexpr double TOL_NS = TOL_NS_FP32;
#else
constexpr double TOL_NS = TOL_NS_BF16;
#endif

using Mat = std::vector<double>;  // row-major

static Mat matmul(const Mat& x, const Mat& y, int n, int k, int m) {  // (n x k) (k x m)
    Mat z((size_t)n * m, 0.0);
    for (int i = 0; i < n; i++)
        for (int l = 0; l < k; l++) {
            const double xil = x[(size_t)i * k + l];
            for (int j = 0; j < m; j++) z[(size_t)i * m + j] += xil * y[(size_t)l * m + j];
        }
    return z;
}
static Mat transpose(const Mat& x, int rows, int cols) {
    Mat t(x.size());
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = x[(size_t)i * cols + j];
    return t;
}
static double frobenius(const Mat& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return std::sqrt(s);
}
static double rel_frobenius(const Mat& got, const Mat& want) {
    Mat d(got.size());
    for (size_t i = 0; i < d.size(); i++) d[i] = got[i] - want[i];
    const double e = frobenius(d) / frobenius(want);
    return std::isnan(e) ? INFINITY : e;
}

// Which Gram the reference iterates with: the smaller one (Muon's), the larger
// one (the same polynomial, p(X X^T) X = X p(X^T X), at more cost), or the
// planted mistake of the Gram of one side applied on the other
// (A = X^T X, X = a X + B X; square matrices only).
enum class Gram { Small, Large, Mixed };
struct Coeffs {
    double a, b, c;
};
// Keller Jordan's coefficients, written here and not taken from muon.cuh, so that a
// typo there is a difference between the two.
constexpr Coeffs KJ{3.4445, -4.7750, 2.0315};

// X = u / (||u||_F + 1e-7), then 5 times A = X X^T, B = b A + c A A, X = a X + B X,
// with X transposed first (and back) when the chosen Gram is X^T X.
static Mat ref_newton_schulz(const Mat& u, int rows, int cols, Coeffs k, Gram gram) {
    const double inv = 1.0 / (frobenius(u) + 1e-7);
    Mat x(u.size());
    for (size_t i = 0; i < u.size(); i++) x[i] = u[i] * inv;
    const bool flip = gram == Gram::Small ? rows > cols : gram == Gram::Large ? rows < cols : false;
    int r = rows, c = cols;
    if (flip) {
        x = transpose(x, rows, cols);
        std::swap(r, c);
    }
    for (int step = 0; step < MUON_NS_STEPS; step++) {
        Mat a, left;
        if (gram == Gram::Mixed) a = matmul(transpose(x, r, c), x, c, r, c);  // X^T X (r == c)
        else a = matmul(x, transpose(x, r, c), r, c, r);                      // X X^T
        const Mat aa = matmul(a, a, r, r, r);
        Mat b(a.size());
        for (size_t i = 0; i < a.size(); i++) b[i] = k.b * a[i] + k.c * aa[i];
        const Mat bx = matmul(b, x, r, r, c);
        for (size_t i = 0; i < x.size(); i++) x[i] = k.a * x[i] + bx[i];
    }
    return flip ? transpose(x, r, c) : x;
}

// Singular values of x (rows x cols) from the eigenvalues of its smaller Gram,
// by cyclic Jacobi rotations (the Gram is symmetric positive semi-definite).
static std::vector<double> singular_values(const Mat& x, int rows, int cols) {
    const Mat xs = rows <= cols ? x : transpose(x, rows, cols);
    const int s = std::min(rows, cols), l = std::max(rows, cols);
    Mat g = matmul(xs, transpose(xs, s, l), s, l, s);
    for (int sweep = 0; sweep < 60; sweep++) {
        double off = 0;
        for (int p = 0; p < s; p++)
            for (int q = p + 1; q < s; q++) off += g[(size_t)p * s + q] * g[(size_t)p * s + q];
        if (off < 1e-26) break;
        for (int p = 0; p < s; p++)
            for (int q = p + 1; q < s; q++) {
                const double apq = g[(size_t)p * s + q];
                if (std::fabs(apq) < 1e-300) continue;
                const double theta = (g[(size_t)q * s + q] - g[(size_t)p * s + p]) / (2 * apq);
                const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
                for (int k = 0; k < s; k++) {  // columns p, q, then rows p, q: G = J^T G J
                    const double gkp = g[(size_t)k * s + p], gkq = g[(size_t)k * s + q];
                    g[(size_t)k * s + p] = cs * gkp - sn * gkq;
                    g[(size_t)k * s + q] = sn * gkp + cs * gkq;
                }
                for (int k = 0; k < s; k++) {
                    const double gpk = g[(size_t)p * s + k], gqk = g[(size_t)q * s + k];
                    g[(size_t)p * s + k] = cs * gpk - sn * gqk;
                    g[(size_t)q * s + k] = sn * gpk + cs * gqk;
                }
            }
    }
    std::vector<double> sv(s);
    for (int i = 0; i < s; i++) sv[i] = std::sqrt(std::max(0.0, g[(size_t)i * s + i]));
    std::sort(sv.begin(), sv.end());
    return sv;
}

// Bits of the bf16 values just below and above |p| (toward zero / away from zero),
// as in test_adamw.
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

constexpr unsigned char GUARD = 0xA5;

// Two steps (the second with the momentum of the first) on `count` rows x cols
// matrices in one call, each checked against the double reference.
static void test_muon(int count, int rows, int cols) {
    g_rng.seed(900 + count * 7 + rows * 3 + cols);
    const size_t per = (size_t)rows * cols, n = per * count;
    const float lr = 0.02f, wd = 0.1f, mu = 0.95f;
    const double scale = std::sqrt(std::max(1.0, (double)rows / cols));
    std::vector<float> master = randf(n, -0.05f, 0.05f), m(n, 0.0f);
    std::vector<floatX> params(n);
    for (size_t i = 0; i < n; i++) params[i] = from_float<floatX>(master[i]);
    Dev d;
    floatX* d_params = d.up(params);
    float *d_master = d.up(master), *d_m = d.up(m), *d_g = d.alloc<float>(n);
    const size_t scratch_bytes = muon_scratch_bytes(rows, cols, count);
    // past the end, room for the two larger Grams a wrong side would write: it then
    // shows as bytes written there, not as a heap overrun
    const size_t big = std::max(rows, cols), guard_bytes = 2 * count * big * big * sizeof(floatX) + 4096;
    unsigned char* d_scratch = d.up(std::vector<unsigned char>(scratch_bytes + guard_bytes, GUARD));
    for (int t = 1; t <= 2; t++) {
        const auto g = randf(n, -1.0f, 1.0f);
        d.put(d_g, g);
        muon_update(d_params, d_master, d_g, d_m, count, rows, cols, lr, wd, mu, nullptr, 500u + t, 0, d_scratch,
                    g_stream);
        const auto nm = to_host(d_master, n), nmom = to_host(d_m, n);
        const auto np = to_host(d_params, n);
        std::vector<double> rm(n), u(n);
        for (size_t i = 0; i < n; i++) {
            rm[i] = (double)mu * m[i] + g[i];
            u[i] = g[i] + (double)mu * rm[i];
        }
        const double e_m = norm_err(dbl(nmom), rm);
        int not_neighbour = 0;
        for (size_t i = 0; i < n; i++) not_neighbour += !is_neighbour(nm[i], np[i]);
        for (int b = 0; b < count; b++) {
            const size_t off = b * per;
            const Mat ub(u.begin() + off, u.begin() + off + per);
            const Mat o_ref = ref_newton_schulz(ub, rows, cols, KJ, Gram::Small);
            Mat o_dev(per);  // the update the device applied, O = (master (1 - lr wd) - master') / (lr scale)
            for (size_t i = 0; i < per; i++)
                o_dev[i] = (master[off + i] * (1 - (double)lr * wd) - nm[off + i]) / (lr * scale);
            const double e_o = rel_frobenius(o_dev, o_ref);
            CHECK(e_m <= TOL_F32 && e_o <= TOL_NS && not_neighbour == 0,
                  "muon_update %dx%d (matrix %d of %d, step %d): momentum (%.1e <= %.0e), update O vs double NS5 "
                  "(rel Frobenius %.2e <= %.0e), params a neighbour of master (%d not)",
                  rows, cols, b, count, t, e_m, TOL_F32, e_o, TOL_NS, not_neighbour);
            if (b > 0 || t > 1) continue;
            // The planted mistakes, each outside the bound that would judge it. A coefficient
            // typo (b = -4.7705) moves O by about 1e-2, the bf16 iteration's own error: the
            // fp32 build's bound (1e-5) is the one that sees it, and both builds run.
            const struct {
                const char* what;
                Coeffs k;
                double bound;
            } planted[] = {{"c = 2.315 (a dropped 0)", {KJ.a, KJ.b, 2.315}, TOL_NS},
                           {"the cubic's (1.5, -0.5, 0)", {1.5, -0.5, 0.0}, TOL_NS},
                           {"b = -4.7705 (swapped digits)", {KJ.a, -4.7705, KJ.c}, TOL_NS_FP32}};
            for (const auto& p : planted) {
                const double e = rel_frobenius(ref_newton_schulz(ub, rows, cols, p.k, Gram::Small), o_ref);
                CHECK(e > 5 * p.bound, "%dx%d planted: coefficients with %s move O by %.2e (> 5 x %.0e)", rows, cols,
                      p.what, e, p.bound);
            }
            if (rows == cols) {
                const double e_mixed = rel_frobenius(ref_newton_schulz(ub, rows, cols, KJ, Gram::Mixed), o_ref);
                CHECK(e_mixed > 5 * TOL_NS,
                      "%dx%d planted: the Gram X^T X applied on the left (X = a X + B X) moves O by %.2e (> 5 x %.0e)",
                      rows, cols, e_mixed, TOL_NS);
            } else {
                // the larger Gram is the same polynomial: only the cost and the scratch differ
                const double e_large = rel_frobenius(ref_newton_schulz(ub, rows, cols, KJ, Gram::Large), o_ref);
                CHECK(e_large <= 1e-10, "%dx%d: the larger Gram gives the same O in double (%.1e <= 1e-10)", rows, cols,
                      e_large);
            }
            // NS5 leaves the singular values near 1, not at 1: in about [0.7, 1.2] for a
            // well-conditioned input (a random rectangular one; a random square matrix
            // has singular values near 0 that 5 steps do not lift that far).
            const auto sv = singular_values(o_dev, rows, cols);
            const double lo = rows == cols ? sv[sv.size() / 10] : sv.front(), hi = sv.back();
            CHECK(lo >= 0.6 && hi <= 1.25, "%dx%d: singular values of O in [%.3f, %.3f] (%s; within [0.6, 1.25])", rows,
                  cols, lo, hi, rows == cols ? "from the 10th percentile" : "all");
        }
        master = nm;
        m = nmom;
    }
    // The small-side Grams fit the scratch: nothing past muon_scratch_bytes was written.
    const auto s = to_host(d_scratch, scratch_bytes + guard_bytes);
    size_t touched = 0;
    for (size_t i = scratch_bytes; i < s.size(); i++) touched += s[i] != GUARD;
    CHECK(touched == 0, "%dx%d x%d: scratch of %zu bytes, %zu bytes written past its end", rows, cols, count,
          scratch_bytes, touched);
}

// A non-finite gradient norm changes nothing (weights, master, momentum), as in
// adamw_update; the same inputs give bitwise the same step (fixed orders).
static void test_muon_skip_and_repeat() {
    g_rng.seed(950);
    const int rows = 48, cols = 80, count = 3;
    const size_t n = (size_t)rows * cols * count;
    const auto master = randf(n, -0.05f, 0.05f), m = randf(n, -0.1f, 0.1f), g = randf(n, -1.0f, 1.0f);
    std::vector<floatX> params(n);
    for (size_t i = 0; i < n; i++) params[i] = from_float<floatX>(master[i]);
    Dev d;
    floatX *d_p1 = d.up(params), *d_p2 = d.up(params);
    float *d_w1 = d.up(master), *d_w2 = d.up(master), *d_m1 = d.up(m), *d_m2 = d.up(m), *d_g = d.up(g);
    void* d_scratch = d.alloc<unsigned char>(muon_scratch_bytes(rows, cols, count));
    float* d_scale = d.alloc<float>(1);
    for (float bad : {NAN, INFINITY}) {
        float* d_norm = d.up(std::vector<float>{bad});
        grad_scale(d_scale, d_norm, 1.0f, g_stream);
        muon_update(d_p1, d_w1, d_g, d_m1, count, rows, cols, 0.02f, 0.1f, 0.95f, d_scale, 3u, 0, d_scratch, g_stream);
        CHECK(same_bits(to_host(d_p1, n), params) && same_bits(to_host(d_w1, n), master) &&
                  same_bits(to_host(d_m1, n), m),
              "muon_update with a %s gradient norm changes nothing", std::isnan(bad) ? "NaN" : "Inf");
    }
    float* d_norm = d.up(std::vector<float>{4.0f});  // clip 1 / (2 + 1e-6): active
    grad_scale(d_scale, d_norm, 1.0f, g_stream);
    muon_update(d_p1, d_w1, d_g, d_m1, count, rows, cols, 0.02f, 0.1f, 0.95f, d_scale, 3u, 0, d_scratch, g_stream);
    muon_update(d_p2, d_w2, d_g, d_m2, count, rows, cols, 0.02f, 0.1f, 0.95f, d_scale, 3u, 0, d_scratch, g_stream);
    const auto m1 = to_host(d_m1, n);
    std::vector<double> rm(n);
    for (size_t i = 0; i < n; i++) rm[i] = 0.95 * m[i] + g[i] / (2.0 + 1e-6);
    CHECK(same_bits(to_host(d_p1, n), to_host(d_p2, n)) && same_bits(to_host(d_w1, n), to_host(d_w2, n)) &&
              same_bits(m1, to_host(d_m2, n)) && norm_err(dbl(m1), rm) <= TOL_F32,
          "muon_update twice from the same state: bitwise the same; the clipped gradient in the momentum "
          "(%.1e <= %.0e)",
          norm_err(dbl(m1), rm), TOL_F32);
}

int main() {
    kernel_test_begin("test_muon");
    matmul_setup();
    printf("test_muon: TOL_NS = %.0e (update O, relative Frobenius)\n", TOL_NS);
    TEST_CASE(test_muon(1, 64, 64));   // square
    TEST_CASE(test_muon(2, 64, 256));  // wide, two in one batched call
    TEST_CASE(test_muon(2, 256, 64));  // tall
    TEST_CASE(test_muon(1, 40, 24));   // tall, sizes not multiples of 16
    TEST_CASE(test_muon_skip_and_repeat());
    matmul_teardown();
    return kernel_test_end("test_muon");
}
