// Device copies for tests: a host vector to a new device buffer and back; a
// float's bits, for results that must match bitwise.
#pragma once
#include <cuda_runtime.h>
#include <cstdint>
#include <cstring>
#include <vector>
#include "test/test_util.h"

template <class T>
static T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    CUDA_OK(cudaMalloc(&d, h.size() * sizeof(T)));
    CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
static std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
inline uint32_t bits_of(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
}
inline float float_of(uint32_t b) {
    float x;
    std::memcpy(&x, &b, 4);
    return x;
}
