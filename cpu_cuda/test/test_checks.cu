// The CPU runtime's checking modes. On a GPU these kernels would hang or race
// silently, so the file only runs its cases on the CPU runtime (CPUCUDA); the
// GPU build compiles it and reports every case skipped.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "test/test_util.h"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif

// Block barrier that block 3's upper threads never reach (they return early).
__global__ void divergent_barrier_kernel(int* out) {
    if (blockIdx.x == 3 && threadIdx.x >= 40) return;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Half a warp leaves before a full-mask shuffle.
__global__ void divergent_shuffle_kernel(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x % 32 >= 16) return;
    v = __shfl_down_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// A lane calls a collective whose mask leaves itself out.
__global__ void bad_mask_kernel(int* out) {
    out[threadIdx.x] = __shfl_sync(threadIdx.x == 0 ? 0xfffffffeu : 0xffffffffu, (int)threadIdx.x, 0);
}

// Some lanes at a shuffle while the others wait at __syncthreads.
__global__ void shuffle_vs_barrier_kernel(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x < 8) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncthreads();
    out[threadIdx.x] = v;
}

namespace cg = cooperative_groups;

// Lane 0 reduces over the warp while the other lanes wait at __syncwarp.
__global__ void reduce_vs_syncwarp_kernel(int* out) {
    const cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int v = threadIdx.x;
    if (threadIdx.x == 0) v = cg::reduce(warp, v, cg::plus<int>());
    else __syncwarp();
    out[threadIdx.x] = v;
}

// One tile, two reductions: half the lanes sum while the others take the maximum.
__global__ void two_reductions_kernel(int* out) {
    const cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    const int v = threadIdx.x;
    out[threadIdx.x] = threadIdx.x < 16 ? cg::reduce(warp, v, cg::plus<int>())
                                        : cg::reduce(warp, v, cg::greater<int>());
}

// A tile of 32 over a warp of 16 threads (blockDim 48).
__global__ void reduce_partial_warp_kernel(int* out) {
    const cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[threadIdx.x] = cg::reduce(warp, (int)threadIdx.x, cg::plus<int>());
}

// An operator that meets the warp: refused (the operator runs in the scheduler).
struct MeetingPlus {
    __device__ int operator()(int a, int b) const { return a + b + __shfl_sync(0xffffffffu, 0, 0); }
};
__global__ void reduce_operator_meets_kernel(int* out) {
    const cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[threadIdx.x] = cg::reduce(warp, (int)threadIdx.x, MeetingPlus());
}

// A kernel that meets through a function pointer read from memory: nothing in
// its text names a meeting, so cudapp.py judges that its threads never meet
// and it runs as a loop, where the meeting is refused.
__device__ void syncing_fn() { __syncwarp(); }
typedef void (*DeviceFn)();
__global__ void meets_through_pointer_kernel(DeviceFn* fns) { fns[0](); }

// Deliberately order-dependent: a tree reduction with its barriers left out,
// so a thread may read a partial sum before or after its neighbour wrote it.
__global__ void racy_sum_kernel(const int* in, int* out) {
    __shared__ int partial[256];
    partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2)
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// The same reduction, correct.
__global__ void synced_sum_kernel(const int* in, int* out) {
    __shared__ int partial[256];
    partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

__global__ void write_ramp_kernel(float* x, int n, float base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + (float)i;
}

__global__ void copy_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

#ifdef CPUCUDA
static bool contains(const char* s, const char* part) { return strstr(s, part) != nullptr; }

// Launches, synchronises, and returns the error (then clears it, as a caller
// that handles the error would).
template <class Launch>
static cudaError_t run_failing(Launch launch) {
    launch();
    cudaError_t e = cudaDeviceSynchronize();
    cudaGetLastError();
    return e;
}

static void test_divergence() {
    int* d;
    CUDA_OK(cudaMalloc(&d, 8 * 64 * sizeof(int)));
    CUDA_OK(cudaMemset(d, 0, 8 * 64 * sizeof(int)));
    cudaError_t e = run_failing([&] { divergent_barrier_kernel<<<8, 64>>>(d); });
    const char* msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure, "divergent __syncthreads fails the launch (%s), no hang", cudaGetErrorName(e));
    CHECK(contains(msg, "divergent_barrier_kernel") && contains(msg, "block (3,0,0)") &&
              contains(msg, "divergent __syncthreads"),
          "the report names the kernel and block: \"%s\"", msg);

    e = run_failing([&] { divergent_shuffle_kernel<<<1, 64>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "divergent_shuffle_kernel") && contains(msg, "has exited"),
          "full-mask shuffle with exited lanes is reported: \"%s\"", msg);

    e = run_failing([&] { bad_mask_kernel<<<1, 32>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "excludes itself"),
          "a mask without the calling lane is reported: \"%s\"", msg);

    e = run_failing([&] { shuffle_vs_barrier_kernel<<<1, 32>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "waits at __syncthreads"),
          "shuffle against a barrier is reported: \"%s\"", msg);

    e = run_failing([&] { reduce_vs_syncwarp_kernel<<<1, 32>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "cg::reduce") && contains(msg, "__syncwarp"),
          "cg::reduce against __syncwarp is reported: \"%s\"", msg);

    e = run_failing([&] { two_reductions_kernel<<<1, 32>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "different cg::reduce calls"),
          "one tile at two different cg::reduce calls is reported: \"%s\"", msg);

    e = run_failing([&] { reduce_partial_warp_kernel<<<1, 48>>>(d); });
    msg = cpucuda::last_kernel_failure();
    CHECK(e == cudaErrorLaunchFailure && contains(msg, "lanes the warp does not have"),
          "cg::reduce over a tile of 32 in a warp of 16 threads is reported: \"%s\"", msg);

    synced_sum_kernel<<<1, 256>>>(d, d);  // the runtime goes on working after a failure
    CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess,
          "launches after a reported failure succeed");
    cudaFree(d);
}

