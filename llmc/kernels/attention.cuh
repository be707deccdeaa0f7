// Causal multi-head self-attention, FlashAttention-2 style, on tensor cores.
//
// Math, per (batch b, head h), with s_ij = (q_i . k_j) / sqrt(HS) for keys j <= i:
//   forward:   P_ij = exp(s_ij - lse_i),  lse_i = log sum_j exp(s_ij),  out_i = sum_j P_ij v_j
//   backward:  D_i = dO_i . out_i                      (= sum_j P_ij dP_ij)
//              dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i)
//              dV_j = sum_i P_ij dO_i,  dK_j = sum_i dS_ij q_i / sqrt(HS),  dQ_i = sum_j dS_ij k_j / sqrt(HS)
// No T x T matrix exists anywhere: the forward streams K/V tiles with an online
// softmax (when a tile raises a row's running max m to m', the running sum l
// and output o are first multiplied by exp(m - m')) and saves only lse; the
// backward recomputes P from it. No atomics: every output row has one owner, so
// results are bitwise reproducible run to run.
//
// Grouped-query attention: NKV key/value heads (NKV divides NH), each shared by
// G = NH / NKV consecutive query heads: query head h reads kv head h / G (the
// pairing of transformers' repeat_kv). NKV = NH is multi-head attention.
// The dK/dV of a kv head is the sum of the above over its G query heads.
//
// Layouts (C = NH * HS, W = (NH + 2 NKV) * HS):
//   qkv  (B, T, W)   columns [0,C) q, then NKV*HS of k, then NKV*HS of v; head h at h*HS .. h*HS+HS-1 of each
//                    (NKV = NH: [0,C) q, [C,2C) k, [2C,3C) v)
//   out  (B, T, C)   query-head layout;  dout likewise
//   lse  (B, NH, T)  float;  scratch (B, NH, T) float: D
//   dqkv (B, T, W)   overwritten by the backward
//
// Design (bf16; HS any multiple of 16 up to 128; the fp32 build runs
// attention_fp32.cuh instead). A block is 4 warps and owns 64 rows of one
// (b, h), 16 per warp; the other side streams through shared memory in tiles,
// double-buffered with cp.async (the next tile lands while this one is used):
//   forward  owns query rows; streams K/V tiles.   S = Q K^T, online softmax, O += P V
//   dQ       owns query rows; streams K/V tiles. Computes D for its rows
//            first (saved for dK/dV), then S, P, dP = dO V^T, dS, dQ += dS K
//   dK/dV    owns key rows of a kv head; streams Q/dO tiles of each of its
//            query heads in turn, from the block's first key to T.  S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q
// so the backward computes S and dP twice (once per pass) instead of adding dQ
// with atomics. All products are mma.sync m16n8k16 (bf16 in, fp32 accumulate;
// llmc/kernels/ptx.cuh). A warp keeps its own 16 rows' operand fragments (Q, dO or K, V)
// in registers for the whole loop; the streamed side is read with ldmatrix
// (.trans where the tile's rows are the product's k dimension). Scores, P and dS
// never leave registers: an m16n8 accumulator pair is exactly an m16k16 A
// fragment once packed to bf16, so P (and dS) feed the next mma directly.
// Softmax runs in base 2 (x = s * log2(e) / sqrt(HS), exp2 as ex2.approx.ftz: one
// MUFU.EX2, a weight below 2^-126 of the row's largest becomes 0) on the accumulator
// fragments; row max and sum are reduced over the 4 lanes that share a row.
// Causality: tiles entirely above the diagonal are never loaded. Only the
// diagonal tiles (the streamed rows [r0, r0 + 64) of a block owning rows r0..r0+63)
// are masked: their code is peeled out of the tile loop, and there a warp skips
// the 16-key (or 16-query) steps its rows cannot see; every other tile lies
// wholly on the seen side, so the loop body has no causal mask at all.
// Document masking (docs != nullptr, see document_spans): query i sees keys
// j with start_i <= j <= i only, start_i the first position of i's document.
// Tiles wholly before the document of a block's first row (or, in dK/dV, wholly
// after the end of the document of its last key) are never loaded either, so
// the cost falls with the documents' length. In the forward, documents being
// contiguous, only the first tile loaded and the diagonal one need the mask per
// element (both peeled out of the loop, skipping 16-key steps); in the tiles between
// a row sees every key (its document is that of the block's first row) or none,
// a per-row mask at no per-element cost. In dQ and dK/dV the document mask is
// applied per element in every tile (dQ also skips whole tiles a warp's rows
// cannot see, and the diagonal tiles their 16-steps).
// Shared-memory rows are HS + 8 bf16 apart, so the 8 rows an ldmatrix phase
// reads fall in 8 different 16-byte bank groups (no conflicts).
//
// Tile sizes (Tiles<HS> below): rows of the streamed side per tile
//   forward  K/V   64 keys
//   dQ       K/V   64 keys, 32 at HS=128
//   dK/dV    Q/dO  32 queries, 16 at HS=128
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "llmc/kernels/attention_fp32.cuh"
#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/ptx.cuh"

