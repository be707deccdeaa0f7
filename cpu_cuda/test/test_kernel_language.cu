// Kernel-language tests: each case is a CUDA kernel whose result is checked
// against plain C++ on the host. Portable: the same file runs on the CPU
// runtime (make test) and on a GPU (build/gpu/..., test/gpu_check.sh).
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "test/test_device.h"

namespace cg = cooperative_groups;

// --- block reduction: tree in static shared memory, one sum per block ----------------
__global__ void block_sum_kernel(const int* in, int* out, int n) {
    __shared__ int partial[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

static void test_block_reduction() {
    const int n = 1000 * 256 - 77, blocks = 1000;  // many blocks, a partial last one
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (i * 7919) % 1001 - 500;
    int* d_in = to_device(h);
    int* d_out;
    CUDA_OK(cudaMalloc(&d_out, blocks * sizeof(int)));
    block_sum_kernel<<<blocks, 256>>>(d_in, d_out, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> got = to_host(d_out, blocks);
    int bad = 0;
    for (int b = 0; b < blocks; b++) {
        int want = 0;
        for (int i = b * 256; i < std::min(n, (b + 1) * 256); i++) want += h[i];
        bad += got[b] != want;
    }
    CHECK(bad == 0, "block reduction over %d blocks of 256 threads (%d wrong sums)", blocks, bad);
    cudaFree(d_in);
    cudaFree(d_out);
}

// --- inclusive scan in shared memory (Hillis-Steele, double buffered) ---------------
__global__ void block_scan_kernel(const float* in, float* out) {
    __shared__ float buf[2][1024];
    int t = threadIdx.x, cur = 0;
    buf[cur][t] = in[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int offset = 1; offset < blockDim.x; offset *= 2) {
        float v = buf[cur][t];
        if (t >= offset) v += buf[cur][t - offset];
        buf[1 - cur][t] = v;
        cur = 1 - cur;
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + t] = buf[cur][t];
}

static void test_block_scan() {
    const int threads = 1024, blocks = 3;
    std::vector<float> h(threads * blocks);
    for (size_t i = 0; i < h.size(); i++) h[i] = (float)((i * 37) % 11);  // small integers: exact sums
    float* d_in = to_device(h);
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, h.size() * sizeof(float)));
    block_scan_kernel<<<blocks, threads>>>(d_in, d_out);
    CUDA_OK(cudaGetLastError());
    std::vector<float> got = to_host(d_out, h.size());
    int bad = 0;
    for (int b = 0; b < blocks; b++) {
        float acc = 0;
        for (int t = 0; t < threads; t++) {
            acc += h[b * threads + t];
            bad += got[b * threads + t] != acc;
        }
    }
    CHECK(bad == 0, "shared-memory inclusive scan, 3 blocks x 1024 threads (%d wrong)", bad);
    cudaFree(d_in);
    cudaFree(d_out);
}

// --- every shuffle kind and the votes ---------------------------------------------------
// out[k * 64 + t] holds result k of thread t (two warps of 32).
__global__ void shuffle_kernel(int* out) {
    const int t = threadIdx.x, lane = t % 32;
    const int v = 1000 * (t / 32) + lane;  // distinct per thread
    const unsigned full = 0xffffffffu;
    int k = 0;
    out[(k++) * 64 + t] = __shfl_sync(full, v, 5);                 // broadcast lane 5
    out[(k++) * 64 + t] = __shfl_sync(full, v, (lane * 7) % 32);   // arbitrary gather
    out[(k++) * 64 + t] = __shfl_sync(full, v, lane + 3, 8);       // within groups of 8
    out[(k++) * 64 + t] = __shfl_up_sync(full, v, 3);
    out[(k++) * 64 + t] = __shfl_up_sync(full, v, 2, 16);
    out[(k++) * 64 + t] = __shfl_down_sync(full, v, 4);
    out[(k++) * 64 + t] = __shfl_down_sync(full, v, 1, 8);
    out[(k++) * 64 + t] = __shfl_xor_sync(full, v, 1);
    out[(k++) * 64 + t] = __shfl_xor_sync(full, v, 16);
    out[(k++) * 64 + t] = __shfl_xor_sync(full, v, 4, 4);          // later segment: own value
    out[(k++) * 64 + t] = (int)__ballot_sync(full, lane % 3 == 0);
    out[(k++) * 64 + t] = __any_sync(full, lane == 17 && t < 32);
    out[(k++) * 64 + t] = __all_sync(full, lane < 32);
    out[(k++) * 64 + t] = __all_sync(full, lane != 9);
    float f = __shfl_down_sync(full, 0.5f * v, 2);  // a float payload
    out[(k++) * 64 + t] = (int)(2.0f * f);
    double d = __shfl_xor_sync(full, 0.25 * v, 2);  // an 8-byte payload
    out[(k++) * 64 + t] = (int)(4.0 * d);
    if (lane < 16) {  // half the warp, with a mask naming exactly those lanes
        out[(k++) * 64 + t] = __shfl_down_sync(0x0000ffffu, v, 1, 16);
    } else {
        out[(k++) * 64 + t] = -1;
    }
    __syncwarp();
}

static void test_shuffles() {
    const int K = 17;
    int* d_out;
    CUDA_OK(cudaMalloc(&d_out, K * 64 * sizeof(int)));
    shuffle_kernel<<<1, 64>>>(d_out);
    CUDA_OK(cudaGetLastError());
    std::vector<int> got = to_host(d_out, K * 64);
    const char* names[K] = {"shfl broadcast",
                            "shfl gather",
                            "shfl width 8",
                            "shfl_up 3",
                            "shfl_up width 16",
                            "shfl_down 4",
                            "shfl_down width 8",
                            "shfl_xor 1",
                            "shfl_xor 16",
                            "shfl_xor width 4 (other segment)",
                            "ballot",
                            "any",
                            "all (true)",
                            "all (false)",
                            "shfl float payload",
                            "shfl double payload",
                            "shfl_down on a 16-lane mask"};
    for (int k = 0; k < K; k++) {
        int bad = 0;
        for (int t = 0; t < 64; t++) {
            const int lane = t % 32, base = 1000 * (t / 32);
            auto v = [&](int l) { return base + l; };
            int want = 0;
            switch (k) {
                case 0: want = v(5); break;
                case 1: want = v((lane * 7) % 32); break;
                case 2: want = v((lane & ~7) + ((lane + 3) & 7)); break;
                case 3: want = lane >= 3 ? v(lane - 3) : v(lane); break;
                case 4: want = (lane % 16) >= 2 ? v(lane - 2) : v(lane); break;
                case 5: want = lane + 4 < 32 ? v(lane + 4) : v(lane); break;
                case 6: want = (lane % 8) + 1 < 8 ? v(lane + 1) : v(lane); break;
                case 7: want = v(lane ^ 1); break;
                case 8: want = v(lane ^ 16); break;
                case 9: want = v(lane ^ 4) >= base + (lane & ~3) + 4 ? v(lane) : v(lane ^ 4); break;
                case 10: {
                    unsigned b = 0;
                    for (int l = 0; l < 32; l++)
                        if (l % 3 == 0) b |= 1u << l;
                    want = (int)b;
                    break;
                }
                case 11: want = t < 32 ? 1 : 0; break;
                case 12: want = 1; break;
                case 13: want = 0; break;
                case 14: want = lane + 2 < 32 ? v(lane + 2) : v(lane); break;
                case 15: want = v(lane ^ 2); break;
                case 16: want = lane < 16 ? (lane + 1 < 16 ? v(lane + 1) : v(lane)) : -1; break;
            }
            bad += got[k * 64 + t] != want;
        }
        CHECK(bad == 0, "warp %s (%d of 64 threads wrong)", names[k], bad);
    }
    cudaFree(d_out);
}

// --- cooperative groups: cg::reduce over tiles, block sync -------------------------------
__global__ void cg_reduce_kernel(const float* in, float* sums32, float* max32, float* sums16, float* block_max) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    cg::thread_block_tile<16> half = cg::tiled_partition<16>(block);
    __shared__ float warp_max[32];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float x = in[i];
    float s = cg::reduce(warp, x, cg::plus<float>());
    float m = cg::reduce(warp, x, cg::greater<float>());
    float h = cg::reduce(half, x, cg::plus<float>());
    const int w = blockIdx.x * (blockDim.x / 32) + warp.meta_group_rank();
    if (warp.thread_rank() == 0) {
        sums32[w] = s;
        max32[w] = m;
        warp_max[warp.meta_group_rank()] = m;
    }
    if (half.thread_rank() == 0) sums16[blockIdx.x * (blockDim.x / 16) + half.meta_group_rank()] = h;
    block.sync();
    if (block.thread_rank() == 0) {
        float bm = warp_max[0];
        for (unsigned k = 1; k < warp.meta_group_size(); k++) bm = fmaxf(bm, warp_max[k]);
        block_max[blockIdx.x] = bm;
    }
}

