// The tensor-core and async-copy primitives of llmc/kernels/ptx.cuh, pinned to the PTX
// ISA's documented register layouts. Each kernel fills and reads fragments by
// the manual's formulas (g = lane / 4, t = lane % 4):
//   mma.m16n8k16 A: a[0] = A[g][2t,2t+1], a[1] = A[g+8][2t,..], a[2] = A[g][2t+8,..], a[3] = A[g+8][2t+8,..]
//                B: b[0] = B[2t,2t+1][g], b[1] = B[2t+8,2t+9][g]
//                C/D: C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
//   ldmatrix m8n8: lane 8j+i gives row i of matrix j; register j of lane l
//                holds M_j[g][2t,2t+1] (.trans: M_j[2t,2t+1][g])
// so a runtime (or a GPU) that used any other layout fails here. Inputs are
// small integers, exact in bf16 and in every fp32 partial sum, so results are
// compared bitwise, on the CPU runtime and on a GPU alike. The cases under
// `#ifdef CPUCUDA` test the runtime's own definitions: mma's sum (in double, k
// in order, one rounding) bit for bit against a plain loop, in both of its
// implementations; poison before a cp.async lands; and reports for misused
// warp-wide instructions.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llmc/kernels/ptx.cuh"
#include "test/test_device.h"
#ifdef CPUCUDA
#include <cpucuda.h>
#endif

typedef __nv_bfloat16 bf16;

__device__ __host__ inline uint32_t pair(bf16 lo, bf16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | (uint32_t)__bfloat16_as_ushort(hi) << 16;
}

