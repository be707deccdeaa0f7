// Flash-style causal attention (llmc/kernels/attention.cuh) against a naive double
// precision reference that builds the full T x T probability matrix:
//   forward:  P = softmax(mask(Q K^T / sqrt(HS))),  out = P V,  lse = log sum exp
//   backward: dV = P^T dO,  dP = dO V^T,  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
//             dQ = dS K / sqrt(HS),  dK = dS^T Q / sqrt(HS)
// The reference's backward uses the softmax Jacobian directly (sum_k P_ik dP_ik),
// not the kernel's D_i = dO_i . out_i, so the two are computed independently.
//
// Error metric: max |got - ref| / max |ref| over a tensor (dq, dk, dv checked
// separately). Both sides see the same inputs: in the bf16 build the random
// inputs are rounded to bf16 first and the reference reads the rounded values.
// Bounds:
//   fp32 build: 1e-5 everywhere.
//   bf16 build: lse 1e-5 (fp32 in the kernel, from the same inputs);
//               out and dq/dk/dv 1e-2: the stored bf16 values carry a relative
//               rounding error of up to 2^-9 (~0.2%); the tensor-core kernels
//               also round P and dS to bf16 before their products, and the
//               backward reads the forward's bf16 `out` for D_i (measured: out
//               <= 2.7e-3, dq/dk/dv <= 5e-3).
// The fp32 build runs attention_fp32.cuh; the bf16 build the tensor-core kernels.
// Document-masked cases (random document lengths, some shorter than a 16-row
// step, some longer than a tile) mask every key before the query's document in
// the reference, and check that the last document run alone as a sequence of
// its own gives the same outputs. Bit for bit, they give those of plain causal
// attention (no documents) on the same inputs where the masks agree: every output
// with one document per sequence, and out and lse of the rows of each sequence's
// first document (those rows see the same keys, in the same tiles; the forward's
// tiles between the first and the diagonal one mask whole rows only).
// Grouped-query attention (NKV < NH key/value heads): the reference repeats
// each kv head for its G = NH / NKV query heads (query head h reads kv head
// h / G), runs multi-head attention on that, and sums dK/dV over each group.
// The kernels, run on the repeated qkv as multi-head attention, give the same
// out, lse and dQ bit for bit (those rows see the same K/V, in the same order).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/kernels/attention.cuh"
#include "test/test_device.h"

#if defined(ENABLE_FP32)
static const double TOL_ACT = 1e-5;
#else
static const double TOL_ACT = 1e-2;
#endif
static const double TOL_LSE = 1e-5;

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    double uniform() {  // [-1, 1)
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0;
    }
};

// max |got - ref| / max |ref| over n elements, reading got with a stride/offset
// pattern described by `index` (element k of the tensor is at got[index(k)]).
template <class Got, class Index>
static double err_vs_max(const Got& got, const std::vector<double>& ref, Index index) {
    double max_ref = 0, max_diff = 0;
    for (size_t k = 0; k < ref.size(); k++) {
        max_ref = std::fmax(max_ref, std::fabs(ref[k]));
        const double d = std::fabs((double)to_float(got[index(k)]) - ref[k]);
        if (!(d <= max_diff)) max_diff = d;  // NaN propagates
    }
    return max_diff / (max_ref > 0 ? max_ref : 1.0);
}

struct Reference {
    std::vector<double> out, lse, dq, dk, dv;  // dq/dk/dv: (B, T, C) each
};