namespace attention_detail {

using attention_fp32::k_column;
using attention_fp32::qkv_stride;
using attention_fp32::v_column;

typedef __nv_bfloat16 bf16;
constexpr float LOG2E = 1.4426950408889634f;
constexpr int WARPS = 4, THREADS = 32 * WARPS, ROWS = 16 * WARPS;  // rows a block owns

template <int HS>
struct Tiles {
    static_assert(HS % 16 == 0 && HS <= 128, "attention: HS must be a multiple of 16, at most 128");
    static constexpr int LD = HS + 8;  // shared-memory row stride (bf16)
    static constexpr int KV_FWD = 64;  // keys per tile: forward
    static constexpr int KV_DQ = HS <= 64 ? 64 : 32;  // keys per tile: dQ
    static constexpr int Q_DKV = HS <= 64 ? 32 : 16;  // queries per tile: dK/dV
    // bytes of dynamic shared memory per kernel
    static constexpr size_t fwd_bytes = (size_t)(ROWS + 4 * KV_FWD) * LD * sizeof(bf16);
    static constexpr size_t dq_bytes = (size_t)(2 * ROWS + 4 * KV_DQ) * LD * sizeof(bf16);
    static constexpr size_t dkv_bytes = (size_t)(2 * ROWS + 4 * Q_DKV) * LD * sizeof(bf16) + 6 * Q_DKV * sizeof(float);
};

// --- tiles: global -> shared ----------------------------------------------------
// Rows [row0, row0 + R) of one head (HS bf16 each, global row stride `stride`)
// into shared memory with row stride HS + 8, 16 bytes per cp.async; rows at or
// past T are zero-filled with plain stores (a zero key or value row contributes
// nothing once masked; garbage could be NaN, and 0 * NaN is NaN). Where a row's
// chunks divide evenly among the threads, each thread copies the same column of
// every THREADS / (HS / 8)-th row: its addresses are computed once and step by a
// constant, and the loop unrolls fully.
template <int HS, int R>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, size_t stride, int row0, int T) {
    constexpr int CHUNKS = HS / 8, LD = Tiles<HS>::LD;
    if constexpr (THREADS % CHUNKS == 0) {
        constexpr int STEP = THREADS / CHUNKS;  // rows between one thread's chunks
        const int r0 = threadIdx.x / CHUNKS, col = threadIdx.x % CHUNKS * 8;
        const bf16* s = src + (size_t)(row0 + r0) * stride + col;
        bf16* d = dst + r0 * LD + col;
        const size_t step = STEP * stride;
        const int left = T - row0 - r0;  // rows of this thread's column before T
#pragma unroll
        for (int i = 0; i < CEIL_DIV(R, STEP); i++, s += step) {
            if (R % STEP != 0 && r0 + i * STEP >= R) break;
            if (i * STEP < left) cp_async_16(d + i * STEP * LD, s);
            else *reinterpret_cast<uint4*>(d + i * STEP * LD) = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int c = threadIdx.x; c < R * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            bf16* d = dst + r * LD + col;
            if (row0 + r < T) cp_async_16(d, src + (size_t)(row0 + r) * stride + col);
            else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        }
    }
}

// --- fragments: shared -> registers (ldmatrix; layouts in llmc/kernels/ptx.cuh) -----------
// A fragments (16 x 16, k = columns) of 16 rows of a row-major tile, all HS/16 k-steps.
template <int HS>
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[HS / 16][4], const bf16* tile16) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4_each<HS / 16>(a,
                              [&](int kk) { return tile16 + (lane % 16) * Tiles<HS>::LD + kk * 16 + (lane / 16) * 8; });
}
// This lane's ldmatrix.x4 row address for the B fragments of two n8 tiles
// (n0..n0+15) at k-step k0..k0+15, from a tile whose rows are n and columns k
// (K rows for S = Q K^T); mma_bf16_16816_ldmatrix_ksteps loads and multiplies them.
template <int HS>
__device__ __forceinline__ const bf16* row_nk(const bf16* tile, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    return tile + (n0 + (lane / 16) * 8 + lane % 8) * Tiles<HS>::LD + k0 + ((lane / 8) % 2) * 8;
}
// The same from a tile whose rows are k and columns n (V rows for O = P V), with .trans.
template <int HS>
__device__ __forceinline__ const bf16* row_kn(const bf16* tile, int k0, int n0) {
    const int lane = threadIdx.x % 32;
    return tile + (k0 + ((lane / 8) % 2) * 8 + lane % 8) * Tiles<HS>::LD + n0 + (lane / 16) * 8;
}

// The A fragment of k-step kk: from registers, or read from 16 shared-memory rows.
template <int HS>
__device__ __forceinline__ void a_fragment(uint32_t (&out)[4], const uint32_t (&a)[HS / 16][4], int kk) {
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = a[kk][i];
}
template <int HS>
__device__ __forceinline__ void a_fragment(uint32_t (&out)[4], const bf16* rows16, int kk) {
    const int lane = threadIdx.x % 32;
    ldmatrix<4>(out, rows16 + (lane % 16) * Tiles<HS>::LD + kk * 16 + (lane / 16) * 8);
}

// acc[n] (16 x N) += A (16 x HS: fragments in registers, or 16 rows in shared
// memory) . tile^T for the tile's rows n0 .. n0+N-1 (rows = n, columns = HS):
// S = Q K^T, dP = dO V^T and their transposes. Only 16-column steps from
// `first` to `steps` - 1 are computed (causal skipping); the others stay as they were.
template <int HS, int N, class ASource>
__device__ __forceinline__ void mma_a_tileT(float (&acc)[N / 8][4], const ASource& a_src, const bf16* tile, int first,
                                            int steps) {
    mma_bf16_16816_ldmatrix_ksteps<false, HS / 16, N / 16>(
        acc, [&](int kk, uint32_t(&a)[4]) { a_fragment<HS>(a, a_src, kk); },
        [&](int kk, int np) { return row_nk<HS>(tile, np * 16, kk * 16); }, 0, HS / 16, first, steps);
}

