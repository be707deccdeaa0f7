// train_gpt.cu: GPT-2 training, a single-file training program in the style
// of llm.c. From the top: the model (its parameter table, activations,
// forward, backward, model file), one optimizer step with gradient
// accumulation (accumulate_gradients, train_step: the lesson,
//   B_global = B_micro x N_ranks x A sequences per optimizer step),
// then main: the flags, the model, the data and the training loop. main calls
// the services of llmc/run/ (flags, ranks, data, evaluation, checkpoints,
// logs) with GPT-2's table of functions (GPT2_FAMILY); the kernels are in
// llmc/kernels/, one family per header. Builds with nvcc for GPUs and, through
// the CUDA-on-CPU runtime (cpu_cuda), with g++ for CI.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/step/params.h"
#include "llmc/step/train_step.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/run/flags.h"
#include "llmc/formats/hf_model.h"
#include "llmc/run/mfu.h"
#include "llmc/rand.h"
#include "llmc/run/run_checkpoint.h"
#include "llmc/run/run_model.h"
#include "llmc/run/run.h"

// One line naming the problem, thrown: main prints it as "error: ..." and
// exits 1 (the one error rule, llmc/error.h).
#define FAIL(...) llmc::failf(__VA_ARGS__)

// ----------------------------------------------------------------------------
// Model configuration and parameters

struct GPT2Config {
    int max_seq_len;        // maxT
    int vocab_size;         // V: real tokens
    int padded_vocab_size;  // Vp: V rounded up to a multiple of 128 (rows of wte)
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    bool operator==(const GPT2Config& o) const {
        return max_seq_len == o.max_seq_len && vocab_size == o.vocab_size && padded_vocab_size == o.padded_vocab_size &&
               num_layers == o.num_layers && num_heads == o.num_heads && channels == o.channels;
    }
};

// The parameters: one row per tensor, in llm.c's order (the order of the one
// contiguous buffer and of the model file). Sizes, names, weight decay, the
// per-layer slices of data parallelism and the initialisation all read it.
enum class Dim { Vp, maxT, C, C3, C4, One };  // C3 = 3C, C4 = 4C
enum class Init {
    Normal,    // N(0, 0.02)
    Residual,  // N(0, 0.02 / sqrt(2L)): the two projections that add into the residual stream
    Ones,      // layernorm gains
    Zeros      // biases
};
struct ParameterSpec {
    const char* name;
    bool per_layer;  // one per layer (L of them), each its own slice of the all-reduce
    Dim rows, cols;  // of one layer's tensor
    bool decays;     // AdamW's weight decay: the matrices, embeddings included
    Init init;
    const char* hf_name;  // in transformers' GPT2LMHeadModel (a layer's under h.N.)
    int muon;             // --optimizer muon: a layer's tensor is this many matrices of rows/muon x cols; 0: AdamW
};
// clang-format off
constexpr ParameterSpec PARAMETERS[] = {
    // name    per layer  rows     cols      decays  init            transformers             Muon
    {"wte",      false, Dim::Vp,   Dim::C,   true,  Init::Normal,   "wte.weight",            0},  // (its padded vocabulary rows are 0)
    {"wpe",      false, Dim::maxT, Dim::C,   true,  Init::Normal,   "wpe.weight",            0},
    {"ln1w",     true,  Dim::C,    Dim::One, false, Init::Ones,     "ln_1.weight",           0},
    {"ln1b",     true,  Dim::C,    Dim::One, false, Init::Zeros,    "ln_1.bias",             0},
    {"qkvw",     true,  Dim::C3,   Dim::C,   true,  Init::Normal,   "attn.c_attn.weight",    3},
    {"qkvb",     true,  Dim::C3,   Dim::One, false, Init::Zeros,    "attn.c_attn.bias",      0},
    {"attprojw", true,  Dim::C,    Dim::C,   true,  Init::Residual, "attn.c_proj.weight",    1},
    {"attprojb", true,  Dim::C,    Dim::One, false, Init::Zeros,    "attn.c_proj.bias",      0},
    {"ln2w",     true,  Dim::C,    Dim::One, false, Init::Ones,     "ln_2.weight",           0},
    {"ln2b",     true,  Dim::C,    Dim::One, false, Init::Zeros,    "ln_2.bias",             0},
    {"fcw",      true,  Dim::C4,   Dim::C,   true,  Init::Normal,   "mlp.c_fc.weight",       1},
    {"fcb",      true,  Dim::C4,   Dim::One, false, Init::Zeros,    "mlp.c_fc.bias",         0},
    {"fcprojw",  true,  Dim::C,    Dim::C4,  true,  Init::Residual, "mlp.c_proj.weight",     1},
    {"fcprojb",  true,  Dim::C,    Dim::One, false, Init::Zeros,    "mlp.c_proj.bias",       0},
    {"lnfw",     false, Dim::C,    Dim::One, false, Init::Ones,     "ln_f.weight",           0},
    {"lnfb",     false, Dim::C,    Dim::One, false, Init::Zeros,    "ln_f.bias",             0},
};
// clang-format on
constexpr int NUM_PARAMETER_TENSORS = sizeof(PARAMETERS) / sizeof(PARAMETERS[0]);

// Pointers to the tensors, by name, in the table's order (point_parameters
// fills them as an array: the struct is exactly the table's pointers).
template <class T>
struct ParameterTensors {
    T *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    T *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
};
static_assert(sizeof(ParameterTensors<float>) == NUM_PARAMETER_TENSORS * sizeof(float*), "one pointer per row");