// Naive attention in double; q/k/v/dout read from the (rounded) inputs.
// start[b * T + i]: the first key query i sees (its document's first position).
static Reference reference(const std::vector<double>& qkv, const std::vector<double>& dout,
                           const std::vector<int>& start, int B, int T, int NH, int HS) {
    const int C = NH * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    Reference r;
    r.out.assign((size_t)B * T * C, 0.0);
    r.lse.assign((size_t)B * NH * T, 0.0);
    r.dq.assign((size_t)B * T * C, 0.0);
    r.dk.assign((size_t)B * T * C, 0.0);
    r.dv.assign((size_t)B * T * C, 0.0);
    std::vector<double> P((size_t)T * T), dP((size_t)T * T), dS((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto q = [&](int t, int d) { return qkv[((size_t)b * T + t) * 3 * C + h * HS + d]; };
            auto k = [&](int t, int d) { return qkv[((size_t)b * T + t) * 3 * C + C + h * HS + d]; };
            auto v = [&](int t, int d) { return qkv[((size_t)b * T + t) * 3 * C + 2 * C + h * HS + d]; };
            auto at = [&](int t, int d) { return ((size_t)b * T + t) * C + h * HS + d; };
            // forward: full masked score matrix, then softmax per row
            for (int i = 0; i < T; i++) {
                const int j0 = start[(size_t)b * T + i];
                double mx = -INFINITY;
                for (int j = j0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += q(i, d) * k(j, d);
                    P[(size_t)i * T + j] = s * scale;
                    mx = std::fmax(mx, s * scale);
                }
                double sum = 0;
                for (int j = j0; j <= i; j++) sum += std::exp(P[(size_t)i * T + j] - mx);
                for (int j = 0; j < T; j++)
                    P[(size_t)i * T + j] = j >= j0 && j <= i ? std::exp(P[(size_t)i * T + j] - mx) / sum : 0.0;
                r.lse[((size_t)b * NH + h) * T + i] = mx + std::log(sum);
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j < T; j++) o += P[(size_t)i * T + j] * v(j, d);
                    r.out[at(i, d)] = o;
                }
            }
            // backward
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += dout[at(i, d)] * v(j, d);
                    dP[(size_t)i * T + j] = s;
                }
            for (int i = 0; i < T; i++) {
                double rowdot = 0;
                for (int j = 0; j < T; j++) rowdot += P[(size_t)i * T + j] * dP[(size_t)i * T + j];
                for (int j = 0; j < T; j++)
                    dS[(size_t)i * T + j] = P[(size_t)i * T + j] * (dP[(size_t)i * T + j] - rowdot);
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HS; d++) {
                    double gq = 0, gk = 0, gv = 0;
                    for (int u = 0; u < T; u++) {
                        gq += dS[(size_t)t * T + u] * k(u, d);
                        gk += dS[(size_t)u * T + t] * q(u, d);
                        gv += P[(size_t)u * T + t] * dout[at(u, d)];
                    }
                    r.dq[at(t, d)] = gq * scale;
                    r.dk[at(t, d)] = gk * scale;
                    r.dv[at(t, d)] = gv;
                }
        }
    return r;
}

struct Outputs {
    std::vector<floatX> out, dqkv;
    std::vector<float> lse;
};

// One forward + backward on a created stream; every output buffer starts as NaN
// bytes so an element the kernels fail to write shows.
static Outputs run_device(const std::vector<floatX>& qkv, const std::vector<floatX>& dout,
                          const std::vector<int2>& spans, int B, int T, int NH, int NKV, int HS) {
    const size_t C = (size_t)NH * HS, n_qkv = (size_t)B * T * (NH + 2 * NKV) * HS, n_out = (size_t)B * T * C;
    const size_t n_lse = (size_t)B * NH * T, n_scratch = attention_backward_scratch_floats(B, T, NH);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    floatX* d_qkv = to_device(qkv);
    floatX* d_dout = to_device(dout);
    floatX *d_out, *d_dqkv;
    float *d_lse, *d_scratch;
    CUDA_OK(cudaMalloc(&d_out, n_out * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_dqkv, n_qkv * sizeof(floatX)));
    CUDA_OK(cudaMalloc(&d_lse, n_lse * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_scratch, n_scratch * sizeof(float)));
    CUDA_OK(cudaMemsetAsync(d_out, 0xFF, n_out * sizeof(floatX), stream));
    CUDA_OK(cudaMemsetAsync(d_dqkv, 0xFF, n_qkv * sizeof(floatX), stream));
    CUDA_OK(cudaMemsetAsync(d_lse, 0xFF, n_lse * sizeof(float), stream));
    CUDA_OK(cudaMemsetAsync(d_scratch, 0xFF, n_scratch * sizeof(float), stream));
    int2* d_docs = spans.empty() ? nullptr : to_device(spans);
    attention_forward(d_out, d_lse, d_qkv, d_docs, B, T, NH, NKV, HS, stream);
    attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, d_docs, B, T, NH, NKV, HS, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    Outputs o;
    o.out = to_host(d_out, n_out);
    o.dqkv = to_host(d_dqkv, n_qkv);
    o.lse = to_host(d_lse, n_lse);
    cudaFree(d_qkv);
    cudaFree(d_dout);
    cudaFree(d_out);
    cudaFree(d_dqkv);
    cudaFree(d_lse);
    cudaFree(d_scratch);
    if (d_docs) cudaFree(d_docs);
    CUDA_OK(cudaStreamDestroy(stream));
    return o;
}

