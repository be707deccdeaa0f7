// llmc/step/params.h: a model's trainable parameters, whatever the model family.
// One contiguous buffer of floatX weights (what forward and backward read),
// the fp32 gradient-accumulation buffer, and the optimizer's fp32 state
// (master weights, AdamW m and v), all in the order of the family's parameter
// table; their slices for data parallelism (ZeRO-1, 2, 3), the gradient reduction
// and the AdamW update. A family describes its tensors (ParameterLayout) and
// reads one layer's tensors through layer_view; nothing here knows a tensor's
// name or shape.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/muon.cuh"
#include "llmc/run/distributed.h"
#include "llmc/error.h"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/rand.h"

// One row of a family's parameter table, as the optimizer sees it.
// Muon's matrices in one layer's tensor (--optimizer muon): count matrices of
// rows x cols ([out, in]) back to back; a tensor lists them in its order.
struct MuonBlock {
    int rows, cols, count;
};

// The optimizers: AdamW for every tensor, or Muon for the blocks' hidden
// matrices (ParameterLayout::muon) and AdamW for the rest.
enum class Optimizer { AdamW, Muon };
inline const char* const OPTIMIZER_NAMES[] = {"adamw", "muon", nullptr};

struct ParameterLayout {
    size_t size;     // elements, all layers together
    bool per_layer;  // one per layer (L of them), each its own slice of the all-reduce
    bool decays;     // AdamW's weight decay applies
    std::vector<MuonBlock> muon = {};  // a block's hidden matrices, Muon's with --optimizer muon; else AdamW's
};

// One layer's view of a struct of device pointers (the parameters, their
// gradients, the activations): a copy with each per-layer tensor's pointer
// moved to layer l's slice. strides[i] is the bytes per layer of the struct's
// i-th pointer, from the tensor's table row (0: not per layer, or one copy
// shared by all layers), so no layer offset is written by hand.
template <class S>
S layer_view(const S& all, const std::vector<size_t>& strides, int l) {
    constexpr size_t POINTERS = sizeof(S) / sizeof(void*);
    static_assert(sizeof(S) == POINTERS * sizeof(void*), "a struct of pointers only");
    S view = all;
    char* fields[POINTERS];
    memcpy(fields, &view, sizeof(S));
    for (size_t i = 0; i < POINTERS; i++) fields[i] += l * strides[i];
    memcpy(&view, fields, sizeof(S));
    return view;
}

// The shapes a family accepts, checked before anything is allocated for
// them: every size fits the kernels' int indexing with room (2^24), the
// per-layer tables stay small, and the parameters number at most 2^40.
constexpr long MAX_MODEL_DIM = 1L << 24;
constexpr long MAX_MODEL_LAYERS = 4096;
constexpr unsigned long long MAX_MODEL_PARAMETERS = 1ULL << 40;

// The embedding's and the head's rows: the vocabulary V padded up to a
// multiple of 128 (llm.c's Vp: the matmul over the logits stays on whole
// tiles); the padded rows stay 0 and their logits are never read.
inline int padded_vocab_size(int V) { return CEIL_DIV(V, 128) * 128; }

// Points the tensors of a struct of pointers (a family's named tensors, in
// its table's order) into one contiguous buffer, one per row of the table.
template <class S, class T>
void point_parameters(S* p, T* base, const std::vector<ParameterLayout>& rows) {
    static_assert(sizeof(S) % sizeof(T*) == 0, "a struct of pointers only");
    if (rows.size() > sizeof(S) / sizeof(T*))
        llmc::failf("params: %zu tensors for %zu pointers", rows.size(), sizeof(S) / sizeof(T*));
    T** tensors = reinterpret_cast<T**>(p);
    for (size_t k = 0; k < rows.size(); k++) {
        tensors[k] = base;
        base += rows[k].size;
    }
}

// Bytes per layer of each tensor of the table, for elements of element_bytes.
inline std::vector<size_t> parameter_strides(const std::vector<ParameterLayout>& tensors, int num_layers,
                                             size_t element_bytes) {
    std::vector<size_t> strides;
    for (const ParameterLayout& t : tensors) strides.push_back(t.per_layer ? t.size / num_layers * element_bytes : 0);
    return strides;
}

// Device memory is allocated once, from tables of buffers: the allocation and
// the memory plan (printed at start, and by --memory-plan) both read them, so
// the plan is what gets allocated.
struct DeviceBuffer {
    void** ptr;
    size_t bytes;
    const char* group;  // the memory plan's line
    int layers = 0;     // per-layer tensors: the layers it holds (L, or 1 kept for all under recompute)
};

// Allocates every buffer of the list, or none: on out-of-memory the ones
// already allocated are freed and false is returned (-b auto tries a smaller B).
inline bool allocate_buffers(const std::vector<DeviceBuffer>& buffers) {
    for (size_t i = 0; i < buffers.size(); i++) {
        const cudaError_t err = cudaMalloc(buffers[i].ptr, buffers[i].bytes);
        if (err == cudaSuccess) continue;
        if (err != cudaErrorMemoryAllocation) cudaCheck(err);
        (void)cudaGetLastError();
        for (size_t k = 0; k < i; k++) cudaCheck(cudaFree(*buffers[k].ptr));
        return false;
    }
    return true;
}

inline size_t total_bytes(const std::vector<DeviceBuffer>& buffers) {
    size_t sum = 0;
    for (const DeviceBuffer& b : buffers) sum += b.bytes;
    return sum;
}