inline size_t dim_size(Dim d, const GPT2Config& c) {
    const size_t C = c.channels;
    switch (d) {
        case Dim::Vp: return c.padded_vocab_size;
        case Dim::maxT: return c.max_seq_len;
        case Dim::C: return C;
        case Dim::C3: return 3 * C;
        case Dim::C4: return 4 * C;
        case Dim::One: return 1;
    }
    return 0;
}
inline size_t parameter_size(int k, const GPT2Config& c) {
    const ParameterSpec& t = PARAMETERS[k];
    return (t.per_layer ? c.num_layers : 1) * dim_size(t.rows, c) * dim_size(t.cols, c);
}
// Every tensor's elements: the size of the parameter buffer.
inline size_t parameter_count(const GPT2Config& c) {
    size_t n = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) n += parameter_size(k, c);
    return n;
}
// The table for a config, as the generic buffers (llmc/step/params.h) lay it out.
inline std::vector<ParameterLayout> parameter_layout(const GPT2Config& c) {
    std::vector<ParameterLayout> rows;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        const ParameterSpec& t = PARAMETERS[k];
        rows.push_back(ParameterLayout{parameter_size(k, c), t.per_layer, t.decays});
        if (t.muon > 0)  // q, k and v are Muon's three C x C matrices of qkvw
            rows.back().muon = {{(int)dim_size(t.rows, c) / t.muon, (int)dim_size(t.cols, c), t.muon}};
    }
    return rows;
}

// ----------------------------------------------------------------------------
// Activations: everything the backward pass reads, allocated once for (B, T).

struct ActivationTensors {
    floatX* encoded;    // (B, T, C)       wte[token] + wpe[pos]
    floatX* ln1;        // (L, B, T, C)
    float* ln1_mean;    // (L, B, T)
    float* ln1_rstd;    // (L, B, T)
    floatX* qkv;        // (L, B, T, 3C)
    floatX* atty;       // (L, B, T, C)    attention output, before its projection
    float* att_lse;     // (L, B, NH, T)   log-sum-exp per query row (flash backward)
    floatX* residual2;  // (L, B, T, C)    after the attention block
    floatX* ln2;        // (L, B, T, C)
    float* ln2_mean;    // (L, B, T)
    float* ln2_rstd;    // (L, B, T)
    floatX* fch;        // (L, B, T, 4C)   MLP pre-activation
    floatX* fch_gelu;   // (L, B, T, 4C)
    floatX* residual3;  // (L, B, T, C)    after the MLP block
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
    floatX* logits;     // (B, T, Vp)      overwritten in place by dloss/dlogits
    float* losses;      // (B, T)          per-token cross-entropy, 0 where masked
    floatX* proj_out;   // (B, T, C)       scratch: attention / MLP projection output
};

// Gradient scratch for one backward pass (activation gradients are transient;
// only weight gradients persist, in the fp32 buffer).
struct BackwardScratch {
    floatX* dresidual;  // (B, T, C)   gradient of the residual stream
    floatX* dwide;      // (B, T, 4C)  dfch / dqkv
    floatX* dnarrow;    // (B, T, C)   dln / datty / dlnf
    float* reduce;      // partial sums of the deterministic two-stage reductions
    int* encoder_plan;  // token-grouped positions for the encoder backward
};

// ----------------------------------------------------------------------------
// The model

// The parameters, their gradients and the optimizer's state are the generic
// buffers of llmc/step/params.h, laid out by the table above, and the micro-batch
// (inputs, staging, documents) is llmc/step/train_step.h's; the rest is GPT-2's.
struct GPT2 : Parameters, MicroBatches {
    GPT2Config config;
    ParameterTensors<floatX> params;  // the tensors of params_memory, by name
    ParameterTensors<float> grads;    // ... and of grads_memory
    // activations for micro-batches of B sequences of T tokens
    int recompute = 0;  // -r: 0 keeps every layer's activations, 1 recomputes GELU, 2 also layernorm outputs,
                        // 3 the whole block from its input
    int gelu_fusion = 0;  // -ge: GELU in cuBLASLt's epilogues, 1 in the forward, 2 also in the backward
    ActivationTensors acts;
    BackwardScratch scratch;
    std::vector<size_t> param_strides, grad_strides;  // bytes per layer of each tensor (layer_view)
    std::vector<size_t> act_strides;    // ... and of each activation
};

// Why a shape cannot be a model here, or "": every field positive, C a
// multiple of NH, Vp >= V, and small enough that every size fits 64 bits, the
// per-layer tables stay small, and the parameters number at most 2^40 (a
// header or descriptor is checked before anything is allocated for it).
static std::string model_shape_problem(const GPT2Config& c) {
    constexpr long MAX_LAYERS = MAX_MODEL_LAYERS, MAX_DIM = MAX_MODEL_DIM;  // (llmc/step/params.h)
    constexpr unsigned __int128 MAX_PARAMETERS = MAX_MODEL_PARAMETERS;
    const struct {
        const char* name;
        long value, max;
    } fields[] = {{"maxT", c.max_seq_len, MAX_DIM}, {"V", c.vocab_size, MAX_DIM}, {"Vp", c.padded_vocab_size, MAX_DIM},
                  {"L", c.num_layers, MAX_LAYERS},  {"NH", c.num_heads, MAX_DIM}, {"C", c.channels, MAX_DIM}};
    for (const auto& f : fields)
        if (f.value <= 0 || f.value > f.max)
            return std::string(f.name) + "=" + std::to_string(f.value) + " is outside 1.." + std::to_string(f.max);
    if (c.channels % c.num_heads != 0)
        return "C=" + std::to_string(c.channels) + " is not a multiple of NH=" + std::to_string(c.num_heads);
    if (c.padded_vocab_size < c.vocab_size)
        return "Vp=" + std::to_string(c.padded_vocab_size) + " is below V=" + std::to_string(c.vocab_size);
    const unsigned __int128 C = c.channels, L = c.num_layers;
    const unsigned __int128 n = (unsigned __int128)c.padded_vocab_size * C + (unsigned __int128)c.max_seq_len * C +
                                L * (12 * C * C + 13 * C) + 2 * C;
    if (n > MAX_PARAMETERS) return "more than 2^40 parameters";
    return "";
}

