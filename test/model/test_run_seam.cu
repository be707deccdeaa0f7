// test_run_seam: a second model family through the shared run (llmc/run/run.h).
// A bigram model (the logits of a token are one row of a V x Vp table) is
// trained, evaluated, sampled, checkpointed and resumed by train<Bigram>, the
// run train_gpt.cu's main calls for GPT-2: what this file defines is all a
// family writes (the hook lists at the top of llmc/step/train_step.h and llmc/run/run.h).
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/kernels/cuda_common.h"
#include "llmc/kernels/classifier.cuh"
#include "llmc/step/params.h"
#include "llmc/step/train_step.h"
#include "llmc/run/run_checkpoint.h"
#include "llmc/run/run_model.h"
#include "test/test_util.h"

struct BigramConfig {
    int vocab_size;         // V
    int padded_vocab_size;  // Vp: the table's columns (the logits)
    int max_seq_len;
    bool operator==(const BigramConfig& o) const {  // (a resume's -e must be the checkpoint's model)
        return vocab_size == o.vocab_size && padded_vocab_size == o.padded_vocab_size && max_seq_len == o.max_seq_len;
    }
};

struct Bigram : Parameters, MicroBatches {
    using Config = BigramConfig;
    BigramConfig config;
    floatX* logits;  // (B, T, Vp), dlogits after cross_entropy
    float* losses;   // (B, T)
    float* reduce;   // global_norm_scratch_floats()
    static constexpr const char* NAME = "bigram";
    static constexpr const char* INIT_DEFAULT = "V=256";
    static constexpr const char* INIT_HELP = "model file .bin, or V=<tokens>";
    static constexpr const char* DOC_TOKEN_HELP = "the token that starts a document (V-1 here)";
    static constexpr const char* RECOMPUTE_HELP = "no effect (nothing to recompute)";
    static constexpr const char* GELU_FUSION_HELP = "no effect (no GELU)";
    static constexpr const char* BUILTIN_INIT = "V=256";
    static constexpr std::array<const char*, 0> MODEL_FOLDER_FILES{};  // one model file
};

// ---- kernels: logits = table[token]; dtable[v] = the sum of dlogits of the positions holding v
__global__ void bigram_forward_kernel(floatX* logits, const floatX* table, const int* tokens, size_t BT, int Vp) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < BT * Vp) logits[i] = table[(size_t)tokens[i / Vp] * Vp + i % Vp];
}

// One thread per column, the positions in order: each table element is summed by
// one thread in a fixed order (deterministic, no atomics), in O(BT x Vp).
__global__ void bigram_backward_kernel(float* dtable, const floatX* dlogits, const int* tokens, size_t BT, int Vp) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= Vp) return;
    for (size_t bt = 0; bt < BT; bt++) dtable[(size_t)tokens[bt] * Vp + col] += (float)dlogits[bt * Vp + col];
}

// ---- llmc/step/train_step.h's hooks
static void forward(Bigram* m) {
    const size_t n = (size_t)m->B * m->T * m->config.padded_vocab_size;
    bigram_forward_kernel<<<CEIL_DIV(n, 256), 256, 0, m->stream>>>(m->logits, m->params_memory, m->inputs,
                                                                   (size_t)m->B * m->T, m->config.padded_vocab_size);
    cudaCheck(cudaGetLastError());
}
static void cross_entropy(Bigram* m, float scale, bool write_dlogits) {
    const int BT = m->B * m->T;
    fused_classifier(m->logits, m->losses, m->targets, scale, BT, m->config.vocab_size, m->config.padded_vocab_size,
                     write_dlogits, m->stream);
    accumulate_loss(&m->stats->loss_sum, m->losses, BT, scale, m->stream);
}
static void backward(Bigram* m, const int*, int, bool reduce) {
    const int Vp = m->config.padded_vocab_size;
    bigram_backward_kernel<<<CEIL_DIV(Vp, 128), 128, 0, m->stream>>>(m->grads_memory, m->logits, m->inputs,
                                                                     (size_t)m->B * m->T, Vp);
    cudaCheck(cudaGetLastError());
    if (reduce) reduce_layer(m, 0);  // no layers: the table is "outside" them
}
static float* reduce_scratch(Bigram* m) { return m->reduce; }
static int document_start_token(const Bigram* m) { return m->config.vocab_size - 1; }