// D (16x8, row-major) = A (16x16, row-major) B (16x8, row-major) + C, fragments by the manual;
// block i computes tile i (A, B, C and D tiles packed one after another).
__global__ void mma_kernel(float* D, const bf16* A, const bf16* B, const float* C) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    A += blockIdx.x * 256;
    B += blockIdx.x * 128;
    C += blockIdx.x * 128;
    D += blockIdx.x * 128;
    const uint32_t a[4] = {pair(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                           pair(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                           pair(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                           pair(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
    const uint32_t b[2] = {pair(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                           pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
    float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    mma_bf16_16816(acc, a, b);
    D[g * 8 + 2 * t] = acc[0];
    D[g * 8 + 2 * t + 1] = acc[1];
    D[(g + 8) * 8 + 2 * t] = acc[2];
    D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// mma_bf16_16816_x2: block i computes A_i B_i + C_i into D0 and A_i B_j + C_j into D1,
// j = (i + 1) % tiles, one instruction pair sharing A (tiles packed as in mma_kernel).
__global__ void mma_x2_kernel(float* D0, float* D1, const bf16* A, const bf16* B, const float* C) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4, j = (blockIdx.x + 1) % gridDim.x;
    A += blockIdx.x * 256;
    const bf16* Bs[2] = {B + blockIdx.x * 128, B + j * 128};
    const float* Cs[2] = {C + blockIdx.x * 128, C + j * 128};
    float* Ds[2] = {D0 + blockIdx.x * 128, D1 + blockIdx.x * 128};
    const uint32_t a[4] = {pair(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                           pair(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                           pair(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                           pair(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
    uint32_t b[4];
    float acc[2][4];
    for (int h = 0; h < 2; h++) {
        b[2 * h] = pair(Bs[h][(2 * t) * 8 + g], Bs[h][(2 * t + 1) * 8 + g]);
        b[2 * h + 1] = pair(Bs[h][(2 * t + 8) * 8 + g], Bs[h][(2 * t + 9) * 8 + g]);
        acc[h][0] = Cs[h][g * 8 + 2 * t];
        acc[h][1] = Cs[h][g * 8 + 2 * t + 1];
        acc[h][2] = Cs[h][(g + 8) * 8 + 2 * t];
        acc[h][3] = Cs[h][(g + 8) * 8 + 2 * t + 1];
    }
    mma_bf16_16816_x2(acc[0], acc[1], a, b);
    for (int h = 0; h < 2; h++) {
        Ds[h][g * 8 + 2 * t] = acc[h][0];
        Ds[h][g * 8 + 2 * t + 1] = acc[h][1];
        Ds[h][(g + 8) * 8 + 2 * t] = acc[h][2];
        Ds[h][(g + 8) * 8 + 2 * t + 1] = acc[h][3];
    }
}

// ldmatrix of N 8x8 matrices of 16-bit ids from a padded shared tile: matrix j
// row i lies at smem[(j * 8 + i) * STRIDE + 8 * (j % 2)], so every lane's
// address differs and matrices are not contiguous. out[lane * 4 + j] = r[j].
template <int N, bool TRANS>
__global__ void ldmatrix_kernel(uint32_t* out, const unsigned short* ids) {
    constexpr int STRIDE = 24;  // 48 bytes: rows 16-byte aligned, matrices apart
    __shared__ __align__(16) unsigned short smem[32 * STRIDE];
    for (int e = threadIdx.x; e < 32 * STRIDE; e += 32) smem[e] = 0xDEAD;
    __syncwarp();
    const int lane = threadIdx.x;
    for (int c = 0; c < 8; c++) {  // lane 8j+i writes row i of matrix j
        const int j = lane / 8, i = lane % 8;
        smem[(j * 8 + i) * STRIDE + 8 * (j % 2) + c] = ids[(j * 8 + i) * 8 + c];
    }
    __syncwarp();
    const int j = (lane / 8) % N, i = lane % 8;  // lanes past 8N repeat valid addresses (ignored)
    const unsigned short* row = smem + (j * 8 + i) * STRIDE + 8 * (j % 2);
    uint32_t r[N];
    if constexpr (TRANS) ldmatrix_trans<N>(r, row);
    else ldmatrix<N>(r, row);
    for (int k = 0; k < 4; k++) out[lane * 4 + k] = k < N ? r[k] : 0;
}

// ldmatrix_x4_each<3>: three ldmatrix.x4 from three groups of 4 matrices of 16-bit ids in a
// padded shared tile, group k's matrix j row i at smem[((4k + j) * 8 + i) * STRIDE + 8 * (j % 2)].
// out[(lane * 3 + k) * 4 + j] = r[k][j].
__global__ void ldmatrix_each_kernel(uint32_t* out, const unsigned short* ids) {
    constexpr int STRIDE = 24, K = 3, ROWS = K * 4 * 8;
    __shared__ __align__(16) unsigned short smem[ROWS * STRIDE];
    for (int e = threadIdx.x; e < ROWS * STRIDE; e += 32) smem[e] = 0xDEAD;
    __syncwarp();
    for (int m = threadIdx.x; m < ROWS; m += 32)  // row m = (4k + j) * 8 + i
        for (int c = 0; c < 8; c++) smem[m * STRIDE + 8 * ((m / 8) % 2) + c] = ids[m * 8 + c];
    __syncwarp();
    const int lane = threadIdx.x, j = lane / 8, i = lane % 8;
    uint32_t r[K][4];
    ldmatrix_x4_each<K>(r, [&](int k) { return smem + ((4 * k + j) * 8 + i) * STRIDE + 8 * (j % 2); });
    for (int k = 0; k < K; k++)
        for (int q = 0; q < 4; q++) out[(lane * K + k) * 4 + q] = r[k][q];
}

// The pattern the attention kernels use: A from a row-major 16x16 tile by
// ldmatrix.x4, B from a row-major 16x8 (k x n) tile by ldmatrix.x2.trans.
__global__ void ldmatrix_mma_kernel(float* D, const bf16* A, const bf16* B) {
    __shared__ __align__(16) bf16 sa[16 * 16], sb[16 * 8];
    const int lane = threadIdx.x;
    for (int e = lane; e < 256; e += 32) sa[e] = A[e];
    for (int e = lane; e < 128; e += 32) sb[e] = B[e];
    __syncwarp();
    uint32_t a[4], b[2];
    ldmatrix<4>(a, sa + (lane % 16) * 16 + (lane / 16) * 8);
    ldmatrix_trans<2>(b, sb + (lane % 16) * 8);
    float acc[4] = {0, 0, 0, 0};
    mma_bf16_16816(acc, a, b);
    const int g = lane / 4, t = lane % 4;
    D[g * 8 + 2 * t] = acc[0];
    D[g * 8 + 2 * t + 1] = acc[1];
    D[(g + 8) * 8 + 2 * t] = acc[2];
    D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// cp.async of a 128-element row per thread, two commit groups: out1 is read
// after wait_group 1 (the first group has landed), out2 after wait_group 0.
// `early` reads the second group's destination before it has been waited for.
__global__ void cp_async_kernel(float* out1, float* out2, float* early, const float* src) {
    __shared__ __align__(16) float s[2][64 * 4];
    const int i = threadIdx.x;
    cp_async_16(&s[0][i * 4], src + i * 4);
    cp_async_commit();
    cp_async_16(&s[1][i * 4], src + 256 + i * 4);
    cp_async_commit();
    early[i] = s[1][i * 4];  // undefined on a GPU; poison on the CPU runtime
    cp_async_wait<1>();
    __syncthreads();
    for (int k = 0; k < 4; k++) out1[i * 4 + k] = s[0][(63 - i) * 4 + k];  // another thread's copy
    cp_async_wait<0>();
    __syncthreads();
    for (int k = 0; k < 4; k++) out2[i * 4 + k] = s[1][(63 - i) * 4 + k];
}

// The same without the barrier after the wait: thread i reads what thread 63-i
// copied, which may not have landed (thread 63-i may not have waited yet).
__global__ void cp_async_no_barrier_kernel(float* out, const float* src) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x;
    cp_async_16(&s[i * 4], src + i * 4);  // racecheck-expect: write
    cp_async_commit();
    cp_async_wait<0>();
    out[i] = s[(63 - i) * 4];  // racecheck-expect: read
}

static bf16 bf(float x) { return __float2bfloat16(x); }

// Small integers: every product and partial sum is exact, on any adder tree.
static void test_mma_layout() {
    std::vector<bf16> A(256), B(128);
    std::vector<float> C(128);
    for (int e = 0; e < 256; e++) A[e] = bf((float)((e * 7 + 3) % 9 - 4));
    for (int e = 0; e < 128; e++) B[e] = bf((float)((e * 5 + 1) % 7 - 3));
    for (int e = 0; e < 128; e++) C[e] = (float)((e * 11) % 13 - 6) * 0.5f;
    bf16 *dA = to_device(A), *dB = to_device(B);
    float* dC = to_device(C);
    float* dD;
    CUDA_OK(cudaMalloc(&dD, 128 * sizeof(float)));
    mma_kernel<<<1, 32>>>(dD, dA, dB, dC);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> D = to_host(dD, 128);
    int wrong = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = C[m * 8 + n];
            for (int k = 0; k < 16; k++) s += (double)__bfloat162float(A[m * 16 + k]) * __bfloat162float(B[k * 8 + n]);
            wrong += D[m * 8 + n] != (float)s;
        }
    CHECK(wrong == 0, "mma.m16n8k16 bf16: D = A B + C exactly, fragments by the PTX ISA layout (%d of 128 wrong)",
          wrong);

    // One nonzero A element at a time: D's column block must light up exactly where the layout says.
    int misplaced = 0;
    std::fill(C.begin(), C.end(), 0.0f);
    CUDA_OK(cudaMemcpy(dC, C.data(), 128 * sizeof(float), cudaMemcpyHostToDevice));
    for (int k = 0; k < 128; k++) B[k] = bf((float)(k + 1));  // distinct rows of B
    CUDA_OK(cudaMemcpy(dB, B.data(), 128 * sizeof(bf16), cudaMemcpyHostToDevice));
    for (int m = 0; m < 16; m += 5)
        for (int k = 0; k < 16; k++) {
            std::fill(A.begin(), A.end(), bf(0.0f));
            A[m * 16 + k] = bf(1.0f);
            CUDA_OK(cudaMemcpy(dA, A.data(), 256 * sizeof(bf16), cudaMemcpyHostToDevice));
            mma_kernel<<<1, 32>>>(dD, dA, dB, dC);
            D = to_host(dD, 128);
            for (int r = 0; r < 16; r++)
                for (int n = 0; n < 8; n++) misplaced += D[r * 8 + n] != (r == m ? (float)(k * 8 + n + 1) : 0.0f);
        }
    CHECK(misplaced == 0, "mma: a single A[m][k] = 1 selects row k of B into row m of D (%d wrong)", misplaced);

    // Random bf16 values: the fp32 sum within rounding of the exact one.
    uint64_t s = 12345;
    auto rnd = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((s >> 40) / 8388608.0 - 1.0);
    };
    for (auto& x : A) x = bf(rnd());
    for (auto& x : B) x = bf(rnd());
    for (auto& x : C) x = rnd();
    CUDA_OK(cudaMemcpy(dA, A.data(), 256 * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, B.data(), 128 * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dC, C.data(), 128 * sizeof(float), cudaMemcpyHostToDevice));
    mma_kernel<<<1, 32>>>(dD, dA, dB, dC);
    D = to_host(dD, 128);
    double worst = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double ref = C[m * 8 + n], mag = std::fabs(ref);
            for (int k = 0; k < 16; k++) {
                const double p = (double)__bfloat162float(A[m * 16 + k]) * __bfloat162float(B[k * 8 + n]);
                ref += p;
                mag += std::fabs(p);
            }
            worst = std::fmax(worst, std::fabs(D[m * 8 + n] - ref) / mag);
        }
    CHECK(worst < 1e-6, "mma with random bf16 inputs: fp32 accumulation error %.2e of sum |terms| (< 1e-6)", worst);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
}

// Runs f once for each mma code of the runtime (vector where the CPU has it,
// then portable), with a label naming it; once on a GPU.
template <class F>
static void for_each_mma_code(F f) {
#ifdef CPUCUDA
    const bool saved = cpucuda::set_mma_vector_code(true);
    for (int pass = 0; pass < 2; pass++) {
        const bool vec = cpucuda::set_mma_vector_code(pass == 0);
        if (pass == 0 && !vec) continue;  // this CPU runs the portable code only
        f(vec ? " (vector code)" : " (portable code)");
    }
    cpucuda::set_mma_vector_code(saved);
#else
    f("");
#endif
}

#ifdef CPUCUDA
// The runtime's definition of mma (ptx.cpp): fp32(C + A[m][0] B[0][n] + ... + A[m][15] B[15][n]),
// each addition in double, k in order. `reverse`: k from 15 down (the test's own power check).
static float mma_reference(const bf16* A, const bf16* B, float c, int m, int n, bool reverse = false) {
    double s = c;
    for (int i = 0; i < 16; i++) {
        const int k = reverse ? 15 - i : i;
        s += (double)__bfloat162float(A[m * 16 + k]) * (double)__bfloat162float(B[k * 8 + n]);
    }
    return (float)s;
}

// Random operands of four kinds, by tile (never NaN: which NaN an addition of two passes on is
// the CPU's operand order, not part of the definition): (0) any bf16 / fp32 bits but NaN (subnormals, -0, inf,
// the largest magnitudes); (1) +-2^e for e in -60..60 step 20, so that large terms cancel and
// whether a small one survives depends on the order of the additions; (2) mostly special values
// (+-0, the smallest and largest subnormals and normals, +-inf); (3) values in -1..1 with full
// fp32 accumulators, sums near rounding boundaries.
struct MmaRandom {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    uint32_t next() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (uint32_t)(s >> 32);
    }
    uint16_t bf16_bits(int kind) {
        const uint32_t r = next();
        switch (kind) {
            case 0: {
                const uint16_t h = (uint16_t)r;
                return (h & 0x7F80) == 0x7F80 && (h & 0x7F) ? (uint16_t)(h & 0xFF80) : h;  // NaN -> inf
            }
            case 1: return (uint16_t)((r & 0x8000) | (127 + 20 * (int)((r >> 4) % 7) - 60) << 7 | (r >> 12 & 1));
            case 2: {
                static const uint16_t special[] = {0x0000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0x3F80, 0x0042, 0x7F80};
                const uint16_t h = special[(r >> 8) % 8];
                return (uint16_t)((r & 0x8000) | (h == 0x7F80 && (r >> 20) % 16 ? 0x3F81 : h));  // inf 1 in 16
            }
            default: return __bfloat16_as_ushort(__float2bfloat16((float)((r >> 8) / 8388608.0 - 1.0)));
        }
    }
    float fp32(int kind) {
        uint32_t b = next();
        switch (kind) {
            case 0:
                if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu)) b &= 0xFF800000u;  // NaN -> inf
                break;
            case 1: b = (b & 0x80000000u) | (uint32_t)(127 + 20 * (int)((b >> 4) % 7) - 60) << 23; break;
            case 2: {  // a special value, or one with random low bits (not for inf: that is NaN)
                const uint32_t h = (uint32_t)bf16_bits(2) << 16;
                b = h | ((h & 0x7F800000u) == 0x7F800000u ? 0 : (b & 0xFFFF) * ((b >> 16) % 2));
                break;
            }
            default: {
                const float f = (float)((b >> 8) / 2097152.0 - 4.0);
                std::memcpy(&b, &f, 4);
            }
        }
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
};

// Every output bit of the runtime's mma equals the plain loop's, over many random tiles of every
// kind, in each implementation (vector code where the CPU has it, and the portable code).
static void test_mma_bitwise() {
    const int tiles = 4096;
    MmaRandom rng;
    std::vector<bf16> A(tiles * 256), B(tiles * 128);
    std::vector<float> C(tiles * 128);
    for (int i = 0; i < tiles; i++) {
        for (int e = 0; e < 256; e++) A[i * 256 + e] = __ushort_as_bfloat16(rng.bf16_bits(i % 4));
        for (int e = 0; e < 128; e++) B[i * 128 + e] = __ushort_as_bfloat16(rng.bf16_bits(i % 4));
        for (int e = 0; e < 128; e++) C[i * 128 + e] = rng.fp32(i % 4);
    }
    std::vector<uint32_t> want(tiles * 128);
    int order_sensitive = 0, nonfinite = 0;
    for (int i = 0; i < tiles; i++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                const bf16 *a = &A[i * 256], *b = &B[i * 128];
                const float d = mma_reference(a, b, C[i * 128 + m * 8 + n], m, n);
                want[i * 128 + m * 8 + n] = bits_of(d);
                order_sensitive += bits_of(d) != bits_of(mma_reference(a, b, C[i * 128 + m * 8 + n], m, n, true));
                nonfinite += !std::isfinite(d);
            }
    CHECK(order_sensitive > 100 && nonfinite > 100,
          "the random mma inputs tell the order of the additions apart (%d outputs change with k reversed) and "
          "reach inf and NaN (%d outputs)",
          order_sensitive, nonfinite);
    bf16 *dA = to_device(A), *dB = to_device(B);
    float* dC = to_device(C);
    float* dD;
    CUDA_OK(cudaMalloc(&dD, C.size() * sizeof(float)));
    // the second product of mma_bf16_16816_x2: A_i B_j + C_j, j = (i + 1) % tiles
    std::vector<uint32_t> want_second(tiles * 128);
    for (int i = 0; i < tiles; i++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                const int j = (i + 1) % tiles;
                want_second[i * 128 + m * 8 + n] =
                    bits_of(mma_reference(&A[i * 256], &B[j * 128], C[j * 128 + m * 8 + n], m, n));
            }
    float* dD1;
    CUDA_OK(cudaMalloc(&dD1, C.size() * sizeof(float)));
    auto count_wrong = [](const std::vector<float>& D, const std::vector<uint32_t>& expect) {
        int wrong = 0;
        for (size_t e = 0; e < D.size(); e++) {
            if (bits_of(D[e]) != expect[e] && wrong++ < 3)
                fprintf(stderr, "  tile %zu D[%zu][%zu] = 0x%08x, want 0x%08x\n", e / 128, e % 128 / 8, e % 8,
                        bits_of(D[e]), expect[e]);
        }
        return wrong;
    };
    for_each_mma_code([&](const char* code) {
        mma_kernel<<<tiles, 32>>>(dD, dA, dB, dC);
        CUDA_OK(cudaDeviceSynchronize());
        const int wrong = count_wrong(to_host(dD, C.size()), want);
        CHECK(wrong == 0,
              "mma%s over %d random tiles: every bit of D as fp32(C + sum_k A B) in double, k in order "
              "(%d of %zu wrong)",
              code, tiles, wrong, C.size());
        mma_x2_kernel<<<tiles, 32>>>(dD, dD1, dA, dB, dC);
        CUDA_OK(cudaDeviceSynchronize());
        const int wrong0 = count_wrong(to_host(dD, C.size()), want);
        const int wrong1 = count_wrong(to_host(dD1, C.size()), want_second);
        CHECK(wrong0 == 0 && wrong1 == 0,
              "mma_bf16_16816_x2%s: both products with the one A, every bit as a single mma's "
              "(%d and %d of %zu wrong)",
              code, wrong0, wrong1, C.size());
    });
    cudaFree(dD1);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
}
#endif

template <int N, bool TRANS>
static void check_ldmatrix(const unsigned short* d_ids, const std::vector<unsigned short>& ids) {
    uint32_t* d_out;
    CUDA_OK(cudaMalloc(&d_out, 128 * sizeof(uint32_t)));
    ldmatrix_kernel<N, TRANS><<<1, 32>>>(d_out, d_ids);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint32_t> out = to_host(d_out, 128);
    int wrong = 0;
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < N; j++) {
            auto M = [&](int r, int c) { return (uint32_t)ids[(j * 8 + r) * 8 + c]; };
            const uint32_t want = TRANS ? M(2 * t, g) | M(2 * t + 1, g) << 16 : M(g, 2 * t) | M(g, 2 * t + 1) << 16;
            wrong += out[lane * 4 + j] != want;
        }
    }
    CHECK(wrong == 0, "ldmatrix.m8n8.x%d%s.b16: every lane's registers as the PTX ISA lays them out (%d wrong)", N,
          TRANS ? ".trans" : "", wrong);
    cudaFree(d_out);
}

// mma_bf16_16816_x2_ldmatrix<TRANS>: D (16 x 16, row-major) = A (16 x 16) B (16 x 16) + C,
// the two n8 halves of B read from shared memory by the function's ldmatrix.x4, at the
// row addresses the attention kernels use: TRANS = false, Bs holds B^T (rows n, columns k);
// TRANS = true, Bs holds B (rows k, columns n). Shared rows are 24 elements apart.
template <bool TRANS>
__global__ void ldmatrix_mma_x2_kernel(float* D, const bf16* A, const bf16* Bs, const float* C) {
    __shared__ __align__(16) bf16 sa[16 * 16], sb[16 * 24];
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (int e = lane; e < 256; e += 32) {
        sa[e] = A[e];
        sb[e / 16 * 24 + e % 16] = Bs[e];
    }
    __syncwarp();
    uint32_t a[4];
    ldmatrix<4>(a, sa + (lane % 16) * 16 + (lane / 16) * 8);
    const bf16* row = TRANS ? sb + (((lane / 8) % 2) * 8 + lane % 8) * 24 + (lane / 16) * 8
                            : sb + ((lane / 16) * 8 + lane % 8) * 24 + ((lane / 8) % 2) * 8;
    float acc[2][4];
    for (int h = 0; h < 2; h++) {
        acc[h][0] = C[g * 16 + 8 * h + 2 * t];
        acc[h][1] = C[g * 16 + 8 * h + 2 * t + 1];
        acc[h][2] = C[(g + 8) * 16 + 8 * h + 2 * t];
        acc[h][3] = C[(g + 8) * 16 + 8 * h + 2 * t + 1];
    }
    mma_bf16_16816_x2_ldmatrix<TRANS>(acc[0], acc[1], a, row);
    for (int h = 0; h < 2; h++) {
        D[g * 16 + 8 * h + 2 * t] = acc[h][0];
        D[g * 16 + 8 * h + 2 * t + 1] = acc[h][1];
        D[(g + 8) * 16 + 8 * h + 2 * t] = acc[h][2];
        D[(g + 8) * 16 + 8 * h + 2 * t + 1] = acc[h][3];
    }
}
// Copies A, B and C to the device, runs `launch(D, A, B, C)` and returns D (as many floats as C).
template <class Launch>
static std::vector<float> run_on_abc(const std::vector<bf16>& A, const std::vector<bf16>& B,
                                     const std::vector<float>& C, Launch launch) {
    bf16 *dA = to_device(A), *dB = to_device(B);
    float *dC = to_device(C), *dD;
    CUDA_OK(cudaMalloc(&dD, C.size() * sizeof(float)));
    launch(dD, dA, dB, dC);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> D = to_host(dD, C.size());
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
    return D;
}

template <bool TRANS>
static void check_ldmatrix_mma_x2(const char* code) {
    std::vector<bf16> A(256), Bs(256);
    std::vector<float> C(256);
    for (int e = 0; e < 256; e++) {
        A[e] = bf((float)((e * 13 + 5) % 11 - 5));
        Bs[e] = bf((float)((e * 7 + 3) % 9 - 4));
        C[e] = (float)((e * 5 + 1) % 7 - 3);
    }
    const std::vector<float> D = run_on_abc(A, Bs, C, [](float* dD, const bf16* dA, const bf16* dB, const float* dC) {
        ldmatrix_mma_x2_kernel<TRANS><<<1, 32>>>(dD, dA, dB, dC);
    });
    int wrong = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double s = C[m * 16 + n];  // small integers: exact on any adder
            for (int k = 0; k < 16; k++)
                s += (double)__bfloat162float(A[m * 16 + k]) *
                     __bfloat162float(TRANS ? Bs[k * 16 + n] : Bs[n * 16 + k]);
            wrong += D[m * 16 + n] != (float)s;
        }
    CHECK(wrong == 0,
          "mma_bf16_16816_x2_ldmatrix<%s>%s: ldmatrix.x4%s of both B fragments, then both mmas, exactly (%d of 256 "
          "wrong)",
          TRANS ? "true" : "false", code, TRANS ? ".trans" : "", wrong);
}

// The lane's accumulator fragments of the J n8 tiles of a 16 x 8J fp32 matrix (row-major):
// tile j's acc = M[g][8j+2t], M[g][8j+2t+1], M[g+8][8j+2t], M[g+8][8j+2t+1].
template <int J>
__device__ void c_fragments(float (&acc)[J][4], const float* C) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int j = 0; j < J; j++)
        for (int i = 0; i < 4; i++) acc[j][i] = C[(g + 8 * (i / 2)) * 8 * J + 8 * j + 2 * t + i % 2];
}
template <int J>
__device__ void d_from_fragments(float* D, const float (&acc)[J][4]) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int j = 0; j < J; j++)
        for (int i = 0; i < 4; i++) D[(g + 8 * (i / 2)) * 8 * J + 8 * j + 2 * t + i % 2] = acc[j][i];
}

