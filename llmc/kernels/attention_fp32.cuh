// Causal attention on fp32 CUDA cores: the path of the fp32 build
// (PRECISION=FP32, floatX = float), which the tight reference tests use. The
// bf16 build runs the tensor-core kernels of attention.cuh; the math, layouts
// and the flash scheme (online softmax, log-sum-exp saved, no atomics) are the
// same, see there.
//
// Design, shared by the three kernels: a block of ROWS threads owns ROWS
// consecutive rows of one (batch, head) -- query rows in the forward and in
// the dQ kernel, key rows in the dK/dV kernel -- one row per thread. The owned
// rows sit in shared memory with an odd row stride (HS + 1, so the threads of
// a warp reading "their" element d hit 32 different banks); the per-row
// accumulators (o, dq, dk, dv) are register arrays, which is why HS is a
// template parameter. The other side (K and V, or Q and dO) streams through
// shared memory in tiles of TILE rows that every thread reads in the same
// order (broadcast reads, 16 bytes at a time), processed CH rows at a time
// (8; 4 for HS < 32) so the scores of a chunk stay in registers.
//
//   HS    ROWS  TILE  CH  shared memory (forward / dQ / dK,dV)
//   8      64    64   4   6.2 / 8.5 / 9.0 KB
//   16     64    64   4   12.2 / 16.5 / 17.0 KB
//   32     64    32   8   16.2 / 24.5 / 24.8 KB
//   64     64    16   8   24.2 / 40.5 / 40.6 KB
//   128    32     8   8   24.1 / 40.2 / 40.3 KB
// (all under the 48 KB a kernel may use without opting in).
// Grid: (B*NH, ceil(T/ROWS)), so T <= 65535 * ROWS; the dK/dV kernel (B*NKV, ceil(T/ROWS)).
// Grouped-query attention (NKV key/value heads, G = NH / NKV query heads each;
// layouts in attention.cuh): the forward and dQ blocks of query head h read kv
// head h / G; a dK/dV block owns the key rows of one kv head and runs the
// query tiles of its G query heads one head after another into the same
// accumulators (dK_j = sum over the group, a fixed order: no atomics).
// Document masking (docs != nullptr: (B, T) spans {first position of the
// token's document, one past its last}): query i sees keys start_i <= j <= i;
// tiles before the document of a block's first row (dK/dV: after the end of
// the document of its last key) are not loaded, chunks a row cannot see skipped.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include "llmc/kernels/cuda_common.h"

namespace attention_fp32 {

__device__ __forceinline__ int2 doc_span(const int2* docs_b, int i, int T) {
    return docs_b ? docs_b[i] : make_int2(0, T);
}

template <int HS>
struct Config {
    static_assert(HS % 4 == 0, "attention: HS must be a multiple of 4 (float4 tile reads)");
    static constexpr int ROWS = HS <= 64 ? 64 : 4096 / HS;          // threads per block = owned rows
    static constexpr int TILE = 1024 / HS < 64 ? 1024 / HS : 64;    // rows per streamed tile
    // rows per register chunk. For small HS nvcc keeps a whole chunk of the
    // tiles (2 * CH * HS floats) in registers between the score and the update
    // loops; CH = 4 keeps that under the register file (CH = 8 spills at HS = 16).
    static constexpr int CH = HS >= 32 ? 8 : 4;
    static constexpr int OWN = HS + 1;                               // owned-row stride (odd: no bank conflicts)
    static_assert(TILE % CH == 0 && ROWS % TILE == 0, "attention: tile sizes");
    // floats of dynamic shared memory per kernel
    static constexpr size_t fwd_floats = 2 * TILE * HS + ROWS * OWN;
    static constexpr size_t dq_floats = 2 * TILE * HS + 2 * ROWS * OWN;
    static constexpr size_t dkv_floats = 2 * TILE * HS + 2 * TILE + 2 * ROWS * OWN;
    static_assert(dkv_floats * sizeof(float) <= 48 * 1024 && dq_floats * sizeof(float) <= 48 * 1024,
                  "attention: shared memory over 48 KB");
};

// s[c] = sum_d own[d] * tile[c*HS + d],  c < CH. `tile` is 16-byte aligned
// (HS % 4 == 0 and every tile starts at a multiple of 4 floats).
template <int HS, int CH>
__device__ __forceinline__ void dot_chunk(float (&s)[CH], const float* own, const float* tile) {
#pragma unroll
    for (int c = 0; c < CH; c++) s[c] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HS; d += 4) {
        const float a0 = own[d], a1 = own[d + 1], a2 = own[d + 2], a3 = own[d + 3];
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const float4 t = *reinterpret_cast<const float4*>(tile + c * HS + d);
            s[c] += a0 * t.x + a1 * t.y + a2 * t.z + a3 * t.w;
        }
    }
}