// Runs `kernel` under each schedule and says whether all results agree.
template <class Kernel>
static bool same_under_all_schedules(Kernel kernel, const char* name) {
    const int blocks = 4, threads = 256, n = blocks * threads;
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (i * 37) % 101;
    int *d_in, *d_out;
    CUDA_OK(cudaMalloc(&d_in, n * sizeof(int)));
    CUDA_OK(cudaMalloc(&d_out, blocks * sizeof(int)));
    CUDA_OK(cudaMemcpy(d_in, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    const cpucuda::Schedule saved = cpucuda::get_schedule();
    const struct {
        cpucuda::Schedule s;
        uint64_t seed;
        const char* label;
    } modes[] = {{cpucuda::Schedule::Forward, 0, "forward"},
                 {cpucuda::Schedule::Reverse, 0, "reverse"},
                 {cpucuda::Schedule::Random, 1, "random:1"},
                 {cpucuda::Schedule::Random, 2, "random:2"}};
    std::vector<int> first;
    bool same = true;
    for (const auto& m : modes) {
        cpucuda::set_schedule(m.s, m.seed);
        kernel<<<blocks, threads>>>(d_in, d_out);
        CUDA_OK(cudaGetLastError());
        std::vector<int> got(blocks);
        CUDA_OK(cudaMemcpy(got.data(), d_out, blocks * sizeof(int), cudaMemcpyDeviceToHost));
        printf("  %s under %-8s: block sums %d %d %d %d\n", name, m.label, got[0], got[1], got[2], got[3]);
        if (first.empty()) first = got;
        else same = same && got == first;
    }
    cpucuda::set_schedule(saved);
    cudaFree(d_in);
    cudaFree(d_out);
    return same;
}

static void test_race_mode() {
    CHECK(!same_under_all_schedules(racy_sum_kernel, "racy_sum_kernel"),
          "race mode flags the reduction without barriers (results differ between schedules)");
    CHECK(same_under_all_schedules(synced_sum_kernel, "synced_sum_kernel"),
          "the correct reduction gives the same result under every schedule");
}

static void test_memory_counters() {
    cpucuda::MemoryStats before = cpucuda::memory_stats();
    void *a, *b;
    CUDA_OK(cudaMalloc(&a, 1000));
    CUDA_OK(cudaMalloc(&b, 3000));
    cpucuda::MemoryStats mid = cpucuda::memory_stats();
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
    cpucuda::MemoryStats after = cpucuda::memory_stats();
    CHECK(mid.in_use == before.in_use + 4000 && mid.allocations == before.allocations + 2 &&
              after.in_use == before.in_use && mid.peak >= mid.in_use,
          "allocation counters: in use %zu -> %zu -> %zu, peak %zu", before.in_use, mid.in_use, after.in_use, mid.peak);
    int host = 0;
    cudaError_t e = cudaMemcpy(&host, &host, sizeof host, cudaMemcpyHostToDevice);
    cudaGetLastError();
    CHECK(e == cudaErrorInvalidValue, "a host pointer passed as the device side of a copy is refused (%s)",
          cudaGetErrorName(e));
    CHECK(cudaFree(&host) == cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return is refused");
    cudaGetLastError();
}

// Producer on s1, consumer on s2, with or without the event between them.
// Returns how many consumer results are wrong.
enum class Consumer { Kernel, NcclAllReduce };
static int producer_consumer(bool with_wait, Consumer consumer) {
    const int n = 4096;
    float *x, *y;
    CUDA_OK(cudaMalloc(&x, n * sizeof(float)));
    CUDA_OK(cudaMalloc(&y, n * sizeof(float)));
    CUDA_OK(cudaMemset(x, 0, n * sizeof(float)));
    CUDA_OK(cudaMemset(y, 0, n * sizeof(float)));
    cudaStream_t s1, s2;
    cudaEvent_t produced;
    CUDA_OK(cudaStreamCreate(&s1));
    CUDA_OK(cudaStreamCreate(&s2));
    CUDA_OK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    ncclComm_t comm = nullptr;
    ncclUniqueId id;
    if (consumer == Consumer::NcclAllReduce &&
        (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)) {
        printf("FAIL cannot make a one-rank NCCL communicator\n");
        exit(1);
    }
    write_ramp_kernel<<<(n + 255) / 256, 256, 0, s1>>>(x, n, 1.0f);
    CUDA_OK(cudaEventRecord(produced, s1));
    if (with_wait) CUDA_OK(cudaStreamWaitEvent(s2, produced, 0));
    if (consumer == Consumer::Kernel) copy_kernel<<<(n + 255) / 256, 256, 0, s2>>>(x, y, n);
    else if (ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, s2) != ncclSuccess) printf("FAIL ncclAllReduce\n");
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h(n);
    CUDA_OK(cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 1.0f + (float)i;
    if (comm) ncclCommDestroy(comm);
    cudaEventDestroy(produced);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaFree(x);
    cudaFree(y);
    return bad;
}

static void test_deferred_streams() {
    const cpucuda::StreamMode saved = cpucuda::get_stream_mode();
    cpucuda::set_stream_mode(cpucuda::StreamMode::Sync);
    const int sync_missing = producer_consumer(false, Consumer::Kernel);
    cpucuda::set_stream_mode(cpucuda::StreamMode::Deferred);
    const int kernel_missing = producer_consumer(false, Consumer::Kernel);
    const int kernel_ok = producer_consumer(true, Consumer::Kernel);
    const int nccl_missing = producer_consumer(false, Consumer::NcclAllReduce);
    const int nccl_ok = producer_consumer(true, Consumer::NcclAllReduce);
    cpucuda::set_stream_mode(saved);
    CHECK(sync_missing == 0, "sync streams hide a missing cudaStreamWaitEvent (%d wrong)", sync_missing);
    CHECK(kernel_missing > 0, "deferred streams expose it: the kernel on s2 reads unwritten data (%d wrong)",
          kernel_missing);
    CHECK(kernel_ok == 0, "with the wait, the kernel on s2 sees the data (%d wrong)", kernel_ok);
    CHECK(nccl_missing > 0, "deferred streams expose an all-reduce issued without waiting (%d wrong)", nccl_missing);
    CHECK(nccl_ok == 0, "with the wait, the all-reduce sees the data (%d wrong)", nccl_ok);
}

// The virtual device follows the environment (run_tests.sh runs this program a
// second time with CPUCUDA_SM_COUNT, CPUCUDA_DEVICE_MEMORY_MB and
// CPUCUDA_SMEM_OPTIN_KB set).
static void test_virtual_device() {
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    const char* sms = getenv("CPUCUDA_SM_COUNT");
    const char* mem = getenv("CPUCUDA_DEVICE_MEMORY_MB");
    const char* optin = getenv("CPUCUDA_SMEM_OPTIN_KB");
    int per_sm[4];
    CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[0], synced_sum_kernel, 256, 0));
    CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[1], synced_sum_kernel, 1024, 0));
    CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[2], synced_sum_kernel, 128, 100 * 1024));
    CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[3], synced_sum_kernel, 32, 0));
    CHECK(
        per_sm[0] == 4 && per_sm[1] == 2 && per_sm[2] == 2 && per_sm[3] == 4,
        "occupancy: min(4 (CPUCUDA_BLOCKS_PER_SM), 2048 threads, 228 KiB of shared memory) blocks per SM: %d %d %d %d",
        per_sm[0], per_sm[1], per_sm[2], per_sm[3]);
    if (!sms || !mem || !optin) {
        CHECK(p.multiProcessorCount == 132 && p.totalGlobalMem == (16384ull << 20) &&
                  p.sharedMemPerBlock == 48 * 1024 && p.sharedMemPerBlockOptin == 227 * 1024,
              "default virtual device: 132 SMs, 16 GiB, 48/227 KiB shared memory");
        return;
    }
    CHECK(p.multiProcessorCount == atoi(sms) && p.totalGlobalMem == (size_t)atol(mem) << 20 &&
              p.sharedMemPerBlockOptin == (size_t)atol(optin) * 1024,
          "virtual device from the environment: %d SMs, %zu MiB, opt-in %zu KiB", p.multiProcessorCount,
          p.totalGlobalMem >> 20, p.sharedMemPerBlockOptin >> 10);
    // allocate until the virtual memory runs out: the last request must fail cleanly
    std::vector<void*> blocks;
    void* q = nullptr;
    cudaError_t e = cudaSuccess;
    while (blocks.size() < 100000 && (e = cudaMalloc(&q, 16u << 20)) == cudaSuccess) blocks.push_back(q);
    cudaGetLastError();
    size_t used = blocks.size() * (16u << 20);
    CHECK(e == cudaErrorMemoryAllocation && used <= p.totalGlobalMem && used + (16u << 20) > p.totalGlobalMem,
          "out of memory after %zu MiB of %zu MiB: %s", used >> 20, p.totalGlobalMem >> 20, cudaGetErrorName(e));
    for (void* b : blocks) cudaFree(b);
}
// A meeting where threads cannot meet stops the program (device_trap), so each
// case runs in a child: this program again, with the case's flag (under
// timeout: were the guard gone, the child could hang in the scheduler).
static std::string run_child(const char* self, const char* flag, int* status) {
    const std::string command = "timeout 300 " + std::string(self) + " " + flag + " 2>&1";
    FILE* child = popen(command.c_str(), "r");
    std::string output;
    char buf[512];
    while (child && fgets(buf, sizeof buf, child)) output += buf;
    *status = child ? pclose(child) : -1;
    return output;
}
static void test_refused_meetings(const char* self) {
    int status;
    std::string out = run_child(self, "--reduce-operator-meets", &status);
    CHECK(status != 0 && contains(out.c_str(), "__shfl_sync reached in the operator of a cg::reduce") &&
              contains(out.c_str(), "reduce_operator_meets_kernel"),
          "a warp operation inside a cg::reduce operator stops the program, naming it (status %d): \"%s\"", status,
          out.c_str());
    out = run_child(self, "--loop-meets", &status);
    CHECK(status != 0 && contains(out.c_str(), "__syncwarp reached in a kernel that cudapp.py judged") &&
              contains(out.c_str(), "meets_through_pointer_kernel"),
          "a looped kernel that meets after all stops the program, naming it (status %d): \"%s\"", status, out.c_str());
}

