// llmc/step/train_step.h: one optimizer step with gradient accumulation, the same
// for every model family. The one idea to take away:
//
//   B_global = B_micro x N_ranks x A sequences per optimizer step.
//
// The A micro-batches add their gradients into one persistent fp32 buffer while
// the weights stay frozen; every target token's loss is divided by G, the
// number of unmasked targets in the whole global batch, so the sum in the
// buffer is exactly the gradient of the big-batch mean loss, however the batch
// is split. Only the last micro-batch's backward communicates.
//
// The trainer's own step (train_gpt.cu's train_step) is where this shows; this
// header holds its host-side parts: the micro-batch a model computes on, the
// document layout, this rank's part of the global batch and the step's stages.
#pragma once
#include <cmath>
#include <cstring>
#include <vector>

#include "llmc/kernels/attention.cuh"
#include "llmc/data/dataloader.h"
#include "llmc/kernels/encoder.cuh"
#include "llmc/step/params.h"

// ---- documents ----------------------------------------------------------------
// A document starts at each doc_token (GPT-2's <|endoftext|>, which begins
// every document in the shards; Llama 3's <|begin_of_text|>; the built-in
// corpus's EOT; llmc/run/run.h sets it) and at the start of each sequence. With
// --doc-mask or --doc-positions the host derives, per micro-batch, from its
// tokens, a document layout of document_ints:
//   [0, 2BT)     (B, T) int2 spans {first position, one past the last} of each
//                token's document: the attention's mask (document_spans)
//   [2BT, 3BT)   position ids: t minus the first position of t's document
//   [3BT, ...)   their encoder-backward plan (dwpe, summed per position id)
inline size_t document_ints(int B, int T) {
    return CEIL_DIV(3 * (size_t)B * T + encoder_backward_plan_ints(B, T), 4) * 4;  // 16-byte slices
}
// The positions and their plan only when asked for (with_positions); returns
// the number of distinct position ids (the plan's groups), else 0.
inline int document_layout(int* layout, const int* tokens, int B, int T, int doc_token, bool with_positions) {
    const size_t BT = (size_t)B * T;
    int2* spans = reinterpret_cast<int2*>(layout);
    int* positions = layout + 2 * BT;
    document_spans(spans, tokens, B, T, doc_token);
    if (!with_positions) return 0;
    for (size_t i = 0; i < BT; i++) positions[i] = (int)(i % T) - spans[i].x;
    return encoder_backward_plan(layout + 3 * BT, positions, B, T);
}

// The micro-batch a model computes on, its inputs on the device and pinned
// host staging for one step's A micro-batches, so uploads are asynchronous (a
// pageable copy would make the host wait for the GPU).
struct MicroBatches {
    int B = 0, T = 0;   // sequences of tokens per micro-batch
    int* inputs;        // device (B, T)
    int* targets;       // device (B, T)
    int max_grad_accum_steps;
    int* staged_inputs;   // (A, B, T)
    int* staged_targets;  // (A, B, T)
    int* staged_plans;    // A encoder-backward plans
    // documents (--doc-mask, --doc-positions; see document_layout)
    int doc_mask = 0;             // attention stays inside each document
    int doc_positions = 0;        // position ids restart at each document
    int doc_token = -1;           // the token that starts a document (also samples' first input)
    int* documents;               // device: the current micro-batch's document layout
    int* staged_documents;        // pinned: A document layouts
    int distinct_positions = 0;   // groups of the current micro-batch's position plan
};

// The current micro-batch's document layout, as the kernels take it: the
// attention's spans with --doc-mask, the position ids (and their plan) with
// --doc-positions; null without.
inline const int2* attention_documents(const MicroBatches* m) {
    return m->doc_mask ? reinterpret_cast<const int2*>(m->documents) : nullptr;
}
inline const int* document_positions(const MicroBatches* m) {
    return m->doc_positions ? m->documents + 2 * (size_t)m->B * m->T : nullptr;
}
inline const int* document_position_plan(const MicroBatches* m) {
    return m->doc_positions ? m->documents + 3 * (size_t)m->B * m->T : nullptr;
}