// mma_bf16_16816_ldmatrix_tiles<TRANS, 3>: D (16 x 48) = A (16 x 16) B (16 x 48) + C for the
// column pairs [first, last) of 16, the others left at C; B in shared memory as B^T (rows n,
// stride 24: a pair's rows 16 x 24 elements further) or, TRANS, as B (rows k, stride 56: a
// pair's columns 16 elements further).
template <bool TRANS>
__global__ void ldmatrix_mma_tiles_kernel(float* D, const bf16* A, const bf16* B, const float* C, int first, int last) {
    constexpr int NP = 3, LDB = TRANS ? 16 * NP + 8 : 24;
    __shared__ __align__(16) bf16 sa[16 * 16], sb[16 * NP * 24];
    const int lane = threadIdx.x;
    for (int e = lane; e < 256; e += 32) sa[e] = A[e];
    for (int e = lane; e < 16 * 16 * NP; e += 32) {  // B[k][n], k < 16, n < 48
        const int k = e / (16 * NP), n = e % (16 * NP);
        sb[TRANS ? k * LDB + n : n * LDB + k] = B[e];
    }
    __syncwarp();
    uint32_t a[4];
    ldmatrix<4>(a, sa + (lane % 16) * 16 + (lane / 16) * 8);
    const bf16* row = TRANS ? sb + (((lane / 8) % 2) * 8 + lane % 8) * LDB + (lane / 16) * 8
                            : sb + ((lane / 16) * 8 + lane % 8) * LDB + ((lane / 8) % 2) * 8;
    float acc[2 * NP][4];
    c_fragments(acc, C);
    const int step = TRANS ? 16 : 16 * LDB;
    mma_bf16_16816_ldmatrix_tiles<TRANS, NP>(acc, a, [&](int np) { return row + np * step; }, first, last);
    d_from_fragments(D, acc);
}
template <bool TRANS>
static void check_ldmatrix_mma_tiles(int first, int last, const char* code) {
    std::vector<bf16> A(256), B(768);
    std::vector<float> C(768);
    for (int e = 0; e < 256; e++) A[e] = bf((float)((e * 13 + 5) % 11 - 5));
    for (int e = 0; e < 768; e++) {
        B[e] = bf((float)((e * 7 + 3) % 9 - 4));
        C[e] = (float)((e * 5 + 1) % 7 - 3);
    }
    const std::vector<float> D = run_on_abc(A, B, C, [&](float* dD, const bf16* dA, const bf16* dB, const float* dC) {
        ldmatrix_mma_tiles_kernel<TRANS><<<1, 32>>>(dD, dA, dB, dC, first, last);
    });
    int wrong = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 48; n++) {
            double s = C[m * 48 + n];  // small integers: exact on any adder
            if (n / 16 >= first && n / 16 < last)
                for (int k = 0; k < 16; k++)
                    s += (double)__bfloat162float(A[m * 16 + k]) * __bfloat162float(B[k * 48 + n]);
            wrong += D[m * 48 + n] != (float)s;
        }
    CHECK(wrong == 0,
          "mma_bf16_16816_ldmatrix_tiles<%s, 3>%s over pairs [%d, %d): those products exactly, the other columns "
          "untouched (%d of 768 wrong)",
          TRANS ? "true" : "false", code, first, last, wrong);
}

