// Training-step benchmark of either family on random tokens: GPT-2
// (train_gpt.cu, default d12) or Llama 3 (train_llama3.cu: a descriptor
// llama3:L=..,C=.. or llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b). Prints ms per
// step, tokens/s, model FLOPs utilisation against a peak and device memory,
// then the roofline of one step per kernel family (dev/bench_roofline.h):
// FLOPs and bytes of forward, backward and AdamW, and the time they take at
// least on an H200 (989 TFLOP/s bf16, 4.8 TB/s).
// GPT-2 also prints -ge 2 against -ge 0, the host's part of a step, under the
// CPU runtime where the time goes (cuBLASLt matmuls, GEMM, vs the hand-written
// kernels), and with BENCH_FAMILIES=1 times each family's launches of one step
// alone with CUDA events (on the CPU runtime: CPU times).
// Llama 3's --roofline prints the roofline alone, from the shape: no model is
// allocated, so Llama 3.2 1B at 16 x 2048 prints on any machine.
//   usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s]
//          bench_train --roofline [Llama 3 descriptor] [B] [T]
//          bench_train --serve CHECKPOINT B T TOKENS: GPT-2 steps on request (bench::serve below)
//   e.g.   build/cpu/bench_train d12 4 64 2        (CPU: GEMM share)
//          build/gpu/sm_90/bench_train d12 16 1024 10 989   (H100/H200 bf16 dense peak)
//          build/cpu/bench_train llama3:L=2,C=64,H=4,KV=2,F=192,V=256 4 64 2   (CPU runtime)
//          build/cpu/bench_train --roofline llama3.2-1b 16 2048
//          build/gpu/sm_90/bench_train llama3.2-1b 4 2048 5 989
//
// Both trainers are in this one unit, each in a namespace of its own (gpt2,
// llama3): both define ParameterTensors, ActivationTensors, forward,
// backward... at file scope. Every header they include is included here
// first, at global scope, so that their own #includes are no-ops (#pragma
// once); a header a trainer starts to include belongs in this list too.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/kernels/rmsnorm.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/kernels/swiglu.cuh"
#include "llmc/step/params.h"
#include "llmc/step/train_step.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/formats/hf_model.h"
#include "llmc/formats/llama3_config.h"
#include "llmc/formats/safetensors.h"
#include "llmc/run/flags.h"
#include "llmc/run/mfu.h"
#include "llmc/rand.h"
#include "llmc/run/run_checkpoint.h"
#include "llmc/run/run_model.h"
#include "llmc/run/run.h"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif
#include "dev/bench_roofline.h"

#define TESTING  // the trainers without their main
namespace gpt2 {
#include "train_gpt.cu"
}
namespace llama3 {
#include "train_llama3.cu"
}