// The device buffers of a micro-batch and of the step's statistics (a family
// lists them with its activations).
inline std::vector<DeviceBuffer> micro_batch_buffers(MicroBatches* m, StepStats** stats, int B, int T) {
    const char* group = "inputs and step statistics";
    const size_t BT = (size_t)B * T;
    return {{(void**)&m->documents, document_ints(B, T) * sizeof(int), group},
            {(void**)stats, sizeof(StepStats), group},
            {(void**)&m->inputs, BT * sizeof(int), group},
            {(void**)&m->targets, BT * sizeof(int), group}};
}

inline void allocate_staging(MicroBatches* m, int B, int T, int max_grad_accum_steps) {
    m->B = B;
    m->T = T;
    m->max_grad_accum_steps = max_grad_accum_steps;
    const size_t staged = (size_t)max_grad_accum_steps * B * T;
    cudaCheck(cudaMallocHost(&m->staged_inputs, staged * sizeof(int)));
    cudaCheck(cudaMallocHost(&m->staged_targets, staged * sizeof(int)));
    cudaCheck(cudaMallocHost(&m->staged_plans, max_grad_accum_steps * encoder_backward_plan_ints(B, T) * sizeof(int)));
    cudaCheck(cudaMallocHost(&m->staged_documents, max_grad_accum_steps * document_ints(B, T) * sizeof(int)));
}

inline void free_staging(MicroBatches* m) {
    for (int* b : {m->staged_inputs, m->staged_targets, m->staged_plans, m->staged_documents})
        cudaCheck(cudaFreeHost(b));
    m->B = m->T = 0;
}

// Host-side inputs of one optimizer step on this rank: A micro-batches of
// (B, T) tokens, and the number of targets the loss is averaged over, counted
// over the whole global batch (every rank's micro-batches). Every rank knows
// it from the data alone, so no rank waits for another before backward.
struct StepBatch {
    const int* inputs;    // (A, B, T)
    const int* targets;   // (A, B, T); -1 = masked (no loss, no gradient)
    int grad_accum_steps;
    long global_targets;  // unmasked targets in B_micro x N x A sequences
};

struct StepResult {
    float loss;       // mean over the unmasked targets of the whole global batch
    float grad_norm;  // before clipping
    long num_targets; // unmasked targets in the global batch
};

inline long count_unmasked(const int* targets, size_t n) {
    long count = 0;
    for (size_t i = 0; i < n; i++) count += targets[i] != -1;
    return count;
}

// One process's step: its A micro-batches are the whole global batch (tests, benchmarks).
inline StepBatch whole_batch(const MicroBatches* model, const int* inputs, const int* targets, int A) {
    return StepBatch{inputs, targets, A, count_unmasked(targets, (size_t)A * model->B * model->T)};
}

// This rank's part of the next step, B_global = B_micro x N x A sequences:
// each of the A micro-batches is a global one of N x B_micro sequences that
// every rank reads alike, keeping its own B_micro. So the ranks' sequences are
// disjoint, their union is what one process with N x A micro-batches reads,
// in the same order, and every rank counts the targets of the whole global
// batch (the loss's divisor) without asking the others.
template <class Model>
StepBatch next_step_batch(DataLoader* loader, const Model* model, int grad_accum_steps, bool overfit,
                          std::vector<int>* inputs, std::vector<int>* targets) {
    const int N = model->dist->num_processes;
    const size_t micro_tokens = (size_t)model->B * model->T, mine = model->dist->rank * micro_tokens;
    inputs->resize(grad_accum_steps * micro_tokens);
    targets->resize(grad_accum_steps * micro_tokens);
    long global_targets = 0;
    for (int micro_step = 0; micro_step < grad_accum_steps; micro_step++) {
        if (overfit && micro_step == 0) dataloader_reset(loader);
        dataloader_next_batch(loader);
        global_targets += count_unmasked(loader->targets, N * micro_tokens);
        memcpy(inputs->data() + micro_step * micro_tokens, loader->inputs + mine, micro_tokens * sizeof(int));
        memcpy(targets->data() + micro_step * micro_tokens, loader->targets + mine, micro_tokens * sizeof(int));
    }
    return StepBatch{inputs->data(), targets->data(), grad_accum_steps, global_targets};
}

