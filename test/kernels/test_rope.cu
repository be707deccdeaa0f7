// Rotary position embedding (llmc/kernels/rope.cuh): Llama 3.1's frequency rule, the
// table, and the forward and backward kernels, in place on a grouped-query
// q|k|v layout, with default and document-relative positions, against a
// rotation in double. Each bound is also shown able to fail: the same metric
// rejects the interleaved (2i, 2i+1) pairing and positions that ignore the
// document starts.
//
// Bounds: each output is a x cos - b sin of floatX inputs in fp32 with the
// table's fp32 cos and sin (within 6e-8 of the true ones), rounded once to
// floatX: TOL_X (kernel_test.h). Measured: 2.8e-3 to 2.9e-3 of the tensor's
// largest value in the bf16 build (one rounding: at most 2^-8 = 3.9e-3), about
// 9e-8 in the fp32 build.
#include "llmc/kernels/rope.cuh"
#include "test/kernels/kernel_test.h"

// Llama 3.1's published rule, written the other way round from the header's: on
// the wavelength, with the band edges as frequencies.
static double scaled_frequency_ref(double f, const RopeScaling& s) {
    const double f_high = s.high_freq_factor * 2 * M_PI / s.original_max_position;  // above: kept
    const double f_low = s.low_freq_factor * 2 * M_PI / s.original_max_position;    // below: divided
    if (f > f_high) return f;
    if (f < f_low) return f / s.factor;
    const double smooth = (s.original_max_position * f / (2 * M_PI) - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    return f / s.factor + smooth * (f - f / s.factor);
}

static RopeScaling llama31() {
    RopeScaling s;
    s.factor = 8;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_position = 8192;
    return s;
}

static void test_rope_frequencies() {
    const int HS = 128;
    const double theta = 500000;
    const RopeScaling s = llama31();
    const std::vector<double> f = rope_frequencies(HS, theta, s), plain = rope_frequencies(HS, theta, RopeScaling());
    int kept = 0, divided = 0, smoothed = 0;
    double worst = 0;
    for (int i = 0; i < HS / 2; i++) {
        const double fi = std::pow(theta, -(2.0 * i) / HS);
        worst = std::max(worst, std::fabs(f[i] - scaled_frequency_ref(fi, s)) / fi + std::fabs(plain[i] - fi) / fi);
        kept += f[i] == fi;
        divided += std::fabs(f[i] - fi / 8) <= 1e-15 * fi;
        smoothed += f[i] < fi && f[i] > fi / 8;
    }
    CHECK(worst < 1e-14, "rope_frequencies HS=128 theta=5e5: Llama 3.1's rule, and factor 1 unscaled (rel err %.1e)",
          worst);
    // wavelengths 2 pi theta^(2i/128) pass 2048 at i = 64 ln(2048 / 2 pi) / ln(theta) = 28.2 and
    // 8192 at i = 35.0 (34.98)
    CHECK(kept == 29 && smoothed == 6 && divided == 29,
          "rope_frequencies: 29 kept, 6 interpolated, 29 divided by 8 (got %d, %d, %d)", kept, smoothed, divided);
    bool threw = false;
    RopeScaling bad = s;
    bad.high_freq_factor = bad.low_freq_factor;
    try {
        rope_frequencies(HS, theta, bad);
    } catch (const llmc::Error&) {
        threw = true;
    }
    CHECK(threw, "rope_frequencies: high_freq_factor == low_freq_factor (a division by zero) is refused");
}

// The table against cos and sin of p f_i in double: one fp32 rounding each.
static void test_rope_table() {
    const int maxT = 9000, HS = 64;
    const std::vector<float> t = rope_table(maxT, HS, 500000, llama31());
    const std::vector<double> f = rope_frequencies(HS, 500000, llama31());
    double worst = 0;
    for (int p = 0; p < maxT; p += 37)
        for (int i = 0; i < HS / 2; i++) {
            worst = std::max(worst, std::fabs(t[(size_t)p * HS + i] - std::cos(p * f[i])));
            worst = std::max(worst, std::fabs(t[(size_t)p * HS + HS / 2 + i] - std::sin(p * f[i])));
        }
    CHECK(worst <= 6e-8, "rope_table maxT=9000 HS=64: cos and sin within fp32's rounding (max abs err %.1e <= 6e-8)",
          worst);
}

// Rotation of the first H heads of each token in double. pairing: the partner of
// element i < HS/2 is i + HS/2 (Llama, transformers), or with interleaved = true
// element 2i with 2i + 1 (the planted wrong one). sign = -1: the transpose.
static std::vector<double> rope_ref(const std::vector<double>& x, const std::vector<int>& pos, int H, int HS,
                                    int stride, const std::vector<double>& f, double sign, bool interleaved = false) {
    std::vector<double> y = x;
    for (size_t tok = 0; tok < pos.size(); tok++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HS / 2; i++) {
                const size_t a = tok * stride + (size_t)h * HS + (interleaved ? 2 * i : i);
                const size_t b = interleaved ? a + 1 : a + HS / 2;
                const double c = std::cos(pos[tok] * f[i]), s = sign * std::sin(pos[tok] * f[i]);
                y[a] = x[a] * c - x[b] * s;
                y[b] = x[b] * c + x[a] * s;
            }
    return y;
}

// Document starts at t = 0, 5 and 17 of every row: positions restart at each.
static std::vector<int> doc_positions(int B, int T) {
    std::vector<int> pos((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0; t < T; t++) {
            if (t == 5 || t == 17) start = t;
            pos[(size_t)b * T + t] = t - start;
        }
    return pos;
}

// Forward then backward, in place on q|k|v rows of grouped-query attention
// (NH query heads, NKV key/value heads): q and k rotated, v untouched.
static void test_rope(int B, int T, int NH, int NKV, int HS, bool docs, int pos_offset = 0) {
    g_rng.seed(500 + B * 13 + T * 7 + HS + docs);
    const int H = NH + NKV, stride = (NH + 2 * NKV) * HS, maxT = T + pos_offset;
    const size_t tokens = (size_t)B * T, n = tokens * stride;
    const double theta = 500000;
    const RopeScaling s = llama31();
    const auto qkv = randx(n, -2, 2), dqkv = randx(n, -1, 1);
    std::vector<int> pos(tokens), plain(tokens);
    for (size_t k = 0; k < tokens; k++) pos[k] = plain[k] = (int)(k % T);
    if (docs) pos = doc_positions(B, T);
    for (auto& p : pos) p += pos_offset;  // far positions: the slow, scaled rotations turn visibly

    Dev d;
    floatX *d_x = d.up(qkv), *d_dx = d.up(dqkv);
    float* d_table = d.up(rope_table(maxT, HS, theta, s));
    int* d_pos = docs || pos_offset ? d.up(pos) : nullptr;
    rope_forward(d_x, d_x, d_table, d_pos, B, T, H, HS, stride, maxT, g_stream);
    rope_backward(d_dx, d_dx, d_table, d_pos, B, T, H, HS, stride, maxT, g_stream);
    const auto y = to_host(d_x, n), dy = to_host(d_dx, n);

    const std::vector<double> f = rope_frequencies(HS, theta, s);
    const auto yref = rope_ref(dbl(qkv), pos, H, HS, stride, f, 1),
               dref = rope_ref(dbl(dqkv), pos, H, HS, stride, f, -1);
    const double e_y = norm_err(dbl(y), yref), e_d = norm_err(dbl(dy), dref);
    CHECK(e_y <= TOL_X, "rope_forward B=%d T=%d NH=%d NKV=%d HS=%d%s (norm err %.2e <= %.1e)", B, T, NH, NKV, HS,
          docs ? " document positions" : "", e_y, TOL_X);
    CHECK(e_d <= TOL_X, "rope_backward B=%d T=%d NH=%d NKV=%d HS=%d%s (norm err %.2e <= %.1e)", B, T, NH, NKV, HS,
          docs ? " document positions" : "", e_d, TOL_X);
    bool v_same = true;
    for (size_t tok = 0; tok < tokens; tok++)
        for (size_t c = (size_t)H * HS; c < (size_t)stride; c++) {
            v_same = v_same && memcmp(&y[tok * stride + c], &qkv[tok * stride + c], sizeof(floatX)) == 0;
            v_same = v_same && memcmp(&dy[tok * stride + c], &dqkv[tok * stride + c], sizeof(floatX)) == 0;
        }
    CHECK(v_same, "rope B=%d T=%d HS=%d: the v heads are left alone, bitwise", B, T, HS);

    // the bound can fail: the other pairing, and positions that ignore the document starts
    const double e_pair = norm_err(dbl(y), rope_ref(dbl(qkv), pos, H, HS, stride, f, 1, true));
    CHECK(e_pair > TOL_X,
          "rope_forward HS=%d: the bound rejects the interleaved (2i, 2i+1) pairing (norm err %.2e > %.1e)", HS, e_pair,
          TOL_X);
    if (pos_offset) {
        const std::vector<double> unscaled = rope_frequencies(HS, theta, RopeScaling());
        const double e_scale = norm_err(dbl(y), rope_ref(dbl(qkv), pos, H, HS, stride, unscaled, 1));
        CHECK(e_scale > TOL_X,
              "rope_forward: the bound rejects unscaled frequencies at positions near %d (norm err %.2e > %.1e)",
              pos_offset, e_scale, TOL_X);
    }
    if (docs) {
        const double e_pos = norm_err(dbl(y), rope_ref(dbl(qkv), plain, H, HS, stride, f, 1));
        CHECK(e_pos > TOL_X,
              "rope_forward: the bound rejects positions t instead of the document's (norm err %.2e > %.1e)", e_pos,
              TOL_X);
    }
}

// The reference backward is the forward's transpose: <dy, R x> = <R^T dy, x>.
static void test_rope_reference_adjoint() {
    g_rng.seed(17);
    const int T = 9, H = 3, HS = 16, stride = H * HS;
    const std::vector<double> f = rope_frequencies(HS, 10000, RopeScaling());
    const auto x = dbl(randf((size_t)T * stride, -1, 1)), dy = dbl(randf((size_t)T * stride, -1, 1));
    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = 3 * t + 1;
    const auto rx = rope_ref(x, pos, H, HS, stride, f, 1), rdy = rope_ref(dy, pos, H, HS, stride, f, -1);
    double lhs = 0, rhs = 0;
    for (size_t k = 0; k < x.size(); k++) {
        lhs += dy[k] * rx[k];
        rhs += rdy[k] * x[k];
    }
    CHECK(std::fabs(lhs - rhs) < 1e-12,
          "rope reference backward is the forward's transpose (|<dy,Rx> - <R'dy,x>| = %.1e)", std::fabs(lhs - rhs));
}

// A position outside the table gives NaN outputs, not a read out of bounds.
static void test_rope_position_out_of_table() {
    const int T = 4, HS = 16, maxT = 8;
    std::vector<floatX> x((size_t)T * HS, from_float<floatX>(1.0f));
    const std::vector<int> pos = {0, 7, 8, -1};
    Dev d;
    floatX* d_x = d.up(x);
    float* d_table = d.up(rope_table(maxT, HS, 10000, RopeScaling()));
    int* d_pos = d.up(pos);
    rope_forward(d_x, d_x, d_table, d_pos, 1, T, 1, HS, HS, maxT, g_stream);
    const auto y = to_host(d_x, x.size());
    int nan_rows = 0, finite_rows = 0;
    for (int t = 0; t < T; t++) {
        int nans = 0;
        for (int c = 0; c < HS; c++) nans += std::isnan(to_float(y[(size_t)t * HS + c]));
        nan_rows += nans == HS;
        finite_rows += nans == 0;
    }
    CHECK(nan_rows == 2 && finite_rows == 2 && std::isnan(to_float(y[2 * HS])) && !std::isnan(to_float(y[HS])),
          "rope_forward: positions 8 and -1 (table of 8) give NaN rows, 0 and 7 finite ones");
}

int main() {
    kernel_test_begin("test_rope");
    TEST_CASE(test_rope_frequencies());
    TEST_CASE(test_rope_table());
    TEST_CASE(test_rope_reference_adjoint());
    TEST_CASE(test_rope(2, 24, 4, 2, 64, false));
    TEST_CASE(test_rope(2, 24, 4, 2, 64, true));          // document-relative positions
    TEST_CASE(test_rope(1, 16, 4, 1, 128, true, 8000));   // positions near 8000: Llama 3.1's scaled band turns
    TEST_CASE(test_rope(3, 7, 2, 2, 12, false));          // HS/2 = 6: one element per access
    TEST_CASE(test_rope_position_out_of_table());
    return kernel_test_end("test_rope");
}
