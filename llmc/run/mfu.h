// Model FLOPs utilisation and ETA formatting for the training log (header-only host C++).
//
// MFU = achieved model FLOP/s / the GPU's peak FLOP/s. "Model" FLOPs are the
// ones the model needs, not what the kernels happen to execute (recomputation,
// padding and masked-out attention do not count), so MFU compares across
// implementations. Each model family gives its count per token
// (model_flops_per_token, llmc/run/run.h); flops_per_token below is GPT-2's.
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

struct GpuPeak {
    const char* name;  // case-insensitive substring of cudaDeviceProp::name
    double bf16_tflops;
};

// Dense bf16 tensor-core peaks (TFLOP/s, fp32 accumulate, no 2:4 structured
// sparsity), from NVIDIA's datasheets, which quote the sparse figure first: the
// dense one is half of it (H100 SXM "1,979*" -> 989). Boost clock, so real
// sustained peaks are a little lower and MFU is, if anything, understated.
//   H200 (SXM) 989, H100 SXM 989, H100 PCIe 756, H100/H200 NVL 835 (1,671*),
//   A100 (SXM and PCIe) 312, L40S 362, RTX 4090 165 (GeForce runs bf16 with
//   fp32 accumulate at half the fp16-accumulate rate; Ada whitepaper).
// Order matters: the first matching entry wins, so the specific variants come
// before the family name they contain ("H100 PCIe" before "H100").
inline const GpuPeak* gpu_peak_table(size_t* count) {
    // clang-format off
    static const GpuPeak table[] = {
        {"H200 NVL", 835.0}, {"H200", 989.0},     {"H100 PCIe", 756.0}, {"H100 NVL", 835.0},
        {"H100", 989.0},     {"A100", 312.0},     {"L40S", 362.0},      {"RTX 4090", 165.0},
    };
    // clang-format on
    *count = sizeof(table) / sizeof(table[0]);
    return table;
}

// Peak dense bf16 FLOP/s of one device named like cudaDeviceProp::name
// ("NVIDIA H100 80GB HBM3"), or -1 when the name is not in the table.
inline double gpu_peak_bf16_flops(const char* device_name) {
    if (!device_name) return -1.0;
    std::string name(device_name);
    for (char& ch : name) ch = (char)std::tolower((unsigned char)ch);
    size_t count;
    const GpuPeak* table = gpu_peak_table(&count);
    for (size_t i = 0; i < count; i++) {
        std::string key(table[i].name);
        for (char& ch : key) ch = (char)std::tolower((unsigned char)ch);
        if (name.find(key) != std::string::npos) return table[i].bf16_tflops * 1e12;
    }
    return -1.0;
}

// Training FLOPs per token of a GPT-2 with num_parameters weights, L layers,
// C channels and sequence length T (the estimate llm.c and the PaLM paper use):
//   6N: every weight takes part in one multiply-add (2 FLOPs) per token in the
//       forward pass and two in the backward pass (the gradient with respect to
//       the input and with respect to the weight): 2N + 4N.
//   6LCT: attention's two matmuls, Q K^T and att V, are 2*T*C FLOPs each per
//       token and layer forward over all T keys, times 3 with backward = 12LCT;
//       the causal mask leaves half of the keys, so 6LCT.
// N counts every parameter as the trainer reports it (the position embedding
// is a lookup, not a matmul, but is small; wte is also the output matmul).
inline double flops_per_token(size_t num_parameters, int L, int C, int T) {
    return 6.0 * (double)num_parameters + 6.0 * (double)L * (double)C * (double)T;
}

// MFU in percent: 100 * tokens_per_second * flops_per_token / peak. With several
// GPUs, pass either the per-GPU rate and one GPU's peak, or the totals of both.
// Returns false (leaving *out alone) when any input is not a positive number,
// which includes an unknown GPU (peak -1): the log then says "n/a" rather than
// printing a negative or meaningless percentage.
inline bool mfu_percent(double tokens_per_second, double flops_per_token, double peak, double* out) {
    if (!(peak > 0.0) || !(tokens_per_second > 0.0) || !(flops_per_token > 0.0)) return false;
    if (!std::isfinite(peak) || !std::isfinite(tokens_per_second) || !std::isfinite(flops_per_token)) return false;
    *out = 100.0 * tokens_per_second * flops_per_token / peak;
    return true;
}

// A duration for an ETA, to two units at most: "45s", "12m05s", "3h07m", "2d04h".
// Rounded to the last unit shown (3h07m40s is "3h08m"); a value that rounds up
// into the next range moves to it (59.6s is "1m00s"). Negative, NaN or infinite
// input (no estimate yet) gives "n/a".
inline std::string format_duration(double seconds) {
    if (!(seconds >= 0.0) || !(seconds < 9.0e18)) return "n/a";
    char buf[48];
    const long long s = std::llround(seconds);
    if (s < 60) {
        snprintf(buf, sizeof buf, "%llds", s);
        return buf;
    }
    if (s < 3600) {
        snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
        return buf;
    }
    const long long m = std::llround(seconds / 60.0);
    if (m < 24 * 60) {
        snprintf(buf, sizeof buf, "%lldh%02lldm", m / 60, m % 60);
        return buf;
    }
    const long long h = std::llround(seconds / 3600.0);
    snprintf(buf, sizeof buf, "%lldd%02lldh", h / 24, h % 24);
    return buf;
}