// acc[d] += sum_c w[c] * tile[c*HS + d]
template <int HS, int CH>
__device__ __forceinline__ void accumulate_chunk(float (&acc)[HS], const float (&w)[CH], const float* tile) {
#pragma unroll
    for (int d = 0; d < HS; d += 4) {
        float x = acc[d], y = acc[d + 1], z = acc[d + 2], u = acc[d + 3];
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const float4 t = *reinterpret_cast<const float4*>(tile + c * HS + d);
            x += w[c] * t.x;
            y += w[c] * t.y;
            z += w[c] * t.z;
            u += w[c] * t.w;
        }
        acc[d] = x;
        acc[d + 1] = y;
        acc[d + 2] = z;
        acc[d + 3] = u;
    }
}

// Cooperative copy of `rows` rows starting at `row0` (HS floats each, global row
// stride `stride`) into shared memory with row stride `dst_stride`, 16 bytes a
// thread at a time (the rows start 16-byte aligned: attention.cuh checks the arrays); rows at or
// past T read as zero. Consecutive threads read consecutive 16-byte pieces
// (coalesced; where a block's threads run one after another, on the CPU, a
// quarter of the index arithmetic of one float at a time). SCALED: each value
// times `scale` on the way.
template <int HS, int NTHREADS, bool SCALED = false>
__device__ __forceinline__ void load_rows(float* dst, int dst_stride, const float* src, size_t stride, int row0,
                                          int rows, int T, float scale = 1.0f) {
    constexpr int V = HS / 4;  // 16-byte pieces per row
    for (int e = threadIdx.x; e < rows * V; e += NTHREADS) {
        const int r = e / V, d = e % V * 4, row = row0 + r;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < T) x = *reinterpret_cast<const float4*>(src + (size_t)row * stride + d);
        float* o = dst + r * dst_stride + d;  // dst_stride may be odd (HS + 1): four stores
        o[0] = SCALED ? x.x * scale : x.x;
        o[1] = SCALED ? x.y * scale : x.y;
        o[2] = SCALED ? x.z * scale : x.z;
        o[3] = SCALED ? x.w * scale : x.w;
    }
}

// The K/V tile of keys [k0, k0 + TILE) into shared memory, between two barriers
// (everyone is done with the previous tile before it is overwritten; the new
// one is complete before anyone reads it). Forward and dQ kernel; k_base and
// v_base: the kv head's first row of K and of V.
template <int HS, int R, int TILE>
__device__ __forceinline__ void load_kv_tile(float* tile_k, float* tile_v, const float* k_base, const float* v_base,
                                             size_t stride, int k0, int T) {
    __syncthreads();
    load_rows<HS, R>(tile_k, HS, k_base, stride, k0, TILE, T);
    load_rows<HS, R>(tile_v, HS, v_base, stride, k0, TILE, T);
    __syncthreads();
}

// Row stride of qkv and dqkv, (NH + 2 NKV) HS, and the columns where the K and
// the V of kv head kvh begin.
__host__ __device__ __forceinline__ size_t qkv_stride(int NH, int NKV, int HS) { return (size_t)(NH + 2 * NKV) * HS; }
__host__ __device__ __forceinline__ int k_column(int NH, int kvh, int HS) { return (NH + kvh) * HS; }
__host__ __device__ __forceinline__ int v_column(int NH, int NKV, int kvh, int HS) { return (NH + NKV + kvh) * HS; }

