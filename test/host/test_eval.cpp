// Tests of the evaluation helpers: llmc/run/sampler.h (next-token sampling),
// llmc/data/hellaswag.h (llm.c's HellaSwag eval file, rows, prediction) and
// llmc/run/mfu.h (peak FLOP/s table, MFU, ETA formatting).
//
// With SHARED_DATA set and build/host/hellaswag built, the real validation set
// is converted into the temporary folder and loaded (10,042 examples);
// otherwise that part prints a SKIP line saying why.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/data/hellaswag.h"
#include "llmc/run/mfu.h"
#include "llmc/run/sampler.h"
#include "test/host/host_util.h"
#include "test/test_util.h"

// ---------------------------------------------------------------------------
// sampler

static std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max(mx, (double)x);
    std::vector<double> p;
    for (float x : logits) p.push_back(std::exp(((double)x - mx) / temperature));
    for (double v : p) sum += v;
    for (double& v : p) v /= sum;
    return p;
}

// Frequencies of `draws` samples; counts outside [0, V) land in the last slot.
static std::vector<double> frequencies(const std::vector<float>& logits, float temperature, int top_k, int draws,
                                       uint64_t seed) {
    const int V = (int)logits.size();
    std::vector<double> f(V + 1, 0.0);
    SamplerRng rng = sampler_rng(seed);
    for (int i = 0; i < draws; i++) {
        int t = sample_token(logits.data(), V, temperature, top_k, &rng);
        f[(t >= 0 && t < V) ? t : V] += 1.0 / draws;
    }
    return f;
}

static void test_rng() {
    // splitmix64's published first output for state 0: integer arithmetic only,
    // so the same on every platform
    SamplerRng r = sampler_rng(0);
    uint64_t a = rng_next(&r), b = rng_next(&r);
    CHECK(a == 0xE220A8397B1DCDAFull && b == 0x6E789E6AA1B965F4ull,
          "splitmix64 from state 0: 0x%016llx 0x%016llx (published values)", (unsigned long long)a,
          (unsigned long long)b);
    SamplerRng u = sampler_rng(12345);
    double mean = 0, lo = 1, hi = 0;
    bool in_range = true;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float x = rng_uniform(&u);
        double y = rng_uniform_double(&u);
        in_range = in_range && x >= 0.0f && x < 1.0f && y >= 0.0 && y < 1.0;
        mean += x / n;
        lo = std::min(lo, (double)x);
        hi = std::max(hi, (double)x);
    }
    CHECK(in_range && std::fabs(mean - 0.5) < 0.005 && lo < 1e-4 && hi > 1 - 1e-4,
          "rng_uniform / rng_uniform_double in [0,1), mean %.4f, range [%.2g, %.6f]", mean, lo, hi);
    // the largest possible draw is still below 1
    uint64_t all_ones = ~0ull;
    float fmax = (float)(all_ones >> 40) * (1.0f / 16777216.0f);
    double dmax = (double)(all_ones >> 11) * (1.0 / 9007199254740992.0);
    CHECK(fmax < 1.0f && dmax < 1.0, "the top draw maps below 1 (float %.9g, double %.17g)", fmax, dmax);
}

