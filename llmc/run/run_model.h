// llmc/run/run_model.h: what a training run does with a model beyond its step,
// the same for every model family: its activations for a micro-batch size,
// the memory plan, the val loss, HellaSwag and sampling. The hooks a family
// defines for it are in the list at the top of llmc/run/run.h.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "llmc/data/dataloader.h"
#include "llmc/run/distributed.h"
#include "llmc/error.h"
#include "llmc/data/hellaswag.h"
#include "llmc/kernels/matmul.cuh"
#include "llmc/step/params.h"
#include "llmc/run/sampler.h"
#include "llmc/step/train_step.h"

// ---- a family's model struct, the parts every family shares -----------------------
// Its named tensors `params` (floatX) and `grads` (fp32), one pointer per row
// of its table, the activations `acts`, the bytes per layer of each
// (param_strides, grad_strides, act_strides), and `recompute` (-r).

// Parameters and optimizer state allocated for model->config (the family's
// configure_model), the named tensors pointed into them; weights unset.
template <class Model>
void allocate_model(Model* model) {
    configure_model(model);
    allocate_parameters(model);
    point_parameters(&model->params, model->params_memory, model->tensors);
    point_parameters(&model->grads, model->grads_memory, model->tensors);
    model->B = model->T = 0;
    cudaCheck(cudaStreamCreate(&model->stream));
    matmul_setup();
}

// Layer l's weights, gradients and activations (layer_view); a tensor kept
// once for all layers (recompute) is the same in every layer's view.
template <class Model>
auto layer_params(const Model* model, int l) {
    return layer_view(model->params, model->param_strides, l);
}
template <class Model>
auto layer_grads(const Model* model, int l) {
    return layer_view(model->grads, model->grad_strides, l);
}
template <class Model>
auto layer_acts(const Model* model, int l) {
    return layer_view(model->acts, model->act_strides, l);
}

// The family's activation_buffers allocated (none, and false, when the device
// is out of memory), their layer strides, and pinned staging for A micro-batches.
template <class Model>
bool allocate_activation_table(Model* model, int B, int T, int max_grad_accum_steps, int recompute) {
    const std::vector<DeviceBuffer> rows = activation_buffers(model, B, T, recompute);
    if (!allocate_buffers(rows)) return false;
    model->act_strides = buffer_strides(model->acts, rows);
    model->recompute = recompute;
    allocate_staging(model, B, T, max_grad_accum_steps);
    return true;
}

template <class Model>
void free_activations(Model* model) {
    for (const DeviceBuffer& b : activation_buffers(model, model->B, model->T, model->recompute))
        cudaCheck(cudaFree(*b.ptr));
    free_staging(model);
}

template <class Model>
void free_model(Model* model) {
    for (const DeviceBuffer& b : parameter_buffers(model)) cudaCheck(cudaFree(*b.ptr));
    if (model->B > 0) free_activations(model);
    cudaCheck(cudaStreamDestroy(model->stream));
}

// ---- activations ---------------------------------------------------------------
// -t within the model's positions: before its activations are allocated (the family's
// try_allocate_activations) and before a run's memory plan (check_run_settings).
template <class Model>
void check_sequence_length(const Model* model, int T) {
    if (T > model->config.max_seq_len)
        llmc::failf("-t %d exceeds the model's maximum sequence length %d", T, model->config.max_seq_len);
}

// Activations for micro-batches of (B, T), and pinned staging for A of them.
template <class Model>
void allocate_activations(Model* model, int B, int T, int max_grad_accum_steps, int recompute = 0) {
    if (!try_allocate_activations(model, B, T, max_grad_accum_steps, recompute))
        llmc::failf("out of device memory for the activations of B=%d, T=%d (%.1f MiB); try a smaller -b, -r 1 or 2, "
                    "or -b auto",
                    B, T, total_bytes(activation_buffers(model, B, T, recompute)) / 1048576.0);
}

// ---- evaluation and sampling ------------------------------------------------------
// Mean loss over `batches` val batches of every rank.
template <class Model>
double evaluate(Model* model, DataLoader* loader, int batches) {
    const size_t micro_tokens = (size_t)model->B * model->T;
    dataloader_reset(loader);
    double loss_sum = 0, count = 0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(loader);
        loss_sum += evaluate_batch(model, loader->inputs, loader->targets);
        count += count_unmasked(loader->targets, micro_tokens);
    }
    return host_sum(loss_sum, model->dist) / std::max(1.0, host_sum(count, model->dist));
}

// Per-token losses of one micro-batch (B, T) into `losses` (host).
template <class Model>
void token_losses(Model* model, const int* inputs, const int* targets, float* losses) {
    evaluate_batch(model, inputs, targets);
    cudaCheck(
        cudaMemcpy(losses, device_losses(model), (size_t)model->B * model->T * sizeof(float), cudaMemcpyDeviceToHost));
}