// Bytes per layer of each pointer of `all`, a struct of pointers into which
// rows of a buffer table point (layer_view's strides; rows that point
// elsewhere, and tensors not per layer, give none).
template <class S>
std::vector<size_t> buffer_strides(const S& all, const std::vector<DeviceBuffer>& rows) {
    std::vector<size_t> strides(sizeof(S) / sizeof(void*), 0);
    for (const DeviceBuffer& b : rows) {
        const size_t field = (size_t)((const char*)b.ptr - (const char*)&all) / sizeof(void*);
        if (b.layers > 1 && field < strides.size()) strides[field] = b.bytes / b.layers;
    }
    return strides;
}

// ----------------------------------------------------------------------------
// Data parallelism: what each rank reduces and, under ZeRO-1, updates.
//
// The unit of communication is a slice: one layer's part of a per-layer tensor
// (its gradient is complete when that layer's backward ends), or a whole
// tensor outside the layers (complete at the end of the backward).
// Under ZeRO-1 rank r owns elements [r*part, (r+1)*part) of every slice of
// size elements, part = floor(size / N); the last size - N*part (< N) elements
// are reduced with an all-reduce and updated on every rank, so no size needs
// padding and every element is still reduced exactly once.
//
// Muon (--optimizer muon, N > 1) orthogonalises whole matrices, so each slice
// of its matrices has one owner rank instead: the owner alone runs its
// Newton-Schulz iteration and keeps its momentum, and sends the new bf16
// weights to the others (a broadcast). The owners split Muon's slices, in
// buffer order, into N runs of about equal elements: a rank's slices of a
// tensor are consecutive layers, one batched call. Under ZeRO-0 the gradient
// is still all-reduced (every rank computes the same norm and AdamW update);
// under ZeRO-1 it is reduced to the owner, which keeps the whole slice's
// master weights, gradient and momentum in its shard arrays.
struct GradientSlice {
    int tensor;         // index into the parameter table
    int layer;          // its layer, or L for the tensors outside the layers
    size_t offset;      // first element in the parameter buffer
    size_t size;
    size_t in_tensor;   // first element within its tensor (stochastic rounding indexes by it)
    size_t part;        // ZeRO-1: elements per rank
    size_t part_offset; // ZeRO-1: where this rank keeps its part in the shard arrays
    size_t tail;        // ZeRO-1: the last size - N*part elements, which every rank holds ...
    size_t tail_offset; // ... here in the shard arrays
    int owner;          // Muon, N > 1: the rank that updates the whole slice; -1: none
    size_t owned;       // ZeRO-1: size on the owner (kept whole at part_offset), else 0
    size_t weight_offset = 0;  // ZeRO-3, a layer's slice: this rank's floatX part, then the tail, in weight_shard
    size_t tail_begin() const { return size - tail; }
};

static const Distributed SINGLE_PROCESS;

// What a step sums on the device and the host reads once, at its end.
struct StepStats {
    float loss_sum;           // the per-token losses, each already divided by the global batch's targets
    float grad_norm_squared;  // of the summed gradient, before clipping
    float grad_scale;         // the clip factor the optimizers apply (NaN: the step is skipped), not read back
};

// The parameters and the optimizer's state: a family's model struct derives
// from it.
struct Parameters {
    std::vector<ParameterLayout> tensors;  // the family's table, in buffer order
    int num_layers = 0;
    size_t num_parameters = 0;
    // weights in the activation precision (what forward/backward read) ...
    floatX* params_memory;
    // ... and the fp32 state of the optimizer: master weights, gradients, moments
    float* master_weights;
    float* grads_memory;  // the persistent gradient-accumulation buffer
    float* adam_m;
    float* adam_v;
    int adam_step;         // number of optimizer steps taken
    StepStats* stats;      // device: the step's loss sum and squared gradient norm
    cudaStream_t stream;   // where the model's work runs
    // data parallelism: set before the weights are allocated
    const Distributed* dist = &SINGLE_PROCESS;
    int zero_stage = 0;                 // 1: optimizer state sharded over the ranks, 2: the gradient too (N > 1),
                                        // 3: the layers' floatX weights too
    std::vector<GradientSlice> slices;  // every slice, in buffer order
    size_t shard_parts = 0;             // ZeRO-1: elements of this rank's parts, then ...
    size_t optimizer_elements = 0;      // ... with the tails: the length of master, m, v (n without ZeRO)
    float* grad_shard = nullptr;        // ZeRO-1/2: the reduced gradients of those elements
    float* grad_receive = nullptr;      // ZeRO-2: one layer's reduced parts, before they add into grad_shard
    cudaEvent_t slot_read[2] = {};      // ZeRO-2: recorded on the comm stream after a staging slot's collectives
    floatX* weight_shard = nullptr;     // ZeRO-3: this rank's floatX parts and the tails of the layers' slices
    size_t weight_shard_elements = 0;
    cudaEvent_t weights_ready[2] = {};  // ZeRO-3: recorded on the comm stream after a weight slot's all-gather
    bool first_micro_batch = true;      // the backward running belongs to the step's first micro-batch ...
    bool last_micro_batch = true;       // ... its last (reduces_gradients sets both)
    int optimizer = 0;                  // Optimizer: set before the weights are allocated
    void* muon_scratch = nullptr;       // --optimizer muon: the Newton-Schulz iteration's buffers
};

// Whether the optimizer state is sharded over the ranks (ZeRO-1 and ZeRO-2
// share the shard's layout, so a checkpoint of one resumes with the other).
inline bool sharded(const Parameters* p) { return p->zero_stage >= 1; }