static void test_sampler_greedy() {
    const float l[] = {1.0f, 5.0f, 3.0f, 2.0f};
    SamplerRng rng = sampler_rng(7);
    const uint64_t before = rng.state;
    int g0 = sample_token(l, 4, 0.0f, 0, &rng);
    int gneg = sample_token(l, 4, -1.0f, 0, &rng);
    int gnan = sample_token(l, 4, NAN, 3, &rng);
    CHECK(g0 == 1 && gneg == 1 && gnan == 1 && rng.state == before,
          "temperature 0, -1 and NaN: argmax (%d %d %d), no draw taken", g0, gneg, gnan);

    const float ties[] = {2.0f, 7.0f, -3.0f, 7.0f, 7.0f};
    CHECK(sample_token(ties, 5, 0.0f, 0, &rng) == 1, "greedy tie: the lowest id of the maxima");
    const float nan_first[] = {NAN, -1.0f, 4.0f, NAN, 4.0f};
    CHECK(sample_token(nan_first, 5, 0.0f, 0, &rng) == 2, "greedy skips NaN, then lowest id of the maxima");

    // only the first vocab_size entries are read: a huge padded column never wins
    std::vector<float> padded = {0.1f, 0.3f, 0.2f, 100.0f, 100.0f, 100.0f};
    bool never_padded = sample_token(padded.data(), 3, 0.0f, 0, &rng) == 1;
    SamplerRng r2 = sampler_rng(3);
    for (int i = 0; i < 2000; i++) {
        int t = sample_token(padded.data(), 3, 1.0f, 0, &r2);
        never_padded = never_padded && t >= 0 && t < 3;
        t = sample_token(padded.data(), 3, 2.0f, 2, &r2);  // the top 2 of the real 3: ids 1 and 2
        never_padded = never_padded && (t == 1 || t == 2);
    }
    CHECK(never_padded, "padded columns beyond vocab_size are never returned (greedy, sampled, top-k)");
    CHECK(sample_token(l, 0, 1.0f, 0, &rng) == -1 && sample_token(nullptr, 4, 1.0f, 0, &rng) == -1,
          "vocab_size 0 or null logits: -1");

    // a tiny temperature is greedy in effect
    SamplerRng r3 = sampler_rng(11);
    bool cold = true;
    for (int i = 0; i < 500; i++) cold = cold && sample_token(l, 4, 1e-6f, 0, &r3) == 1;
    CHECK(cold, "temperature 1e-6 always picks the argmax");

    // top_k = 1 equals greedy on random rows with ties, at any temperature
    SamplerRng gen = sampler_rng(99), r4 = sampler_rng(5);
    bool same = true;
    int tie_rows = 0;
    for (int row = 0; row < 300; row++) {
        std::vector<float> x(37);
        // few distinct values: many ties
        for (float& v : x) v = (float)(rng_next(&gen) % 6) - 2.0f;
        int g = sample_token(x.data(), 37, 0.0f, 0, &r4);
        tie_rows += std::count(x.begin(), x.end(), x[g]) > 1;
        for (float t : {0.5f, 1.0f, 3.0f}) same = same && sample_token(x.data(), 37, t, 1, &r4) == g;
    }
    CHECK(same && tie_rows > 100, "top_k=1 == greedy at T 0.5/1/3 on 300 random rows (%d with tied maxima)", tie_rows);

    // -inf and NaN are never sampled; a row of nothing else falls back to greedy
    const float masked[] = {-INFINITY, 0.0f, NAN, -INFINITY, 0.0f};
    SamplerRng r5 = sampler_rng(8);
    bool only_live = true;
    int c1 = 0;
    for (int i = 0; i < 4000; i++) {
        int t = sample_token(masked, 5, 1.0f, 0, &r5);
        only_live = only_live && (t == 1 || t == 4);
        c1 += t == 1;
    }
    CHECK(only_live && std::fabs(c1 / 4000.0 - 0.5) < 0.03,
          "-inf and NaN logits never sampled (id 1: %.3f, expect 0.5)", c1 / 4000.0);
    const float dead[] = {NAN, -INFINITY, -INFINITY};
    const float all_nan[] = {NAN, NAN};
    const float pos_inf[] = {0.0f, INFINITY, 1e30f, INFINITY};
    SamplerRng r6 = sampler_rng(1);
    int d = sample_token(dead, 3, 1.0f, 0, &r6), an = sample_token(all_nan, 2, 1.0f, 0, &r6);
    bool inf_ok = true;
    for (int i = 0; i < 200; i++) {
        int t = sample_token(pos_inf, 4, 1.0f, 0, &r6);
        inf_ok = inf_ok && (t == 1 || t == 3);
    }
    CHECK(d == 1 && an == 0 && inf_ok,
          "degenerate rows: all -inf/NaN -> %d (1), all NaN -> %d (0), +inf shares the mass", d, an);
    const float wide[] = {0.0f, -1.0f};
    SamplerRng r7 = sampler_rng(2);
    int c0 = 0;
    for (int i = 0; i < 4000; i++) c0 += sample_token(wide, 2, INFINITY, 0, &r7) == 0;
    CHECK(std::fabs(c0 / 4000.0 - 0.5) < 0.03, "temperature inf: uniform (id 0: %.3f)", c0 / 4000.0);
}