// ---- llmc/run/run.h's hooks
static bool parse_descriptor(const char* text, BigramConfig* c) {
    int V = 0, used = 0;
    if (sscanf(text, "V=%d%n", &V, &used) != 1 || text[used] != '\0' || V < 2 || V > 4096) return false;
    *c = BigramConfig{V, CEIL_DIV(V, 128) * 128, 1024};
    return true;
}
static void configure_model(Bigram* m) {
    configure_parameters(m, {ParameterLayout{(size_t)m->config.vocab_size * m->config.padded_vocab_size, false, true}},
                         0);
}
static void allocate(Bigram* m) {
    configure_model(m);
    allocate_parameters(m);
    m->B = m->T = 0;
    cudaCheck(cudaStreamCreate(&m->stream));
    matmul_setup();  // (the run's end tears it down)
}
static void init_from_descriptor(Bigram* m, const char* descriptor, uint64_t seed) {
    if (!parse_descriptor(descriptor, &m->config)) llmc::failf("-e %s: not a bigram descriptor", descriptor);
    allocate(m);
    const int V = m->config.vocab_size, Vp = m->config.padded_vocab_size;
    std::vector<float> w((size_t)V * Vp, 0.0f);
    for (size_t i = 0; i < w.size(); i++)
        if ((int)(i % Vp) < V) w[i] = 0.02f * ((float)(splitmix64(seed + i) >> 40) / (1 << 24) - 0.5f);
    set_weights(m, w);
}
static BigramConfig config_of(const ModelFileHeader& h) {
    return BigramConfig{h.vocab_size, h.padded_vocab_size, h.max_seq_len};
}
static BigramConfig model_file_config(const char* path) {
    ModelFileHeader h;
    fclose(model_file_open(path, &h));
    return config_of(h);
}
static void init_from_model_file(Bigram* m, const char* path) {
    ModelFileHeader h;
    FILE* f = model_file_open(path, &h);
    m->config = config_of(h);
    const std::vector<float> w =
        read_model_weights(f, path, h, (size_t)m->config.vocab_size * m->config.padded_vocab_size);
    allocate(m);
    set_weights(m, w);
}
static std::vector<CheckpointFile> write_model_file(const Bigram* m, const std::string& path) {
    const BigramConfig& c = m->config;
    return {
        write_model_weights(m, path, ModelFileHeader{0, c.max_seq_len, c.vocab_size, 0, 0, 0, c.padded_vocab_size})};
}
static std::vector<DeviceBuffer> activation_buffers(Bigram* m, int B, int T, int) {
    const size_t BT = (size_t)B * T;
    std::vector<DeviceBuffer> rows = {
        {(void**)&m->logits, BT * m->config.padded_vocab_size * sizeof(floatX), "logits (B x T x Vp)"},
        {(void**)&m->losses, BT * sizeof(float), "logits (B x T x Vp)"},
        {(void**)&m->reduce, global_norm_scratch_floats() * sizeof(float), "backward scratch"}};
    for (const DeviceBuffer& b : micro_batch_buffers(m, &m->stats, B, T)) rows.push_back(b);
    return rows;
}
static bool try_allocate_activations(Bigram* m, int B, int T, int max_grad_accum_steps, int recompute) {
    if (!allocate_buffers(activation_buffers(m, B, T, recompute))) return false;
    allocate_staging(m, B, T, max_grad_accum_steps);
    return true;
}
static void free_activations(Bigram* m) {
    for (const DeviceBuffer& b : activation_buffers(m, m->B, m->T, 0)) cudaCheck(cudaFree(*b.ptr));
    free_staging(m);
}
static void free_model(Bigram* m) {
    for (const DeviceBuffer& b : parameter_buffers(m)) cudaCheck(cudaFree(*b.ptr));
    if (m->B > 0) free_activations(m);
    cudaCheck(cudaStreamDestroy(m->stream));
}
static int vocab_size(const Bigram* m) { return m->config.vocab_size; }
static const float* device_losses(const Bigram* m) { return m->losses; }
static void read_logits(const Bigram* m, int position, float* logits) {
    const int Vp = m->config.padded_vocab_size;
    std::vector<floatX> row(Vp);
    cudaCheck(cudaMemcpy(row.data(), m->logits + (size_t)position * Vp, Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < m->config.vocab_size; i++) logits[i] = to_float(row[i]);
}
static double model_flops_per_token(const Bigram*, int) { return 0; }  // a lookup: MFU "n/a"
static std::string model_summary(const Bigram* m) { return "bigram V=" + std::to_string(m->config.vocab_size); }
static std::string adapt_to_device(Bigram*, int, int) { return ""; }

#include "llmc/run/run.h"

// ---- the test: runs of the bigram through train<Bigram>, in this process
static int run_trainer(std::vector<std::string> args) {
    args.insert(args.begin(), "test_run_seam");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    try {
        return train<Bigram>((int)args.size(), argv.data());
    } catch (const llmc::Error& e) {
        printf("error: %s\n", e.what());
        return 1;
    }
}

// The val losses main.jsonl records, in step order.
static std::vector<double> val_losses(const std::string& dir) {
    std::vector<double> losses;
    FILE* f = fopen((dir + "/main.jsonl").c_str(), "r");
    if (!f) return losses;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        const char* key = strstr(line, "\"val_loss\"");
        double v;
        if (key && sscanf(key, "\"val_loss\":%lf", &v) == 1) losses.push_back(v);
    }
    fclose(f);
    return losses;
}

