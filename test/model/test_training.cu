// What a long run relies on besides the math (CPU runtime):
//   - recompute (-r 1, 2, 3) gives bitwise the losses, weights and optimizer state of -r 0 and
//     allocates exactly the activation memory it promises to save (measured
//     with the runtime's allocation counter);
//   - the memory plan matches what the runtime actually allocates (within 2%);
//   - learning-rate schedules and the batch ramp give the expected values;
//   - HellaSwag scoring is deterministic and does not depend on how the
//     examples are batched; sampling is deterministic for a seed;
//   - with --doc-mask and --doc-positions a document's losses do not depend on
//     what precedes it in its sequence, and sequences of one document each
//     give bitwise the losses of plain causal attention.
#define TESTING
#include "train_gpt.cu"
#include "llmc/run/schedulers.h"
#include "test/test_util.h"
#ifdef CPUCUDA
#include "cpucuda.h"
#endif

static const char* MODEL = "L=3,C=64,H=4,V=256,maxT=64";

// Device bytes allocated now: the CPU runtime's exact counter (a GPU build
// has no exact one, so the memory checks below run on the CPU runtime only).
static size_t bytes_in_use() {
#ifdef CPUCUDA
    return cpucuda::memory_stats().in_use;
#else
    return 0;
#endif
}

static std::vector<int> tokens(size_t n, uint64_t seed, int V) {
    std::vector<int> t(n);
    for (size_t i = 0; i < n; i++) t[i] = (int)(splitmix64(seed * 1000003 + i) % V);
    return t;
}

// ---- recompute ------------------------------------------------------------------
struct RecomputeRun {
    std::vector<float> losses;
    std::vector<char> state;  // what a checkpoint holds: the weights, then the fp32 master weights, m and v
    size_t activation_bytes;
};

static void append_device(std::vector<char>* out, const void* device, size_t bytes) {
    if (!device) return;  // (no master weights in the fp32 build)
    out->resize(out->size() + bytes);
    cudaCheck(cudaMemcpy(out->data() + out->size() - bytes, device, bytes, cudaMemcpyDeviceToHost));
}

static RecomputeRun train_with_recompute(int recompute, int gelu_fusion = 0) {
    const int B = 4, T = 64, A = 2, steps = 3;
    GPT2 model;
    init_from_descriptor(&model, MODEL, 11);
    const size_t before = bytes_in_use();
    allocate_activations(GPT2_FAMILY, &model, B, T, A, recompute);
    model.gelu_fusion = gelu_fusion;
    // documents (every 37th token starts one): the recomputed attention masks and positions as the forward's
    model.doc_token = 255;
    model.doc_mask = model.doc_positions = 1;
    RecomputeRun run;
    run.activation_bytes = bytes_in_use() - before;
    OptimizerSettings opt;
    for (int s = 0; s < steps; s++) {
        std::vector<int> data = tokens((size_t)A * B * T + 1, s, 255);
        for (size_t i = 0; i < data.size(); i += 37) data[i] = 255;
        run.losses.push_back(train_step(&model, whole_batch(&model, data.data(), data.data() + 1, A), 1e-3f, opt).loss);
    }
    append_device(&run.state, model.params_memory, model.num_parameters * sizeof(floatX));
    for (const float* t : {model.master_weights, model.adam_m, model.adam_v})
        append_device(&run.state, t, model.optimizer_elements * sizeof(float));
    free_model(&model);
    return run;
}