static void test_cg_reduce() {
    const int threads = 256, blocks = 8, n = threads * blocks;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = (float)((i * 131) % 257) - 128.0f;
    float* d_in = to_device(h);
    float *d_s32, *d_m32, *d_s16, *d_bm;
    CUDA_OK(cudaMalloc(&d_s32, n / 32 * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_m32, n / 32 * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_s16, n / 16 * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_bm, blocks * sizeof(float)));
    cg_reduce_kernel<<<blocks, threads>>>(d_in, d_s32, d_m32, d_s16, d_bm);
    CUDA_OK(cudaGetLastError());
    auto s32 = to_host(d_s32, n / 32), m32 = to_host(d_m32, n / 32), s16 = to_host(d_s16, n / 16),
         bm = to_host(d_bm, blocks);
    int bad_s = 0, bad_m = 0, bad_h = 0, bad_b = 0;
    for (int w = 0; w < n / 32; w++) {
        float s = 0, m = -1e30f;
        for (int l = 0; l < 32; l++) s += h[w * 32 + l], m = std::max(m, h[w * 32 + l]);
        bad_s += s32[w] != s;
        bad_m += m32[w] != m;
    }
    for (int g = 0; g < n / 16; g++) {
        float s = 0;
        for (int l = 0; l < 16; l++) s += h[g * 16 + l];
        bad_h += s16[g] != s;
    }
    for (int b = 0; b < blocks; b++) {
        float m = -1e30f;
        for (int i = 0; i < threads; i++) m = std::max(m, h[b * threads + i]);
        bad_b += bm[b] != m;
    }
    CHECK(bad_s == 0, "cg::reduce plus over tiled_partition<32> (%d wrong)", bad_s);
    CHECK(bad_m == 0, "cg::reduce greater over tiled_partition<32> (%d wrong)", bad_m);
    CHECK(bad_h == 0, "cg::reduce plus over tiled_partition<16> (%d wrong)", bad_h);
    CHECK(bad_b == 0, "thread_block::sync + meta_group ranks: block max (%d wrong)", bad_b);
    cudaFree(d_in);
    cudaFree(d_s32);
    cudaFree(d_m32);
    cudaFree(d_s16);
    cudaFree(d_bm);
}