// ---------------------------------------------------------------------------
// Forward. For query row i (keys j <= i), with s_ij = (q_i . k_j) / sqrt(HS):
//   m_i   = max_j s_ij,   l_i = sum_j exp(s_ij - m_i)
//   out_i = sum_j exp(s_ij - m_i) v_j / l_i,   lse_i = m_i + log(l_i)
// computed online: keys arrive in chunks; when a chunk raises the running max
// from m to m', the running l and o are first multiplied by exp(m - m').
// Block: ROWS threads = ROWS query rows of one (b, h); grid (B*NH, ceil(T/ROWS)),
// query blocks in reverse order so the longest (latest rows) start first.
template <int HS>
__global__ void __launch_bounds__(Config<HS>::ROWS)
    attention_forward_kernel(float* out, float* lse, const float* qkv, const int2* docs, int T, int NH, int NKV) {
    using Cfg = Config<HS>;
    constexpr int R = Cfg::ROWS, TILE = Cfg::TILE, CH = Cfg::CH, OWN = Cfg::OWN;
    extern __shared__ float attn_smem[];
    float* tile_k = attn_smem;              // TILE x HS
    float* tile_v = tile_k + TILE * HS;     // TILE x HS
    float* own_q = tile_v + TILE * HS;      // R x OWN, pre-scaled by 1/sqrt(HS)

    const int C = NH * HS, bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * R;
    const int i = q0 + threadIdx.x;
    const size_t stride = qkv_stride(NH, NKV, HS);
    const float* seq = qkv + (size_t)b * T * stride;
    const float* base = seq + h * HS;  // q
    const float *k_base = seq + k_column(NH, kvh, HS), *v_base = seq + v_column(NH, NKV, kvh, HS);
    const float scale = 1.0f / sqrtf((float)HS);

    load_rows<HS, R, true>(own_q, OWN, base, stride, q0, R, T, scale);
    const float* q = own_q + threadIdx.x * OWN;

    float o[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    const int2* docs_b = docs ? docs + (size_t)b * T : nullptr;
    const int start = doc_span(docs_b, min(i, T - 1), T).x;  // this row's document
    // this block needs keys [kv_begin, kv_end): from the document of its first row
    const int kv_begin = doc_span(docs_b, q0, T).x / TILE * TILE, kv_end = min(T, q0 + R);
    for (int k0 = kv_begin; k0 < kv_end; k0 += TILE) {
        load_kv_tile<HS, R, TILE>(tile_k, tile_v, k_base, v_base, stride, k0, T);
#pragma unroll 1  // chunks one after another (code size)
        for (int c0 = 0; c0 < TILE; c0 += CH) {
            const int j0 = k0 + c0;
            if (i >= T || j0 > i || j0 + CH <= start) continue;  // the row sees no key of the chunk
            float s[CH];
            dot_chunk<HS, CH>(s, q, tile_k + c0 * HS);
            float chunk_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                if (j0 + c > i || j0 + c < start) s[c] = -INFINITY;  // causal and document mask
                chunk_max = fmaxf(chunk_max, s[c]);
            }
            if (chunk_max > m) {  // chunk_max is finite: the chunk holds a key the row sees
                const float corr = expf(m - chunk_max);  // 0 on the first chunk
                l *= corr;
#pragma unroll
                for (int d = 0; d < HS; d++) o[d] *= corr;
                m = chunk_max;
            }
            float p[CH];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                p[c] = expf(s[c] - m);
                l += p[c];
            }
            accumulate_chunk<HS, CH>(o, p, tile_v + c0 * HS);
        }
    }
    if (i < T) {
        const float inv_l = 1.0f / l;
        float* dst = out + ((size_t)b * T + i) * C + h * HS;
#pragma unroll
        for (int d = 0; d < HS; d++) dst[d] = (o[d] * inv_l);
        lse[(size_t)bh * T + i] = m + logf(l);
    }
}