// ---- what both families' benchmarks do alike -------------------------------------
namespace bench {

// The command line of a timed step, or of --roofline (no steps, no peak).
struct Args {
    bool roofline_only;
    const char* descriptor;
    int B, T, steps;
    double peak_tflops;
};

static Args parse_args(int argc, char** argv) {
    Args a{};
    a.roofline_only = argc > 1 && strcmp(argv[1], "--roofline") == 0;
    if (a.roofline_only) argc--, argv++;
    // --roofline is Llama 3's: its default is the trainer's small Llama
    a.descriptor = argc > 1 ? argv[1] : a.roofline_only ? llama3::LLAMA3_FAMILY.builtin_init : "d12";
    a.B = argc > 2 ? atoi(argv[2]) : 4;
    a.T = argc > 3 ? atoi(argv[3]) : 64;
    a.steps = argc > 4 ? atoi(argv[4]) : 2;
    a.peak_tflops = argc > 5 ? atof(argv[5]) : 989.0;
    if (a.B <= 0 || a.T <= 0 || a.steps <= 0 || !(a.peak_tflops > 0) || argc > (a.roofline_only ? 4 : 6))
        FAIL("usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s], bench_train --roofline [Llama 3 "
             "descriptor] [B] [T], or bench_train --serve CHECKPOINT B T TOKENS");
    return a;
}

static void check_sequence_length(int T, int max_seq_len) {
    if (T > max_seq_len) FAIL("T=%d exceeds the model's maximum sequence length %d", T, max_seq_len);
}

// The model of the descriptor with activations for B x T, and its batch:
// B*T+1 random token ids (in *tokens), the inputs and, shifted by one, the targets.
template <class Model, class Config>
static StepBatch prepare(const ModelFamily<Model, Config>& f, Model* model, const Args& a, std::vector<int>* tokens) {
    f.init_from_descriptor(model, a.descriptor, 1337);
    check_sequence_length(a.T, f.max_seq_len(model));
    allocate_activations(f, model, a.B, a.T, 1);
    std::mt19937 rng(42);
    tokens->resize((size_t)a.B * a.T + 1);
    for (int& t : *tokens) t = rng() % f.vocab_size(model);
    return whole_batch(model, tokens->data(), tokens->data() + 1, 1);
}

template <class Model, class Config>
static void finish(const ModelFamily<Model, Config>& f, Model* model) {
    f.free_model(model);
    matmul_teardown();
}

// ms per step over `steps` steps after one warm-up step (the first touch of
// every buffer, and the cuBLASLt heuristics); profile: the CPU runtime's
// per-kernel profile covers exactly these steps.
// *wall_ms: the wall-clock ms per step; what exceeds the device's ms is host
// work the device waited for (staging, the encoder plan, launches, the sync).
template <class Model>
static double time_steps(Model* model, const StepBatch& batch, int steps, bool profile, double* wall_ms = nullptr) {
    OptimizerSettings opt;
    train_step(model, batch, 1e-4f, opt);
#ifdef CPUCUDA
    cpucuda::set_profiling(profile);
    cpucuda::reset_profile();
#else
    (void)profile;
#endif
    const auto wall_start = std::chrono::steady_clock::now();
    const double ms = time_ms([&] { train_step(model, batch, 1e-4f, opt); }, steps, model->stream);
    if (wall_ms)
        *wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start).count() /
                   steps;
    return ms;
}

// The step line after its family's head: ms/step, tok/s, TFLOP/s and MFU against the peak.
static void print_speed(double step_ms, const Args& a, double flops_per_token) {
    const double tokens_per_s = (double)a.B * a.T / (step_ms / 1000.0);
    const double achieved_tflops = flops_per_token * tokens_per_s / 1e12;
    printf(": %.1f ms/step, %.0f tok/s, %.2f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s\n", step_ms, tokens_per_s,
           achieved_tflops, 100.0 * achieved_tflops / a.peak_tflops, a.peak_tflops);
}

static void print_memory() {
#ifdef CPUCUDA
    printf("peak device memory: %.1f MiB\n", cpucuda::memory_stats().peak / 1048576.0);
#else
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory in use: %.1f MiB of %.1f MiB\n", (total_bytes - free_bytes) / 1048576.0,
           total_bytes / 1048576.0);
#endif
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
template <class Model, class Config>
static int serve(const ModelFamily<Model, Config>& f, int argc, char** argv) {
    if (argc != 6) FAIL("usage: bench_train --serve CHECKPOINT B T TOKENS (B*T+1 int32 token ids)");
    const int B = atoi(argv[3]), T = atoi(argv[4]);
    if (B <= 0 || T <= 0) FAIL("--serve: B=%s and T=%s must be positive integers", argv[3], argv[4]);
    Model model;
    f.init_from_model_file(&model, argv[2]);
    if (T > f.max_seq_len(&model)) FAIL("--serve: T=%d over the model's maxT=%d", T, f.max_seq_len(&model));
    allocate_activations(f, &model, B, T, 1);
    const std::vector<int> tokens = read_tokens(argv[5], B, T, f.vocab_size(&model));
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
    finish(f, &model);
    return 0;
}

}  // namespace bench