template <class T>
static bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// qkv (B, T, (NH + 2 NKV) HS) -> (B, T, 3 NH HS): kv head h / G repeated for query head h.
template <class E>
static std::vector<E> repeat_kv(const std::vector<E>& qkv, int B, int T, int NH, int NKV, int HS) {
    const size_t W = (size_t)(NH + 2 * NKV) * HS, C = (size_t)NH * HS;
    std::vector<E> r((size_t)B * T * 3 * C);
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HS; d++) {
                const int kvh = h / (NH / NKV);
                r[row * 3 * C + h * HS + d] = qkv[row * W + h * HS + d];
                r[row * 3 * C + C + h * HS + d] = qkv[row * W + (NH + kvh) * HS + d];
                r[row * 3 * C + 2 * C + h * HS + d] = qkv[row * W + (NH + NKV + kvh) * HS + d];
            }
    return r;
}

// (B, T, NH HS) per query head -> (B, T, NKV HS): the sum over each kv head's G query heads.
static std::vector<double> sum_groups(const std::vector<double>& x, int B, int T, int NH, int NKV, int HS) {
    const int G = NH / NKV;
    std::vector<double> r((size_t)B * T * NKV * HS, 0.0);
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HS; d++) r[(row * NKV + h / G) * HS + d] += x[(row * NH + h) * HS + d];
    return r;
}