// acc (16 x HS) += P (16 x N, accumulator fragments, packed to bf16 here) . tile
// (rows = N, columns = HS): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
// k-steps from `first` to `steps` - 1 only.
template <int HS, int N>
__device__ __forceinline__ void mma_p_tile(float (&acc)[HS / 8][4], const float (&p)[N / 8][4], const bf16* tile,
                                           int first, int steps) {
    // the accumulator pair of columns 16kk .. 16kk+15 is the A fragment of k-step kk
    const auto a_of = [&](int kk, uint32_t(&a)[4]) {
        a[0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    };
    mma_bf16_16816_ldmatrix_ksteps<true, N / 16, HS / 16>(
        acc, a_of, [&](int kk, int hp) { return row_kn<HS>(tile, kk * 16, hp * 16); }, first, steps, 0, HS / 16);
}

// Double buffering, the loop step of the forward and dQ kernels: starts copying tile
// it + 1 (if any) into the other buffer with load(it + 1, buffer), then waits
// for tile it's copies and makes every thread's visible to the block.
template <class Load>
__device__ __forceinline__ void next_tile(int it, int tiles, Load load) {
    if (it + 1 < tiles) {
        load(it + 1, (it + 1) % 2);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}
// Document masking, read once per block from the (B, T) spans of its sequence
// (docs_b[i] = {first position of i's document, one past its last}). The
// kernels are instantiated with and without it (DOCS), so plain causal
// attention pays nothing for it: no registers, no extra conditions.
// Query-row blocks (forward, dQ): where the documents start of the block's
// first row (tiles before it are skipped), of the warp's first row, of the lane's two rows.
struct DocRows {
    int block_start = 0, warp_start = 0, row_start[2] = {0, 0};
    __device__ DocRows(const int2* docs_b, int q0, int row_lo, int T) {
        if (!docs_b) return;
        const int g = threadIdx.x % 32 / 4;
        block_start = docs_b[q0].x;
        warp_start = docs_b[min(row_lo, T - 1)].x;
        row_start[0] = docs_b[min(row_lo + g, T - 1)].x;
        row_start[1] = docs_b[min(row_lo + g + 8, T - 1)].x;
    }
};
// Key-row blocks (dK/dV) skip the query tiles after the end of the document of
// their last key, and keep each query's document start beside its lse in
// shared memory: query i >= key j sees j exactly when start_i <= j.

// Max / sum over the 4 lanes that hold one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Writes 16 rows of a (16 x HS) accumulator (rows row0 + g, row0 + g + 8; only rows < T)
// to dst (row stride `stride`), times `scale`, as bf16 pairs.
template <int HS>
__device__ __forceinline__ void store_rows(bf16* dst, size_t stride, const float (&acc)[HS / 8][4], int row0, int T,
                                           float scale0, float scale1) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = row0 + g + 8 * half;
        if (row >= T) continue;
        const float s = half ? scale1 : scale0;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            *reinterpret_cast<uint32_t*>(dst + (size_t)row * stride + n * 8 + 2 * t) =
                pack_bf16x2(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
    }
}

// ---------------------------------------------------------------------------
// Forward. Block: 64 query rows [q0, q0+64) of one (b, h); grid (B*NH, ceil(T/64)),
// query blocks in reverse order so the longest (latest rows) start first.
// Grouped-query attention: the G query heads of kv head h / G are G consecutive
// blockIdx.x (b*NH + h), and blocks are dispatched x fastest, so the G blocks of
// one (b, kv head, query block) run together and stream the same K/V tiles in the
// same order: the first to ask for a tile brings it from DRAM, the other G - 1
// find it in L2. K/V bytes from DRAM per query block: tiles * 2 * 64 * HS * 2,
// once per kv head instead of G times; per block, the bytes copied to shared
// memory and the HMMAs are exactly those of multi-head attention (at HS = 64 a
// 16 KB K/V tile feeds 64 x 64 x 64 x 2 x 2 = 1 MFLOP, 64 FLOP per byte, as today).
// One block for all G heads would save the L2 -> shared copies too, but would
// hold G times the Q fragments (or G times fewer rows per head) in registers
// the kernel has no room for at G = 4..8; the L2 pairing needs no code at all.
// The dQ kernel below pairs its blocks the same way.
template <int HS, bool DOCS>
__global__ void __launch_bounds__(THREADS)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int2* docs, int T, int NH, int NKV) {
    using Tl = Tiles<HS>;
    constexpr int KV = Tl::KV_FWD, LD = Tl::LD;
    extern __shared__ uint4 attn_tiles[];
    bf16* q_tile = reinterpret_cast<bf16*>(attn_tiles);  // ROWS x LD
    bf16* k_tiles = q_tile + ROWS * LD;  // 2 x KV x LD
    bf16* v_tiles = k_tiles + 2 * KV * LD;  // 2 x KV x LD

    const int C = NH * HS, bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_lo = q0 + 16 * warp;  // this warp's rows: row_lo + g, row_lo + g + 8
    const size_t stride = qkv_stride(NH, NKV, HS);
    const bf16* seq = qkv + (size_t)b * T * stride;
    const bf16 *base = seq + h * HS, *k_base = seq + k_column(NH, kvh, HS), *v_base = seq + v_column(NH, NKV, kvh, HS);
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    const DocRows doc(DOCS ? docs + (size_t)b * T : nullptr, q0, row_lo, T);
    // keys [tile0 * KV, q0 + 64): from the document of the block's first row
    const int tile0 = doc.block_start / KV;
    const int tiles = CEIL_DIV(min(T, q0 + ROWS), KV) - tile0;
    auto load_kv_tile = [&](int it, int buf) {  // keys of tile tile0 + it into buffer buf
        load_tile<HS, KV>(k_tiles + buf * KV * LD, k_base, stride, (tile0 + it) * KV, T);
        load_tile<HS, KV>(v_tiles + buf * KV * LD, v_base, stride, (tile0 + it) * KV, T);
    };
    load_tile<HS, ROWS>(q_tile, base, stride, q0, T);
    load_kv_tile(0, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HS / 16][4];
    load_a_rows<HS>(qf, q_tile + 16 * warp * LD);

    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(o);
    // Tile it: S = Q K^T, online softmax, O += P V. The causal and document masks
    // (per element) and the skipping of 16-key steps apply only to a MASKED tile:
    // the diagonal one (keys from q0 on) and, with documents, the first one (tile0,
    // keys from block_start's tile on). The tiles between hold only keys < every row
    // of the block and, documents being contiguous, only keys of the document of row
    // q0 (block_start < key < q0): a row of that document sees all of them, a row of
    // a later one (its document starts after q0) none. Such a row sees no key of the
    // first tile either, while a row of q0's document has seen block_start there, so
    // in the tiles between m = -inf marks the rows that see nothing: their tile max
    // is taken as -inf (no per-element cost), which gives exactly the m, l, o of a
    // row whose keys are all masked.
    auto tile_step = [&](int it, auto masked) {
        constexpr bool MASKED = decltype(masked)::value;
        const int k0 = (tile0 + it) * KV, buf = it % 2;
        next_tile(it, tiles, load_kv_tile);
        // 16-key steps of this tile that hold a key <= the warp's last row, from
        // the first that holds a key of the warp's first row's document
        const int steps = !MASKED ? KV / 16 : row_lo + 15 < k0 ? 0 : min(KV / 16, (row_lo + 15 - k0) / 16 + 1);
        const int first = MASKED && DOCS ? max(0, (doc.warp_start - k0) / 16) : 0;
        // no warp skips a whole tile: a branch around the quad shuffles below would
        // cost a divergence fallback (a warp's rows not yet in their document keep
        // m = -inf, l = 0, o = 0 through such a tile)
        float s[KV / 8][4];
        zero(s);
        mma_a_tileT<HS, KV>(s, qf, k_tiles + buf * KV * LD, first, steps);
        // online softmax, rows r = 0 (g) and 1 (g + 8); element e of n-tile n is key k0 + 8n + 2t + e%2.
        // m is the running max of the unscaled scores (the scale is positive); the exponent
        // s * scale_log2 - m * scale_log2 is one FMA
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + g + 8 * r;
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < KV / 8; n++)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    // key k0 + 2t + j, j = 8n + e%2: the bounds moved to j's side stay per-tile constants
                    const int j = 8 * n + e % 2, off = k0 + 2 * t;
                    const bool seen = n < 2 * steps && j <= row - off && (!DOCS || j >= doc.row_start[r] - off);
                    if (MASKED) s[n][e] = seen ? s[n][e] : -INFINITY;
                    mx = fmaxf(mx, s[n][e]);
                }
            // finite once a row has seen a key: always without documents (key 0 <= row is in the
            // first tile), only from its document's start with them (an unmasked tile's keys:
            // all or none, see above)
            // (the row mask selects after the fmaxf: so ptxas keeps the DOCS kernel at HS 64 to
            // 128 registers, 4 blocks per SM; selecting inside it, 136)
            const float m_max = fmaxf(m[r], quad_max(mx));
            const float m_new = !MASKED && DOCS && m[r] == -INFINITY ? -INFINITY : m_max;
            // a row that has seen no key yet (m_new = -inf) subtracts +inf, so that exp2 gives 0 (and
            // corr 0), not NaN
            const float m_use = DOCS && m_new == -INFINITY ? INFINITY : m_new * scale_log2;
            const float corr = ex2_ftz(m[r] * scale_log2 - m_use);  // 0 on the row's first keys
            m[r] = m_new;
            l[r] *= corr;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