#endif

int main(int argc, char** argv) {
#ifdef CPUCUDA
    if (argc > 1 && !strcmp(argv[1], "--reduce-operator-meets")) {
        int* d;
        CUDA_OK(cudaMalloc(&d, 32 * sizeof(int)));
        reduce_operator_meets_kernel<<<1, 32>>>(d);
        cudaDeviceSynchronize();
        return 0;  // not reached: the runtime stops the program
    }
    if (argc > 1 && !strcmp(argv[1], "--loop-meets")) {
        DeviceFn* fns;
        CUDA_OK(cudaMalloc(&fns, sizeof(DeviceFn)));
        const DeviceFn fn = &syncing_fn;  // the CPU runtime's device code is host code
        CUDA_OK(cudaMemcpy(fns, &fn, sizeof fn, cudaMemcpyHostToDevice));
        meets_through_pointer_kernel<<<1, 32>>>(fns);
        cudaDeviceSynchronize();
        return 0;  // not reached
    }
    TEST_CASE(test_divergence());
    TEST_CASE(test_refused_meetings(argv[0]));
    TEST_CASE(test_race_mode());
    TEST_CASE(test_memory_counters());
    TEST_CASE(test_virtual_device());
    TEST_CASE(test_deferred_streams());
#else
    printf("SKIP test_checks: the checking modes belong to the CPU runtime\n");
#endif
    return test_summary("test_checks");
}
