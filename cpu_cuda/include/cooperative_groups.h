// cooperative_groups.h for the CUDA-on-CPU runtime: the subset kernels here use
// (thread_block, thread_block_tile<N> from tiled_partition, cg::reduce with the
// functional objects), built on the runtime's barriers and warp collectives.
#pragma once
#include <type_traits>

#include <cuda_runtime.h>

namespace cooperative_groups {

class thread_block {
  public:
    void sync() const { __syncthreads(); }
    unsigned thread_rank() const { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
    unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
    unsigned num_threads() const { return size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    dim3 group_dim() const { return dim3(blockDim.x, blockDim.y, blockDim.z); }
    dim3 dim_threads() const { return group_dim(); }
};
inline thread_block this_thread_block() { return thread_block(); }

// A tile of N consecutive threads (N a power of two, at most 32).
template <unsigned N>
class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "tile size: power of two <= 32");
    unsigned mask_;  // the lanes of this tile within its warp
    template <unsigned M, class T, class Op>
    friend T reduce(const thread_block_tile<M>& tile, T value, Op op);

  public:
    thread_block_tile() {
        unsigned lane = ::cpucuda::tls_thread->lane;
        mask_ = (N == 32) ? 0xffffffffu : (((1u << N) - 1u) << (lane / N * N));
    }
    unsigned thread_rank() const { return ::cpucuda::tls_thread->lane % N; }
    static constexpr unsigned size() { return N; }
    static constexpr unsigned num_threads() { return N; }
    unsigned meta_group_rank() const { return this_thread_block().thread_rank() / N; }
    unsigned meta_group_size() const { return (this_thread_block().size() + N - 1) / N; }
    void sync() const { __syncwarp(mask_); }
    template <class T> T shfl(T v, int src) const { return __shfl_sync(mask_, v, src, N); }
    template <class T> T shfl_down(T v, unsigned d) const { return __shfl_down_sync(mask_, v, d, N); }
    template <class T> T shfl_up(T v, unsigned d) const { return __shfl_up_sync(mask_, v, d, N); }
    template <class T> T shfl_xor(T v, int m) const { return __shfl_xor_sync(mask_, v, m, N); }
    int any(int p) const { return __any_sync(mask_, p); }
    int all(int p) const { return __all_sync(mask_, p); }
    unsigned ballot(int p) const { return __ballot_sync(mask_, p) >> (mask_ ? __builtin_ctz(mask_) : 0); }
};

template <unsigned N, class Parent>
inline thread_block_tile<N> tiled_partition(const Parent&) {
    return thread_block_tile<N>();
}

// Functional objects of cg::reduce. Like CUDA's, greater/less pick the larger/smaller value.
template <class T> struct plus {
    T operator()(T a, T b) const { return a + b; }
};
template <class T> struct less {
    T operator()(T a, T b) const { return b < a ? b : a; }
};
template <class T> struct greater {
    T operator()(T a, T b) const { return a < b ? b : a; }
};
template <class T> struct bit_and {
    T operator()(T a, T b) const { return a & b; }
};
template <class T> struct bit_or {
    T operator()(T a, T b) const { return a | b; }
};
template <class T> struct bit_xor {
    T operator()(T a, T b) const { return a ^ b; }
};

// cg::reduce: every thread of the tile gets op over all its values, by CUDA's
// butterfly for a tile (cooperative_groups/details/coalesced_reduce.h):
//     for offset = N/2, N/4, ..., 1:   value = op(value, tile.shfl_xor(value, offset))
// Here the tile meets once (tile_reduce), not log2(N) times: when its last
// lane arrives, reduce_tile runs the same butterfly over all N lanes' values,
// step by step, each lane with its own operator, as that lane (threadIdx and
// friends are the lane's) - the same operations in the same order, so the
// same bits as the shuffles. The operator runs in the scheduler: a warp
// operation or barrier in it is refused.
namespace detail {
template <class T, class Op>
struct ReduceLane {
    T value;  // in: the lane's value; out: its result
    const Op* op;
    ::cpucuda::ThreadCtx* thread;
};
template <class T, class Op>
void reduce_tile(void* const* io, unsigned width) {
    ::cpucuda::ThreadCtx* const arrived_last = ::cpucuda::tls_thread;
    T v[32], next[32];
    for (unsigned l = 0; l < width; l++) v[l] = static_cast<ReduceLane<T, Op>*>(io[l])->value;
    for (unsigned offset = width / 2; offset > 0; offset /= 2) {
        for (unsigned l = 0; l < width; l++) {
            const ReduceLane<T, Op>& lane = *static_cast<ReduceLane<T, Op>*>(io[l]);
            ::cpucuda::run_as(lane.thread);
            next[l] = (*lane.op)(v[l], v[l ^ offset]);
        }
        for (unsigned l = 0; l < width; l++) v[l] = next[l];
    }
    ::cpucuda::run_as(arrived_last);
    for (unsigned l = 0; l < width; l++) static_cast<ReduceLane<T, Op>*>(io[l])->value = v[l];
}
}  // namespace detail

template <unsigned N, class T, class Op>
inline T reduce(const thread_block_tile<N>& tile, T value, Op op) {
    static_assert(std::is_trivially_copyable<T>::value, "cg::reduce moves trivially copyable values");
    if (N == 1) return value;
    detail::ReduceLane<T, Op> lane{value, &op, ::cpucuda::tls_thread};
    ::cpucuda::tile_reduce(&detail::reduce_tile<T, Op>, &lane, tile.mask_, (int)N);
    return lane.value;
}

}  // namespace cooperative_groups
