// Fused softmax + cross-entropy over rows of padded logits, and a deterministic
// loss accumulation. The (N, Vp) logits are the largest activation of the
// model, so the gradient is written over them in place instead of into a
// second buffer of the same size.
#pragma once
#include <cmath>
#include "llmc/kernels/cuda_common.h"

// ---------------------------------------------------------------------------
// Online softmax state over a set of logits: m = max x, s = sum exp(x - m).
// Two states merge as m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m); an
// empty state (m = -inf, s = 0) contributes nothing (and no NaN from inf - inf).
__device__ inline float softmax_rescale(float s, float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : s * expf(m_old - m_new);
}

__device__ inline void softmax_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    s = softmax_rescale(s, m, mn) + softmax_rescale(s2, m2, mn);
    m = mn;
}

// Merges the 32 lanes' states (m, s) (warp_reduce's butterfly); every lane
// gets the same result.
struct SoftmaxMerge {
    __device__ float2 operator()(float2 a, float2 b) const {
        softmax_merge(a.x, a.y, b.x, b.y);
        return a;
    }
};
__device__ inline void warp_softmax_merge(float& m, float& s) {
    const float2 merged = warp_reduce(make_float2(m, s), SoftmaxMerge());
    m = merged.x;
    s = merged.y;
}

// block_softmax_merge's static shared memory, one array so that its size is
// what ptxas reserves (the launcher counts it): the warps' m, their s, then
// the block's (m, s), padded to 16 bytes.
constexpr int SOFTMAX_MERGE_FLOATS = 2 * WARP_SIZE + 4;

// Merges every thread's state over the block (blockDim.x a multiple of 32);
// every thread gets the same, fixed-order result. Warp 0 alone merges the
// warps' states and shares the result (a barrier instead of every warp
// repeating the same five shuffles: the same bits, fewer warp meetings).
__device__ inline void block_softmax_merge(float& m, float& s) {
    __shared__ float merge_smem[SOFTMAX_MERGE_FLOATS];
    float *warp_m = merge_smem, *warp_s = merge_smem + WARP_SIZE, *block_ms = merge_smem + 2 * WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    warp_softmax_merge(m, s);
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < num_warps ? warp_m[lane] : -INFINITY;
        s = lane < num_warps ? warp_s[lane] : 0.0f;
        warp_softmax_merge(m, s);
        if (lane == 0) {
            block_ms[0] = m;
            block_ms[1] = s;
        }
    }
    __syncthreads();
    m = block_ms[0];
    s = block_ms[1];
}

