// Training-step benchmark: a GPT-2 model (default d12) on random tokens.
// Prints ms per step, tokens/s, model FLOPs utilisation against a peak, and
// peak device memory. Under the CPU runtime it also prints where the time
// goes: cuBLASLt matmuls (GEMM) vs the hand-written kernels.
//   usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s]
//   e.g.   build/cpu/bench_train d12 4 64 2        (CPU: GEMM share)
//          build/gpu/sm_90/bench_train d12 16 1024 10 989   (H100/H200 bf16 dense peak)
#define TESTING
#include "train_gpt.cu"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif
#include <chrono>
#include <random>

int main(int argc, char** argv) {
    const char* descriptor = argc > 1 ? argv[1] : "d12";
    const int B = argc > 2 ? atoi(argv[2]) : 4;
    const int T = argc > 3 ? atoi(argv[3]) : 64;
    const int steps = argc > 4 ? atoi(argv[4]) : 2;
    const double peak_tflops = argc > 5 ? atof(argv[5]) : 989.0;
    if (B <= 0 || T <= 0 || steps <= 0) FAIL("usage: bench_train [descriptor] [B] [T] [steps] [peak TFLOP/s]");

    GPT2 model;
    gpt2_init_from_descriptor(&model, descriptor, 1337);
    gpt2_allocate_activations(&model, B, T, 1);
    const GPT2Config& c = model.config;
    std::mt19937 rng(42);
    std::vector<int> tokens((size_t)B * T + 1);
    for (int& t : tokens) t = rng() % c.vocab_size;
    const StepBatch batch = whole_batch(&model, tokens.data(), tokens.data() + 1, 1);
    OptimizerSettings opt;

    train_step(&model, batch, 1e-4f, opt);  // warm-up: first touch of every buffer
#ifdef CPUCUDA
    cpucuda::set_profiling(true);
    cpucuda::reset_profile();
#endif
    cudaEvent_t start, end;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&end));
    cudaCheck(cudaEventRecord(start, model.stream));
    for (int i = 0; i < steps; i++) train_step(&model, batch, 1e-4f, opt);
    cudaCheck(cudaEventRecord(end, model.stream));
    cudaCheck(cudaEventSynchronize(end));
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, start, end));
    const double step_ms = ms / steps;
    const double tokens_per_s = (double)B * T / (step_ms / 1000.0);
    // 6 FLOPs per parameter per token (forward + backward) plus attention
    const double flops_per_token = 6.0 * model.num_parameters + 6.0 * c.num_layers * c.channels * T;
    const double achieved_tflops = flops_per_token * tokens_per_s / 1e12;
    printf("model %s (%zu parameters), B=%d T=%d, %s: %.1f ms/step, %.0f tok/s, %.2f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s\n",
           descriptor, model.num_parameters, B, T, PRECISION_NAME, step_ms, tokens_per_s, achieved_tflops,
           100.0 * achieved_tflops / peak_tflops, peak_tflops);
#ifdef CPUCUDA
    double gemm = 0, kernels = 0;
    for (const auto& e : cpucuda::profile()) (e.name == "cublasLtMatmul" ? gemm : kernels) += e.seconds;
    const double total = ms / 1000.0;
    printf("time per step: GEMM %.0f ms (%.1f%%), kernels %.0f ms (%.1f%%), other %.0f ms (%.1f%%)\n",
           1000 * gemm / steps, 100 * gemm / total, 1000 * kernels / steps, 100 * kernels / total,
           1000 * (total - gemm - kernels) / steps, 100 * (total - gemm - kernels) / total);
    int shown = 0;
    for (const auto& e : cpucuda::profile())
        if (shown++ < 8) printf("  %-44s %7.1f ms/step %5.1f%%\n", e.name.c_str(), 1000 * e.seconds / steps, 100 * e.seconds / total);
    printf("peak device memory: %.1f MiB\n", cpucuda::memory_stats().peak / 1048576.0);
#else
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory in use: %.1f MiB of %.1f MiB\n", (total_bytes - free_bytes) / 1048576.0, total_bytes / 1048576.0);
#endif
    gpt2_free(&model);
    matmul_teardown();
    return 0;
}