#pragma unroll
            for (int n = 0; n < KV / 8; n++)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    s[n][e] = ex2_ftz(fmaf(s[n][e], scale_log2, -m_use));
                    l[r] += s[n][e];
                }
        }
        mma_p_tile<HS, KV>(o, s, v_tiles + buf * KV * LD, first, steps);
        __syncthreads();  // everyone is done with this buffer before it is refilled
    };
    // the diagonal tile, keys [q0, q0 + ROWS), is the last (the document of row q0
    // begins at or before q0); run unconditionally, so its quad shuffles stay convergent.
    // With documents the first tile before it is peeled off the loop (a branch the whole
    // block takes alike); in it the causal mask sees every key and steps = KV / 16
    static_assert(KV == ROWS, "attention forward: one diagonal tile");
    const int diag = tiles - 1;
    if (DOCS && diag > 0) tile_step(0, std::true_type());
    for (int it = DOCS ? 1 : 0; it < diag; it++) tile_step(it, std::false_type());
    tile_step(diag, std::true_type());
    l[0] = quad_sum(l[0]);
    l[1] = quad_sum(l[1]);
    store_rows<HS>(out + (size_t)b * T * C + h * HS, C, o, row_lo, T, 1.0f / l[0], 1.0f / l[1]);
    if (t == 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + g + 8 * r;
            if (row < T) lse[(size_t)bh * T + row] = (m[r] * scale_log2 + log2f(l[r])) / LOG2E;
        }
}