static void test_sampler_distribution() {
    const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -0.3f};
    const int draws = 20000;
    for (float temp : {1.0f, 0.5f}) {
        std::vector<double> p = softmax(logits, temp);
        std::vector<double> f = frequencies(logits, temp, 0, draws, 2024);
        double worst = 0;
        for (size_t i = 0; i < p.size(); i++) worst = std::max(worst, std::fabs(f[i] - p[i]));
        CHECK(worst < 0.02 && f.back() == 0, "T=%.1f: %d draws within 2%% of softmax (worst |f-p| %.4f)", temp, draws,
              worst);
    }
    // top-k = 3: only the three largest, renormalised
    {
        std::vector<double> p = softmax({0.5f, 2.0f, 1.2f}, 1.0);  // ids 0, 2, 4
        std::vector<double> f = frequencies(logits, 1.0f, 3, draws, 77);
        double worst = std::max({std::fabs(f[0] - p[0]), std::fabs(f[2] - p[1]), std::fabs(f[4] - p[2])});
        CHECK(f[1] == 0 && f[3] == 0 && f[5] == 0 && worst < 0.02,
              "top_k=3: only ids 0, 2, 4, renormalised softmax within 2%% (worst %.4f)", worst);
    }
    // top-k ties at the cut: the lower ids are kept
    {
        const std::vector<float> t = {3.0f, 1.0f, 3.0f, 3.0f, 5.0f};
        std::vector<double> f = frequencies(t, 1.0f, 2, 4000, 5);
        std::vector<double> g = frequencies(t, 1.0f, 3, 4000, 5);
        CHECK(f[0] > 0 && f[4] > 0 && f[1] == 0 && f[2] == 0 && f[3] == 0 && g[2] > 0 && g[3] == 0,
              "top_k ties at the cut go to the lower id (k=2 keeps 4,0; k=3 keeps 4,0,2)");
    }
    // top_k >= V or <= 0: no truncation
    {
        std::vector<double> a = frequencies(logits, 1.0f, 0, 3000, 9);
        std::vector<double> b = frequencies(logits, 1.0f, 6, 3000, 9);
        std::vector<double> c = frequencies(logits, 1.0f, -4, 3000, 9);
        std::vector<double> d = frequencies(logits, 1.0f, 100, 3000, 9);
        CHECK(a == b && a == c && a == d && a[1] > 0, "top_k 0, -4, V and > V: identical draws (no truncation)");
    }
    // GPT-2's vocabulary: one token holding 1% of the mass, the rest spread thinly
    {
        std::vector<float> big(50257, 0.0f);
        big[50000] = (float)std::log(50256.0 / 99.0);  // p = 1/100
        SamplerRng r = sampler_rng(31);
        int hits = 0;
        const int n = 5000;  // the frequency's standard deviation: 0.0014
        for (int i = 0; i < n; i++) hits += sample_token(big.data(), 50257, 1.0f, 0, &r) == 50000;
        CHECK(std::fabs(hits / (double)n - 0.01) < 0.004, "V=50257: a 1%% token drawn at %.4f", hits / (double)n);
    }
}

static void test_sampler_determinism() {
    std::vector<float> x(1000);
    SamplerRng gen = sampler_rng(4);
    for (float& v : x) v = rng_uniform(&gen) * 6.0f - 3.0f;
    auto run = [&](uint64_t seed, int k) {
        SamplerRng r = sampler_rng(seed);
        std::vector<int> out;
        for (int i = 0; i < 500; i++) out.push_back(sample_token(x.data(), 1000, 0.8f, k, &r));
        out.push_back((int)(r.state & 0x7fffffff));
        return out;
    };
    CHECK(run(42, 0) == run(42, 0) && run(42, 50) == run(42, 50), "same seed: same 500 tokens (full and top-50)");
    CHECK(run(42, 0) != run(43, 0), "different seeds: different tokens");
    // one draw per sampled token, whatever the logits or k: the stream stays aligned
    SamplerRng a = sampler_rng(6), b = sampler_rng(6);
    sample_token(x.data(), 1000, 1.0f, 0, &a);
    sample_token(x.data(), 1000, 1.0f, 1, &a);
    const float dead[] = {NAN, NAN};
    sample_token(dead, 2, 1.0f, 0, &a);
    rng_next(&b);
    rng_next(&b);
    rng_next(&b);
    CHECK(a.state == b.state, "every sampled token takes exactly one draw (full, top-1, all-NaN row)");
}

