// The warp-wide PTX instructions of cpucuda_ptx.h, run once per warp by the
// scheduler when all 32 lanes have arrived (runtime.cpp, warp_wide). Register
// layouts are the PTX ISA's ("Matrix fragments for mma.m16n8k16 with floating
// point type", "Warp-level matrix load instruction: ldmatrix"), with
//   g = lane / 4 (groupID), t = lane % 4 (threadID_in_group),
// and in every 32-bit register the element of lower index in the low 16 bits.
#include <cpucuda_ptx.h>

#include <cstring>

#include "internal.h"

namespace cpucuda {

static inline float bf16_lo(uint32_t r) {
    float f;
    uint32_t b = r << 16;
    std::memcpy(&f, &b, 4);
    return f;
}
static inline float bf16_hi(uint32_t r) {
    float f;
    uint32_t b = r & 0xFFFF0000u;
    std::memcpy(&f, &b, 4);
    return f;
}

// D = A B + C for A 16x16 (row), B 16x8 (col), C and D 16x8, fp32 accumulators:
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   acc  = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// Numerics: every product of two bf16 is exact in fp32; the emulation adds C
// and the 16 products in double (k in order) and rounds once to fp32,
// round-to-nearest-even. The hardware's adder tree is not documented: it may
// truncate aligned addends and round differently in the last bit or two; no
// test here depends on bits the PTX ISA does not define.
typedef double Row8 __attribute__((vector_size(64)));  // 8 doubles: a row of B, C or D

const char* mma_m16n8k16_bf16_f32(void* const* io) {
    double A[16][16];
    Row8 B[16], C[16];  // B by k (a row of 8 n), C by m
    for (int lane = 0; lane < 32; lane++) {
        const MmaOperands& o = *static_cast<const MmaOperands*>(io[lane]);
        const int g = lane / 4, t = lane % 4;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; i++) {
            A[rows[i]][cols[i]] = bf16_lo(o.a[i]);
            A[rows[i]][cols[i] + 1] = bf16_hi(o.a[i]);
        }
        for (int i = 0; i < 2; i++) {
            B[2 * t + 8 * i][g] = bf16_lo(o.b[i]);
            B[2 * t + 8 * i + 1][g] = bf16_hi(o.b[i]);
        }
        for (int i = 0; i < 4; i++) C[g + 8 * (i / 2)][2 * t + i % 2] = o.acc[i];
    }
    // C then the 16 products (each exact in double), added in k order in double
    for (int m = 0; m < 16; m++) {
        Row8 acc = C[m];
        for (int k = 0; k < 16; k++) acc += A[m][k] * B[k];
        C[m] = acc;
    }
    for (int lane = 0; lane < 32; lane++) {
        float* acc = static_cast<const MmaOperands*>(io[lane])->acc;
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) acc[i] = (float)C[g + 8 * (i / 2)][2 * t + i % 2];
    }
    return nullptr;
}

// ldmatrix .m8n8 .b16, .x1/.x2/.x4 (num matrices): lane 8j + r gives the
// address of row r of matrix j (16 bytes, 16-byte aligned; lanes past 8*num
// are ignored). Lane l receives, in register j,
//   M_j[g][2t], M_j[g][2t+1]          without .trans
//   M_j[2t][g], M_j[2t+1][g]          with .trans (the transposed matrix)
const char* ldmatrix_m8n8_b16(void* const* io) {
    const LdmatrixOperands& o0 = *static_cast<const LdmatrixOperands*>(io[0]);
    const int num = o0.num;
    uint16_t M[4][8][8];
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
    for (int lane = 0; lane < 32; lane++) {
        uint32_t* r = static_cast<const LdmatrixOperands*>(io[lane])->r;
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < num; j++)
            r[j] = o0.trans ? (uint32_t)M[j][2 * t][g] | (uint32_t)M[j][2 * t + 1][g] << 16
                            : (uint32_t)M[j][g][2 * t] | (uint32_t)M[j][g][2 * t + 1] << 16;
    }
    return nullptr;
}

}  // namespace cpucuda