// ---- GPT-2 ---------------------------------------------------------------------------
namespace gpt2 {

// The roofline of one step, per kernel family (dev/bench_roofline.h).
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
             grad_scale(&m->stats->grad_scale, &m->stats->grad_norm_squared, 1.0f, st);
             adamw_update(m->params_memory, m->master_weights, m->grads_memory, m->adam_m, m->adam_v, m->num_parameters,
                          1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, &m->stats->grad_scale, 1, 0, st);
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

#ifdef CPUCUDA
// Where the timed steps' time went on the CPU runtime: cuBLASLt's matmuls
// (GEMM), the kernels, the rest; then the 8 costliest entries.
static void print_cpu_profile(double step_ms, int steps) {
    double gemm = 0, kernels = 0;
    for (const auto& e : cpucuda::profile()) (e.name == "cublasLtMatmul" ? gemm : kernels) += e.seconds;
    const double total = step_ms * steps / 1000.0;
    printf("time per step: GEMM %.0f ms (%.1f%%), kernels %.0f ms (%.1f%%), other %.0f ms (%.1f%%)\n",
           1000 * gemm / steps, 100 * gemm / total, 1000 * kernels / steps, 100 * kernels / total,
           1000 * (total - gemm - kernels) / steps, 100 * (total - gemm - kernels) / total);
    int shown = 0;
    for (const auto& e : cpucuda::profile())
        if (shown++ < 8)
            printf("  %-44s %7.1f ms/step %5.1f%%\n", e.name.c_str(), 1000 * e.seconds / steps,
                   100 * e.seconds / total);
}
#endif

static int bench_step(const bench::Args& a) {
    GPT2 model;
    std::vector<int> tokens;
    const StepBatch batch = bench::prepare(GPT2_FAMILY, &model, a, &tokens);
    // The trainer's default -ge (2 from compute capability 9.0), and the GELU
    // kernels (-ge 0) for the ratio, timed in this one run.
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, 0));
    const int default_fusion = props.major >= 9 ? 2 : 0, other_fusion = 2 - default_fusion;
    model.gelu_fusion = other_fusion;
    const double other_ms = bench::time_steps(&model, batch, a.steps, false);
    model.gelu_fusion = default_fusion;
    double wall_ms = 0;
    const double step_ms = bench::time_steps(&model, batch, a.steps, true, &wall_ms);
    printf("model %s (%zu parameters), B=%d T=%d, %s, -ge %d", a.descriptor, model.num_parameters, a.B, a.T,
           PRECISION_NAME, default_fusion);
    bench::print_speed(step_ms, a, GPT2_FAMILY.flops_per_token(&model, a.T));
    printf("-ge %d: %.1f ms/step; -ge 2 is %.2fx the speed of -ge 0\n", other_fusion, other_ms,
           default_fusion == 2 ? other_ms / step_ms : step_ms / other_ms);
    print_host_time(tokens.data(), a.B, a.T, step_ms, wall_ms);
#ifdef CPUCUDA
    print_cpu_profile(step_ms, a.steps);
#endif
    bench::print_memory();
    print_roofline(step_families(&model), model.B, model.T,
                   getenv("BENCH_FAMILIES") && atoi(getenv("BENCH_FAMILIES")) == 1, model.stream);
    bench::finish(GPT2_FAMILY, &model);
    return 0;
}

}  // namespace gpt2