// ZeRO-2 (and 3): the per-layer tensors' gradients live in a staging buffer of two
// layers (layer l in slot l % 2: layer l's reduce-scatter reads one slot
// while layer l-1's backward writes the other); the tensors outside the
// layers keep their whole gradient (the backward adds to them at both ends).
// The staging buffer is laid out as the parameter table with L = 2, so a
// layer's gradients are layer_view(grads, grad_strides, gradient_slot(l)).
// ZeRO-3 stages the layers' floatX weights the same way (weight_slot): layer
// l's are all-gathered into slot l % 2 before its forward and again before
// its backward, the next layer's gather running while this one computes; the
// tensors outside the layers (embeddings, head, final norms) stay whole on
// every rank, so only the layers' slices are ever gathered.
inline bool stages_gradients(const Parameters* p) { return p->zero_stage >= 2; }
inline bool stages_weights(const Parameters* p) { return p->zero_stage == 3; }
inline int staging_slots(const Parameters* p) { return std::min(2, p->num_layers); }
inline int gradient_slot(const Parameters* p, int l) { return stages_gradients(p) ? l % 2 : l; }
inline int weight_slot(const Parameters* p, int l) { return stages_weights(p) ? l % 2 : l; }

// A buffer's table: the parameter table, or (staged) the staging's, L = 2.
inline std::vector<ParameterLayout> staging_layout(const Parameters* p, bool staged) {
    std::vector<ParameterLayout> rows = p->tensors;
    if (!staged) return rows;
    for (ParameterLayout& t : rows)
        if (t.per_layer) t.size = t.size / p->num_layers * staging_slots(p);
    return rows;
}
inline std::vector<ParameterLayout> gradient_layout(const Parameters* p) {
    return staging_layout(p, stages_gradients(p));
}
inline std::vector<ParameterLayout> weight_layout(const Parameters* p) { return staging_layout(p, stages_weights(p)); }

inline size_t layout_elements(const std::vector<ParameterLayout>& rows) {
    size_t n = 0;
    for (const ParameterLayout& t : rows) n += t.size;
    return n;
}
// Elements of the gradient buffer (grads_memory) and of the floatX weights (params_memory).
inline size_t gradient_elements(const Parameters* p) { return layout_elements(gradient_layout(p)); }
inline size_t weight_elements(const Parameters* p) { return layout_elements(weight_layout(p)); }

// Whether tensor k's matrices are Muon's.
inline bool muon_tensor_of(const Parameters* p, int k) {
    return p->optimizer == (int)Optimizer::Muon && !p->tensors[k].muon.empty();
}

// Muon's owners (N > 1): the slices of its matrices, in buffer order, cut into
// N runs of about equal elements (a slice goes to the run its middle falls in).
inline void plan_muon_owners(Parameters* p) {
    const int N = p->dist->num_processes;
    size_t total = 0, before = 0;
    for (const GradientSlice& s : p->slices) total += muon_tensor_of(p, s.tensor) ? s.size : 0;
    if (N == 1 || total == 0) return;
    for (GradientSlice& s : p->slices) {
        if (!muon_tensor_of(p, s.tensor)) continue;
        s.owner = std::min(N - 1, (int)((before + s.size / 2) * N / total));
        before += s.size;
    }
}

// The elements of Muon's matrices each rank owns (the memory plan and the run
// print it).
inline std::vector<size_t> muon_owner_elements(const Parameters* p) {
    std::vector<size_t> load(p->dist->num_processes, 0);
    for (const GradientSlice& s : p->slices)
        if (s.owner >= 0) load[s.owner] += s.size;
    return load;
}

// Cuts the parameter buffer into slices, gives Muon's their owners and lays
// out this rank's ZeRO-1 shard: its parts and whole owned slices, then the
// tails.
inline void plan_slices(Parameters* p) {
    const int L = p->num_layers, N = p->dist->num_processes;
    p->slices.clear();
    size_t offset = 0;
    for (int k = 0; k < (int)p->tensors.size(); k++) {
        const bool per_layer = p->tensors[k].per_layer;
        const int count = per_layer ? L : 1;
        const size_t size = p->tensors[k].size / count;
        for (int l = 0; l < count; l++) {
            p->slices.push_back(GradientSlice{k, per_layer ? l : L, offset, size, l * size, 0, 0, 0, 0, -1, 0});
            offset += size;
        }
    }
    plan_muon_owners(p);
    size_t parts = 0;
    for (GradientSlice& s : p->slices) {
        if (!sharded(p)) continue;
        if (s.owner >= 0) {
            s.owned = s.owner == p->dist->rank ? s.size : 0;
        } else {
            s.part = s.size / N;
            s.tail = s.size - s.part * N;
        }
        s.part_offset = parts;
        parts += s.part + s.owned;
    }
    size_t tails = parts, weights = 0;
    for (GradientSlice& s : p->slices) {
        s.tail_offset = tails;
        tails += s.tail;
        if (!stages_weights(p) || s.layer == p->num_layers) continue;
        s.weight_offset = weights;
        weights += s.part + s.tail;
    }
    p->weight_shard_elements = weights;
    p->shard_parts = parts;
    p->optimizer_elements = sharded(p) ? tails : p->num_parameters;
}

// Sizes, slices and the ZeRO-1 layout of a family's table (nothing allocated).
inline void configure_parameters(Parameters* p, const std::vector<ParameterLayout>& tensors, int num_layers) {
    p->tensors = tensors;
    p->num_layers = num_layers;
    p->num_parameters = 0;
    for (const ParameterLayout& t : tensors) p->num_parameters += t.size;
    if (p->dist->num_processes == 1) p->zero_stage = 0;  // one rank: nothing to shard
    plan_slices(p);
}

