// train_llama3.cu: Llama 3 training. The model (its parameter table,
// activations, forward, backward, model file), its step and main, shaped as
// train_gpt.cu's (the lesson to read first), calling the same services of
// llmc/run/ and llmc/step/.
// What Llama changes against GPT-2, block by block:
//   embedding   tokens only: positions enter through RoPE on q and k
//   norms       RMSNorm (no mean, no bias), fused with the residual add
//   attention   grouped-query: NKV key/value heads, each read by NH/NKV query heads
//   MLP         SwiGLU on one fused [gate | up] projection
//   biases      none; the LM head tied to the embedding or its own
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/kernels/rmsnorm.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/kernels/swiglu.cuh"
#include "llmc/step/params.h"
#include "llmc/step/train_step.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/formats/llama3_config.h"
#include "llmc/run/mfu.h"
#include "llmc/rand.h"
#include "llmc/run/run_checkpoint.h"
#include "llmc/run/run_model.h"
#include "llmc/run/run.h"
#include "llmc/formats/hf_model.h"
#include "llmc/formats/safetensors.h"

#define FAIL(...) llmc::failf(__VA_ARGS__)
using llmc::Llama3Config;

// ----------------------------------------------------------------------------
// Parameters: one row per tensor, in dev/train_llama3.py's order (the one
// contiguous buffer, the reference's debug files and the initialisation's
// stream numbers). lmheadw exists only when the head is untied.
enum class Shape { VpC, C, QKVxC, CxC, F2xC, CxF };
struct Llama3Tensor {
    const char* name;
    bool per_layer;
    Shape shape;   // of one layer's tensor
    bool decays;   // AdamW's weight decay: the matrices
    double std;    // initial N(0, std) for std > 0 (scaled by 1/sqrt(2L) where residual); 0: all ones
    bool residual;
};
// clang-format off
constexpr Llama3Tensor TENSORS[] = {
    // name       per layer  shape          decays  std   residual projection
    {"wte",       false, Shape::VpC,    true,  0.02, false},  // its padded vocabulary rows are 0
    {"attnnormw", true,  Shape::C,      false, 0,    false},
    {"qkvw",      true,  Shape::QKVxC,  true,  0.02, false},  // rows [q: NH heads | k: NKV heads | v: NKV heads]
    {"attprojw",  true,  Shape::CxC,    true,  0.02, true},
    {"mlpnormw",  true,  Shape::C,      false, 0,    false},
    {"fcw",       true,  Shape::F2xC,   true,  0.02, false},  // rows [gate: F | up: F] (llmc/kernels/swiglu.cuh)
    {"fcprojw",   true,  Shape::CxF,    true,  0.02, true},
    {"normfw",    false, Shape::C,      false, 0,    false},
    {"lmheadw",   false, Shape::VpC,    true,  0.02, false},  // untied only
};
// clang-format on
constexpr int MAX_TENSORS = sizeof(TENSORS) / sizeof(TENSORS[0]);

template <class T>
struct ParameterTensors {
    T *wte, *attnnormw, *qkvw, *attprojw, *mlpnormw, *fcw, *fcprojw, *normfw, *lmheadw;
};
static_assert(sizeof(ParameterTensors<float>) == MAX_TENSORS * sizeof(float*), "one pointer per row");

// V rounded up to a multiple of 128: the rows of wte and of the LM head.
static int padded_vocab(const Llama3Config& c) { return padded_vocab_size(c.V); }
static int qkv_rows(const Llama3Config& c) { return (c.H + 2 * c.KV) * c.head_dim(); }
static int num_tensors(const Llama3Config& c) { return c.tied ? MAX_TENSORS - 1 : MAX_TENSORS; }

static size_t tensor_size(int k, const Llama3Config& c) {
    const size_t C = c.C, F = c.F, layers = TENSORS[k].per_layer ? c.L : 1;
    switch (TENSORS[k].shape) {
        case Shape::VpC: return (size_t)padded_vocab(c) * C;
        case Shape::C: return layers * C;
        case Shape::QKVxC: return layers * qkv_rows(c) * C;
        case Shape::CxC: return layers * C * C;
        case Shape::F2xC: return layers * 2 * F * C;
        case Shape::CxF: return layers * C * F;
    }
    return 0;
}
static std::vector<ParameterLayout> llama3_layout(const Llama3Config& c) {
    std::vector<ParameterLayout> rows;
    const int C = c.C, F = c.F, KV = c.KV * c.head_dim();
    for (int k = 0; k < num_tensors(c); k++) {
        rows.push_back({tensor_size(k, c), TENSORS[k].per_layer, TENSORS[k].decays});
        switch (TENSORS[k].shape) {  // --optimizer muon: a layer's hidden matrices, [out, in]
            case Shape::QKVxC: rows.back().muon = {{C, C, 1}, {KV, C, 2}}; break;  // q; k and v
            case Shape::CxC: rows.back().muon = {{C, C, 1}}; break;
            case Shape::F2xC: rows.back().muon = {{F, C, 2}}; break;  // gate and up
            case Shape::CxF: rows.back().muon = {{C, F, 1}}; break;
            default: break;  // embeddings, head, norms: AdamW
        }
    }
    return rows;
}

