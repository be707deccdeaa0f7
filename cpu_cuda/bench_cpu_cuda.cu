// Speed of the CUDA-on-CPU runtime on a layernorm-shaped kernel: 4096 rows x
// 768, one warp per row, 10 shuffles per thread (two 5-step butterflies), against
// the same math as a plain C++ loop on one core, both timed in this run.
// Prints the ratio (goal: runtime at most 20x the plain loop), and the same
// kernel with its two butterflies written as cg::reduce (on the CPU runtime one
// meeting of the warp each instead of five; the same bits). Then an
// element-wise kernel, one element per GPU thread (y = a x + b over 16 M
// floats), against its plain loop: the CPU runtime runs it as a loop of the
// block's threads (its threads never meet), and here also on fibers, to show
// what the loop saves. Then the tensor-core instructions: ns per
// mma.m16n8k16 (bf16, fp32 accumulators) and per ldmatrix.x4, each issued in
// a loop by every warp (on the CPU runtime: the scheduler's warp-wide
// rendezvous plus the emulation). Last, the matmuls of one GPT-2 d12 training
// step (cuBLASLt, in bf16 and in fp32; see bench_matmul). Built with nvcc the
// same program times the GPU instead.
//
//   make bench        (runs it with the default workers, then with one)
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llmc/kernels/ptx.cuh"
#ifdef CPUCUDA
#include "cpucuda.h"
#endif

// The warp's sum by a butterfly of five shuffles, or by cg::reduce: on a GPU
// the same five shuffles, on the CPU runtime one meeting of the warp.
template <bool CG>
__device__ float warp_sum(float v) {
    if constexpr (CG) {
        namespace cg = cooperative_groups;
        return cg::reduce(cg::tiled_partition<32>(cg::this_thread_block()), v, cg::plus<float>());
    } else {
        for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
        return v;
    }
}

// mean and rstd of each row by warp butterflies, then the normalised row
template <bool CG>
__global__ void layernorm_rows_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                      const float* bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const float* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += 32) sum += x[i];
    sum = warp_sum<CG>(sum);
    const float m = sum / C;
    float sq = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        sq += d * d;
    }
    sq = warp_sum<CG>(sq);
    const float s = rsqrtf(sq / C + 1e-5f);
    float* o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// The same math, one row at a time; the sums run in the kernel's order (32
// strided partial sums combined by the butterfly) so the outputs match closely.
static void layernorm_rows_plain(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int N, int C) {
    for (int row = 0; row < N; row++) {
        const float* x = inp + (size_t)row * C;
        float part[32] = {0};
        for (int i = 0; i < C; i++) part[i % 32] += x[i];
        float sum = 0.0f;
        for (int l = 0; l < 32; l++) sum += part[l];
        const float m = sum / C;
        float sq = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            sq += d * d;
        }
        const float s = 1.0f / sqrtf(sq / C + 1e-5f);
        float* o = out + (size_t)row * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[row] = m;
        rstd[row] = s;
    }
}

__global__ void axpb_kernel(float* y, const float* x, float a, float b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

static double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of `runs` runs of launch() and a device synchronisation, in seconds (0 if one failed).
template <class Launch>
static double best_of(int runs, Launch launch) {
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        const double t0 = seconds_now();
        launch();
        if (cudaDeviceSynchronize() != cudaSuccess) return 0;
        best = std::min(best, seconds_now() - t0);
    }
    return best;
}

// Best of 5 runs of the element-wise kernel, in seconds (0 if it failed).
static double time_axpb(float* d_y, const float* d_x, int n) {
    return best_of(5, [&] { axpb_kernel<<<(n + 255) / 256, 256>>>(d_y, d_x, 2.0f, 1.0f, n); });
}

