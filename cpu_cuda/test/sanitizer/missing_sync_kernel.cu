// Deliberately wrong: each thread writes its element of a shared tile and
// reads another thread's element with no __syncthreads in between.
// test/run_tests.sh (racecheck) expects the racecheck build to report the
// kernel and both lines.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void reverse_tile_kernel(const float* in, float* out) {
    __shared__ float tile[256];
    const int t = threadIdx.x, base = blockIdx.x * 256;
    tile[t] = in[base + t];  // racecheck-expect: write
    out[base + t] = tile[255 - t];  // BUG on purpose: needs __syncthreads() before this read; racecheck-expect: read
}

int main() {
    const int n = 512;
    float h[n], *in, *out;
    for (int i = 0; i < n; i++) h[i] = (float)i;
    cudaMalloc(&in, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice);
    reverse_tile_kernel<<<n / 256, 256>>>(in, out);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    printf("missing_sync_kernel finished: out[0] = %g (255 if the threads had been synchronised)\n", h[0]);
    cudaFree(in);
    cudaFree(out);
    return 0;
}
