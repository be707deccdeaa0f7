// Training-step benchmark of a Llama 3 model (train_llama3.cu) on random
// tokens: ms per step, tokens/s, model FLOPs utilisation against a peak, then
// the H200 roofline of one step per kernel family (FLOPs and bytes of forward,
// backward and AdamW; bound = max(FLOPs / 989 TFLOP/s, bytes / 4.8 TB/s)).
// --roofline prints the roofline alone, from the shape: no model is allocated,
// so Llama 3.2 1B at 16 x 2048 prints on any machine.
// A program of its own next to dev/bench_train.cu (GPT-2): both trainers
// define ParameterTensors, ActivationTensors and the model's functions at file
// scope, so one unit cannot include both.
//   usage: bench_llama3 [descriptor] [B] [T] [steps] [peak TFLOP/s]
//          bench_llama3 --roofline [descriptor] [B] [T]
//   e.g.   build/cpu/bench_llama3 llama3:L=2,C=64,H=4,KV=2,F=192,V=256 4 64 2   (CPU runtime)
//          build/cpu/bench_llama3 --roofline llama3.2-1b 16 2048
//          build/gpu/sm_90/bench_llama3 llama3.2-1b 4 2048 5 989
#define TESTING
#include "train_llama3.cu"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif
#include <random>
#include "dev/bench_roofline.h"

// --- the roofline of one step, per kernel family (dev/bench_roofline.h) ---------
// Counted the way bench_train.cu counts GPT-2's, from the launches of forward
// and backward in train_llama3.cu; X = sizeof(floatX).
static std::vector<Family> step_families(const Llama3Config& c, int B, int T) {
    const double X = sizeof(floatX), bt = (double)B * T, l = c.L, C = c.C, F = c.F, NH = c.H, HS = c.head_dim();
    const double QKV = qkv_rows(c), Vp = padded_vocab(c);
    double n = 0;  // the parameter buffer (padded vocabulary rows included)
    for (int k = 0; k < num_tensors(c); k++) n += (double)tensor_size(k, c);
    const double attn_unit = attention_unit(B, T, NH, HS);  // GQA: per query head
    return {
        // per layer: qkv (C -> QKV), attproj (C -> C), fc (C -> [gate | up] 2F), fcproj (F -> C)
        matmul_family("matmuls (cuBLASLt)", {{C, QKV}, {C, C}, {C, 2 * F}, {F, C}}, l, bt, C, Vp, X),
        // the same products as bench_train.cu counts: 2 forward, 7 backward
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

// ms per step over `steps` steps after one warm-up step (the first touch of
// every buffer, the cuBLASLt heuristics).
static double time_steps(Llama3* model, const StepBatch& batch, int steps) {
    OptimizerSettings opt;
    train_step(model, batch, 1e-4f, opt);
    return time_ms([&] { train_step(model, batch, 1e-4f, opt); }, steps, model->stream);
}

static int bench(int argc, char** argv) {
    const bool roofline_only = argc > 1 && strcmp(argv[1], "--roofline") == 0;
    if (roofline_only) argc--, argv++;
    const char* descriptor = argc > 1 ? argv[1] : LLAMA3_FAMILY.builtin_init;
    const int B = argc > 2 ? atoi(argv[2]) : 4;
    const int T = argc > 3 ? atoi(argv[3]) : 64;
    const int steps = argc > 4 ? atoi(argv[4]) : 2;
    const double peak_tflops = argc > 5 ? atof(argv[5]) : 989.0;
    if (B <= 0 || T <= 0 || steps <= 0 || !(peak_tflops > 0) || argc > (roofline_only ? 4 : 6))
        FAIL("usage: bench_llama3 [descriptor] [B] [T] [steps] [peak TFLOP/s], or bench_llama3 --roofline "
             "[descriptor] [B] [T]");
    const Llama3Config c = llmc::llama3_parse_descriptor(descriptor);
    llmc::llama3_check(c, descriptor);
    if (T > c.max_seq_len) FAIL("T=%d exceeds the model's maximum sequence length %d", T, c.max_seq_len);
    print_model(descriptor, c);
    if (roofline_only) {
        print_roofline(step_families(c, B, T), B, T, false, nullptr);
        return 0;
    }

    Llama3 model;
    init_from_descriptor(&model, descriptor, 1337);
    allocate_activations(LLAMA3_FAMILY, &model, B, T, 1);
    std::mt19937 rng(42);
    std::vector<int> tokens((size_t)B * T + 1);
    for (int& t : tokens) t = rng() % c.V;
    const StepBatch batch = whole_batch(&model, tokens.data(), tokens.data() + 1, 1);
    const double step_ms = time_steps(&model, batch, steps);
    const double tokens_per_s = (double)B * T / (step_ms / 1000.0);
    const double achieved_tflops = LLAMA3_FAMILY.flops_per_token(&model, T) * tokens_per_s / 1e12;
    printf("step B=%d T=%d, %s, %s: %.1f ms/step, %.0f tok/s, %.2f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s\n", B, T,
           PRECISION_NAME,
#ifdef CPUCUDA
           "CPU runtime (CPU time, not a GPU's)",
#else
           "CUDA events on this GPU",
#endif
           step_ms, tokens_per_s, achieved_tflops, 100.0 * achieved_tflops / peak_tflops, peak_tflops);
#ifdef CPUCUDA
    printf("peak device memory: %.1f MiB\n", cpucuda::memory_stats().peak / 1048576.0);
#else
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory in use: %.1f MiB of %.1f MiB\n", (total_bytes - free_bytes) / 1048576.0,
           total_bytes / 1048576.0);
#endif
    print_roofline(step_families(c, B, T), B, T, false, nullptr);
    free_model(&model);
    matmul_teardown();
    return 0;
}

// a CUDA or cuBLASLt error (llmc::Error) is one line "error: ..." and exit status 1
int main(int argc, char** argv) { return llmc::run_main(bench, argc, argv); }