// ---------------------------------------------------------------------------
// Backward. With P_ij = exp(s_ij - lse_i) (recomputed), dO = dout:
//   dV_j  = sum_{i>=j} P_ij dO_i
//   dP_ij = dO_i . v_j
//   D_i   = sum_j P_ij dP_ij = dO_i . out_i
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i  = scale * sum_{j<=i} dS_ij k_j
//   dK_j  = scale * sum_{i>=j} dS_ij q_i
// Two kernels, each owning the rows it writes (no atomics, fixed order):
// (1) query rows: D_i (saved in scratch) and dQ_i, streaming K/V tiles;
// (2) key rows: dK_j and dV_j, streaming Q/dO tiles with their lse and D.

// (1) Block: ROWS query rows of one (b, h), as the forward.
template <int HS>
__global__ void __launch_bounds__(Config<HS>::ROWS)
    attention_backward_dq_kernel(float* dqkv, float* Dvec, const float* dout, const float* qkv, const float* out,
                                 const float* lse, const int2* docs, int T, int NH, int NKV) {
    using Cfg = Config<HS>;
    constexpr int R = Cfg::ROWS, TILE = Cfg::TILE, CH = Cfg::CH, OWN = Cfg::OWN;
    extern __shared__ float attn_smem[];
    float* tile_k = attn_smem;             // TILE x HS
    float* tile_v = tile_k + TILE * HS;    // TILE x HS
    float* own_q = tile_v + TILE * HS;     // R x OWN
    float* own_do = own_q + R * OWN;       // R x OWN

    const int C = NH * HS, bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * R;
    const int i = q0 + threadIdx.x;
    const size_t stride = qkv_stride(NH, NKV, HS);
    const float* seq = qkv + (size_t)b * T * stride;
    const float* base = seq + h * HS;
    const float *k_base = seq + k_column(NH, kvh, HS), *v_base = seq + v_column(NH, NKV, kvh, HS);
    const size_t out_off = (size_t)b * T * C + h * HS;  // (b, 0, h) in out / dout
    const float scale = 1.0f / sqrtf((float)HS);

    load_rows<HS, R>(own_q, OWN, base, stride, q0, R, T);
    load_rows<HS, R>(own_do, OWN, dout + out_off, C, q0, R, T);
    __syncthreads();
    const float* q = own_q + threadIdx.x * OWN;
    const float* dO = own_do + threadIdx.x * OWN;

    float D = 0.0f, L = 0.0f;
    if (i < T) {
        const float* o = out + out_off + (size_t)i * C;
        for (int d = 0; d < HS; d++) D += dO[d] * (o[d]);
        Dvec[(size_t)bh * T + i] = D;
        L = lse[(size_t)bh * T + i];
    }

    float dq[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) dq[d] = 0.0f;

    const int2* docs_b = docs ? docs + (size_t)b * T : nullptr;
    const int start = doc_span(docs_b, min(i, T - 1), T).x;
    const int kv_begin = doc_span(docs_b, q0, T).x / TILE * TILE, kv_end = min(T, q0 + R);  // as the forward
    for (int k0 = kv_begin; k0 < kv_end; k0 += TILE) {
        load_kv_tile<HS, R, TILE>(tile_k, tile_v, k_base, v_base, stride, k0, T);
#pragma unroll 1  // chunks one after another (code size)
        for (int c0 = 0; c0 < TILE; c0 += CH) {
            const int j0 = k0 + c0;
            if (i >= T || j0 > i || j0 + CH <= start) continue;
            float s[CH], ds[CH];
            dot_chunk<HS, CH>(s, q, tile_k + c0 * HS);
            dot_chunk<HS, CH>(ds, dO, tile_v + c0 * HS);  // dP
#pragma unroll
            for (int c = 0; c < CH; c++) {
                const float p = j0 + c <= i && j0 + c >= start ? expf(s[c] * scale - L) : 0.0f;
                ds[c] = p * (ds[c] - D);
            }
            accumulate_chunk<HS, CH>(dq, ds, tile_k + c0 * HS);
        }
    }
    if (i < T) {
        float* dst = dqkv + ((size_t)b * T + i) * stride + h * HS;
#pragma unroll
        for (int d = 0; d < HS; d++) dst[d] = (dq[d] * scale);
    }
}

