// The PTX instructions of llmc/kernels/ptx.cuh (tensor-core mma.sync, ldmatrix,
// cp.async, ex2.approx.ftz, cvt.rn.bf16) for the CPU runtime: the same functions, with the same
// signatures, emulated exactly as the PTX ISA defines them (README.md,
// "Tensor cores and async copies"). llmc/kernels/ptx.cuh includes this file in the CPU
// build and inline PTX under nvcc; kernels see one set of functions.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cpucuda {
struct MmaOperands {  // one lane's registers of `count` (1 or 2) mma.m16n8k16 with the same A
    const uint32_t* a;
    const uint32_t* b[2];
    float* acc[2];
    int count;
};
struct LdmatrixOperands {  // one lane's row address and destination registers
    const void* row;
    uint32_t* r;
    int num;
    bool trans;
};
const char* mma_m16n8k16_bf16_f32(void* const* io);  // ptx.cpp
const char* ldmatrix_m8n8_b16(void* const* io);
struct LdmatrixEachOperands {  // ldmatrix_x4_each: one lane's operands
    const void* const* rows;   // the lane's row address of each ldmatrix.x4
    uint32_t (*r)[4];          // and its registers
    int count;
};
const char* ldmatrix_x4_each(void* const* io);
struct LdmatrixMmaTilesOperands {  // mma_bf16_16816_ldmatrix_ksteps (and _tiles: one k-step): one lane's operands
    const uint32_t (*a)[4];   // the lane's A fragment of each k-step
    const void* const* rows;  // its ldmatrix row address of pair np at k-step kk: rows[kk * pairs + np]
    float* const* acc;        // 2 per pair: each the lane's 4 accumulators
    int kfirst, klast;        // the k-steps issued: [kfirst, klast)
    int first, last;          // the pairs issued at each: [first, last), within [0, pairs)
    int pairs;
    bool trans;
};
const char* ldmatrix_mma_tiles(void* const* io);
}  // namespace cpucuda

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: acc = A B + acc.
inline void mma_bf16_16816(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    ::cpucuda::MmaOperands io{a, {b, b}, {acc, acc}, 1};
    ::cpucuda::warp_wide("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", ::cpucuda::mma_m16n8k16_bf16_f32, &io);
}
// Two of them with the same A, one after the other: acc0 += A B0, acc1 += A B1
// (b = B0's two registers, then B1's). One meeting of the warp for both: the
// lanes do nothing between the two instructions, so no lane can observe that
// they ran together.
inline void mma_bf16_16816_x2(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
    ::cpucuda::MmaOperands io{a, {&b[0], &b[2]}, {acc0, acc1}, 2};
    ::cpucuda::warp_wide("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (x2)", ::cpucuda::mma_m16n8k16_bf16_f32,
                         &io);
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
template <int N>
inline void ldmatrix(uint32_t (&r)[N], const void* row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: .x1, .x2 or .x4");
    ::cpucuda::LdmatrixOperands io{row, r, N, false};
    ::cpucuda::warp_wide("ldmatrix.sync.aligned.m8n8.shared.b16", ::cpucuda::ldmatrix_m8n8_b16, &io);
}
template <int N>
inline void ldmatrix_trans(uint32_t (&r)[N], const void* row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: .x1, .x2 or .x4");
    ::cpucuda::LdmatrixOperands io{row, r, N, true};
    ::cpucuda::warp_wide("ldmatrix.sync.aligned.m8n8.trans.shared.b16", ::cpucuda::ldmatrix_m8n8_b16, &io);
}

// ldmatrix<4>(r[k], row_of(k)) for k = 0 .. K-1, in order: K instructions in
// one meeting of the warp (the lanes run nothing between them).
template <int K, class RowOf>
inline void ldmatrix_x4_each(uint32_t (&r)[K][4], const RowOf& row_of) {
    const void* rows[K];
    for (int k = 0; k < K; k++) rows[k] = row_of(k);
    ::cpucuda::LdmatrixEachOperands io{rows, r, K};
    ::cpucuda::warp_wide("ldmatrix.sync.aligned.m8n8.x4.shared.b16, each of a run", ::cpucuda::ldmatrix_x4_each, &io);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 of B0 and B1, then
// mma_bf16_16816_x2 with them: the three instructions in one meeting of the
// warp (the B registers are this function's own, so no lane can run code
// between them).
template <bool TRANS>
inline void mma_bf16_16816_x2_ldmatrix(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4], const void* row) {
    const void* rows[1] = {row};
    float* const acc[2] = {acc0, acc1};
    ::cpucuda::LdmatrixMmaTilesOperands io{&a, rows, acc, 0, 1, 0, 1, 1, TRANS};
    ::cpucuda::warp_wide(TRANS ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 + mma.sync (x2)"
                               : "ldmatrix.sync.aligned.m8n8.x4.shared.b16 + mma.sync (x2)",
                         ::cpucuda::ldmatrix_mma_tiles, &io);
}

// For each k-step kk in [kfirst, klast) of KS, in order: a_of(kk, a), this lane's
// A fragment, then, for each pair np in [first, last) of NP,
// mma_bf16_16816_x2_ldmatrix with it into acc[2np], acc[2np+1] from row_of(kk, np).
// Every lane computes all its A fragments first (a_of may itself issue an
// ldmatrix, a meeting of its own), then the k-steps run in one meeting: the
// lanes' code between two k-steps only makes the next A, which no mma reads
// before it, and an mma writes nothing but the lanes' accumulators.
template <bool TRANS, int KS, int NP, class AOf, class RowOf>
inline void mma_bf16_16816_ldmatrix_ksteps(float (&acc)[2 * NP][4], const AOf& a_of, const RowOf& row_of, int kfirst,
                                           int klast, int first, int last) {
    if (kfirst < 0) kfirst = 0;
    if (klast > KS) klast = KS;
    if (first < 0) first = 0;
    if (last > NP) last = NP;
    uint32_t a[KS][4];
    for (int kk = kfirst; kk < klast; kk++) a_of(kk, a[kk]);
    if (kfirst >= klast || first >= last) return;  // no mma issued, as on a GPU: no meeting
    const void* rows[KS * NP] = {};
    float* accs[2 * NP] = {};
    for (int kk = kfirst; kk < klast; kk++)
        for (int np = first; np < last; np++) rows[kk * NP + np] = row_of(kk, np);
    for (int np = first; np < last; np++) {
        accs[2 * np] = acc[2 * np];
        accs[2 * np + 1] = acc[2 * np + 1];
    }
    ::cpucuda::LdmatrixMmaTilesOperands io{a, rows, accs, kfirst, klast, first, last, NP, TRANS};
    ::cpucuda::warp_wide(TRANS ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 + mma.sync (x2), per tile pair, "
                                 "per k-step"
                               : "ldmatrix.sync.aligned.m8n8.x4.shared.b16 + mma.sync (x2), per tile pair, per k-step",
                         ::cpucuda::ldmatrix_mma_tiles, &io);
}

// For each pair np in [first, last) of NP, in order: mma_bf16_16816_x2_ldmatrix
// into acc[2np], acc[2np+1] from this lane's row_of(np); all of them in one
// meeting of the warp (nothing of the lanes' own runs between them): the
// k-steps' operation with the one k-step.
template <bool TRANS, int NP, class RowOf>
inline void mma_bf16_16816_ldmatrix_tiles(float (&acc)[2 * NP][4], const uint32_t (&a)[4], const RowOf& row_of,
                                          int first, int last) {
    mma_bf16_16816_ldmatrix_ksteps<TRANS, 1, NP>(
        acc, [&](int, uint32_t(&out)[4]) { std::memcpy(out, a, sizeof out); }, [&](int, int np) { return row_of(np); },
        0, 1, first, last);
}

// cp.async.cg.shared.global [dst], [src], 16; commit_group; wait_group N.
inline void cp_async_16(void* smem_dst, const void* gmem_src) { ::cpucuda::cp_async(smem_dst, gmem_src, 16); }
inline void cp_async_commit() { ::cpucuda::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
    ::cpucuda::cp_async_wait(N);
}

namespace cpucuda {
// The bits of cvt.rn.bf16.f32: to nearest even, every NaN to 0x7fff - those of
// the toolkit's host __float2bfloat16_rn, without its branches (its rounding
// branch depends on a value's low bits, which no predictor can guess): a
// select, so loops of it vectorise (here and in cublaslt.cpp's epilogues).
inline uint16_t float_to_bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : rounded);
}
}  // namespace cpucuda
// cvt.rn.bf16.f32
inline __nv_bfloat16 cvt_rn_bf16(float x) {
    __nv_bfloat16_raw r;
    r.x = ::cpucuda::float_to_bf16_bits(x);
    return r;
}
// cvt.rn.bf16x2.f32: two of them in one register, lo in the low 16 bits.
inline uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat16_raw l = cvt_rn_bf16(lo), h = cvt_rn_bf16(hi);
    return (uint32_t)l.x | (uint32_t)h.x << 16;
}

// ex2.approx.ftz.f32: 2^x (the ISA's bound is 2 ulp; std::exp2 is within it),
// a subnormal input read as a zero of its sign and a subnormal result flushed
// to +0 (2^x is never negative); -Inf gives +0, +Inf gives +Inf, NaN gives NaN.
inline float ex2_ftz(float x) {
    if (std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.0f, x);
    const float y = std::exp2(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