// Sizes, slices and the ZeRO-1 layout for model->config (nothing allocated).
static void configure_model(GPT2* model) {
    const GPT2Config& c = model->config;
    const std::string problem = model_shape_problem(c);
    if (!problem.empty()) FAIL("model: %s", problem.c_str());
    configure_parameters(model, parameter_layout(c), c.num_layers);
    model->param_strides = parameter_strides(model->tensors, c.num_layers, sizeof(floatX));
    model->grad_strides = parameter_strides(model->tensors, c.num_layers, sizeof(float));
}

// Parameters and optimizer state allocated for model->config, the named
// tensors pointed into them; weights unset.
static void allocate_model(GPT2* model) {
    configure_model(model);
    allocate_parameters(model);
    point_parameters(&model->params, model->params_memory, weight_layout(model));  // ZeRO-3: the staging's
    point_parameters(&model->grads, model->grads_memory, gradient_layout(model));  // ZeRO-2: the staging's
    model->B = model->T = 0;
    cudaCheck(cudaStreamCreate(&model->stream));
    matmul_setup();
}

// Layer l's weights, gradients and activations (layer_view); a tensor kept
// once for all layers (recompute) is the same in every layer's view.
static ParameterTensors<floatX> layer_params(const GPT2* model, int l) {
    return layer_view(model->params, model->param_strides, weight_slot(model, l));  // ZeRO-3: a staging slot
}
static ParameterTensors<float> layer_grads(const GPT2* model, int l) {
    return layer_view(model->grads, model->grad_strides, gradient_slot(model, l));  // ZeRO-2: a staging slot
}
static ActivationTensors layer_acts(const GPT2* model, int l) { return layer_view(model->acts, model->act_strides, l); }

// ---- initialisation from a seed ---------------------------------------------
// Each tensor as its row of PARAMETERS says; the padded vocabulary rows of wte
// are 0. Each element is a counter-based draw (fill_normal, llmc/rand.h), so
// the result does not depend on the order of generation, and
// dev/train_gpt2.py draws identical values.
static std::vector<float> gpt2_initial_weights(const GPT2Config& c, uint64_t seed) {
    size_t sizes[NUM_PARAMETER_TENSORS], total = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) total += sizes[k] = parameter_size(k, c);
    std::vector<float> w(total, 0.0f);
    size_t offset = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        const Init init = PARAMETERS[k].init;
        float* t = w.data() + offset;
        if (init == Init::Ones) std::fill(t, t + sizes[k], 1.0f);
        if (init == Init::Normal || init == Init::Residual) {
            const double std = init == Init::Residual ? 0.02 / sqrt(2.0 * c.num_layers) : 0.02;
            fill_normal(t, sizes[k], std, seed, k);
        }
        offset += sizes[k];
    }
    // wte (the first tensor): its padded vocabulary rows are never real tokens
    std::fill(w.begin() + (size_t)c.vocab_size * c.channels, w.begin() + sizes[0], 0.0f);
    return w;
}

// ---- model descriptors: "d12" .. "d48", or "L=2,C=64,H=4,V=250,maxT=64" -------

// "" and *c when text is a descriptor, else why not. The KEY=VALUE list is
// read as Llama's (llmc::parse_key_values: a repeated key or an empty item is
// refused).
static std::string descriptor_problem(const char* text, GPT2Config* c) {
    const struct {
        const char* name;
        int L, C;
    } gpt2_sizes[] = {{"d12", 12, 768}, {"d24", 24, 1024}, {"d36", 36, 1280}, {"d48", 48, 1600}};
    for (auto& s : gpt2_sizes)
        if (strcmp(text, s.name) == 0) {
            *c = GPT2Config{1024, 50257, padded_vocab_size(50257), s.L, s.C / 64, s.C};
            return "";
        }
    GPT2Config d{1024, 50257, 0, 0, 0, 0};
    std::map<std::string, std::string> kv;
    const std::string problem = llmc::parse_key_values(text, &kv);
    if (!problem.empty()) return problem;
    for (const auto& e : kv) {
        const std::string &key = e.first, &v = e.second;
        char* rest = nullptr;
        const long value = strtol(v.c_str(), &rest, 10);
        if (v.empty() || *rest != '\0' || value <= 0 || value > MAX_MODEL_DIM)
            return key + "=" + v + " is not an integer from 1 to 2^24";
        if (key == "L") d.num_layers = value;
        else if (key == "C") d.channels = value;
        else if (key == "H") d.num_heads = value;
        else if (key == "V") d.vocab_size = value;
        else if (key == "Vp") d.padded_vocab_size = value;
        else if (key == "maxT") d.max_seq_len = value;
        else return "unknown key " + key + "=";
    }
    if (d.num_layers == 0 || d.channels == 0 || d.num_heads == 0) return "L=, C= and H= are needed";
    if (d.padded_vocab_size == 0) d.padded_vocab_size = padded_vocab_size(d.vocab_size);
    if (d.padded_vocab_size < d.vocab_size) return "Vp is below V";
    *c = d;
    return "";
}

static bool parse_descriptor(const char* text, GPT2Config* c) { return descriptor_problem(text, c).empty(); }

static void init_from_descriptor(GPT2* model, const char* descriptor, uint64_t seed) {
    const std::string problem = descriptor_problem(descriptor, &model->config);
    if (!problem.empty())
        FAIL("-e %s: not a checkpoint file or a model descriptor (%s; d12, d24, d36, d48, or e.g. "
             "\"L=2,C=64,H=4,V=250,maxT=64\")",
             descriptor, problem.c_str());
    allocate_model(model);
    set_weights(model, gpt2_initial_weights(model->config, seed));
}

// ---- model files: llm.c's format (llmc/formats/checkpoint.h), or a transformers folder ---
static GPT2Config config_of(const ModelFileHeader& h) {
    return GPT2Config{h.max_seq_len, h.vocab_size, h.padded_vocab_size, h.num_layers, h.num_heads, h.channels};
}