// (2) Block: ROWS key rows of one (b, kv head); grid (B*NKV, ceil(T/ROWS)) in
// natural order (the earliest keys have the most queries). For each query head
// of the group in turn, query tiles run from the block's first key to T.
template <int HS>
__global__ void __launch_bounds__(Config<HS>::ROWS)
    attention_backward_dkv_kernel(float* dqkv, const float* Dvec, const float* dout, const float* qkv, const float* lse,
                                  const int2* docs, int T, int NH, int NKV) {
    using Cfg = Config<HS>;
    constexpr int R = Cfg::ROWS, TILE = Cfg::TILE, CH = Cfg::CH, OWN = Cfg::OWN;
    extern __shared__ float attn_smem[];
    float* tile_q = attn_smem;             // TILE x HS
    float* tile_do = tile_q + TILE * HS;   // TILE x HS
    float* tile_lse = tile_do + TILE * HS; // TILE
    float* tile_D = tile_lse + TILE;       // TILE
    float* own_k = tile_D + TILE;          // R x OWN
    float* own_v = own_k + R * OWN;        // R x OWN

    const int C = NH * HS, G = NH / NKV, b = blockIdx.x / NKV, kvh = blockIdx.x % NKV;
    const int kb0 = blockIdx.y * R;
    const int j = kb0 + threadIdx.x;
    const size_t stride = qkv_stride(NH, NKV, HS);
    const float* seq = qkv + (size_t)b * T * stride;
    const float scale = 1.0f / sqrtf((float)HS);

    load_rows<HS, R>(own_k, OWN, seq + k_column(NH, kvh, HS), stride, kb0, R, T);
    load_rows<HS, R>(own_v, OWN, seq + v_column(NH, NKV, kvh, HS), stride, kb0, R, T);
    const float* k = own_k + threadIdx.x * OWN;
    const float* v = own_v + threadIdx.x * OWN;

    float dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) dk[d] = dv[d] = 0.0f;

    const int2* docs_b = docs ? docs + (size_t)b * T : nullptr;
    const int end = doc_span(docs_b, min(j, T - 1), T).y;  // queries before the end of key j's document
    const int q_end = doc_span(docs_b, min(kb0 + R, T) - 1, T).y;  // ... of the block's last key
#pragma unroll 1
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {  // the group's query heads, in order
        const float* q_base = seq + h * HS;
        const float* dout_base = dout + (size_t)b * T * C + h * HS;
        const float* lse_bh = lse + ((size_t)b * NH + h) * T;
        const float* D_bh = Dvec + ((size_t)b * NH + h) * T;
        for (int i0 = kb0 / TILE * TILE; i0 < q_end; i0 += TILE) {
            __syncthreads();
            load_rows<HS, R>(tile_q, HS, q_base, stride, i0, TILE, T);
            load_rows<HS, R>(tile_do, HS, dout_base, C, i0, TILE, T);
            for (int r = threadIdx.x; r < TILE; r += R) {
                tile_lse[r] = i0 + r < T ? lse_bh[i0 + r] : 0.0f;
                tile_D[r] = i0 + r < T ? D_bh[i0 + r] : 0.0f;
            }
            __syncthreads();
#pragma unroll 1  // chunks one after another (code size)
            for (int c0 = 0; c0 < TILE; c0 += CH) {
                const int ic = i0 + c0;
                if (j >= T || ic + CH - 1 < j || ic >= end) continue;  // no query of the chunk sees key j
                float s[CH], dp[CH], p[CH];
                dot_chunk<HS, CH>(s, k, tile_q + c0 * HS);
                dot_chunk<HS, CH>(dp, v, tile_do + c0 * HS);
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    const int iq = ic + c;
                    p[c] = iq >= j && iq < end ? expf(s[c] * scale - tile_lse[c0 + c]) : 0.0f;
                    dp[c] = p[c] * (dp[c] - tile_D[c0 + c]);  // dS
                }
                accumulate_chunk<HS, CH>(dv, p, tile_do + c0 * HS);
                accumulate_chunk<HS, CH>(dk, dp, tile_q + c0 * HS);
            }
        }
    }
    if (j < T) {
        float* dst = dqkv + ((size_t)b * T + j) * stride;
#pragma unroll
        for (int d = 0; d < HS; d++) {
            dst[k_column(NH, kvh, HS) + d] = (dk[d] * scale);
            dst[v_column(NH, NKV, kvh, HS) + d] = (dv[d]);
        }
    }
}

