// The warp-wide PTX instructions of cpucuda_ptx.h, run once per warp by the
// scheduler when all 32 lanes have arrived (runtime.cpp, warp_wide). Register
// layouts are the PTX ISA's ("Matrix fragments for mma.m16n8k16 with floating
// point type", "Warp-level matrix load instruction: ldmatrix"), with
//   g = lane / 4 (groupID), t = lane % 4 (threadID_in_group),
// and in every 32-bit register the element of lower index in the low 16 bits.
#include <cpucuda_ptx.h>

#include <atomic>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpucuda.h"
#include "internal.h"

namespace cpucuda {

// D = A B + C for A 16x16 (row), B 16x8 (col), C and D 16x8, fp32 accumulators:
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   acc  = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// Numerics: every product of two bf16 is exact in double (8-bit significands,
// exponents far inside double's range); the emulation computes
//   D[m][n] = fp32(((C[m][n] + A[m][0] B[0][n]) + A[m][1] B[1][n]) + ... + A[m][15] B[15][n])
// with each addition rounded in double, k in order, and one rounding to fp32,
// round-to-nearest-even. The hardware's adder tree is not documented: it may
// truncate aligned addends and round differently in the last bit or two; no
// test here depends on bits the PTX ISA does not define. (Which payload a sum
// of two NaNs keeps is the CPU's operand order, not part of the definition.)
//
// Speed (it runs once per mma of every warp): in each group g the 4 lanes'
// registers hold whole rows - a[0] of lanes 4g..4g+3 is A[g][0..7] in memory
// order, b[0] is column g of B (k = 0..7) - so gathering is copying 32-bit
// words (and a transpose for B); then every row of D is C's row plus
// A[m][k] times row k of B (8 doubles), k in order: a broadcast times a
// vector, no gathers in the loop. A is gathered and widened once for all the
// mmas of one meeting that share it (MmasSharingA: widen_a_*, then an mma_* per product).
// With AVX2 and FMA (chosen at run time; the binary stays portable) the
// gathers are done in registers (SSE2 unpacks) and the sum is one fused
// multiply-add per 4 elements: the product is exact, so fma(a, b, c) rounds
// exactly as a b + c does. Rows go 4 (portable: 2) at a time so that 8
// independent chains of additions stay in registers.
// test_ptx checks both versions bit for bit against a plain loop.
static inline double bf16_to_double(uint16_t h) {
    float f;
    const uint32_t b = (uint32_t)h << 16;
    std::memcpy(&f, &b, 4);
    return f;
}

typedef double WideA[16][16];  // A[m][k], widened to double
struct MmaLanes {              // the B operand and the accumulators of one mma, lane by lane
    const uint32_t* b[32];     // each lane's B registers, or (from_rows) B straight from shared memory:
    const uint16_t* rows[16];  // rows[8h + i], 8 bf16: with n_major column i of B for k = 8h..8h+7
                               // (what ldmatrix without .trans reads), else row 8h + i of B (.trans)
    bool from_rows = false, n_major = false;
    float* acc[32];
};

typedef double V2 __attribute__((vector_size(16)));  // 2 doubles

// Portable version: plain loops, the sums in vectors of 2 doubles (SSE2).
static void widen_a_portable(const uint32_t* const* a, WideA& A) {
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; r++) {  // a[r]: row g + 8 (r % 2), columns 2t + 8 (r / 2) and the next
            double* dst = &A[g + 8 * (r % 2)][2 * t + 8 * (r / 2)];
            dst[0] = bf16_to_double((uint16_t)a[lane][r]);
            dst[1] = bf16_to_double((uint16_t)(a[lane][r] >> 16));
        }
    }
}

