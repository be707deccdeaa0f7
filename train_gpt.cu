// train_gpt.cu: GPT-2 training. The model (its parameter table, activations,
// forward, backward) and main. What every model family shares is in llmc/:
// the parameters and the optimizer (llmc/params.h) and the step with gradient
// accumulation (llmc/train_step.h, the place to start:
//   B_global = B_micro x N_ranks x A sequences per optimizer step).
// Kernels live in llmc/, one family per header. Builds with nvcc for GPUs and,
// through the CUDA-on-CPU runtime (cpu_cuda), with g++ for CI.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/cuda_common.h"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/params.h"
#include "llmc/train_step.h"
#include "llmc/schedulers.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/distributed.h"
#include "llmc/flags.h"
#include "llmc/hellaswag.h"
#include "llmc/markov_corpus.h"
#include "llmc/mfu.h"
#include "llmc/rand.h"
#include "llmc/run_control.h"
#include "llmc/run_log.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

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
};
constexpr ParameterSpec PARAMETERS[] = {
    // name    per layer  rows     cols      decays  init
    {"wte",      false, Dim::Vp,   Dim::C,   true,  Init::Normal},  // (its padded vocabulary rows are 0)
    {"wpe",      false, Dim::maxT, Dim::C,   true,  Init::Normal},
    {"ln1w",     true,  Dim::C,    Dim::One, false, Init::Ones},
    {"ln1b",     true,  Dim::C,    Dim::One, false, Init::Zeros},
    {"qkvw",     true,  Dim::C3,   Dim::C,   true,  Init::Normal},
    {"qkvb",     true,  Dim::C3,   Dim::One, false, Init::Zeros},
    {"attprojw", true,  Dim::C,    Dim::C,   true,  Init::Residual},
    {"attprojb", true,  Dim::C,    Dim::One, false, Init::Zeros},
    {"ln2w",     true,  Dim::C,    Dim::One, false, Init::Ones},
    {"ln2b",     true,  Dim::C,    Dim::One, false, Init::Zeros},
    {"fcw",      true,  Dim::C4,   Dim::C,   true,  Init::Normal},
    {"fcb",      true,  Dim::C4,   Dim::One, false, Init::Zeros},
    {"fcprojw",  true,  Dim::C,    Dim::C4,  true,  Init::Residual},
    {"fcprojb",  true,  Dim::C,    Dim::One, false, Init::Zeros},
    {"lnfw",     false, Dim::C,    Dim::One, false, Init::Ones},
    {"lnfb",     false, Dim::C,    Dim::One, false, Init::Zeros},
};
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
// The table for a config, as the generic buffers (llmc/params.h) lay it out.
inline std::vector<ParameterLayout> parameter_layout(const GPT2Config& c) {
    std::vector<ParameterLayout> rows;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++)
        rows.push_back(ParameterLayout{parameter_size(k, c), PARAMETERS[k].per_layer, PARAMETERS[k].decays});
    return rows;
}

// Points each named tensor into one contiguous buffer.
template <class T>
void point_parameters(ParameterTensors<T>* p, T* base, const std::vector<ParameterLayout>& rows) {
    T** tensors = reinterpret_cast<T**>(p);
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        tensors[k] = base;
        base += rows[k].size;
    }
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
// buffers of llmc/params.h, laid out by the table above, and the micro-batch
// (inputs, staging, documents) is llmc/train_step.h's; the rest is GPT-2's.
struct GPT2 : Parameters, MicroBatches {
    GPT2Config config;
    ParameterTensors<floatX> params;  // the tensors of params_memory, by name
    ParameterTensors<float> grads;    // ... and of grads_memory
    // activations for micro-batches of B sequences of T tokens
    int recompute = 0;  // -r: 0 keeps every layer's activations, 1 recomputes GELU, 2 also layernorm outputs
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
    constexpr long MAX_LAYERS = 4096, MAX_DIM = 1 << 24;
    constexpr unsigned __int128 MAX_PARAMETERS = (unsigned __int128)1 << 40;
    const struct { const char* name; long value, max; } fields[] = {
        {"maxT", c.max_seq_len, MAX_DIM}, {"V", c.vocab_size, MAX_DIM}, {"Vp", c.padded_vocab_size, MAX_DIM},
        {"L", c.num_layers, MAX_LAYERS}, {"NH", c.num_heads, MAX_DIM}, {"C", c.channels, MAX_DIM}};
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
static void gpt2_configure(GPT2* model) {
    const GPT2Config& c = model->config;
    const std::string problem = model_shape_problem(c);
    if (!problem.empty()) FAIL("model: %s", problem.c_str());
    configure_parameters(model, parameter_layout(c), c.num_layers);
    model->param_strides = parameter_strides(model->tensors, c.num_layers, sizeof(floatX));
    model->grad_strides = parameter_strides(model->tensors, c.num_layers, sizeof(float));
}

// Allocates parameters and optimizer state for model->config (weights unset).
static void gpt2_allocate_parameters(GPT2* model) {
    gpt2_configure(model);
    allocate_parameters(model);
    point_parameters(&model->params, model->params_memory, model->tensors);
    point_parameters(&model->grads, model->grads_memory, model->tensors);
    model->B = model->T = 0;
    cudaCheck(cudaStreamCreate(&model->stream));
    matmul_setup();
}

// ---- initialisation from a seed ---------------------------------------------
// Each tensor as its row of PARAMETERS says; the padded vocabulary rows of wte
// are 0. Each element is a counter-based draw (splitmix64 hashes of (seed,
// tensor, index) through Box-Muller), so the result does not depend on the
// order of generation, and dev/train_gpt2.py draws identical values.
static inline double normal_draw(uint64_t stream_key, uint64_t i) {
    const uint64_t h1 = splitmix64(stream_key + 2 * i), h2 = splitmix64(stream_key + 2 * i + 1);
    const double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = (double)(h2 >> 11) * 0x1.0p-53;        // [0, 1)
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

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
            const uint64_t key = splitmix64(seed * 16 + k);
            for (size_t i = 0; i < sizes[k]; i++) t[i] = (float)(std * normal_draw(key, i));
        }
        offset += sizes[k];
    }
    // wte (the first tensor): its padded vocabulary rows are never real tokens
    std::fill(w.begin() + (size_t)c.vocab_size * c.channels, w.begin() + sizes[0], 0.0f);
    return w;
}

// ---- model descriptors: "d12" .. "d48", or "L=2,C=64,H=4,V=250,maxT=64" -------
static int round_up_vocab(int V) { return CEIL_DIV(V, 128) * 128; }

static bool parse_descriptor(const char* text, GPT2Config* c) {
    const struct { const char* name; int L, C; } gpt2_sizes[] = {
        {"d12", 12, 768}, {"d24", 24, 1024}, {"d36", 36, 1280}, {"d48", 48, 1600}};
    for (auto& s : gpt2_sizes)
        if (strcmp(text, s.name) == 0) {
            *c = GPT2Config{1024, 50257, 50304, s.L, s.C / 64, s.C};
            return true;
        }
    GPT2Config d{1024, 50257, 0, 0, 0, 0};
    std::string spec = text;
    size_t pos = 0;
    while (pos < spec.size()) {
        size_t end = spec.find(',', pos);
        if (end == std::string::npos) end = spec.size();
        std::string item = spec.substr(pos, end - pos);
        size_t eq = item.find('=');
        if (eq == std::string::npos) return false;
        std::string key = item.substr(0, eq);
        char* rest = nullptr;
        long value = strtol(item.c_str() + eq + 1, &rest, 10);
        if (*rest != '\0' || value <= 0 || value > (1 << 24)) return false;
        if (key == "L") d.num_layers = value;
        else if (key == "C") d.channels = value;
        else if (key == "H") d.num_heads = value;
        else if (key == "V") d.vocab_size = value;
        else if (key == "Vp") d.padded_vocab_size = value;
        else if (key == "maxT") d.max_seq_len = value;
        else return false;
        pos = end + 1;
    }
    if (d.num_layers == 0 || d.channels == 0 || d.num_heads == 0) return false;
    if (d.padded_vocab_size == 0) d.padded_vocab_size = round_up_vocab(d.vocab_size);
    if (d.padded_vocab_size < d.vocab_size) return false;
    *c = d;
    return true;
}

static void gpt2_init_from_descriptor(GPT2* model, const char* descriptor, uint64_t seed) {
    if (!parse_descriptor(descriptor, &model->config))
        FAIL("-e %s: not a checkpoint file or a model descriptor (d12, d24, d36, d48, or e.g. "
             "\"L=2,C=64,H=4,V=250,maxT=64\")", descriptor);
    gpt2_allocate_parameters(model);
    set_weights(model, gpt2_initial_weights(model->config, seed));
}

// ---- model files (llm.c's format, llmc/checkpoint.h) --------------------------
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

// A weight the build's floatX cannot hold (an fp32 file's weight beyond
// bf16's range, or Inf or NaN) would make the first step or checkpoint fail,
// every step since the last one lost: refused at load time instead.
static void check_weights_representable(const std::vector<float>& weights, const char* path) {
    for (size_t i = 0; i < weights.size(); i++) {
        if (std::isfinite(to_float(from_float<floatX>(weights[i])))) continue;
        if (std::isfinite(weights[i]))
            FAIL("%s: weight %zu is %.9g, beyond %s's range (this build computes with %s weights)", path, i,
                 weights[i], PRECISION_NAME, PRECISION_NAME);
        FAIL("%s: weight %zu is %f, not finite", path, i, weights[i]);
    }
}

static void gpt2_init_from_checkpoint(GPT2* model, const char* path) {
    ModelFileHeader h;
    FILE* f = open_model_file(path, &model->config, &h);
    size_t n = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) n += parameter_size(k, model->config);
    const std::vector<float> weights = model_file_read_weights(f, path, h, n);
    check_weights_representable(weights, path);
    gpt2_allocate_parameters(model);
    set_weights(model, weights);
}

