// dev/bench_timing.h: the benchmarks' one timer (CUDA events on a stream; on
// the CPU runtime, the host time between the two events).
#pragma once
#include "llmc/kernels/cuda_common.h"

// ms per call of `iters` calls of f, on the stream, by cudaEvents.
template <class F>
static double time_ms(F f, int iters, cudaStream_t stream) {
    cudaEvent_t start, end;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&end));
    cudaCheck(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; i++) f();
    cudaCheck(cudaEventRecord(end, stream));
    cudaCheck(cudaEventSynchronize(end));
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, start, end));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(end));
    return ms / iters;
}