// One block per row i of logits x = logits[i, 0..Vp), target y = targets[i]:
//   loss[i] = log(sum_{c<V} exp(x[c] - m)) + m - x[y],   m = max_{c<V} x[c]
//   dlogits[i, c] = dloss * (softmax(x)[c] - [c == y])  for c < V,  0 for V <= c < Vp
// masked rows (y == -1): loss 0, dlogits all 0.
// Pass 1 loads each thread's N-element packs (16-byte accesses where Vp and
// the pointer allow; 1 element otherwise) and folds them into the online
// max+sum. CACHED: the row is read from memory once, pass 1 keeping it in the
// block's shared memory (Vp elements, ~100 KB at GPT-2's vocabulary: two blocks
// per SM); a row larger than a block's shared memory (Llama 3's 128256 logits
// are 251 KB in bf16, an H100/H200 block has at most 227 KB) is read a second
// time instead, from global memory (mostly from L2, which pass 1 just filled).
// After the block merge (whose barriers order every read of x, including
// x[y], before any write) pass 2 turns each thread's own packs, read back,
// into the gradient and writes it over the logits. A thread only ever reads
// back what it loaded itself, so no barrier is needed for that.
template <int N, bool CACHED>
__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                                        bool write_dlogits) {
    extern __shared__ uint4 classifier_smem[];  // one name and type for every N (nvcc requires it)
    Packed<floatX, N>* row_cache = reinterpret_cast<Packed<floatX, N>*>(classifier_smem);  // Vp / N packs
    const int row = blockIdx.x;
    floatX* x = logits + (size_t)row * Vp;
    const int target = targets[row];
    const int packs = Vp / N;
    if (target < 0) {  // the same for the whole block: no barrier is skipped by only some threads
        if (threadIdx.x == 0) losses[row] = 0.0f;
        const Packed<floatX, N> zero = {};
        if (write_dlogits)
            for (int k = threadIdx.x; k < packs; k += blockDim.x) store_packed(x + k * N, zero);
        return;
    }
    const float x_target = to_float(x[target]);
    float m = -INFINITY, s = 0.0f;
    for (int k = threadIdx.x; k < packs; k += blockDim.x) {
        const Packed<floatX, N> xv = CACHED ? load_packed_streaming<N>(x + k * N) : load_packed<N>(x + k * N);
        if constexpr (CACHED) row_cache[k] = xv;
#pragma unroll
        for (int e = 0; e < N; e++) {
            if (k * N + e >= V) break;
            const float v = to_float(xv.v[e]);
            if (v > m) {
                s = softmax_rescale(s, m, v) + 1.0f;
                m = v;
            } else {
                s += expf(v - m);
            }
        }
    }
    block_softmax_merge(m, s);
    if (threadIdx.x == 0) losses[row] = logf(s) + m - x_target;
    if (!write_dlogits) return;
    const float inv_s = 1.0f / s;
    for (int k = threadIdx.x; k < packs; k += blockDim.x) {
        Packed<floatX, N> xv = CACHED ? row_cache[k] : load_packed<N>(x + k * N);
#pragma unroll
        for (int e = 0; e < N; e++) {
            const int c = k * N + e;
            float d = 0.0f;
            if (c < V) {
                const float p = expf(to_float(xv.v[e]) - m) * inv_s;
                d = dloss * (p - (c == target ? 1.0f : 0.0f));
            }
            xv.v[e] = from_float<floatX>(d);
        }
        store_packed(x + k * N, xv);
    }
}

// targets[i] in [0, V) or -1 (masked). dloss = 1 / (unmasked targets in the whole global batch).
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream) {
    if (N <= 0) return;
    // one row in shared memory where it fits beside the block merge's static array (with the opt-in)
    const size_t row_bytes = (size_t)Vp * sizeof(floatX), merge_bytes = SOFTMAX_MERGE_FLOATS * sizeof(float);
    const bool cached = row_bytes + merge_bytes <= (size_t)device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const size_t smem = cached ? row_bytes : 0;
    // 1024 threads: ~6 packs of 8 each at V = 50257; small vocabularies get just enough warps
    const int block = Vp >= 1024 ? 1024 : CEIL_DIV(Vp, WARP_SIZE) * WARP_SIZE;
    with_pack_width<floatX>(pack_width<floatX>(Vp, logits), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        if (!cached) {
            fused_classifier_kernel<P, false>
                <<<N, block, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
            return;
        }
        static size_t granted = 48 << 10;  // above the default 48 KB a kernel needs the opt-in
        if (smem > granted) {
            cudaCheck(cudaFuncSetAttribute(fused_classifier_kernel<P, true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            granted = smem;
        }
        fused_classifier_kernel<P, true>
            <<<N, block, smem, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    });
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// loss_sum[0] += scale * sum_i losses[i]
// One block: thread k sums losses k, k+1024, ... in order, then a fixed-order
// block reduction; the same bits every run, and nothing waits on the host.
__global__ void accumulate_loss_kernel(float* loss_sum, const float* losses, int N, float scale) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) sum += losses[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) loss_sum[0] += scale * sum;
}

inline void accumulate_loss(float* loss_sum, const float* losses, int N, float scale, cudaStream_t stream) {
    accumulate_loss_kernel<<<1, 1024, 0, stream>>>(loss_sum, losses, N, scale);
    cudaCheck(cudaGetLastError());
}

// A model's cross-entropy step: the per-token losses of the (N, Vp) logits
// (dloss/dlogits in their place with write_dlogits), and scale x their sum
// added to loss_sum.
inline void classifier_loss(floatX* logits, float* losses, const int* targets, float scale, int N, int V, int Vp,
                            bool write_dlogits, float* loss_sum, cudaStream_t stream) {
    fused_classifier(logits, losses, targets, scale, N, V, Vp, write_dlogits, stream);
    accumulate_loss(loss_sum, losses, N, scale, stream);
}