// The element-wise kernel against its plain loop; false if a result differs.
static bool bench_elementwise() {
    const int n = 1 << 24;
    std::vector<float> x(n), y(n), ref(n);
    for (int i = 0; i < n; i++) x[i] = (float)(i % 1000) * 0.001f;
    float *d_x, *d_y;
    cudaMalloc(&d_x, n * sizeof(float));
    cudaMalloc(&d_y, n * sizeof(float));
    cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    const double kernel = time_axpb(d_y, d_x, n);
    double plain = 1e30;
    for (int r = 0; r < 5; r++) {
        const double t0 = seconds_now();
        for (int i = 0; i < n; i++) ref[i] = 2.0f * x[i] + 1.0f;
        plain = std::min(plain, seconds_now() - t0);
    }
    cudaMemcpy(y.data(), d_y, n * sizeof(float), cudaMemcpyDeviceToHost);
    bool same = kernel > 0 && y == ref;
    printf("\nelement-wise kernel, y = a x + b over %d floats, one element per GPU thread\n", n);
    printf("kernel            : %8.2f ms  (best of 5)\n", kernel * 1e3);
#ifdef CPUCUDA
    cpucuda::set_thread_loops(false);
    const double fibers = time_axpb(d_y, d_x, n);
    cpucuda::set_thread_loops(true);
    cudaMemcpy(y.data(), d_y, n * sizeof(float), cudaMemcpyDeviceToHost);
    same = same && fibers > 0 && y == ref;
    printf("kernel on fibers  : %8.2f ms  (best of 5; CPUCUDA_THREAD_LOOPS=0)\n", fibers * 1e3);
#endif
    printf("plain loop, 1 core: %8.2f ms  (best of 5)\n", plain * 1e3);
    printf("ratio kernel/plain: %.2fx\n", kernel / plain);
    cudaFree(d_x);
    cudaFree(d_y);
    return same;
}

// --- mma: tensor-core instructions ------------------------------------------------
// Every warp keeps A (16x16) and B (16x8) fragments in registers and issues
// `iters` mma.m16n8k16 into one accumulator: D = iters A B exactly (entries of
// A and B in -1..1, |D| <= 16 iters < 2^24).
__global__ void mma_loop_kernel(float* D, const uint32_t* frag_a, const uint32_t* frag_b, int iters) {
    const int lane = threadIdx.x % 32;
    const uint32_t a[4] = {frag_a[lane * 4], frag_a[lane * 4 + 1], frag_a[lane * 4 + 2], frag_a[lane * 4 + 3]};
    const uint32_t b[2] = {frag_b[lane * 2], frag_b[lane * 2 + 1]};
    float acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < iters; i++) mma_bf16_16816(acc, a, b);
    if (blockIdx.x == 0 && threadIdx.x < 32)
        for (int r = 0; r < 4; r++) D[lane * 4 + r] = acc[r];
}

// Every warp issues `iters` ldmatrix.x4, alternating plain and .trans, from a
// 16x16 shared tile; out gets the xor of the registers (keeps the loads live).
__global__ void ldmatrix_loop_kernel(uint32_t* out, int iters) {
    __shared__ __align__(16) unsigned short tile[16 * 16];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) tile[e] = (unsigned short)e;
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const unsigned short* row = tile + (lane % 16) * 16 + (lane / 16) * 8;
    uint32_t x = 0, r[4];
    for (int i = 0; i < iters; i++) {
        if (i % 2) ldmatrix_trans<4>(r, row);
        else ldmatrix<4>(r, row);
        x ^= r[0] ^ r[1] ^ r[2] ^ r[3];
    }
    if (blockIdx.x == 0 && threadIdx.x < 32) out[lane] = x;
}

// A, B and C = iters A B, and the fragments of A and B by the PTX ISA layout.
static void mma_bench_inputs(std::vector<uint32_t>& frag_a, std::vector<uint32_t>& frag_b, std::vector<float>& C,
                             int iters) {
    auto A = [](int m, int k) { return (m * 7 + k * 3) % 3 - 1; };  // -1, 0, 1: exact in bf16
    auto B = [](int k, int n) { return (k * 5 + n) % 3 - 1; };
    auto bits = [](int v) { return v == 0 ? 0u : v > 0 ? 0x3F80u : 0xBF80u; };  // bf16 of 0, 1, -1
    auto pair = [&](int lo, int hi) { return bits(lo) | bits(hi) << 16; };
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        frag_a[lane * 4] = pair(A(g, 2 * t), A(g, 2 * t + 1));
        frag_a[lane * 4 + 1] = pair(A(g + 8, 2 * t), A(g + 8, 2 * t + 1));
        frag_a[lane * 4 + 2] = pair(A(g, 2 * t + 8), A(g, 2 * t + 9));
        frag_a[lane * 4 + 3] = pair(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9));
        frag_b[lane * 2] = pair(B(2 * t, g), B(2 * t + 1, g));
        frag_b[lane * 2 + 1] = pair(B(2 * t + 8, g), B(2 * t + 9, g));
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            int s = 0;
            for (int k = 0; k < 16; k++) s += A(m, k) * B(k, n);
            C[m * 8 + n] = (float)(s * iters);
        }
}