// ----------------------------------------------------------------------------
// Activations: what the backward reads, allocated once for (B, T).
struct ActivationTensors {
    floatX* encoded;     // (B, T, C)        wte[token]
    floatX* ln1;         // (L, B, T, C)     attention norm output
    float* ln1_rstd;     // (L, B, T)
    floatX* qkv;         // (L, B, T, QKV)   after RoPE on q and k
    floatX* atty;        // (L, B, T, C)
    float* att_lse;      // (L, B, NH, T)
    floatX* residual2;   // (L, B, T, C)     after the attention block
    floatX* ln2;         // (L, B, T, C)     MLP norm output
    float* ln2_rstd;     // (L, B, T)
    floatX* fch;         // (L, B, T, 2F)    [gate | up]
    floatX* fch_swiglu;  // (L, B, T, F)
    floatX* residual3;   // (L, B, T, C)     after the MLP block
    floatX* lnf;         // (B, T, C)
    float* lnf_rstd;     // (B, T)
    floatX* logits;      // (B, T, Vp)       dlogits after cross_entropy
    float* losses;       // (B, T)
    floatX* proj_out;    // (B, T, C)        scratch: a projection's output
    float* rope;         // (T, HS)          rope_table's cos | sin rows for positions 0..T-1
};
struct BackwardScratch {
    floatX* dresidual;   // (B, T, C)
    floatX* dwide;       // (B, T, max(2F, QKV))  d[gate | up], dqkv
    floatX* dmid;        // (B, T, F)             d swiglu output
    floatX* dnarrow;     // (B, T, C)             d of a norm's output, datty
    float* reduce;       // the two-stage reductions' partial sums
    int* encoder_plan;   // token-grouped positions for the embedding backward
};

struct Llama3 : Parameters, MicroBatches {
    Llama3Config config;
    ParameterTensors<floatX> params;
    ParameterTensors<float> grads;
    int recompute = 0;  // -r: 1 recomputes SwiGLU's output in the backward, 2 also the norms' outputs, 3 the block
    ActivationTensors acts;
    BackwardScratch scratch;
    std::vector<size_t> param_strides, grad_strides, act_strides;
};

// ---- sizes and allocation -------------------------------------------------
// A shape whose sizes fit the kernels' int indexing and at most 2^40 parameters.
static void configure_model(Llama3* model) {
    const Llama3Config& c = model->config;
    llmc::llama3_check(c, "model");
    for (int d : {c.C, c.F, c.V, c.H, qkv_rows(c)})
        if (d > MAX_MODEL_DIM) FAIL("model: a size of %d is over 2^24", d);  // (llmc/step/params.h's limits)
    if (c.L > MAX_MODEL_LAYERS) FAIL("model: L=%d is over %ld layers", c.L, MAX_MODEL_LAYERS);
    if (llmc::llama3_num_parameters(c) > MAX_MODEL_PARAMETERS) FAIL("model: more than 2^40 parameters");
    const std::vector<ParameterLayout> rows = llama3_layout(c);
    configure_parameters(model, rows, c.L);
    // one stride per pointer: lmheadw (not per layer) has none when tied
    model->param_strides = parameter_strides(rows, c.L, sizeof(floatX));
    model->grad_strides = parameter_strides(rows, c.L, sizeof(float));
    model->param_strides.resize(MAX_TENSORS, 0);
    model->grad_strides.resize(MAX_TENSORS, 0);
}

// Parameters and optimizer state allocated for model->config, the named
// tensors pointed into them (the tied head is wte itself, for the weights and
// for their gradient); weights unset.
static void llama3_allocate_parameters(Llama3* model) {
    configure_model(model);
    allocate_parameters(model);
    point_parameters(&model->params, model->params_memory, weight_layout(model));  // ZeRO-3: the staging's
    point_parameters(&model->grads, model->grads_memory, gradient_layout(model));  // ZeRO-2: the staging's
    model->B = model->T = 0;
    cudaCheck(cudaStreamCreate(&model->stream));
    matmul_setup();
    if (model->config.tied) {
        model->params.lmheadw = model->params.wte;
        model->grads.lmheadw = model->grads.wte;
    }
}

// Layer l's weights, gradients and activations (layer_view); a tensor kept
// once for all layers (recompute) is the same in every layer's view.
static ParameterTensors<floatX> layer_params(const Llama3* model, int l) {
    return layer_view(model->params, model->param_strides, weight_slot(model, l));  // ZeRO-3: a staging slot
}
static ParameterTensors<float> layer_grads(const Llama3* model, int l) {
    return layer_view(model->grads, model->grad_strides, gradient_slot(model, l));  // ZeRO-2: a staging slot
}
static ActivationTensors layer_acts(const Llama3* model, int l) {
    return layer_view(model->acts, model->act_strides, l);
}