// Opens a model file, reads its header and checks the shape it describes.
static FILE* open_model_file(const char* path, GPT2Config* c, ModelFileHeader* h) {
    FILE* f = model_file_open(path, h);
    *c = config_of(*h);
    const std::string problem = model_shape_problem(*c);
    if (!problem.empty())
        FAIL("%s: not a usable model shape in the header: %s (maxT=%d V=%d Vp=%d L=%d NH=%d C=%d)", path,
             problem.c_str(), c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->num_layers, c->num_heads,
             c->channels);
    return f;
}

// ---- Hugging Face folders (transformers' GPT-2, llmc/formats/hf_model.h) -------------
// config.json (GPT2Config) as the trainer's shape; an option the trainer does
// not compute is refused, naming its key. Vp is V rounded up to 128, as for a
// descriptor.
static GPT2Config hf_config(const std::string& path) {
    const nlohmann::json j = llmc::hf_read_config_json(path);
    const std::string type = j.contains("model_type") ? j["model_type"].dump() : "missing";
    if (type != "\"gpt2\"")
        FAIL("%s: model_type is %.60s, not \"gpt2\"%s", path.c_str(), type.c_str(),
             type == "\"llama\"" ? " (a Llama folder: train_llama3 reads it)" : "");
    GPT2Config c{};
    const struct {
        const char* key;
        int* field;
    } sizes[] = {{"n_layer", &c.num_layers},
                 {"n_head", &c.num_heads},
                 {"n_embd", &c.channels},
                 {"vocab_size", &c.vocab_size},
                 {"n_positions", &c.max_seq_len}};
    for (const auto& f : sizes) {
        *f.field = llmc::hf_json_required_int(j, f.key, path);
        if (*f.field <= 0) FAIL("%s: %s is %d, not > 0", path.c_str(), f.key, *f.field);
    }
    if (c.channels % c.num_heads != 0)
        FAIL("%s: n_embd %d is not a multiple of n_head %d", path.c_str(), c.channels, c.num_heads);
    c.padded_vocab_size = c.vocab_size <= MAX_MODEL_DIM ? padded_vocab_size(c.vocab_size) : c.vocab_size;
    const std::string problem = model_shape_problem(c);
    if (!problem.empty())
        FAIL("%s: not a shape the trainer takes: %s (L = n_layer, NH = n_head, C = n_embd, V = vocab_size, maxT = "
             "n_positions)",
             path.c_str(), problem.c_str());
    // gelu_pytorch_tanh is gelu_new's formula (tanh), computed by another kernel
    const std::string act = llmc::hf_json_string(j, "activation_function", path, "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
        FAIL("%s: activation_function %s is not supported (the trainer's GELU is gelu_new's tanh form)", path.c_str(),
             llmc::quote_for_error(act.substr(0, 40)).c_str());
    bool found;
    const int inner = llmc::hf_json_int(j, "n_inner", path, &found);
    if (found && inner != 4 * c.channels)
        FAIL("%s: n_inner %d is not supported (the trainer's MLP is 4 x n_embd = %d)", path.c_str(), inner,
             4 * c.channels);
    const double eps = llmc::hf_json_number(j, "layer_norm_epsilon", path, 1e-5);
    if (std::fabs(eps - 1e-5) > 1e-12)
        FAIL("%s: layer_norm_epsilon %g is not supported (the trainer's layernorm uses 1e-5)", path.c_str(), eps);
    // reorder_and_upcast_attn is accepted: it computes the same attention in
    // fp32, as the trainer's kernels accumulate it
    const struct {
        const char* key;
        bool value;
    } flags[] = {{"scale_attn_weights", true},
                 {"scale_attn_by_inverse_layer_idx", false},
                 {"tie_word_embeddings", true},
                 {"add_cross_attention", false}};
    for (const auto& f : flags)
        if (llmc::hf_json_bool(j, f.key, path, f.value) != f.value)
            FAIL("%s: %s %s is not supported (only %s)", path.c_str(), f.key, f.value ? "false" : "true",
                 f.value ? "true" : "false");
    return c;
}

// Where each tensor of a transformers folder goes (names under prefix:
// "transformer." as GPT2LMHeadModel saves them, "" in the hub's gpt2 files):
// wte's V rows (the padded rows stay 0), layer l's h.l.* at its slice; a
// layer's matrices are Conv1D's, stored (in, out), placed transposed.
static std::vector<llmc::HfPlacement> hf_tensors(const GPT2Config& c, const std::string& prefix) {
    std::vector<llmc::HfPlacement> out;
    size_t at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        const ParameterSpec& t = PARAMETERS[k];
        const uint64_t rows = dim_size(t.rows, c), cols = dim_size(t.cols, c);
        const bool conv1d = t.per_layer && t.cols != Dim::One;
        std::vector<uint64_t> shape = {t.rows == Dim::Vp ? (uint64_t)c.vocab_size : rows};
        if (t.cols != Dim::One) shape.push_back(cols);
        if (conv1d) std::swap(shape[0], shape[1]);
        for (int l = 0; l < (t.per_layer ? c.num_layers : 1); l++) {
            const std::string layer = t.per_layer ? "h." + std::to_string(l) + "." : "";
            out.push_back({prefix + layer + t.hf_name, shape, at + l * rows * cols, conv1d});
        }
        at += parameter_size(k, c);
    }
    return out;
}

