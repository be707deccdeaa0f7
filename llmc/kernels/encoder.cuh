// Token + position embedding: forward, and a backward without atomics.
//
// The backward of an embedding lookup scatters each position's gradient into
// the row of its token; many positions share a token, so a naive kernel needs
// atomics (and is then not reproducible). Instead the host, which has the
// tokens anyway, groups the positions by token once per microbatch (the
// "plan"); the device then gives each distinct token to one warp, which sums
// its positions in a fixed order and owns that row of dwte outright.
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>
#include "llmc/kernels/cuda_common.h"

// ---------------------------------------------------------------------------
// Forward: out[b,t,c] = wte[inp[b,t], c] + wpe[pos[b,t], c]   (sum in fp32, one rounding)
// pos: position ids (e.g. restarting at each document), or nullptr for pos[b,t] = t.
// wpe: nullptr for a model without a position table (out = wte[inp], Llama's).
// N consecutive c per thread (16-byte accesses, or 1 where C or a pointer does
// not allow them) in a block-chunked loop; consecutive threads take consecutive
// c, so the wte/wpe row reads and the out writes are coalesced.
template <int N>
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const int* pos, const floatX* wte,
                                       const floatX* wpe, int T, int C, size_t total) {
    const BlockChunk chunk = block_chunk(total / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        const size_t i = k * N, bt = i / C;
        const int c = (int)(i % C);
        const int t = pos ? pos[bt] : (int)(bt % T);
        const Packed<floatX, N> w = load_packed<N>(wte + (size_t)inp[bt] * C + c);
        Packed<floatX, N> o = w;
        if (wpe) {
            const Packed<floatX, N> p = load_packed<N>(wpe + (size_t)t * C + c);
#pragma unroll
            for (int e = 0; e < N; e++) o.v[e] = from_float<floatX>(to_float(w.v[e]) + to_float(p.v[e]));
        }
        store_packed(out + i, o);
    }
}

inline void encoder_forward(floatX* out, const int* inp, const int* pos, const floatX* wte, const floatX* wpe, int B,
                            int T, int C, cudaStream_t stream) {
    const size_t total = (size_t)B * T * C;
    const int block = 256;
    with_pack_width<floatX>(pack_width<floatX>(C, out, wte, wpe), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        encoder_forward_kernel<P>
            <<<chunked_grid_blocks(total / P, block), block, 0, stream>>>(out, inp, pos, wte, wpe, T, C, total);
    });
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Backward plan (host). With BT = B*T and D = number of distinct tokens, the
// plan is 3*BT + 1 ints at fixed offsets (so its size does not depend on D):
//
//   plan[0 .. BT)                positions p = b*T + t, grouped by token id
//                                (ascending id), increasing p inside a group
//   plan[BT .. BT + D]           D+1 group offsets into that list: group g is
//                                positions plan[off[g] .. off[g+1]), off[0] = 0,
//                                off[D] = BT
//   plan[2*BT + 1 .. 2*BT+1+D)   the token id of group g
//
// Entries past D in the last two parts are unused. The caller copies the whole
// plan (encoder_backward_plan_ints) to the device and passes D to
// encoder_backward. Token ids must be >= 0; returns -1 (plan unusable) if one
// is negative.
inline size_t encoder_backward_plan_ints(int B, int T) { return 3 * (size_t)B * T + 1; }