// ---- initialisation from a seed -----------------------------------------
// Tensor k is fill_normal's stream k of the seed (dev/train_llama3.py's
// init_params draws the same values); norm weights are 1, padded vocabulary
// rows 0.
static std::vector<float> llama3_initial_weights(const Llama3Config& c, uint64_t seed) {
    size_t total = 0;
    for (int k = 0; k < num_tensors(c); k++) total += tensor_size(k, c);
    std::vector<float> w(total);
    float* t = w.data();
    for (int k = 0; k < num_tensors(c); k++) {
        const size_t n = tensor_size(k, c);
        const Llama3Tensor& spec = TENSORS[k];
        if (spec.std == 0) std::fill(t, t + n, 1.0f);
        else fill_normal(t, n, spec.residual ? spec.std / sqrt(2.0 * c.L) : spec.std, seed, k);
        if (spec.shape == Shape::VpC) std::fill(t + (size_t)c.V * c.C, t + n, 0.0f);
        t += n;
    }
    return w;
}

// "llama3:..." or a published size; false for anything else (a model file).
static bool parse_descriptor(const char* text, Llama3Config* c) {
    Llama3Config named;
    if (!llmc::llama3_named(text, &named) && strncmp(text, "llama3:", 7) != 0) return false;
    *c = llmc::llama3_parse_descriptor(text);
    return true;
}

// (a descriptor that does not parse is one error line saying what is wrong)
static void init_from_descriptor(Llama3* model, const char* descriptor, uint64_t seed) {
    model->config = llmc::llama3_parse_descriptor(descriptor);
    llama3_allocate_parameters(model);
    set_weights(model, llama3_initial_weights(model->config, seed));
}

// ---- model files: Hugging Face's tensors ------------------------------------
// Every tensor of llama3_param_table at its place in the buffer: q, k and v
// are consecutive rows of qkvw, gate and up of fcw, so each Hugging Face
// tensor is one contiguous run (transformers' q/k layout, which RoPE's
// rotate_half pairing in llmc/kernels/rope.cuh expects, is kept as it is).
static std::vector<llmc::HfPlacement> hf_tensors(const Llama3Config& c) {
    const size_t C = c.C, F = c.F, HS = c.head_dim(), QKV = qkv_rows(c);
    size_t start[MAX_TENSORS], total = 0;  // where each row of TENSORS starts in the buffer
    for (int k = 0; k < num_tensors(c); k++) start[k] = total, total += tensor_size(k, c);
    auto at = [&](const char* tensor) {  // by the row's name in TENSORS, the one table of the tensors
        for (int k = 0; k < num_tensors(c); k++)
            if (strcmp(TENSORS[k].name, tensor) == 0) return start[k];
        FAIL("model: no tensor %s", tensor);
    };
    std::vector<llmc::HfPlacement> out;
    for (const llmc::Llama3Param& p : llmc::llama3_param_table(c)) {
        const std::string& n = p.name;
        const size_t l = n.rfind("model.layers.", 0) == 0 ? std::stoul(n.substr(13)) : 0;  // its layer
        auto has = [&](const char* part) { return n.find(part) != std::string::npos; };
        size_t offset;
        if (n == "model.embed_tokens.weight") offset = at("wte");
        else if (n == "model.norm.weight") offset = at("normfw");
        else if (n == "lm_head.weight") offset = at("lmheadw");
        else if (has("input_layernorm")) offset = at("attnnormw") + l * C;
        else if (has("q_proj")) offset = at("qkvw") + l * QKV * C;
        else if (has("k_proj")) offset = at("qkvw") + l * QKV * C + c.H * HS * C;
        else if (has("v_proj")) offset = at("qkvw") + l * QKV * C + (c.H + c.KV) * HS * C;
        else if (has("o_proj")) offset = at("attprojw") + l * C * C;
        else if (has("post_attention_layernorm")) offset = at("mlpnormw") + l * C;
        else if (has("gate_proj")) offset = at("fcw") + l * 2 * F * C;
        else if (has("up_proj")) offset = at("fcw") + l * 2 * F * C + F * C;
        else if (has("down_proj")) offset = at("fcprojw") + l * C * F;
        else FAIL("model: no place for the tensor %s", n.c_str());
        out.push_back({p.name, p.shape, offset});
    }
    return out;
}

// The shape a Hugging Face folder gives: its config.json.
static Llama3Config model_file_config(const char* path) {
    return llmc::llama3_read_hf_config(std::string(path) + "/config.json");
}