// The fp32 values this rank's optimizer keeps, from the full set: all of them,
// or under ZeRO-1 its part of every slice, then every slice's tail.
inline std::vector<float> local_values(const Parameters* p, const float* full) {
    if (p->zero_stage == 0) return std::vector<float>(full, full + p->num_parameters);
    std::vector<float> local(p->optimizer_elements);
    const size_t r = p->dist->rank;
    for (const GradientSlice& s : p->slices) {
        memcpy(&local[s.part_offset], full + s.offset + r * s.part, s.part * sizeof(float));
        memcpy(&local[s.part_offset], full + s.offset, s.owned * sizeof(float));
        memcpy(&local[s.tail_offset], full + s.offset + s.tail_begin(), s.tail * sizeof(float));
    }
    return local;
}

// Muon's calls for the layers [first, first + layers) of tensor k (a tensor
// outside the layers: its one copy): one per block kind over those layers
// where a layer holds one kind (muon_update's count: layers x count), else one
// per layer and block.
struct MuonCall {
    size_t in_tensor;  // the first element's place in the tensor
    MuonBlock block;   // count: the matrices of this call
};
inline std::vector<MuonCall> muon_calls(const Parameters* p, int k, int first, int layers) {
    const ParameterLayout& t = p->tensors[k];
    size_t at = t.per_layer ? t.size / p->num_layers * first : 0;
    if (t.muon.size() == 1) return {{at, {t.muon[0].rows, t.muon[0].cols, t.muon[0].count * layers}}};
    std::vector<MuonCall> calls;
    for (int l = 0; l < layers; l++)
        for (const MuonBlock& b : t.muon) {
            calls.push_back({at, b});
            at += (size_t)b.rows * b.cols * b.count;
        }
    return calls;
}

// The layers of tensor k whose Muon update runs on this rank, [*first, *first
// + *layers): all of them on one rank, else the consecutive ones it owns.
inline void muon_owned_layers(const Parameters* p, int k, int* first, int* layers) {
    *first = 0;
    *layers = 0;
    for (const GradientSlice& s : p->slices) {
        if (s.tensor != k || (s.owner >= 0 && s.owner != p->dist->rank)) continue;
        const int l = s.layer == p->num_layers ? 0 : s.layer;
        if (*layers == 0) *first = l;
        *layers = l - *first + 1;
    }
}

// The scratch of this rank's largest call.
inline size_t muon_scratch_size(const Parameters* p) {
    size_t bytes = 0;
    for (int k = 0; k < (int)p->tensors.size(); k++) {
        int first, layers;
        muon_owned_layers(p, k, &first, &layers);
        if (!muon_tensor_of(p, k) || layers == 0) continue;
        for (const MuonCall& c : muon_calls(p, k, first, layers))
            bytes = std::max(bytes, muon_scratch_bytes(c.block.rows, c.block.cols, c.block.count));
    }
    return bytes;
}

// ZeRO-2: elements of the receive buffer, one layer's reduced parts, owned
// slices and tails (the most of any layer, or of the tensors outside them).
inline size_t receive_elements(const Parameters* p) {
    if (!stages_gradients(p)) return 0;
    std::vector<size_t> per_layer(p->num_layers + 1, 0);
    for (const GradientSlice& s : p->slices) per_layer[s.layer] += s.part + s.owned + s.tail;
    return *std::max_element(per_layer.begin(), per_layer.end());
}

inline std::vector<DeviceBuffer> parameter_buffers(Parameters* p) {
    const size_t local = p->optimizer_elements;
    const bool zero2 = stages_gradients(p);
    std::vector<DeviceBuffer> list = {{(void**)&p->params_memory, weight_elements(p) * sizeof(floatX),
                                       stages_weights(p) ? "weights (staging and non-layer)" : "parameters"},
                                      {(void**)&p->grads_memory, gradient_elements(p) * sizeof(float),
                                       zero2 ? "fp32 gradient staging" : "fp32 gradients"},
                                      {(void**)&p->master_weights, local * sizeof(float), "fp32 master weights"},
                                      {(void**)&p->adam_m, local * sizeof(float), "AdamW m and v"},
                                      {(void**)&p->adam_v, local * sizeof(float), "AdamW m and v"}};
    if (sharded(p))
        list.push_back(
            {(void**)&p->grad_shard, local * sizeof(float), zero2 ? "ZeRO-2 gradient shard" : "ZeRO-1 gradient shard"});
    if (zero2) list.push_back({(void**)&p->grad_receive, receive_elements(p) * sizeof(float), "ZeRO-2 receive buffer"});
    if (stages_weights(p))
        list.push_back({(void**)&p->weight_shard, p->weight_shard_elements * sizeof(floatX), "ZeRO-3 weight shard"});
    if (const size_t scratch = p->optimizer == (int)Optimizer::Muon ? muon_scratch_size(p) : 0)
        list.push_back({&p->muon_scratch, scratch, "Muon's Newton-Schulz scratch"});
    return list;
}