// mma_bf16_16816_ldmatrix_ksteps<TRANS, 2, 3>: D (16 x 48) = C + A_0 B_0 + A_1 B_1 over the
// k-steps [kfirst, klast) and the column pairs [first, last) (the other columns left at C), each
// k-step an mma of its own, in order: acc = fp32(acc + A_kk B_kk). A_kk (16 x 16) comes from
// shared memory through a_of, which issues an ldmatrix itself; B_kk (16 x 48) as in
// ldmatrix_mma_tiles_kernel, k-step kk's block after the other's.
template <bool TRANS>
__global__ void ldmatrix_mma_ksteps_kernel(float* D, const bf16* A, const bf16* B, const float* C, int kfirst,
                                           int klast, int first, int last) {
    constexpr int KS = 2, NP = 3, LDB = TRANS ? 16 * NP + 8 : 24, BLOCK = TRANS ? 16 * LDB : 16 * NP * 24;
    __shared__ __align__(16) bf16 sa[KS * 256], sb[KS * 16 * NP * 24];
    const int lane = threadIdx.x;
    for (int e = lane; e < KS * 256; e += 32) sa[e] = A[e];
    for (int e = lane; e < KS * 16 * 16 * NP; e += 32) {  // B_kk[k][n], k < 16, n < 48
        const int kk = e / (256 * NP), k = e % (256 * NP) / (16 * NP), n = e % (16 * NP);
        sb[kk * BLOCK + (TRANS ? k * LDB + n : n * LDB + k)] = B[e];
    }
    __syncwarp();
    const bf16* row = TRANS ? sb + (((lane / 8) % 2) * 8 + lane % 8) * LDB + (lane / 16) * 8
                            : sb + ((lane / 16) * 8 + lane % 8) * LDB + ((lane / 8) % 2) * 8;
    float acc[2 * NP][4];
    c_fragments(acc, C);
    const int step = TRANS ? 16 : 16 * LDB;
    mma_bf16_16816_ldmatrix_ksteps<TRANS, KS, NP>(
        acc, [&](int kk, uint32_t(&a)[4]) { ldmatrix<4>(a, sa + kk * 256 + (lane % 16) * 16 + (lane / 16) * 8); },
        [&](int kk, int np) { return row + kk * BLOCK + np * step; }, kfirst, klast, first, last);
    d_from_fragments(D, acc);
}
// powers: the operands +-2^e (MmaRandom's kind 1: whether a small term survives depends on the
// order of the additions), checked bit for bit against the runtime's definition of mma (CPU
// runtime only); else small integers, exact on any adder.
template <bool TRANS>
static void check_ldmatrix_mma_ksteps(int kfirst, int klast, int first, int last, bool powers, const char* code) {
    std::vector<bf16> A(512), B(1536);
    std::vector<float> C(768);
#ifdef CPUCUDA
    MmaRandom rnd;
#endif
    const auto value = [&](int e, int a, int b, int c) -> bf16 {
#ifdef CPUCUDA
        if (powers) return __ushort_as_bfloat16(rnd.bf16_bits(1));
#endif
        return bf((float)((e * a + b) % c - c / 2));
    };
    for (int e = 0; e < 512; e++) A[e] = value(e, 13, 5, 11);
    for (int e = 0; e < 1536; e++) B[e] = value(e, 7, 3, 9);
    for (int e = 0; e < 768; e++) C[e] = __bfloat162float(value(e, 5, 1, 7));
    const std::vector<float> D = run_on_abc(A, B, C, [&](float* dD, const bf16* dA, const bf16* dB, const float* dC) {
        ldmatrix_mma_ksteps_kernel<TRANS><<<1, 32>>>(dD, dA, dB, dC, kfirst, klast, first, last);
    });
    int wrong = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 48; n++) {
            float acc = C[m * 48 + n];
            if (n / 16 >= first && n / 16 < last)
                for (int kk = kfirst; kk < klast; kk++) {  // one mma per k-step: its sum in double, k in order
                    double s = acc;
                    for (int k = 0; k < 16; k++)
                        s += (double)__bfloat162float(A[kk * 256 + m * 16 + k]) *
                             __bfloat162float(B[kk * 768 + k * 48 + n]);
                    acc = (float)s;
                }
            wrong += std::memcmp(&D[m * 48 + n], &acc, 4) != 0;
        }
    CHECK(wrong == 0,
          "mma_bf16_16816_ldmatrix_ksteps<%s, 2, 3>%s over k-steps [%d, %d) and pairs [%d, %d)%s: each k-step's "
          "mmas after the last one's, A from its own ldmatrix, the other columns untouched (%d of 768 wrong)",
          TRANS ? "true" : "false", code, kfirst, klast, first, last, powers ? ", operands +-2^e, bit for bit" : "",
          wrong);
}

