// Streams and events: stream order, cross-stream dependencies through events,
// the legacy default stream, async copies with pinned and pageable memory.
// Portable; make test also runs it with CPUCUDA_STREAMS=deferred, where work
// on a stream runs only when something needs it, so every ordering these
// cases rely on must be expressed through the CUDA API.
#include <cuda_runtime.h>

#include <vector>

#include "test/test_util.h"

__global__ void fill_kernel(float* x, int n, float base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + (float)i;
}

__global__ void axpb_kernel(const float* x, float* y, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

static const int N = 5000, THREADS = 256, BLOCKS = (N + THREADS - 1) / THREADS;

static int count_wrong(const float* y, float a, float b, float base) {
    int bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != a * (base + (float)i) + b;
    return bad;
}

int main() {
    float *x, *y, *pinned;
    CUDA_OK(cudaMalloc(&x, N * sizeof(float)));
    CUDA_OK(cudaMalloc(&y, N * sizeof(float)));
    CUDA_OK(cudaMallocHost(&pinned, N * sizeof(float)));
    std::vector<float> host(N);
    cudaStream_t s1, s2;
    CUDA_OK(cudaStreamCreate(&s1));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t done, start, stop, never;
    CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    CUDA_OK(cudaEventCreate(&never));

    // 1. one stream: launches and an async copy into pinned memory run in order
    fill_kernel<<<BLOCKS, THREADS, 0, s1>>>(x, N, 1.0f);
    axpb_kernel<<<BLOCKS, THREADS, 0, s1>>>(x, y, N, 2.0f, 0.5f);
    CUDA_OK(cudaMemcpyAsync(pinned, y, N * sizeof(float), cudaMemcpyDeviceToHost, s1));
    CUDA_OK(cudaStreamSynchronize(s1));
    CHECK(count_wrong(pinned, 2.0f, 0.5f, 1.0f) == 0, "stream order: fill, axpb, async copy to pinned memory");

    // 2. two streams ordered by an event
    CUDA_OK(cudaEventRecord(start, s1));
    fill_kernel<<<BLOCKS, THREADS, 0, s1>>>(x, N, 7.0f);
    CUDA_OK(cudaEventRecord(done, s1));
    CUDA_OK(cudaStreamWaitEvent(s2, done, 0));
    axpb_kernel<<<BLOCKS, THREADS, 0, s2>>>(x, y, N, -1.0f, 3.0f);
    CUDA_OK(cudaMemcpyAsync(pinned, y, N * sizeof(float), cudaMemcpyDeviceToHost, s2));
    CUDA_OK(cudaEventRecord(stop, s2));
    CUDA_OK(cudaEventSynchronize(stop));
    CHECK(count_wrong(pinned, -1.0f, 3.0f, 7.0f) == 0, "cudaStreamWaitEvent orders a kernel on s2 after one on s1");
    float ms = -1;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 0.0f && cudaEventQuery(stop) == cudaSuccess, "elapsed time across streams (%.3f ms), query done", ms);

    // 3. the legacy default stream waits for blocking streams
    fill_kernel<<<BLOCKS, THREADS, 0, s1>>>(x, N, -4.0f);
    axpb_kernel<<<BLOCKS, THREADS>>>(x, y, N, 0.5f, 0.0f);  // stream 0
    CUDA_OK(cudaMemcpy(host.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_wrong(host.data(), 0.5f, 0.0f, -4.0f) == 0, "a stream-0 kernel runs after earlier work on s1");

    // 4. a wait on an event that was never recorded does not block
    CUDA_OK(cudaStreamWaitEvent(s2, never, 0));
    fill_kernel<<<BLOCKS, THREADS, 0, s2>>>(y, N, 2.0f);
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaMemcpy(host.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_wrong(host.data(), 1.0f, 0.0f, 2.0f) == 0, "waiting on a never-recorded event completes at once");

    // 5. an async copy from pageable memory has taken the data when it returns
    for (int i = 0; i < N; i++) host[i] = 10.0f + (float)i;
    CUDA_OK(cudaMemcpyAsync(x, host.data(), N * sizeof(float), cudaMemcpyHostToDevice, s1));
    for (int i = 0; i < N; i++) host[i] = -1.0f;  // reusing the buffer at once is allowed
    axpb_kernel<<<BLOCKS, THREADS, 0, s1>>>(x, y, N, 1.0f, 1.0f);
    CUDA_OK(cudaMemcpyAsync(host.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost, s1));  // pageable: returns done
    CHECK(count_wrong(host.data(), 1.0f, 1.0f, 10.0f) == 0, "pageable async copies complete before they return");

    // 6. destroying a stream lets its queued work finish
    cudaStream_t s3;
    CUDA_OK(cudaStreamCreate(&s3));
    fill_kernel<<<BLOCKS, THREADS, 0, s3>>>(x, N, 5.0f);
    CUDA_OK(cudaMemsetAsync(y, 0, N * sizeof(float), s3));
    axpb_kernel<<<BLOCKS, THREADS, 0, s3>>>(x, y, N, 3.0f, 0.0f);
    CUDA_OK(cudaStreamDestroy(s3));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(host.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_wrong(host.data(), 3.0f, 0.0f, 5.0f) == 0, "work queued on a destroyed stream completes");

    for (cudaEvent_t e : {done, start, stop, never}) cudaEventDestroy(e);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaFreeHost(pinned);
    cudaFree(x);
    cudaFree(y);
    return test_summary("test_streams");
}