// ns per mma.m16n8k16 and per ldmatrix.x4 (wall time / instructions issued by
// all warps); false if the mma's result is wrong.
static bool bench_mma() {
    const int blocks = 64, threads = 128, iters = 256;
    const double count = (double)blocks * (threads / 32) * iters;
    std::vector<uint32_t> frag_a(128), frag_b(64);
    std::vector<float> want(128), D(128);
    mma_bench_inputs(frag_a, frag_b, want, iters);
    uint32_t *d_a, *d_b, *d_x;
    float* d_D;
    cudaMalloc(&d_a, 128 * sizeof(uint32_t));
    cudaMalloc(&d_b, 64 * sizeof(uint32_t));
    cudaMalloc(&d_x, 32 * sizeof(uint32_t));
    cudaMalloc(&d_D, 128 * sizeof(float));
    cudaMemcpy(d_a, frag_a.data(), 128 * sizeof(uint32_t), cudaMemcpyHostToDevice);
    cudaMemcpy(d_b, frag_b.data(), 64 * sizeof(uint32_t), cudaMemcpyHostToDevice);
    const double mma = best_of(3, [&] { mma_loop_kernel<<<blocks, threads>>>(d_D, d_a, d_b, iters); });
    const double ld = best_of(3, [&] { ldmatrix_loop_kernel<<<blocks, threads>>>(d_x, iters); });
    cudaMemcpy(D.data(), d_D, 128 * sizeof(float), cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        const int at[4] = {g * 8 + 2 * t, g * 8 + 2 * t + 1, (g + 8) * 8 + 2 * t, (g + 8) * 8 + 2 * t + 1};
        for (int r = 0; r < 4; r++) wrong += D[lane * 4 + r] != want[at[r]];
    }
    printf("\nmma: %d warps x %d instructions each\n", blocks * threads / 32, iters);
    printf("mma.m16n8k16 bf16 : %8.1f ns per mma  (best of 3; %s)\n", mma * 1e9 / count,
           wrong ? "WRONG result" : "result exact");
    printf("ldmatrix.x4       : %8.1f ns per ldmatrix  (best of 3)\n", ld * 1e9 / count);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_x);
    cudaFree(d_D);
    return mma > 0 && ld > 0 && wrong == 0;
}

// ---------------------------------------------------------------------------
// matmul: the cuBLASLt calls of one GPT-2 124M (d12) training step at B*T = 256
// tokens, made as llmc/kernels/matmul.cuh makes them (column-major; forward
// D(OC, N) = W^T x with BIAS or GELU_AUX_BIAS, backward dX = W dY (DGELU
// behind the GELU) and dW += x dY^T in fp32 with BGRADB), in bf16 and in fp32.
// One layer's calls are timed (best of 3 each) and counted 12 times, plus the
// lm_head's.

struct MatmulBenchCall {
    const char* name;
    int m, n, k;
    bool ta, tb;
    bool d_f32;  // D (and bias) fp32 whatever the operands: the weight gradient
    float beta;
    cublasLtEpilogue_t epilogue;
    int count;  // calls per step
};

static void* matmul_bench_alloc(size_t elements, cudaDataType_t t) {
    const size_t size = t == CUDA_R_32F ? 4 : 2;
    std::vector<unsigned char> host(elements * size);
    for (size_t i = 0; i < elements; i++) {
        const float v = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        if (t == CUDA_R_32F) ((float*)host.data())[i] = 0.05f * v;
        else ((__nv_bfloat16*)host.data())[i] = __float2bfloat16(0.05f * v);
    }
    void* d = nullptr;
    if (cudaMalloc(&d, host.size()) != cudaSuccess) return nullptr;
    cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice);
    return d;
}

#define MATMUL_BENCH_OK(call) \
    if ((call) != CUBLAS_STATUS_SUCCESS) return -1