// ---------------------------------------------------------------------------
// hellaswag

// Builds one example's uint16s in the file format; the caller may corrupt them.
static std::vector<uint16_t> example_u16(int index, int label, const std::vector<int>& ctx,
                                         const std::vector<std::vector<int>>& ends) {
    std::vector<uint16_t> u = {65535, 0, (uint16_t)index, (uint16_t)label, (uint16_t)ends.size(), (uint16_t)ctx.size()};
    for (int t : ctx) u.push_back((uint16_t)t);
    for (const auto& e : ends) {
        u.push_back((uint16_t)e.size());
        for (int t : e) u.push_back((uint16_t)t);
    }
    u[1] = (uint16_t)(u.size() * 2);
    return u;
}

struct EvalFile {
    int32_t h[256];
    std::vector<std::vector<uint16_t>> examples;
    EvalFile() {
        memset(h, 0, sizeof h);
        h[0] = 20240522;
        h[1] = 1;
    }
    void add(const std::vector<uint16_t>& ex) {
        examples.push_back(ex);
        h[2] = (int32_t)examples.size();
        h[3] = std::max(h[3], (int32_t)(ex.size() * 2));
    }
    std::string bytes() const {
        std::string s((const char*)h, sizeof h);
        for (const auto& e : examples) s.append((const char*)e.data(), e.size() * 2);
        return s;
    }
};

static const std::vector<int> kCtx0 = {10, 11, 12};
static const std::vector<std::vector<int>> kEnds0 = {{20}, {21, 22}, {23, 24, 25}, {26}};

static EvalFile sample_file() {
    EvalFile f;
    f.add(example_u16(0, 2, kCtx0, kEnds0));
    f.add(example_u16(1, 0, {50256, 7}, {{1, 2, 3, 4, 5}, {6}, {7, 8}, {9}}));
    f.add(example_u16(2, 3, {5}, {{60000}, {1}, {2}, {3}}));
    return f;
}

static void test_hellaswag_load() {
    std::string path = g_tmp + "/hs_small.bin";
    write_file(path, sample_file().bytes());
    std::vector<HellaSwagExample> exs;
    const std::string err = error_of([&] { exs = hellaswag_load(path); });
    const bool ok = err == "NO ERROR";
    CHECK(ok && exs.size() == 3, "load a 3-example file written in the format (%s)", err.c_str());
    if (ok && exs.size() == 3) {
        CHECK(exs[0].index == 0 && exs[0].label == 2 && exs[0].context == kCtx0 && exs[0].endings == kEnds0,
              "example 0: index, label, context and the 4 endings round-trip");
        CHECK(exs[1].index == 1 && exs[1].label == 0 && exs[1].context == std::vector<int>({50256, 7}) &&
                  exs[1].endings[0].size() == 5 && exs[1].endings[3] == std::vector<int>({9}),
              "example 1 round-trips");
        CHECK(exs[2].label == 3 && exs[2].endings[0][0] == 60000, "example 2: label 3, token 60000 kept as is");
        const std::string fine = error_of([&] { hellaswag_check_vocab(exs, 65535, path); });
        const std::string verr = error_of([&] { hellaswag_check_vocab(exs, 50257, path); });
        CHECK(fine == "NO ERROR" && verr.rfind(path + ": example 2: ", 0) == 0 && contains_all(verr, {"60000"}),
              "check_vocab: 60000 fine for V=65535, llmc::Error for V=50257 naming the file (%s)", verr.c_str());
    }
    EvalFile empty;
    write_file(g_tmp + "/hs_empty.bin", empty.bytes());
    exs.assign(1, HellaSwagExample());
    CHECK(error_of([&] { exs = hellaswag_load(g_tmp + "/hs_empty.bin"); }) == "NO ERROR" && exs.empty(),
          "a header with 0 examples loads, empty");
}

// One malformed file: load must throw llmc::Error, one line naming the file and each needle.
static void expect_error(const char* what, const std::string& bytes, std::initializer_list<std::string> needles) {
    std::string path = g_tmp + "/bad.bin";
    write_file(path, bytes);
    const std::string err = error_of([&] { hellaswag_load(path); });
    CHECK(err.rfind(path + ": ", 0) == 0 && contains_all(err, needles), "malformed, %s: %s", what, err.c_str());
}

