// Deliberately wrong: the last thread writes one element past the end of its
// buffer. test/run_tests.sh runs the sanitizer build of this program and
// expects AddressSanitizer to stop it with a heap-buffer-overflow report that
// points at the store below.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void write_past_end_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;  // BUG on purpose: should be i < n; asan-expect: write
}

int main() {
    const int n = 1000;
    float* d;
    cudaMalloc(&d, n * sizeof(float));
    write_past_end_kernel<<<(n + 255) / 256, 256>>>(d, n);
    cudaError_t e = cudaDeviceSynchronize();
    printf("oob_kernel finished: %s (no out-of-bounds access was detected)\n", cudaGetErrorString(e));
    cudaFree(d);
    return 0;
}