static void test_ldmatrix() {
    std::vector<unsigned short> ids(256);
    for (int e = 0; e < 256; e++) ids[e] = (unsigned short)(0x100 + e);  // matrix j row r col c: 0x100 + 64j + 8r + c
    unsigned short* d_ids = to_device(ids);
    check_ldmatrix<1, false>(d_ids, ids);
    check_ldmatrix<2, false>(d_ids, ids);
    check_ldmatrix<4, false>(d_ids, ids);
    check_ldmatrix<1, true>(d_ids, ids);
    check_ldmatrix<2, true>(d_ids, ids);
    check_ldmatrix<4, true>(d_ids, ids);
    cudaFree(d_ids);
    {
        std::vector<unsigned short> ids3(768);  // group k, matrix j, row r, col c: 0x1000 + 256k + 64j + 8r + c
        for (int e = 0; e < 768; e++) ids3[e] = (unsigned short)(0x1000 + e);
        unsigned short* d_ids3 = to_device(ids3);
        uint32_t* d_out;
        CUDA_OK(cudaMalloc(&d_out, 384 * sizeof(uint32_t)));
        ldmatrix_each_kernel<<<1, 32>>>(d_out, d_ids3);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint32_t> out = to_host(d_out, 384);
        int wrong = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int k = 0; k < 3; k++)
                for (int j = 0; j < 4; j++) {
                    const int g = lane / 4, t = lane % 4, m0 = (4 * k + j) * 8;
                    const uint32_t want = ids3[(m0 + g) * 8 + 2 * t] | (uint32_t)ids3[(m0 + g) * 8 + 2 * t + 1] << 16;
                    wrong += out[(lane * 3 + k) * 4 + j] != want;
                }
        CHECK(wrong == 0,
              "ldmatrix_x4_each<3>: each ldmatrix.x4 from its own rows, registers as the PTX ISA lays them out "
              "(%d of 384 wrong)",
              wrong);
        cudaFree(d_out);
        cudaFree(d_ids3);
    }

    std::vector<bf16> A(256), B(128);
    for (int e = 0; e < 256; e++) A[e] = bf((float)((e * 13 + 5) % 11 - 5));
    for (int e = 0; e < 128; e++) B[e] = bf((float)((e * 3 + 2) % 9 - 4));
    bf16 *dA = to_device(A), *dB = to_device(B);
    float* dD;
    CUDA_OK(cudaMalloc(&dD, 128 * sizeof(float)));
    ldmatrix_mma_kernel<<<1, 32>>>(dD, dA, dB);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> D = to_host(dD, 128);
    int wrong = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += (double)__bfloat162float(A[m * 16 + k]) * __bfloat162float(B[k * 8 + n]);
            wrong += D[m * 8 + n] != (float)s;
        }
    CHECK(wrong == 0, "ldmatrix.x4 (A, row-major) + ldmatrix.x2.trans (B, k x n row-major) feed mma exactly (%d wrong)",
          wrong);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    for_each_mma_code([](const char* code) {
        check_ldmatrix_mma_x2<false>(code);
        check_ldmatrix_mma_x2<true>(code);
        for (int first = 0; first < 3; first++)
            for (int last = first + 1; last <= 3; last++) {
                check_ldmatrix_mma_tiles<false>(first, last, code);
                check_ldmatrix_mma_tiles<true>(first, last, code);
            }
        for (const int* r : {(const int[4]){0, 2, 0, 3}, (const int[4]){1, 2, 1, 3}}) {
            check_ldmatrix_mma_ksteps<false>(r[0], r[1], r[2], r[3], false, code);
            check_ldmatrix_mma_ksteps<true>(r[0], r[1], r[2], r[3], false, code);
        }
#ifdef CPUCUDA
        check_ldmatrix_mma_ksteps<false>(0, 2, 0, 3, true, code);
        check_ldmatrix_mma_ksteps<true>(0, 2, 0, 3, true, code);
#endif
    });
}