// qk_amp scales q and k: larger values give sharper softmax rows (scores of
// tens), which exercises the online rescaling. mean_doc > 0: document-masked,
// documents of 1 .. 2 mean_doc - 1 tokens (uniform), each starting with token 0
// of a token sequence given to document_spans.
static void test_shape(int B, int T, int NH, int NKV, int HS, double qk_amp, uint64_t seed, int mean_doc = 0) {
    const auto t_start = std::chrono::steady_clock::now();
    const size_t C = (size_t)NH * HS, W = (size_t)(NH + 2 * NKV) * HS;  // W: a row of qkv
    const size_t n_qkv = (size_t)B * T * W, n_out = (size_t)B * T * C;
    Rng rng(seed);
    std::vector<floatX> qkv(n_qkv), dout(n_out);
    std::vector<double> qkv_d(n_qkv), dout_d(n_out);
    for (size_t e = 0; e < n_qkv; e++) {
        const bool is_qk = (e % W) < (size_t)(NH + NKV) * HS;
        qkv[e] = from_float<floatX>((float)(rng.uniform() * (is_qk ? qk_amp : 1.0)));
        qkv_d[e] = to_float(qkv[e]);
    }
    for (size_t e = 0; e < n_out; e++) {
        dout[e] = from_float<floatX>((float)rng.uniform());
        dout_d[e] = to_float(dout[e]);
    }

    std::vector<int2> spans;
    std::vector<int> start((size_t)B * T, 0);
    if (mean_doc > 0) {
        std::vector<int> tokens((size_t)B * T, 1);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t += 1 + (int)((rng.uniform() + 1) / 2 * (2 * mean_doc - 1)))
                tokens[(size_t)b * T + t] = 0;
        spans.resize((size_t)B * T);
        document_spans(spans.data(), tokens.data(), B, T, 0);
        for (size_t e = 0; e < start.size(); e++) start[e] = spans[e].x;
    }
    const Reference ref = reference(repeat_kv(qkv_d, B, T, NH, NKV, HS), dout_d, start, B, T, NH, HS);
    const std::vector<double> ref_dk = sum_groups(ref.dk, B, T, NH, NKV, HS);
    const std::vector<double> ref_dv = sum_groups(ref.dv, B, T, NH, NKV, HS);
    const Outputs got = run_device(qkv, dout, spans, B, T, NH, NKV, HS);

    char shape[128];
    snprintf(shape, sizeof shape, "(B,T,NH,NKV,HS)=(%d,%d,%d,%d,%d)%s%s", B, T, NH, NKV, HS, qk_amp > 1 ? " sharp" : "",
             mean_doc > 0 ? " documents" : "");
    auto same = [](size_t k) { return k; };
    // element k of a (B, T, width) tensor -> its place in a (B, T, W) qkv row at column col
    auto part = [W](size_t width, size_t col) { return [=](size_t k) { return (k / width) * W + col + k % width; }; };
    const size_t KVW = (size_t)NKV * HS;

    const double e_out = err_vs_max(got.out, ref.out, same);
    const double e_lse = err_vs_max(got.lse, ref.lse, same);
    const double e_dq = err_vs_max(got.dqkv, ref.dq, part(C, 0));
    const double e_dk = err_vs_max(got.dqkv, ref_dk, part(KVW, C));
    const double e_dv = err_vs_max(got.dqkv, ref_dv, part(KVW, C + KVW));
    CHECK(e_out <= TOL_ACT, "%s forward out: rel err %.2e (bound %.0e)", shape, e_out, TOL_ACT);
    CHECK(e_lse <= TOL_LSE, "%s forward lse: rel err %.2e (bound %.0e)", shape, e_lse, TOL_LSE);
    CHECK(e_dq <= TOL_ACT && e_dk <= TOL_ACT && e_dv <= TOL_ACT,
          "%s backward dq/dk/dv: rel err %.2e / %.2e / %.2e (bound %.0e)", shape, e_dq, e_dk, e_dv, TOL_ACT);

    const Outputs again = run_device(qkv, dout, spans, B, T, NH, NKV, HS);
    CHECK(bitwise_equal(got.out, again.out) && bitwise_equal(got.lse, again.lse) && bitwise_equal(got.dqkv, again.dqkv),
          "%s deterministic: a second run is bitwise equal", shape);
    if (NKV < NH) {
        const Outputs mha = run_device(repeat_kv(qkv, B, T, NH, NKV, HS), dout, spans, B, T, NH, NH, HS);
        bool dq_equal = true;
        for (size_t k = 0; k < n_out; k++) {
            const size_t row = k / C, col = k % C;
            dq_equal &= std::memcmp(&got.dqkv[row * W + col], &mha.dqkv[row * 3 * C + col], sizeof(floatX)) == 0;
        }
        CHECK(bitwise_equal(got.out, mha.out) && bitwise_equal(got.lse, mha.lse) && dq_equal,
              "%s out, lse and dq bitwise equal to multi-head attention on the repeated K/V", shape);
    }
    if (mean_doc > 0) {
        // The last sequence's last document alone, as a sequence of its own
        // (everything before it removed): the same outputs, to rounding (the
        // tiles fall differently), so nothing before a document leaks into it.
        const int b = B - 1, doc0 = spans[(size_t)b * T + T - 1].x, len = T - doc0;
        std::vector<floatX> qkv1((size_t)len * W), dout1((size_t)len * C);
        memcpy(qkv1.data(), &qkv[((size_t)b * T + doc0) * W], qkv1.size() * sizeof(floatX));
        memcpy(dout1.data(), &dout[((size_t)b * T + doc0) * C], dout1.size() * sizeof(floatX));
        const Outputs alone = run_device(qkv1, dout1, {}, 1, len, NH, NKV, HS);
        double worst = 0;
        for (size_t e = 0; e < alone.out.size(); e++)
            worst =
                std::fmax(worst, std::fabs(to_float(alone.out[e]) - to_float(got.out[((size_t)b * T + doc0) * C + e])));
        CHECK(worst <= 4 * TOL_ACT, "%s the last document (%d tokens) alone gives its outputs: max diff %.2e", shape,
              len, worst);

        const Outputs plain = run_device(qkv, dout, {}, B, T, NH, NKV, HS);
        bool first_equal = true;  // rows [0, end of the first document) of each sequence
        for (int bb = 0; bb < B; bb++)
            for (int i = 0; i < spans[(size_t)bb * T].y; i++) {
                const size_t row = (size_t)bb * T + i;
                first_equal &= std::memcmp(&got.out[row * C], &plain.out[row * C], C * sizeof(floatX)) == 0;
                for (int h = 0; h < NH; h++)
                    first_equal &= std::memcmp(&got.lse[((size_t)bb * NH + h) * T + i],
                                               &plain.lse[((size_t)bb * NH + h) * T + i], sizeof(float)) == 0;
            }
        CHECK(first_equal, "%s the rows of each sequence's first document: out and lse bitwise equal to no documents",
              shape);
        const std::vector<int2> whole((size_t)B * T, make_int2(0, T));
        const Outputs one = run_device(qkv, dout, whole, B, T, NH, NKV, HS);
        CHECK(bitwise_equal(one.out, plain.out) && bitwise_equal(one.lse, plain.lse) &&
                  bitwise_equal(one.dqkv, plain.dqkv),
              "%s one document per sequence: out, lse and dqkv bitwise equal to no documents", shape);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    printf("      %s took %.2f s\n", shape, secs);
}

// NKV must divide NH: 3 key/value heads for 4 query heads is an llmc::Error
// naming the head counts, thrown before any launch.
static void test_heads_must_divide() {
    std::string message;
    try {
        attention_forward(nullptr, nullptr, nullptr, nullptr, 1, 16, 4, 3, 64, nullptr);
    } catch (const llmc::Error& e) {
        message = e.what();
    }
    CHECK(message.find("3 key/value heads do not divide 4 query heads") != std::string::npos,
          "NH=4, NKV=3 is refused: \"%s\"", message.c_str());
}