// --- cg::reduce is CUDA's butterfly, lane by lane ----------------------------------------
// Lane l of a tile of N gets value = op(value, tile.shfl_xor(value, offset)) for
// offset = N/2, ..., 1: the kernel computes it both ways, with cg::reduce and
// with explicit shuffles. The operator a + 0.75 b does not commute, so every
// lane's own result shows; the values span many magnitudes, so the order of
// the additions shows in the bits.
struct WeightedSum {
    float w;
    __device__ float operator()(float a, float b) const { return a + w * b; }
};
struct PairSum {
    __device__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};
struct LaneWeightedSum {  // each lane weighs its partner by its own thread index
    __device__ float operator()(float a, float b) const { return a + (float)(1 + threadIdx.x % 3) * b; }
};
template <unsigned N, class Op>
__device__ float shuffle_butterfly(float v, Op op) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned mask = N == 32 ? 0xffffffffu : ((1u << N) - 1u) << (lane / N * N);
    for (unsigned offset = N / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(mask, v, offset, N));
    return v;
}
// out: 8 arrays of n: reduce(plus), shuffles(plus), reduce(weighted), shuffles(weighted), reduce over
// (x, -2x) pairs: .x, .y, reduce(lane-weighted), shuffles(lane-weighted)
template <unsigned N>
__global__ void cg_reduce_order_kernel(const float* in, float* out) {
    const int n = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    const cg::thread_block_tile<N> tile = cg::tiled_partition<N>(cg::this_thread_block());
    const float x = in[i];
    const WeightedSum weighted{0.75f};
    out[i] = cg::reduce(tile, x, cg::plus<float>());
    out[n + i] = shuffle_butterfly<N>(x, cg::plus<float>());
    out[2 * n + i] = cg::reduce(tile, x, weighted);
    out[3 * n + i] = shuffle_butterfly<N>(x, weighted);
    const float2 pair = cg::reduce(tile, make_float2(x, -2.0f * x), PairSum());
    out[4 * n + i] = pair.x;
    out[5 * n + i] = pair.y;
    out[6 * n + i] = cg::reduce(tile, x, LaneWeightedSum());
    out[7 * n + i] = shuffle_butterfly<N>(x, LaneWeightedSum());
}

// The butterfly of tile values v (N of them) on the host: every lane's result.
template <class Op>
static std::vector<float> host_butterfly(std::vector<float> v, Op op) {
    const unsigned N = (unsigned)v.size();
    for (unsigned offset = N / 2; offset > 0; offset /= 2) {
        std::vector<float> next(N);
        for (unsigned l = 0; l < N; l++) next[l] = op(v[l], v[l ^ offset]);
        v = next;
    }
    return v;
}

template <unsigned N>
static void check_cg_reduce_order(const float* d_in, const std::vector<float>& h, float* d_out) {
    const int n = (int)h.size();
    cg_reduce_order_kernel<N><<<n / 128, 128>>>(d_in, d_out);
    CUDA_OK(cudaGetLastError());
    const std::vector<float> got = to_host(d_out, 8 * (size_t)n);
    int bad_plus = 0, bad_weighted = 0, bad_lane_op = 0, bad_host = 0, bad_pair = 0, sequential_differs = 0,
        lanes_differ = 0;
    for (int t = 0; t < n / (int)N; t++) {
        const std::vector<float> x(h.begin() + t * N, h.begin() + (t + 1) * N);
        std::vector<float> minus2x(N);
        for (unsigned l = 0; l < N; l++) minus2x[l] = -2.0f * x[l];
        const auto plus = [](float a, float b) { return a + b; };
        const std::vector<float> want = host_butterfly(x, plus), want_y = host_butterfly(minus2x, plus);
        float sequential = 0.0f;
        for (float v : x) sequential += v;
        sequential_differs += bits_of(sequential) != bits_of(want[0]);
        for (unsigned l = 0; l < N; l++) {
            const int i = t * N + l;
            bad_plus += bits_of(got[i]) != bits_of(got[n + i]);
            bad_weighted += bits_of(got[2 * n + i]) != bits_of(got[3 * n + i]);
            bad_lane_op += bits_of(got[6 * n + i]) != bits_of(got[7 * n + i]);
            bad_host += bits_of(got[i]) != bits_of(want[l]);
            bad_pair += bits_of(got[4 * n + i]) != bits_of(want[l]) || bits_of(got[5 * n + i]) != bits_of(want_y[l]);
            lanes_differ += bits_of(got[2 * n + i]) != bits_of(got[2 * n + t * N]);
        }
    }
    CHECK(bad_plus == 0 && bad_weighted == 0,
          "cg::reduce over tiles of %u: bitwise the shuffle butterfly (%d plus, %d non-commuting op lanes differ)", N,
          bad_plus, bad_weighted);
    CHECK(bad_lane_op == 0,
          "cg::reduce over tiles of %u: an operator reading threadIdx sees its own lane's (%d lanes differ)", N,
          bad_lane_op);
    CHECK(bad_host == 0 && bad_pair == 0,
          "cg::reduce over tiles of %u: the butterfly's order of additions, floats and float2 (%d, %d lanes differ)", N,
          bad_host, bad_pair);
    // the data can tell the orders apart: a left-to-right sum, or one result
    // copied to every lane, would fail the checks above
    CHECK(N < 4 || (sequential_differs > 0 && lanes_differ > 0),
          "tiles of %u: the test data tell the butterfly from a sequential sum (%d tiles) and lane from lane (%d)", N,
          sequential_differs, lanes_differ);
}