// Allocates the parameters and the optimizer's state, zeroed (weights unset).
inline void allocate_parameters(Parameters* p) {
    const std::vector<DeviceBuffer> buffers = parameter_buffers(p);
    if (!allocate_buffers(buffers))
        llmc::failf("out of device memory for the weights and optimizer state (%.1f MiB); try -z 1 on several GPUs "
                    "or a smaller model",
                    total_bytes(buffers) / 1048576.0);
    const size_t local = p->optimizer_elements;
    cudaCheck(cudaMemset(p->grads_memory, 0, gradient_elements(p) * sizeof(float)));
    for (cudaEvent_t& e : p->slot_read)
        if (stages_gradients(p)) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : p->weights_ready)
        if (stages_weights(p)) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaCheck(cudaMemset(p->adam_m, 0, local * sizeof(float)));
    cudaCheck(cudaMemset(p->adam_v, 0, local * sizeof(float)));
    p->adam_step = 0;
}

// Where slice s is in a buffer laid out by `rows` (staging_layout): a
// layer's slice in its layer's slot.
inline size_t staged_offset(const Parameters* p, const std::vector<ParameterLayout>& rows, const GradientSlice& s,
                            int slot) {
    size_t at = 0;
    for (int k = 0; k < s.tensor; k++) at += rows[k].size;
    return at + (s.layer < p->num_layers ? (size_t)slot * s.size : 0);
}

// Where slice s's gradient is in grads_memory (ZeRO-2, 3: in its layer's staging slot).
inline float* slice_gradient(const Parameters* p, const GradientSlice& s) {
    if (!stages_gradients(p)) return p->grads_memory + s.offset;
    return p->grads_memory + staged_offset(p, gradient_layout(p), s, gradient_slot(p, s.layer));
}

// Where slice s's floatX weights are in params_memory (ZeRO-3: a layer's in its staging slot).
inline floatX* slice_weights(const Parameters* p, const GradientSlice& s) {
    if (!stages_weights(p)) return p->params_memory + s.offset;
    return p->params_memory + staged_offset(p, weight_layout(p), s, weight_slot(p, s.layer));
}

// Whether slice s's floatX weights live in the ZeRO-3 shard (a layer's), not whole in params_memory.
inline bool weights_sharded(const Parameters* p, const GradientSlice& s) {
    return stages_weights(p) && s.layer < p->num_layers;
}