// Best of 3 of one call, in seconds; negative if cuBLASLt refused it.
static double matmul_bench_time(cublasLtHandle_t lt, const MatmulBenchCall& c, cudaDataType_t ab) {
    const cudaDataType_t cd = c.d_f32 ? CUDA_R_32F : ab;
    const bool bias = c.epilogue != CUBLASLT_EPILOGUE_DEFAULT && c.epilogue != CUBLASLT_EPILOGUE_DGELU;
    const bool aux = c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || c.epilogue == CUBLASLT_EPILOGUE_DGELU;
    void* a = matmul_bench_alloc((size_t)c.m * c.k, ab);
    void* b = matmul_bench_alloc((size_t)c.k * c.n, ab);
    void* d = matmul_bench_alloc((size_t)c.m * c.n, cd);
    void* bias_p = matmul_bench_alloc(c.epilogue == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m, cd);
    void* aux_p = matmul_bench_alloc((size_t)c.m * c.n, ab);
    double best = -1;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS) {
        best = [&]() -> double {
            const cublasOperation_t op_a = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
            MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
            MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
            MATMUL_BENCH_OK(
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof(c.epilogue)));
            if (bias || c.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
                const int32_t bias_type = cd;
                MATMUL_BENCH_OK(
                    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_p, sizeof(bias_p)));
                MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                               sizeof(bias_type)));
            }
            if (aux) {
                const int64_t aux_ld = c.m;
                const int32_t aux_type = ab;
                MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_p,
                                                               sizeof(aux_p)));
                MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                               sizeof(aux_ld)));
                MATMUL_BENCH_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                               &aux_type, sizeof(aux_type)));
            }
            MATMUL_BENCH_OK(cublasLtMatrixLayoutCreate(&la, ab, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.ta ? c.k : c.m));
            MATMUL_BENCH_OK(cublasLtMatrixLayoutCreate(&lb, ab, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.tb ? c.n : c.k));
            MATMUL_BENCH_OK(cublasLtMatrixLayoutCreate(&ld, cd, c.m, c.n, c.m));
            const float alpha = 1.0f;
            cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
            double t = best_of(3, [&] {
                if (status == CUBLAS_STATUS_SUCCESS)
                    status =
                        cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &c.beta, d, ld, d, ld, nullptr, nullptr, 0, 0);
            });
            if (status != CUBLAS_STATUS_SUCCESS || t <= 0) t = -1;
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(ld);
            return t;
        }();
        cublasLtMatmulDescDestroy(desc);
    }
    for (void* p : {a, b, d, bias_p, aux_p}) cudaFree(p);
    return best;
}

// false if a call was refused or failed.
static bool bench_matmul() {
    const int N = 256, C = 768, V = 50304, L = 12;
    const MatmulBenchCall calls[] = {
        {"qkv    fwd", 3 * C, N, C, true, false, false, 0.0f, CUBLASLT_EPILOGUE_BIAS, L},
        {"qkv    dX ", C, N, 3 * C, false, false, false, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, L},
        {"qkv    dW ", C, 3 * C, N, false, true, true, 1.0f, CUBLASLT_EPILOGUE_BGRADB, L},
        {"attprj fwd", C, N, C, true, false, false, 0.0f, CUBLASLT_EPILOGUE_BIAS, L},
        {"attprj dX ", C, N, C, false, false, false, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, L},
        {"attprj dW ", C, C, N, false, true, true, 1.0f, CUBLASLT_EPILOGUE_BGRADB, L},
        {"fc     fwd", 4 * C, N, C, true, false, false, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, L},
        {"fc     dX ", C, N, 4 * C, false, false, false, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, L},
        {"fc     dW ", C, 4 * C, N, false, true, true, 1.0f, CUBLASLT_EPILOGUE_BGRADB, L},
        {"fcproj fwd", C, N, 4 * C, true, false, false, 0.0f, CUBLASLT_EPILOGUE_BIAS, L},
        {"fcproj dX ", 4 * C, N, C, false, false, false, 0.0f, CUBLASLT_EPILOGUE_DGELU, L},
        {"fcproj dW ", 4 * C, C, N, false, true, true, 1.0f, CUBLASLT_EPILOGUE_BGRADB, L},
        {"lmhead fwd", V, N, C, true, false, false, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, 1},
        {"lmhead dX ", C, N, V, false, false, false, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, 1},
        {"lmhead dW ", C, V, N, false, true, true, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, 1},
    };
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return false;
    printf("\nmatmul: the cuBLASLt calls of one GPT-2 d12 step, %d tokens (best of 3 each; m n k, calls per step)\n",
           N);
    printf("%-10s %6s %6s %6s %5s %10s %10s %7s\n", "call", "m", "n", "k", "calls", "bf16 ms", "fp32 ms", "ratio");
    double total_bf16 = 0, total_f32 = 0;
    bool ok = true;
    for (const MatmulBenchCall& c : calls) {
        const double bf16 = matmul_bench_time(lt, c, CUDA_R_16BF), f32 = matmul_bench_time(lt, c, CUDA_R_32F);
        ok = ok && bf16 >= 0 && f32 >= 0;
        total_bf16 += c.count * bf16;
        total_f32 += c.count * f32;
        printf("%-10s %6d %6d %6d %5d %10.2f %10.2f %6.2fx\n", c.name, c.m, c.n, c.k, c.count, bf16 * 1e3, f32 * 1e3,
               bf16 / f32);
    }
    printf("step total (calls x ms)           %10.1f %10.1f %6.2fx\n", total_bf16 * 1e3, total_f32 * 1e3,
           total_bf16 / total_f32);
    cublasLtDestroy(lt);
    if (!ok) printf("a matmul was refused or failed\n");
    return ok;
}