// Tiles of one warp meet at different reductions at once: the odd tiles of 4
// take their maximum first, then every tile sums.
__global__ void cg_reduce_staggered_kernel(const float* in, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const cg::thread_block_tile<4> tile = cg::tiled_partition<4>(cg::this_thread_block());
    float x = in[i];
    if (tile.meta_group_rank() % 2) x = cg::reduce(tile, x, cg::greater<float>());
    out[i] = cg::reduce(tile, x, cg::plus<float>());
}

static void test_cg_reduce_order() {
    const int n = 1024;
    std::vector<float> h(n);
    uint32_t s = 12345;
    for (int i = 0; i < n; i++) {  // mantissas in full, exponents over 2^-12 .. 2^12, both signs
        s = s * 1664525u + 1013904223u;
        h[i] = ldexpf(1.0f + (float)(s >> 9) / (float)(1u << 23), (int)(s % 25) - 12) * ((s >> 5) & 1 ? -1.0f : 1.0f);
    }
    float* d_in = to_device(h);
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, 8 * (size_t)n * sizeof(float)));
    check_cg_reduce_order<32>(d_in, h, d_out);
    check_cg_reduce_order<16>(d_in, h, d_out);
    check_cg_reduce_order<4>(d_in, h, d_out);
    check_cg_reduce_order<2>(d_in, h, d_out);
    check_cg_reduce_order<1>(d_in, h, d_out);

    cg_reduce_staggered_kernel<<<n / 64, 64>>>(d_in, d_out);
    CUDA_OK(cudaGetLastError());
    const std::vector<float> got = to_host(d_out, n);
    int bad = 0;
    for (int t = 0; t < n / 4; t++) {
        std::vector<float> x(h.begin() + t * 4, h.begin() + t * 4 + 4);
        if (t % 2) x.assign(4, std::max(std::max(x[0], x[1]), std::max(x[2], x[3])));
        const std::vector<float> want = host_butterfly(x, [](float a, float b) { return a + b; });
        for (int l = 0; l < 4; l++) bad += bits_of(got[t * 4 + l]) != bits_of(want[l]);
    }
    CHECK(bad == 0, "tiles of one warp at different cg::reduce calls at once (%d lanes wrong)", bad);
    cudaFree(d_in);
    cudaFree(d_out);
}

// --- contended atomics ------------------------------------------------------------------
struct AtomicTargets {
    float fsum;
    int isum;
    unsigned usum;
    unsigned long long ull;
    int imax;
    unsigned umax;
    float fmax_;
    int imin;
    int cas_counter;
    unsigned inc;
};

__global__ void atomics_kernel(AtomicTargets* a) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&a->fsum, 1.0f);
    atomicAdd(&a->isum, i % 7 - 3);
    atomicAdd(&a->usum, 2u);
    atomicAdd(&a->ull, 3ull);
    atomicMax(&a->imax, (i * 7919) % 100003);
    atomicMax(&a->umax, (unsigned)i);
    // float max through CAS on the bit pattern (CUDA has no float atomicMax)
    const float fv = 0.5f * (float)((i * 31) % 4099);
    unsigned* fbits = reinterpret_cast<unsigned*>(&a->fmax_);
    unsigned seen = *fbits;
    while (__uint_as_float(seen) < fv) {
        unsigned prev = atomicCAS(fbits, seen, __float_as_uint(fv));
        if (prev == seen) break;
        seen = prev;
    }
    atomicMin(&a->imin, -((i * 13) % 977));
    int old = a->cas_counter, assumed;  // increment through a CAS loop
    do {
        assumed = old;
        old = atomicCAS(&a->cas_counter, assumed, assumed + 1);
    } while (old != assumed);
    atomicInc(&a->inc, 99u);  // wraps to 0 after 99
}