// qkv and dout are read 16 bytes at a time: an array that does not start
// 16-byte aligned is an llmc::Error naming it, thrown before any launch (the
// pointers are never dereferenced).
static void test_alignment_refused() {
    auto refusal = [](auto call) {
        try {
            call();
        } catch (const llmc::Error& e) {
            return std::string(e.what());
        }
        return std::string("(not refused)");
    };
    floatX* aligned = reinterpret_cast<floatX*>(uintptr_t(1) << 12);
    floatX* off = aligned + 1;
    const std::string fwd =
        refusal([&] { attention_forward(aligned, nullptr, off, nullptr, 1, 16, 4, 4, 64, nullptr); });
    CHECK(fwd.find("qkv is not 16-byte aligned") != std::string::npos, "forward, qkv off by one element: \"%s\"",
          fwd.c_str());
    const std::string bwd = refusal([&] {
        attention_backward(aligned, nullptr, off, aligned, aligned, nullptr, nullptr, 1, 16, 4, 4, 64, nullptr);
    });
    CHECK(bwd.find("dout is not 16-byte aligned") != std::string::npos, "backward, dout off by one element: \"%s\"",
          bwd.c_str());
}

int main() {
    printf("test_attention (%s)\n", PRECISION_NAME);
    TEST_CASE(test_shape(2, 32, 4, 4, 16, 1.0, 1));
    TEST_CASE(test_shape(1, 65, 2, 2, 64, 1.0, 2));   // T not a multiple of the tile or block
    TEST_CASE(test_shape(2, 7, 3, 3, 16, 1.0, 3));    // T smaller than one 16-row step
    TEST_CASE(test_shape(1, 128, 1, 1, 128, 1.0, 4)); // HS=128: 32-thread blocks, several query blocks
    TEST_CASE(test_shape(1, 1, 2, 2, 32, 1.0, 5));    // a single token
    TEST_CASE(test_shape(2, 50, 2, 2, 32, 4.0, 6));   // sharp softmax: scores of +-15, running max moves
    TEST_CASE(test_shape(2, 200, 3, 3, 64, 1.0, 7));  // GPT-2 head size, 4 query blocks, partial last one
    TEST_CASE(test_shape(1, 512, 1, 1, 64, 1.0, 8));  // long rows: 8 K/V tiles for the last query block
    TEST_CASE(test_shape(2, 100, 2, 2, 128, 1.0, 9)); // HS=128, T not a multiple of any tile
    if (sizeof(floatX) == 2) TEST_CASE(test_shape(1, 70, 2, 2, 48, 1.0, 10));  // bf16: any multiple of 16
    else printf("SKIP HS=48: the fp32 kernels take HS in {8, 16, 32, 64, 128}\n");
    TEST_CASE(test_shape(1, 1024, 1, 1, 64, 1.0, 11)); // T = maxT of GPT-2: 16 query blocks, 16 tiles for the last
    // document masks: short documents (many inside one 16-row step), tile-sized ones, long ones
    TEST_CASE(test_shape(2, 200, 2, 2, 64, 1.0, 12, 5));
    TEST_CASE(test_shape(1, 300, 2, 2, 32, 4.0, 13, 40));
    TEST_CASE(test_shape(2, 256, 1, 1, 64, 1.0, 14, 100));
    TEST_CASE(test_shape(1, 130, 2, 2, 128, 1.0, 15, 30));
    // long documents: query blocks with several whole tiles between their first and diagonal ones
    TEST_CASE(test_shape(1, 600, 2, 2, 64, 1.0, 23, 200));
    TEST_CASE(test_shape(1, 520, 1, 1, 128, 4.0, 24, 150));
    if (sizeof(floatX) == 2) TEST_CASE(test_shape(1, 100, 1, 1, 16, 1.0, 16, 12));
    else TEST_CASE(test_shape(1, 100, 1, 1, 8, 1.0, 16, 12));
    // grouped-query attention: G = 2, 4, 4 query heads per kv head
    TEST_CASE(test_shape(2, 100, 4, 2, 64, 1.0, 17));
    TEST_CASE(test_shape(1, 130, 4, 1, 128, 1.0, 18));
    TEST_CASE(test_shape(1, 150, 8, 2, 64, 4.0, 19));
    TEST_CASE(test_shape(2, 140, 4, 2, 64, 1.0, 20, 30));
    TEST_CASE(test_shape(1, 100, 4, 1, 128, 1.0, 21, 20));
    TEST_CASE(test_shape(1, 90, 8, 2, 32, 1.0, 22, 10));
    TEST_CASE(test_heads_must_divide());
    TEST_CASE(test_alignment_refused());
    return test_summary("test_attention");
}
