// dev/bench_roofline.h: the H200 roofline of one training step, per kernel
// family, as bench_train prints it for GPT-2 and Llama 3. A family's bound
// is the time it takes at least: max(FLOPs / 989 TFLOP/s, bytes / 4.8 TB/s),
// its bytes what its kernels must move at least (every operand read once,
// every result written once). Each benchmark lists its model's families.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "dev/bench_timing.h"

struct Family {
    const char* name;
    double flops, bytes;
    std::function<void()> run;  // the family's launches of one step (empty: not timed)
};

// The matmuls of a step: per layer `shapes` (in -> out features), then the LM
// head (C -> Vp), over bt tokens. Forward, input gradient and weight gradient
// are 6 FLOPs per multiply-add of a token; each reads and writes its
// activations (3 x in and 3 x out per token, X bytes each), reads the weight
// twice and reads and writes its fp32 gradient.
struct MatmulShape {
    double in, out;
};
inline Family matmul_family(const char* name, const std::vector<MatmulShape>& shapes, double L, double bt, double C,
                            double Vp, double X) {
    double flops = 6 * bt * C * Vp, bytes = 3 * bt * C * X + 3 * bt * Vp * X + Vp * C * (2 * X + 8);
    for (const MatmulShape& s : shapes) {
        flops += L * 6 * bt * s.in * s.out;
        bytes += L * (3 * bt * s.in * X + 3 * bt * s.out * X + s.in * s.out * (2 * X + 8));
    }
    return {name, flops, bytes, {}};
}

// One causal T x T x HS product over B sequences and NH query heads (FLOPs):
// attention's forward is 2 of them, its backward 7.
inline double attention_unit(double B, double T, double NH, double HS) { return 2 * B * NH * T * T * HS / 2; }

// Prints the table and the step's bound (and the part outside matmuls and
// attention). With `timed`, each family's launches run once to warm up and
// once timed on `stream`, beside their bound.
inline void print_roofline(const std::vector<Family>& families, int B, int T, bool timed, cudaStream_t stream) {
    const double peak_flops = 989e12, peak_bytes = 4.8e12;
#ifdef CPUCUDA
    const char* times = "; times: CPU runtime (CPU times, not a GPU's)";
#else
    const char* times = "; times: CUDA events on this GPU";
#endif
    printf("roofline of one step (B=%d T=%d), H200 bound = max(FLOPs / 989 TFLOP/s, bytes / 4.8 TB/s)%s\n", B, T,
           timed ? times : "");
    printf("  %-32s %12s %12s %10s%s\n", "family", "GFLOP", "GB", "bound ms", timed ? "    time ms" : "");
    double bound_all = 0, bound_rest = 0;
    for (const Family& f : families) {
        const double bound = 1000 * std::max(f.flops / peak_flops, f.bytes / peak_bytes);
        bound_all += bound;
        if (strncmp(f.name, "matmuls", 7) != 0 && strncmp(f.name, "attention", 9) != 0) bound_rest += bound;
        printf("  %-32s %12.6g %12.6g %10.4g", f.name, f.flops / 1e9, f.bytes / 1e9, bound);
        if (timed && f.run) {
            f.run();  // warm-up
            printf(" %10.3f", time_ms(f.run, 1, stream));
        }
        printf("\n");
    }
    printf("  bound of the step: %.4g ms; outside matmuls and attention: %.4g ms\n", bound_all, bound_rest);
}
