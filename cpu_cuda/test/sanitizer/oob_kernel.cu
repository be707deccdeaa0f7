// Deliberately wrong: a kernel that accesses memory past the end of what it was
// given. test/run_tests.sh runs the sanitizer build of this program once per
// case and expects AddressSanitizer to stop it with a report that points at the
// marked line:
//   global (the default)  the last thread writes one element past the end of its
//                         global buffer: heap-buffer-overflow
//   smem                  a thread reads one element past the block's dynamic shared
//                         memory (the runtime poisons the rest of the block's
//                         shared memory arena): use-after-poison
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>

__global__ void write_past_end_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;  // BUG on purpose: should be i < n; asan-expect: global
}

__global__ void read_past_shared_kernel(float* out, int n) {
    extern __shared__ float s[];  // n floats
    int i = threadIdx.x;
    s[i] = (float)i;
    __syncthreads();
    out[i] = s[i + 1];  // BUG on purpose: s[n] for the last thread; asan-expect: smem
}

int main(int argc, char** argv) {
    const bool smem = argc > 1 && strcmp(argv[1], "smem") == 0;
    const int n = smem ? 64 : 1000;
    float* d;
    cudaMalloc(&d, n * sizeof(float));
    if (smem) read_past_shared_kernel<<<1, n, n * sizeof(float)>>>(d, n);
    else write_past_end_kernel<<<(n + 255) / 256, 256>>>(d, n);
    cudaError_t e = cudaDeviceSynchronize();
    printf("oob_kernel finished: %s (no out-of-bounds access was detected)\n", cudaGetErrorString(e));
    cudaFree(d);
    return 0;
}
