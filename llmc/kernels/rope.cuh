// Rotary position embedding (RoPE) of Llama, forward and backward, with Llama
// 3.1's frequency scaling.
//
// Pairing: transformers' Llama convention (rotate_half): in each head of HS
// elements, element i is paired with element i + HS/2, for i < HS/2. Meta's
// original checkpoints pair (2i, 2i+1) instead; transformers' conversion
// permutes the rows of the q and k projections so that the two agree, and the
// weights this trainer imports and exports are in transformers' layout.
//
// For a token at position p, pair i rotates by the angle p * f_i:
//   y[i]        = x[i] cos(p f_i) - x[i + HS/2] sin(p f_i)
//   y[i + HS/2] = x[i + HS/2] cos(p f_i) + x[i] sin(p f_i)
// The backward is the transposed rotation (angle -p f_i) applied to dy.
//
// The cos and sin values come from a table computed on the host in double and
// rounded once to fp32 (rope_table), uploaded by the caller: every build (GPU,
// the CPU runtime, bf16 and fp32) then rotates by exactly the same numbers,
// where the device's sinf/cosf of an fp32 angle p * f_i would differ from one
// math library to the next and lose accuracy as p grows.
#pragma once
#include <cmath>
#include <vector>

#include "llmc/kernels/cuda_common.h"

// Llama 3.1's rope_scaling ("rope_type": "llama3" in a transformers config).
// factor = 1 leaves every frequency as it is (Llama 3.0 and earlier), whatever
// the other fields say.
struct RopeScaling {
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double original_max_position = 8192.0;  // original_max_position_embeddings
};

// f_i = theta^(-2i/HS), i in [0, HS/2), then Llama 3.1's rule, with wavelength
// w_i = 2 pi / f_i and the two wavelength thresholds
//   w_high = original_max_position / high_freq_factor
//   w_low  = original_max_position / low_freq_factor:
//   w_i < w_high:  f_i unchanged               (fast rotations: local order)
//   w_i > w_low:   f_i / factor                (slow ones: stretched to the longer context)
//   otherwise:     (1 - s) f_i / factor + s f_i,
//                  s = (original_max_position / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
// (s runs from 0 at w_low to 1 at w_high, so the three pieces join continuously).
inline std::vector<double> rope_frequencies(int HS, double theta, const RopeScaling& s) {
    if (HS <= 0 || HS % 2 != 0) llmc::failf("rope: head size %d must be positive and even", HS);
    if (!(theta > 1.0)) llmc::failf("rope: theta %g must be over 1", theta);
    if (!(s.factor >= 1.0) || !(s.low_freq_factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor) ||
        !(s.original_max_position > 0.0))
        llmc::failf("rope: scaling factor %g (>= 1), low_freq_factor %g (> 0), high_freq_factor %g (> low), "
                    "original_max_position %g (> 0) out of range",
                    s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position);
    const double w_high = s.original_max_position / s.high_freq_factor;
    const double w_low = s.original_max_position / s.low_freq_factor;
    std::vector<double> f(HS / 2);
    for (int i = 0; i < HS / 2; i++) {
        const double fi = std::pow(theta, -2.0 * i / HS), w = 2.0 * M_PI / fi;
        if (w < w_high) {
            f[i] = fi;
        } else if (w > w_low) {
            f[i] = fi / s.factor;
        } else {
            const double smooth = (s.original_max_position / w - s.low_freq_factor) /
                                  (s.high_freq_factor - s.low_freq_factor);
            f[i] = (1.0 - smooth) * fi / s.factor + smooth * fi;
        }
    }
    return f;
}

// The table the kernels read: maxT rows of HS floats, row p = [cos(p f_i), i < HS/2 | sin(p f_i), i < HS/2],
// the angle and its cos and sin in double, each rounded once to fp32.
inline std::vector<float> rope_table(int maxT, int HS, double theta, const RopeScaling& s) {
    if (maxT <= 0) llmc::failf("rope: table length %d must be positive", maxT);
    const std::vector<double> f = rope_frequencies(HS, theta, s);
    std::vector<float> table((size_t)maxT * HS);
    for (int p = 0; p < maxT; p++) {
        float* row = &table[(size_t)p * HS];
        for (int i = 0; i < HS / 2; i++) {
            const double angle = p * f[i];
            row[i] = (float)std::cos(angle);
            row[HS / 2 + i] = (float)std::sin(angle);
        }
    }
    return table;
}

