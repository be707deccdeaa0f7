// The AdamW update (llmc/kernels/adamw.cuh) against one step in double, with gradient
// clipping from llmc/kernels/global_norm.cuh's norm; stochastic rounding of the master
// weights to floatX; updates in pieces with index offsets (a ZeRO-1 shard);
// a non-finite gradient norm that skips the step.
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "test/kernels/kernel_test.h"

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
    float *d_norm = d.alloc<float>(1), *d_scale = d.alloc<float>(1);
    float* d_scratch = d.alloc<float>(global_norm_scratch_floats());
    const int steps[] = {1, 2, 3, 1000};
    for (int t : steps) {
        const auto g = randf(n, -0.5f, 0.5f);
        d.put(d_g, g);
        global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
        const float ns = to_host(d_norm, 1)[0];
        const float grad_clip = clip_mode > 0 ? clip_mode * std::sqrt(ns) : 0.0f;
        grad_scale(d_scale, d_norm, grad_clip, g_stream);
        adamw_update(d_params, d_master, d_g, d_m, d_v, n, lr, beta1, beta2, eps, weight_decay, t,
                     clip_mode > 0 ? d_scale : nullptr, 1000u + t, 0, g_stream);
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
        const double e_p = max_rel_diff(nm.data(), rp.data(), n, lr),
                     e_d = norm_err(delta, rdelta);  // floor: one update's size
        const double e_m = norm_err(dbl(nmm), rm), e_v = norm_err(dbl(nv), rv);
        int not_neighbour = 0;
        for (size_t i = 0; i < n; i++) not_neighbour += !is_neighbour(nm[i], np[i]);
        CHECK(e_p <= TOL_F32 && e_d <= TOL_F32 && e_m <= TOL_F32 && e_v <= TOL_F32 && not_neighbour == 0,
              "adamw_update n=%zu t=%d wd=%.1f clip %s: master (rel %.1e, floor lr; update norm %.1e), m (%.1e), v "
              "(%.1e) <= %.0e; "
              "params a neighbour of master (%d not)",
              n, t, weight_decay,
              clip_mode == 0 ? "disabled"
              : clip < 1     ? "active"
                             : "inactive",
              e_p, e_d, e_m, e_v, TOL_F32, not_neighbour);
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
    float *d_master = d.alloc<float>(n), *d_m = d.up(std::vector<float>(n, 0.0f)),
          *d_v = d.up(std::vector<float>(n, 0.0f));
    float* d_g = d.up(std::vector<float>(n, 0.0f));
    for (float x : values) {
        for (uint32_t seed : {1u, 77u}) {
            d.put(d_master, std::vector<float>(n, x));
            adamw_update(d_params, d_master, d_g, d_m, d_v, n, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, nullptr, seed, 0,
                         g_stream);
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
            CHECK(bad == 0 && e <= 0.01 * ulp,
                  "stochastic rounding of %.7g (seed %u) over %zu elements: mean off by %.3g ulp (<= 0.01), "
                  "%d results not a neighbour",
                  x, seed, n, ulp > 0 ? e / ulp : e, bad);
        }
    }
}