static void test_atomics() {
    const int blocks = 64, threads = 256, n = blocks * threads;
    AtomicTargets init = {0.0f, 0, 0u, 0ull, -1, 0u, -1.0f, 0, 0, 0u};
    AtomicTargets* d;
    CUDA_OK(cudaMalloc(&d, sizeof init));
    CUDA_OK(cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice));
    atomics_kernel<<<blocks, threads>>>(d);
    CUDA_OK(cudaGetLastError());
    AtomicTargets got;
    CUDA_OK(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
    int isum = 0, imax = -1, imin = 0;
    float fmax_ = -1;
    for (int i = 0; i < n; i++) {
        isum += i % 7 - 3;
        imax = std::max(imax, (i * 7919) % 100003);
        fmax_ = std::max(fmax_, 0.5f * (float)((i * 31) % 4099));
        imin = std::min(imin, -((i * 13) % 977));
    }
    CHECK(got.fsum == (float)n, "atomicAdd float, %d threads (got %.1f)", n, got.fsum);
    CHECK(got.isum == isum && got.usum == 2u * n && got.ull == 3ull * n, "atomicAdd int/unsigned/ull");
    CHECK(got.imax == imax && got.umax == (unsigned)(n - 1), "atomicMax int/unsigned");
    CHECK(got.fmax_ == fmax_, "float max through atomicCAS on its bits (got %.1f want %.1f)", got.fmax_, fmax_);
    CHECK(got.imin == imin, "atomicMin int");
    CHECK(got.cas_counter == n, "atomicCAS loop increments (got %d of %d)", got.cas_counter, n);
    CHECK(got.inc == (unsigned)(n % 100), "atomicInc wraps (got %u)", got.inc);
    cudaFree(d);
}

// --- every block of a grid runs once, every thread of it once ---------------------------------------------
// The CPU runtime hands each worker runs of consecutive blocks (runtime.cpp, work_on); a run cut short or taken
// twice would show here as a block counted 0 or 2 times. One kernel whose threads never meet (a loop on the
// runtime) and one with a barrier (fibers).
__device__ unsigned linear_block() { return (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x; }
__global__ void count_runs_kernel(unsigned* block_runs, unsigned* thread_runs) {
    if (threadIdx.x == 0) atomicAdd(&block_runs[linear_block()], 1u);
    atomicAdd(&thread_runs[linear_block()], 1u);
}
__global__ void count_runs_barrier_kernel(unsigned* block_runs, unsigned* thread_runs) {
    __shared__ unsigned arrived;
    if (threadIdx.x == 0) arrived = 0;
    __syncthreads();
    atomicAdd(&arrived, 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(&block_runs[linear_block()], 1u);
        atomicAdd(&thread_runs[linear_block()], arrived);
    }
}

static void test_every_block_once() {
    const dim3 grids[] = {dim3(1), dim3(2), dim3(3), dim3(7), dim3(64), dim3(1000), dim3(40001), dim3(13, 5, 3)};
    const int threads = 64;
    for (int barrier = 0; barrier < 2; barrier++) {
        for (const dim3& grid : grids) {
            const size_t blocks = (size_t)grid.x * grid.y * grid.z;
            unsigned *d_blocks, *d_threads;
            CUDA_OK(cudaMalloc(&d_blocks, blocks * sizeof(unsigned)));
            CUDA_OK(cudaMalloc(&d_threads, blocks * sizeof(unsigned)));
            CUDA_OK(cudaMemset(d_blocks, 0, blocks * sizeof(unsigned)));
            CUDA_OK(cudaMemset(d_threads, 0, blocks * sizeof(unsigned)));
            if (barrier) count_runs_barrier_kernel<<<grid, threads>>>(d_blocks, d_threads);
            else count_runs_kernel<<<grid, threads>>>(d_blocks, d_threads);
            CUDA_OK(cudaGetLastError());
            std::vector<unsigned> runs(blocks), thread_runs(blocks);
            CUDA_OK(cudaMemcpy(runs.data(), d_blocks, blocks * sizeof(unsigned), cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(thread_runs.data(), d_threads, blocks * sizeof(unsigned), cudaMemcpyDeviceToHost));
            size_t wrong = 0, first = 0;
            for (size_t b = blocks; b-- > 0;)
                if (runs[b] != 1 || thread_runs[b] != (unsigned)threads) wrong++, first = b;
            CHECK(wrong == 0,
                  "%s, grid (%u, %u, %u): every block ran once with all %d threads (%zu blocks wrong, "
                  "the first %zu: %u runs, %u threads)",
                  barrier ? "with a barrier" : "no meeting", grid.x, grid.y, grid.z, threads, wrong, first, runs[first],
                  thread_runs[first]);
            cudaFree(d_blocks);
            cudaFree(d_threads);
        }
    }
}

// --- dynamic shared memory above 48 KiB -------------------------------------------------
__global__ void big_smem_kernel(float* out, int n_floats) {
    extern __shared__ float big[];
    for (int i = threadIdx.x; i < n_floats; i += blockDim.x) big[i] = (float)(i % 1000);
    __syncthreads();
    // each thread sums a strided slice in reverse order: reads what others wrote
    float s = 0;
    for (int i = n_floats - 1 - threadIdx.x; i >= 0; i -= blockDim.x) s += big[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

static void test_dynamic_smem() {
    const int bytes = 96 * 1024, n_floats = bytes / 4, threads = 128, blocks = 4;
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, blocks * threads * sizeof(float)));
    cudaGetLastError();
    big_smem_kernel<<<blocks, threads, bytes>>>(d_out, n_floats);
    cudaError_t before = cudaGetLastError();
    CHECK(before == cudaErrorInvalidValue, "96 KiB dynamic smem without the attribute is refused (%s)",
          cudaGetErrorString(before));
    CUDA_OK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    big_smem_kernel<<<blocks, threads, bytes>>>(d_out, n_floats);
    CUDA_OK(cudaGetLastError());
    std::vector<float> got = to_host(d_out, blocks * threads);
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < threads; t++) {
            float s = 0;
            for (int i = n_floats - 1 - t; i >= 0; i -= threads) s += (float)(i % 1000);
            bad += got[b * threads + t] != s;
        }
    CHECK(bad == 0, "96 KiB dynamic smem after cudaFuncSetAttribute (%d wrong)", bad);
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    cudaError_t e = cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)prop.sharedMemPerBlockOptin + 1024);
    cudaGetLastError();
    CHECK(e == cudaErrorInvalidValue, "attribute above sharedMemPerBlockOptin is refused (%s)", cudaGetErrorString(e));
    cudaFree(d_out);
}