static void test_hellaswag_errors() {
    const std::string err = error_of([&] { hellaswag_load(g_tmp + "/no_such_file.bin"); });
    CHECK(contains_all(err, {"no_such_file.bin: cannot open"}), "missing file: llmc::Error %s", err.c_str());

    const std::string good = sample_file().bytes();
    expect_error("short header", good.substr(0, 100), {"shorter than the 1024-byte header"});
    {
        EvalFile f = sample_file();
        f.h[0] = 20240520;  // a token shard's magic
        expect_error("token shard magic", f.bytes(), {"bad magic 20240520"});
        f = sample_file();
        f.h[1] = 2;
        expect_error("version 2", f.bytes(), {"unsupported version 2"});
        f = sample_file();
        f.h[2] = -1;
        expect_error("negative count", f.bytes(), {"negative example count"});
        f = sample_file();
        f.h[2] = 4;
        expect_error("header count too high", f.bytes(), {"example 3", "file ends"});
        f = sample_file();
        f.h[2] = 2;
        expect_error("header count too low", f.bytes(), {"bytes after the last"});
        f = sample_file();
        f.h[3] = 20;
        expect_error("longest example too small", f.bytes(), {"longer than the header's longest"});
        f = sample_file();
        f.h[2] = 0x7fffffff;
        expect_error("huge count", f.bytes(), {"example 3", "file ends"});
    }
    expect_error("odd payload", good + "x", {"odd number of bytes"});
    expect_error("trailing bytes", good + std::string(4, '\0'), {"4 bytes after the last"});
    auto with = [&](int which, auto mutate) {
        EvalFile f = sample_file();
        mutate(f.examples[which]);
        return f.bytes();
    };
    expect_error("bad delimiter", with(1, [](std::vector<uint16_t>& u) { u[0] = 65534; }),
                 {"example 1", "delimiter 65534"});
    expect_error("label 4", with(0, [](std::vector<uint16_t>& u) { u[3] = 4; }), {"example 0", "label 4"});
    expect_error("3 endings", with(2, [](std::vector<uint16_t>& u) { u[4] = 3; }), {"example 2", "3 endings"});
    expect_error("empty context", with(0, [](std::vector<uint16_t>& u) { u = example_u16(0, 1, {}, kEnds0); }),
                 {"empty context"});
    expect_error("empty ending",
                 with(0, [](std::vector<uint16_t>& u) { u = example_u16(0, 1, kCtx0, {{1}, {}, {2}, {3}}); }),
                 {"ending 1 is empty"});
    expect_error("length field too long", with(0, [](std::vector<uint16_t>& u) { u[1] += 2; }),
                 {"example 0", "length field says"});
    expect_error("length field too short", with(1, [](std::vector<uint16_t>& u) { u[1] -= 2; }),
                 {"example 1", "runs past the example's length field"});
    expect_error("odd length field", with(0, [](std::vector<uint16_t>& u) { u[1] += 1; }), {"is not valid"});
    expect_error("context overruns", with(2, [](std::vector<uint16_t>& u) { u[5] = 500; }),
                 {"example 2", "context of 500 tokens"});
    {
        EvalFile f = sample_file();
        f.examples.back().resize(f.examples.back().size() - 2);  // cut off the last example's end
        expect_error("truncated last example", f.bytes(), {"example 2", "runs past the end of the file"});
    }
}