template <class T>
static bool all_finite(const std::vector<T>& values) {
    for (const T& x : values)
        if (!std::isfinite(to_float(x))) return false;
    return true;
}

// Writes the weights the model computes with (version 5 = bf16, or 3 in the
// fp32 build; the fp32 master weights go to the state files) through a
// temporary file, fsync and rename: an existing file is never half overwritten.
// A model whose weights are not all finite (a bf16 rounding can overflow to
// Inf) is refused: the error names it and nothing is written. Returns the
// file's name, size and hash.
static CheckpointFile gpt2_write_model_file(const GPT2* model, const std::string& path) {
    std::vector<floatX> weights(model->num_parameters);
    cudaCheck(cudaMemcpy(weights.data(), model->params_memory, weights.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    if (!all_finite(weights)) FAIL("%s: the model's weights hold Inf or NaN; not written", path.c_str());
    const GPT2Config& c = model->config;
    const ModelFileHeader h{sizeof(floatX) == 2 ? MODEL_VERSION_BF16 : MODEL_VERSION_FP32, c.max_seq_len,
                            c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size};
    return model_file_write(path, h, weights.data(), weights.size());
}

// ---- activations ------------------------------------------------------------
// Every device buffer the forward and backward use, as one table.
// Recompute (-r) keeps one layer's copy of a tensor instead of L, and
// recomputes it in the backward: 1 = the GELU output, 2 = also the two
// layernorm outputs. The results are bitwise the same (the same kernels run
// on the same stored inputs).
static std::vector<DeviceBuffer> activation_buffers(GPT2* model, int B, int T, int recompute) {
    const GPT2Config& c = model->config;
    const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, Vp = c.padded_vocab_size;
    const size_t X = sizeof(floatX), F = sizeof(float);
    const size_t L_gelu = recompute >= 1 ? 1 : L, L_ln = recompute >= 2 ? 1 : L;  // layers kept
    ActivationTensors& a = model->acts;
    BackwardScratch& s = model->scratch;
    size_t reduce_floats = bias_backward_scratch_floats(4 * C);
    reduce_floats = std::max(reduce_floats, layernorm_backward_scratch_floats(BT, C));
    reduce_floats = std::max(reduce_floats, attention_backward_scratch_floats(B, T, NH));
    reduce_floats = std::max(reduce_floats, global_norm_scratch_floats());
    const char* act = "activations (B x T x C x L)";
    const int Lk = (int)L, Lg = (int)L_gelu, Ll = (int)L_ln;
    std::vector<DeviceBuffer> rows = {
        {(void**)&a.encoded, BT * C * X, act},               {(void**)&a.ln1, L_ln * BT * C * X, act, Ll},
        {(void**)&a.ln1_mean, L * BT * F, act, Lk},          {(void**)&a.ln1_rstd, L * BT * F, act, Lk},
        {(void**)&a.qkv, L * BT * 3 * C * X, act, Lk},       {(void**)&a.atty, L * BT * C * X, act, Lk},
        {(void**)&a.att_lse, L * BT * NH * F, act, Lk},      {(void**)&a.residual2, L * BT * C * X, act, Lk},
        {(void**)&a.ln2, L_ln * BT * C * X, act, Ll},        {(void**)&a.ln2_mean, L * BT * F, act, Lk},
        {(void**)&a.ln2_rstd, L * BT * F, act, Lk},          {(void**)&a.fch, L * BT * 4 * C * X, act, Lk},
        {(void**)&a.fch_gelu, L_gelu * BT * 4 * C * X, act, Lg}, {(void**)&a.residual3, L * BT * C * X, act, Lk},
        {(void**)&a.lnf, BT * C * X, act},                   {(void**)&a.lnf_mean, BT * F, act},
        {(void**)&a.lnf_rstd, BT * F, act},                  {(void**)&a.proj_out, BT * C * X, act},
        {(void**)&a.logits, BT * Vp * X, "logits (B x T x Vp)"}, {(void**)&a.losses, BT * F, "logits (B x T x Vp)"},
        {(void**)&s.dresidual, BT * C * X, "backward scratch"},  {(void**)&s.dwide, BT * 4 * C * X, "backward scratch"},
        {(void**)&s.dnarrow, BT * C * X, "backward scratch"},    {(void**)&s.reduce, reduce_floats * F, "backward scratch"},
        {(void**)&s.encoder_plan, encoder_backward_plan_ints(B, T) * sizeof(int), "backward scratch"},
    };
    for (const DeviceBuffer& b : micro_batch_buffers(model, &model->stats, B, T)) rows.push_back(b);
    return rows;
}

// Activations for micro-batches of (B, T), and pinned staging for A of them.
// Returns false (nothing allocated) when the device is out of memory.
static bool gpt2_try_allocate_activations(GPT2* model, int B, int T, int max_grad_accum_steps, int recompute) {
    const GPT2Config& c = model->config;
    if (T > c.max_seq_len) FAIL("-t %d exceeds the model's maximum sequence length %d", T, c.max_seq_len);
    const std::vector<DeviceBuffer> rows = activation_buffers(model, B, T, recompute);
    if (!allocate_buffers(rows)) return false;
    model->act_strides = buffer_strides(model->acts, rows);
    model->recompute = recompute;
    allocate_staging(model, B, T, max_grad_accum_steps);
    return true;
}

static void gpt2_allocate_activations(GPT2* model, int B, int T, int max_grad_accum_steps, int recompute = 0) {
    if (!gpt2_try_allocate_activations(model, B, T, max_grad_accum_steps, recompute))
        FAIL("out of device memory for the activations of B=%d, T=%d (%.1f MiB); try a smaller -b, -r 1 or 2, "
             "or -b auto", B, T, total_bytes(activation_buffers(model, B, T, recompute)) / 1048576.0);
}

static void gpt2_free_activations(GPT2* model) {
    for (const DeviceBuffer& b : activation_buffers(model, model->B, model->T, model->recompute))
        cudaCheck(cudaFree(*b.ptr));
    free_staging(model);
}

// ----------------------------------------------------------------------------
// Forward: logits (B, T, Vp) for the tokens in model->inputs.

// Layer l's weights and activations (layer_view): under recompute the
// layernorm and GELU outputs are one copy that every layer shares.
static ParameterTensors<floatX> layer_params(const GPT2* model, int l) {
    return layer_view(model->params, model->param_strides, l);
}
static ParameterTensors<float> layer_grads(const GPT2* model, int l) {
    return layer_view(model->grads, model->grad_strides, l);
}
static ActivationTensors layer_acts(const GPT2* model, int l) { return layer_view(model->acts, model->act_strides, l); }

static void forward(GPT2* model) {
    const GPT2Config& c = model->config;
    const int B = model->B, T = model->T, C = c.channels, NH = c.num_heads, L = c.num_layers;
    const int BT = B * T, HS = C / NH;
    const ParameterTensors<floatX>& p = model->params;
    ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;

    const int2* docs = model->doc_mask ? reinterpret_cast<const int2*>(model->documents) : nullptr;
    const int* positions = model->doc_positions ? model->documents + 2 * (size_t)BT : nullptr;
    encoder_forward(a.encoded, model->inputs, positions, p.wte, p.wpe, B, T, C, stream);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, BT, C, stream);
    for (int l = 0; l < L; l++) {
        const ParameterTensors<floatX> w = layer_params(model, l);
        const ActivationTensors x = layer_acts(model, l);
        const floatX* residual = l == 0 ? a.encoded : layer_acts(model, l - 1).residual3;
        // attention block: residual2 = residual + proj(attention(ln1(residual)))
        matmul_forward(x.qkv, x.ln1, w.qkvw, w.qkvb, BT, C, 3 * C, stream);
        attention_forward(x.atty, x.att_lse, x.qkv, docs, B, T, NH, HS, stream);
        matmul_forward(a.proj_out, x.atty, w.attprojw, w.attprojb, BT, C, C, stream);
        fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, a.proj_out, w.ln2w,
                                         w.ln2b, BT, C, stream);
        // MLP block: residual3 = residual2 + proj(gelu(fc(ln2(residual2)))); the
        // add is fused with the next layernorm (the next layer's ln1, or lnf).
        matmul_forward_gelu(x.fch_gelu, x.fch, x.ln2, w.fcw, w.fcb, BT, C, 4 * C, model->gelu_fusion >= 1, stream);
        matmul_forward(a.proj_out, x.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * C, C, stream);
        if (l + 1 < L) {
            const ActivationTensors next = layer_acts(model, l + 1);
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
    const int BT = model->B * model->T;
    fused_classifier(model->acts.logits, model->acts.losses, model->targets, loss_scale, BT,
                     model->config.vocab_size, model->config.padded_vocab_size, write_dlogits, model->stream);
    accumulate_loss(&model->stats->loss_sum, model->acts.losses, BT, loss_scale, model->stream);
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
    const int2* docs = model->doc_mask ? reinterpret_cast<const int2*>(model->documents) : nullptr;

    cudaCheck(cudaMemcpyAsync(s.encoder_plan, encoder_plan_host, encoder_backward_plan_ints(B, T) * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
    // LM head and final layernorm
    matmul_backward(s.dnarrow, g.wte, nullptr, s.reduce, a.logits, a.lnf, p.wte, BT, C, c.padded_vocab_size, stream);
    cudaCheck(cudaMemsetAsync(s.dresidual, 0, (size_t)BT * C * sizeof(floatX), stream));
    layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.reduce, s.dnarrow, layer_acts(model, L - 1).residual3, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C, stream);
    for (int l = L - 1; l >= 0; l--) {
        const ParameterTensors<floatX> w = layer_params(model, l);
        const ParameterTensors<float> dw = layer_grads(model, l);
        const ActivationTensors x = layer_acts(model, l);
        const floatX* residual = l == 0 ? a.encoded : layer_acts(model, l - 1).residual3;
        if (model->recompute >= 1) gelu_forward(x.fch_gelu, x.fch, (size_t)BT * 4 * C, stream);
        if (model->recompute >= 2) {  // from the stored residuals (the stats are rewritten with equal values)
            layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, BT, C, stream);
            layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C, stream);
        }
        // MLP block (dresidual is the gradient w.r.t. residual3 here)
        matmul_backward_gelu(s.dwide, dw.fcprojw, dw.fcprojb, s.reduce, s.dresidual, x.fch_gelu, x.fch, w.fcprojw, BT,
                             4 * C, C, model->gelu_fusion >= 2, stream);
        matmul_backward(s.dnarrow, dw.fcw, dw.fcb, s.reduce, s.dwide, x.ln2, w.fcw, BT, C, 4 * C, stream);
        layernorm_backward(s.dresidual, dw.ln2w, dw.ln2b, s.reduce, s.dnarrow, x.residual2, w.ln2w, x.ln2_mean,
                           x.ln2_rstd, BT, C, stream);
        // attention block (dresidual is now the gradient w.r.t. residual2)
        matmul_backward(s.dnarrow, dw.attprojw, dw.attprojb, s.reduce, s.dresidual, x.atty, w.attprojw, BT, C, C,
                        stream);
        attention_backward(s.dwide, s.reduce, s.dnarrow, x.qkv, x.atty, x.att_lse, docs, B, T, NH, HS, stream);
        matmul_backward(s.dnarrow, dw.qkvw, dw.qkvb, s.reduce, s.dwide, x.ln1, w.qkvw, BT, C, 3 * C, stream);
        layernorm_backward(s.dresidual, dw.ln1w, dw.ln1b, s.reduce, s.dnarrow, residual, w.ln1w, x.ln1_mean,
                           x.ln1_rstd, BT, C, stream);
        if (reduce) reduce_layer(model, l);  // layer l's gradients are complete
    }
    const int* position_plan = model->doc_positions ? model->documents + 3 * (size_t)BT : nullptr;
    encoder_backward(g.wte, g.wpe, s.dresidual, s.encoder_plan, num_distinct_tokens, position_plan,
                     model->distinct_positions, B, T, C, stream);
    if (reduce) reduce_layer(model, L);  // wte, wpe, lnfw, lnfb and the loss
}

// The rest of what llmc/train_step.h asks of a family.
static float* reduce_scratch(GPT2* model) { return model->scratch.reduce; }
// GPT-2's <|endoftext|> (V - 1) begins every document.
static int document_start_token(const GPT2* model) { return model->config.vocab_size - 1; }

static void gpt2_free(GPT2* model) {
    for (const DeviceBuffer& b : parameter_buffers(model)) cudaCheck(cudaFree(*b.ptr));
    if (model->B > 0) gpt2_free_activations(model);
    cudaCheck(cudaStreamDestroy(model->stream));
}

// ----------------------------------------------------------------------------
// Checkpoints: model_%08d.bin (rank 0), state_%08d_%05d.bin (every rank: its
// master weights, m and v, and where the data stream stands), then DONE_%08d
// once every rank's files are durable (llmc/checkpoint.h). Resuming from one
// continues bitwise as if the run had never stopped: everything else a step
// depends on (learning rate, batch size of a ramp, stochastic-rounding seeds,
// the sampling seed) is a function of the step number.

// The trainer's part of a state file (its "extra" blob).
struct ResumeInfo {
    uint32_t magic;                // RESUME_MAGIC
    int32_t adam_step;
    DataLoaderPosition train_data; // the next train sequence
    double initial_val_gap;        // for the built-in corpus's progress line
};
constexpr uint32_t RESUME_MAGIC = 0x47505452;  // "RTPG"


static std::vector<float> device_to_host(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// Every rank calls it. Refuses (one error line, nothing written) when any
// weight or moment is not finite, or when the folder's lock may no longer keep
// another trainer out, so earlier checkpoints stay the newest. A DONE of this
// step from before (a resume that fell back past it) goes first: it must never
// vouch for files being rewritten. The new DONE lists every file's size and
// hash, and the run id, the owner; only the owner's checkpoints older than its
// newest -nk proven ones are pruned.
static void save_checkpoint(GPT2* model, CheckpointFolder* folder, int step, const ResumeInfo& info) {
    const Distributed* d = model->dist;
    const std::string& dir = folder->dir;
    const size_t local = model->optimizer_elements;
    const std::vector<float> m = device_to_host(model->adam_m, local), v = device_to_host(model->adam_v, local);
    const std::vector<float> master = device_to_host(model->master_weights, local);
    if (!all_finite(m) || !all_finite(v) || !all_finite(master))
        FAIL("step %d: the optimizer state holds Inf or NaN; no checkpoint written (the earlier ones are kept)", step);
    CheckpointFile model_file;
    if (d->rank == 0) {
        checkpoint_check_lock(&folder->lock);
        if (unlink(checkpoint_done_path(dir, step).c_str()) == 0) fsync_directory(dir);
        try {
            model_file = gpt2_write_model_file(model, checkpoint_model_path(dir, step));
        } catch (const llmc::Error& e) {
            FAIL("step %d: %s (the earlier checkpoints are kept)", step, e.what());
        }
    }
    host_barrier(d);  // no stale DONE of this step is left
    const TrainingStateHeader h{d->num_processes, d->rank, 0, step, model->zero_stage, local, model->num_parameters,
                                sizeof(ResumeInfo)};
    const CheckpointFile state_file =
        state_write(checkpoint_state_path(dir, step, d->rank), h, m.data(), v.data(), master.data(), &info);
    const uint64_t mine[2] = {state_file.bytes, state_file.xxh64};
    const std::vector<uint64_t> states = host_all_gather(mine, 2, d);  // also: every rank's file is durable
    if (d->rank == 0) {
        DoneRecord done{folder->run_id, {model_file}};
        for (int r = 0; r < d->num_processes; r++) {
            const std::string path = checkpoint_state_path(dir, step, r);
            done.files.push_back(CheckpointFile{path.substr(dir.size() + 1), states[2 * r], states[2 * r + 1]});
        }
        checkpoint_write_done(dir, step, done);
        folder->proven.push_back(step);
        checkpoint_prune(dir, folder->keep_last, folder->run_id, folder->proven);
    }
}

// Why this rank cannot trust checkpoint `step` of dir ("" when it can): its DONE
// must list the model and every rank's state file, and the model and this
// rank's state must match the sizes and hashes it lists.
static std::string checkpoint_problem(const std::string& dir, int step, const Distributed* d, DoneRecord* done) {
    std::string problem;
    if (!checkpoint_read_done(dir, step, done, &problem)) return problem;
    if (checkpoint_done_ranks(*done) > 0 && checkpoint_done_ranks(*done) != d->num_processes)
        FAIL("-y 1: checkpoint %d of %s was saved with %d processes, this run has %d (resume with as many)", step,
             dir.c_str(), checkpoint_done_ranks(*done), d->num_processes);
    if (!checkpoint_done_covers(*done, step, d->num_processes, &problem)) {
        const std::string state = checkpoint_state_path(dir, step, d->rank);
        if (state_file_is_llmc(state))
            problem += "; " + state + " is llm.c's state, which this trainer does not resume (start from its model "
                       "with -e " + checkpoint_model_path(dir, step) + ")";
        return problem;
    }
    const std::string mine[] = {checkpoint_model_path(dir, step), checkpoint_state_path(dir, step, d->rank)};
    DoneRecord check{done->run_id, {}};
    for (const CheckpointFile& f : done->files)
        for (const std::string& path : mine)
            if (path == dir + "/" + f.name) check.files.push_back(f);
    checkpoint_verify_files(dir, check, &problem);
    return problem;
}

// The newest checkpoint of dir that every rank can trust (checkpoint_problem);
// one that is not is skipped with a warning line, falling back to the one
// before. -1: there is no DONE at all. All ranks take the same step (rank 0's
// list, checks agreed).
static int choose_resume_step(const std::string& dir, const Distributed* d, std::string* run_id) {
    const std::vector<int> steps = d->rank == 0 ? checkpoint_complete_steps(dir) : std::vector<int>();
    const int count = (int)host_sum(steps.size(), d);
    std::vector<std::string> skipped;  // printed once a checkpoint is chosen
    for (int i = 0; i < count; i++) {
        const int step = (int)host_sum(d->rank == 0 ? steps[i] : 0, d);
        DoneRecord done;
        const std::string problem = checkpoint_problem(dir, step, d, &done);
        if (host_sum(problem.empty() ? 0 : 1, d) == 0) {
            for (const std::string& w : skipped) fprintf(stderr, "warning: %s; falling back\n", w.c_str());
            *run_id = done.run_id;
            return step;
        }
        // (each rank reports what it found itself)
        if (!problem.empty()) skipped.push_back("checkpoint " + std::to_string(step) + " not used: " + problem);
    }
    // one error line, not the warnings too: nothing is resumed
    if (count > 0) FAIL("-y 1: no complete checkpoint in %s passes its checks (%s)", dir.c_str(),
                        skipped.empty() ? "damaged as another rank reports" : skipped.front().c_str());
    return -1;
}

// How many of this rank's weights are not its fp32 master weight rounded to
// floatX: each must be the master's top 16 bits or one more (AdamW rounds
// stochastically, the initialisation to nearest), the master itself in the
// fp32 build. A model file of another step or run misses on nearly every
// element: this catches the swap where no checksum vouches for the pair
// (llm.c's empty DONE).
static size_t weights_off_master(GPT2* model, const std::vector<float>& master) {
    std::vector<floatX> params(model->num_parameters);
    cudaCheck(cudaMemcpy(params.data(), model->params_memory, params.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> full(params.size());
    for (size_t i = 0; i < params.size(); i++) full[i] = to_float(params[i]);
    const std::vector<float> mine = local_values(model, full.data());
    size_t off = 0;
    for (size_t i = 0; i < mine.size(); i++) {
        uint32_t w, p;
        memcpy(&w, &mine[i], 4);
        memcpy(&p, &master[i], 4);
        off += sizeof(floatX) == 4 ? w != p : (w >> 16) - (p >> 16) > 1u;
    }
    return off;
}

// Loads checkpoint `step` of dir: the model (config, weights), then this
// rank's state. model->dist and zero_stage must be set (they must match).
static ResumeInfo load_checkpoint(GPT2* model, const std::string& dir, int step) {
    gpt2_init_from_checkpoint(model, checkpoint_model_path(dir, step).c_str());
    const Distributed* d = model->dist;
    const size_t local = model->optimizer_elements;
    const TrainingStateHeader expected{d->num_processes, d->rank, 0, step, model->zero_stage, local,
                                       model->num_parameters, sizeof(ResumeInfo)};
    std::vector<float> m(local), v(local), master(local);
    ResumeInfo info;
    const std::string state_path = checkpoint_state_path(dir, step, d->rank);
    state_read(state_path, expected, m.data(), v.data(), master.data(), &info);
    if (info.magic != RESUME_MAGIC) FAIL("%s: not written by this trainer", state_path.c_str());
    // (skipped non-finite steps leave the AdamW step behind the step, never ahead)
    if (info.adam_step < 0 || info.adam_step > step)
        FAIL("%s: AdamW step %d is outside 0..%d, the checkpoint's step", state_path.c_str(), info.adam_step, step);
    if (const size_t off = weights_off_master(model, master))
        FAIL("%s: %zu of %zu weights are not the master weights of %s rounded: the two files are from different "
             "checkpoints", checkpoint_model_path(dir, step).c_str(), off, local, state_path.c_str());
    if (model->zero_stage == 0) {  // every rank holds the same replica: a differing one would train apart
        XXH64_state_t h;
        XXH64_reset(&h, 0);
        for (const std::vector<float>* a : {&m, &v, &master}) XXH64_update(&h, a->data(), a->size() * sizeof(float));
        const uint64_t mine = XXH64_digest(&h);
        const std::vector<uint64_t> all = host_all_gather(&mine, 1, d);
        for (int r = 1; r < d->num_processes; r++)
            if (all[r] != all[0])
                FAIL("%s: ZeRO-0 replicas differ: the optimizer state of rank %d is not rank 0's", state_path.c_str(), r);
    }
    cudaCheck(cudaMemcpy(model->adam_m, m.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->adam_v, v.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->master_weights, master.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    model->adam_step = info.adam_step;
    return info;
}

// ----------------------------------------------------------------------------
// Evaluation and sampling

// Per-token losses of one micro-batch (B, T) into `losses` (host).
static void gpt2_token_losses(GPT2* model, const int* inputs, const int* targets, float* losses) {
    evaluate_batch(model, inputs, targets);
    cudaCheck(cudaMemcpy(losses, model->acts.losses, (size_t)model->B * model->T * sizeof(float), cudaMemcpyDeviceToHost));
}

// HellaSwag (llm.c's eval .bin): each example's four endings are four rows
// (context + ending) of one batch; the prediction is the ending with the
// lowest mean loss over its tokens. Examples are split over the ranks.
// Returns the accuracy; *scored counts the examples that fit in T.
static double evaluate_hellaswag(GPT2* model, const std::vector<HellaSwagExample>& examples, long* scored) {
    const int B = model->B, T = model->T, rows = hellaswag_rows_needed(), per_batch = B / rows;
    const int eot = model->config.vocab_size - 1;
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    std::vector<float> losses((size_t)B * T);
    double correct = 0, count = 0;
    std::vector<const HellaSwagExample*> mine;
    for (size_t i = model->dist->rank; i < examples.size(); i += model->dist->num_processes) mine.push_back(&examples[i]);
    for (size_t first = 0; first < mine.size(); first += per_batch) {
        std::fill(inputs.begin(), inputs.end(), eot);
        std::fill(targets.begin(), targets.end(), -1);
        std::vector<int> fits(per_batch, 0);
        for (int e = 0; e < per_batch && first + e < mine.size(); e++)
            fits[e] = hellaswag_fill(*mine[first + e], T, &inputs[(size_t)e * rows * T], &targets[(size_t)e * rows * T], eot);
        gpt2_token_losses(model, inputs.data(), targets.data(), losses.data());
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

// Generates `tokens` tokens after an EOT (one forward per token, row 0 of the
// batch), sampled with the given temperature and top-k from a seeded stream.
static std::vector<int> gpt2_sample(GPT2* model, int tokens, float temperature, int top_k, uint64_t seed) {
    const int B = model->B, T = model->T, V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    const int eot = V - 1;
    std::vector<int> inputs((size_t)B * T, eot), targets((size_t)B * T, -1), out;
    std::vector<floatX> row(Vp);
    std::vector<float> logits(V);
    SamplerRng rng = sampler_rng(seed);
    for (int t = 1; t <= tokens && t < T; t++) {
        evaluate_batch(model, inputs.data(), targets.data());
        cudaCheck(cudaMemcpy(row.data(), model->acts.logits + (size_t)(t - 1) * Vp, Vp * sizeof(floatX),
                             cudaMemcpyDeviceToHost));
        for (int i = 0; i < V; i++) logits[i] = to_float(row[i]);
        const int next = sample_token(logits.data(), V, temperature, top_k, &rng);
        inputs[t] = next;
        out.push_back(next);
    }
    return out;
}

// ----------------------------------------------------------------------------
// The memory plan: the device memory of a run by what it holds, from the same
// tables the allocation uses, plus cuBLASLt's workspace.
struct MemoryPlan {
    std::vector<std::pair<std::string, size_t>> lines;
    size_t total = 0;
};

static MemoryPlan memory_plan(GPT2* model, int B, int T, int recompute) {
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
static int largest_fitting_batch(GPT2* model, int T, int recompute, size_t available, int max_B, long sequences_per_rank) {
    for (int B = max_B; B >= 1; B--) {
        if (sequences_per_rank > 0 && sequences_per_rank % B != 0) continue;
        if (total_bytes(activation_buffers(model, B, T, recompute)) <= available) return B;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// main: flags (compatible with llm.c's), data, the training loop, logs
#ifndef TESTING

// printf on rank 0 only: the ranks run in lock step and would print the same.
static const Distributed* g_dist = &SINGLE_PROCESS;
#define print0(...) do { if (g_dist->rank == 0) printf(__VA_ARGS__); } while (0)

struct TrainOptions {
    const char* train_pattern;  // -i
    const char* val_pattern;
    const char* init;
    const char* output_dir;
    int B;                      // 0: auto
    int T;
    long total_batch_tokens;    // -1: B*T*N
    int max_steps;              // -1: one epoch
    int schedule;               // LRSchedule
    float lr;
    int warmup_steps;
    float final_lr_fraction;
    float weight_decay;
    int val_every;
    int val_batches;
    int sample_every;
    int sample_tokens;
    int hellaswag;
    int checkpoint_every;
    int checkpoint_keep;
    int resume;
    int zero_stage;
    int recompute;
    int gelu_fusion;            // -1: by compute capability
    int doc_mask;
    int doc_positions;
    int packing;                // DataPacking
    int overfit_single_batch;
    float grad_clip;
    long seed;
    float temperature;
    int top_k;
    const char* tokenizer;
    const char* hellaswag_file;
    long ramp_tokens;
    int ramp_steps;
    int ramp_lr;                // RampLRScaling
    int skip_nonfinite;
    int memory_plan_only;
    float stall_timeout;        // 0: automatic
};

// The one table of the flags (llmc/flags.h): parsing, the defaults and --help
// come from it (test_train_cli.sh checks README.md's flag table against --help).
constexpr double INT_TOP = FLAG_INT_TOP, LONG_TOP = FLAG_LONG_TOP, FLOAT_TOP = FLAG_FLOAT_TOP;
constexpr double STEP_TOP = 99999999;  // checkpoint names hold 8 digits of the step
static const Flag<TrainOptions> FLAGS[] = {
    {"-i", &TrainOptions::train_pattern, "<glob>", 0, 0, nullptr,
     "train data shards (llm.c format); without -i: the built-in Markov corpus\n(build/markov/, known loss floor) "
     "and a small model, 300 steps", "data and model"},
    {"-j", &TrainOptions::val_pattern, "<glob>", 0, 0, nullptr, "val data shards", nullptr},
    {"-e", &TrainOptions::init, "<init>", 0, 0, "d12",
     "model file .bin (llm.c format, version 3 or 5), or a model descriptor:\nd12, d24, d36, d48, or e.g. "
     "\"L=2,C=64,H=4,V=250,maxT=64\" (a file named\nlike a descriptor is given with a '/': ./d12)", nullptr},
    {"--doc-mask", &TrainOptions::doc_mask, nullptr, 0, 1, "0",
     "attention within each document only (documents start at token V-1,\nGPT-2's <|endoftext|>)", nullptr},
    {"--doc-positions", &TrainOptions::doc_positions, nullptr, 0, 1, "0", "position ids restart at 0 at each document",
     nullptr},
    {"--packing", &TrainOptions::packing, nullptr, 0, 0, "packed",
     "packed: sequences cut from the token stream (llm.c); slots: one document per\nsequence, cut at T, the rest "
     "padded with masked targets", nullptr, DATA_PACKING_NAMES, "packing"},
    {"-b", &TrainOptions::B, "<int|auto>", 1, INT_TOP, "4",
     "micro-batch size B in sequences, or auto: the largest that fits",
     "batch: tokens per step = B x T x N x A (N ranks, A accumulated micro-batches)"},
    {"-t", &TrainOptions::T, "<int>", 1, INT_TOP, "1024", "sequence length T", nullptr},
    {"-d", &TrainOptions::total_batch_tokens, "<int>", -1, LONG_TOP, "-1",
     "tokens per optimizer step = B x T x N x A; -1: B x T x N, A = 1", nullptr},
    {"-x", &TrainOptions::max_steps, "<int>", -1, STEP_TOP, "-1", "optimizer steps; -1: one epoch of the train data",
     nullptr},
    {"--ramp-tokens", &TrainOptions::ramp_tokens, "<int>", 0, LONG_TOP, "0",
     "batch ramp: tokens per step at step 0, growing to -d; 0: off", nullptr},
    {"--ramp-steps", &TrainOptions::ramp_steps, "<int>", 0, STEP_TOP, "0", "batch ramp: steps to reach -d", nullptr},
    {"--ramp-lr", &TrainOptions::ramp_lr, nullptr, 0, 0, "none",
     "lr during the ramp: x 1, x tokens/target or x sqrt(tokens/target)", nullptr, RAMP_LR_NAMES,
     "ramp lr rule"},
    {"-k", &TrainOptions::schedule, nullptr, 0, 0, "cosine", "lr schedule after the warmup (wsd: flat, then linear over the last 20%)",
     "optimizer (AdamW, betas 0.9 and 0.95, eps 1e-8)", LR_SCHEDULE_NAMES, "schedule"},
    {"-l", &TrainOptions::lr, "<float>", 0, FLOAT_TOP, "3e-4", "peak learning rate", nullptr},
    {"-u", &TrainOptions::warmup_steps, "<int>", 0, INT_TOP, "0", "warmup steps", nullptr},
    {"-q", &TrainOptions::final_lr_fraction, "<float>", 0, 1, "1.0", "final lr as a fraction of the peak", nullptr},
    {"-c", &TrainOptions::weight_decay, "<float>", 0, FLOAT_TOP, "0.0", "weight decay of the matrices", nullptr},
    {"--grad-clip", &TrainOptions::grad_clip, "<float>", 0, FLOAT_TOP, "1.0",
     "clip the global gradient norm (0 = off)", nullptr},
    {"--skip-nonfinite", &TrainOptions::skip_nonfinite, nullptr, 0, 1, "0",
     "skip a step whose loss or gradient is Inf/NaN instead of stopping", nullptr},
    {"--seed", &TrainOptions::seed, "<int>", 0, LONG_TOP, "1337", "weight init, stochastic rounding and sampling seed",
     nullptr},
    {"-v", &TrainOptions::val_every, "<int>", 0, INT_TOP, "20", "val loss (and HellaSwag) every this many steps (0 = never)",
     "evaluation and sampling"},
    {"-m", &TrainOptions::val_batches, "<int>", 1, INT_TOP, "20", "val batches per rank", nullptr},
    {"-h", &TrainOptions::hellaswag, nullptr, 0, 1, "0", "HellaSwag accuracy at each evaluation (needs -b >= 4)",
     nullptr},
    {"--hellaswag-file", &TrainOptions::hellaswag_file, "<path>", 0, 0, "data/hellaswag/hellaswag_val.bin",
     "llm.c's eval .bin", nullptr},
    {"-s", &TrainOptions::sample_every, "<int>", 0, INT_TOP, "0", "sample every this many steps (0 = never)", nullptr},
    {"-g", &TrainOptions::sample_tokens, "<int>", 1, INT_TOP, "64", "tokens per sample", nullptr},
    {"--temperature", &TrainOptions::temperature, "<float>", 0, FLOAT_TOP, "1.0", "sampling temperature (0 = greedy)",
     nullptr},
    {"--top-k", &TrainOptions::top_k, "<int>", 0, INT_TOP, "0", "sample among the k most likely tokens (0 = all)",
     nullptr},
    {"--tokenizer", &TrainOptions::tokenizer, "<path>", 0, 0, nullptr,
     "llm.c tokenizer .bin to print samples as text (default: the GPT-2\nfiles in data/gpt2 or ../shared/data/gpt2 "
     "when V = 50257)", nullptr},
    {"-o", &TrainOptions::output_dir, "<dir>", 0, 0, nullptr,
     "output directory: main.log, main.jsonl, checkpoints (model_%08d.bin,\nstate_%08d_%05d.bin, DONE_%08d), a "
     "checkpoint at the end", "checkpoints and memory"},
    {"-n", &TrainOptions::checkpoint_every, "<int>", 0, STEP_TOP, "0", "checkpoint every this many steps (0 = only at the end)",
     nullptr},
    {"-nk", &TrainOptions::checkpoint_keep, "<int>", 0, INT_TOP, "0", "keep only the newest this many checkpoints (0 = all)",
     nullptr},
    {"-y", &TrainOptions::resume, nullptr, 0, 1, "0", "resume from the newest complete checkpoint in -o", nullptr},
    {"-z", &TrainOptions::zero_stage, nullptr, 0, 1, "0",
     "ZeRO stage: 1 shards master weights and AdamW m, v over the ranks", nullptr},
    {"-r", &TrainOptions::recompute, nullptr, 0, 2, "0",
     "recompute in the backward: 1 = GELU, 2 = GELU and layernorm", nullptr},
    {"-ge", &TrainOptions::gelu_fusion, nullptr, -1, 2, "-1",
     "GELU in cuBLASLt's matmul epilogues: 1 = forward, 2 = forward and backward;\n-1: 2 on compute capability 9.0 "
     "and newer, 0 before", nullptr},
    {"--memory-plan", &TrainOptions::memory_plan_only, nullptr, 0, 1, "0", "1: print the device memory plan and exit",
     nullptr},
    {"-a", &TrainOptions::overfit_single_batch, nullptr, 0, 1, "0", "overfit the first batch", nullptr},
    {"--stall-timeout", &TrainOptions::stall_timeout, "<float>", 0, FLOAT_TOP, "0",
     "seconds a step, evaluation, checkpoint or collective may take before every rank\nstops the job "
     "(0: 10 x the median step time, at least 600)", "reliability"},
};

static void print_usage(const char* program) {
    printf("Usage: %s [flags]   (GPT-2 training; %s build)\n", program, PRECISION_NAME);
    flags_print_help(FLAGS);
    printf("%s.\n", distributed_build_note());
}

// A flag whose value would be ignored, or would mean what --help does not
// say, is refused: the run would not be the one asked for.
static void refuse_ignored_flags(const TrainOptions& o, const std::set<std::string>& given) {
    if (o.max_steps == 0) FAIL("-x 0: give the number of optimizer steps (-x -1 is one epoch of the train data)");
    if (!o.output_dir) {
        if (o.resume) FAIL("-y 1: resuming needs the run's -o folder");
        for (const char* flag : {"-n", "-nk"})
            if (given.count(flag)) FAIL("%s: checkpoints need -o (the folder they are written to)", flag);
    }
    if (o.ramp_tokens > 0 && o.ramp_steps == 0)
        FAIL("--ramp-tokens %ld: a batch ramp needs --ramp-steps too (the steps to reach -d)", o.ramp_tokens);
    if (o.ramp_steps > 0 && o.ramp_tokens == 0)
        FAIL("--ramp-steps %d: a batch ramp needs --ramp-tokens too (the tokens per step at step 0)", o.ramp_steps);
}

static TrainOptions parse_options(int argc, char** argv, std::set<std::string>* given) {
    TrainOptions o{};
    if (!flags_parse(FLAGS, argc, argv, &o, given)) {  // --help
        if (g_dist->rank == 0) print_usage(argv[0]);
        distributed_exit_success();
    }
    refuse_ignored_flags(o, *given);
    return o;
}

// With no -i: the built-in corpus, documents from a random sparse Markov chain
// whose loss floor (the entropy of its next-token distribution) is known
// exactly, and a small model that gets close to it in about a minute on two
// CPU cores. Flags given on the command line still win.
constexpr const char* BUILTIN_CORPUS_DIR = "build/markov";
static void use_builtin_corpus(TrainOptions* o, const std::set<std::string>& given) {
    if (!o->memory_plan_only)  // the plan needs the model's defaults, not the data
        markov_corpus_write(BUILTIN_CORPUS_DIR, MARKOV_DEFAULT_SEED, MARKOV_DEFAULT_TRAIN_TOKENS,
                            MARKOV_DEFAULT_VAL_TOKENS, MARKOV_DEFAULT_VOCAB);
    static const std::string train = markov_corpus_train_path(BUILTIN_CORPUS_DIR);
    static const std::string val = markov_corpus_val_path(BUILTIN_CORPUS_DIR);
    auto unset = [&](const char* flag) { return given.count(flag) == 0; };
    o->train_pattern = train.c_str();
    if (unset("-j")) o->val_pattern = val.c_str();
    if (unset("-e")) o->init = "L=2,C=64,H=4,V=256,maxT=64";
    if (unset("-b")) o->B = 8;
    if (unset("-t")) o->T = 64;
    if (unset("-x")) o->max_steps = 300;
    if (unset("-l")) o->lr = 3e-3f;
    if (unset("-u")) o->warmup_steps = 10;
    if (unset("-q")) o->final_lr_fraction = 0.1f;
    if (unset("-v")) o->val_every = 50;
    if (unset("-m")) o->val_batches = 16;
    if (!o->memory_plan_only) print0("data: the built-in Markov corpus in %s/ (no -i given)\n", BUILTIN_CORPUS_DIR);
}

// A = tokens per step / (B x T x N), which must divide exactly; the error
// suggests the multiples around -d that a long can hold.
static int grad_accum_steps_for(long total_batch_tokens, int B, int T, int num_processes) {
    long micro_tokens;  // ((long)B * T fits: both are ints)
    if (__builtin_mul_overflow((long)B * T, (long)num_processes, &micro_tokens))
        FAIL("B x T x N = %d x %d x %d tokens is more than a long holds", B, T, num_processes);
    if (total_batch_tokens == -1) return 1;
    if (total_batch_tokens <= 0 || total_batch_tokens % micro_tokens != 0) {
        const long lower = std::max(1L, total_batch_tokens / micro_tokens) * micro_tokens;
        long upper;
        char other[48] = "";
        if (!__builtin_add_overflow(lower, micro_tokens, &upper)) snprintf(other, sizeof other, " or -d %ld", upper);
        FAIL("-d %ld is not a multiple of B x T x N = %d x %d x %d = %ld tokens; try -d %ld%s", total_batch_tokens,
             B, T, num_processes, micro_tokens, lower, other);
    }
    const long A = total_batch_tokens / micro_tokens;
    if (A > INT_MAX)
        FAIL("-d %ld: %ld micro-batches of B x T x N = %ld tokens per step, more than %d", total_batch_tokens, A,
             micro_tokens, INT_MAX);
    return (int)A;
}

// -e is a descriptor where it reads as one and holds no '/', whatever the
// folder holds (an earlier -o d12 must not shadow d12); a file named like a
// descriptor is given with a '/' (./d12). Anything else is a model file.
static bool init_is_descriptor(const char* init) {
    GPT2Config c;
    return strchr(init, '/') == nullptr && parse_descriptor(init, &c);
}

// The model's shape from -e without loading anything (the memory plan).
static GPT2Config read_config(const char* init) {
    GPT2Config c;
    struct stat st;
    if (init_is_descriptor(init)) {
        parse_descriptor(init, &c);
        return c;
    }
    if (stat(init, &st) != 0) FAIL("-e %s: not a model file or a model descriptor", init);
    ModelFileHeader h;
    fclose(open_model_file(init, &c, &h));
    return c;
}

static void print_memory_plan(GPT2* model, int B, int T, int recompute) {
    const MemoryPlan plan = memory_plan(model, B, T, recompute);
    size_t free_bytes = 0, device_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &device_bytes));
    const double MiB = 1048576.0;
    print0("memory plan per rank (B=%d, T=%d, recompute %d, ZeRO-%d over %d ranks):\n", B, T, recompute,
           model->zero_stage, model->dist->num_processes);
    for (const auto& line : plan.lines) print0("  %-34s %10.1f MiB\n", line.first.c_str(), line.second / MiB);
    print0("  %-34s %10.1f MiB of %.1f MiB on the device\n", "total", plan.total / MiB, device_bytes / MiB);
}

// -b auto: the largest micro-batch whose activations fit (from the plan),
// confirmed by allocating them (on out-of-memory, the next smaller one), the
// smallest of the ranks' choices, then a trial forward and backward. With -d the tokens per step stay:
// B must divide the sequences each rank takes per step.
static int choose_micro_batch(GPT2* model, int T, int recompute, long total_batch_tokens, int data_cap) {
    const int N = model->dist->num_processes;
    const long sequences_per_rank = total_batch_tokens > 0 ? total_batch_tokens / ((long)T * N) : 0;
    if (total_batch_tokens > 0 && total_batch_tokens % ((long)T * N) != 0)
        FAIL("-b auto: -d %ld is not a multiple of T x N = %ld", total_batch_tokens, (long)T * N);
    size_t free_bytes = 0, device_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &device_bytes));
    int B = (int)std::min<long>(sequences_per_rank > 0 ? sequences_per_rank : 4096, std::min(data_cap, 4096));
    while ((B = largest_fitting_batch(model, T, recompute, (size_t)(free_bytes * 0.98), B, sequences_per_rank)) > 0) {
        if (gpt2_try_allocate_activations(model, B, T, grad_accum_steps_for(total_batch_tokens, B, T, N), recompute)) break;
        print0("-b auto: B=%d does not fit after all; trying smaller\n", B);
        B -= 1;
    }
    if (B == 0 && sequences_per_rank > 0 && data_cap < sequences_per_rank &&
        largest_fitting_batch(model, T, recompute, (size_t)(free_bytes * 0.98), data_cap, 0) > 0)
        FAIL("-b auto: no B up to %d (what the data holds) divides the %ld sequences per rank that -d %ld asks for",
             data_cap, sequences_per_rank, total_batch_tokens);
    if (B == 0)
        FAIL("-b auto: not even B=1 fits at T=%d (%.1f MiB free); try -r 2, a smaller -t or more ranks with -z 1", T,
             free_bytes / 1048576.0);
    // every rank takes the smallest B that fits on every rank: the tokens per
    // step (B x T x N x A) must be the same number everywhere
    const uint64_t mine = B;
    const std::vector<uint64_t> all = host_all_gather(&mine, 1, model->dist);
    const int agreed = (int)*std::min_element(all.begin(), all.end());
    if (agreed < B) {
        gpt2_free_activations(model);
        gpt2_allocate_activations(model, agreed, T, grad_accum_steps_for(total_batch_tokens, agreed, T, N), recompute);
    }
    std::vector<int> tokens((size_t)agreed * T, 0);  // a trial step without the update
    accumulate_gradients(model, whole_batch(model, tokens.data(), tokens.data(), 1));
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->num_parameters * sizeof(float), model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    return agreed;
}

// Prints samples as text where a tokenizer is at hand, else as token ids.
static std::string sample_text(const std::vector<int>& tokens, const llmc::Tokenizer* tokenizer) {
    if (tokenizer) return tokenizer->decode(tokens);
    std::string text;
    for (int t : tokens) text += std::to_string(t) + " ";
    return text;
}

// A tokenizer with fewer tokens than the model could not print every sample:
// refused before training, not at the first sample.
static std::unique_ptr<llmc::Tokenizer> load_tokenizer(const TrainOptions& opt, int vocab_size) {
    std::unique_ptr<llmc::Tokenizer> t;
    if (opt.tokenizer) t = std::make_unique<llmc::Tokenizer>(llmc::Tokenizer::from_bin(opt.tokenizer));
    const std::string dir = llmc::find_gpt2_dir();
    if (!opt.tokenizer && vocab_size == 50257 && !dir.empty())
        t = std::make_unique<llmc::Tokenizer>(llmc::Tokenizer::from_gpt2_files(dir + "/encoder.json", dir + "/vocab.bpe"));
    if (t && t->vocab_size() < vocab_size)
        FAIL("--tokenizer %s: %d tokens, fewer than the model's vocabulary of %d (a sample could not be printed)",
             opt.tokenizer, t->vocab_size(), vocab_size);
    return t;
}

// -o becomes this run's: the folder exists (created here), rank 0 holds its
// lock for the whole run, and a fresh run (-y 0) refuses a folder that holds
// checkpoint files (of another run, or of this one: resume it with -y 1), so
// no run ever overwrites or prunes what another wrote.
static FolderLock claim_output_dir(const char* dir, const Distributed* d) {
    FolderLock lock;
    if (d->rank == 0) {
        struct stat st;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            const std::string parent = checkpoint_parent_dir_(dir);
            if (errno == ENOENT) FAIL("-o %s: cannot create the folder: %s does not exist", dir, parent.c_str());
            FAIL("-o %s: cannot create the folder in %s (%s)", dir, parent.c_str(), strerror(errno));
        }
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) FAIL("-o %s: not a folder", dir);
        try {
            lock = checkpoint_lock_dir(dir);
        } catch (const llmc::Error& e) {
            FAIL("-o %s", e.what());
        }
    }
    host_barrier(d);  // the folder is there and locked
    return lock;
}

// A fresh run in a folder with checkpoint files refuses.
static void refuse_foreign_checkpoints(const char* dir, const Distributed* d) {
    if (d->rank != 0) return;
    const std::vector<int> steps = checkpoint_steps_with_files(dir);
    if (steps.empty()) return;
    FAIL("-o %s holds checkpoint files (steps %d..%d) of an earlier run; resume it with -y 1, or give a new folder",
         dir, steps.front(), steps.back());
}

// Whether any rank got a stop signal (every rank asks at the same point of
// every step, so they all stop after the same step).
static bool stop_requested(const Distributed* d) { return host_sum(stop_signal() ? 1 : 0, d) > 0; }

// What ZeRO-1 saves: master weights, m and v (12 bytes per parameter) live on
// one rank in N, plus a gradient shard of 4 bytes per owned element.
static void print_optimizer_memory(const GPT2& model) {
    const double MiB = 1048576.0, full = 12.0 * model.num_parameters / MiB;
    if (model.zero_stage == 0) {
        print0("optimizer state per rank: %.1f MiB (fp32 master weights, m, v)\n", full);
        return;
    }
    const double sharded = 16.0 * model.optimizer_elements / MiB;
    print0("optimizer state per rank: %.1f MiB with ZeRO-1 (master, m, v and the gradient shard of %zu elements), "
           "%.1f MiB without: saves %.1f MiB per rank\n", sharded, model.optimizer_elements, full, full - sharded);
}

// Mean loss over `batches` val batches of every rank.
static double evaluate(GPT2* model, DataLoader* loader, int batches) {
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

// ---- the run -------------------------------------------------------------------
// Everything one training run holds from its start to its end.
struct Run {
    TrainOptions opt;
    const Distributed* dist;
    Watchdog* watchdog;
    GPT2 model;
    DataLoader train_loader, val_loader;
    LRScheduler scheduler;
    BatchRamp ramp;
    OptimizerSettings adamw;
    DataPacking packing;
    RampLRScaling ramp_lr;
    int start_step = 0, steps = 0;  // steps: the run ends after this one
    int resume_step = -1;           // the checkpoint resumed from, or -1
    int saved_step = -1;            // the newest checkpoint this run wrote
    CheckpointFolder folder;        // -o (llmc/checkpoint.h): owner, lock, what pruning may delete
    ResumeInfo resumed{RESUME_MAGIC, 0, {}, 0};
    bool has_floor = false;         // the val data carries its loss floor (the built-in corpus)
    double loss_floor = 0, initial_gap = 0;
    std::vector<HellaSwagExample> hellaswag;
    std::unique_ptr<llmc::Tokenizer> tokenizer;
    RunLog log;
    std::vector<int> inputs, targets;  // this rank's part of the step's A micro-batches (next_step_batch)
    cudaEvent_t step_start = nullptr, step_end = nullptr;  // the step's device time (timed_train_step)
    double peak_flops = 0, flops_token = 0, recent_ms = 0;  // recent_ms: mean step time, for the ETA
    int timed_steps = 0;
};

// The flags, the built-in corpus where no -i is given, and the named choices.
static void configure_run(Run* run, int argc, char** argv) {
    TrainOptions& opt = run->opt;
    std::set<std::string> given;
    opt = parse_options(argc, argv, &given);
    if (!opt.train_pattern) use_builtin_corpus(&opt, given);
    // the enumerated flags hold their choice's index (llmc/flags.h), in the enum's order
    run->scheduler = LRScheduler{(LRSchedule)opt.schedule, opt.lr, opt.warmup_steps, 0, opt.final_lr_fraction};
    run->packing = (DataPacking)opt.packing;
    run->ramp_lr = (RampLRScaling)opt.ramp_lr;
    if (run->ramp_lr != RampLRScaling::None && opt.ramp_tokens == 0)
        FAIL("--ramp-lr %s: there is no batch ramp to scale the lr of (give --ramp-tokens and --ramp-steps)",
             RAMP_LR_NAMES[opt.ramp_lr]);
    run->adamw.weight_decay = opt.weight_decay;
    run->adamw.grad_clip = opt.grad_clip;
    run->adamw.seed = opt.seed;
    run->model.dist = run->dist;
    run->model.zero_stage = opt.zero_stage;
    run->model.doc_mask = opt.doc_mask;
    run->model.doc_positions = opt.doc_positions;
}

// --memory-plan 1: the plan of -e at -b, -t, -r; nothing allocated.
static void print_plan_only(Run* run) {
    run->model.config = read_config(run->opt.init);
    gpt2_configure(&run->model);
    if (run->opt.B == 0) FAIL("--memory-plan: give -b (auto needs the device)");
    print_memory_plan(&run->model, run->opt.B, run->opt.T, run->opt.recompute);
}

// Whether the run reads the val data (-j, and -v > 0).
static bool reads_val(const TrainOptions& opt) { return opt.val_pattern && opt.val_every > 0; }

// The largest B the data holds (for -b auto): the train loader reads N x B
// sequences per micro-batch, the val loader B per rank, where it is read. A B
// larger than the device alone would allow is capped with a note.
static int data_batch_cap(Run* run) {
    const TrainOptions& opt = run->opt;
    const int N = run->dist->num_processes, V = run->model.config.vocab_size;
    const uint64_t train = dataloader_count_sequences(opt.train_pattern, opt.T, V, run->packing);
    const uint64_t val = reads_val(opt) ? dataloader_count_sequences(opt.val_pattern, opt.T, V, run->packing)
                                        : UINT64_MAX;
    const bool by_val = val < train / N;
    const uint64_t cap = std::min<uint64_t>({train / N, val, (uint64_t)INT_MAX});
    const char* which = by_val ? "val data (-j; -v 0 does not read it)" : "train data (read N x B at a time)";
    if (cap == 0) FAIL("-b auto: the %s holds too few sequences of T=%d for B=1", which, opt.T);
    if (cap < 4096)
        print0("-b auto: B at most %llu: the %s holds %llu sequences of T=%d\n", (unsigned long long)cap, which,
               (unsigned long long)(by_val ? val : train), opt.T);
    return (int)cap;
}

// The model: the newest complete checkpoint of -o that passes its checks
// (with -y 1), else -e (a model file or a descriptor); then its activations.
static void build_model(Run* run) {
    const TrainOptions& opt = run->opt;
    GPT2* model = &run->model;
    CheckpointFolder& folder = run->folder;
    if (opt.output_dir) {
        folder.dir = opt.output_dir;
        folder.keep_last = opt.checkpoint_keep;
        folder.lock = claim_output_dir(opt.output_dir, run->dist);
    }
    if (opt.output_dir && !opt.resume) refuse_foreign_checkpoints(opt.output_dir, run->dist);
    run->resume_step = opt.resume ? choose_resume_step(opt.output_dir, run->dist, &folder.run_id) : -1;
    if (folder.run_id.empty()) folder.run_id = checkpoint_new_run_id();  // (only rank 0 writes DONE markers)
    struct stat st;
    if (run->resume_step >= 0) {
        folder.proven.push_back(run->resume_step);  // every rank checked its files against the DONE
        if (run->dist->rank == 0) checkpoint_remove_stale_temps(opt.output_dir);
        run->resumed = load_checkpoint(model, opt.output_dir, run->resume_step);
        print0("resuming from step %d of %s\n", run->resume_step, opt.output_dir);
    } else {
        if (opt.resume) print0("no complete checkpoint in %s: starting from -e\n", opt.output_dir);
        if (!init_is_descriptor(opt.init) && stat(opt.init, &st) == 0) gpt2_init_from_checkpoint(model, opt.init);
        else gpt2_init_from_descriptor(model, opt.init, opt.seed);
    }
    run->start_step = std::max(run->resume_step, 0);
    run->initial_gap = run->resumed.initial_val_gap;
    run->watchdog->mark(opt.B == 0 ? "-b auto: choosing the micro-batch (a trial step)" : "allocating the activations");
    if (opt.B == 0)
        run->opt.B = choose_micro_batch(model, opt.T, opt.recompute, opt.total_batch_tokens, data_batch_cap(run));
}

// B_global = B_micro x N x A sequences per step (a batch ramp raises A from a
// smaller start up to it), the data, and what evaluation and sampling need.
static void open_data(Run* run) {
    const TrainOptions& opt = run->opt;
    GPT2* model = &run->model;
    const int N = run->dist->num_processes, rank = run->dist->rank, V = model->config.vocab_size;
    const int grad_accum_steps = grad_accum_steps_for(opt.total_batch_tokens, opt.B, opt.T, N);
    const long micro_tokens_all = (long)opt.B * opt.T * N, tokens_per_step = micro_tokens_all * grad_accum_steps;
    run->ramp = BatchRamp{opt.ramp_tokens, opt.ramp_steps, tokens_per_step, micro_tokens_all, run->ramp_lr};
    if (model->B == 0) gpt2_allocate_activations(model, opt.B, opt.T, grad_accum_steps, opt.recompute);  // (-b auto allocated them)
    run->watchdog->mark("opening the data");
    // Every rank reads the whole global micro-batch (N x B sequences) and
    // trains on its B of them (next_step_batch). Val batches are split by rank.
    dataloader_init(&run->train_loader, opt.train_pattern, N * opt.B, opt.T, 0, 1, V, false, opt.seed, run->packing);
    if (run->resume_step >= 0) dataloader_restore(&run->train_loader, run->resumed.train_data);
    if (reads_val(opt))
        dataloader_init(&run->val_loader, opt.val_pattern, opt.B, opt.T, rank, N, V, false, opt.seed, run->packing);
    run->steps = opt.max_steps > 0 ? opt.max_steps : std::max(1L, (long)(run->train_loader.num_tokens / tokens_per_step));
    const int resumed = run->resume_step;
    if (resumed > run->steps)
        FAIL("-x %d: the run resumed from step %d is already past it (give -x > %d, or another -o)", run->steps,
             resumed, resumed);
    // a step reads at most tokens_per_step / T sequences (fewer in a ramp)
    const uint64_t next_sequence = run->resumed.train_data.next_sequence;
    if (resumed >= 0 && next_sequence > (uint64_t)resumed * (tokens_per_step / opt.T))
        FAIL("%s: data position %llu is beyond the %ld sequences that %d steps read",
             checkpoint_state_path(opt.output_dir, resumed, rank).c_str(), (unsigned long long)next_sequence,
             (long)resumed * (tokens_per_step / opt.T), resumed);
    run->scheduler.total_steps = run->steps;
    if (opt.hellaswag) {
        if (opt.B < hellaswag_rows_needed()) FAIL("-h 1: HellaSwag needs -b >= %d (4 endings per example)", hellaswag_rows_needed());
        try {
            run->hellaswag = hellaswag_load(opt.hellaswag_file);
            hellaswag_check_vocab(run->hellaswag, V, opt.hellaswag_file);
        } catch (const llmc::Error& e) {
            FAIL("-h 1: %s", e.what());
        }
    }
    if (opt.sample_every > 0 && rank == 0) run->tokenizer = load_tokenizer(opt, V);
    int floor_vocab = 0;  // a val shard of the built-in corpus carries its loss floor
    run->has_floor = opt.val_pattern && markov_corpus_floor(opt.val_pattern, &run->loss_floor, &floor_vocab);
}

// What the run is, before its first step; the GELU fusion follows the device.
static void print_run(Run* run) {
    const TrainOptions& opt = run->opt;
    GPT2& model = run->model;
    const GPT2Config& c = model.config;
    const int N = run->dist->num_processes;
    const long tokens_per_step = run->ramp.target_tokens;
    print0("model: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %zu parameters, %s\n", c.num_layers, c.channels,
           c.num_heads, c.vocab_size, c.padded_vocab_size, c.max_seq_len, model.num_parameters, PRECISION_NAME);
    print0("batch: B=%d x T=%d x N=%d x A=%d = %ld tokens per step\n", opt.B, opt.T, N,
           (int)(tokens_per_step / run->ramp.micro_tokens), tokens_per_step);
    if (model.doc_mask || model.doc_positions)
        print0("documents: starting at token %d; attention %s; positions %s\n", c.vocab_size - 1,
               model.doc_mask ? "within each document" : "across documents",
               model.doc_positions ? "restart at each document" : "0..T-1 per sequence");
    if (opt.ramp_tokens > 0)
        print0("batch ramp: %ld tokens per step at step 0 (A=%d), %ld from step %d; lr scaling %s\n",
               run->ramp.tokens(0), run->ramp.grad_accum_steps(0), tokens_per_step, opt.ramp_steps,
               RAMP_LR_NAMES[opt.ramp_lr]);
    print0("ranks: %d (ZeRO-%d)\n", N, model.zero_stage);
    print_optimizer_memory(model);
    print_memory_plan(&model, opt.B, opt.T, opt.recompute);
    print0("train: %s (%zu tokens), %d steps\n", opt.train_pattern, run->train_loader.num_tokens, run->steps);
    if (run->has_floor) print0("loss floor of the val data: %.6f nats/token\n", run->loss_floor);
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, run->dist->local_rank));
    run->peak_flops = gpu_peak_bf16_flops(props.name);
    run->flops_token = flops_per_token(model.num_parameters, c.num_layers, c.channels, opt.T);
    // cuBLASLt's fused GELU pays off from Hopper on (llm.c measured a slowdown before)
    model.gelu_fusion = opt.gelu_fusion >= 0 ? opt.gelu_fusion : (props.major >= 9 ? 2 : 0);
    const char* fusion_names[] = {"GELU kernels", "GELU in the forward matmul's epilogue",
                                  "GELU in the forward and backward matmuls' epilogues"};
    print0("gelu: -ge %d, %s\n", model.gelu_fusion, fusion_names[model.gelu_fusion]);
}

// The val loss (with the gap to the floor where known) and HellaSwag at every
// -v steps and the last; a sample at every -s steps and the last.
static void evaluate_and_log(Run* run, int step, bool last) {
    const TrainOptions& opt = run->opt;
    GPT2* model = &run->model;
    run->watchdog->mark("the evaluation or sample at step " + std::to_string(step));
    if (reads_val(opt) && (step % opt.val_every == 0 || last)) {
        const double val_loss = evaluate(model, &run->val_loader, opt.val_batches);
        if (run->has_floor) {
            const double gap = val_loss - run->loss_floor;
            if (step == 0) run->initial_gap = gap;
            print0("step %d: val loss %.6f | floor %.6f | gap %.4f (%.1f%% of the initial gap)\n", step, val_loss,
                   run->loss_floor, gap, 100.0 * gap / std::max(run->initial_gap, 1e-12));
        } else {
            print0("step %d: val loss %.6f\n", step, val_loss);
        }
        run->log.record(step, "tel", "val_loss", val_loss);
        if (opt.hellaswag) {
            long scored = 0;
            const double accuracy = evaluate_hellaswag(model, run->hellaswag, &scored);
            print0("step %d: HellaSwag accuracy %.4f (%ld of %zu examples fit T=%d)\n", step, accuracy, scored,
                   run->hellaswag.size(), opt.T);
            run->log.record(step, "eval", "hellaswag_acc", accuracy);
        }
    }
    if (opt.sample_every > 0 && step > 0 && (step % opt.sample_every == 0 || last) && run->dist->rank == 0) {
        const std::vector<int> sample = gpt2_sample(model, opt.sample_tokens, opt.temperature, opt.top_k,
                                                    splitmix64((uint64_t)opt.seed ^ ((uint64_t)step << 32)));
        printf("step %d: sample: %s\n", step, sample_text(sample, run->tokenizer.get()).c_str());
    }
}

// One optimizer step, timed on the device.
static StepResult timed_train_step(Run* run, const StepBatch& batch, float lr, float* ms) {
    if (!run->step_start) {
        cudaCheck(cudaEventCreate(&run->step_start));
        cudaCheck(cudaEventCreate(&run->step_end));
    }
    cudaCheck(cudaEventRecord(run->step_start, run->model.stream));
    const StepResult r = train_step(&run->model, batch, lr, run->adamw);
    cudaCheck(cudaEventRecord(run->step_end, run->model.stream));
    cudaCheck(cudaEventSynchronize(run->step_end));
    cudaCheck(cudaEventElapsedTime(ms, run->step_start, run->step_end));
    return r;
}

// The step line on stdout and its log records.
static void log_step(Run* run, int step, const StepResult& r, float lr, float ms) {
    const int N = run->dist->num_processes;
    run->watchdog->step_took(ms);
    const long step_tokens = run->ramp.tokens(step);
    run->recent_ms = run->timed_steps++ == 0 ? ms : 0.9 * run->recent_ms + 0.1 * ms;
    const double tok_per_s = step_tokens / (ms / 1000.0);
    double mfu = 0;
    char mfu_text[32] = "n/a";
    if (mfu_percent(tok_per_s / N, run->flops_token, run->peak_flops, &mfu)) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", mfu);
    const double util = 100.0 * r.num_targets / step_tokens;  // token slots that carry a counted target
    print0("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %ld tok/step | util %.1f%% | %.1f ms | %.0f tok/s | "
           "MFU %s | ETA %s\n", step + 1, run->steps, r.loss, r.grad_norm, lr, step_tokens, util, ms, tok_per_s,
           mfu_text, format_duration(run->recent_ms / 1000.0 * (run->steps - step - 1)).c_str());
    run->log.train_record(step, r.loss, r.grad_norm, lr, step_tokens, util / 100, ms, tok_per_s);
}

// A step whose loss or gradient norm is not finite changed nothing (see
// adamw.cuh): it stops the run, or with --skip-nonfinite 1 is skipped.
static void skip_nonfinite_step(Run* run, int step, const StepResult& r) {
    if (!run->opt.skip_nonfinite)
        FAIL("step %d: loss %f, gradient norm %f: not finite; stopping, the weights of step %d and the "
             "checkpoints are intact (lower -l, check the data, or --skip-nonfinite 1)",
             step + 1, r.loss, r.grad_norm, step);
    run->model.adam_step--;  // the step never happened for the optimizer
    print0("step %4d/%d | loss %f | norm %f | skipped: not finite\n", step + 1, run->steps, r.loss, r.grad_norm);
}

// One optimizer step and its line, or its skip. A step with no counted target
// (every target masked: --packing slots with a document of one token) has no
// loss and no gradient, yet AdamW would move the weights (momentum, decay):
// it is not taken, and the AdamW step count stays. A non-finite one is
// skipped or stops the run.
static void take_step(Run* run, int step, const StepBatch& batch, float lr) {
    if (batch.global_targets == 0) {
        print0("step %4d/%d | skipped: no counted target (every target of the step is masked)\n", step + 1,
               run->steps);
        return;
    }
    float ms = 0;
    const StepResult r = timed_train_step(run, batch, lr, &ms);
    if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) log_step(run, step, r, lr, ms);
    else skip_nonfinite_step(run, step, r);
}

// A checkpoint after `step` steps: every -n steps, at the end, or (always)
// when a signal asked the run to stop; never twice for one step.
static void maybe_checkpoint(Run* run, int step, bool always = false) {
    const TrainOptions& opt = run->opt;
    const bool due = (opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0) || step == run->steps || always;
    if (!opt.output_dir || !due || run->saved_step == step) return;
    run->watchdog->mark("the checkpoint of step " + std::to_string(step));
    const ResumeInfo info{RESUME_MAGIC, run->model.adam_step, dataloader_position(&run->train_loader), run->initial_gap};
    save_checkpoint(&run->model, &run->folder, step, info);
    run->saved_step = step;
    print0("checkpoint: step %d in %s\n", step, opt.output_dir);
}

static int train(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines, promptly, also into a pipe or a Slurm log
    // no rank waits forever, from before MPI's start-up on (a rank stopped
    // there holds up every other): the rank is the launcher's, the timeout
    // read from argv ahead of the flags
    Run run;
    run.watchdog = new Watchdog(launcher_rank(), prescan_stall_timeout(argc, argv));  // (kept until exit, with its thread)
    run.watchdog->mark("MPI/NCCL start-up");
    Distributed dist;
    distributed_init(&dist, &argc, &argv);
    g_dist = &dist;
    install_signal_handlers();
    run.dist = &dist;
    run.watchdog->mark("reading the flags");
    configure_run(&run, argc, argv);
    run.watchdog->configure(dist.rank, run.opt.stall_timeout);
    // building the model and -b auto's trial step too (a stopped rank stalls a collective in them)
    run.watchdog->mark("building the model");
    if (run.opt.memory_plan_only) {
        print_plan_only(&run);
    } else {
        // the data is there before the model is built (minutes for a large one)
        for (const char* pattern : {run.opt.train_pattern, run.opt.val_pattern})
            if (pattern) dataloader_find_shards(pattern);
        build_model(&run);
        open_data(&run);
        print_run(&run);
        if (run.opt.output_dir && dist.rank == 0) run.log.open(run.opt.output_dir, run.resume_step);
        for (int step = run.start_step; step <= run.steps; step++) {
            const bool last = step == run.steps;
            run.watchdog->mark("the stop-signal check before step " + std::to_string(step + 1));
            if (step > run.start_step && !last && stop_requested(&dist)) {
                maybe_checkpoint(&run, step, true);
                print0("stopped by a signal after step %d%s\n", step,
                       run.opt.output_dir ? "; resume with -y 1" : " (no -o: nothing saved)");
                break;
            }
            evaluate_and_log(&run, step, last);
            if (last) break;
            // B_global = B_micro x N x A sequences: this rank's B_micro of each of the A global micro-batches
            const StepBatch batch = next_step_batch(&run.train_loader, &run.model, run.ramp.grad_accum_steps(step),
                                                    run.opt.overfit_single_batch, &run.inputs, &run.targets);
            const float lr = (float)(run.scheduler.at(step) * run.ramp.lr_factor(step));
            run.watchdog->mark("step " + std::to_string(step + 1) + " (forward, backward, gradient all-reduce, AdamW)");
            take_step(&run, step, batch, lr);
            maybe_checkpoint(&run, step + 1);  // (a skipped last step too)
        }
        run.log.close();
        if (run.step_start) {
            cudaCheck(cudaEventDestroy(run.step_start));
            cudaCheck(cudaEventDestroy(run.step_end));
        }
        dataloader_free(&run.train_loader);
        if (reads_val(run.opt)) dataloader_free(&run.val_loader);
        gpt2_free(&run.model);
        matmul_teardown();
    }
    run.watchdog->mark("the end of the run");
    distributed_free(&dist);
    return 0;
}

// Whatever is thrown (llmc::Error, FAIL's) ends the run with one error line
// (and, under mpirun, the exit aborts the other ranks), never with an abort.
int main(int argc, char** argv) { return llmc::run_main(train, argc, argv); }
#endif