// ---------------------------------------------------------------------------
// One thread per (token, head, pack of N pairs): it reads x[i..i+N) and
// x[i+HS/2..i+HS/2+N) as two 16-byte accesses (bf16, N = 8), their N cos and N
// sin from the table row of the token's position, and writes both packs back.
// Each element is read and then written by the same thread, so out may be inp
// (in place). sin_sign = +1 rotates (forward), -1 rotates back (backward).
// The position is positions[token] where given (document-relative positions),
// else the token's index t in its row of T. A position outside [0, maxT) has no
// table row: its outputs are NaN, which the loss then shows, instead of a read
// out of bounds.
template <int N>
__global__ void rope_kernel(floatX* out, const floatX* inp, const float* table, const int* positions, size_t tokens,
                            int T, int H, int HS, int stride, int maxT, float sin_sign) {
    const int half = HS / 2, packs = half / N;
    const BlockChunk chunk = block_chunk(tokens * H * packs);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const int i = (int)(k % packs) * N, h = (int)(k / packs % H);
        const size_t token = k / packs / H;
        const int p = positions ? positions[token] : (int)(token % T);
        const size_t at = token * stride + (size_t)h * HS + i;
        const Packed<floatX, N> x1 = load_packed<N>(inp + at), x2 = load_packed<N>(inp + at + half);
        Packed<floatX, N> y1, y2;
        if (p >= 0 && p < maxT) {
            const float* row = table + (size_t)p * HS;
            const Packed<float, N> c = load_packed<N>(row + i), s = load_packed<N>(row + half + i);
#pragma unroll
            for (int e = 0; e < N; e++) {
                const float a = to_float(x1.v[e]), b = to_float(x2.v[e]), sn = sin_sign * s.v[e];
                y1.v[e] = from_float<floatX>(a * c.v[e] - b * sn);
                y2.v[e] = from_float<floatX>(b * c.v[e] + a * sn);
            }
        } else {
#pragma unroll
            for (int e = 0; e < N; e++) y1.v[e] = y2.v[e] = from_float<floatX>(NAN);
        }
        store_packed(out + at, y1);
        store_packed(out + at + half, y2);
    }
}

// The layout both launchers take: `tokens` rows (B*T tokens, T per sequence) of
// `stride` elements; the first H heads of HS elements of each row are rotated,
// the rest of the row is neither read nor written (out of place, out's copy of
// it is left as it was). For the fused q|k|v output of grouped-query
// attention, [q: NH heads | k: NKV heads | v: NKV heads], that is H = NH + NKV
// and stride = (NH + 2 NKV) HS, in place. positions: tokens ints in [0, maxT), or
// null for t (then T <= maxT). table: rope_table(maxT, HS, ...) on the device.
inline void rope_launch(floatX* out, const floatX* inp, const float* table, const int* positions, int B, int T, int H,
                        int HS, int stride, int maxT, float sin_sign, cudaStream_t stream) {
    if (HS <= 0 || HS % 2 != 0 || H <= 0 || stride < H * HS || maxT <= 0 || (!positions && T > maxT))
        llmc::failf("rope: head size %d (even), %d heads, row stride %d (>= heads x head size), table length %d "
                    "(>= T %d without positions) do not fit",
                    HS, H, stride, maxT, T);
    const size_t tokens = (size_t)B * T;
    if (tokens == 0) return;
    const int block = 256;
    const int width = stride % PACK128<floatX> == 0 ? pack_width<floatX>(HS / 2, out, inp) : 1;
    with_pack_width<floatX>(width, [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        const size_t n = tokens * H * (HS / 2 / P);
        rope_kernel<P><<<chunked_grid_blocks(n, block), block, 0, stream>>>(out, inp, table, positions, tokens, T, H,
                                                                            HS, stride, maxT, sin_sign);
    });
    cudaCheck(cudaGetLastError());
}

// out = rope(inp); out may be inp.
inline void rope_forward(floatX* out, const floatX* inp, const float* table, const int* positions, int B, int T, int H,
                         int HS, int stride, int maxT, cudaStream_t stream) {
    rope_launch(out, inp, table, positions, B, T, H, HS, stride, maxT, 1.0f, stream);
}

// dinp = rope^T(dout), the gradient through the rotation; dinp may be dout.
inline void rope_backward(floatX* dinp, const floatX* dout, const float* table, const int* positions, int B, int T,
                          int H, int HS, int stride, int maxT, cudaStream_t stream) {
    rope_launch(dinp, dout, table, positions, B, T, H, HS, stride, maxT, -1.0f, stream);
}