// The rounding rule bit for bit, written out here: the bf16 weight is the top
// 16 bits of (master bits + the 16 noise bits of hash(index ^ hash(seed))),
// and of the master bits alone when master is infinite or NaN. lr = 0 leaves
// master as it was; it holds NaNs whose low payload bits would carry into the
// kept bits if the noise were added to them, infinities, the largest finite
// values (which round up to infinity), subnormals and random values. Three
// sizes and starts run the three widths of the kernel (a 16-byte pack of the
// weights, 4, 1 per thread; adamw_pack_width, checked too), each with an
// index offset past 2^32 (the hash takes it mod 2^32).
static void test_stochastic_rounding_bits() {
    const uint32_t specials[] = {0x7FC0FFFFu, 0xFFC0FFFFu, 0x7FC00001u, 0x7F800000u, 0xFF800000u,
                                 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u, 0x807FFFFFu, 0x00000000u};
    const size_t offset = (1ull << 32) + 7, most = 4099;
    const uint32_t seed = 31337u;
    g_rng.seed(801);
    auto master = randf(most + 4, -3.0f, 3.0f);
    for (size_t i = 0; i < master.size(); i += 97) memcpy(&master[i], &specials[(i / 97) % 10], 4);
    Dev d;
    struct Case {
        size_t n, start;
        int width;
    };
    // start 0: every array aligned as cudaMalloc aligns; start 4: 16 bytes into the fp32 arrays
    const Case cases[] = {{4096, 0, PACK128<floatX>}, {4096, 4, 4}, {most, 1, 1}};
    for (const Case& c : cases) {
        const size_t n = c.n, start = c.start;
        floatX* d_params = d.alloc<floatX>(most + 4);
        float *d_master = d.up(master), *d_g = d.up(std::vector<float>(most + 4, 0.0f)),
              *d_m = d.up(std::vector<float>(most + 4, 0.0f)), *d_v = d.up(std::vector<float>(most + 4, 0.0f));
        const int width =
            adamw_pack_width(n, d_params + start, d_master + start, d_g + start, d_m + start, d_v + start);
        CHECK(width == c.width, "n %zu from element %zu: %d elements per thread (want %d)", n, start, width, c.width);
        adamw_update(d_params + start, d_master + start, d_g + start, d_m + start, d_v + start, n, 0.0f, 0.9f, 0.95f,
                     1e-8f, 0.0f, 1, nullptr, seed, offset, g_stream);
        const auto p = to_host(d_params, most + 4);
        const auto after = to_host(d_master, most + 4);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &after[start + i], 4);
#if defined(ENABLE_FP32)
            const uint32_t want = bits, got_bits = [&] {
                uint32_t b;
                memcpy(&b, &p[start + i], 4);
                return b;
            }();
#else
            const uint32_t noise = hash_u32((uint32_t)(offset + i) ^ hash_u32(seed)) & 0xFFFFu;
            const bool finite = (bits & 0x7F800000u) != 0x7F800000u;
            const uint32_t want = (finite ? bits + noise : bits) >> 16, got_bits = [&] {
                uint16_t b;
                memcpy(&b, &p[start + i], 2);
                return (uint32_t)b;
            }();
#endif
            wrong += got_bits != want;
        }
        CHECK(wrong == 0,
              "stochastic rounding bit for bit (%d per thread, n %zu, index offset 2^32 + 7, NaN payloads, inf, "
              "max finite, subnormals): %zu of %zu weights differ from the rule",
              width, n, wrong, n);
    }
}