static bool is_poison(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b == 0xFFFFFFFFu;
}

static void test_cp_async() {
    std::vector<float> src(512);
    for (int e = 0; e < 512; e++) src[e] = (float)e;
    float* d_src = to_device(src);
    float *d1, *d2, *de;
    CUDA_OK(cudaMalloc(&d1, 256 * sizeof(float)));
    CUDA_OK(cudaMalloc(&d2, 256 * sizeof(float)));
    CUDA_OK(cudaMalloc(&de, 64 * sizeof(float)));
    cp_async_kernel<<<1, 64>>>(d1, d2, de, d_src);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> o1 = to_host(d1, 256), o2 = to_host(d2, 256), early = to_host(de, 64);
    int wrong = 0;
    for (int i = 0; i < 64; i++)
        for (int k = 0; k < 4; k++) {
            wrong += o1[i * 4 + k] != src[(63 - i) * 4 + k];
            wrong += o2[i * 4 + k] != src[256 + (63 - i) * 4 + k];
        }
    CHECK(wrong == 0, "cp.async 16 B in two commit groups: wait_group 1 lands the first, wait_group 0 both (%d wrong)",
          wrong);
#ifdef CPUCUDA
    int poisoned = 0;
    for (float x : early) poisoned += is_poison(x);
    CHECK(poisoned == 64, "CPU runtime: a cp.async destination read before its wait_group holds poison (%d of 64)",
          poisoned);
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, 64 * sizeof(float)));
    cp_async_no_barrier_kernel<<<1, 64>>>(d_out, d_src);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> out = to_host(d_out, 64);
    int stale = 0;
    for (int i = 0; i < 64; i++) stale += out[i] != src[(63 - i) * 4];
    CHECK(stale > 0, "CPU runtime: a missing __syncthreads after cp.async.wait_group shows (%d of 64 reads wrong)",
          stale);
    cudaFree(d_out);