// --- 3-D grids and blocks ---------------------------------------------------------------
__global__ void index_3d_kernel(int4* out) {
    const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int4 v = make_int4(blockIdx.x * 100 + threadIdx.x, blockIdx.y * 100 + threadIdx.y,
                             blockIdx.z * 100 + threadIdx.z,
                             gridDim.x * gridDim.y * gridDim.z * 1000 + blockDim.x * blockDim.y * blockDim.z);
    __stcs(&out[bx * (blockDim.x * blockDim.y * blockDim.z) + tx], v);
}

static void test_3d() {
    const dim3 grid(3, 4, 5), block(4, 3, 2);
    const int nb = 3 * 4 * 5, nt = 4 * 3 * 2;
    int4* d;
    CUDA_OK(cudaMalloc(&d, nb * nt * sizeof(int4)));
    index_3d_kernel<<<grid, block>>>(d);
    CUDA_OK(cudaGetLastError());
    std::vector<int4> got = to_host(d, nb * nt);
    int bad = 0;
    for (int bz = 0; bz < 5; bz++)
        for (int by = 0; by < 4; by++)
            for (int bx = 0; bx < 3; bx++)
                for (int tz = 0; tz < 2; tz++)
                    for (int ty = 0; ty < 3; ty++)
                        for (int tx = 0; tx < 4; tx++) {
                            const int4 g = got[(bx + 3 * (by + 4 * bz)) * nt + tx + 4 * (ty + 3 * tz)];
                            bad += g.x != bx * 100 + tx || g.y != by * 100 + ty || g.z != bz * 100 + tz ||
                                   g.w != nb * 1000 + nt;
                        }
    CHECK(bad == 0, "3-D grid (3,4,5) x block (4,3,2): indices and dims (%d wrong)", bad);
    cudaFree(d);
}

// --- bf16 conversions in kernels match the host's (and the device's) rounding -----------------
__global__ void bf16_roundtrip_kernel(const float* in, __nv_bfloat16* as_bf16, float* back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __nv_bfloat16 b = __float2bfloat16(__ldcs(&in[i]));
        as_bf16[i] = b;
        back[i] = __bfloat162float(b);
    }
}

