// The fused softmax + cross-entropy classifier (llmc/kernels/classifier.cuh): losses,
// dlogits in place, padded vocabulary columns, masked targets; and the loss
// accumulation kernel.
#include "llmc/kernels/classifier.cuh"
#include "test/kernels/kernel_test.h"

static void test_classifier(int N, int V, int Vp, std::vector<int> masked_rows) {
    g_rng.seed(400 + V);
    std::vector<floatX> logits = randx((size_t)N * Vp, -4, 4);
    for (int r = 0; r < N; r++)
        for (int c = V; c < Vp; c++)
            logits[(size_t)r * Vp + c] = from_float<floatX>(1000.0f);  // padding must be ignored
    if (N > 2)  // a row far above exp's fp32 range: needs the max subtracted
        for (int c = 0; c < V; c++)
            logits[(size_t)2 * Vp + c] = from_float<floatX>(to_float(logits[(size_t)2 * Vp + c]) + 100.0f);
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

    const bool cached = (size_t)Vp * sizeof(floatX) + 256 <=
                        (size_t)device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    printf("fused_classifier N=%d V=%d Vp=%d: the row %s\n", N, V, Vp,
           cached ? "cached in shared memory" : "read twice from global memory (larger than shared memory)");
    Dev d;
    floatX* d_logits = d.up(logits);
    int* d_t = d.up(targets);
    float* d_loss = d.alloc<float>(N);
    // losses only: logits stay as they are
    fused_classifier(d_logits, d_loss, d_t, dloss, N, V, Vp, false, g_stream);
    const auto loss_only = to_host(d_loss, N);
    CHECK(same_bits(to_host(d_logits, logits.size()), logits),
          "fused_classifier N=%d V=%d Vp=%d without dlogits leaves logits unchanged", N, V, Vp);
    // losses and dlogits in place
    fused_classifier(d_logits, d_loss, d_t, dloss, N, V, Vp, true, g_stream);
    const auto loss = to_host(d_loss, N);
    const auto dl = to_host(d_logits, logits.size());
    const double el = max_rel_diff(loss.data(), lref.data(), N, 1e-3);
    CHECK(el <= TOL_F32 && same_bits(loss, loss_only),
          "fused_classifier N=%d V=%d Vp=%d losses (rel err %.2e <= %.0e, floor 1e-3; same with and without dlogits)",
          N, V, Vp, el, TOL_F32);
    const auto dld = dbl(dl);
    const double eg = max_rel_diff(dld.data(), gref.data(), dld.size(), 1e-6 * dloss);
    CHECK(
        eg <= TOL_X,
        "fused_classifier N=%d V=%d Vp=%d dlogits = dloss (softmax - onehot) (rel err %.2e <= %.1e, floor 1e-6 dloss)",
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
    CHECK(masked_zero, "fused_classifier V=%d: %zu masked rows have loss 0 and all-zero dlogits", V,
          masked_rows.size());
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

int main() {
    kernel_test_begin("test_classifier");
    TEST_CASE(test_classifier(6, 250, 256, {1, 5}));
    TEST_CASE(test_classifier(3, 50257, 50304, {1}));
    TEST_CASE(test_classifier(4, 37, 37, {2}));  // Vp not a multiple of 8: one element per access
    // Llama 3's vocabulary: a row larger than a block's shared memory (bf16 and fp32), read twice
    TEST_CASE(test_classifier(3, 128256, 128256, {1}));
    TEST_CASE(test_accumulate_loss(1));
    TEST_CASE(test_accumulate_loss(3001));
    return kernel_test_end("test_classifier");
}
