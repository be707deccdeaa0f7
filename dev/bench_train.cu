// Training-step benchmark: a GPT-2 model (default d12) on random tokens.
// Prints ms per step, tokens/s, model FLOPs utilisation against a peak, and
// peak device memory. Under the CPU runtime it also prints where the time
// goes: cuBLASLt matmuls (GEMM) vs the hand-written kernels. Then a roofline
// per kernel family: FLOPs and bytes of one step (forward, backward, AdamW) and
// the time they take at least on an H200 (989 TFLOP/s bf16, 4.8 TB/s); with
// BENCH_FAMILIES=1 each family's launches of one step are also run and timed
// alone with CUDA events (on the CPU runtime: CPU times).
//   usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s]
//   e.g.   build/cpu/bench_train d12 4 64 2        (CPU: GEMM share)
//          build/gpu/sm_90/bench_train d12 16 1024 10 989   (H100/H200 bf16 dense peak)
//   bench_train --serve CHECKPOINT B T TOKENS: steps on request (serve() below)
#define TESTING
#include "train_gpt.cu"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif
#include <chrono>
#include <numeric>
#include <random>

#include "dev/bench_roofline.h"

// --- the roofline of one step, per kernel family (dev/bench_roofline.h) ---------
// X = sizeof(floatX). The launches are those of forward / backward /
// update_parameters for one micro-batch, on the model's own buffers (values do
// not matter for the time).
static std::vector<Family> step_families(GPT2* m) {
    const GPT2Config& c = m->config;
    const int B = m->B, T = m->T, C = c.channels, NH = c.num_heads, L = c.num_layers, Vp = c.padded_vocab_size;
    const int BT = B * T, HS = C / NH;
    const double X = sizeof(floatX), bt = BT, n = (double)m->num_parameters, l = L;
    ActivationTensors& a = m->acts;
    BackwardScratch& s = m->scratch;
    const ParameterTensors<floatX>& p = m->params;
    const ParameterTensors<float>& g = m->grads;
    cudaStream_t st = m->stream;
    const double attn_unit = attention_unit(B, T, NH, HS);
    // per layer: qkv (C -> 3C), attproj (C -> C), fc (C -> 4C), fcproj (4C -> C)
    const int shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    // -ge 2: the fc matmul also writes the pre-GELU input, the fcproj input
    // gradient reads it back; the GELU kernels are gone
    const bool fused = m->gelu_fusion == 2;
    std::vector<MatmulShape> per_layer;
    for (auto& sh : shapes) per_layer.push_back({(double)sh[0], (double)sh[1]});
    Family matmuls =
        matmul_family(fused ? "matmuls (cuBLASLt, GELU fused)" : "matmuls (cuBLASLt)", per_layer, l, bt, C, Vp, X);
    if (fused) matmuls.bytes += l * 2 * bt * 4 * C * X;
    std::vector<Family> families = {
        {matmuls.name, matmuls.flops, matmuls.bytes,
         [=] {
             for (int k = 0; k < L; k++)
                 for (int i = 0; i < 4; i++) {
                     const int ic = shapes[i][0], oc = shapes[i][1];
                     if (fused && i == 2)
                         matmul_forward_gelu(a.fch_gelu, a.fch, a.ln2, p.fcw, p.fcb, BT, ic, oc, true, st);
                     else matmul_forward(a.fch, a.fch_gelu, p.fcw, p.fcb, BT, ic, oc, st);
                     if (fused && i == 3)
                         matmul_backward_gelu(s.dwide, g.fcw, g.fcb, s.reduce, a.fch, a.fch_gelu, a.fch, p.fcw, BT, ic,
                                              oc, true, st);
                     else matmul_backward(s.dwide, g.fcw, g.fcb, s.reduce, a.fch, a.fch_gelu, p.fcw, BT, ic, oc, st);
                 }
             matmul_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, Vp, st);
             matmul_backward(s.dnarrow, g.wte, nullptr, s.reduce, a.logits, a.lnf, p.wte, BT, C, Vp, st);
         }},
        {"attention forward", l * 2 * attn_unit, l * (3 * bt * C * X + bt * C * X + bt * NH * 4),
         [=] {
             for (int k = 0; k < L; k++) attention_forward(a.atty, a.att_lse, a.qkv, nullptr, B, T, NH, NH, HS, st);
         }},
        {"attention backward", l * 7 * attn_unit,
         l * (3 * bt * C * X + 2 * bt * C * X + 3 * bt * C * X + 2 * bt * NH * 4),
         [=] {
             for (int k = 0; k < L; k++)
                 attention_backward(s.dwide, s.reduce, s.dnarrow, a.qkv, a.atty, a.att_lse, nullptr, B, T, NH, NH, HS,
                                    st);
         }},
        {"layernorm forward (+ residual)", 0, (2 * l + 1) * 4 * bt * C * X,
         [=] {
             for (int k = 0; k < 2 * L + 1; k++)
                 fused_residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual3, a.proj_out,
                                                  p.ln2w, p.ln2b, BT, C, st);
         }},
        {"layernorm backward", 0, (2 * l + 1) * 4 * bt * C * X,
         [=] {
             for (int k = 0; k < 2 * L + 1; k++)
                 layernorm_backward(s.dresidual, g.ln2w, g.ln2b, s.reduce, s.dnarrow, a.residual2, p.ln2w, a.ln2_mean,
                                    a.ln2_rstd, BT, C, st);
         }},
        {"classifier", 0, 2 * bt * Vp * X,
         [=] { fused_classifier(a.logits, a.losses, m->targets, 1.0f / BT, BT, c.vocab_size, Vp, true, st); }},
        {"encoder forward + backward", 0, 2 * bt * C * X + bt * C * X + 2.0 * T * C * 4,
         [=] {
             encoder_forward(a.encoded, m->inputs, nullptr, p.wte, p.wpe, B, T, C, st);
             encoder_backward(g.wte, g.wpe, s.dresidual, s.encoder_plan, 0, nullptr, 0, B, T, C, st);
         }},
        {"AdamW + global norm + zeroing", 0, n * (30 + 4 + 4),
         [=] {
             global_norm_squared(&m->stats->grad_norm_squared, s.reduce, m->grads_memory, m->num_parameters, st);
             adamw_update(m->params_memory, m->master_weights, m->grads_memory, m->adam_m, m->adam_v, m->num_parameters,
                          1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 0.0f, nullptr, 1, 0, st);
             cudaCheck(cudaMemsetAsync(m->grads_memory, 0, m->num_parameters * sizeof(float), st));
         }},
    };
    if (!fused)
        families.push_back({"gelu forward + backward", 0, l * 5 * bt * 4 * C * X, [=] {
                                for (int k = 0; k < L; k++) {
                                    gelu_forward(a.fch_gelu, a.fch, (size_t)BT * 4 * C, st);
                                    gelu_backward_inplace(s.dwide, a.fch, (size_t)BT * 4 * C, st);
                                }
                            }});
    return families;
}