static void test_hellaswag_fill_predict() {
    HellaSwagExample ex;
    ex.index = 0;
    ex.label = 2;
    ex.context = kCtx0;
    ex.endings = kEnds0;
    const int T = 8, R = hellaswag_rows_needed(), EOT = 50256;
    CHECK(R == 4, "hellaswag_rows_needed() == 4");
    std::vector<int> in(R * T, 777), tg(R * T, 777);
    bool ok = hellaswag_fill(ex, T, in.data(), tg.data(), EOT);
    const std::vector<int> in2 = {10, 11, 12, 23, 24, 25, EOT, EOT}, tg2 = {-1, -1, 23, 24, 25, -1, -1, -1};
    const std::vector<int> in0 = {10, 11, 12, 20, EOT, EOT, EOT, EOT}, tg0 = {-1, -1, 20, -1, -1, -1, -1, -1};
    const std::vector<int> tg1 = {-1, -1, 21, 22, -1, -1, -1, -1};
    CHECK(ok && std::vector<int>(in.begin() + 2 * T, in.begin() + 3 * T) == in2 &&
              std::vector<int>(tg.begin() + 2 * T, tg.begin() + 3 * T) == tg2,
          "row 2: context + ending 2 + EOT padding; targets only where the ending is predicted");
    CHECK(std::vector<int>(in.begin(), in.begin() + T) == in0 && std::vector<int>(tg.begin(), tg.begin() + T) == tg0 &&
              std::vector<int>(tg.begin() + T, tg.begin() + 2 * T) == tg1,
          "rows 0 and 1 likewise (a 1-token ending has one target, at the last context position)");
    bool counts = true;
    for (int i = 0; i < R; i++) {
        int n = 0;
        for (int p = 0; p < T; p++) n += tg[i * T + p] != -1;
        counts = counts && n == (int)kEnds0[i].size();
    }
    CHECK(counts, "each row has exactly as many targets as its ending has tokens");

    std::vector<int> in6(R * 6), tg6(R * 6);
    CHECK(hellaswag_fill(ex, 6, in6.data(), tg6.data(), EOT) && in6[2 * 6 + 5] == 25 && tg6[2 * 6 + 4] == 25,
          "T = 6 fits exactly: the longest row is context + ending with no padding");
    std::vector<int> in5(R * 5, 777), tg5(R * 5, 777);
    bool fits = hellaswag_fill(ex, 5, in5.data(), tg5.data(), EOT);
    bool untouched = std::count(in5.begin(), in5.end(), 777) == R * 5 &&
                     std::count(tg5.begin(), tg5.end(), 777) == R * 5;
    CHECK(!fits && untouched, "T = 5 is too short for context + ending 2: false, nothing written");
    HellaSwagExample bad = ex;
    bad.endings.pop_back();
    CHECK(!hellaswag_fill(bad, T, in.data(), tg.data(), EOT), "an example without 4 endings is refused");

    // predict: the lowest MEAN over the ending tokens
    std::vector<float> loss(R * T, 0.0f);
    auto set = [&](int row, std::vector<float> per_token) {
        int k = 0;
        for (int p = 0; p < T; p++)
            if (tg[row * T + p] != -1) loss[row * T + p] = per_token[k++];
    };
    set(0, {2.0f});             // mean 2.0, sum 2.0 (lowest sum)
    set(1, {1.0f, 2.5f});       // mean 1.75, sum 3.5
    set(2, {0.5f, 0.5f, 2.0f});  // mean 1.0, sum 3.0
    set(3, {2.5f});             // mean 2.5
    CHECK(hellaswag_predict(loss.data(), tg.data(), T) == 2,
          "predict: the lowest mean (row 2: 1.0), not the lowest sum (row 0)");
    set(1, {1.0f, 1.0f});  // mean 1.0: tie with row 2
    CHECK(hellaswag_predict(loss.data(), tg.data(), T) == 1, "predict: a tie goes to the lower index");
    // garbage at masked positions is ignored (only targets != -1 count)
    std::vector<float> noisy = loss;
    for (int i = 0; i < R * T; i++)
        if (tg[i] == -1) noisy[i] = (i % 3 == 0) ? 100.0f : -100.0f;
    CHECK(hellaswag_predict(noisy.data(), tg.data(), T) == 1, "predict ignores the losses at masked positions");
    std::vector<float> nanrow = loss;
    nanrow[1 * T + 2] = NAN;
    CHECK(hellaswag_predict(nanrow.data(), tg.data(), T) == 2, "a NaN loss disqualifies its row");
    std::vector<int> none(R * T, -1);
    CHECK(hellaswag_predict(loss.data(), none.data(), T) == -1, "no unmasked position at all: -1");
    set(0, {0.25f});
    CHECK(hellaswag_predict(loss.data(), tg.data(), T) == 0, "row 0 with the lowest mean wins");
}