// Every tensor of the folder checked by name, shape and dtype (a tensor the
// model does not have is refused), then read into the fp32 buffer.
static void init_from_model_file(Llama3* model, const char* path) {
    model->config = model_file_config(path);
    configure_model(model);  // the sizes checked before a table of L layers is built
    llmc::SafetensorsModel folder(path);
    const std::vector<llmc::HfPlacement> placed = hf_tensors(model->config);
    llmc::hf_check_tensors(folder, path, placed, [](const std::string&) { return false; });
    llama3_allocate_parameters(model);
    std::vector<float> weights(model->num_parameters, 0.0f);
    llmc::hf_read_tensors(folder, placed, weights.data());
    check_weights_representable(weights, path);
    set_weights(model, weights);
}

// The weights it computes with as a Hugging Face folder at path, the one
// LlamaForCausalLM.from_pretrained loads: config.json and model.safetensors
// under transformers' names. Written whole (write_folder_atomic: a temporary
// folder renamed into place; a checkpoint rewrites the model of a step whose
// DONE it has removed); its two files' names, sizes and hashes.
static std::vector<CheckpointFile> write_model_file(const Llama3* model, const std::vector<floatX>& weights,
                                                    const std::string& path) {
    if (!all_finite(weights)) FAIL("%s: the model's weights hold Inf or NaN; not written", path.c_str());
    const bool bf16 = sizeof(floatX) == 2;
    std::vector<llmc::SafetensorsOut> out;
    for (const llmc::HfPlacement& h : hf_tensors(model->config))
        out.push_back({h.name, bf16 ? "BF16" : "F32", h.shape, weights.data() + h.offset});
    return write_folder_atomic(path, [&](const std::string& tmp) {
        return std::vector<CheckpointFile>{
            llmc::llama3_write_hf_config(tmp + "/config.json", model->config, bf16 ? "bfloat16" : "float32"),
            llmc::safetensors_write(tmp + "/model.safetensors", out, {{"format", "pt"}})};
    });
}

// ---- activations ------------------------------------------------------------
// Recompute (-r) keeps one layer's copy: 1 = the SwiGLU output, 2 = also the
// two norm outputs, 3 = everything but the block's input (residual3 of the
// layer before, or encoded); the backward recomputes them from the stored
// inputs (recompute_layer), bitwise the forward's values.
static std::vector<DeviceBuffer> activation_buffers(Llama3* model, int B, int T, int recompute) {
    const Llama3Config& c = model->config;
    const size_t BT = (size_t)B * T, C = c.C, L = c.L, NH = c.H, F = c.F, QKV = qkv_rows(c), Vp = padded_vocab(c);
    const size_t X = sizeof(floatX), S = sizeof(float);
    const size_t L_swiglu = recompute >= 1 ? 1 : L, L_ln = recompute >= 2 ? 1 : L;
    const size_t L_block = recompute >= 3 ? 1 : L;  // the rest of the block's (residual3 is kept: the next input)
    ActivationTensors& a = model->acts;
    BackwardScratch& s = model->scratch;
    const size_t reduce_floats = std::max({rmsnorm_backward_scratch_floats(BT, C),
                                           attention_backward_scratch_floats(B, T, NH), global_norm_scratch_floats()});
    const char* act = "activations (B x T x C x L)";
    const char* bwd = "backward scratch";
    const int Lk = (int)L, Ls = (int)L_swiglu, Ll = (int)L_ln, Lb = (int)L_block;
    const size_t Lbk = L_block;
    // clang-format off
    std::vector<DeviceBuffer> rows = {
        {(void**)&a.encoded, BT * C * X, act},
        {(void**)&a.ln1, L_ln * BT * C * X, act, Ll},         {(void**)&a.ln1_rstd, Lbk * BT * S, act, Lb},
        {(void**)&a.qkv, Lbk * BT * QKV * X, act, Lb},        {(void**)&a.atty, Lbk * BT * C * X, act, Lb},
        {(void**)&a.att_lse, Lbk * BT * NH * S, act, Lb},     {(void**)&a.residual2, Lbk * BT * C * X, act, Lb},
        {(void**)&a.ln2, L_ln * BT * C * X, act, Ll},         {(void**)&a.ln2_rstd, Lbk * BT * S, act, Lb},
        {(void**)&a.fch, Lbk * BT * 2 * F * X, act, Lb},      {(void**)&a.fch_swiglu, L_swiglu * BT * F * X, act, Ls},
        {(void**)&a.residual3, L * BT * C * X, act, Lk},      {(void**)&a.lnf, BT * C * X, act},
        {(void**)&a.lnf_rstd, BT * S, act},                   {(void**)&a.proj_out, BT * C * X, act},
        {(void**)&a.rope, (size_t)T * c.head_dim() * S, act},
        {(void**)&a.logits, BT * Vp * X, "logits (B x T x Vp)"}, {(void**)&a.losses, BT * S, "logits (B x T x Vp)"},
        {(void**)&s.dresidual, BT * C * X, bwd},              {(void**)&s.dwide, BT * std::max(2 * F, QKV) * X, bwd},
        {(void**)&s.dmid, BT * F * X, bwd},                   {(void**)&s.dnarrow, BT * C * X, bwd},
        {(void**)&s.reduce, reduce_floats * S, bwd},
        {(void**)&s.encoder_plan, encoder_backward_plan_ints(B, T) * sizeof(int), bwd},
    };
    // clang-format on
    for (const DeviceBuffer& b : micro_batch_buffers(model, &model->stats, B, T)) rows.push_back(b);
    return rows;
}