static std::vector<char> file_bytes(const std::string& path) {
    std::vector<char> bytes;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return bytes;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    fclose(f);
    return bytes;
}

int main() {
    const std::string root = scratch_path("test_run_seam");
    if (system(("rm -rf " + root + " && mkdir -p " + root).c_str()) != 0) return 1;
    const std::string whole = root + "/whole", split = root + "/split", resumed = root + "/resumed";
    // the built-in corpus (a Markov chain: a bigram can learn it), 3 micro-batches a step, samples every 10 steps
    const std::vector<std::string> common = {"-d", "1536", "-v", "10", "-m", "4", "-s", "10", "-g", "8", "-l", "0.05"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = common;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    const int rc_whole = run_trainer(with({"-x", "20", "-o", whole}));
    const std::vector<double> losses = val_losses(whole);
    CHECK(rc_whole == 0 && losses.size() == 3 && losses[2] < losses[0] - 0.5,
          "train<Bigram>: 20 steps, val loss %.4f at step 0, %.4f at step 20", losses.empty() ? 0.0 : losses[0],
          losses.size() < 3 ? 0.0 : losses[2]);
    // the folder's lock stays with this process: the resume goes on in a copy without it
    const int rc_first = run_trainer(with({"-x", "10", "-o", split}));
    const std::string copy = "cp -r " + split + " " + resumed + " && rm " + resumed + "/train.lock";
    const int rc_copy = system(copy.c_str());
    const int rc_resumed = run_trainer(with({"-x", "20", "-o", resumed, "-y", "1"}));
    bool same = true;
    for (const char* name : {"model_00000020.bin", "state_00000020_00000.bin"}) {
        const std::vector<char> a = file_bytes(whole + "/" + name), b = file_bytes(resumed + "/" + name);
        same = same && !a.empty() && a == b;
    }
    CHECK(rc_first == 0 && rc_copy == 0 && rc_resumed == 0 && same,
          "train<Bigram>: 10 steps, then -y 1 to 20, writes the model and state files of 20 straight steps byte for "
          "byte");
    if (g_tally.failed == 0 && system(("rm -rf " + root).c_str()) != 0) return 1;  // kept where a check failed
    return test_summary("test_run_seam");
}