// Sets every weight from fp32 values: master weights exact (this rank's share
// under ZeRO-1), the floatX copy rounded to nearest (ZeRO-3: the layers'
// this rank's parts and the tails).
inline void set_weights(Parameters* p, const std::vector<float>& weights) {
    const size_t n = p->num_parameters, r = p->dist->rank;
    std::vector<floatX> rounded(n);
    for (size_t i = 0; i < n; i++) rounded[i] = from_float<floatX>(weights[i]);
    const std::vector<float> local = local_values(p, weights.data());
    cudaCheck(cudaMemcpy(p->master_weights, local.data(), local.size() * sizeof(float), cudaMemcpyHostToDevice));
    if (!stages_weights(p)) {
        cudaCheck(cudaMemcpy(p->params_memory, rounded.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
        return;
    }
    std::vector<floatX> shard(p->weight_shard_elements);
    for (const GradientSlice& s : p->slices) {
        const floatX* w = rounded.data() + s.offset;
        if (!weights_sharded(p, s)) {
            cudaCheck(cudaMemcpy(slice_weights(p, s), w, s.size * sizeof(floatX), cudaMemcpyHostToDevice));
            continue;
        }
        std::copy(w + r * s.part, w + (r + 1) * s.part, shard.begin() + s.weight_offset);
        std::copy(w + s.tail_begin(), w + s.size, shard.begin() + s.weight_offset + s.part);
    }
    cudaCheck(cudaMemcpy(p->weight_shard, shard.data(), shard.size() * sizeof(floatX), cudaMemcpyHostToDevice));
}

// ZeRO-3: layer l's floatX weights all-gathered into its staging slot on the
// communication stream, once the compute stream has finished everything
// issued so far (the slot's last reader, layer l +- 2, among it): each rank's
// part copied in place, the tails from the local shard (every rank holds
// them). Issue it a layer ahead; wait_layer_weights before the first read.
inline void gather_layer_weights(Parameters* p, int l) {
    if (!stages_weights(p)) return;
    const Distributed* d = p->dist;
    const size_t r = d->rank;
    comm_after_compute(d, p->stream);
    for (const GradientSlice& s : p->slices) {
        if (s.layer != l) continue;
        floatX* w = slice_weights(p, s);
        const floatX* mine = p->weight_shard + s.weight_offset;
        cudaCheck(
            cudaMemcpyAsync(w + r * s.part, mine, s.part * sizeof(floatX), cudaMemcpyDeviceToDevice, d->comm_stream));
        cudaCheck(cudaMemcpyAsync(w + s.tail_begin(), mine + s.part, s.tail * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  d->comm_stream));
    }
    group_start();
    for (const GradientSlice& s : p->slices)
        if (s.layer == l && s.part > 0) all_gather_in_place(slice_weights(p, s), s.part, d);
    group_end();
    cudaCheck(cudaEventRecord(p->weights_ready[weight_slot(p, l)], d->comm_stream));
}

// ZeRO-3: the compute stream waits for layer l's gather (the last one issued into its slot).
inline void wait_layer_weights(Parameters* p, int l) {
    if (stages_weights(p)) cudaCheck(cudaStreamWaitEvent(p->stream, p->weights_ready[weight_slot(p, l)], 0));
}

// Every slice's floatX weights, whole, on the device: fn(slice, pointer)
// slice by slice, a layer's together (ZeRO-3: gathered into its slot first,
// so every rank must call it; between steps only).
template <class Fn>
void visit_weights(Parameters* p, Fn fn) {
    for (int l = 0; l <= p->num_layers; l++) {
        if (l < p->num_layers) {
            gather_layer_weights(p, l);
            wait_layer_weights(p, l);
        }
        cudaCheck(cudaStreamSynchronize(p->stream));
        for (const GradientSlice& s : p->slices)
            if (s.layer == l) fn(s, (const floatX*)slice_weights(p, s));
    }
}

// All floatX weights, in buffer order, on the host (every rank calls it).
inline std::vector<floatX> gather_weights(Parameters* p) {
    std::vector<floatX> weights(p->num_parameters);
    visit_weights(p, [&](const GradientSlice& s, const floatX* w) {
        cudaCheck(cudaMemcpy(weights.data() + s.offset, w, s.size * sizeof(floatX), cudaMemcpyDeviceToHost));
    });
    return weights;
}

// Whether some slice has a Muon owner (N > 1 with --optimizer muon).
inline bool has_owners(const Parameters* p) {
    for (const GradientSlice& s : p->slices)
        if (s.owner >= 0) return true;
    return false;
}

// Every rank's copy of the owned slices' fp32 state made the owner's, in place
// (ZeRO-0: only an owner updates a slice's master weights and momentum, so the
// others' copies lag until a checkpoint, whose replicas must be equal). Every
// rank calls it.
inline void sync_owned_state(Parameters* p) {
    if (p->zero_stage != 0 || !has_owners(p)) return;
    const Distributed* d = p->dist;
    comm_after_compute(d, p->stream);
    group_start();
    for (const GradientSlice& s : p->slices) {
        if (s.owner < 0) continue;
        broadcast_in_place(s.owner, p->master_weights + s.offset, s.size, d);
        broadcast_in_place(s.owner, p->adam_m + s.offset, s.size, d);
    }
    group_end();
    compute_after_comm(d, p->stream);
    cudaCheck(cudaStreamSynchronize(p->stream));
}


// Slices [first, last) (consecutive in the buffer) of the master weights
// into host[offset of first ...], through the gradient buffer as scratch:
// each rank's parts and owned slices copied in place, then all-gathered and
// broadcast.
inline void gather_slices(Parameters* p, size_t first, size_t last, float* host) {
    const Distributed* d = p->dist;
    const size_t r = d->rank, base = p->slices[first].offset;
    const size_t n = p->slices[last - 1].offset + p->slices[last - 1].size - base;
    float* full = p->grads_memory - base;  // full + s.offset: slice s's place in the scratch
    for (size_t i = first; i < last; i++) {
        const GradientSlice& s = p->slices[i];
        if (p->zero_stage == 0) {  // a full replica: the owners' values are broadcast below
            cudaCheck(cudaMemcpyAsync(full + s.offset, p->master_weights + s.offset, s.size * sizeof(float),
                                      cudaMemcpyDeviceToDevice, p->stream));
            continue;
        }
        cudaCheck(cudaMemcpyAsync(full + s.offset + r * s.part, p->master_weights + s.part_offset,
                                  s.part * sizeof(float), cudaMemcpyDeviceToDevice, p->stream));
        cudaCheck(cudaMemcpyAsync(full + s.offset, p->master_weights + s.part_offset, s.owned * sizeof(float),
                                  cudaMemcpyDeviceToDevice, p->stream));
        cudaCheck(cudaMemcpyAsync(full + s.offset + s.tail_begin(), p->master_weights + s.tail_offset,
                                  s.tail * sizeof(float), cudaMemcpyDeviceToDevice, p->stream));
    }
    comm_after_compute(d, p->stream);
    group_start();
    for (size_t i = first; i < last; i++) {
        const GradientSlice& s = p->slices[i];
        if (s.owner >= 0) broadcast_in_place(s.owner, full + s.offset, s.size, d);
        else if (s.part > 0) all_gather_in_place(full + s.offset, s.part, d);
    }
    group_end();
    compute_after_comm(d, p->stream);
    cudaCheck(cudaMemcpyAsync(host + base, full + base, n * sizeof(float), cudaMemcpyDeviceToHost, p->stream));
    cudaCheck(cudaMemsetAsync(full + base, 0, n * sizeof(float), p->stream));
    cudaCheck(cudaStreamSynchronize(p->stream));
}

// All fp32 master weights on the host. With ZeRO or Muon's owners every rank
// must call it: the shards are gathered in the gradient buffer (zero between
// steps, and zeroed again after), as many whole slices at a time as it holds
// (all of them but under ZeRO-2, whose staging holds at least the largest).
inline std::vector<float> gather_master_weights(Parameters* p) {
    std::vector<float> weights(p->num_parameters);
    if (p->zero_stage == 0 && !has_owners(p)) {
        cudaCheck(cudaMemcpy(weights.data(), p->master_weights, weights.size() * 4, cudaMemcpyDeviceToHost));
        return weights;
    }
    const size_t capacity = gradient_elements(p);
    for (size_t first = 0, last = 0; first < p->slices.size(); first = last) {
        size_t elements = p->slices[first].size;
        for (last = first + 1; last < p->slices.size() && elements + p->slices[last].size <= capacity; last++)
            elements += p->slices[last].size;
        gather_slices(p, first, last, weights.data());
    }
    return weights;
}

// Which micro-batch of the step's A the next backward is, and whether it
// reduces over the ranks: ZeRO-0 and ZeRO-1 on the last only (the full
// gradient buffer holds the others' sum), ZeRO-2 on every one (its staging
// holds one micro-batch's gradients).
inline bool reduces_gradients(Parameters* p, int micro_step, int A) {
    p->first_micro_batch = micro_step == 0;
    p->last_micro_batch = micro_step == A - 1;
    return p->dist->num_processes > 1 && (p->last_micro_batch || stages_gradients(p));
}

// ZeRO-2, as a backward begins: the staging buffer zeroed (the kernels add
// with +=) once the previous micro-batch's collectives have read it.
inline void begin_backward_gradients(Parameters* p) {
    if (!stages_gradients(p)) return;
    compute_after_comm(p->dist, p->stream);
    cudaCheck(cudaMemsetAsync(p->grads_memory, 0, gradient_elements(p) * sizeof(float), p->stream));
}

// ZeRO-2, before layer l's backward: its slot zeroed once the collectives of
// layer l + 2, the slot's last user, have read it (the backward's first two
// layers find theirs zeroed by begin_backward_gradients).
inline void begin_layer_gradients(Parameters* p, int l) {
    if (!stages_gradients(p) || l + 2 >= p->num_layers) return;
    cudaCheck(cudaStreamWaitEvent(p->stream, p->slot_read[l % 2], 0));
    for (const GradientSlice& s : p->slices)
        if (s.layer == l) cudaCheck(cudaMemsetAsync(slice_gradient(p, s), 0, s.size * sizeof(float), p->stream));
}

__global__ void add_into_kernel(float* sum, const float* add, size_t n) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) sum[i] += add[i];
}
inline void add_into(float* sum, const float* add, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    add_into_kernel<<<(unsigned)CEIL_DIV(n, (size_t)256), 256, 0, stream>>>(sum, add, n);
    cudaCheck(cudaGetLastError());
}