template <int HS>
inline void forward_launch(float* out, float* lse, const float* qkv, const int2* docs, int B, int T, int NH, int NKV,
                           cudaStream_t stream) {
    using Cfg = Config<HS>;
    const dim3 grid(B * NH, CEIL_DIV(T, Cfg::ROWS));
    attention_forward_kernel<HS>
        <<<grid, Cfg::ROWS, Cfg::fwd_floats * sizeof(float), stream>>>(out, lse, qkv, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
}

template <int HS>
inline void backward_launch(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                            const float* lse, const int2* docs, int B, int T, int NH, int NKV, cudaStream_t stream) {
    using Cfg = Config<HS>;
    const dim3 grid(B * NH, CEIL_DIV(T, Cfg::ROWS)), grid_kv(B * NKV, CEIL_DIV(T, Cfg::ROWS));
    attention_backward_dq_kernel<HS><<<grid, Cfg::ROWS, Cfg::dq_floats * sizeof(float), stream>>>(
        dqkv, scratch, dout, qkv, out, lse, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
    attention_backward_dkv_kernel<HS><<<grid_kv, Cfg::ROWS, Cfg::dkv_floats * sizeof(float), stream>>>(
        dqkv, scratch, dout, qkv, lse, docs, T, NH, NKV);
    cudaCheck(cudaGetLastError());
}

[[noreturn]] inline void attention_fp32_unsupported(int HS) {
    llmc::fail("attention: head size " + std::to_string(HS) + " not supported in fp32 (8, 16, 32, 64, 128)");
}

// out (B,T,C) and lse (B,NH,T) from qkv (B,T,(NH+2NKV)HS); HS in {8, 16, 32, 64, 128}. Templates
// (F = float) so that only a build that calls them instantiates their kernels.
template <class F>
inline void forward(F* out, float* lse, const F* qkv, const int2* docs, int B, int T, int NH, int NKV, int HS,
                    cudaStream_t stream) {
    switch (HS) {
        case 8: forward_launch<8>(out, lse, qkv, docs, B, T, NH, NKV, stream); break;
        case 16: forward_launch<16>(out, lse, qkv, docs, B, T, NH, NKV, stream); break;
        case 32: forward_launch<32>(out, lse, qkv, docs, B, T, NH, NKV, stream); break;
        case 64: forward_launch<64>(out, lse, qkv, docs, B, T, NH, NKV, stream); break;
        case 128: forward_launch<128>(out, lse, qkv, docs, B, T, NH, NKV, stream); break;
        default: attention_fp32_unsupported(HS);
    }
}

template <class F>
inline void backward(F* dqkv, float* scratch, const F* dout, const F* qkv, const F* out, const float* lse,
                     const int2* docs, int B, int T, int NH, int NKV, int HS, cudaStream_t stream) {
    switch (HS) {
        case 8: backward_launch<8>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream); break;
        case 16: backward_launch<16>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream); break;
        case 32: backward_launch<32>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream); break;
        case 64: backward_launch<64>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream); break;
        case 128: backward_launch<128>(dqkv, scratch, dout, qkv, out, lse, docs, B, T, NH, NKV, stream); break;
        default: attention_fp32_unsupported(HS);
    }
}

}  // namespace attention_fp32