#endif
    cudaFree(d_src);
    cudaFree(d1);
    cudaFree(d2);
    cudaFree(de);
}

// ex2.approx.ftz.f32 of each input.
__global__ void ex2_kernel(float* out, const float* in, int n) {
    const int i = threadIdx.x;
    if (i < n) out[i] = ex2_ftz(in[i]);
}

// Exact powers of two within the ISA's 2 ulp, and the flush to zero: 2^-127 is
// subnormal (exp2f gives it, ex2.approx.ftz gives +0), and a subnormal input
// reads as 0 (2^0 = 1).
// cvt_rn_bf16 and pack_bf16x2 in a kernel, against the toolkit's host __float2bfloat16_rn: every
// sign and exponent with the low 16 bits at the rounding's edges (ties, just below and above),
// and random bits. A NaN must give 0x7fff on the CPU runtime (as the toolkit's host code) and a
// NaN on a GPU.
__global__ void cvt_kernel(unsigned short* one, uint32_t* two, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __nv_bfloat16_raw r = cvt_rn_bf16(x[i]);
    one[i] = r.x;
    two[i] = pack_bf16x2(x[i], x[n - 1 - i]);
}
static void test_cvt() {
    std::vector<float> x;
    const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000};
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (uint32_t lo : lows) x.push_back(float_of(hi << 16 | lo));
    uint32_t state = 12345;
    for (int i = 0; i < (1 << 20); i++) {
        state = state * 1664525u + 1013904223u;
        x.push_back(float_of(state ^ (state >> 13)));
    }
    const int n = (int)x.size();
    float* dx = to_device(x);
    unsigned short* d_one;
    uint32_t* d_two;
    CUDA_OK(cudaMalloc(&d_one, n * sizeof(unsigned short)));
    CUDA_OK(cudaMalloc(&d_two, n * sizeof(uint32_t)));
    cvt_kernel<<<(n + 255) / 256, 256>>>(d_one, d_two, dx, n);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned short> one = to_host(d_one, n);
    const std::vector<uint32_t> two = to_host(d_two, n);
    auto agrees = [](unsigned short got, float v) {
        const unsigned short want = __bfloat16_as_ushort(__float2bfloat16_rn(v));
#ifdef CPUCUDA
        return got == want;
#else
        return std::isnan(v) ? (got & 0x7fffu) > 0x7f80u : got == want;
#endif
    };
    int wrong_one = 0, wrong_two = 0, nans = 0, ties = 0;
    for (int i = 0; i < n; i++) {
        nans += std::isnan(x[i]);
        ties += (bits_of(x[i]) & 0xffffu) == 0x8000u;
        wrong_one += !agrees(one[i], x[i]);
        wrong_two += !agrees((unsigned short)two[i], x[i]) || !agrees((unsigned short)(two[i] >> 16), x[n - 1 - i]);
    }
    CHECK(wrong_one == 0 && nans > 0 && ties > 0,
          "cvt_rn_bf16: the toolkit's host __float2bfloat16_rn bits for %d inputs, %d ties and %d NaN among them "
          "(%d wrong)",
          n, ties, nans, wrong_one);
    CHECK(wrong_two == 0, "pack_bf16x2: both conversions, lo in the low half (%d of %d wrong)", wrong_two, n);
    cudaFree(dx);
    cudaFree(d_one);
    cudaFree(d_two);
}

static void test_ex2_ftz() {
    const float inf = INFINITY;
    const std::vector<float> in = {0.0f,    1.0f, -1.0f,  10.0f,   -126.0f, 0.5f, -127.0f,
                                   -149.5f, -inf, 1e-40f, -1e-40f, 128.0f,  inf};
    const std::vector<double> want = {1, 2, 0.5, 1024, std::ldexp(1.0, -126), std::sqrt(2.0), 0, 0, 0, 1, 1, inf, inf};
    float* d_in = to_device(in);
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, in.size() * sizeof(float)));
    ex2_kernel<<<1, 32>>>(d_out, d_in, (int)in.size());
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> out = to_host(d_out, in.size());
    int wrong = 0;
    for (size_t i = 0; i < in.size(); i++) {
        const bool exact = want[i] == 0 || std::isinf(want[i]);
        const bool ok = exact ? (double)out[i] == want[i] && !std::signbit(out[i])
                              : std::fabs(out[i] - want[i]) <= 2 * std::ldexp(want[i], -23);
        if (!ok) fprintf(stderr, "  ex2.approx.ftz(%g) = %g, want %g\n", in[i], out[i], want[i]);
        wrong += !ok;
    }
    CHECK(wrong == 0,
          "ex2.approx.ftz.f32: 2^x within 2 ulp, subnormal inputs and results flushed to +0 (%d of %zu wrong)", wrong,
          in.size());
    cudaFree(d_in);
    cudaFree(d_out);
}

