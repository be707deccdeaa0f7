// test_run_seam: the smallest model family, written as a trainer file is
// (docs/new_family.md walks through it): a bigram model (the logits of a token
// are one row of a V x Vp table) with its kernels, its step, its family table
// (llmc/run/family.h) and its own training loop, trained, evaluated, sampled,
// checkpointed and resumed through the services of llmc/run/ that
// train_gpt.cu's and train_llama3.cu's main call.
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
#include "llmc/run/run.h"
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
    BigramConfig config;
    floatX* logits;  // (B, T, Vp), dlogits after cross_entropy
    float* losses;   // (B, T)
    float* reduce;   // global_norm_scratch_floats()
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

// ---- the model: forward, loss, backward
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
static int document_start_token(const Bigram* m) { return m->config.vocab_size - 1; }

// ---- its shape, weights, files and activations
static bool parse_descriptor(const char* text, BigramConfig* c) {
    int V = 0, used = 0;
    if (sscanf(text, "V=%d%n", &V, &used) != 1 || text[used] != '\0' || V < 2 || V > 4096) return false;
    *c = BigramConfig{V, padded_vocab_size(V), 1024};
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
static std::vector<CheckpointFile> write_model_file(const Bigram* m, const std::vector<floatX>& weights,
                                                    const std::string& path) {
    const BigramConfig& c = m->config;
    return {write_model_weights(weights, path,
                                ModelFileHeader{0, c.max_seq_len, c.vocab_size, 0, 0, 0, c.padded_vocab_size})};
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
static void read_logits(const Bigram* m, int position, float* logits) {
    read_logits_row(m->logits, position, m->config.vocab_size, m->config.padded_vocab_size, logits);
}

// ---- one optimizer step: B_global = B_micro x N x A sequences (train_gpt.cu's, said again)
static void accumulate_gradients(Bigram* m, const StepBatch& batch) {
    const int A = batch.grad_accum_steps;
    stage_step(m, batch);
    const float dloss = loss_scale(batch);  // 1/G
    for (int micro_step = 0; micro_step < A; micro_step++) {
        const EncoderPlan plan = next_micro_batch(m, batch, micro_step);
        forward(m);
        cross_entropy(m, dloss, true);
        backward(m, plan.groups, plan.distinct_tokens, m->dist->num_processes > 1 && micro_step == A - 1);
    }
}
static StepResult train_step(Bigram* m, const StepBatch& batch, float lr, const OptimizerSettings& opt) {
    accumulate_gradients(m, batch);
    update_parameters(m, m->reduce, lr, opt);  // global norm, clip, AdamW
    return end_step(m, batch);
}

// ---- the family's table for the run's services (llmc/run/family.h)
static ModelFamily<Bigram, BigramConfig> bigram_family() {
    ModelFamily<Bigram, BigramConfig> f{};
    f.name = "bigram";
    f.init_default = "V=256";
    f.init_help = "model file .bin, or V=<tokens>";
    f.doc_token_help = "the token that starts a document (V-1 here)";
    f.recompute_help = "no effect (nothing to recompute)";
    f.builtin_init = "V=256";
    f.model_folder_files = {};  // one model file
    f.forward = forward;
    f.cross_entropy = cross_entropy;
    f.accumulate_gradients = accumulate_gradients;
    f.parse_descriptor = parse_descriptor;
    f.model_file_config = model_file_config;
    f.same_config = [](const BigramConfig& a, const BigramConfig& b) { return a == b; };
    f.describe = [](const BigramConfig& c) { return "bigram V=" + std::to_string(c.vocab_size); };
    f.configure_model = configure_model;
    f.vocab_size = [](const Bigram* m) { return m->config.vocab_size; };
    f.max_seq_len = [](const Bigram* m) { return m->config.max_seq_len; };
    f.document_start_token = document_start_token;
    f.flops_per_token = [](const Bigram*, int) { return 0.0; };  // a lookup: MFU "n/a"
    f.init_from_descriptor = init_from_descriptor;
    f.init_from_model_file = init_from_model_file;
    f.write_model_file = write_model_file;
    f.activation_buffers = activation_buffers;
    f.try_allocate_activations = try_allocate_activations;
    f.free_activations = free_activations;
    f.free_model = free_model;
    f.device_losses = [](const Bigram* m) -> const float* { return m->losses; };
    f.read_logits = read_logits;
    return f;
}
static const ModelFamily<Bigram, BigramConfig> BIGRAM_FAMILY = bigram_family();

// ---- main of a bigram trainer: the flags, the model, the data, the loop (train_gpt.cu's)
static int train_bigram(int argc, char** argv) {
    Run<Bigram, BigramConfig> run(&BIGRAM_FAMILY);
    Bigram& model = run.model;
    TrainOptions opt;
    start_run(&run, &argc, &argv, run_flags<TrainOptions>(BIGRAM_FAMILY), &opt);
    if (opt.memory_plan_only) {
        print_plan_only(&run);
        return end_run(&run);
    }
    build_model(&run);
    open_data(&run);
    print_run(&run);
    open_log(&run);
    for (int step = run.start_step; step <= run.steps; step++) {
        const bool last = step == run.steps;
        if (stopped_by_signal(&run, step)) break;
        evaluate_and_log(&run, step, last);
        if (last) break;
        const StepBatch batch = next_step_batch(&run.train_loader, &model, run.ramp.grad_accum_steps(step),
                                                opt.overfit_single_batch, &run.inputs, &run.targets);
        const float lr = learning_rate(&run, step);
        if (batch.global_targets == 0) {
            skip_empty_step(&run, step);
        } else {
            step_timer_start(&run);
            const StepResult result = train_step(&model, batch, lr, run.adamw);
            report_step(&run, step, result, lr, step_timer_ms(&run));
        }
        maybe_checkpoint(&run, step + 1);
    }
    return end_run(&run);
}

// ---- the test: runs of the bigram trainer, in this process
static int run_trainer(std::vector<std::string> args) {
    args.insert(args.begin(), "test_run_seam");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    try {
        return train_bigram((int)args.size(), argv.data());
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
          "the bigram trainer: 20 steps, val loss %.4f at step 0, %.4f at step 20", losses.empty() ? 0.0 : losses[0],
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
    CHECK(
        rc_first == 0 && rc_copy == 0 && rc_resumed == 0 && same,
        "the bigram trainer: 10 steps, then -y 1 to 20, writes the model and state files of 20 straight steps byte for "
        "byte");
    if (g_tally.failed == 0 && system(("rm -rf " + root).c_str()) != 0) return 1;  // kept where a check failed
    return test_summary("test_run_seam");
}