// The host's part of a step next to the device's: the wall time per step
// beyond the device time, and the encoder-backward plan that the host builds
// before the step's first launch, timed against the stable sort it replaced.
static void print_host_time(const int* tokens, int B, int T, double device_ms, double wall_ms) {
    const int BT = B * T, reps = 5;
    std::vector<int> plan(encoder_backward_plan_ints(B, T)), order(BT);
    auto ms_of = [&](auto&& f) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; i++) f();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    const double counting = ms_of([&] { encoder_backward_plan(plan.data(), tokens, B, T); });
    const double sorting = ms_of([&] {
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
    });
    printf("host: %.2f ms/step of wall time beyond the device's %.2f; the encoder plan %.3f ms (a stable sort of "
           "the %d ids: %.3f ms, %.1fx)\n",
           std::max(0.0, wall_ms - device_ms), device_ms, counting, BT, sorting, sorting / std::max(counting, 1e-9));
}

// ms per step over `steps` steps after one warm-up step (the first touch of
// every buffer, and the cuBLASLt heuristics); profile: the CPU runtime's
// per-kernel profile covers exactly these steps.
// *wall_ms: the wall-clock ms per step; what exceeds the device's ms is host
// work the device waited for (staging, the encoder plan, launches, the sync).
static double time_steps(GPT2* model, const StepBatch& batch, int steps, bool profile, double* wall_ms = nullptr) {
    OptimizerSettings opt;
    train_step(model, batch, 1e-4f, opt);
#ifdef CPUCUDA
    cpucuda::set_profiling(profile);
    cpucuda::reset_profile();
#else
    (void)profile;
#endif
    cudaEvent_t start, end;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&end));
    const auto wall_start = std::chrono::steady_clock::now();
    cudaCheck(cudaEventRecord(start, model->stream));
    for (int i = 0; i < steps; i++) train_step(model, batch, 1e-4f, opt);
    cudaCheck(cudaEventRecord(end, model->stream));
    cudaCheck(cudaEventSynchronize(end));
    if (wall_ms)
        *wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start).count() /
                   steps;
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, start, end));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(end));
    return ms / steps;
}

