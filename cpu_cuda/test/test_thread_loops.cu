// Kernels whose threads never meet run each block as a plain loop on the CPU
// runtime (cudapp.py marks their launches; the runtime loops over the threads
// instead of starting fibers). This program checks which kernels do: none
// that meets its neighbours (a barrier or a shuffle reached through a helper
// or a functor, shared memory, cooperative groups, a block reduction of llmc/),
// and the element-wise kernels of llmc/ do; and that a looped kernel's results
// are bitwise those of the fibers (AdamW, GELU, the encoder, the global norm),
// with the threads in the schedule's order. Portable: on a GPU it runs the
// kernels and checks only what does not depend on the runtime.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "test/kernels/kernel_test.h"
#ifdef CPUCUDA
#include "cpucuda.h"
#endif

namespace cg = cooperative_groups;

// --- kernels that meet: through a helper defined after them, a functor, shared memory, cooperative groups -------
__device__ float block_sum_later(float x);
__global__ void barrier_through_helper_kernel(float* out) { out[threadIdx.x] = block_sum_later((float)threadIdx.x); }
__device__ float block_sum_later(float x) {
    __shared__ float total;
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    atomicAdd(&total, x);
    __syncthreads();
    return total;
}

__global__ void shuffle_kernel(float* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1); }

struct WarpSyncOp {
    __device__ float operator()(float x) const {
        __syncwarp();
        return x + 1;
    }
};
template <class Op>
__global__ void functor_kernel(float* out, Op op) {
    out[threadIdx.x] = op((float)threadIdx.x);
}

// each thread reads only what it wrote itself: correct without a barrier, and still not looped
__global__ void own_shared_slot_kernel(float* out) {
    __shared__ float slot[64];
    slot[threadIdx.x] = 2.0f * threadIdx.x;
    out[threadIdx.x] = slot[threadIdx.x];
}

__global__ void cg_reduce_kernel(float* out) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[threadIdx.x] = cg::reduce(warp, (float)threadIdx.x, cg::plus<float>());
}

// --- a kernel that does not meet, but whose result depends on the order of the block's threads: every thread
// writes its index to the same word, so the last one to run wins (a race on a GPU; here, the schedule's order)
__global__ void last_writer_kernel(unsigned* out) { out[blockIdx.x] = threadIdx.x + 1000 * threadIdx.y; }

// --- each thread's own index, in a block of any shape
__global__ void thread_index_kernel(unsigned* out) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[blockIdx.x * blockDim.x * blockDim.y * blockDim.z + t] = threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z;
}

#ifdef CPUCUDA
// How many launches of `launch` ran as loops.
template <class F>
static uint64_t loops_in(F launch) {
    const uint64_t before = cpucuda::loop_launches();
    launch();
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    return cpucuda::loop_launches() - before;
}
#endif

static void test_meeting_kernels_never_loop() {
#ifdef CPUCUDA
    Dev d;
    float* out = d.alloc<float>(64);
    float* scratch = d.alloc<float>(GLOBAL_NORM_MAX_BLOCKS);
    float* norm = d.alloc<float>(1);
    const std::vector<float> g(5000, 0.5f);
    float* grads = d.up(g);
    struct Case {
        const char* what;
        uint64_t loops;
    } cases[] = {
        {"__syncthreads in a helper defined after the kernel",
         loops_in([&] { barrier_through_helper_kernel<<<2, 64>>>(out); })},
        {"__shfl_xor_sync", loops_in([&] { shuffle_kernel<<<2, 64>>>(out); })},
        {"__syncwarp in a functor's operator()", loops_in([&] { functor_kernel<<<2, 64>>>(out, WarpSyncOp{}); })},
        {"static __shared__ memory, no barrier", loops_in([&] { own_shared_slot_kernel<<<2, 64>>>(out); })},
        {"cg::reduce over a tiled_partition", loops_in([&] { cg_reduce_kernel<<<2, 64>>>(out); })},
        {"llmc's global norm (block_reduce_sum)",
         loops_in([&] { global_norm_squared(norm, scratch, grads, g.size(), 0); })},
    };
    for (const Case& c : cases) CHECK(c.loops == 0, "a kernel that meets its neighbours runs on fibers: %s", c.what);
#else
    printf("SKIP which kernels run as loops: a CPU runtime question\n");
#endif
}