static void test_hellaswag_real() {
    const char* sd = getenv("SHARED_DATA");
    std::string tool;
    // the plain (fast) build of the writer, also when this is the sanitizer build
    if (exists("build/host/hellaswag")) tool = "build/host/hellaswag";
    if (!sd || !*sd) {
        printf("SKIP real HellaSwag file: SHARED_DATA is not set\n");
        return;
    }
    if (tool.empty()) {
        printf("SKIP real HellaSwag file: build/host/hellaswag not built (make build/host/hellaswag)\n");
        return;
    }
    std::string shared = sd, txt = shared + "/hellaswag_val_full.txt", gpt2 = shared + "/gpt2";
    if (!exists(txt) || !exists(gpt2 + "/encoder.json")) {
        printf("SKIP real HellaSwag file: %s or %s/encoder.json absent\n", txt.c_str(), gpt2.c_str());
        return;
    }
    std::string out = g_tmp + "/hellaswag_val.bin";
    Run r = run_cmd(tool + " --input " + txt + " --gpt2-dir " + gpt2 + " --out " + out);
    CHECK(r.code == 0, "build/host/hellaswag converts %s (%s)", txt.c_str(),
          first_line(r.code ? r.err : r.out).c_str());
    std::vector<HellaSwagExample> exs;
    const std::string err = error_of([&] { exs = hellaswag_load(out); });
    const bool ok = err == "NO ERROR";
    CHECK(ok && exs.size() == 10042, "the real validation file loads: %zu examples (10042) %s", exs.size(),
          err.c_str());
    if (!ok || exs.empty()) return;
    bool idx = true;
    int counts[4] = {0, 0, 0, 0};
    size_t longest = 0;
    for (size_t i = 0; i < exs.size(); i++) {
        idx = idx && exs[i].index == (int)i;
        counts[exs[i].label]++;
        for (const auto& e : exs[i].endings) longest = std::max(longest, exs[i].context.size() + e.size());
    }
    const bool in_vocab = error_of([&] { hellaswag_check_vocab(exs, 50257, out); }) == "NO ERROR";
    CHECK(idx && exs[0].label == 3 && exs[0].context.size() == 15 && in_vocab,
          "indices 0..N-1, item 0 has label 3 and 15 context tokens, every token < 50257");
    CHECK(counts[0] > 2000 && counts[1] > 2000 && counts[2] > 2000 && counts[3] > 2000,
          "labels spread over 0..3 (%d %d %d %d)", counts[0], counts[1], counts[2], counts[3]);
    // how many examples a given T can score: all at llm.c's 1024 and at the longest
    // context + ending; at smaller T exactly those whose longest row fits
    const int R = hellaswag_rows_needed();
    auto fitting = [&](int T) {
        std::vector<int> in((size_t)R * T), tg((size_t)R * T);
        int n = 0;
        for (const auto& ex : exs) n += hellaswag_fill(ex, T, in.data(), tg.data(), 50256);
        return n;
    };
    auto expected = [&](int T) {
        int n = 0;
        for (const auto& ex : exs) {
            size_t m = 0;
            for (const auto& e : ex.endings) m = std::max(m, ex.context.size() + e.size());
            n += m <= (size_t)T;
        }
        return n;
    };
    const int L = (int)longest;
    int f1024 = fitting(1024), fl = fitting(L), fl1 = fitting(L - 1), f64 = fitting(64);
    CHECK(f1024 == 10042 && fl == 10042 && fl1 < 10042 && fl1 == expected(L - 1) && f64 == expected(64) && f64 > 0,
          "fill: all 10042 fit T=1024 and T=%d (the longest context+ending), %d fit T=%d, %d fit T=64", L, fl1, L - 1,
          f64);
}

// ---------------------------------------------------------------------------
// mfu