static void mma_portable(const WideA& A, const MmaLanes& l) {
    uint16_t B16[16][8];  // bf16 bits, B[k][n]
    float C32[16][8];
    if (l.from_rows)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 8; i++)
                for (int c = 0; c < 8; c++) {
                    const uint16_t v = l.rows[8 * h + i][c];
                    if (l.n_major) B16[8 * h + c][i] = v;
                    else B16[8 * h + i][c] = v;
                }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        if (!l.from_rows)
            for (int h = 0; h < 2; h++) {
                B16[2 * t + 8 * h][g] = (uint16_t)l.b[lane][h];
                B16[2 * t + 8 * h + 1][g] = (uint16_t)(l.b[lane][h] >> 16);
            }
        std::memcpy(&C32[g][2 * t], &l.acc[lane][0], 8);
        std::memcpy(&C32[g + 8][2 * t], &l.acc[lane][2], 8);
    }
    V2 B[16][4];  // row k of B, n = 2j, 2j+1
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 4; j++) B[k][j] = V2{bf16_to_double(B16[k][2 * j]), bf16_to_double(B16[k][2 * j + 1])};
    for (int m = 0; m < 16; m += 2) {  // 2 rows at a time: 8 independent chains in registers
        V2 acc[2][4];
#pragma GCC unroll 16
        for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
            for (int j = 0; j < 4; j++) acc[r][j] = V2{C32[m + r][2 * j], C32[m + r][2 * j + 1]};
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
#pragma GCC unroll 16
            for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
                for (int j = 0; j < 4; j++) acc[r][j] += A[m + r][k] * B[k][j];
#pragma GCC unroll 16
        for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
            for (int j = 0; j < 4; j++) {
                C32[m + r][2 * j] = (float)acc[r][j][0];
                C32[m + r][2 * j + 1] = (float)acc[r][j][1];
            }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        std::memcpy(&l.acc[lane][0], &C32[g][2 * t], 8);
        std::memcpy(&l.acc[lane][2], &C32[g + 8][2 * t], 8);
    }
}

#if defined(__x86_64__)
// 8x8 16-bit transpose (SSE2): out[c] = column c of rows r[0..7].
static inline void transpose8x8_16(const __m128i* r, __m128i* out) {
    __m128i t[8], u[8];
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);  // columns 0..3 of rows 2i, 2i+1
        t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 16
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 16
        for (int q = 0; q < 2; q++) {  // rows 4q..4q+3: u[4h + 2q] columns 4h, 4h+1; u[4h + 2q + 1] 4h+2, 4h+3
            u[4 * h + 2 * q] = _mm_unpacklo_epi32(t[4 * q + h], t[4 * q + 2 + h]);
            u[4 * h + 2 * q + 1] = _mm_unpackhi_epi32(t[4 * q + h], t[4 * q + 2 + h]);
        }