// ---------------------------------------------------------------------------
// Backward (1): dQ, and D for the dK/dV kernel. Block: 64 query rows, as the forward.
template <int HS, bool DOCS>
__global__ void __launch_bounds__(THREADS)
    attention_backward_dq_kernel(bf16* dqkv, float* Dvec, const bf16* dout, const bf16* qkv, const bf16* out,
                                 const float* lse, const int2* docs, int T, int NH, int NKV) {
    using Tl = Tiles<HS>;
    constexpr int KV = Tl::KV_DQ, LD = Tl::LD;
    extern __shared__ uint4 attn_tiles[];
    bf16* q_tile = reinterpret_cast<bf16*>(attn_tiles);  // ROWS x LD
    bf16* do_tile = q_tile + ROWS * LD;  // ROWS x LD
    bf16* k_tiles = do_tile + ROWS * LD;  // 2 x KV x LD
    bf16* v_tiles = k_tiles + 2 * KV * LD;  // 2 x KV x LD

    const int C = NH * HS, bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_lo = q0 + 16 * warp;
    const size_t stride = qkv_stride(NH, NKV, HS);
    const bf16* seq = qkv + (size_t)b * T * stride;
    const bf16 *base = seq + h * HS, *k_base = seq + k_column(NH, kvh, HS), *v_base = seq + v_column(NH, NKV, kvh, HS);
    const size_t out_off = (size_t)b * T * C + h * HS;  // (b, 0, h) in out / dout
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = LOG2E * scale;
    const DocRows doc(DOCS ? docs + (size_t)b * T : nullptr, q0, row_lo, T);
    const int tile0 = doc.block_start / KV;  // as the forward
    const int tiles = CEIL_DIV(min(T, q0 + ROWS), KV) - tile0;
    auto load_kv_tile = [&](int it, int buf) {  // keys of tile tile0 + it into buffer buf
        load_tile<HS, KV>(k_tiles + buf * KV * LD, k_base, stride, (tile0 + it) * KV, T);
        load_tile<HS, KV>(v_tiles + buf * KV * LD, v_base, stride, (tile0 + it) * KV, T);
    };
    load_tile<HS, ROWS>(q_tile, base, stride, q0, T);
    load_tile<HS, ROWS>(do_tile, dout + out_off, C, q0, T);
    load_kv_tile(0, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    uint32_t qf[HS / 16][4], dof[HS / 16][4];
    float dq[HS / 8][4], lse2[2], D[2];
    zero(dq);
    load_a_rows<HS>(qf, q_tile + 16 * warp * LD);
    load_a_rows<HS>(dof, do_tile + 16 * warp * LD);
    {
        // D_i = dO_i . out_i: lanes 2i and 2i+1 take the two halves of row row_lo + i
        const int i = lane / 2, row = row_lo + i;
        float d = 0.0f;
        if (row < T) {
            const bf16* o_row = out + out_off + (size_t)row * C + (lane % 2) * (HS / 2);
            const bf16* do_row = do_tile + (16 * warp + i) * LD + (lane % 2) * (HS / 2);
#pragma unroll
            for (int c = 0; c < HS / 2; c += 8) {
                union {
                    uint4 v;
                    bf16 e[8];
                } o8;  // one 16-byte load of 8 bf16
                o8.v = *reinterpret_cast<const uint4*>(o_row + c);
#pragma unroll
                for (int e = 0; e < 8; e++) d += __bfloat162float(o8.e[e]) * __bfloat162float(do_row[c + e]);
            }
        }
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        if (row < T && lane % 2 == 0) Dvec[(size_t)bh * T + row] = d;
        D[0] = __shfl_sync(0xffffffffu, d, 2 * g);
        D[1] = __shfl_sync(0xffffffffu, d, 2 * g + 16);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int rr = row_lo + g + 8 * r;
            lse2[r] = rr < T ? lse[(size_t)bh * T + rr] * LOG2E : 0.0f;
        }
    }
    // Tile it: S, P, dP, dS, dQ += dS K; the causal mask and 16-key step skipping
    // on the diagonal tiles only, as in the forward; the document mask per element
    // in every tile
    auto tile_step = [&](int it, auto diagonal) {
        constexpr bool DIAG = decltype(diagonal)::value;
        const int k0 = (tile0 + it) * KV, buf = it % 2;
        next_tile(it, tiles, load_kv_tile);
        const int steps = !DIAG ? KV / 16 : row_lo + 15 < k0 ? 0 : min(KV / 16, (row_lo + 15 - k0) / 16 + 1);
        const int first = DIAG && DOCS ? max(0, (doc.warp_start - k0) / 16) : 0;
        if (DIAG ? first < steps : !DOCS || k0 + KV > doc.warp_start) {
            float s[KV / 8][4], dp[KV / 8][4];
            zero(s);
            zero(dp);
            mma_a_tileT<HS, KV>(s, qf, k_tiles + buf * KV * LD, first, steps);
            mma_a_tileT<HS, KV>(dp, dof, v_tiles + buf * KV * LD, first, steps);
#pragma unroll
            for (int n = 0; n < KV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    // key k0 + 2t + j, j = 8n + e%2: the bounds moved to j's side stay per-tile constants
                    const int row = row_lo + g + 8 * (e / 2), j = 8 * n + e % 2, off = k0 + 2 * t;
                    const bool seen = (!DIAG || (n < 2 * steps && j <= row - off)) &&
                                      (!DOCS || j >= doc.row_start[e / 2] - off);
                    const float p = seen ? ex2_ftz(s[n][e] * scale_log2 - lse2[e / 2]) : 0.0f;
                    s[n][e] = p * (dp[n][e] - D[e / 2]);  // dS
                }
            mma_p_tile<HS, KV>(dq, s, k_tiles + buf * KV * LD, first, steps);
        }
        __syncthreads();
    };
    constexpr int DIAG_TILES = ROWS / KV;
    const int diag0 = q0 / KV - tile0;
    for (int it = 0; it < diag0; it++) tile_step(it, std::false_type());
#pragma unroll
    for (int j = 0; j < DIAG_TILES; j++)
        if (diag0 + j < tiles) tile_step(diag0 + j, std::true_type());
    store_rows<HS>(dqkv + (size_t)b * T * stride + h * HS, stride, dq, row_lo, T, scale, scale);
}

