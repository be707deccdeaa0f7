// Deliberately wrong: a warp-synchronous shared-memory reduction without
// __syncwarp, which assumes the 32 lanes run in lockstep (they do not since
// Volta). The CPU runtime runs the lanes one after another between
// synchronisation points, in an order the schedule sets, so the sum comes out
// wrong in every schedule; the racecheck build reports the kernel and the
// line. Exits 1 when the sum is wrong.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void warp_sum_kernel(const float* in, float* out) {
    __shared__ volatile float s[48];
    const int t = threadIdx.x;
    s[t] = in[t];
    if (t < 16) s[32 + t] = 0.0f;
    // BUG on purpose: no __syncwarp() between the steps
    for (int offset = 16; offset > 0; offset /= 2) s[t] += s[t + offset];  // racecheck-expect: race
    if (t == 0) *out = s[0];
}

int main() {
    float h[32], *in, *out, sum;
    for (int i = 0; i < 32; i++) h[i] = (float)(i + 1);
    cudaMalloc(&in, sizeof h);
    cudaMalloc(&out, sizeof(float));
    cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice);
    warp_sum_kernel<<<1, 32>>>(in, out);
    cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost);
    printf("warp_sync_kernel finished: sum %g, expected 528\n", sum);
    cudaFree(in);
    cudaFree(out);
    return sum == 528.0f ? 0 : 1;
}
