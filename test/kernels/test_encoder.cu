// The token and position embedding (llmc/kernels/encoder.cuh): the forward, the
// backward's plan of positions grouped by token, the backward into pre-filled
// gradients, and position ids that restart at each document.
#include <numeric>

#include "llmc/kernels/encoder.cuh"
#include "test/kernels/kernel_test.h"

// The plan as a stable comparison sort of the positions by token id gives it
// (the encoder backward's first plan): the counting sort must give the same.
static bool plan_equals_sorted(const std::vector<int>& plan, const std::vector<int>& inp, int B, int T, int D) {
    const int BT = B * T;
    std::vector<int> order(BT);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return inp[a] < inp[b]; });
    std::vector<int> offsets, tokens;
    for (int k = 0; k < BT; k++)
        if (k == 0 || inp[order[k]] != inp[order[k - 1]]) {
            offsets.push_back(k);
            tokens.push_back(inp[order[k]]);
        }
    offsets.push_back(BT);
    return D == (int)tokens.size() && std::equal(order.begin(), order.end(), plan.begin()) &&
           std::equal(offsets.begin(), offsets.end(), plan.begin() + BT) &&
           std::equal(tokens.begin(), tokens.end(), plan.begin() + 2 * BT + 1);
}

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
            ref[(size_t)p * C + c] = (double)to_float(wte[(size_t)inp[p] * C + c]) +
                                     to_float(wpe[(size_t)(p % T) * C + c]);
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
    CHECK(layout_ok, "encoder plan B=%d T=%d: %d distinct tokens (want %d), groups sorted, each position once", B, T, D,
          D_want);
    CHECK(plan_equals_sorted(plan, inp, B, T, D), "encoder plan B=%d T=%d: entry for entry the plan of a stable sort",
          B, T);
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
            ref[(size_t)p * C + c] = (double)to_float(wte[(size_t)inp[p] * C + c]) +
                                     to_float(wpe[(size_t)pos[p] * C + c]);
    const double e_pos = norm_err(dbl(to_host(d_out, (size_t)BT * C)), ref);
    CHECK(e_pos <= TOL_X, "encoder_forward with position ids B=%d T=%d C=%d (norm err %.2e <= %.1e)", B, T, C, e_pos,
          TOL_X);
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

int main() {
    kernel_test_begin("test_encoder");
    TEST_CASE(test_encoder(3, 13, 40, 50));
    TEST_CASE(test_encoder(2, 5, 768, 1000));
    TEST_CASE(test_encoder(1, 1, 40, 5));
    TEST_CASE(test_encoder(2, 3, 20, 50));    // C not a multiple of 8: one element per access
    TEST_CASE(test_encoder(4, 256, 8, 50257)); // GPT-2's vocabulary: the counting sort spans 50257 ids
    return kernel_test_end("test_encoder");
}