// Sums one layer's gradients over the ranks, on the communication stream, once
// the compute stream has finished them: the backward of the layers below runs
// meanwhile. ZeRO-0 all-reduces in place; ZeRO-1 reduce-scatters each slice
// into this rank's shard. Sums, not averages: every rank's gradients already
// carry 1/(unmasked targets of the global batch). Layer L (the tensors outside
// the layers) also sums the step's loss, on the last micro-batch. Under ZeRO
// a slice of Muon's goes whole to its owner's shard. ZeRO-2 reduces every
// micro-batch: the first straight into the shard (with A = 1 exactly
// ZeRO-1's sums), the later ones into the receive buffer, added into the
// shard on the comm stream; then the layer's staging slot is free again.
inline void reduce_layer(Parameters* p, int layer) {
    const Distributed* d = p->dist;
    const bool add = stages_gradients(p) && !p->first_micro_batch;
    comm_after_compute(d, p->stream);
    group_start();
    size_t received = 0;  // add: where the layer's next reduced elements land in grad_receive
    for (const GradientSlice& s : p->slices) {
        if (s.layer != layer) continue;
        float* g = slice_gradient(p, s);
        if (p->zero_stage == 0) {
            all_reduce_sum(g, g, s.size, d);
            continue;
        }
        float* part = add ? p->grad_receive + received : p->grad_shard + s.part_offset;
        float* tail = add ? part + s.part + s.owned : p->grad_shard + s.tail_offset;
        if (add) received += s.part + s.owned + s.tail;
        if (s.owner >= 0) reduce_sum_to(s.owner, part, g, s.size, d);
        if (s.part > 0) reduce_scatter_sum(part, g, s.part, d);
        if (s.tail > 0) all_reduce_sum(tail, g + s.tail_begin(), s.tail, d);
    }
    if (layer == p->num_layers && p->last_micro_batch) all_reduce_sum(&p->stats->loss_sum, &p->stats->loss_sum, 1, d);
    group_end();
    received = 0;
    for (const GradientSlice& s : p->slices) {
        if (s.layer != layer || !add) continue;
        add_into(p->grad_shard + s.part_offset, p->grad_receive + received, s.part + s.owned, d->comm_stream);
        add_into(p->grad_shard + s.tail_offset, p->grad_receive + received + s.part + s.owned, s.tail, d->comm_stream);
        received += s.part + s.owned + s.tail;
    }
    if (stages_gradients(p) && layer < p->num_layers)
        cudaCheck(cudaEventRecord(p->slot_read[layer % 2], d->comm_stream));
}

// ----------------------------------------------------------------------------
// The optimizer step

struct OptimizerSettings {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float weight_decay = 0.0f;
    // --optimizer muon: its lr follows the schedule of AdamW's (lr x muon_lr_per_lr)
    float muon_lr_per_lr = 0.0f, muon_weight_decay = 0.0f, muon_momentum = 0.95f;
    float grad_clip = 1.0f;  // <= 0: no clipping
    uint64_t seed = 1337;    // stochastic rounding
};

// AdamW on `n` optimizer elements starting at `local` (master, m, v, the
// gradient), whose floatX weights start at `weights` and sit at `in_tensor`
// within tensor k.
inline void adamw_elements(Parameters* p, const float* grads, size_t local, floatX* weights, size_t in_tensor, size_t n,
                           int k, float lr, const OptimizerSettings& opt) {
    const uint32_t seed = (uint32_t)splitmix64(opt.seed ^ ((uint64_t)p->adam_step << 8 | k));
    adamw_update(weights, p->master_weights + local, grads + local, p->adam_m + local, p->adam_v + local, n, lr,
                 opt.beta1, opt.beta2, opt.eps, p->tensors[k].decays ? opt.weight_decay : 0.0f, p->adam_step,
                 &p->stats->grad_scale, seed, in_tensor, p->stream);
}