// A tensor updated in pieces (as a ZeRO-1 shard is: each piece with the
// offset of its first element in the tensor) gives bitwise the weights of
// one update of the whole tensor, stochastic rounding included.
static void test_adamw_in_pieces() {
    g_rng.seed(800);
    const size_t n = 10007, cuts[] = {0, 1, 2500, 2501, 7000, n};
    const auto master = randf(n, -1.0f, 1.0f), g = randf(n, -0.5f, 0.5f);
    Dev d;
    floatX *d_whole = d.alloc<floatX>(n), *d_pieces = d.alloc<floatX>(n);
    float *d_g = d.up(g), *d_mw = d.up(master), *d_mp = d.up(master);
    float *d_m1 = d.up(std::vector<float>(n, 0.0f)), *d_v1 = d.up(std::vector<float>(n, 0.0f));
    float *d_m2 = d.up(std::vector<float>(n, 0.0f)), *d_v2 = d.up(std::vector<float>(n, 0.0f));
    adamw_update(d_whole, d_mw, d_g, d_m1, d_v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, nullptr, 99u, 0, g_stream);
    for (int k = 0; k + 1 < 6; k++) {
        const size_t a = cuts[k], len = cuts[k + 1] - a;
        adamw_update(d_pieces + a, d_mp + a, d_g + a, d_m2 + a, d_v2 + a, len, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3,
                     nullptr, 99u, a, g_stream);
    }
    const auto w = to_host(d_whole, n), p = to_host(d_pieces, n);
    const auto mw = to_host(d_mw, n), mp = to_host(d_mp, n);
    CHECK(memcmp(w.data(), p.data(), n * sizeof(floatX)) == 0 && memcmp(mw.data(), mp.data(), n * 4) == 0,
          "adamw_update in 5 pieces with index offsets: weights and master bitwise equal to one whole update");
    // a non-finite gradient norm (its scale NaN) leaves weights, master, m and v untouched
    const auto m_before = to_host(d_m1, n);
    float* d_scale = d.alloc<float>(1);
    for (float bad : {NAN, INFINITY}) {
        float* d_norm = d.up(std::vector<float>{bad});
        grad_scale(d_scale, d_norm, 1.0f, g_stream);
        adamw_update(d_whole, d_mw, d_g, d_m1, d_v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, d_scale, 7u, 0, g_stream);
        CHECK(memcmp(to_host(d_whole, n).data(), w.data(), n * sizeof(floatX)) == 0 &&
                  memcmp(to_host(d_mw, n).data(), mw.data(), n * 4) == 0 &&
                  memcmp(to_host(d_m1, n).data(), m_before.data(), n * 4) == 0,
              "adamw_update with a %s gradient norm changes nothing", std::isnan(bad) ? "NaN" : "Inf");
    }
}

// grad_scale against the formula in double: min(1, clip / (norm + 1e-6)), 1
// without clipping, NaN (the step skipped) for a non-finite norm, clipping or not.
static void test_grad_scale() {
    Dev d;
    float *d_ns = d.alloc<float>(1), *d_scale = d.alloc<float>(1);
    const float norms_squared[] = {0.0f, 1e-8f, 0.25f, 1.0f, 4.0f, 1e6f, 3e38f};
    const float clips[] = {0.0f, -1.0f, 0.5f, 1.0f, 1e3f};
    int worst = 0;
    double worst_err = 0;
    for (float ns : norms_squared)
        for (float clip : clips) {
            d.put(d_ns, std::vector<float>{ns});
            grad_scale(d_scale, d_ns, clip, g_stream);
            const double got = to_host(d_scale, 1)[0];
            const double want = clip > 0 ? std::min(1.0, clip / (std::sqrt((double)ns) + 1e-6)) : 1.0;
            const double err = std::fabs(got - want) / want;
            worst_err = std::max(worst_err, err);
            worst += !(err <= TOL_F32);
        }
    CHECK(worst == 0, "grad_scale over %zu norms x %zu clips: max rel err %.1e <= %.0e (%d over)",
          std::size(norms_squared), std::size(clips), worst_err, TOL_F32, worst);
    int finite = 0;
    for (float bad : {NAN, INFINITY, -INFINITY})
        for (float clip : clips) {
            d.put(d_ns, std::vector<float>{bad});
            grad_scale(d_scale, d_ns, clip, g_stream);
            finite += !std::isnan(to_host(d_scale, 1)[0]);
        }
    CHECK(finite == 0, "grad_scale of a NaN or infinite norm is NaN, with and without clipping (%d not)", finite);
}

int main() {
    kernel_test_begin("test_adamw");
    TEST_CASE(test_grad_scale());
    TEST_CASE(test_adamw(1037, 0.1f, 0.5f));  // clipping active
    TEST_CASE(test_adamw(1037, 0.0f, 0.0f));  // clipping disabled, no weight decay
    TEST_CASE(test_adamw(140001, 0.1f, 1e3f));  // clip above the norm: inactive; grid-stride wraps
    TEST_CASE(test_adamw(140000, 0.1f, 0.5f));  // a multiple of 4: 16-byte accesses
    TEST_CASE(test_stochastic_rounding());
    TEST_CASE(test_stochastic_rounding_bits());
    TEST_CASE(test_adamw_in_pieces());
    return kernel_test_end("test_adamw");
}