// A transformers GPT-2 folder: config.json, then every tensor's name, shape
// and dtype checked before anything is allocated. Besides the model's
// tensors it may hold the attention mask buffers h.N.attn.bias and
// h.N.attn.masked_bias (ignored) and lm_head.weight, which must be wte (GPT-2
// ties them).
static void init_from_hf_folder(GPT2* model, const char* path) {
    const GPT2Config c = hf_config(std::string(path) + "/config.json");
    llmc::SafetensorsModel folder(path);
    const std::string prefix = folder.find("transformer.wte.weight") ? "transformer." : "";
    std::vector<llmc::HfPlacement> placed = hf_tensors(c, prefix);
    const size_t n = parameter_count(c);
    std::set<std::string> buffers;
    for (int l = 0; l < c.num_layers; l++)
        for (const char* b : {"attn.bias", "attn.masked_bias"})
            buffers.insert(prefix + "h." + std::to_string(l) + "." + b);
    const bool head = folder.find("lm_head.weight") != nullptr;  // read past the parameters, compared with wte
    if (head) placed.push_back({"lm_head.weight", placed[0].shape, n});
    llmc::hf_check_tensors(folder, path, placed, [&](const std::string& name) { return buffers.count(name) > 0; });
    std::vector<float> weights(n + (head ? placed.back().numel() : 0), 0.0f);
    llmc::hf_read_tensors(folder, placed, weights.data());
    if (head && !std::equal(weights.begin() + n, weights.end(), weights.begin()))
        FAIL("%s: lm_head.weight differs from %swte.weight (an untied head; GPT-2 ties them)", path, prefix.c_str());
    weights.resize(n);
    check_weights_representable(weights, path);
    model->config = c;
    allocate_model(model);
    set_weights(model, weights);
}

// The shape -e's model file or folder gives (nothing else read).
static GPT2Config model_file_config(const char* path) {
    if (llmc::hf_is_folder(path)) return hf_config(std::string(path) + "/config.json");
    GPT2Config c;
    ModelFileHeader h;
    fclose(open_model_file(path, &c, &h));
    return c;
}

static void init_from_model_file(GPT2* model, const char* path) {
    if (llmc::hf_is_folder(path)) return init_from_hf_folder(model, path);
    ModelFileHeader h;
    FILE* f = open_model_file(path, &model->config, &h);
    const std::vector<float> weights = read_model_weights(f, path, h, parameter_count(model->config));
    allocate_model(model);
    set_weights(model, weights);
}

// The weights it computes with, under GPT-2's header (write_model_weights).
static std::vector<CheckpointFile> write_model_file(const GPT2* model, const std::vector<floatX>& weights,
                                                    const std::string& path) {
    const GPT2Config& c = model->config;
    return {write_model_weights(
        weights, path,
        ModelFileHeader{0, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size})};
}

// ---- activations ------------------------------------------------------------
// Every device buffer the forward and backward use, as one table.
// Recompute (-r) keeps one layer's copy of a tensor instead of L, and
// recomputes it in the backward: 1 = the GELU output, 2 = also the two
// layernorm outputs, 3 = everything but the block's input (residual3 of the
// layer before, or encoded): the backward of layer l reruns block l's forward
// into the one copy (recompute_layer). The results are bitwise the same (the
// same kernels run on the same stored inputs).
static std::vector<DeviceBuffer> activation_buffers(GPT2* model, int B, int T, int recompute) {
    const GPT2Config& c = model->config;
    const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, Vp = c.padded_vocab_size;
    const size_t X = sizeof(floatX), F = sizeof(float);
    const size_t L_gelu = recompute >= 1 ? 1 : L, L_ln = recompute >= 2 ? 1 : L;  // layers kept
    const size_t L_block = recompute >= 3 ? 1 : L;  // the rest of the block's (residual3 is kept: the next input)
    ActivationTensors& a = model->acts;
    BackwardScratch& s = model->scratch;
    size_t reduce_floats = bias_backward_scratch_floats(4 * C);
    reduce_floats = std::max(reduce_floats, layernorm_backward_scratch_floats(BT, C));
    reduce_floats = std::max(reduce_floats, attention_backward_scratch_floats(B, T, NH));
    reduce_floats = std::max(reduce_floats, global_norm_scratch_floats());
    const char* act = "activations (B x T x C x L)";
    const int Lk = (int)L, Lg = (int)L_gelu, Ll = (int)L_ln, Lb = (int)L_block;
    const size_t Lbk = L_block;
    // clang-format off
    std::vector<DeviceBuffer> rows = {
        {(void**)&a.encoded, BT * C * X, act},               {(void**)&a.ln1, L_ln * BT * C * X, act, Ll},
        {(void**)&a.ln1_mean, Lbk * BT * F, act, Lb},        {(void**)&a.ln1_rstd, Lbk * BT * F, act, Lb},
        {(void**)&a.qkv, Lbk * BT * 3 * C * X, act, Lb},     {(void**)&a.atty, Lbk * BT * C * X, act, Lb},
        {(void**)&a.att_lse, Lbk * BT * NH * F, act, Lb},    {(void**)&a.residual2, Lbk * BT * C * X, act, Lb},
        {(void**)&a.ln2, L_ln * BT * C * X, act, Ll},        {(void**)&a.ln2_mean, Lbk * BT * F, act, Lb},
        {(void**)&a.ln2_rstd, Lbk * BT * F, act, Lb},        {(void**)&a.fch, Lbk * BT * 4 * C * X, act, Lb},
        {(void**)&a.fch_gelu, L_gelu * BT * 4 * C * X, act, Lg}, {(void**)&a.residual3, L * BT * C * X, act, Lk},
        {(void**)&a.lnf, BT * C * X, act},                   {(void**)&a.lnf_mean, BT * F, act},
        {(void**)&a.lnf_rstd, BT * F, act},                  {(void**)&a.proj_out, BT * C * X, act},
        {(void**)&a.logits, BT * Vp * X, "logits (B x T x Vp)"}, {(void**)&a.losses, BT * F, "logits (B x T x Vp)"},
        {(void**)&s.dresidual, BT * C * X, "backward scratch"},  {(void**)&s.dwide, BT * 4 * C * X, "backward scratch"},
        {(void**)&s.dnarrow, BT * C * X, "backward scratch"},    {(void**)&s.reduce, reduce_floats * F, "backward scratch"},
        {(void**)&s.encoder_plan, encoder_backward_plan_ints(B, T) * sizeof(int), "backward scratch"},
    };
    // clang-format on
    for (const DeviceBuffer& b : micro_batch_buffers(model, &model->stats, B, T)) rows.push_back(b);
    return rows;
}

