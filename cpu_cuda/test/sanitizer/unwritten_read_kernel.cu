// Deliberately wrong: the kernel reads the whole input buffer, but the host
// filled only its first half. test/run_tests.sh (initcheck) expects the
// normal build under CPUCUDA_INITCHECK=1 to produce NaN, and the racecheck
// build under CPUCUDA_INITCHECK=1 to report the kernel and the line. Exits 1
// when an output is NaN.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>

__global__ void scale_kernel(const float* in, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * in[i];  // in[n/2..n) was never written; initcheck-expect: read
}

int main() {
    const int n = 256;
    float h[n], *in, *out;
    for (int i = 0; i < n; i++) h[i] = 1.0f;
    cudaMalloc(&in, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaMemcpy(in, h, n / 2 * sizeof(float), cudaMemcpyHostToDevice);  // BUG on purpose: half of it
    scale_kernel<<<n / 64, 64>>>(in, out, n);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    int nans = 0;
    for (int i = 0; i < n; i++) nans += std::isnan(h[i]);
    printf("unwritten_read_kernel finished: %d of %d outputs are NaN\n", nans, n);
    cudaFree(in);
    cudaFree(out);
    return nans ? 1 : 0;
}