// ---------------------------------------------------------------------------
// Backward (2): dK and dV. Block: 64 key rows [k0, k0+64) of one (b, kv head);
// grid (B*NKV, ceil(T/64)) in natural order (the earliest keys have the most
// queries). For each of the G query heads h of the kv head in turn, query tiles
// run from the block's first key to T, all into the same dK, dV accumulators:
//   dV_j = sum_h sum_i P^h_ij dO^h_i,   dK_j = sum_h sum_i dS^h_ij q^h_i / sqrt(HS)
// (fp32 in registers, heads and tiles in a fixed order: no atomics, bitwise
// reproducible). The K/V rows are read once per block and kept for all G heads.
// __launch_bounds__: with documents at HS <= 64 ptxas would take 208 registers
// (two blocks per SM); bounded to three blocks it fits 168 without spilling. 0
// (no bound) elsewhere: a bound of 1 alone makes ptxas take 202 at HS = 64.
template <int HS, bool DOCS>
__global__ void __launch_bounds__(THREADS, HS <= 64 && DOCS ? 3 : 0)
    attention_backward_dkv_kernel(bf16* dqkv, const float* Dvec, const bf16* dout, const bf16* qkv, const float* lse,
                                  const int2* docs, int T, int NH, int NKV) {
    using Tl = Tiles<HS>;
    constexpr int QT = Tl::Q_DKV, LD = Tl::LD;
    extern __shared__ uint4 attn_tiles[];
    bf16* k_tile = reinterpret_cast<bf16*>(attn_tiles);  // ROWS x LD
    bf16* v_tile = k_tile + ROWS * LD;  // ROWS x LD
    bf16* q_tiles = v_tile + ROWS * LD;  // 2 x QT x LD
    bf16* do_tiles = q_tiles + 2 * QT * LD;  // 2 x QT x LD
    float* lse_tiles = reinterpret_cast<float*>(do_tiles + 2 * QT * LD);  // 2 x QT, times log2(e)
    float* D_tiles = lse_tiles + 2 * QT;  // 2 x QT
    int* start_tiles = reinterpret_cast<int*>(D_tiles + 2 * QT);  // 2 x QT (DOCS)

    const int C = NH * HS, G = NH / NKV, b = blockIdx.x / NKV, kvh = blockIdx.x % NKV;
    const int h_first = kvh * G;  // the group's query heads: h_first .. h_first + G - 1
    const int kb0 = blockIdx.y * ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int key_lo = kb0 + 16 * warp;  // this warp's keys: key_lo + g, key_lo + g + 8
    const size_t stride = qkv_stride(NH, NKV, HS);
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = LOG2E * scale;

    // the current query head's Q, dO, lse and D (the group's first, then each next one in turn)
    const bf16* q_h = seq + h_first * HS;
    const bf16* dout_h = dout + (size_t)b * T * C + h_first * HS;
    const float* lse_h = lse + ((size_t)b * NH + h_first) * T;
    const float* D_h = Dvec + ((size_t)b * NH + h_first) * T;
    // queries [i0, i0 + QT) of the current head. Queries at or past T: lse = +inf
    // makes P = 0 (their Q and dO rows are zero)
    auto load_q_tile = [&](int i0, int buf) {
        load_tile<HS, QT>(q_tiles + buf * QT * LD, q_h, stride, i0, T);
        load_tile<HS, QT>(do_tiles + buf * QT * LD, dout_h, C, i0, T);
        static_assert(QT <= THREADS, "attention dK/dV: one thread per query of a tile");
        if (const int r = threadIdx.x; r < QT) {
            lse_tiles[buf * QT + r] = i0 + r < T ? lse_h[i0 + r] * LOG2E : INFINITY;
            D_tiles[buf * QT + r] = i0 + r < T ? D_h[i0 + r] : 0.0f;
            if constexpr (DOCS) start_tiles[buf * QT + r] = i0 + r < T ? docs[(size_t)b * T + i0 + r].x : T;
        }
    };
    // queries [kb0, end of the document of the block's last key), per query head
    const int q_end = DOCS ? docs[(size_t)b * T + min(kb0 + ROWS, T) - 1].y : T;
    const int i_first = kb0, tiles = CEIL_DIV(q_end - i_first, QT);
    load_tile<HS, ROWS>(k_tile, seq + k_column(NH, kvh, HS), stride, kb0, T);
    load_tile<HS, ROWS>(v_tile, seq + v_column(NH, NKV, kvh, HS), stride, kb0, T);
    load_q_tile(i_first, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // K and V fragments stay in registers; at HS = 128 those of V would make the
    // kernel spill, so V's are read from shared memory at each use instead
    constexpr bool V_IN_REGISTERS = HS < 128;
    uint32_t kf[HS / 16][4], vf[V_IN_REGISTERS ? HS / 16 : 1][4];
    float dk[HS / 8][4], dv[HS / 8][4];
    zero(dk);
    zero(dv);
    load_a_rows<HS>(kf, k_tile + 16 * warp * LD);
    if constexpr (V_IN_REGISTERS) load_a_rows<HS>(vf, v_tile + 16 * warp * LD);
    // Query tile it of head h: S^T, P^T, dV += P^T dO, dP^T, dS^T, dK += dS^T Q.
    // The causal mask and the skipping of 16-query steps apply only to a DIAGonal
    // tile (queries < kb0 + ROWS); later tiles hold only queries > every key of the block.
    // key_lo, passed through an empty asm at each head (below): what the diagonal
    // tiles derive from it is then recomputed per head, not hoisted out of the head
    // loop and held in registers through the tile loop (HS = 64: 168 registers, not 179)
    int key_lo_h = key_lo;
    auto tile_step = [&](int it, auto diagonal) {
        constexpr bool DIAG = decltype(diagonal)::value;
        const int i0 = i_first + it * QT, buf = it % 2;
        // the double buffering of next_tile, written out: with it, ptxas gives this kernel 5 more registers
        // at HS = 64 (173), one block per SM fewer
        if (it + 1 < tiles) {
            load_q_tile(i0 + QT, 1 - buf);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // 16-query steps of this tile that hold a query >= the warp's first key
        const int first = DIAG ? max(0, (key_lo_h - i0) / 16) : 0;
        if (first < QT / 16) {
            const bf16* q_t = q_tiles + buf * QT * LD;
            const bf16* do_t = do_tiles + buf * QT * LD;
            float s[QT / 8][4], dp[QT / 8][4];
            zero(s);
            zero(dp);
            // steps before `first` hold only queries < every key of the warp: P = 0 there
            mma_a_tileT<HS, QT>(s, kf, q_t, first, QT / 16);
            if constexpr (V_IN_REGISTERS) mma_a_tileT<HS, QT>(dp, vf, do_t, first, QT / 16);
            else mma_a_tileT<HS, QT>(dp, v_tile + 16 * warp * LD, do_t, first, QT / 16);
#pragma unroll
            for (int n = 0; n < QT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = key_lo_h + g + 8 * (e / 2), c = 8 * n + 2 * t + e % 2, query = i0 + c;
                    const bool seen = (!DIAG || query >= key) && (!DOCS || start_tiles[buf * QT + c] <= key);
                    const float p = seen ? ex2_ftz(s[n][e] * scale_log2 - lse_tiles[buf * QT + c]) : 0.0f;
                    s[n][e] = p;  // P^T
                    dp[n][e] = p * (dp[n][e] - D_tiles[buf * QT + c]);  // dS^T
                }
            mma_p_tile<HS, QT>(dv, s, do_t, first, QT / 16);
            mma_p_tile<HS, QT>(dk, dp, q_t, first, QT / 16);
        }
        __syncthreads();
    };
    constexpr int DIAG_TILES = ROWS / QT;
    // the group's query heads one after another (a fixed order: dK, dV bitwise reproducible);
    // a head's first tile is loaded once the previous head's last is done with (no
    // prefetch across heads: that would put a head switch into the tile loop)
    for (int h = 0; h < G; h++) {
        asm volatile("" : "+r"(key_lo_h));
        if (h > 0) {
            q_h += HS, dout_h += HS, lse_h += T, D_h += T;
            load_q_tile(i_first, 0);
            cp_async_commit();
        }
#pragma unroll
        for (int j = 0; j < DIAG_TILES; j++)
            if (j < tiles) tile_step(j, std::true_type());
        for (int it = DIAG_TILES; it < tiles; it++) tile_step(it, std::false_type());
    }
    bf16* dst = dqkv + (size_t)b * T * stride;
    store_rows<HS>(dst + k_column(NH, kvh, HS), stride, dk, key_lo, T, scale, scale);
    store_rows<HS>(dst + v_column(NH, NKV, kvh, HS), stride, dv, key_lo, T, 1.0f, 1.0f);
}

template <int HS, bool DOCS>
inline void forward_launch(bf16* out, float* lse, const bf16* qkv, const int2* docs, int B, int T, int NH, int NKV,
                           cudaStream_t stream) {
    // dynamic shared memory over 48 KB needs an opt-in (cudaFuncSetAttribute takes the kernel by name)
    static const cudaError_t opt_in = cudaFuncSetAttribute(
        attention_forward_kernel<HS, DOCS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Tiles<HS>::fwd_bytes);
    cudaCheck(opt_in);
    const dim3 grid(B * NH, CEIL_DIV(T, ROWS));
    attention_forward_kernel<HS, DOCS>
        <<<grid, THREADS, Tiles<HS>::fwd_bytes, stream>>>(out, lse, qkv, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
}

template <int HS, bool DOCS>
inline void backward_launch(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                            const float* lse, const int2* docs, int B, int T, int NH, int NKV, cudaStream_t stream) {
    static const cudaError_t opt_in[2] = {
        cudaFuncSetAttribute(attention_backward_dq_kernel<HS, DOCS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)Tiles<HS>::dq_bytes),
        cudaFuncSetAttribute(attention_backward_dkv_kernel<HS, DOCS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)Tiles<HS>::dkv_bytes)};
    cudaCheck(opt_in[0]);
    cudaCheck(opt_in[1]);
    const dim3 grid(B * NH, CEIL_DIV(T, ROWS)), grid_kv(B * NKV, CEIL_DIV(T, ROWS));
    attention_backward_dq_kernel<HS, DOCS>
        <<<grid, THREADS, Tiles<HS>::dq_bytes, stream>>>(dqkv, scratch, dout, qkv, out, lse, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
    attention_backward_dkv_kernel<HS, DOCS>
        <<<grid_kv, THREADS, Tiles<HS>::dkv_bytes, stream>>>(dqkv, scratch, dout, qkv, lse, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
}

// The head sizes a build compiles attention for: each is 3 kernels x 2 masks, most of a
// trainer's compile time. All by default; a build for known models may list only theirs
// (-DATTENTION_HEAD_SIZES=64, as the Makefile does for the model tests, which run HS 16).
#ifndef ATTENTION_HEAD_SIZES
#define ATTENTION_HEAD_SIZES 16, 32, 48, 64, 80, 96, 112, 128
#endif
#define ATTENTION_TEXT_(...) #__VA_ARGS__
#define ATTENTION_TEXT(...) ATTENTION_TEXT_(__VA_ARGS__)

// HS -> the instantiation for it, among the compiled sizes; false where HS is not one.
template <class F, int... Sizes>
inline bool with_head_size_among(int HS, F& f, std::integer_sequence<int, Sizes...>) {
    return ((HS == Sizes && (f(std::integral_constant<int, Sizes>()), true)) || ...);
}
template <class F>
inline void with_head_size(int HS, F f) {
    if (with_head_size_among(HS, f, std::integer_sequence<int, ATTENTION_HEAD_SIZES>())) return;
    const std::string hs = std::to_string(HS);
    if (HS % 16 != 0 || HS < 16 || HS > 128)
        llmc::fail("attention: head size " + hs + " not supported (a multiple of 16, at most 128)");
    llmc::fail("attention: head size " + hs +
               " is not compiled into this build (ATTENTION_HEAD_SIZES=" + ATTENTION_TEXT(ATTENTION_HEAD_SIZES) + ")");
}

// floatX = bf16: tensor cores; floatX = float: attention_fp32.cuh. Templates, so
// that each build instantiates only its own kernels.
template <class X>
inline void forward(X* out, float* lse, const X* qkv, const int2* docs, int B, int T, int NH, int NKV, int HS,
                    cudaStream_t stream) {
    if constexpr (std::is_same_v<X, float>) attention_fp32::forward(out, lse, qkv, docs, B, T, NH, NKV, HS, stream);
    else
        with_head_size(HS, [&](auto hs) {
            constexpr int H = decltype(hs)::value;
            if (docs) forward_launch<H, true>(out, lse, qkv, docs, B, T, NH, NKV, stream);
            else forward_launch<H, false>(out, lse, qkv, nullptr, B, T, NH, NKV, stream);
        });
}
template <class X>
inline void backward(X* dqkv, float* scratch, const X* dout, const X* qkv, const X* out, const float* lse,
                     const int2* docs, int B, int T, int NH, int NKV, int HS, cudaStream_t stream) {
    if constexpr (std::is_same_v<X, float>)
        attention_fp32::backward(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, HS, stream);
    else
        with_head_size(HS, [&](auto hs) {
            constexpr int H = decltype(hs)::value;
            if (docs) backward_launch<H, true>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream);
            else backward_launch<H, false>(dqkv, scratch, dout, qkv, out, lse, nullptr, B, T, NH, NKV, stream);
        });
}

}  // namespace attention_detail

// Document spans of (B, T) input tokens for the attention's document mask: a
// document begins at position 0 and at every doc_token (the EOT token that
// starts each document in the shards); spans[b * T + i] = {the first position
// of i's document, one past its last}.
inline void document_spans(int2* spans, const int* tokens, int B, int T, int doc_token) {
    for (int b = 0; b < B; b++) {
        const int* x = tokens + (size_t)b * T;
        int2* sp = spans + (size_t)b * T;
        for (int start = 0; start < T;) {
            int end = start + 1;
            while (end < T && x[end] != doc_token) end++;
            for (int i = start; i < end; i++) sp[i] = make_int2(start, end);
            start = end;
        }
    }
}

// NH query heads share NKV key/value heads: NKV must divide NH (NKV = NH: multi-head attention).
inline void attention_check_heads(int NH, int NKV) {
    if (NKV < 1 || NH % NKV != 0) llmc::failf("attention: %d key/value heads do not divide %d query heads", NKV, NH);
}

// Both precisions read rows of qkv and dout 16 bytes at a time (cp.async;
// attention_fp32's load_rows), so every row starts 16-byte aligned (HS * the
// element size is a multiple of 16) where the arrays do.
inline void attention_check_aligned(const void* p, const char* name) {
    if ((uintptr_t)p % 16 != 0) llmc::failf("attention: %s is not 16-byte aligned", name);
}

// out (B,T,C) and lse (B,NH,T) from qkv (B,T,(NH+2NKV)HS); causal, scale 1/sqrt(HS).
// docs: nullptr, or (B, T) document spans (document_spans): causal within each
// document only.
inline void attention_forward(floatX* out, float* lse, const floatX* qkv, const int2* docs, int B, int T, int NH,
                              int NKV, int HS, cudaStream_t stream) {
    attention_check_heads(NH, NKV);
    if ((size_t)B * T * NH == 0) return;
    attention_check_aligned(qkv, "qkv");
    attention_detail::forward(out, lse, qkv, docs, B, T, NH, NKV, HS, stream);
}

// Floats of scratch attention_backward needs: D_i = dout_i . out_i per (b, h, i).
inline size_t attention_backward_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

// dqkv (B,T,(NH+2NKV)HS) is overwritten with dL/dqkv. scratch: attention_backward_scratch_floats floats.
inline void attention_backward(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                               const float* lse, const int2* docs, int B, int T, int NH, int NKV, int HS,
                               cudaStream_t stream) {
    attention_check_heads(NH, NKV);
    if ((size_t)B * T * NH == 0) return;
    attention_check_aligned(qkv, "qkv");
    attention_check_aligned(dout, "dout");
    attention_detail::backward(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, HS, stream);
}
