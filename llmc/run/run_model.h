// llmc/run/run_model.h: what a training run does with a model beyond its step,
// the same for every model family, given the family's table (llmc/run/family.h):
// its activations for a micro-batch size, the memory plan, the val loss,
// HellaSwag and sampling.
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
#include "llmc/run/family.h"

// -t within the model's positions: before its activations are allocated and
// before a run's memory plan (check_run_settings, llmc/run/run.h).
inline void check_sequence_length(int max_seq_len, int T) {
    if (T > max_seq_len) llmc::failf("-t %d exceeds the model's maximum sequence length %d", T, max_seq_len);
}

// Activations for micro-batches of (B, T), and pinned staging for A of them.
template <class Model, class Config>
void allocate_activations(const ModelFamily<Model, Config>& f, Model* model, int B, int T, int max_grad_accum_steps,
                          int recompute = 0) {
    if (!f.try_allocate_activations(model, B, T, max_grad_accum_steps, recompute))
        llmc::failf("out of device memory for the activations of B=%d, T=%d (%.1f MiB); try a smaller -b, -r 1 or 2, "
                    "or -b auto",
                    B, T, total_bytes(f.activation_buffers(model, B, T, recompute)) / 1048576.0);
}

// ---- evaluation and sampling ------------------------------------------------------
// Sum of the per-token losses of one micro-batch (no gradient, no update).
template <class Model, class Config>
double evaluate_batch(const ModelFamily<Model, Config>& f, Model* model, const int* inputs, const int* targets) {
    const size_t n = (size_t)model->B * model->T;
    memcpy(model->staged_inputs, inputs, n * sizeof(int));
    memcpy(model->staged_targets, targets, n * sizeof(int));
    cudaCheck(cudaMemsetAsync(&model->stats->loss_sum, 0, sizeof(float), model->stream));
    upload_micro_batch(model, 0);
    f.forward(model);
    f.cross_entropy(model, 1.0f, false);
    float loss_sum;
    cudaCheck(
        cudaMemcpyAsync(&loss_sum, &model->stats->loss_sum, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    return loss_sum;
}

// Mean loss over `batches` val batches of every rank.
template <class Model, class Config>
double evaluate(const ModelFamily<Model, Config>& f, Model* model, DataLoader* loader, int batches) {
    const size_t micro_tokens = (size_t)model->B * model->T;
    dataloader_reset(loader);
    double loss_sum = 0, count = 0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(loader);
        loss_sum += evaluate_batch(f, model, loader->inputs, loader->targets);
        count += count_unmasked(loader->targets, micro_tokens);
    }
    return host_sum(loss_sum, model->dist) / std::max(1.0, host_sum(count, model->dist));
}

// Per-token losses of one micro-batch (B, T) into `losses` (host).
template <class Model, class Config>
void token_losses(const ModelFamily<Model, Config>& f, Model* model, const int* inputs, const int* targets,
                  float* losses) {
    evaluate_batch(f, model, inputs, targets);
    cudaCheck(cudaMemcpy(losses, f.device_losses(model), (size_t)model->B * model->T * sizeof(float),
                         cudaMemcpyDeviceToHost));
}

// HellaSwag (llm.c's eval .bin): each example's four endings are four rows
// (context + ending) of one batch; the prediction is the ending with the
// lowest mean loss over its tokens. Examples are split over the ranks.
// Returns the accuracy; *scored counts the examples that fit in T.
template <class Model, class Config>
double evaluate_hellaswag(const ModelFamily<Model, Config>& f, Model* model,
                          const std::vector<HellaSwagExample>& examples, long* scored) {
    const int B = model->B, T = model->T, rows = hellaswag_rows_needed(), per_batch = B / rows;
    const int eot = model->doc_token;  // the padding after each row's ending
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    std::vector<float> losses((size_t)B * T);
    double correct = 0, count = 0;
    std::vector<const HellaSwagExample*> mine;
    for (size_t i = model->dist->rank; i < examples.size(); i += model->dist->num_processes)
        mine.push_back(&examples[i]);
    // every rank runs as many batches as rank 0, which has the most examples
    // (ZeRO-3: each forward's gathers are collectives)
    const size_t most = CEIL_DIV(examples.size(), (size_t)model->dist->num_processes);
    for (size_t first = 0; first < most; first += per_batch) {
        std::fill(inputs.begin(), inputs.end(), eot);
        std::fill(targets.begin(), targets.end(), -1);
        std::vector<int> fits(per_batch, 0);
        for (int e = 0; e < per_batch && first + e < mine.size(); e++)
            fits[e] =
                hellaswag_fill(*mine[first + e], T, &inputs[(size_t)e * rows * T], &targets[(size_t)e * rows * T], eot);
        token_losses(f, model, inputs.data(), targets.data(), losses.data());
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
template <class Model, class Config>
std::vector<int> generate(const ModelFamily<Model, Config>& f, Model* model, int tokens, float temperature, int top_k,
                          uint64_t seed) {
    const int B = model->B, T = model->T, V = f.vocab_size(model);
    std::vector<int> inputs((size_t)B * T, model->doc_token), targets((size_t)B * T, -1), out;
    std::vector<float> logits(V);
    SamplerRng rng = sampler_rng(seed);
    for (int t = 1; t <= tokens && t < T; t++) {
        evaluate_batch(f, model, inputs.data(), targets.data());
        f.read_logits(model, t - 1, logits.data());
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

template <class Model, class Config>
MemoryPlan memory_plan(const ModelFamily<Model, Config>& f, Model* model, int B, int T, int recompute) {
    MemoryPlan plan;
    std::vector<DeviceBuffer> all = parameter_buffers(model);
    for (const DeviceBuffer& b : f.activation_buffers(model, B, T, recompute)) all.push_back(b);
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
template <class Model, class Config>
int largest_fitting_batch(const ModelFamily<Model, Config>& f, Model* model, int T, int recompute, size_t available,
                          int max_B, long sequences_per_rank) {
    for (int B = max_B; B >= 1; B--) {
        if (sequences_per_rank > 0 && sequences_per_rank % B != 0) continue;
        if (total_bytes(f.activation_buffers(model, B, T, recompute)) <= available) return B;
    }
    return 0;
}