// ---- Llama 3 -------------------------------------------------------------------------
namespace llama3 {

// The roofline of one step, per kernel family (dev/bench_roofline.h), from
// the shape alone. Counted the way gpt2::step_families counts GPT-2's, from
// the launches of forward and backward in train_llama3.cu; X = sizeof(floatX).
static std::vector<Family> step_families(const Llama3Config& c, int B, int T) {
    const double X = sizeof(floatX), bt = (double)B * T, l = c.L, C = c.C, F = c.F, NH = c.H, HS = c.head_dim();
    const double QKV = qkv_rows(c), Vp = padded_vocab(c);
    double n = 0;  // the parameter buffer (padded vocabulary rows included)
    for (int k = 0; k < num_tensors(c); k++) n += (double)tensor_size(k, c);
    const double attn_unit = attention_unit(B, T, NH, HS);  // GQA: per query head
    return {
        // per layer: qkv (C -> QKV), attproj (C -> C), fc (C -> [gate | up] 2F), fcproj (F -> C)
        matmul_family("matmuls (cuBLASLt)", {{C, QKV}, {C, C}, {C, 2 * F}, {F, C}}, l, bt, C, Vp, X),
        // the same products as gpt2::step_families counts: 2 forward, 7 backward
        {"attention forward", l * 2 * attn_unit, l * (bt * QKV * X + bt * C * X + bt * NH * 4)},
        {"attention backward", l * 7 * attn_unit, l * (bt * QKV * X + 2 * bt * C * X + bt * QKV * X + 2 * bt * NH * 4)},
        // q and k heads rotated in place, forward and backward
        {"rope forward + backward", 0, l * 2 * 2 * bt * (C + c.KV * HS) * X},
        // the first norm reads and writes; the 2L fused ones read residual and projection, write both outputs
        {"rmsnorm forward (+ residual)", 0, 2 * bt * C * X + 2 * l * 4 * bt * C * X},
        {"rmsnorm backward", 0, (2 * l + 1) * 4 * bt * C * X},
        {"swiglu forward + backward", 0, l * (3 + 5) * bt * F * X},
        // a row cached in shared memory where it fits an H200 block (227 KB), else read twice (fused_classifier)
        {"classifier", 0, (Vp * X + 256 <= 232448 ? 2 : 3) * bt * Vp * X},
        // forward: a row of wte per token; backward: a row of its fp32 gradient read and written per token
        {"encoder forward + backward", 0, 2 * bt * C * X + bt * C * X + 2 * bt * C * 4},
        // weights (X), fp32 master, gradient, m and v; the gradient read again for the norm and zeroed
        {"AdamW + global norm + zeroing", 0, n * (30 + 4 + 4)},
    };
}

static void print_model(const char* descriptor, const Llama3Config& c) {
    printf("model %s: L=%d C=%d H=%d KV=%d F=%d V=%d %s, %llu parameters\n", descriptor, c.L, c.C, c.H, c.KV, c.F, c.V,
           c.tied ? "tied" : "untied", (unsigned long long)llmc::llama3_num_parameters(c));
}

static int bench_step(const bench::Args& a) {
    const Llama3Config c = llmc::llama3_parse_descriptor(a.descriptor);
    llmc::llama3_check(c, a.descriptor);
    bench::check_sequence_length(a.T, c.max_seq_len);
    print_model(a.descriptor, c);
    if (!a.roofline_only) {
        Llama3 model;
        std::vector<int> tokens;
        const StepBatch batch = bench::prepare(LLAMA3_FAMILY, &model, a, &tokens);
        const double step_ms = bench::time_steps(&model, batch, a.steps, false);
        printf("step B=%d T=%d, %s, %s", a.B, a.T, PRECISION_NAME,
#ifdef CPUCUDA
               "CPU runtime (CPU time, not a GPU's)"
#else
               "CUDA events on this GPU"
#endif
        );
        bench::print_speed(step_ms, a, LLAMA3_FAMILY.flops_per_token(&model, a.T));
        bench::print_memory();
        bench::finish(LLAMA3_FAMILY, &model);
    }
    print_roofline(step_families(c, a.B, a.T), a.B, a.T, false, nullptr);
    return 0;
}

}  // namespace llama3

// A Llama 3 descriptor (llama3:..., llama3.2-1b, ...) names its family; any other is GPT-2's.
static int bench_or_serve(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--serve") == 0) return bench::serve(gpt2::GPT2_FAMILY, argc, argv);
    const bench::Args a = bench::parse_args(argc, argv);
    if (strncmp(a.descriptor, "llama3", 6) == 0) return llama3::bench_step(a);
    if (a.roofline_only)
        FAIL("--roofline %s: the roofline from the shape alone is Llama 3's (GPT-2's follows its timed step)",
             a.descriptor);
    return gpt2::bench_step(a);
}

// a CUDA or cuBLASLt error (llmc::Error) is one line "error: ..." and exit status 1
int main(int argc, char** argv) { return llmc::run_main(bench_or_serve, argc, argv); }