static int bench(int argc, char** argv) {
    const char* descriptor = argc > 1 ? argv[1] : "d12";
    const int B = argc > 2 ? atoi(argv[2]) : 4;
    const int T = argc > 3 ? atoi(argv[3]) : 64;
    const int steps = argc > 4 ? atoi(argv[4]) : 2;
    const double peak_tflops = argc > 5 ? atof(argv[5]) : 989.0;
    if (B <= 0 || T <= 0 || steps <= 0) FAIL("usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s]");

    GPT2 model;
    init_from_descriptor(&model, descriptor, 1337);
    allocate_activations(GPT2_FAMILY, &model, B, T, 1);
    const GPT2Config& c = model.config;
    std::mt19937 rng(42);
    std::vector<int> tokens((size_t)B * T + 1);
    for (int& t : tokens) t = rng() % c.vocab_size;
    const StepBatch batch = whole_batch(&model, tokens.data(), tokens.data() + 1, 1);

    // The trainer's default -ge (2 from compute capability 9.0), and the GELU
    // kernels (-ge 0) for the ratio, timed in this one run.
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, 0));
    const int default_fusion = props.major >= 9 ? 2 : 0, other_fusion = 2 - default_fusion;
    model.gelu_fusion = other_fusion;
    const double other_ms = time_steps(&model, batch, steps, false);
    model.gelu_fusion = default_fusion;
    double wall_ms = 0;
    const double step_ms = time_steps(&model, batch, steps, true, &wall_ms);
    const float ms = (float)(step_ms * steps);
    const double tokens_per_s = (double)B * T / (step_ms / 1000.0);
    // 6 FLOPs per parameter per token (forward + backward) plus attention
    const double flops_per_token = 6.0 * model.num_parameters + 6.0 * c.num_layers * c.channels * T;
    const double achieved_tflops = flops_per_token * tokens_per_s / 1e12;
    printf("model %s (%zu parameters), B=%d T=%d, %s, -ge %d: %.1f ms/step, %.0f tok/s, %.2f TFLOP/s, MFU %.1f%% of "
           "%.0f TFLOP/s\n",
           descriptor, model.num_parameters, B, T, PRECISION_NAME, default_fusion, step_ms, tokens_per_s,
           achieved_tflops, 100.0 * achieved_tflops / peak_tflops, peak_tflops);
    printf("-ge %d: %.1f ms/step; -ge 2 is %.2fx the speed of -ge 0\n", other_fusion, other_ms,
           default_fusion == 2 ? other_ms / step_ms : step_ms / other_ms);
    print_host_time(tokens.data(), B, T, step_ms, wall_ms);