// HellaSwag (llm.c's eval .bin): each example's four endings are four rows
// (context + ending) of one batch; the prediction is the ending with the
// lowest mean loss over its tokens. Examples are split over the ranks.
// Returns the accuracy; *scored counts the examples that fit in T.
template <class Model>
double evaluate_hellaswag(Model* model, const std::vector<HellaSwagExample>& examples, long* scored) {
    const int B = model->B, T = model->T, rows = hellaswag_rows_needed(), per_batch = B / rows;
    const int eot = model->doc_token;  // the padding after each row's ending
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    std::vector<float> losses((size_t)B * T);
    double correct = 0, count = 0;
    std::vector<const HellaSwagExample*> mine;
    for (size_t i = model->dist->rank; i < examples.size(); i += model->dist->num_processes)
        mine.push_back(&examples[i]);
    for (size_t first = 0; first < mine.size(); first += per_batch) {
        std::fill(inputs.begin(), inputs.end(), eot);
        std::fill(targets.begin(), targets.end(), -1);
        std::vector<int> fits(per_batch, 0);
        for (int e = 0; e < per_batch && first + e < mine.size(); e++)
            fits[e] =
                hellaswag_fill(*mine[first + e], T, &inputs[(size_t)e * rows * T], &targets[(size_t)e * rows * T], eot);
        token_losses(model, inputs.data(), targets.data(), losses.data());
        for (int e = 0; e < per_batch && first + e < mine.size(); e++) {
            if (!fits[e]) continue;
            const size_t row = (size_t)e * rows * T;
            correct += hellaswag_predict(&losses[row], &targets[row], T) == mine[first + e]->label;
            count += 1;
        }
    }
    count = host_sum(count, model->dist);
    *scored = (long)count;
    return host_sum(correct, model->dist) / std::max(1.0, count);
}

// The V real logits at `position` of (B, T, Vp) device logits, as floats.
inline void read_logits_row(const floatX* device_logits, int position, int V, int Vp, float* logits) {
    std::vector<floatX> row(Vp);
    cudaCheck(
        cudaMemcpy(row.data(), device_logits + (size_t)position * Vp, Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < V; i++) logits[i] = to_float(row[i]);
}

// Generates `tokens` tokens after a document start (one forward per token,
// row 0 of the batch), sampled with the given temperature and top-k from a
// seeded stream.
template <class Model>
std::vector<int> generate(Model* model, int tokens, float temperature, int top_k, uint64_t seed) {
    const int B = model->B, T = model->T, V = vocab_size(model);
    std::vector<int> inputs((size_t)B * T, model->doc_token), targets((size_t)B * T, -1), out;
    std::vector<float> logits(V);
    SamplerRng rng = sampler_rng(seed);
    for (int t = 1; t <= tokens && t < T; t++) {
        evaluate_batch(model, inputs.data(), targets.data());
        read_logits(model, t - 1, logits.data());
        const int next = sample_token(logits.data(), V, temperature, top_k, &rng);
        inputs[t] = next;
        out.push_back(next);
    }
    return out;
}

// ---- the memory plan ---------------------------------------------------------------
// The device memory of a run by what it holds, from the same
// tables the allocation uses, plus cuBLASLt's workspace.
struct MemoryPlan {
    std::vector<std::pair<std::string, size_t>> lines;
    size_t total = 0;
};

template <class Model>
MemoryPlan memory_plan(Model* model, int B, int T, int recompute) {
    MemoryPlan plan;
    std::vector<DeviceBuffer> all = parameter_buffers(model);
    for (const DeviceBuffer& b : activation_buffers(model, B, T, recompute)) all.push_back(b);
    for (const DeviceBuffer& b : all) {
        auto it = std::find_if(plan.lines.begin(), plan.lines.end(), [&](auto& l) { return l.first == b.group; });
        if (it == plan.lines.end()) plan.lines.push_back({b.group, b.bytes});
        else it->second += b.bytes;
        plan.total += b.bytes;
    }
    plan.lines.push_back({"cuBLASLt workspace", CUBLASLT_WORKSPACE_BYTES});
    plan.total += CUBLASLT_WORKSPACE_BYTES;
    return plan;
}

// The largest micro-batch B <= max_B whose activations fit in `available`
// bytes and that divides `sequences_per_rank` (when > 0: the tokens per step
// must stay B x T x N x A), or 0.
template <class Model>
int largest_fitting_batch(Model* model, int T, int recompute, size_t available, int max_B, long sequences_per_rank) {
    for (int B = max_B; B >= 1; B--) {
        if (sequences_per_rank > 0 && sequences_per_rank % B != 0) continue;
        if (total_bytes(activation_buffers(model, B, T, recompute)) <= available) return B;
    }
    return 0;
}