// Activations for micro-batches of (B, T), and pinned staging for A of them.
// Returns false (nothing allocated) when the device is out of memory.
static bool try_allocate_activations(GPT2* model, int B, int T, int max_grad_accum_steps, int recompute) {
    check_sequence_length(model->config.max_seq_len, T);
    const std::vector<DeviceBuffer> rows = activation_buffers(model, B, T, recompute);
    if (!allocate_buffers(rows)) return false;
    model->act_strides = buffer_strides(model->acts, rows);
    model->recompute = recompute;
    allocate_staging(model, B, T, max_grad_accum_steps);
    return true;
}

static void free_activations(GPT2* model) {
    for (const DeviceBuffer& b : activation_buffers(model, model->B, model->T, model->recompute))
        cudaCheck(cudaFree(*b.ptr));
    free_staging(model);
}

static void free_model(GPT2* model) {
    for (const DeviceBuffer& b : parameter_buffers(model)) cudaCheck(cudaFree(*b.ptr));
    if (model->B > 0) free_activations(model);
    cudaCheck(cudaStreamDestroy(model->stream));
}

// ----------------------------------------------------------------------------
// Forward: logits (B, T, Vp) for the tokens in model->inputs.

// Block l from its normed input (ln1, written before) to the MLP's GELU
// output: everything its backward reads. The forward and -r 3's recompute
// both run it, so the recompute is the forward's kernels in its order.
static void block_forward(GPT2* model, int l, const floatX* residual) {
    const GPT2Config& c = model->config;
    const int B = model->B, T = model->T, C = c.channels, NH = c.num_heads, BT = B * T, HS = C / NH;
    const ParameterTensors<floatX> w = layer_params(model, l);
    const ActivationTensors x = layer_acts(model, l);
    floatX* proj_out = model->acts.proj_out;
    cudaStream_t stream = model->stream;
    // attention block: residual2 = residual + proj(attention(ln1(residual)))
    matmul_forward(x.qkv, x.ln1, w.qkvw, w.qkvb, BT, C, 3 * C, stream);
    attention_forward(x.atty, x.att_lse, x.qkv, attention_documents(model), B, T, NH, NH, HS, stream);
    matmul_forward(proj_out, x.atty, w.attprojw, w.attprojb, BT, C, C, stream);
    fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, proj_out, w.ln2w, w.ln2b, BT,
                                     C, stream);
    // MLP block up to its projection: gelu(fc(ln2(residual2)))
    matmul_forward_gelu(x.fch_gelu, x.fch, x.ln2, w.fcw, w.fcb, BT, C, 4 * C, model->gelu_fusion >= 1, stream);
}

// Layer l's weights and activations: layer_params, layer_acts (above;
// under recompute a tensor not kept is one copy all layers share).
static void forward(GPT2* model) {
    const GPT2Config& c = model->config;
    const int B = model->B, T = model->T, C = c.channels, L = c.num_layers;
    const int BT = B * T;
    const ParameterTensors<floatX>& p = model->params;
    ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;

    const int* positions = document_positions(model);
    gather_layer_weights(model, 0);  // ZeRO-3: each layer's weights into its slot, one layer ahead
    encoder_forward(a.encoded, model->inputs, positions, p.wte, p.wpe, B, T, C, stream);
    wait_layer_weights(model, 0);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, BT, C, stream);
    for (int l = 0; l < L; l++) {
        if (l + 1 < L) gather_layer_weights(model, l + 1);  // ZeRO-3: prefetched while layer l computes
        wait_layer_weights(model, l);
        const ParameterTensors<floatX> w = layer_params(model, l);
        const ActivationTensors x = layer_acts(model, l);
        block_forward(model, l, l == 0 ? a.encoded : layer_acts(model, l - 1).residual3);
        // residual3 = residual2 + proj(gelu(...)); the add is fused with the
        // next layernorm (the next layer's ln1, or lnf).
        matmul_forward(a.proj_out, x.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * C, C, stream);
        if (l + 1 < L) {
            const ActivationTensors next = layer_acts(model, l + 1);
            wait_layer_weights(model, l + 1);  // its ln1 runs here, fused
            const ParameterTensors<floatX> next_w = layer_params(model, l + 1);
            fused_residual_layernorm_forward(x.residual3, next.ln1, next.ln1_mean, next.ln1_rstd, x.residual2,
                                             a.proj_out, next_w.ln1w, next_w.ln1b, BT, C, stream);
        } else {
            fused_residual_layernorm_forward(x.residual3, a.lnf, a.lnf_mean, a.lnf_rstd, x.residual2, a.proj_out,
                                             p.lnfw, p.lnfb, BT, C, stream);
        }
    }
    // the LM head shares its weights with the token embedding
    matmul_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, c.padded_vocab_size, stream);
}

// Cross-entropy of the logits against model->targets. Adds
// loss_scale * sum(per-token losses) to stats->loss_sum; with write_dlogits the
// logits become dloss/dlogits, every unmasked token weighted by loss_scale.
static void cross_entropy(GPT2* model, float loss_scale, bool write_dlogits) {
    classifier_loss(model->acts.logits, model->acts.losses, model->targets, loss_scale, model->B * model->T,
                    model->config.vocab_size, model->config.padded_vocab_size, write_dlogits, &model->stats->loss_sum,
                    model->stream);
}

// -r: what layer l's backward reads and the forward did not keep, rerun from
// what it kept: the GELU output (1), also the layernorm outputs from the stored
// residuals (2; the stats are rewritten with equal values), or the whole block
// from its input (3; ln1 as the forward's fused layernorm computed it).
static void recompute_layer(GPT2* model, int l, const floatX* residual) {
    const int BT = model->B * model->T, C = model->config.channels;
    const ParameterTensors<floatX> w = layer_params(model, l);
    const ActivationTensors x = layer_acts(model, l);
    cudaStream_t stream = model->stream;
    if (model->recompute >= 3) {
        layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C, stream);
        block_forward(model, l, residual);
        return;
    }
    if (model->recompute >= 1) gelu_forward(x.fch_gelu, x.fch, (size_t)BT * 4 * C, stream);
    if (model->recompute >= 2) {
        layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, BT, C, stream);
        layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C, stream);
    }
}