#ifdef CPUCUDA
    double gemm = 0, kernels = 0;
    for (const auto& e : cpucuda::profile()) (e.name == "cublasLtMatmul" ? gemm : kernels) += e.seconds;
    const double total = ms / 1000.0;
    printf("time per step: GEMM %.0f ms (%.1f%%), kernels %.0f ms (%.1f%%), other %.0f ms (%.1f%%)\n",
           1000 * gemm / steps, 100 * gemm / total, 1000 * kernels / steps, 100 * kernels / total,
           1000 * (total - gemm - kernels) / steps, 100 * (total - gemm - kernels) / total);
    int shown = 0;
    for (const auto& e : cpucuda::profile())
        if (shown++ < 8)
            printf("  %-44s %7.1f ms/step %5.1f%%\n", e.name.c_str(), 1000 * e.seconds / steps,
                   100 * e.seconds / total);
    printf("peak device memory: %.1f MiB\n", cpucuda::memory_stats().peak / 1048576.0);
#else
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory in use: %.1f MiB of %.1f MiB\n", (total_bytes - free_bytes) / 1048576.0,
           total_bytes / 1048576.0);
#endif
    print_roofline(step_families(&model), model.B, model.T,
                   getenv("BENCH_FAMILIES") && atoi(getenv("BENCH_FAMILIES")) == 1, model.stream);
    free_model(&model);
    matmul_teardown();
    return 0;
}

// B*T+1 token ids (int32) from a file: the inputs and, shifted by one, the targets.
static std::vector<int> read_tokens(const char* path, int B, int T, int vocab_size) {
    std::vector<int> tokens((size_t)B * T + 1);
    FILE* f = fopen(path, "rb");
    if (!f) FAIL("%s: cannot open the token file", path);
    const size_t got = fread(tokens.data(), sizeof(int), tokens.size(), f);
    fclose(f);
    if (got != tokens.size()) FAIL("%s: %zu token ids, expected B*T+1 = %zu", path, got, tokens.size());
    for (int t : tokens)
        if (t < 0 || t >= vocab_size) FAIL("%s: token id %d is not in [0, %d)", path, t, vocab_size);
    return tokens;
}

// Serve mode, for a driver that alternates this build's steps with another
// program's in one run (dev/bench_cpu_vs_torch.py): the model comes from a
// checkpoint and the batch from a token file; after one warm-up step it prints
// "ready", then for each line "step" on stdin runs one training step and prints
// "ms <wall ms of the step>"; end of input ends it.
static int serve(int argc, char** argv) {
    if (argc != 6) FAIL("usage: bench_train --serve CHECKPOINT B T TOKENS (B*T+1 int32 token ids)");
    const int B = atoi(argv[3]), T = atoi(argv[4]);
    if (B <= 0 || T <= 0) FAIL("--serve: B=%s and T=%s must be positive integers", argv[3], argv[4]);
    GPT2 model;
    init_from_model_file(&model, argv[2]);
    if (T > model.config.max_seq_len) FAIL("--serve: T=%d over the model's maxT=%d", T, model.config.max_seq_len);
    allocate_activations(GPT2_FAMILY, &model, B, T, 1);
    const std::vector<int> tokens = read_tokens(argv[5], B, T, model.config.vocab_size);
    const StepBatch batch = whole_batch(&model, tokens.data(), tokens.data() + 1, 1);
    OptimizerSettings opt;
    train_step(&model, batch, 1e-4f, opt);
    printf("ready %s\n", PRECISION_NAME);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "step\n") != 0) FAIL("--serve: expected the line \"step\", got \"%.20s\"", line);
        const auto t0 = std::chrono::steady_clock::now();
        const StepResult r = train_step(&model, batch, 1e-4f, opt);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        printf("ms %.3f loss %.6f\n", ms, r.loss);
        fflush(stdout);
    }
    free_model(&model);
    matmul_teardown();
    return 0;
}

static int bench_or_serve(int argc, char** argv) {
    return argc > 1 && strcmp(argv[1], "--serve") == 0 ? serve(argc, argv) : bench(argc, argv);
}

// a CUDA or cuBLASLt error (llmc::Error) is one line "error: ..." and exit status 1
int main(int argc, char** argv) { return llmc::run_main(bench_or_serve, argc, argv); }