int main() {
    const int N = 4096, C = 768, threads = 256, reps = 5;
    const size_t n = (size_t)N * C;
    std::vector<float> inp(n), weight(C), bias(C), out(n), mean(N), rstd(N), ref(n), ref_mean(N), ref_rstd(N);
    for (size_t i = 0; i < n; i++) inp[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < C; i++) weight[i] = 1.0f + 0.001f * i, bias[i] = 0.01f * (i % 7);

    float *d_inp, *d_w, *d_b, *d_out, *d_mean, *d_rstd;
    cudaMalloc(&d_inp, n * sizeof(float));
    cudaMalloc(&d_out, n * sizeof(float));
    cudaMalloc(&d_w, C * sizeof(float));
    cudaMalloc(&d_b, C * sizeof(float));
    cudaMalloc(&d_mean, N * sizeof(float));
    cudaMalloc(&d_rstd, N * sizeof(float));
    cudaMemcpy(d_inp, inp.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_w, weight.data(), C * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_b, bias.data(), C * sizeof(float), cudaMemcpyHostToDevice);

    const int blocks = (N * 32 + threads - 1) / threads;
    double best_kernel = 1e30, best_cg = 1e30, best_plain = 1e30;
    std::vector<float> out_cg(n);
    for (int r = 0; r < reps; r++) {  // the three take turns
        double t0 = seconds_now();
        layernorm_rows_kernel<true><<<blocks, threads>>>(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        cudaError_t e = cudaDeviceSynchronize();
        double t1 = seconds_now();
        if (e == cudaSuccess) e = cudaMemcpy(out_cg.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost);
        double t2 = seconds_now();
        layernorm_rows_kernel<false><<<blocks, threads>>>(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        double t3 = seconds_now();
        if (e != cudaSuccess) {
            printf("kernel failed: %s\n", cudaGetErrorString(e));
            return 1;
        }
        layernorm_rows_plain(ref.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(), bias.data(), N,
                             C);
        double t4 = seconds_now();
        best_cg = std::min(best_cg, t1 - t0);
        best_kernel = std::min(best_kernel, t3 - t2);
        best_plain = std::min(best_plain, t4 - t3);
    }
    cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = std::max(worst, (double)std::fabs(out[i] - ref[i]));
    const bool cg_same = std::equal(out.begin(), out.end(), out_cg.begin(),
                                    [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; });

    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const double fibers = (double)N * 32, switches = fibers * 11;  // 10 shuffles + exit
    printf("layernorm-shaped kernel, %d rows x %d, one warp per row, %d threads per block\n", N, C, threads);
    printf("device            : %s\n", prop.name);
    printf("kernel            : %8.2f ms  (best of %d; %.0f GPU threads, ~%.1f M fiber switches)\n", best_kernel * 1e3,
           reps, fibers, switches / 1e6);
    printf("plain loop, 1 core: %8.2f ms  (best of %d)\n", best_plain * 1e3, reps);
    printf("max |difference|  : %.2e\n", worst);
    printf("ratio kernel/plain: %.2fx  (goal for the CPU runtime: <= 20x)\n", best_kernel / best_plain);
    printf("with cg::reduce   : %8.2f ms  (best of %d; ~%.1f M fiber switches), %.2fx the plain loop, %.2fx the "
           "shuffles' speed; the same bits: %s\n",
           best_cg * 1e3, reps, fibers * 3 / 1e6, best_cg / best_plain, best_kernel / best_cg, cg_same ? "yes" : "NO");
    const bool elementwise_same = bench_elementwise();
    const bool mma_same = bench_mma();
    const bool matmul_ok = bench_matmul();
    return worst < 1e-4 && cg_same && elementwise_same && mma_same && matmul_ok ? 0 : 1;
}