// Reference: round to nearest even on the bit pattern, NaN stays NaN.
static uint16_t bf16_bits_reference(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static void test_bf16() {
    std::vector<float> h;
    const uint32_t patterns[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f7fffffu,
                                 0x7f800000u, 0xff800000u, 0x00000001u, 0x80000000u, 0x7fc00000u};
    for (uint32_t p : patterns) {
        float f;
        memcpy(&f, &p, 4);
        h.push_back(f);
    }  // ties, overflow, inf, denormal
    for (int i = 0; i < 4000; i++) h.push_back((float)((i * 2654435761u) % 100000) * 1.37e-3f - 60.0f);
    const int n = (int)h.size();
    float* d_in = to_device(h);
    __nv_bfloat16* d_b;
    float* d_back;
    CUDA_OK(cudaMalloc(&d_b, n * sizeof(__nv_bfloat16)));
    CUDA_OK(cudaMalloc(&d_back, n * sizeof(float)));
    bf16_roundtrip_kernel<<<(n + 255) / 256, 256>>>(d_in, d_b, d_back, n);
    CUDA_OK(cudaGetLastError());
    std::vector<__nv_bfloat16> b = to_host(d_b, n);
    std::vector<float> back = to_host(d_back, n);
    int bad_bits = 0, bad_back = 0;
    for (int i = 0; i < n; i++) {
        uint16_t bits;
        memcpy(&bits, &b[i], 2);
        const uint16_t want = bf16_bits_reference(h[i]);
        const bool nan = (want & 0x7fff) > 0x7f80;
        bad_bits += nan ? (bits & 0x7fff) <= 0x7f80 : bits != want;
        uint32_t u = (uint32_t)want << 16;
        float wf;
        memcpy(&wf, &u, 4);
        bad_back += nan ? !std::isnan(back[i]) : back[i] != wf;
        if (__bfloat162float(__float2bfloat16(h[i])) != back[i] && !nan) bad_back++;  // host == kernel
    }
    CHECK(bad_bits == 0, "float->bf16 in a kernel rounds to nearest even (%d of %d differ)", bad_bits, n);
    CHECK(bad_back == 0, "bf16->float round trip, kernel equals host conversion (%d differ)", bad_back);
    cudaFree(d_in);
    cudaFree(d_b);
    cudaFree(d_back);
}

// --- __syncthreads_count / vector loads --------------------------------------------------
__global__ void vote_count_kernel(const float4* in, int* counts, float4* out) {
    const float4 v = __ldcs(&in[threadIdx.x]);
    const int c = __syncthreads_count(v.x > 0.0f);
    const int any = __syncthreads_or(v.y > 100.0f);
    const int all = __syncthreads_and(v.w >= 0.0f);
    if (threadIdx.x == 0) {
        counts[0] = c;
        counts[1] = any;
        counts[2] = all;
    }
    out[threadIdx.x] = make_float4(v.w, v.z, v.y, v.x);
}

static void test_block_votes() {
    const int n = 96;
    std::vector<float4> h(n);
    int positive = 0;
    for (int i = 0; i < n; i++) {
        h[i] = make_float4((float)((i % 5) - 2), (float)i, 1.0f, (float)i);
        positive += (i % 5) - 2 > 0;
    }
    float4* d_in = to_device(h);
    int* d_c;
    float4* d_out;
    CUDA_OK(cudaMalloc(&d_c, 3 * sizeof(int)));
    CUDA_OK(cudaMalloc(&d_out, n * sizeof(float4)));
    vote_count_kernel<<<1, n>>>(d_in, d_c, d_out);
    CUDA_OK(cudaGetLastError());
    std::vector<int> c = to_host(d_c, 3);
    std::vector<float4> o = to_host(d_out, n);
    CHECK(c[0] == positive && c[1] == 0 && c[2] == 1, "__syncthreads_count/or/and (count %d want %d)", c[0], positive);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += o[i].x != h[i].w || o[i].w != h[i].x;
    CHECK(bad == 0, "float4 __ldcs loads and stores (%d wrong)", bad);
    cudaFree(d_in);
    cudaFree(d_c);
    cudaFree(d_out);
}

// --- math intrinsics against the host's libm ----------------------------------------------
__global__ void math_kernel(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    out[0 * n + i] = __expf(v);
    out[1 * n + i] = rsqrtf(fabsf(v) + 0.5f);
    out[2 * n + i] = tanhf(v);
    out[3 * n + i] = __fdividef(v, 3.0f + v * v);
    out[4 * n + i] = __logf(fabsf(v) + 1.0f);
    out[5 * n + i] = fmaxf(v, 0.0f) + __saturatef(v) + (float)__float2int_rn(v);
    out[6 * n + i] = __int_as_float(__float_as_int(v)) + (float)__popc(__float_as_uint(v)) + (float)max(i, 7) +
                     (float)min(i, 7);
}

static void test_math() {
    const int n = 2000, K = 7;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = -10.0f + 20.0f * (float)i / (float)(n - 1);
    float* d_x = to_device(h);
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, K * n * sizeof(float)));
    math_kernel<<<(n + 127) / 128, 128>>>(d_x, d_out, n);
    CUDA_OK(cudaGetLastError());
    std::vector<float> got = to_host(d_out, K * n);
    const char* names[K] = {"__expf",
                            "rsqrtf",
                            "tanhf",
                            "__fdividef",
                            "__logf",
                            "fmaxf/__saturatef/__float2int_rn",
                            "bit casts/__popc/min/max"};
    for (int k = 0; k < K; k++) {
        std::vector<double> want(n);
        for (int i = 0; i < n; i++) {
            const double v = h[i];
            switch (k) {
                case 0: want[i] = std::exp(v); break;
                case 1: want[i] = 1.0 / std::sqrt(std::fabs(v) + 0.5); break;
                case 2: want[i] = std::tanh(v); break;
                case 3: want[i] = v / (3.0 + v * v); break;
                case 4: want[i] = std::log(std::fabs(v) + 1.0); break;
                case 5: want[i] = std::fmax(v, 0.0) + std::fmin(std::fmax(v, 0.0), 1.0) + std::nearbyint(h[i]); break;
                case 6: {
                    uint32_t u;
                    memcpy(&u, &h[i], 4);
                    want[i] = v + __builtin_popcount(u) + std::max(i, 7) + std::min(i, 7);
                    break;
                }
            }
        }
        // the GPU's fast intrinsics are approximate: a few ulp, far below 1e-5
        double err = max_rel_diff(&got[k * n], want.data(), n, 1e-3);
        CHECK(err < 1e-5, "%s in a kernel vs libm (max rel. error %.2e)", names[k], err);
    }
    cudaFree(d_x);
    cudaFree(d_out);
}