// Muon on the layers of tensor k this rank updates (all on one rank; its
// owned ones with N > 1). The tensor's weights start at params_memory +
// `offset`; its fp32 state (master, gradient, momentum in adam_m's place,
// adam_v unused) at `offset` too under ZeRO-0, in the shard under ZeRO-1.
inline void muon_tensor(Parameters* p, const float* grads, size_t offset, int k, float lr,
                        const OptimizerSettings& opt) {
    int first, layers;
    muon_owned_layers(p, k, &first, &layers);
    if (layers == 0) return;
    const ParameterLayout& t = p->tensors[k];
    const size_t layer_size = t.per_layer ? t.size / p->num_layers : 0, first_element = layer_size * first;
    size_t state = offset + first_element;  // ZeRO-0: where the tensor's state is in the full arrays
    for (const GradientSlice& s : p->slices)
        if (sharded(p) && s.tensor == k && s.layer == (t.per_layer ? first : p->num_layers)) state = s.part_offset;
    const uint32_t seed = (uint32_t)splitmix64(opt.seed ^ ((uint64_t)p->adam_step << 8 | k));
    const float decay = t.decays ? opt.muon_weight_decay : 0.0f;
    for (const MuonCall& c : muon_calls(p, k, first, layers)) {
        const size_t w = offset + c.in_tensor, at = state + (c.in_tensor - first_element);
        muon_update(p->params_memory + w, p->master_weights + at, grads + at, p->adam_m + at, c.block.count,
                    c.block.rows, c.block.cols, lr * opt.muon_lr_per_lr, decay, opt.muon_momentum,
                    &p->stats->grad_scale, seed, c.in_tensor, p->muon_scratch, p->stream);
    }
}

// Each owner's new bf16 weights of its Muon slices to every rank.
inline void broadcast_owned_weights(Parameters* p) {
    for (const GradientSlice& s : p->slices)
        if (s.owner >= 0) broadcast_in_place(s.owner, p->params_memory + s.offset, s.size, p->dist);
}

// Global gradient norm, then AdamW (clipping folded in as a scale computed on
// the device from the norm: no host round trip). `scratch` holds
// global_norm_scratch_floats() floats.
//   ZeRO-0: every rank holds the summed gradient and updates every weight
//           (Muon's: those it owns, then the owners broadcast them).
//   ZeRO-1: a rank updates its shard (its parts, its owned slices and the
//           tails), then the ranks all-gather (and broadcast) the weights.
//   ZeRO-3: the layers' floatX parts and tails are written to the weight
//           shard and gathered by the next forward; the rest as ZeRO-1.
inline void update_parameters(Parameters* p, float* scratch, float lr, const OptimizerSettings& opt) {
    const Distributed* d = p->dist;
    cudaStream_t stream = p->stream;
    if (d->num_processes > 1) compute_after_comm(d, stream);  // the reduced gradients and loss
    p->adam_step++;
    if (p->zero_stage == 0) {
        global_norm_squared(&p->stats->grad_norm_squared, scratch, p->grads_memory, p->num_parameters, stream);
        grad_scale(&p->stats->grad_scale, &p->stats->grad_norm_squared, opt.grad_clip, stream);
        size_t offset = 0;
        for (int k = 0; k < (int)p->tensors.size(); k++) {
            if (muon_tensor_of(p, k)) muon_tensor(p, p->grads_memory, offset, k, lr, opt);
            else
                adamw_elements(p, p->grads_memory, offset, p->params_memory + offset, 0, p->tensors[k].size, k, lr,
                               opt);
            offset += p->tensors[k].size;
        }
        if (!has_owners(p)) return;
        comm_after_compute(d, stream);
        group_start();
        broadcast_owned_weights(p);
        group_end();
        compute_after_comm(d, stream);
        return;
    }
    // the squared norm of this rank's elements (the tails, held by every rank,
    // count on rank 0 only), summed over the ranks
    const size_t r = d->rank;
    global_norm_squared(&p->stats->grad_norm_squared, scratch, p->grad_shard,
                        r == 0 ? p->optimizer_elements : p->shard_parts, stream);
    comm_after_compute(d, stream);
    all_reduce_sum(&p->stats->grad_norm_squared, &p->stats->grad_norm_squared, 1, d);
    compute_after_comm(d, stream);
    grad_scale(&p->stats->grad_scale, &p->stats->grad_norm_squared, opt.grad_clip, stream);
    for (const GradientSlice& s : p->slices) {
        floatX* part = weights_sharded(p, s) ? p->weight_shard + s.weight_offset : slice_weights(p, s) + r * s.part;
        floatX* tail = weights_sharded(p, s) ? p->weight_shard + s.weight_offset + s.part
                                             : slice_weights(p, s) + s.tail_begin();
        adamw_elements(p, p->grad_shard, s.part_offset, part, s.in_tensor + r * s.part, s.part, s.tensor, lr, opt);
        adamw_elements(p, p->grad_shard, s.tail_offset, tail, s.in_tensor + s.tail_begin(), s.tail, s.tensor, lr, opt);
    }
    size_t offset = 0;
    for (int k = 0; k < (int)p->tensors.size(); k++) {
        if (muon_tensor_of(p, k)) muon_tensor(p, p->grad_shard, offset, k, lr, opt);
        offset += p->tensors[k].size;
    }
    comm_after_compute(d, stream);  // the all-gather reads what the optimizers wrote ...
    group_start();
    for (const GradientSlice& s : p->slices)
        if (s.part > 0 && !weights_sharded(p, s)) all_gather_in_place(slice_weights(p, s), s.part, d);
    broadcast_owned_weights(p);
    group_end();
    compute_after_comm(d, stream);  // ... and the next forward reads what it gathered
}