#ifdef CPUCUDA
// Misuse that a GPU leaves undefined; the runtime reports it.
__global__ void half_warp_mma_kernel(float* out) {
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float acc[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) mma_bf16_16816(acc, a, b);
    out[threadIdx.x] = acc[0];
}
__global__ void misaligned_ldmatrix_kernel(uint32_t* out) {
    __shared__ __align__(16) unsigned short s[8 * 16];
    for (int e = threadIdx.x; e < 128; e += 32) s[e] = (unsigned short)e;
    __syncwarp();
    uint32_t r[1];
    ldmatrix<1>(r, s + (threadIdx.x % 8) * 16 + 1);  // 2 bytes off
    out[threadIdx.x] = r[0];
}
__global__ void mma_vs_ldmatrix_kernel(uint32_t* out) {
    __shared__ __align__(16) unsigned short s[8 * 8];
    for (int e = threadIdx.x; e < 64; e += 32) s[e] = (unsigned short)e;
    __syncwarp();
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float acc[4] = {0, 0, 0, 0};
    uint32_t r[1] = {0};
    if (threadIdx.x == 5) mma_bf16_16816(acc, a, b);
    else ldmatrix<1>(r, s + (threadIdx.x % 8) * 8);
    out[threadIdx.x] = r[0] + (uint32_t)acc[0];
}

__global__ void mma_x2_vs_mma_kernel(float* out) {  // lane 7 issues one mma, the others two
    uint32_t a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
    float acc[2][4] = {};
    if (threadIdx.x == 7) mma_bf16_16816(acc[0], a, {b[0], b[1]});
    else mma_bf16_16816_x2(acc[0], acc[1], a, b);
    out[threadIdx.x] = acc[0][0] + acc[1][0];
}

__global__ void tiles_disagree_kernel(float* out) {  // lane 3 issues two tile pairs, the others three
    __shared__ __align__(16) bf16 sb[48 * 24];
    for (int e = threadIdx.x; e < 48 * 24; e += 32) sb[e] = __float2bfloat16(0.0f);
    __syncwarp();
    uint32_t a[4] = {0, 0, 0, 0};
    float acc[6][4] = {};
    const bf16* row = sb + (threadIdx.x % 16) * 24;
    mma_bf16_16816_ldmatrix_tiles<false, 3>(
        acc, a, [&](int np) { return row + np * 16 * 24; }, 0, threadIdx.x == 3 ? 2 : 3);
    out[threadIdx.x] = acc[0][0];
}

__global__ void ksteps_disagree_kernel(float* out) {  // lane 9 issues one k-step, the others two
    __shared__ __align__(16) bf16 sb[48 * 24];
    for (int e = threadIdx.x; e < 48 * 24; e += 32) sb[e] = __float2bfloat16(0.0f);
    __syncwarp();
    float acc[6][4] = {};
    const bf16* row = sb + (threadIdx.x % 16) * 24;
    mma_bf16_16816_ldmatrix_ksteps<false, 2, 3>(
        acc, [](int, uint32_t(&a)[4]) { a[0] = a[1] = a[2] = a[3] = 0; },
        [&](int kk, int np) { return row + np * 16 * 24 + kk * 16; }, 0, threadIdx.x == 9 ? 1 : 2, 0, 3);
    out[threadIdx.x] = acc[0][0];
}

__global__ void each_disagree_kernel(uint32_t* out) {  // lane 5 issues two ldmatrix.x4, the others three
    __shared__ __align__(16) unsigned short s[32 * 8];
    for (int e = threadIdx.x; e < 32 * 8; e += 32) s[e] = 0;
    __syncwarp();
    const unsigned short* row = s + threadIdx.x * 8;
    uint32_t r[3][4] = {};
    if (threadIdx.x == 5) ldmatrix_x4_each<2>(reinterpret_cast<uint32_t(&)[2][4]>(r), [&](int) { return row; });
    else ldmatrix_x4_each<3>(r, [&](int) { return row; });
    out[threadIdx.x] = r[0][0];
}

static bool contains(const char* s, const char* sub) { return s && std::strstr(s, sub); }

template <class F>
static const char* failure_of(F launch) {
    launch();
    cudaError_t e = cudaDeviceSynchronize();
    cudaGetLastError();
    return e == cudaErrorLaunchFailure ? cpucuda::last_kernel_failure() : "";
}

static void test_misuse() {
    uint32_t* d;
    CUDA_OK(cudaMalloc(&d, 64 * sizeof(uint32_t)));
    const char* msg = failure_of([&] { half_warp_mma_kernel<<<1, 32>>>((float*)d); });
    CHECK(contains(msg, "mma.sync") && contains(msg, "has exited"),
          "mma.sync reached by half a warp is reported: \"%s\"", msg);
    msg = failure_of([&] { half_warp_mma_kernel<<<1, 16>>>((float*)d); });
    CHECK(contains(msg, "needs all 32 lanes"), "mma.sync in a 16-thread block is reported: \"%s\"", msg);
    msg = failure_of([&] { misaligned_ldmatrix_kernel<<<1, 32>>>(d); });
    CHECK(contains(msg, "ldmatrix") && contains(msg, "16-byte aligned"),
          "a misaligned ldmatrix row is reported: \"%s\"", msg);
    msg = failure_of([&] { mma_vs_ldmatrix_kernel<<<1, 32>>>(d); });
    CHECK(contains(msg, "mma.sync") && contains(msg, "ldmatrix"),
          "lanes at different warp-wide instructions are reported: \"%s\"", msg);
    msg = failure_of([&] { mma_x2_vs_mma_kernel<<<1, 32>>>((float*)d); });
    CHECK(contains(msg, "mma.sync") && contains(msg, "number of mmas"),
          "one lane at a single mma while the others issue two is reported: \"%s\"", msg);
    msg = failure_of([&] { tiles_disagree_kernel<<<1, 32>>>((float*)d); });
    CHECK(contains(msg, "per tile pair") && contains(msg, "disagree on the tile pairs"),
          "lanes that issue different tile pairs are reported: \"%s\"", msg);
    msg = failure_of([&] { ksteps_disagree_kernel<<<1, 32>>>((float*)d); });
    CHECK(contains(msg, "per k-step") && contains(msg, "disagree on the k-steps"),
          "lanes that issue different k-steps are reported: \"%s\"", msg);
    msg = failure_of([&] { each_disagree_kernel<<<1, 32>>>(d); });
    CHECK(contains(msg, "each of a run") && contains(msg, "number of ldmatrix"),
          "lanes that issue different numbers of ldmatrix.x4 in one run are reported: \"%s\"", msg);
    cudaFree(d);
}
#endif

int main() {
    TEST_CASE(test_mma_layout());
#ifdef CPUCUDA
    TEST_CASE(test_mma_bitwise());
#endif
    TEST_CASE(test_ldmatrix());
    TEST_CASE(test_cp_async());
    TEST_CASE(test_ex2_ftz());
    TEST_CASE(test_cvt());
#ifdef CPUCUDA
    TEST_CASE(test_misuse());
#endif
    return test_summary("test_ptx");
}