// Also uploads RoPE's table of cos and sin for positions 0..T-1 (every
// position id, document-relative ones included, is below T).
static bool try_allocate_activations(Llama3* model, int B, int T, int max_grad_accum_steps, int recompute) {
    const Llama3Config& c = model->config;
    check_sequence_length(c.max_seq_len, T);
    const std::vector<DeviceBuffer> rows = activation_buffers(model, B, T, recompute);
    if (!allocate_buffers(rows)) return false;
    model->act_strides = buffer_strides(model->acts, rows);
    model->recompute = recompute;
    allocate_staging(model, B, T, max_grad_accum_steps);
    RopeScaling scaling;
    if (c.rope_scaling)
        scaling = RopeScaling{c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
                              (double)c.rope_original_max_seq_len};
    const std::vector<float> table = rope_table(T, c.head_dim(), c.rope_theta, scaling);
    cudaCheck(cudaMemcpy(model->acts.rope, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
    return true;
}

static void free_activations(Llama3* model) {
    for (const DeviceBuffer& b : activation_buffers(model, model->B, model->T, model->recompute))
        cudaCheck(cudaFree(*b.ptr));
    free_staging(model);
}

static void free_model(Llama3* model) {
    for (const DeviceBuffer& b : parameter_buffers(model)) cudaCheck(cudaFree(*b.ptr));
    if (model->B > 0) free_activations(model);
    cudaCheck(cudaStreamDestroy(model->stream));
}

// ----------------------------------------------------------------------------
// Forward: logits (B, T, Vp) for the tokens in model->inputs.

// Block l from its normed input (ln1, written before) to the SwiGLU output:
// everything its backward reads. The forward and -r 3's recompute both run
// it, so the recompute is the forward's kernels in its order.
static void block_forward(Llama3* model, int l, const floatX* residual) {
    const Llama3Config& c = model->config;
    const int B = model->B, T = model->T, C = c.C, NH = c.H, NKV = c.KV, HS = c.head_dim(), F = c.F;
    const int BT = B * T, QKV = qkv_rows(c);
    const ParameterTensors<floatX> w = layer_params(model, l);
    const ActivationTensors x = layer_acts(model, l);
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    const int* positions = document_positions(model);  // RoPE's: document-relative, or t where null
    // attention block: residual2 = residual + o(attention(rope(qkv(norm(residual)))))
    matmul_forward(x.qkv, x.ln1, w.qkvw, nullptr, BT, C, QKV, stream);
    rope_forward(x.qkv, x.qkv, a.rope, positions, B, T, NH + NKV, HS, QKV, T, stream);  // q and k heads
    attention_forward(x.atty, x.att_lse, x.qkv, attention_documents(model), B, T, NH, NKV, HS, stream);
    matmul_forward(a.proj_out, x.atty, w.attprojw, nullptr, BT, C, C, stream);
    fused_residual_rmsnorm_forward(x.residual2, x.ln2, x.ln2_rstd, residual, a.proj_out, w.mlpnormw, BT, C,
                                   (float)c.rms_norm_eps, stream);
    // MLP block up to its down projection: silu(gate) * up of ln2
    matmul_forward(x.fch, x.ln2, w.fcw, nullptr, BT, C, 2 * F, stream);
    swiglu_forward(x.fch_swiglu, x.fch, BT, F, stream);
}

static void forward(Llama3* model) {
    const Llama3Config& c = model->config;
    const int B = model->B, T = model->T, C = c.C, F = c.F, L = c.L;
    const int BT = B * T;
    const float eps = (float)c.rms_norm_eps;
    const ParameterTensors<floatX>& p = model->params;
    ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;

    gather_layer_weights(model, 0);  // ZeRO-3: each layer's weights into its slot, one layer ahead
    encoder_forward(a.encoded, model->inputs, nullptr, p.wte, nullptr, B, T, C, stream);
    wait_layer_weights(model, 0);
    rmsnorm_forward(a.ln1, a.ln1_rstd, a.encoded, p.attnnormw, BT, C, eps, stream);
    for (int l = 0; l < L; l++) {
        if (l + 1 < L) gather_layer_weights(model, l + 1);  // ZeRO-3: prefetched while layer l computes
        wait_layer_weights(model, l);
        const ParameterTensors<floatX> w = layer_params(model, l);
        const ActivationTensors x = layer_acts(model, l);
        block_forward(model, l, l == 0 ? a.encoded : layer_acts(model, l - 1).residual3);
        // residual3 = residual2 + down(silu(gate) * up); the add is fused with
        // the next norm (the next layer's, or the final one).
        matmul_forward(a.proj_out, x.fch_swiglu, w.fcprojw, nullptr, BT, F, C, stream);
        const bool last = l + 1 == L;
        if (!last) wait_layer_weights(model, l + 1);  // its norm runs here, fused
        floatX* norm_out = last ? a.lnf : layer_acts(model, l + 1).ln1;
        float* norm_rstd = last ? a.lnf_rstd : layer_acts(model, l + 1).ln1_rstd;
        const floatX* norm_w = last ? p.normfw : layer_params(model, l + 1).attnnormw;
        fused_residual_rmsnorm_forward(x.residual3, norm_out, norm_rstd, x.residual2, a.proj_out, norm_w, BT, C, eps,
                                       stream);
    }
    matmul_forward(a.logits, a.lnf, p.lmheadw, nullptr, BT, C, padded_vocab(c), stream);
}

static void cross_entropy(Llama3* model, float loss_scale, bool write_dlogits) {
    classifier_loss(model->acts.logits, model->acts.losses, model->targets, loss_scale, model->B * model->T,
                    model->config.V, padded_vocab(model->config), write_dlogits, &model->stats->loss_sum,
                    model->stream);
}

// -r: what layer l's backward reads and the forward did not keep, rerun from
// what it kept: the SwiGLU output (1), also the norm outputs from the stored
// residuals (2), or the whole block from its input (3; ln1 as the forward's
// fused norm computed it).
static void recompute_layer(Llama3* model, int l, const floatX* residual) {
    const int BT = model->B * model->T, C = model->config.C;
    const float eps = (float)model->config.rms_norm_eps;
    const ParameterTensors<floatX> w = layer_params(model, l);
    const ActivationTensors x = layer_acts(model, l);
    cudaStream_t stream = model->stream;
    if (model->recompute >= 3) {
        rmsnorm_forward(x.ln1, x.ln1_rstd, residual, w.attnnormw, BT, C, eps, stream);
        block_forward(model, l, residual);
        return;
    }
    if (model->recompute >= 1) swiglu_forward(x.fch_swiglu, x.fch, BT, model->config.F, stream);
    if (model->recompute >= 2) {
        rmsnorm_forward(x.ln2, x.ln2_rstd, x.residual2, w.mlpnormw, BT, C, eps, stream);
        rmsnorm_forward(x.ln1, x.ln1_rstd, residual, w.attnnormw, BT, C, eps, stream);
    }
}

// ----------------------------------------------------------------------------
// Backward: adds this micro-batch's weight gradients into the fp32 buffer;
// reduce: the last micro-batch of a step with N > 1 ranks.
static void backward(Llama3* model, const int* encoder_plan_host, int num_distinct_tokens, bool reduce) {
    const Llama3Config& c = model->config;
    const int B = model->B, T = model->T, C = c.C, NH = c.H, NKV = c.KV, HS = c.head_dim(), F = c.F, L = c.L;
    const int BT = B * T, QKV = qkv_rows(c);
    cudaStream_t stream = model->stream;
    const ParameterTensors<floatX>& p = model->params;
    const ParameterTensors<float>& g = model->grads;
    ActivationTensors& a = model->acts;
    BackwardScratch& s = model->scratch;
    const int2* docs = attention_documents(model);
    const int* positions = document_positions(model);  // RoPE's: document-relative, or t where null

    begin_backward_gradients(model);  // ZeRO-2: the staging zeroed once free
    gather_layer_weights(model, L - 1);  // ZeRO-3: again for the backward, while the head's runs
    cudaCheck(cudaMemcpyAsync(s.encoder_plan, encoder_plan_host, encoder_backward_plan_ints(B, T) * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
    // LM head (into wte's gradient when tied) and final norm
    matmul_backward(s.dnarrow, g.lmheadw, nullptr, s.reduce, a.logits, a.lnf, p.lmheadw, BT, C, padded_vocab(c),
                    stream);
    cudaCheck(cudaMemsetAsync(s.dresidual, 0, (size_t)BT * C * sizeof(floatX), stream));
    rmsnorm_backward(s.dresidual, g.normfw, s.reduce, s.dnarrow, layer_acts(model, L - 1).residual3, p.normfw,
                     a.lnf_rstd, BT, C, stream);
    for (int l = L - 1; l >= 0; l--) {
        if (l > 0) gather_layer_weights(model, l - 1);  // ZeRO-3: prefetched while layer l computes
        wait_layer_weights(model, l);
        const ParameterTensors<floatX> w = layer_params(model, l);
        begin_layer_gradients(model, l);  // ZeRO-2: the slot zeroed once free
        const ParameterTensors<float> dw = layer_grads(model, l);
        const ActivationTensors x = layer_acts(model, l);
        const floatX* residual = l == 0 ? a.encoded : layer_acts(model, l - 1).residual3;
        recompute_layer(model, l, residual);
        // MLP block (dresidual: the gradient w.r.t. residual3)
        matmul_backward(s.dmid, dw.fcprojw, nullptr, s.reduce, s.dresidual, x.fch_swiglu, w.fcprojw, BT, F, C, stream);
        swiglu_backward(s.dwide, s.dmid, x.fch, BT, F, stream);
        matmul_backward(s.dnarrow, dw.fcw, nullptr, s.reduce, s.dwide, x.ln2, w.fcw, BT, C, 2 * F, stream);
        rmsnorm_backward(s.dresidual, dw.mlpnormw, s.reduce, s.dnarrow, x.residual2, w.mlpnormw, x.ln2_rstd, BT, C,
                         stream);
        // attention block (dresidual: the gradient w.r.t. residual2)
        matmul_backward(s.dnarrow, dw.attprojw, nullptr, s.reduce, s.dresidual, x.atty, w.attprojw, BT, C, C, stream);
        attention_backward(s.dwide, s.reduce, s.dnarrow, x.qkv, x.atty, x.att_lse, docs, B, T, NH, NKV, HS, stream);
        rope_backward(s.dwide, s.dwide, a.rope, positions, B, T, NH + NKV, HS, QKV, T, stream);
        matmul_backward(s.dnarrow, dw.qkvw, nullptr, s.reduce, s.dwide, x.ln1, w.qkvw, BT, C, QKV, stream);
        rmsnorm_backward(s.dresidual, dw.attnnormw, s.reduce, s.dnarrow, residual, w.attnnormw, x.ln1_rstd, BT, C,
                         stream);
        if (reduce) reduce_layer(model, l);
    }
    encoder_backward(g.wte, nullptr, s.dresidual, s.encoder_plan, num_distinct_tokens, nullptr, 0, B, T, C, stream);
    if (reduce) reduce_layer(model, L);  // wte, normfw, lmheadw and the loss
}

// Llama 3's tokenizer begins every document with <|begin_of_text|> (128000;
// <|end_of_text|>, 128001, ends it): the document start for its vocabulary of
// 128256. Another vocabulary's is not known here (-1: llmc/run/run.h asks for
// --doc-token; the built-in corpus's shards record theirs).
constexpr int LLAMA3_VOCAB = 128256, LLAMA3_BEGIN_OF_TEXT = 128000;
static int document_start_token(const Llama3* model) {
    return model->config.V == LLAMA3_VOCAB ? LLAMA3_BEGIN_OF_TEXT : -1;
}

static void read_logits(const Llama3* model, int position, float* logits) {
    read_logits_row(model->acts.logits, position, model->config.V, padded_vocab(model->config), logits);
}

static std::string describe(const Llama3Config& c) {
    char text[200];
    snprintf(text, sizeof text, "Llama 3 L=%d C=%d H=%d KV=%d F=%d V=%d maxT=%d %s, ", c.L, c.C, c.H, c.KV, c.F, c.V,
             c.max_seq_len, c.tied ? "tied" : "untied");
    return text + llmc::llama3_rope_text(c);
}

// ----------------------------------------------------------------------------
// One optimizer step: B_global = B_micro x N x A sequences, as train_gpt.cu's
// (read there): the A micro-batches' gradients add up in the fp32 buffer with
// the weights frozen, each token's loss scaled by 1/G of the global batch; only
// the last micro-batch's backward reduces over the ranks; then one update.
static void accumulate_gradients(Llama3* model, const StepBatch& batch) {
    const int A = batch.grad_accum_steps;
    stage_step(model, batch);                // the A micro-batches into pinned memory; loss sum = 0
    const float dloss = loss_scale(batch);  // 1/G
    for (int micro_step = 0; micro_step < A; micro_step++) {
        const EncoderPlan plan = next_micro_batch(model, batch, micro_step);
        forward(model);
        cross_entropy(model, dloss, true);  // the logits become dloss/dlogits; the loss adds up too
        backward(model, plan.groups, plan.distinct_tokens, reduces_gradients(model, micro_step, A));
    }
}

static StepResult train_step(Llama3* model, const StepBatch& batch, float lr, const OptimizerSettings& opt) {
    accumulate_gradients(model, batch);
    update_parameters(model, model->scratch.reduce, lr, opt);  // global norm, clip, AdamW
    return end_step(model, batch);  // the buffer zeroed; the loss and the norm read (the one host sync)
}

// ----------------------------------------------------------------------------
// Llama 3 for the run's services (llmc/run/family.h).
static ModelFamily<Llama3, Llama3Config> llama3_family() {
    ModelFamily<Llama3, Llama3Config> f{};
    f.name = "Llama 3";
    f.init_default = "llama3.2-1b";
    f.init_help = "a Hugging Face Llama folder (config.json + model.safetensors or shards;\na checkpoint's model is "
                  "one), or a descriptor: llama3.2-1b, llama3.2-3b, llama3.1-8b,\nllama3.1-70b, or e.g. "
                  "\"llama3:L=2,C=64,H=4,KV=2,F=192,V=256\" (T=, theta=, eps=, tied=,\nfactor=, low=, high=, orig=)";
    f.doc_token_help = "the token that starts a document (--packing slots, --doc-mask, --doc-positions,\nsamples); "
                       "-1: the built-in corpus's EOT, else 128000 (<|begin_of_text|>) for\nV=128256; any other V: "
                       "give it";
    f.recompute_help =
        "recompute in the backward: 1 = SwiGLU, 2 = SwiGLU and the RMSNorms,\n3 = the whole block from its input";
    f.builtin_init = "llama3:L=2,C=64,H=4,KV=2,F=192,V=256,T=64";
    // a checkpoint's model is a Hugging Face folder model_%08d of these files (write_model_file)
    f.model_folder_files = {"config.json", "model.safetensors"};
    f.forward = forward;
    f.cross_entropy = cross_entropy;
    f.accumulate_gradients = accumulate_gradients;
    f.parse_descriptor = parse_descriptor;
    f.model_file_config = model_file_config;
    f.same_config = [](const Llama3Config& a, const Llama3Config& b) { return a == b; };
    f.describe = describe;
    f.configure_model = configure_model;
    f.vocab_size = [](const Llama3* m) { return m->config.V; };
    f.max_seq_len = [](const Llama3* m) { return m->config.max_seq_len; };
    f.document_start_token = document_start_token;
    // 6N + 6LCT as for GPT-2 (llmc/run/mfu.h): every weight a multiply-add per token,
    // attention's two matmuls over C = NH x HS (GQA shares K and V, not the work)
    f.flops_per_token = [](const Llama3* m, int T) {
        return flops_per_token(m->num_parameters, m->config.L, m->config.C, T);
    };
    f.init_from_descriptor = init_from_descriptor;
    f.init_from_model_file = init_from_model_file;
    f.write_model_file = write_model_file;
    f.activation_buffers = activation_buffers;
    f.try_allocate_activations = try_allocate_activations;
    f.free_activations = free_activations;
    f.free_model = free_model;
    f.device_losses = [](const Llama3* m) -> const float* { return m->acts.losses; };
    f.read_logits = read_logits;
    return f;
}
static const ModelFamily<Llama3, Llama3Config> LLAMA3_FAMILY = llama3_family();

// ----------------------------------------------------------------------------
// main: the flags, the model, the data, then the training loop (train_gpt.cu's).
#ifndef TESTING
static int train(int argc, char** argv) {
    Run<Llama3, Llama3Config> run(&LLAMA3_FAMILY);  // what the run holds (llmc/run/run.h)
    Llama3& model = run.model;
    TrainOptions opt;
    start_run(&run, &argc, &argv, run_flags<TrainOptions>(LLAMA3_FAMILY), &opt);
    if (opt.memory_plan_only) {
        print_plan_only(&run);
        return end_run(&run);
    }
    build_model(&run);  // the newest complete checkpoint of -o (-y 1), else -e; -b auto chooses B
    open_data(&run);    // the loaders, B_global = B_micro x N x A; the steps
    print_run(&run);
    open_log(&run);

    // B_global = B_micro x N x A sequences per optimizer step (a batch ramp raises A up to it)
    for (int step = run.start_step; step <= run.steps; step++) {
        const bool last = step == run.steps;
        if (stopped_by_signal(&run, step)) break;  // with a checkpoint
        evaluate_and_log(&run, step, last);      // val loss, HellaSwag, samples
        if (last) break;
        // this rank's B_micro sequences of each of the A global micro-batches
        const StepBatch batch = next_step_batch(&run.train_loader, &model, run.ramp.grad_accum_steps(step),
                                                opt.overfit_single_batch, &run.inputs, &run.targets);
        const float lr = learning_rate(&run, step);
        run.watchdog->mark("step " + std::to_string(step + 1) + " (forward, backward, gradient all-reduce, AdamW)");
        if (batch.global_targets == 0) {
            skip_empty_step(&run, step);  // every target masked: nothing to learn, no update
        } else {
            step_timer_start(&run);
            const StepResult result = train_step(&model, batch, lr, run.adamw);
            report_step(&run, step, result, lr, step_timer_ms(&run));  // the step's line, or its skip if not finite
        }
        maybe_checkpoint(&run, step + 1);  // every -n steps and the last
    }
    return end_run(&run);
}

int main(int argc, char** argv) { return llmc::run_main(train, argc, argv); }
#endif
