// What the tests of the elementwise and row kernels share (test_encoder,
// test_layernorm, test_gelu, test_classifier, test_global_norm, test_adamw):
// their bounds, random inputs, the error metrics, device buffers, and the
// stream every case launches on. Each kernel is checked against plain C++ in double.
//
// Error metrics (stated per check):
//   norm    max_i |got_i - ref_i| / max_i |ref_i|       (one number per tensor)
//   rel     max_i |got_i - ref_i| / max(|ref_i|, floor)  (elementwise, max_rel_diff)
// Tolerances:
//   TOL_F32  1e-5 for everything the kernels compute and store in fp32 (mean, rstd,
//            losses, weight gradients, norms, optimizer state), in both builds:
//            the inputs are the same floatX values in kernel and reference.
//   TOL_X    what one rounding to floatX costs, for floatX outputs (activations,
//            dinp, dlogits, dgelu): 1e-5 under ENABLE_FP32; 2^-7 under bf16, twice
//            bf16's unit roundoff 2^-8 (8 significant bits), which bounds
//            |round(x) - x| / |x| and so both metrics for one rounding.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "test/test_device.h"

#if defined(ENABLE_FP32)
constexpr double TOL_X = 1e-5;
#else
constexpr double TOL_X = 1.0 / 128;
#endif
constexpr double TOL_F32 = 1e-5;

static cudaStream_t g_stream;
static std::mt19937 g_rng;

static inline std::vector<float> randf(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(g_rng);
    return v;
}
static inline std::vector<floatX> randx(size_t n, float lo, float hi) {
    std::vector<float> f = randf(n, lo, hi);
    std::vector<floatX> v(n);
    for (size_t i = 0; i < n; i++) v[i] = from_float<floatX>(f[i]);
    return v;
}
template <class T>
static inline std::vector<double> dbl(const std::vector<T>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); i++) d[i] = (double)to_float(v[i]);
    return d;
}
static inline double norm_err(const std::vector<double>& got, const std::vector<double>& ref) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        scale = std::max(scale, std::fabs(ref[i]));
        const double d = std::fabs(got[i] - ref[i]);
        if (!(d <= worst)) worst = d;  // NaN stays
    }
    return worst / std::max(scale, 1e-30);
}
template <class T>
static inline bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Device buffers of one test case, freed together.
struct Dev {
    std::vector<void*> ptrs;
    template <class T> T* up(const std::vector<T>& h) {
        T* d = to_device(h);
        ptrs.push_back(d);
        return d;
    }
    template <class T> T* alloc(size_t n) {
        T* d = nullptr;
        CUDA_OK(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)));
        ptrs.push_back(d);
        return d;
    }
    template <class T> void put(T* d, const std::vector<T>& h) {
        CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Dev() {
        for (void* p : ptrs) cudaFree(p);
    }
};

// Creates the stream and says which precision and bounds apply.
static inline void kernel_test_begin(const char* program) {
    CUDA_OK(cudaStreamCreate(&g_stream));
    printf("%s: floatX = %s, TOL_X = %.2e, TOL_F32 = %.0e\n", program, PRECISION_NAME, TOL_X, TOL_F32);
}
static inline int kernel_test_end(const char* program) {
    CUDA_OK(cudaStreamDestroy(g_stream));
    return test_summary(program);
}