//
// A counting sort over the token ids (O(BT + the largest id), two passes over the
// tokens), not a comparison sort: it runs on the host between a step's launches,
// where a sort of BT ids took milliseconds with the GPU idle. Scattering the
// positions in increasing p into their token's slots keeps each group in order.
inline int encoder_backward_plan(int* plan, const int* inp_host, int B, int T) {
    const int BT = B * T;
    int max_id = -1;
    for (int p = 0; p < BT; p++) {
        if (inp_host[p] < 0) return -1;
        max_id = std::max(max_id, inp_host[p]);
    }
    int* positions = plan;
    int* offsets = plan + BT;
    int* tokens = plan + 2 * (size_t)BT + 1;
    std::vector<int> next((size_t)max_id + 2, 0);  // next[v]: where token v's next position goes
    for (int p = 0; p < BT; p++) next[inp_host[p] + 1]++;
    int D = 0;
    for (int v = 0; v <= max_id; v++) {
        if (next[v + 1] > 0) {
            offsets[D] = next[v];
            tokens[D] = v;
            D++;
        }
        next[v + 1] += next[v];  // now the start of token v + 1's group
    }
    offsets[D] = BT;
    for (int p = 0; p < BT; p++) positions[next[inp_host[p]]++] = p;
    return D;
}

// dwte[v, c] += sum over the positions p of token v, in increasing p, of dout[p, c]
// One warp per distinct token (8 per block); lanes take N-column packs (16-byte
// reads of dout where C and the pointers allow), so reads of a dout row and the
// read-modify-write of the dwte row are coalesced. Each dwte row belongs to
// exactly one warp: no atomics, the order of the sum is fixed.
template <int N>
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* plan, int num_distinct, int BT,
                                            int C) {
    const int group = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (group >= num_distinct) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const int* positions = plan;
    const int* offsets = plan + BT;
    const int* tokens = plan + 2 * (size_t)BT + 1;
    const int begin = offsets[group], end = offsets[group + 1];
    float* row = dwte + (size_t)tokens[group] * C;
    for (int c = lane * N; c < C; c += WARP_SIZE * N) {
        float sum[N] = {};
        for (int k = begin; k < end; k++) {
            const Packed<floatX, N> d = load_packed<N>(dout + (size_t)positions[k] * C + c);
#pragma unroll
            for (int e = 0; e < N; e++) sum[e] += to_float(d.v[e]);
        }
#pragma unroll
        for (int e = 0; e < N; e++) row[c + e] += sum[e];
    }
}

// dwpe[t, c] += sum over b = 0..B-1, in that order, of dout[b, t, c]
// N consecutive (t, c) per thread in a block-chunked loop; the sum over b is serial.
template <int N>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t TC = (size_t)T * C;
    const BlockChunk chunk = block_chunk(TC / N);
    for (size_t k = chunk.begin + threadIdx.x; k < chunk.end; k += blockDim.x) {
        float sum[N] = {};
        for (int b = 0; b < B; b++) {
            const Packed<floatX, N> d = load_packed<N>(dout + b * TC + k * N);
#pragma unroll
            for (int e = 0; e < N; e++) sum[e] += to_float(d.v[e]);
        }
#pragma unroll
        for (int e = 0; e < N; e++) dwpe[k * N + e] += sum[e];
    }
}

// position_plan (device, nullptr for positions t): the plan of the forward's
// position ids, built like the token plan; then dwpe is summed per position id
// by the same per-group kernel as dwte. dwpe: nullptr without a position table.
inline void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* plan_device, int num_distinct,
                             const int* position_plan, int distinct_positions, int B, int T, int C,
                             cudaStream_t stream) {
    const int block = 256, warps_per_block = block / WARP_SIZE;
    const size_t TC = (size_t)T * C;
    with_pack_width<floatX>(pack_width<floatX>(C, dout), [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        if (num_distinct > 0) {
            encoder_backward_wte_kernel<P><<<CEIL_DIV(num_distinct, warps_per_block), block, 0, stream>>>(
                dwte, dout, plan_device, num_distinct, B * T, C);
            cudaCheck(cudaGetLastError());
        }
        if (!dwpe) return;
        if (position_plan)
            encoder_backward_wte_kernel<P><<<CEIL_DIV(distinct_positions, warps_per_block), block, 0, stream>>>(
                dwpe, dout, position_plan, distinct_positions, B * T, C);
        else
            encoder_backward_wpe_kernel<P>
                <<<chunked_grid_blocks(TC / P, block), block, 0, stream>>>(dwpe, dout, B, T, C);
    });
    cudaCheck(cudaGetLastError());
}
