// Tensor-core, async-copy and conversion instructions as device functions: inline PTX
// under nvcc; the CPU runtime supplies the same functions (cpucuda_ptx.h), so
// kernels call one set of functions and contain no #if.
//
//   mma_bf16_16816(acc, a, b)  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32:
//                              acc (16x8 fp32) += A (16x16 bf16, row) B (16x8 bf16, col)
//   mma_bf16_16816_x2(acc0, acc1, a, b)  two of them with the same A, in order:
//                              acc0 += A B0, acc1 += A B1; b = B0's registers, then B1's
//                              (the CPU runtime runs both in one meeting of the warp)
//   mma_bf16_16816_x2_ldmatrix<TRANS>(acc0, acc1, a, row)  ldmatrix<4> (TRANS: ldmatrix_trans<4>)
//                              of B0 and B1 at this lane's row address, then
//                              mma_bf16_16816_x2 with them (on the CPU runtime one meeting)
//   mma_bf16_16816_ldmatrix_tiles<TRANS, NP>(acc, a, row_of, first, last)
//                              for each pair np in [first, last) of NP: the above into
//                              acc[2np], acc[2np+1] from this lane's row_of(np) (one meeting)
//   mma_bf16_16816_ldmatrix_ksteps<TRANS, KS, NP>(acc, a_of, row_of, kfirst, klast, first, last)
//                              for each k-step kk in [kfirst, klast) of KS: a_of(kk, a) (this
//                              lane's A fragment), then the above with row_of(kk, np) (on the CPU
//                              runtime every a_of first, then one meeting for all the k-steps)
//   ldmatrix<N>(r, row)        ldmatrix.sync.aligned.m8n8.xN.shared.b16: N 8x8 tiles of
//   ldmatrix_trans<N>(r, row)  b16 from shared memory; lane 8j+i gives row i of tile j
//   ldmatrix_x4_each<K>(r, row_of)  ldmatrix<4>(r[k], row_of(k)) for k = 0 .. K-1, in order
//                              (the CPU runtime runs the K in one meeting of the warp)
//   cp_async_16(dst, src)      cp.async.cg.shared.global, 16 bytes, global -> shared
//   cp_async_commit()          cp.async.commit_group
//   cp_async_wait<N>()         cp.async.wait_group N: all but the N newest groups landed
//   ex2_ftz(x)                 ex2.approx.ftz.f32: 2^x in one MUFU.EX2 (exp2f adds range
//                              fix-ups for subnormals); subnormal inputs and results are 0
//   cvt_rn_bf16(x)             cvt.rn.bf16.f32: x to bf16, to nearest even (a NaN stays a NaN;
//                              0x7fff on the CPU runtime, as the toolkit's host code gives)
//   pack_bf16x2(lo, hi)        cvt.rn.bf16x2.f32: two of them in one register, lo in the low half
//
// Fragments (g = lane / 4, t = lane % 4; the lower-indexed element of a pair
// in the low 16 bits of its register):
//   A: a[0] = A[g][2t,2t+1]  a[1] = A[g+8][2t,2t+1]  a[2] = A[g][2t+8,2t+9]  a[3] = A[g+8][2t+8,2t+9]
//   B: b[0] = B[2t,2t+1][g]  b[1] = B[2t+8,2t+9][g]
//   C: acc = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
//   ldmatrix: r[j] = M_j[g][2t,2t+1];  with .trans r[j] = M_j[2t,2t+1][g]
// So an x4 ldmatrix of a row-major 16x16 bf16 tile (lanes 0-15 give rows
// 0-15 at column 0, lanes 16-31 rows 0-15 at column 8) is exactly an A
// fragment, and of a 16x16 tile of B^T rows (n-major), two B fragments.
#pragma once
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#if defined(CPUCUDA_RUNTIME)
#include <cpucuda_ptx.h>
#else
__device__ __forceinline__ void mma_bf16_16816(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16_16816_x2(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[4]) {
    mma_bf16_16816(acc0, a, {b[0], b[1]});
    mma_bf16_16816(acc1, a, {b[2], b[3]});
}

__device__ __forceinline__ uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int N>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: .x1, .x2 or .x4");
    if constexpr (N == 1)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r[0])
                     : "r"(shared_address(row))
                     : "memory");
    else if constexpr (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(shared_address(row))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(shared_address(row))
                     : "memory");
}
template <int N>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[N], const void* row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: .x1, .x2 or .x4");
    if constexpr (N == 1)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
                     : "=r"(r[0])
                     : "r"(shared_address(row))
                     : "memory");
    else if constexpr (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(shared_address(row))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(shared_address(row))
                     : "memory");
}

template <int K, class RowOf>
__device__ __forceinline__ void ldmatrix_x4_each(uint32_t (&r)[K][4], const RowOf& row_of) {
#pragma unroll
    for (int k = 0; k < K; k++) ldmatrix<4>(r[k], row_of(k));
}

template <bool TRANS>
__device__ __forceinline__ void mma_bf16_16816_x2_ldmatrix(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4],
                                                           const void* row) {
    uint32_t b[4];
    if constexpr (TRANS) ldmatrix_trans<4>(b, row);
    else ldmatrix<4>(b, row);
    mma_bf16_16816_x2(acc0, acc1, a, b);
}

template <bool TRANS, int NP, class RowOf>
__device__ __forceinline__ void mma_bf16_16816_ldmatrix_tiles(float (&acc)[2 * NP][4], const uint32_t (&a)[4],
                                                              const RowOf& row_of, int first, int last) {
#pragma unroll
    for (int np = 0; np < NP; np++) {
        if (np < first || np >= last) continue;
        mma_bf16_16816_x2_ldmatrix<TRANS>(acc[2 * np], acc[2 * np + 1], a, row_of(np));
    }
}

template <bool TRANS, int KS, int NP, class AOf, class RowOf>
__device__ __forceinline__ void mma_bf16_16816_ldmatrix_ksteps(float (&acc)[2 * NP][4], const AOf& a_of,
                                                               const RowOf& row_of, int kfirst, int klast, int first,
                                                               int last) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        if (kk < kfirst || kk >= klast) continue;
        uint32_t a[4];
        a_of(kk, a);
        mma_bf16_16816_ldmatrix_tiles<TRANS, NP>(acc, a, [&](int np) { return row_of(kk, np); }, first, last);
    }
}

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(smem_dst)), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The toolkit's conversions, one instruction each in device code (host code too calls them).
__device__ __host__ __forceinline__ __nv_bfloat16 cvt_rn_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
#endif