static void test_recompute() {
    const RecomputeRun r0 = train_with_recompute(0);
    const size_t X = sizeof(floatX), F = sizeof(float);
    for (int r : {1, 2, 3}) {
        const RecomputeRun rr = train_with_recompute(r);
        const bool same = rr.losses == r0.losses && rr.state == r0.state;
        CHECK(same,
              "-r %d: 3 steps (A=2, documents) give bitwise the losses, weights, master, m, v of -r 0 (%.6f %.6f)", r,
              rr.losses[0], rr.losses[2]);
#ifdef CPUCUDA
        // one layer's copy instead of L: GELU (B x T x 4C), and for -r 2 ln1 and ln2 (B x T x C each); -r 3
        // also qkv (3C), atty, residual2 (C each), fch (4C), the two layernorms' mean and rstd and att_lse (NH)
        const size_t B = 4, T = 64, C = 64, NH = 4, L = 3;  // train_with_recompute's model and batch
        const size_t per_token = r == 1 ? 4 * C * X : r == 2 ? 6 * C * X : 15 * C * X + (4 + NH) * F;
        const size_t saved = (L - 1) * B * T * per_token;
        CHECK(r0.activation_bytes - rr.activation_bytes == saved,
              "-r %d allocates %zu bytes less activation memory (runtime counter: %zu -> %zu bytes, %.0f%% less)", r,
              saved, r0.activation_bytes, rr.activation_bytes,
              100.0 * (r0.activation_bytes - rr.activation_bytes) / r0.activation_bytes);
#endif
    }
    // With GELU in cuBLASLt's forward epilogue (-ge 1, 2) the recompute of -r 1
    // (the GELU kernel) is not bitwise what the forward used (cuBLASLt's own
    // GELU): the same to bf16 rounding of the GELU output. -r 3 reruns the
    // forward's own fused matmul: bitwise.
    const RecomputeRun f0 = train_with_recompute(0, 2), f1 = train_with_recompute(1, 2);
    for (int fusion : {1, 2}) {
        const RecomputeRun base = fusion == 2 ? f0 : train_with_recompute(0, fusion),
                           f3 = train_with_recompute(3, fusion);
        CHECK(f3.losses == base.losses && f3.state == base.state,
              "-ge %d: -r 3 gives bitwise the losses, weights and optimizer state of -r 0", fusion);
    }
    double worst_loss = 0;
    for (int s = 0; s < 3; s++)
        worst_loss = std::fmax(worst_loss, std::fabs(f1.losses[s] - f0.losses[s]) / f0.losses[s]);
    CHECK(worst_loss <= 1e-4, "-ge 2: -r 1 gives the losses of -r 0 to %.1e (max rel diff %.2e)", 1e-4, worst_loss);
}

// ---- memory plan vs the runtime's allocations ----------------------------------------
static void test_memory_plan() {
#ifndef CPUCUDA
    printf("SKIP memory plan vs allocations: needs the CPU runtime's exact allocation counter\n");
#else
    matmul_teardown();  // the earlier tests' cuBLASLt workspace: this test counts its own
    for (int recompute : {0, 2, 3}) {
        cpucuda::reset_peak_memory();
        const size_t before = cpucuda::memory_stats().in_use;
        GPT2 model;
        init_from_descriptor(&model, MODEL, 3);
        allocate_activations(GPT2_FAMILY, &model, 8, 64, 1, recompute);
        const std::vector<int> data = tokens(8 * 64 + 1, 9, 256);
        OptimizerSettings opt;
        train_step(&model, whole_batch(&model, data.data(), data.data() + 1, 1), 1e-3f, opt);
        const size_t actual = cpucuda::memory_stats().peak - before;
        const size_t planned = memory_plan(GPT2_FAMILY, &model, 8, 64, recompute).total;
        const double off = std::fabs((double)planned - (double)actual) / actual;
        CHECK(off <= 0.02,
              "memory plan (-r %d) %.2f MiB vs the runtime's peak allocation over a step %.2f MiB: %.2f%% "
              "apart (<= 2%%)",
              recompute, planned / 1048576.0, actual / 1048576.0, 100 * off);
        free_model(&model);
        matmul_teardown();
    }
#endif
}