static void test_elementwise_kernels_loop() {
#ifdef CPUCUDA
    const size_t n = 4096;
    Dev d;
    floatX *x = d.up(randx(n, -1, 1)), *y = d.alloc<floatX>(n);
    const std::vector<int> tokens(8, 3);
    int* inp = d.up(tokens);
    floatX *wte = d.up(randx(16 * 64, -1, 1)), *wpe = d.up(randx(8 * 64, -1, 1)), *enc = d.alloc<floatX>(8 * 64);
    float *master = d.up(randf(n, -1, 1)), *grads = d.up(randf(n, -1, 1)), *m = d.alloc<float>(n),
          *v = d.alloc<float>(n);
    CUDA_OK(cudaMemset(m, 0, n * sizeof(float)));
    CUDA_OK(cudaMemset(v, 0, n * sizeof(float)));
    CHECK(loops_in([&] { gelu_forward(y, x, n, 0); }) == 1, "gelu_forward runs as a loop");
    CHECK(loops_in([&] { encoder_forward(enc, inp, nullptr, wte, wpe, 1, 8, 64, 0); }) == 1,
          "encoder_forward runs as a loop");
    CHECK(loops_in([&] {
              adamw_update(y, master, grads, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, nullptr, 7, 0, 0);
          }) == 1,
          "adamw_update runs as a loop");
    cpucuda::set_thread_loops(false);
    CHECK(loops_in([&] { gelu_forward(y, x, n, 0); }) == 0, "set_thread_loops(false): gelu_forward runs on fibers");
    cpucuda::set_thread_loops(true);
#else
    printf("SKIP which kernels run as loops: a CPU runtime question\n");
#endif
}

// The outputs of one run of each kernel (AdamW's four arrays, GELU forward and backward, the encoder, the global
// norm's partials and result), from the same inputs.
static std::vector<std::vector<uint8_t>> run_kernels() {
    g_rng.seed(38);
    const size_t n = 3 * 4096 + 8;  // a pack width of 4 (16-byte accesses) and a tail of 2 blocks' chunks
    const int B = 2, T = 16, C = 64, V = 50;
    Dev d;
    floatX *params = d.up(randx(n, -1, 1)), *gin = d.up(randx(n, -4, 4)), *gout = d.alloc<floatX>(n);
    floatX* dgelu = d.up(randx(n, -1, 1));
    float *master = d.up(randf(n, -1, 1)), *grads = d.up(randf(n, -1, 1)), *m = d.up(randf(n, -0.1f, 0.1f)),
          *v = d.up(randf(n, 0, 0.01f)), *scratch = d.alloc<float>(GLOBAL_NORM_MAX_BLOCKS), *norm = d.alloc<float>(1),
          *scale = d.alloc<float>(1);
    std::vector<int> tokens(B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7) % V;
    int* inp = d.up(tokens);
    floatX *wte = d.up(randx((size_t)V * C, -1, 1)), *wpe = d.up(randx((size_t)T * C, -1, 1)),
           *enc = d.alloc<floatX>((size_t)B * T * C);
    global_norm_squared(norm, scratch, grads, n, 0);
    grad_scale(scale, norm, 1.0f, 0);
    adamw_update(params, master, grads, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, scale, 1234, 0, 0);
    gelu_forward(gout, gin, n, 0);
    gelu_backward_inplace(dgelu, gin, n, 0);
    encoder_forward(enc, inp, nullptr, wte, wpe, B, T, C, 0);
    CUDA_OK(cudaDeviceSynchronize());
    auto bytes = [](const auto* p, size_t count) {
        const auto h = to_host(p, count);
        const uint8_t* b = reinterpret_cast<const uint8_t*>(h.data());
        return std::vector<uint8_t>(b, b + count * sizeof(h[0]));
    };
    return {bytes(params, n),
            bytes(master, n),
            bytes(m, n),
            bytes(v, n),
            bytes(gout, n),
            bytes(dgelu, n),
            bytes(enc, (size_t)B * T * C),
            bytes(scratch, 4),
            bytes(norm, 1),
            bytes(scale, 1)};
}

static void test_loops_bitwise_as_fibers() {
    const char* names[] = {
        "adamw params",    "adamw master",         "adamw m",     "adamw v",   "gelu_forward", "gelu_backward_inplace",
        "encoder_forward", "global norm partials", "global norm", "grad_scale"};
#ifdef CPUCUDA
    cpucuda::set_thread_loops(false);
    const auto fibers = run_kernels();
    cpucuda::set_thread_loops(true);
    const uint64_t before = cpucuda::loop_launches();
    const auto loops = run_kernels();
    CHECK(cpucuda::loop_launches() - before == 5,
          "grad_scale, adamw, gelu forward and backward, encoder ran as loops (%llu)",
          (unsigned long long)(cpucuda::loop_launches() - before));
#else
    const auto fibers = run_kernels(), loops = run_kernels();
#endif
    for (size_t k = 0; k < fibers.size(); k++)
        CHECK(fibers[k] == loops[k], "%s: as a loop, bitwise the fibers' result", names[k]);
}