#pragma GCC unroll 16
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 16
        for (int p = 0; p < 2; p++) {
            out[4 * h + 2 * p] = _mm_unpacklo_epi64(u[4 * h + p], u[4 * h + 2 + p]);
            out[4 * h + 2 * p + 1] = _mm_unpackhi_epi64(u[4 * h + p], u[4 * h + 2 + p]);
        }
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPUCUDA_MMA_AVX2 1
#define AVX2 __attribute__((target("avx2,fma")))
// 8 bf16 -> 8 doubles (two vectors of 4): the bits in the high half of an fp32, then widened.
AVX2 static inline void bf16x8_to_double(__m128i h, __m256d* out) {
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    out[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
    out[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}

AVX2 static void widen_a_avx2(const uint32_t* const* a, WideA& A) {
#pragma GCC unroll 16
    for (int g = 0; g < 8; g++) {
        // lane t's a[0..3]: A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]
        __m128i q[4];
#pragma GCC unroll 16
        for (int t = 0; t < 4; t++) q[t] = _mm_loadu_si128((const __m128i*)a[4 * g + t]);
        const __m128i x0 = _mm_unpacklo_epi32(q[0], q[1]), x1 = _mm_unpacklo_epi32(q[2], q[3]);
        const __m128i x2 = _mm_unpackhi_epi32(q[0], q[1]), x3 = _mm_unpackhi_epi32(q[2], q[3]);
        __m256d v[2];
        const __m128i rows[4] = {_mm_unpacklo_epi64(x0, x1), _mm_unpacklo_epi64(x2, x3), _mm_unpackhi_epi64(x0, x1),
                                 _mm_unpackhi_epi64(x2, x3)};  // A[g][0..7], A[g][8..15], A[g+8][0..7], A[g+8][8..15]
#pragma GCC unroll 16
        for (int i = 0; i < 4; i++) {
            bf16x8_to_double(rows[i], v);
            double* dst = &A[g + 8 * (i / 2)][8 * (i % 2)];
            _mm256_storeu_pd(dst, v[0]);
            _mm256_storeu_pd(dst + 4, v[1]);
        }
    }
}

AVX2 static void mma_avx2(const WideA& A, const MmaLanes& l) {
    __m256d B[16][2], C[16][2];  // rows of B and C, n = 0..3 and 4..7
    if (l.from_rows && !l.n_major) {  // the rows are B's rows
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) bf16x8_to_double(_mm_loadu_si128((const __m128i*)l.rows[k]), B[k]);
    } else {
        __m128i bt[2][8];  // bt[h][n] = B[8h..8h+7][n] (bf16): B's columns
#pragma GCC unroll 16
        for (int g = 0; g < 8; g++) {
            if (l.from_rows) {
                bt[0][g] = _mm_loadu_si128((const __m128i*)l.rows[g]);
                bt[1][g] = _mm_loadu_si128((const __m128i*)l.rows[8 + g]);
                continue;
            }
            // lane t's b[0..1]: B[2t..2t+1][g], B[2t+8..2t+9][g]: column g of B
            const uint32_t* const* b = &l.b[4 * g];
            __m128i bv[4];
#pragma GCC unroll 16
            for (int t = 0; t < 4; t++) bv[t] = _mm_loadl_epi64((const __m128i*)b[t]);
            const __m128i y0 = _mm_unpacklo_epi32(bv[0], bv[1]), y1 = _mm_unpacklo_epi32(bv[2], bv[3]);
            bt[0][g] = _mm_unpacklo_epi64(y0, y1);
            bt[1][g] = _mm_unpackhi_epi64(y0, y1);
        }
#pragma GCC unroll 16
        for (int h = 0; h < 2; h++) {
            __m128i rows[8];
            transpose8x8_16(bt[h], rows);
#pragma GCC unroll 16
            for (int k = 0; k < 8; k++) bf16x8_to_double(rows[k], B[8 * h + k]);
        }
    }
#pragma GCC unroll 16
    for (int g = 0; g < 8; g++) {
        // lane t's acc: C[g][2t..2t+1], C[g+8][2t..2t+1]
        float* const* acc = &l.acc[4 * g];
        __m128i c[4];
#pragma GCC unroll 16
        for (int t = 0; t < 4; t++) c[t] = _mm_loadu_si128((const __m128i*)acc[t]);
        C[g][0] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi64(c[0], c[1])));
        C[g][1] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi64(c[2], c[3])));
        C[g + 8][0] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi64(c[0], c[1])));
        C[g + 8][1] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi64(c[2], c[3])));
    }
    __m128 D[16][2];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m += 4) {  // 4 rows at a time: 8 independent chains
        __m256d acc[4][2];
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++) {
            acc[r][0] = C[m + r][0];
            acc[r][1] = C[m + r][1];
        }
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
#pragma GCC unroll 16
            for (int r = 0; r < 4; r++) {
                const __m256d a = _mm256_broadcast_sd(&A[m + r][k]);
                acc[r][0] = _mm256_fmadd_pd(a, B[k][0], acc[r][0]);
                acc[r][1] = _mm256_fmadd_pd(a, B[k][1], acc[r][1]);
            }
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++) {
            D[m + r][0] = _mm256_cvtpd_ps(acc[r][0]);
            D[m + r][1] = _mm256_cvtpd_ps(acc[r][1]);
        }
    }
#pragma GCC unroll 16
    for (int g = 0; g < 8; g++) {  // lane t: D[g][2t..2t+1], D[g+8][2t..2t+1]
        const __m128i lo[2] = {_mm_castps_si128(D[g][0]), _mm_castps_si128(D[g][1])};
        const __m128i hi[2] = {_mm_castps_si128(D[g + 8][0]), _mm_castps_si128(D[g + 8][1])};
#pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            const __m128i r = t % 2 ? _mm_unpackhi_epi64(lo[t / 2], hi[t / 2])
                                    : _mm_unpacklo_epi64(lo[t / 2], hi[t / 2]);
            _mm_storeu_si128((__m128i*)l.acc[4 * g + t], r);
        }
    }
}
#undef AVX2
static const bool has_avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
static const bool has_avx2_fma = false;
#endif
static std::atomic<bool> mma_vector_code{has_avx2_fma};

bool set_mma_vector_code(bool on) {
    mma_vector_code = on && has_avx2_fma;
    return mma_vector_code;
}