// ---- schedules ---------------------------------------------------------------------
static void test_schedules() {
    const double peak = 1e-3;
    struct Case {
        LRSchedule s;
        int step;
        double expected;
        const char* what;
    };
    // warmup 10 steps, 110 steps, final fraction 0.1: decay over steps 10..110
    const Case cases[] = {
        {LRSchedule::Cosine, 0, 1e-4, "cosine: warmup step 0 = peak/10"},
        {LRSchedule::Cosine, 9, 1e-3, "cosine: last warmup step = peak"},
        {LRSchedule::Cosine, 60, 1e-4 + 0.5 * 0.9e-3, "cosine: halfway = (peak + final)/2"},
        {LRSchedule::Cosine, 110, 1e-4, "cosine: the end = final"},
        {LRSchedule::Linear, 35, 1e-3 - 0.25 * 0.9e-3, "linear: a quarter of the way"},
        {LRSchedule::Constant, 80, 1e-3, "constant"},
        {LRSchedule::WSD, 89, 1e-3, "wsd: stable until 80% of the decay steps"},
        {LRSchedule::WSD, 100, 1e-3 - 0.5 * 0.9e-3, "wsd: halfway through the last 20%"},
    };
    for (const Case& c : cases) {
        const LRScheduler s{c.s, peak, 10, 110, 0.1};
        CHECK(std::fabs(s.at(c.step) - c.expected) <= 1e-12, "%s: lr(%d) = %.6e (expected %.6e)", c.what, c.step,
              s.at(c.step), c.expected);
    }
    // ramp: 4096 -> 32768 tokens over 10 steps, micro-batches of 2048
    const BatchRamp ramp{4096, 10, 32768, 2048, RampLRScaling::Sqrt};
    std::string as;
    bool monotone = true, whole = true;
    for (int s = 0; s <= 12; s++) {
        as += std::to_string(ramp.grad_accum_steps(s)) + " ";
        if (s > 0) monotone &= ramp.grad_accum_steps(s) >= ramp.grad_accum_steps(s - 1);
        whole &= ramp.tokens(s) == ramp.grad_accum_steps(s) * 2048L;
    }
    CHECK(ramp.grad_accum_steps(0) == 2 && ramp.grad_accum_steps(5) == 9 && ramp.grad_accum_steps(10) == 16 &&
              monotone && whole,
          "batch ramp 4096 -> 32768 tokens over 10 steps: A = %s(2 at the start, 9 halfway, 16 from step 10)",
          as.c_str());
    CHECK(std::fabs(ramp.lr_factor(0) - std::sqrt(4096.0 / 32768)) < 1e-12 && ramp.lr_factor(12) == 1.0,
          "ramp lr scaling sqrt: %.4f at step 0, 1 at the end", ramp.lr_factor(0));
    const BatchRamp linear{4096, 10, 32768, 2048, RampLRScaling::Linear}, off{0, 0, 32768, 2048, RampLRScaling::None};
    CHECK(std::fabs(linear.lr_factor(0) - 0.125) < 1e-12 && off.grad_accum_steps(0) == 16 && off.lr_factor(0) == 1.0,
          "ramp lr scaling linear: 0.125 at step 0; no ramp: A = 16 from step 0");
}

// ---- HellaSwag and sampling ------------------------------------------------------------
static std::vector<HellaSwagExample> synthetic_examples(int count, int V) {
    std::vector<HellaSwagExample> examples;
    for (int i = 0; i < count; i++) {
        HellaSwagExample e;
        e.index = i;
        e.label = (int)(splitmix64(i) % 4);
        e.context = tokens(5 + i % 7, 100 + i, V - 1);
        for (int k = 0; k < 4; k++) e.endings.push_back(tokens(2 + (i + k) % 5, 200 + 4 * i + k, V - 1));
        examples.push_back(e);
    }
    examples[3].context = tokens(60, 5, V - 1);  // does not fit in T = 32: skipped
    return examples;
}