// Copies micro-batch `i` of the pinned staging area to the device (async),
// with its document layout where documents matter.
template <class Model>
void upload_micro_batch(Model* model, int i) {
    const size_t n = (size_t)model->B * model->T;
    cudaCheck(cudaMemcpyAsync(model->inputs, model->staged_inputs + i * n, n * sizeof(int), cudaMemcpyHostToDevice,
                              model->stream));
    cudaCheck(cudaMemcpyAsync(model->targets, model->staged_targets + i * n, n * sizeof(int), cudaMemcpyHostToDevice,
                              model->stream));
    if (model->doc_mask || model->doc_positions) {
        const size_t ints = document_ints(model->B, model->T);
        int* layout = model->staged_documents + i * ints;
        model->distinct_positions = document_layout(layout, model->staged_inputs + i * n, model->B, model->T,
                                                    model->doc_token, model->doc_positions);
        const size_t used = model->doc_positions ? ints : 2 * n;  // the spans alone without positions
        cudaCheck(cudaMemcpyAsync(model->documents, layout, used * sizeof(int), cudaMemcpyHostToDevice, model->stream));
    }
}

// ---- the step's parts: B_global = B_micro x N x A sequences ----------------------
// A trainer's step (its accumulate_gradients and train_step) runs, for this
// rank's A micro-batches, stage_step, then per micro-batch next_micro_batch,
// its forward, cross_entropy and backward, then the update and end_step.

// The step's A micro-batches into pinned staging (the previous step has
// finished with it), the loss sum zeroed.
template <class Model>
void stage_step(Model* model, const StepBatch& batch) {
    const size_t tokens = (size_t)batch.grad_accum_steps * model->B * model->T;
    if (batch.grad_accum_steps > model->max_grad_accum_steps)
        llmc::failf("internal: %d micro-steps, staging holds %d", batch.grad_accum_steps, model->max_grad_accum_steps);
    memcpy(model->staged_inputs, batch.inputs, tokens * sizeof(int));
    memcpy(model->staged_targets, batch.targets, tokens * sizeof(int));
    cudaCheck(cudaMemsetAsync(&model->stats->loss_sum, 0, sizeof(float), model->stream));
}

// 1/G: one target token's share of the mean loss of the whole global batch.
inline float loss_scale(const StepBatch& batch) {
    return batch.global_targets > 0 ? 1.0f / batch.global_targets : 0.0f;
}

// Micro-batch i on the device (its documents too), and the plan its
// encoder backward groups token positions by (computed on the host).
struct EncoderPlan {
    const int* groups;
    int distinct_tokens;
};
template <class Model>
EncoderPlan next_micro_batch(Model* model, const StepBatch& batch, int i) {
    const size_t micro_tokens = (size_t)model->B * model->T;
    int* plan = model->staged_plans + i * encoder_backward_plan_ints(model->B, model->T);
    const int distinct = encoder_backward_plan(plan, batch.inputs + i * micro_tokens, model->B, model->T);
    upload_micro_batch(model, i);
    return EncoderPlan{plan, distinct};
}

// After the update: the gradient buffer back to zero for the next step, and
// the step's loss and gradient norm read (the one host sync of the step).
template <class Model>
StepResult end_step(Model* model, const StepBatch& batch) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, gradient_elements(model) * sizeof(float), model->stream));
    StepStats stats;
    cudaCheck(cudaMemcpyAsync(&stats, model->stats, sizeof(stats), cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    return StepResult{stats.loss_sum, sqrtf(stats.grad_norm_squared), batch.global_targets};
}