// The mmas of one meeting that share A: A gathered and widened once (each
// lane's a, the same registers for all of them), then each product in
// program order (a later one may read an earlier one's D).
class MmasSharingA {
  public:
    explicit MmasSharingA(const uint32_t* const* a) : vector_(mma_vector_code.load(std::memory_order_relaxed)) {
#ifdef CPUCUDA_MMA_AVX2
        if (vector_) {
            widen_a_avx2(a, A_);
            return;
        }
#endif
        widen_a_portable(a, A_);
    }
    void mma(const MmaLanes& l) const {
#ifdef CPUCUDA_MMA_AVX2
        if (vector_) {
            mma_avx2(A_, l);
            return;
        }
#endif
        mma_portable(A_, l);
    }

  private:
    bool vector_;
    alignas(32) WideA A_;
};

const char* mma_m16n8k16_bf16_f32(void* const* io) {
    const int count = static_cast<const MmaOperands*>(io[0])->count;
    const uint32_t* a[32];
    for (int lane = 0; lane < 32; lane++) {
        const MmaOperands& o = *static_cast<const MmaOperands*>(io[lane]);
        if (o.count != count) return "lanes disagree on the number of mmas";
        a[lane] = o.a;
    }
    const MmasSharingA mmas(a);
    for (int i = 0; i < count; i++) {
        MmaLanes l;
        for (int lane = 0; lane < 32; lane++) {
            const MmaOperands& o = *static_cast<const MmaOperands*>(io[lane]);
            l.b[lane] = o.b[i];
            l.acc[lane] = o.acc[i];
        }
        mmas.mma(l);
    }
    return nullptr;
}

// ldmatrix .m8n8 .b16, .x1/.x2/.x4 (num matrices): lane 8j + r gives the
// address of row r of matrix j (16 bytes, 16-byte aligned; lanes past 8*num
// are ignored). Lane l receives, in register j,
//   M_j[g][2t], M_j[g][2t+1]          without .trans
//   M_j[2t][g], M_j[2t+1][g]          with .trans (the transposed matrix)
// The rows are copied as they are (.trans: then transposed, 16-bit elements),
// and each register is one 32-bit word of a row.
const char* ldmatrix_m8n8_b16(void* const* io) {
    const LdmatrixOperands& o0 = *static_cast<const LdmatrixOperands*>(io[0]);
    const int num = o0.num;
    alignas(16) uint16_t M[4][8][8];
    for (int lane = 0; lane < 32; lane++) {
        const LdmatrixOperands& o = *static_cast<const LdmatrixOperands*>(io[lane]);
        if (o.num != num || o.trans != o0.trans) return "lanes disagree on .num or .trans";
        if (lane >= 8 * num) continue;
        if ((uintptr_t)o.row % 16) return "a row address is not 16-byte aligned";
#ifdef CPUCUDA_RACECHECK
        race_ldmatrix_row((unsigned)lane, o.row);
#endif
        std::memcpy(M[lane / 8][lane % 8], o.row, 16);
    }
    if (o0.trans) {  // then as without .trans, from the transposed matrices
        for (int j = 0; j < num; j++) {
#if defined(__x86_64__)
            __m128i rows[8], cols[8];
            for (int i = 0; i < 8; i++) rows[i] = _mm_load_si128((const __m128i*)M[j][i]);
            transpose8x8_16(rows, cols);
            for (int i = 0; i < 8; i++) _mm_store_si128((__m128i*)M[j][i], cols[i]);
#else
            uint16_t T[8][8];
            for (int r = 0; r < 8; r++)
                for (int c = 0; c < 8; c++) T[c][r] = M[j][r][c];
            std::memcpy(M[j], T, sizeof T);
#endif
        }
    }
    // Register j of lane l is M_j[g][2t..2t+1]: 32-bit word l of matrix j.
#if defined(__x86_64__)
    if (num == 4) {  // .x4: a 4 x 4 transpose of words for each 4 lanes
        for (int l = 0; l < 32; l += 4) {
            __m128i w[4];
            for (int j = 0; j < 4; j++) w[j] = _mm_load_si128((const __m128i*)&M[j][l / 4][0]);  // words l..l+3
            const __m128i x0 = _mm_unpacklo_epi32(w[0], w[1]), x1 = _mm_unpacklo_epi32(w[2], w[3]);
            const __m128i x2 = _mm_unpackhi_epi32(w[0], w[1]), x3 = _mm_unpackhi_epi32(w[2], w[3]);
            const __m128i r[4] = {_mm_unpacklo_epi64(x0, x1), _mm_unpackhi_epi64(x0, x1), _mm_unpacklo_epi64(x2, x3),
                                  _mm_unpackhi_epi64(x2, x3)};
            for (int i = 0; i < 4; i++)
                _mm_storeu_si128((__m128i*)static_cast<const LdmatrixOperands*>(io[l + i])->r, r[i]);
        }
        return nullptr;
    }
#endif
    for (int lane = 0; lane < 32; lane++) {
        uint32_t* r = static_cast<const LdmatrixOperands*>(io[lane])->r;
        for (int j = 0; j < num; j++) std::memcpy(&r[j], &M[j][lane / 4][2 * (lane % 4)], 4);
    }
    return nullptr;
}