// ----------------------------------------------------------------------------
// Backward: adds this micro-batch's weight gradients into the fp32 buffer.
// Needs the dlogits left by cross_entropy and the inputs on the host (to group
// token positions for the atomics-free embedding gradient).

// reduce: the last micro-batch of a step with N > 1 ranks (the only one that communicates)
static void backward(GPT2* model, const int* encoder_plan_host, int num_distinct_tokens, bool reduce) {
    const GPT2Config& c = model->config;
    const int B = model->B, T = model->T, C = c.channels, NH = c.num_heads, L = c.num_layers;
    const int BT = B * T, HS = C / NH;
    const ParameterTensors<floatX>& p = model->params;
    const ParameterTensors<float>& g = model->grads;
    ActivationTensors& a = model->acts;
    BackwardScratch& s = model->scratch;
    cudaStream_t stream = model->stream;
    const int2* docs = attention_documents(model);

    begin_backward_gradients(model);  // ZeRO-2: the staging zeroed once free
    gather_layer_weights(model, L - 1);  // ZeRO-3: again for the backward, while the head's runs
    cudaCheck(cudaMemcpyAsync(s.encoder_plan, encoder_plan_host, encoder_backward_plan_ints(B, T) * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
    // LM head and final layernorm
    matmul_backward(s.dnarrow, g.wte, nullptr, s.reduce, a.logits, a.lnf, p.wte, BT, C, c.padded_vocab_size, stream);
    cudaCheck(cudaMemsetAsync(s.dresidual, 0, (size_t)BT * C * sizeof(floatX), stream));
    layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.reduce, s.dnarrow, layer_acts(model, L - 1).residual3, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C, stream);
    for (int l = L - 1; l >= 0; l--) {
        if (l > 0) gather_layer_weights(model, l - 1);  // ZeRO-3: prefetched while layer l computes
        wait_layer_weights(model, l);
        const ParameterTensors<floatX> w = layer_params(model, l);
        begin_layer_gradients(model, l);  // ZeRO-2: the slot zeroed once free
        const ParameterTensors<float> dw = layer_grads(model, l);
        const ActivationTensors x = layer_acts(model, l);
        const floatX* residual = l == 0 ? a.encoded : layer_acts(model, l - 1).residual3;
        recompute_layer(model, l, residual);
        // MLP block (dresidual is the gradient w.r.t. residual3 here)
        matmul_backward_gelu(s.dwide, dw.fcprojw, dw.fcprojb, s.reduce, s.dresidual, x.fch_gelu, x.fch, w.fcprojw, BT,
                             4 * C, C, model->gelu_fusion >= 2, stream);
        matmul_backward(s.dnarrow, dw.fcw, dw.fcb, s.reduce, s.dwide, x.ln2, w.fcw, BT, C, 4 * C, stream);
        layernorm_backward(s.dresidual, dw.ln2w, dw.ln2b, s.reduce, s.dnarrow, x.residual2, w.ln2w, x.ln2_mean,
                           x.ln2_rstd, BT, C, stream);
        // attention block (dresidual is now the gradient w.r.t. residual2)
        matmul_backward(s.dnarrow, dw.attprojw, dw.attprojb, s.reduce, s.dresidual, x.atty, w.attprojw, BT, C, C,
                        stream);
        attention_backward(s.dwide, s.reduce, s.dnarrow, x.qkv, x.atty, x.att_lse, docs, B, T, NH, NH, HS, stream);
        matmul_backward(s.dnarrow, dw.qkvw, dw.qkvb, s.reduce, s.dwide, x.ln1, w.qkvw, BT, C, 3 * C, stream);
        layernorm_backward(s.dresidual, dw.ln1w, dw.ln1b, s.reduce, s.dnarrow, residual, w.ln1w, x.ln1_mean, x.ln1_rstd,
                           BT, C, stream);
        if (reduce) reduce_layer(model, l);  // layer l's gradients are complete
    }
    const int* position_plan = document_position_plan(model);
    encoder_backward(g.wte, g.wpe, s.dresidual, s.encoder_plan, num_distinct_tokens, position_plan,
                     model->distinct_positions, B, T, C, stream);
    if (reduce) reduce_layer(model, L);  // wte, wpe, lnfw, lnfb and the loss
}

// GPT-2's <|endoftext|> (V - 1) begins every document (the shards put one
// before each document).
static int document_start_token(const GPT2* model) { return model->config.vocab_size - 1; }

// The V real logits of sequence 0 at `position` (the last forward's).
static void read_logits(const GPT2* model, int position, float* logits) {
    read_logits_row(model->acts.logits, position, model->config.vocab_size, model->config.padded_vocab_size, logits);
}

static std::string describe(const GPT2Config& c) {
    char text[160];
    snprintf(text, sizeof text, "L=%d C=%d NH=%d V=%d (padded %d) maxT=%d", c.num_layers, c.channels, c.num_heads,
             c.vocab_size, c.padded_vocab_size, c.max_seq_len);
    return text;
}

// -ge: cuBLASLt's fused GELU pays off from Hopper on (llm.c measured a
// slowdown before), so -1 takes 2 there and 0 before. Returns the line saying so.
static std::string choose_gelu_fusion(GPT2* model, int gelu_fusion, int compute_major) {
    model->gelu_fusion = gelu_fusion >= 0 ? gelu_fusion : (compute_major >= 9 ? 2 : 0);
    const char* fusion_names[] = {"GELU kernels", "GELU in the forward matmul's epilogue",
                                  "GELU in the forward and backward matmuls' epilogues"};
    return "gelu: -ge " + std::to_string(model->gelu_fusion) + ", " + fusion_names[model->gelu_fusion];
}

// ----------------------------------------------------------------------------
// One optimizer step: B_global = B_micro x N x A sequences
//
// This rank's A micro-batches run forward and backward with the weights
// frozen, every backward adding its weight gradients into the one persistent
// fp32 buffer (grads_memory). Each target token's loss is scaled by 1/G, G the
// unmasked targets of the whole global batch (all ranks, all micro-batches),
// so the buffer ends holding the gradient of the big batch's mean loss however
// the batch is split. Nothing is communicated until the last micro-batch's
// backward, which sums the buffer over the ranks layer by layer as each layer
// completes (NCCL all-reduce, or ZeRO-1's reduce-scatter), overlapped with the
// layers still to go. Then one update: global norm, clip, AdamW.
static void accumulate_gradients(GPT2* model, const StepBatch& batch) {
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

static StepResult train_step(GPT2* model, const StepBatch& batch, float lr, const OptimizerSettings& opt) {
    accumulate_gradients(model, batch);
    // the buffer holds d(mean loss)/dW of the global batch: global norm, clip, AdamW (llmc/step/params.h)
    update_parameters(model, model->scratch.reduce, lr, opt);
    return end_step(model, batch);  // the buffer zeroed; the loss and the norm read (the one host sync)
}

// ----------------------------------------------------------------------------
// GPT-2 for the run's services (llmc/run/family.h): --help's texts and the
// functions above.
static ModelFamily<GPT2, GPT2Config> gpt2_family() {
    ModelFamily<GPT2, GPT2Config> f{};
    f.name = "GPT-2";
    f.init_default = "d12";
    f.init_help = "model file .bin (llm.c format, version 3 or 5), a transformers GPT-2 folder\n(config.json + "
                  "model.safetensors or shards), or a model descriptor:\nd12, d24, d36, d48, or e.g. "
                  "\"L=2,C=64,H=4,V=250,maxT=64\" (a file named\nlike a descriptor is given with a '/': ./d12)";
    f.doc_token_help = "the token that starts a document (--packing slots, --doc-mask, --doc-positions,\nsamples); "
                       "-1: the built-in corpus's EOT, else V-1 (GPT-2's <|endoftext|>)";
    f.recompute_help =
        "recompute in the backward: 1 = GELU, 2 = GELU and layernorm,\n3 = the whole block from its input";
    f.builtin_init = "L=2,C=64,H=4,V=256,maxT=64";
    f.model_folder_files = {};  // a checkpoint's model: llm.c's one file model_%08d.bin
    f.forward = forward;
    f.cross_entropy = cross_entropy;
    f.accumulate_gradients = accumulate_gradients;
    f.parse_descriptor = parse_descriptor;
    f.model_file_config = model_file_config;
    f.same_config = [](const GPT2Config& a, const GPT2Config& b) { return a == b; };
    f.describe = describe;
    f.configure_model = configure_model;
    f.vocab_size = [](const GPT2* m) { return m->config.vocab_size; };
    f.max_seq_len = [](const GPT2* m) { return m->config.max_seq_len; };
    f.document_start_token = document_start_token;
    f.flops_per_token = [](const GPT2* m, int T) {
        return flops_per_token(m->num_parameters, m->config.num_layers, m->config.channels, T);
    };
    f.init_from_descriptor = init_from_descriptor;
    f.init_from_model_file = init_from_model_file;
    f.write_model_file = write_model_file;
    f.activation_buffers = activation_buffers;
    f.try_allocate_activations = try_allocate_activations;
    f.free_activations = free_activations;
    f.free_model = free_model;
    f.device_losses = [](const GPT2* m) -> const float* { return m->acts.losses; };
    f.read_logits = read_logits;
    return f;
}
static const ModelFamily<GPT2, GPT2Config> GPT2_FAMILY = gpt2_family();

// The run's flags (llmc/run/run.h), and GPT-2's -ge after -r.
struct GPT2Options : TrainOptions {
    int gelu_fusion;  // -1: by the device's compute capability
};
static std::vector<Flag<GPT2Options>> gpt2_flags() {
    std::vector<Flag<GPT2Options>> flags = run_flags<GPT2Options>(GPT2_FAMILY);
    auto r = std::find_if(flags.begin(), flags.end(), [](const Flag<GPT2Options>& f) { return !strcmp(f.name, "-r"); });
    flags.insert(r + 1, {"-ge", &GPT2Options::gelu_fusion, nullptr, -1, 2, "-1",
                         "GELU in cuBLASLt's matmul epilogues: 1 = forward, 2 = forward and backward;\n-1: 2 on "
                         "compute capability 9.0 and newer, 0 before",
                         nullptr});
    return flags;
}

// ----------------------------------------------------------------------------
// main: the flags, the model, the data, then the training loop.
#ifndef TESTING
static int train(int argc, char** argv) {
    Run<GPT2, GPT2Config> run(&GPT2_FAMILY);  // what the run holds (llmc/run/run.h)
    GPT2& model = run.model;
    GPT2Options opt;
    start_run(&run, &argc, &argv, gpt2_flags(), &opt);  // MPI, the watchdog, the flags every rank agrees on
    if (opt.memory_plan_only) {
        print_plan_only(&run);
        return end_run(&run);
    }
    build_model(&run);  // the newest complete checkpoint of -o (-y 1), else -e; -b auto chooses B
    open_data(&run);    // the loaders, B_global = B_micro x N x A; the steps
    print_run(&run);
    const std::string gelu = choose_gelu_fusion(&model, opt.gelu_fusion, run.compute_major);  // (every rank)
    print0("%s\n", gelu.c_str());
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

// Whatever is thrown (llmc::Error, FAIL's) ends the run with one error line
// (and, under mpirun, the exit aborts the other ranks), never with an abort.
int main(int argc, char** argv) { return llmc::run_main(train, argc, argv); }
#endif