static void test_hellaswag_and_sampling() {
    const char* model_desc = "L=1,C=32,H=2,V=300,maxT=32";
    const std::vector<HellaSwagExample> examples = synthetic_examples(23, 300);
    double accuracy[3];
    long scored[3];
    std::vector<int> samples[3];
    const int batch[3] = {4, 12, 12};
    for (int k = 0; k < 3; k++) {
        GPT2 model;
        init_from_descriptor(&model, model_desc, 21);
        allocate_activations(GPT2_FAMILY, &model, batch[k], 32, 1);
        model.doc_token = 299;  // V-1: samples start at it, HellaSwag pads with it
        accuracy[k] = evaluate_hellaswag(GPT2_FAMILY, &model, examples, &scored[k]);
        samples[k] = generate(GPT2_FAMILY, &model, 20, k == 2 ? 0.0f : 1.0f, 0, 77);
        free_model(&model);
    }
    CHECK(scored[0] == 22 && accuracy[0] == accuracy[1] && scored[0] == scored[1],
          "HellaSwag on a tiny model: accuracy %.4f over %ld examples (1 too long for T): the same with 1 and with 3 "
          "examples per batch",
          accuracy[0], scored[0]);
    CHECK(samples[0] == samples[1] && samples[0].size() == 20,
          "sampling: the same 20 tokens for the same seed, whatever the batch size");
    // greedy: each token is the argmax of the logits after the tokens before it
    GPT2 model;
    init_from_descriptor(&model, model_desc, 21);
    allocate_activations(GPT2_FAMILY, &model, 4, 32, 1);
    std::vector<int> inputs(4 * 32, 299), targets(4 * 32, -1);
    bool greedy = true;
    std::vector<floatX> row(model.config.padded_vocab_size);
    std::vector<float> logits(300);
    for (size_t t = 0; t < samples[2].size(); t++) {
        evaluate_batch(GPT2_FAMILY, &model, inputs.data(), targets.data());
        cudaCheck(cudaMemcpy(row.data(), model.acts.logits + t * model.config.padded_vocab_size,
                             row.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        for (int i = 0; i < 300; i++) logits[i] = to_float(row[i]);
        greedy &= samples[2][t] == sampler_argmax(logits.data(), 300);
        inputs[t + 1] = samples[2][t];
    }
    CHECK(greedy, "sampling at temperature 0 is the greedy continuation");
    free_model(&model);
}

// ---- documents (--doc-mask, --doc-positions) ------------------------------------------
static std::vector<float> token_losses(GPT2* model, const std::vector<int>& inputs, const std::vector<int>& targets) {
    evaluate_batch(GPT2_FAMILY, model, inputs.data(), targets.data());
    std::vector<float> losses(inputs.size());
    cudaCheck(cudaMemcpy(losses.data(), model->acts.losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return losses;
}

static void test_documents() {
    const int B = 2, T = 64, V = 256, EOT = V - 1, first_len = 29;
#ifdef ENABLE_FP32
    const double bound = 1e-5;
#else
    const double bound = 5e-3;  // bf16: the tiles fall differently in the two sequences (measured: 0, bitwise)
#endif
    GPT2 model;
    init_from_descriptor(&model, MODEL, 5);
    allocate_activations(GPT2_FAMILY, &model, B, T, 1);
    model.doc_token = EOT;
    // sequence 0: EOT, a first document, EOT, then document D; sequence 1: D from position 0, then another one.
    // Targets: the next token (the last position of each sequence unmasked too, as shards do).
    const std::vector<int> other = tokens(2 * T + 1, 31, V - 1), doc = tokens(T, 32, V - 1);
    std::vector<int> inputs(B * T), targets(B * T);
    const int d0 = first_len + 1, len = T - d0;  // D's start in sequence 0, and its length there
    for (int t = 0; t < T; t++) {
        inputs[t] = t == 0 || t == d0 ? EOT : t < d0 ? other[t] : doc[t - d0 - 1];
        inputs[T + t] = t == 0 ? EOT : t <= len ? doc[t - 1] : t == len + 1 ? EOT : other[T + t];
    }
    for (int t = 0; t < T; t++) {
        targets[t] = t + 1 < T ? inputs[t + 1] : other[2 * T];
        targets[T + t] = t + 1 < T ? inputs[T + t + 1] : other[2 * T];
    }
    // in sequence 1, D (with its EOT) sits at positions 0 .. len; in sequence 0 at d0 .. d0 + len - 1, its
    // first len - 1 tokens predicting the same next tokens
    auto diff = [&](const std::vector<float>& l) {
        double worst = 0;
        for (int k = 0; k < len - 1; k++)
            worst = std::fmax(worst, std::fabs(l[d0 + k] - l[T + k]) / std::fmax(1e-3, std::fabs(l[T + k])));
        return worst;
    };
    model.doc_mask = model.doc_positions = 1;
    const double masked = diff(token_losses(&model, inputs, targets));
    model.doc_mask = model.doc_positions = 0;
    const double plain = diff(token_losses(&model, inputs, targets));
    CHECK(masked <= bound && plain > 10 * bound,
          "--doc-mask 1 --doc-positions 1: a %d-token document after another one has the losses it has at the start "
          "of a sequence (max rel diff %.2e <= %.0e; %.2e without the mask)",
          len, masked, bound, plain);
    // one document per sequence (an EOT only at position 0): the mask changes nothing, bitwise
    std::vector<int> single(inputs);
    for (int b = 0; b < B; b++)
        for (int t = 1; t < T; t++) single[b * T + t] = other[b * T + t];
    const std::vector<float> off = token_losses(&model, single, targets);
    model.doc_mask = 1;
    const std::vector<float> on = token_losses(&model, single, targets);
    CHECK(memcmp(on.data(), off.data(), on.size() * sizeof(float)) == 0,
          "--doc-mask 1 on sequences of one document each: bitwise the losses of causal attention");
    free_model(&model);
}

int main() {
    test_recompute();
    test_memory_plan();
    test_schedules();
    test_hellaswag_and_sampling();
    test_documents();
    return test_summary("test_training");
}