// ldmatrix_x4_each: ldmatrix.x4 after ldmatrix.x4, each for every lane.
const char* ldmatrix_x4_each(void* const* io) {
    const int count = static_cast<const LdmatrixEachOperands*>(io[0])->count;
    for (int lane = 1; lane < 32; lane++)
        if (static_cast<const LdmatrixEachOperands*>(io[lane])->count != count)
            return "lanes disagree on the number of ldmatrix";
    LdmatrixOperands ld[32];
    void* ld_io[32];
    for (int k = 0; k < count; k++) {
        for (int lane = 0; lane < 32; lane++) {
            const LdmatrixEachOperands& o = *static_cast<const LdmatrixEachOperands*>(io[lane]);
            ld[lane] = {o.rows[k], o.r[k], 4, false};
            ld_io[lane] = &ld[lane];
        }
        if (const char* error = ldmatrix_m8n8_b16(ld_io)) return error;
    }
    return nullptr;
}

// mma_bf16_16816_ldmatrix_ksteps (and _tiles, one k-step; _x2_ldmatrix, one pair): k-step after
// k-step, its A gathered and widened once (MmasSharingA), then pair after pair the
// ldmatrix.x4 of its B fragments and its two mmas.
const char* ldmatrix_mma_tiles(void* const* io) {
    const LdmatrixMmaTilesOperands& o0 = *static_cast<const LdmatrixMmaTilesOperands*>(io[0]);
    for (int lane = 1; lane < 32; lane++) {
        const LdmatrixMmaTilesOperands& o = *static_cast<const LdmatrixMmaTilesOperands*>(io[lane]);
        if (o.first != o0.first || o.last != o0.last || o.pairs != o0.pairs) return "lanes disagree on the tile pairs";
        if (o.kfirst != o0.kfirst || o.klast != o0.klast) return "lanes disagree on the k-steps";
        if (o.trans != o0.trans) return "lanes disagree on .num or .trans";
    }
    // The ldmatrix.x4 of a pair reads matrix j's row r from lane 8j + r's address; matrices 0
    // and 1 are the first mma's B (k = 0..7 and 8..15), 2 and 3 the second's. Its registers
    // would only carry those rows, unchanged (or, .trans, transposed), to the mmas, which
    // read the rows themselves (MmaLanes::rows): B's columns without .trans, its rows with.
    MmaLanes l0, l1;
    l0.from_rows = l1.from_rows = true;
    l0.n_major = l1.n_major = !o0.trans;
    for (int kk = o0.kfirst; kk < o0.klast; kk++) {
        const uint32_t* a[32];
        for (int lane = 0; lane < 32; lane++) a[lane] = static_cast<const LdmatrixMmaTilesOperands*>(io[lane])->a[kk];
        const MmasSharingA mmas(a);
        for (int np = o0.first; np < o0.last; np++) {
            for (int lane = 0; lane < 32; lane++) {
                const LdmatrixMmaTilesOperands& o = *static_cast<const LdmatrixMmaTilesOperands*>(io[lane]);
                const void* row = o.rows[kk * o0.pairs + np];
                if ((uintptr_t)row % 16) return "a row address is not 16-byte aligned";
#ifdef CPUCUDA_RACECHECK
                race_ldmatrix_row((unsigned)lane, row);
#endif
                MmaLanes& l = lane < 16 ? l0 : l1;
                l.rows[lane % 16] = static_cast<const uint16_t*>(row);
                l0.acc[lane] = o.acc[2 * np];
                l1.acc[lane] = o.acc[2 * np + 1];
            }
            mmas.mma(l0);
            mmas.mma(l1);
        }
    }
    return nullptr;
}

}  // namespace cpucuda