static void test_mfu() {
    // clang-format off
    struct Case {
        const char* name;
        double tflops;
    } cases[] = {
        {"NVIDIA H200", 989},           {"NVIDIA H100 80GB HBM3", 989}, {"NVIDIA H100 PCIe", 756},
        {"NVIDIA H100 NVL", 835},       {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA A100 80GB PCIe", 312},
        {"NVIDIA L40S", 362},           {"NVIDIA GeForce RTX 4090", 165}, {"nvidia h100 pcie", 756},
        {"NVIDIA GeForce GTX 1080", -1}, {"Tesla V100-SXM2-16GB", -1},  {"", -1},
        {"CPU", -1},
    };
    // clang-format on
    bool all = true;
    for (const Case& c : cases) {
        double got = gpu_peak_bf16_flops(c.name);
        double want = c.tflops < 0 ? -1.0 : c.tflops * 1e12;
        if (got != want) {
            printf("  %s: got %g, want %g\n", c.name, got, want);
            all = false;
        }
    }
    CHECK(all && gpu_peak_bf16_flops(nullptr) == -1.0, "peak table: H200/H100 SXM 989, H100 PCIe 756, A100 312, L40S "
                                                       "362, RTX 4090 165 TFLOP/s; unknown/empty/null -1");

    // GPT-2 124M as llm.c counts it (padded vocab 50304): 6N + 6LCT
    const double fpt = flops_per_token(124475904, 12, 768, 1024);
    CHECK(fpt == 6.0 * 124475904 + 6.0 * 12 * 768 * 1024 && fpt == 803478528.0,
          "flops_per_token(GPT-2 124M, T=1024) = %.0f", fpt);
    double mfu = -7;
    bool ok = mfu_percent(1.0e6, fpt, gpu_peak_bf16_flops("NVIDIA H100 80GB HBM3"), &mfu);
    CHECK(ok && std::fabs(mfu - 100.0 * 1e6 * 803478528.0 / 989e12) < 1e-9 && std::fabs(mfu - 81.24) < 0.01,
          "1M tok/s of GPT-2 124M on an H100: MFU %.2f%%", mfu);
    bool refused = true;
    double out = 123.0;
    refused = refused && !mfu_percent(1e6, fpt, gpu_peak_bf16_flops("Unknown GPU"), &out);
    refused = refused && !mfu_percent(1e6, fpt, 0.0, &out);
    refused = refused && !mfu_percent(0.0, fpt, 989e12, &out);
    refused = refused && !mfu_percent(-5.0, fpt, 989e12, &out);
    refused = refused && !mfu_percent(NAN, fpt, 989e12, &out);
    refused = refused && !mfu_percent(1e6, fpt, NAN, &out);
    refused = refused && !mfu_percent(INFINITY, fpt, 989e12, &out);
    refused = refused && !mfu_percent(1e6, -1.0, 989e12, &out);
    CHECK(refused && out == 123.0,
          "mfu_percent: false for an unknown GPU, zero/negative/NaN/inf inputs; *out untouched");
    bool never_negative = true;
    for (double tps : {1.0, 1e3, 1e9})
        for (const char* n : {"NVIDIA H200", "NVIDIA GeForce RTX 4090", "mystery"}) {
            double m = -1;
            if (mfu_percent(tps, fpt, gpu_peak_bf16_flops(n), &m)) never_negative = never_negative && m > 0;
        }
    CHECK(never_negative, "an MFU that is reported is positive");

    // clang-format off
    struct D {
        double s;
        const char* want;
    } durs[] = {
        {0, "0s"},           {0.4, "0s"},           {45, "45s"},         {59.4, "59s"},         {59.6, "1m00s"},
        {60, "1m00s"},       {725, "12m05s"},       {3599.4, "59m59s"},  {3599.6, "1h00m"},     {3600, "1h00m"},
        {11220, "3h07m"},    {11259, "3h08m"},      {86340, "23h59m"},   {86399, "1d00h"},      {187200, "2d04h"},
        {10 * 86400.0, "10d00h"}, {-1, "n/a"},      {NAN, "n/a"},        {INFINITY, "n/a"},
    };
    // clang-format on
    bool fmt = true;
    for (const D& d : durs) {
        std::string got = format_duration(d.s);
        if (got != d.want) {
            printf("  format_duration(%g) = \"%s\", want \"%s\"\n", d.s, got.c_str(), d.want);
            fmt = false;
        }
    }
    CHECK(fmt, "format_duration: 45s, 12m05s, 3h07m, 2d04h, rounding across units, n/a for negative/NaN/inf");
}

int main() {
    char tmpl[] = "/tmp/test_eval.XXXXXX";
    if (!mkdtemp(tmpl)) {
        printf("FAIL cannot create a temporary directory\n");
        return test_summary("test_eval");
    }
    g_tmp = tmpl;
    test_rng();
    test_sampler_greedy();
    test_sampler_distribution();
    test_sampler_determinism();
    test_hellaswag_load();
    test_hellaswag_errors();
    test_hellaswag_fill_predict();
    test_hellaswag_real();
    test_mfu();
    run_cmd("rm -rf " + g_tmp);
    return test_summary("test_eval");
}