// --- pinned host memory, async copies and memset on a stream --------------------------------
static void test_async_copies() {
    const int n = 10000;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    float *pinned, *back, *d;
    CUDA_OK(cudaMallocHost(&pinned, n * sizeof(float)));
    CUDA_OK(cudaMallocHost(&back, n * sizeof(float)));
    CUDA_OK(cudaMalloc(&d, 2 * n * sizeof(float)));
    for (int i = 0; i < n; i++) pinned[i] = (float)i * 0.5f;
    CUDA_OK(cudaMemsetAsync(d, 0, 2 * n * sizeof(float), s));
    CUDA_OK(cudaMemcpyAsync(d + n, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(d, d + n, n / 2 * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CUDA_OK(cudaMemcpyAsync(back, d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += back[i] != (i < n / 2 ? (float)i * 0.5f : 0.0f);
    CHECK(bad == 0, "pinned memory, cudaMemsetAsync and cudaMemcpyAsync H2D/D2D/D2H on a stream (%d wrong)", bad);
    cudaFreeHost(pinned);
    cudaFreeHost(back);
    cudaFree(d);
    cudaStreamDestroy(s);
}

// --- errors that the real runtime returns -------------------------------------------------
__global__ void noop_kernel(int* p) {
    if (p && threadIdx.x == 0 && blockIdx.x == 0) p[0] = 1;  // one writer: no race
}

static void test_launch_errors() {
    cudaGetLastError();
    noop_kernel<<<1, 1025>>>(nullptr);
    cudaError_t e1 = cudaGetLastError();
    CHECK(e1 == cudaErrorInvalidConfiguration, "1025 threads per block: %s", cudaGetErrorName(e1));
    CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
    noop_kernel<<<1, dim3(1, 1, 65)>>>(nullptr);
    cudaError_t e2 = cudaPeekAtLastError();
    CHECK(e2 == cudaErrorInvalidConfiguration && cudaGetLastError() == e2, "blockDim.z = 65: %s (peek keeps it)",
          cudaGetErrorName(e2));
    noop_kernel<<<dim3(1, 65536), 32>>>(nullptr);
    cudaError_t e3 = cudaGetLastError();
    CHECK(e3 == cudaErrorInvalidConfiguration, "gridDim.y = 65536: %s", cudaGetErrorName(e3));
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    noop_kernel<<<1, 32, prop.sharedMemPerBlockOptin + 1>>>(nullptr);
    cudaError_t e4 = cudaGetLastError();
    CHECK(e4 == cudaErrorInvalidValue, "dynamic smem above the opt-in limit: %s", cudaGetErrorName(e4));
    int* d;
    CUDA_OK(cudaMalloc(&d, sizeof(int)));
    noop_kernel<<<1, 1024>>>(d);  // the largest legal block still runs
    int one = 0;
    CUDA_OK(cudaMemcpy(&one, d, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaGetLastError() == cudaSuccess && one == 1, "1024 threads per block runs");
    cudaFree(d);
}

static void test_memory_errors() {
    size_t free_b = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, total + (1ull << 30));
    CHECK(e == cudaErrorMemoryAllocation && p == nullptr, "cudaMalloc past device memory: %s", cudaGetErrorName(e));
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "the failed allocation is the last error");
    CHECK(cudaGetLastError() == cudaSuccess, "and is cleared after reading");
}

static void test_events() {
    cudaEvent_t a, b;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    int* d;
    CUDA_OK(cudaMalloc(&d, 4096 * sizeof(int)));
    CUDA_OK(cudaEventRecord(a, s));
    for (int i = 0; i < 20; i++) noop_kernel<<<64, 64, 0, s>>>(d);
    CUDA_OK(cudaMemsetAsync(d, 0, 4096 * sizeof(int), s));
    CUDA_OK(cudaEventRecord(b, s));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = -1;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    CHECK(ms >= 0.0f && ms < 10000.0f, "stream launches + event elapsed time (%.3f ms)", ms);
    CUDA_OK(cudaStreamSynchronize(s));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    cudaFree(d);
}

int main() {
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %zu MiB, smem %zu/%zu KiB\n", prop.name, prop.multiProcessorCount,
           prop.totalGlobalMem >> 20, prop.sharedMemPerBlock >> 10, prop.sharedMemPerBlockOptin >> 10);
    TEST_CASE(test_block_reduction());
    TEST_CASE(test_block_scan());
    TEST_CASE(test_shuffles());
    TEST_CASE(test_cg_reduce());
    TEST_CASE(test_cg_reduce_order());
    TEST_CASE(test_atomics());
    TEST_CASE(test_every_block_once());
    TEST_CASE(test_dynamic_smem());
    TEST_CASE(test_3d());
    TEST_CASE(test_bf16());
    TEST_CASE(test_block_votes());
    TEST_CASE(test_math());
    TEST_CASE(test_async_copies());
    TEST_CASE(test_launch_errors());
    TEST_CASE(test_memory_errors());
    TEST_CASE(test_events());
    return test_summary("test_kernel_language");
}