// The loop takes the threads in the order the fibers run them: the last writer of a word that every thread of
// the block writes is the same, in forward and reverse order. (A random order is seeded by the launch too, so two
// launches never share one: there the loop must at least not run the threads in forward order.)
static void test_loop_order_is_the_schedule() {
#ifdef CPUCUDA
    const dim3 block(40, 3);  // 120 threads: three full warps and one of 24 lanes
    const int blocks = 16;
    Dev d;
    unsigned* out = d.alloc<unsigned>(blocks);
    auto last_writers = [&](bool loops, cpucuda::Schedule s, uint64_t seed, const char* name) {
        cpucuda::set_thread_loops(loops);
        cpucuda::set_schedule(s, seed);
        const uint64_t ran = loops_in([&] { last_writer_kernel<<<blocks, block>>>(out); });
        CHECK(ran == (uint64_t)loops, "%s: last_writer_kernel ran %s", name, loops ? "as a loop" : "on fibers");
        return to_host(out, blocks);
    };
    const auto forward = last_writers(false, cpucuda::Schedule::Forward, 0, "forward");
    const auto forward_loop = last_writers(true, cpucuda::Schedule::Forward, 0, "forward");
    CHECK(forward == forward_loop && forward[0] == 2039, "forward: every block's last thread is (39, 2), as on fibers");
    const auto reverse = last_writers(false, cpucuda::Schedule::Reverse, 0, "reverse");
    const auto reverse_loop = last_writers(true, cpucuda::Schedule::Reverse, 0, "reverse");
    CHECK(reverse == reverse_loop && reverse[0] == 0, "reverse: every block's last thread is (0, 0), as on fibers");
    const auto random_loop = last_writers(true, cpucuda::Schedule::Random, 11, "random:11");
    int forward_ends = 0;
    for (unsigned w : random_loop) forward_ends += w == 2039;
    CHECK(forward_ends < blocks, "random:11: the loop follows the shuffled order (%d of %d blocks end at (39, 2))",
          forward_ends, blocks);
    cpucuda::set_schedule(cpucuda::Schedule::Forward, 0);
    cpucuda::set_thread_loops(true);
#else
    printf("SKIP the loop's thread order: a CPU runtime question\n");
#endif
}

// A worker keeps its threads' indices and its loop order from one block to the next: blocks of a new shape with
// the same thread count, and a new schedule between two looped launches of one shape, must still see their own.
static void test_loops_after_shape_and_schedule_changes() {
#ifdef CPUCUDA
    const int blocks = 6;
    Dev d;
    unsigned* out = d.alloc<unsigned>(blocks * 128);
    cpucuda::set_thread_loops(true);
    for (dim3 block : {dim3(128), dim3(64, 2), dim3(32, 2, 2), dim3(128), dim3(40, 3)}) {
        CHECK(loops_in([&] { thread_index_kernel<<<blocks, block>>>(out); }) == 1, "thread_index_kernel is a loop");
        const std::vector<unsigned> got = to_host(out, blocks * block.x * block.y * block.z);
        int wrong = 0;
        for (size_t i = 0; i < got.size(); i++) {
            const unsigned t = (unsigned)(i % (block.x * block.y * block.z));
            wrong += got[i] != t % block.x + 100 * (t / block.x % block.y) + 10000 * (t / (block.x * block.y));
        }
        CHECK(wrong == 0, "block (%u, %u, %u) after other shapes: %d threads saw another thread's index", block.x,
              block.y, block.z, wrong);
    }
    unsigned* last = d.alloc<unsigned>(blocks);
    const cpucuda::Schedule order[] = {cpucuda::Schedule::Forward, cpucuda::Schedule::Reverse,
                                       cpucuda::Schedule::Forward};
    for (cpucuda::Schedule s : order) {
        cpucuda::set_schedule(s, 0);
        CHECK(loops_in([&] { last_writer_kernel<<<blocks, dim3(40, 3)>>>(last); }) == 1, "last_writer is a loop");
        const unsigned want = s == cpucuda::Schedule::Forward ? 2039 : 0;
        CHECK(to_host(last, blocks) == std::vector<unsigned>(blocks, want),
              "%s schedule right after another: every block's last thread is %u",
              s == cpucuda::Schedule::Forward ? "forward" : "reverse", want);
    }
    cpucuda::set_schedule(cpucuda::Schedule::Forward, 0);
#else
    printf("SKIP the loop's indices and order across launches: a CPU runtime question\n");
#endif
}

int main() {
    kernel_test_begin("test_thread_loops");
    TEST_CASE(test_meeting_kernels_never_loop());
    TEST_CASE(test_elementwise_kernels_loop());
    TEST_CASE(test_loops_bitwise_as_fibers());
    TEST_CASE(test_loop_order_is_the_schedule());
    TEST_CASE(test_loops_after_shape_and_schedule_changes());
    return kernel_test_end("test_thread_loops");
}
