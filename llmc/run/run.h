// llmc/run/run.h: the services a trainer's main calls around its training
// loop, the same for every model family: the flags (compatible with llm.c's),
// the ranks and the watchdog, the built-in corpus, the model from -e or a
// checkpoint, -b auto and the memory plan, the data, evaluation, sampling,
// checkpoints and logs. A trainer passes its family's table
// (llmc/run/family.h); its own loop (train_gpt.cu's main) calls these.
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/data/dataloader.h"
#include "llmc/run/distributed.h"
#include "llmc/error.h"
#include "llmc/run/flags.h"
#include "llmc/data/hellaswag.h"
#include "llmc/data/markov_corpus.h"
#include "llmc/run/mfu.h"
#include "llmc/step/params.h"
#include "llmc/run/run_checkpoint.h"
#include "llmc/run/run_agreement.h"
#include "llmc/run/run_control.h"
#include "llmc/run/run_log.h"
#include "llmc/run/run_model.h"
#include "llmc/run/schedulers.h"
#include "llmc/data/tokenizer.h"
#include "llmc/step/train_step.h"
#include "llmc/run/family.h"

// printf on rank 0 only: the ranks run in lock step and would print the same.
// Its arguments are evaluated on rank 0 only: work every rank must do (a
// setting chosen for the device) goes before it, never inside the call.
inline const Distributed* g_dist = &SINGLE_PROCESS;
#define print0(...)                                 \
    do {                                            \
        if (g_dist->rank == 0) printf(__VA_ARGS__); \
    } while (0)

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
    int optimizer;              // Optimizer
    float muon_lr;
    float muon_weight_decay;
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
    int doc_token;              // -1: the data's or the family's (document_token_for_run)
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

// --skip-nonfinite 1 stops the run at this many non-finite steps in a row: the weights
// have not moved since, and a run that only skips would end in a checkpoint of nothing learnt.
#define SKIP_NONFINITE_MAX 10
#define SKIP_NONFINITE_STR_(x) #x
#define SKIP_NONFINITE_STR(x) SKIP_NONFINITE_STR_(x)

// The one table of the flags (llmc/run/flags.h): parsing, the defaults and --help
// come from it (test_train_cli.sh checks docs/usage.md's flag table against --help).
constexpr double INT_TOP = FLAG_INT_TOP, LONG_TOP = FLAG_LONG_TOP, FLOAT_TOP = FLAG_FLOAT_TOP;
constexpr double STEP_TOP = 99999999;  // checkpoint names hold 8 digits of the step
// A trainer adds its family's own flags to these (train_gpt.cu: -ge); O is its
// options struct, derived from TrainOptions.
template <class O, class Model, class Config>
std::vector<Flag<O>> run_flags(const ModelFamily<Model, Config>& f) {
    return {
        {"-i", &TrainOptions::train_pattern, "<glob>", 0, 0, nullptr,
         "train data shards (llm.c format); without -i: the built-in Markov corpus\n(build/markov/, known loss floor) "
         "and a small model, 300 steps",
         "data and model"},
        {"-j", &TrainOptions::val_pattern, "<glob>", 0, 0, nullptr, "val data shards", nullptr},
        {"-e", &TrainOptions::init, "<init>", 0, 0, f.init_default, f.init_help, nullptr},
        {"--doc-mask", &TrainOptions::doc_mask, nullptr, 0, 1, "0",
         "attention within each document only (documents start at --doc-token)", nullptr},
        {"--doc-positions", &TrainOptions::doc_positions, nullptr, 0, 1, "0",
         "position ids restart at 0 at each document", nullptr},
        {"--doc-token", &TrainOptions::doc_token, "<int>", -1, INT_TOP, "-1", f.doc_token_help, nullptr},
        {"--packing", &TrainOptions::packing, nullptr, 0, 0, "packed",
         "packed: sequences cut from the token stream (llm.c); slots: one document per\nsequence, cut at T, the rest "
         "padded with masked targets",
         nullptr, DATA_PACKING_NAMES, "packing"},
        {"-b", &TrainOptions::B, "<int|auto>", 1, INT_TOP, "4",
         "micro-batch size B in sequences, or auto: the largest that fits",
         "batch: tokens per step = B x T x N x A (N ranks, A accumulated micro-batches)"},
        {"-t", &TrainOptions::T, "<int>", 1, INT_TOP, "1024", "sequence length T", nullptr},
        {"-d", &TrainOptions::total_batch_tokens, "<int>", -1, LONG_TOP, "-1",
         "tokens per optimizer step = B x T x N x A; -1: B x T x N, A = 1", nullptr},
        {"-x", &TrainOptions::max_steps, "<int>", -1, STEP_TOP, "-1",
         "optimizer steps; -1: one epoch of the train data", nullptr},
        {"--ramp-tokens", &TrainOptions::ramp_tokens, "<int>", 0, LONG_TOP, "0",
         "batch ramp: tokens per step at step 0, growing to -d; 0: off", nullptr},
        {"--ramp-steps", &TrainOptions::ramp_steps, "<int>", 0, STEP_TOP, "0", "batch ramp: steps to reach -d",
         nullptr},
        {"--ramp-lr", &TrainOptions::ramp_lr, nullptr, 0, 0, "none",
         "lr during the ramp: x 1, x tokens/target or x sqrt(tokens/target)", nullptr, RAMP_LR_NAMES, "ramp lr rule"},
        {"-k", &TrainOptions::schedule, nullptr, 0, 0, "cosine",
         "lr schedule after the warmup (wsd: flat, then linear over the last 20%)",
         "optimizer (AdamW, betas 0.9 and 0.95, eps 1e-8)", LR_SCHEDULE_NAMES, "schedule"},
        {"-l", &TrainOptions::lr, "<float>", 0, FLOAT_TOP, "3e-4", "peak learning rate", nullptr},
        {"-u", &TrainOptions::warmup_steps, "<int>", 0, INT_TOP, "0", "warmup steps", nullptr},
        {"-q", &TrainOptions::final_lr_fraction, "<float>", 0, 1, "1.0", "final lr as a fraction of the peak", nullptr},
        {"-c", &TrainOptions::weight_decay, "<float>", 0, FLOAT_TOP, "0.0", "weight decay of the matrices", nullptr},
        {"--optimizer", &TrainOptions::optimizer, nullptr, 0, 0, "adamw",
         "muon: Muon for the blocks' hidden matrices (Nesterov 0.95, 5 Newton-Schulz\nsteps), AdamW for the "
         "embeddings, the head, gains and biases; with several ranks each matrix on one\nowner rank",
         nullptr, OPTIMIZER_NAMES, "optimizer"},
        {"--muon-lr", &TrainOptions::muon_lr, "<float>", 0, FLOAT_TOP, "0.02",
         "Muon's peak lr (nanochat's), on -l's schedule (-k, -u, -q)", nullptr},
        {"--muon-wd", &TrainOptions::muon_weight_decay, "<float>", 0, FLOAT_TOP, "0.0",
         "Muon's decoupled weight decay of the matrices", nullptr},
        {"--grad-clip", &TrainOptions::grad_clip, "<float>", 0, FLOAT_TOP, "1.0",
         "clip the global gradient norm (0 = off)", nullptr},
        {"--skip-nonfinite", &TrainOptions::skip_nonfinite, nullptr, 0, 1, "0",
         "skip a step whose loss or gradient is Inf/NaN instead of stopping;\n" SKIP_NONFINITE_STR(
             SKIP_NONFINITE_MAX) " such steps in a row stop the run",
         nullptr},
        {"--seed", &TrainOptions::seed, "<int>", 0, LONG_TOP, "1337",
         "weight init, stochastic rounding and sampling seed", nullptr},
        {"-v", &TrainOptions::val_every, "<int>", 0, INT_TOP, "20",
         "val loss (and HellaSwag) every this many steps (0 = never)", "evaluation and sampling"},
        {"-m", &TrainOptions::val_batches, "<int>", 1, INT_TOP, "20", "val batches per rank", nullptr},
        {"-h", &TrainOptions::hellaswag, nullptr, 0, 1, "0", "HellaSwag accuracy at each evaluation (needs -b >= 4)",
         nullptr},
        {"--hellaswag-file", &TrainOptions::hellaswag_file, "<path>", 0, 0, "data/hellaswag/hellaswag_val.bin",
         "llm.c's eval .bin", nullptr},
        {"-s", &TrainOptions::sample_every, "<int>", 0, INT_TOP, "0", "sample every this many steps (0 = never)",
         nullptr},
        {"-g", &TrainOptions::sample_tokens, "<int>", 1, INT_TOP, "64", "tokens per sample", nullptr},
        {"--temperature", &TrainOptions::temperature, "<float>", 0, FLOAT_TOP, "1.0",
         "sampling temperature (0 = greedy)", nullptr},
        {"--top-k", &TrainOptions::top_k, "<int>", 0, INT_TOP, "0", "sample among the k most likely tokens (0 = all)",
         nullptr},
        {"--tokenizer", &TrainOptions::tokenizer, "<path>", 0, 0, nullptr,
         "llm.c tokenizer .bin to print samples as text (default: the GPT-2\nfiles in data/gpt2 or ../shared/data/gpt2 "
         "when V = 50257)",
         nullptr},
        {"-o", &TrainOptions::output_dir, "<dir>", 0, 0, nullptr,
         "output directory: main.log, main.jsonl, checkpoints (model_%08d.bin\nor the folder model_%08d/, "
         "state_%08d_%05d.bin, DONE_%08d), a checkpoint\nat the end",
         "checkpoints and memory"},
        {"-n", &TrainOptions::checkpoint_every, "<int>", 0, STEP_TOP, "0",
         "checkpoint every this many steps (0 = only at the end)", nullptr},
        {"-nk", &TrainOptions::checkpoint_keep, "<int>", 0, INT_TOP, "0",
         "keep only the newest this many checkpoints (0 = all)", nullptr},
        {"-y", &TrainOptions::resume, nullptr, 0, 1, "0", "resume from the newest complete checkpoint in -o", nullptr},
        {"-z", &TrainOptions::zero_stage, nullptr, 0, 3, "0",
         "ZeRO stage: 1 shards master weights and AdamW m, v over the ranks; 2 also the fp32\ngradient (a "
         "2-layer staging buffer; every micro-batch communicates); 3 also the layers'\nweights (each layer "
         "all-gathered into a 2-layer staging before its forward and\nbackward)",
         nullptr},
        {"-r", &TrainOptions::recompute, nullptr, 0, 3, "0", f.recompute_help, nullptr},
        {"--memory-plan", &TrainOptions::memory_plan_only, nullptr, 0, 1, "0",
         "1: print the device memory plan and exit", nullptr},
        {"-a", &TrainOptions::overfit_single_batch, nullptr, 0, 1, "0", "overfit the first batch", nullptr},
        {"--stall-timeout", &TrainOptions::stall_timeout, "<float>", 0, FLOAT_TOP, "0",
         "seconds a step, evaluation, checkpoint or collective may take before every rank\nstops the job "
         "(0: 10 x the median step time, at least 600)",
         "reliability"},
    };
}

template <class O>
void print_usage(const char* program, const char* family_name, const std::vector<Flag<O>>& flags) {
    printf("Usage: %s [flags]   (%s training; %s build)\n", program, family_name, PRECISION_NAME);
    flags_print_help(flags);
    printf("%s.\n", distributed_build_note());
}

// The first flag that needs the token starting a document (--doc-token), or null.
inline const char* document_token_user(const TrainOptions& o) {
    return (DataPacking)o.packing == DataPacking::Slots ? "--packing slots"
           : o.doc_mask                                 ? "--doc-mask"
           : o.doc_positions                            ? "--doc-positions"
           : o.sample_every > 0                         ? "-s"
           : o.hellaswag                                ? "-h"
                                                        : nullptr;
}

// -o is a folder's name: not empty or blank, and not one that reads as a flag (a
// forgotten value: "-o --help", or "-o -" for stdout, would create such a folder).
inline void check_output_dir(const char* dir) {
    if (!dir) return;
    bool blank = true;
    for (const char* c = dir; *c; c++) blank = blank && isspace((unsigned char)*c);
    if (blank) llmc::failf("-o \"%s\": expected a folder's name, not blank", dir);
    if (dir[0] == '-') llmc::failf("-o %s: expected a folder's name, not one starting with '-' (give ./%s)", dir, dir);
}

// A flag whose value would be ignored, or would mean what --help does not
// say, is refused: the run would not be the one asked for.
inline void refuse_ignored_flags(const TrainOptions& o, const std::set<std::string>& given) {
    if (o.max_steps == 0)
        llmc::failf("-x 0: give the number of optimizer steps (-x -1 is one epoch of the train data)");
    check_output_dir(o.output_dir);
    if (given.count("--doc-token") && !document_token_user(o))
        llmc::failf("--doc-token %d: no flag uses it (--packing slots, --doc-mask, --doc-positions, -s or -h do)",
                    o.doc_token);
    if (!o.output_dir) {
        if (o.resume) llmc::failf("-y 1: resuming needs the run's -o folder");
        for (const char* flag : {"-n", "-nk"})
            if (given.count(flag)) llmc::failf("%s: checkpoints need -o (the folder they are written to)", flag);
    }
    if ((Optimizer)o.optimizer == Optimizer::Muon && o.zero_stage == 3)
        llmc::failf("--optimizer muon with -z 3: a Muon owner needs its matrices' whole weights, which ZeRO-3 shards; "
                    "use -z 2");
    if ((Optimizer)o.optimizer != Optimizer::Muon)
        for (const char* flag : {"--muon-lr", "--muon-wd"})
            if (given.count(flag)) llmc::failf("%s: Muon's setting needs --optimizer muon", flag);
    if (o.ramp_tokens > 0 && o.ramp_steps == 0)
        llmc::failf("--ramp-tokens %ld: a batch ramp needs --ramp-steps too (the steps to reach -d)", o.ramp_tokens);
    if (o.ramp_steps > 0 && o.ramp_tokens == 0)
        llmc::failf("--ramp-steps %d: a batch ramp needs --ramp-tokens too (the tokens per step at step 0)",
                    o.ramp_steps);
}

template <class O>
void parse_options(int argc, char** argv, const char* family_name, const std::vector<Flag<O>>& flags, O* o,
                   std::set<std::string>* given) {
    *o = O{};
    if (!flags_parse(flags, argc, argv, o, given)) {  // --help
        if (g_dist->rank == 0) print_usage(argv[0], family_name, flags);
        distributed_exit_success();
    }
    refuse_ignored_flags(*o, *given);
}

// With no -i: the built-in corpus, documents from a random sparse Markov chain
// whose loss floor (the entropy of its next-token distribution) is known
// exactly, and a small model that gets close to it in about a minute on two
// CPU cores. Flags given on the command line still win.
constexpr const char* BUILTIN_CORPUS_DIR = "build/markov";
inline void use_builtin_corpus(TrainOptions* o, const std::set<std::string>& given, const char* builtin_init) {
    if (!o->memory_plan_only)  // the plan needs the model's defaults, not the data
        markov_corpus_write(BUILTIN_CORPUS_DIR, MARKOV_DEFAULT_SEED, MARKOV_DEFAULT_TRAIN_TOKENS,
                            MARKOV_DEFAULT_VAL_TOKENS, MARKOV_DEFAULT_VOCAB);
    static const std::string train = markov_corpus_train_path(BUILTIN_CORPUS_DIR);
    static const std::string val = markov_corpus_val_path(BUILTIN_CORPUS_DIR);
    auto unset = [&](const char* flag) { return given.count(flag) == 0; };
    o->train_pattern = train.c_str();
    if (unset("-j")) o->val_pattern = val.c_str();
    if (unset("-e")) o->init = builtin_init;
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
inline int grad_accum_steps_for(long total_batch_tokens, int B, int T, int num_processes) {
    long micro_tokens;  // ((long)B * T fits: both are ints)
    if (__builtin_mul_overflow((long)B * T, (long)num_processes, &micro_tokens))
        llmc::failf("B x T x N = %d x %d x %d tokens is more than a long holds", B, T, num_processes);
    if (total_batch_tokens == -1) return 1;
    if (total_batch_tokens <= 0 || total_batch_tokens % micro_tokens != 0) {
        const long lower = std::max(1L, total_batch_tokens / micro_tokens) * micro_tokens;
        long upper;
        char other[48] = "";
        if (!__builtin_add_overflow(lower, micro_tokens, &upper)) snprintf(other, sizeof other, " or -d %ld", upper);
        llmc::failf("-d %ld is not a multiple of B x T x N = %d x %d x %d = %ld tokens; try -d %ld%s",
                    total_batch_tokens, B, T, num_processes, micro_tokens, lower, other);
    }
    const long A = total_batch_tokens / micro_tokens;
    if (A > INT_MAX)
        llmc::failf("-d %ld: %ld micro-batches of B x T x N = %ld tokens per step, more than %d", total_batch_tokens, A,
                    micro_tokens, INT_MAX);
    return (int)A;
}

// -e is a descriptor where it reads as one and holds no '/', whatever the
// folder holds (an earlier -o d12 must not shadow d12); a file named like a
// descriptor is given with a '/' (./d12). Anything else is a model file.
template <class Model, class Config>
bool init_is_descriptor(const ModelFamily<Model, Config>& f, const char* init) {
    Config c;
    return strchr(init, '/') == nullptr && f.parse_descriptor(init, &c);
}

// The model's shape from -e without loading anything (the memory plan).
template <class Model, class Config>
Config read_config(const ModelFamily<Model, Config>& f, const char* init) {
    Config c;
    struct stat st;
    if (init_is_descriptor(f, init)) {
        f.parse_descriptor(init, &c);
        return c;
    }
    if (stat(init, &st) != 0) llmc::failf("-e %s: not a model file or a model descriptor", init);
    return f.model_file_config(init);
}

template <class Model, class Config>
void print_memory_plan(const ModelFamily<Model, Config>& f, Model* model, int B, int T, int recompute) {
    const MemoryPlan plan = memory_plan(f, model, B, T, recompute);
    size_t free_bytes = 0, device_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &device_bytes));
    const double MiB = 1048576.0;
    print0("memory plan per rank (B=%d, T=%d, recompute %d, ZeRO-%d over %d ranks):\n", B, T, recompute,
           model->zero_stage, model->dist->num_processes);
    for (const auto& line : plan.lines) print0("  %-34s %10.1f MiB\n", line.first.c_str(), line.second / MiB);
    print0("  %-34s %10.1f MiB of %.1f MiB on the device%s\n", "total", plan.total / MiB, device_bytes / MiB,
           plan.total <= device_bytes ? "" : " (does not fit)");
}

// -b auto: the largest micro-batch whose activations fit (from the plan),
// confirmed by allocating them (on out-of-memory, the next smaller one), the
// smallest of the ranks' choices, then a trial forward and backward. With -d the tokens per step stay:
// B must divide the sequences each rank takes per step.
// -b auto with -d: the sequences each rank takes per step (0: no -d).
inline long auto_sequences_per_rank(long total_batch_tokens, int T, int N) {
    if (total_batch_tokens > 0 && total_batch_tokens % ((long)T * N) != 0)
        llmc::failf("-b auto: -d %ld is not a multiple of T x N = %ld", total_batch_tokens, (long)T * N);
    return total_batch_tokens > 0 ? total_batch_tokens / ((long)T * N) : 0;
}

template <class Model, class Config>
int choose_micro_batch(const ModelFamily<Model, Config>& f, Model* model, int T, int recompute, long total_batch_tokens,
                       int data_cap) {
    const int N = model->dist->num_processes;
    const long sequences_per_rank = auto_sequences_per_rank(total_batch_tokens, T, N);
    size_t free_bytes = 0, device_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &device_bytes));
    int B = (int)std::min<long>(sequences_per_rank > 0 ? sequences_per_rank : 4096, std::min(data_cap, 4096));
    while ((B = largest_fitting_batch(f, model, T, recompute, (size_t)(free_bytes * 0.98), B, sequences_per_rank)) >
           0) {
        if (f.try_allocate_activations(model, B, T, grad_accum_steps_for(total_batch_tokens, B, T, N), recompute))
            break;
        print0("-b auto: B=%d does not fit after all; trying smaller\n", B);
        B -= 1;
    }
    if (B == 0 && sequences_per_rank > 0 && data_cap < sequences_per_rank &&
        largest_fitting_batch(f, model, T, recompute, (size_t)(free_bytes * 0.98), data_cap, 0) > 0)
        llmc::failf(
            "-b auto: no B up to %d (what the data holds) divides the %ld sequences per rank that -d %ld asks for",
            data_cap, sequences_per_rank, total_batch_tokens);
    if (B == 0)
        llmc::failf(
            "-b auto: not even B=1 fits at T=%d (%.1f MiB free); try -r 2, a smaller -t or more ranks with -z 1", T,
            free_bytes / 1048576.0);
    // every rank takes the smallest B that fits on every rank: the tokens per
    // step (B x T x N x A) must be the same number everywhere
    const uint64_t mine = B;
    const std::vector<uint64_t> all = host_all_gather(&mine, 1, model->dist);
    const int agreed = (int)*std::min_element(all.begin(), all.end());
    if (agreed < B) {
        f.free_activations(model);
        allocate_activations(f, model, agreed, T, grad_accum_steps_for(total_batch_tokens, agreed, T, N), recompute);
    }
    std::vector<int> tokens((size_t)agreed * T, 0);  // a trial step without the update
    f.accumulate_gradients(model, whole_batch(model, tokens.data(), tokens.data(), 1));
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, gradient_elements(model) * sizeof(float), model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    return agreed;
}

// Prints samples as text where a tokenizer is at hand, else as token ids.
inline std::string sample_text(const std::vector<int>& tokens, const llmc::Tokenizer* tokenizer) {
    if (tokenizer) return tokenizer->decode(tokens);
    std::string text;
    for (int t : tokens) text += std::to_string(t) + " ";
    return text;
}

// A tokenizer with fewer tokens than the model could not print every sample:
// refused before training, not at the first sample.
inline std::unique_ptr<llmc::Tokenizer> load_tokenizer(const TrainOptions& opt, int vocab_size) {
    std::unique_ptr<llmc::Tokenizer> t;
    if (opt.tokenizer) t = std::make_unique<llmc::Tokenizer>(llmc::Tokenizer::from_bin(opt.tokenizer));
    const std::string dir = llmc::find_gpt2_dir();
    if (!opt.tokenizer && vocab_size == 50257 && !dir.empty())
        t = std::make_unique<llmc::Tokenizer>(
            llmc::Tokenizer::from_gpt2_files(dir + "/encoder.json", dir + "/vocab.bpe"));
    if (t && t->vocab_size() < vocab_size)
        llmc::failf(
            "--tokenizer %s: %d tokens, fewer than the model's vocabulary of %d (a sample could not be printed)",
            opt.tokenizer, t->vocab_size(), vocab_size);
    return t;
}

// -o becomes this run's: the folder exists (created here), rank 0 holds its
// lock for the whole run, and a fresh run (-y 0) refuses a folder that holds
// checkpoint files (of another run, or of this one: resume it with -y 1), so
// no run ever overwrites or prunes what another wrote.
inline FolderLock claim_output_dir(const char* dir, const Distributed* d) {
    FolderLock lock;
    if (d->rank == 0) {
        struct stat st;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            const std::string parent = checkpoint_parent_dir_(dir);
            if (errno == ENOENT) llmc::failf("-o %s: cannot create the folder: %s does not exist", dir, parent.c_str());
            llmc::failf("-o %s: cannot create the folder in %s (%s)", dir, parent.c_str(), strerror(errno));
        }
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) llmc::failf("-o %s: not a folder", dir);
        try {
            lock = checkpoint_lock_dir(dir);
        } catch (const llmc::Error& e) {
            llmc::failf("-o %s", e.what());
        }
    }
    host_barrier(d);  // the folder is there and locked
    return lock;
}

// A fresh run in a folder with checkpoint files refuses.
inline void refuse_foreign_checkpoints(const char* dir, const Distributed* d) {
    if (d->rank != 0) return;
    const std::vector<int> steps = checkpoint_steps_with_files(dir);
    if (steps.empty()) return;
    llmc::failf(
        "-o %s holds checkpoint files (steps %d..%d) of an earlier run; resume it with -y 1, or give a new folder", dir,
        steps.front(), steps.back());
}

// Whether any rank got a stop signal (every rank asks at the same point of
// every step, so they all stop after the same step).
inline bool stop_requested(const Distributed* d) { return host_sum(stop_signal() ? 1 : 0, d) > 0; }

// What ZeRO-1 saves: master weights, m and v (12 bytes per parameter) live on
// one rank in N, plus a gradient shard of 4 bytes per owned element.
template <class Model>
void print_optimizer_memory(const Model& model) {
    const double MiB = 1048576.0, full = 12.0 * model.num_parameters / MiB;
    const std::vector<size_t> owned = muon_owner_elements(&model);
    const size_t most = *std::max_element(owned.begin(), owned.end()),
                 least = *std::min_element(owned.begin(), owned.end());
    if (most > 0)
        print0("Muon: each matrix orthogonalised by one owner rank, which sends its bf16 weights to the others; "
               "%zu to %zu matrix elements per rank\n",
               least, most);
    if (model.zero_stage == 0) {
        print0("optimizer state per rank: %.1f MiB (fp32 master weights, m, v)\n", full);
        return;
    }
    const double sharded = 16.0 * model.optimizer_elements / MiB;
    print0("optimizer state per rank: %.1f MiB with ZeRO-%d (master, m, v and the gradient shard of %zu elements), "
           "%.1f MiB without: saves %.1f MiB per rank\n",
           sharded, model.zero_stage, model.optimizer_elements, full, full - sharded);
    if (stages_gradients(&model))
        print0("fp32 gradient per rank: %.1f MiB of staging (2 layers and the tensors outside them) and a %.1f MiB "
               "receive buffer, %.1f MiB without ZeRO-2\n",
               4.0 * gradient_elements(&model) / MiB, 4.0 * receive_elements(&model) / MiB,
               4.0 * model.num_parameters / MiB);
    const double X = sizeof(floatX);
    if (stages_weights(&model))
        print0("weights per rank: %.1f MiB of staging (2 layers and the tensors outside them, whole) and a %.1f MiB "
               "shard of the layers', %.1f MiB without ZeRO-3\n",
               X * weight_elements(&model) / MiB, X * model.weight_shard_elements / MiB,
               X * model.num_parameters / MiB);
}

// ---- the run -------------------------------------------------------------------
// Everything one training run holds from its start to its end.
template <class Model, class Config>
struct Run {
    const ModelFamily<Model, Config>* family;
    explicit Run(const ModelFamily<Model, Config>* f) : family(f) {}
    TrainOptions opt;
    const Distributed* dist;
    Watchdog* watchdog;
    Model model;
    DataLoader train_loader, val_loader;
    LRScheduler scheduler;
    BatchRamp ramp;
    OptimizerSettings adamw;
    DataPacking packing;
    RampLRScaling ramp_lr;
    int start_step = 0, steps = 0;  // steps: the run ends after this one
    int resume_step = -1;           // the checkpoint resumed from, or -1
    bool init_given = false;        // -e was on the command line (not its default)
    int saved_step = -1;            // the newest checkpoint this run wrote
    CheckpointFolder folder;        // -o (llmc/formats/checkpoint.h): owner, lock, what pruning may delete
    ResumeInfo resumed{RESUME_MAGIC, 0, {}, 0};
    bool has_floor = false;         // the val data carries its loss floor (the built-in corpus)
    double loss_floor = 0, initial_gap = 0;
    std::vector<HellaSwagExample> hellaswag;
    std::unique_ptr<llmc::Tokenizer> tokenizer;
    RunLog log;
    std::vector<int> inputs, targets;  // this rank's part of the step's A micro-batches (next_step_batch)
    cudaEvent_t step_start = nullptr, step_end = nullptr;  // the step's device time (step_timer_*)
    Distributed ranks;                 // (dist points here once start_run has started MPI)
    std::vector<AgreedValue> flag_values;  // every flag's value as parsed, for the ranks to compare
    double peak_flops = 0, flops_token = 0, recent_ms = 0;  // recent_ms: mean step time, for the ETA
    int timed_steps = 0;
    int compute_major = 0;  // the device's compute capability (a family may adapt to it)
    int nonfinite_in_a_row = 0;  // steps skipped by --skip-nonfinite since the last one taken
};

// The model's shape, for the "model:" line and errors.
template <class Model, class Config>
std::string model_summary(const Run<Model, Config>* run) {
    return run->family->describe(run->family->config(&run->model));
}

// The flags, the built-in corpus where no -i is given, and the named choices.
template <class O, class Model, class Config>
void configure_run(Run<Model, Config>* run, int argc, char** argv, const std::vector<Flag<O>>& flags, O* options) {
    std::set<std::string> given;
    parse_options(argc, argv, run->family->name, flags, options, &given);
    run->init_given = given.count("-e") > 0;
    if (!options->train_pattern) use_builtin_corpus(options, given, run->family->builtin_init);
    for (const Flag<O>& f : flags) run->flag_values.push_back({f.name, flag_value_text(f, *options)});
    TrainOptions& opt = run->opt;
    opt = *options;
    // the enumerated flags hold their choice's index (llmc/run/flags.h), in the enum's order
    run->scheduler = LRScheduler{(LRSchedule)opt.schedule, opt.lr, opt.warmup_steps, 0, opt.final_lr_fraction};
    run->packing = (DataPacking)opt.packing;
    run->ramp_lr = (RampLRScaling)opt.ramp_lr;
    if (run->ramp_lr != RampLRScaling::None && opt.ramp_tokens == 0)
        llmc::failf("--ramp-lr %s: there is no batch ramp to scale the lr of (give --ramp-tokens and --ramp-steps)",
                    RAMP_LR_NAMES[opt.ramp_lr]);
    run->adamw.weight_decay = opt.weight_decay;
    run->adamw.muon_lr_per_lr = opt.lr > 0 ? opt.muon_lr / opt.lr : 0.0f;
    run->adamw.muon_weight_decay = opt.muon_weight_decay;
    run->model.optimizer = opt.optimizer;
    run->adamw.grad_clip = opt.grad_clip;
    run->adamw.seed = opt.seed;
    run->model.dist = run->dist;
    run->model.zero_stage = opt.zero_stage;
    run->model.doc_mask = opt.doc_mask;
    run->model.doc_positions = opt.doc_positions;
}

// The flags checked against the model's shape and against each other, for micro-batch B,
// where neither the data nor the device's memory is needed: a run makes these checks
// before it allocates its activations and --memory-plan 1 before its plan (a plan of a run
// that would be refused tells nothing). Returns A, the micro-batches per step.
template <class Model, class Config>
int check_run_settings(const Run<Model, Config>* run, int B) {
    const TrainOptions& opt = run->opt;
    const int N = run->dist->num_processes;
    check_sequence_length(run->family->max_seq_len(&run->model), opt.T);
    check_doc_token(opt, run->family->vocab_size(&run->model));
    const int A = grad_accum_steps_for(opt.total_batch_tokens, B, opt.T, N);
    const long tokens_per_step = (long)B * opt.T * N * A;
    if (opt.ramp_tokens > tokens_per_step)
        llmc::failf("--ramp-tokens %ld: more than the %ld tokens per step the ramp grows to (-d)", opt.ramp_tokens,
                    tokens_per_step);
    if (opt.hellaswag && B < hellaswag_rows_needed())
        llmc::failf("-h 1: HellaSwag needs -b >= %d (4 endings per example)", hellaswag_rows_needed());
    return A;
}

// --memory-plan 1 -b auto: the B a run would choose from the same plan (the
// largest whose activations fit in 98% of what the weights, the optimizer's
// state and cuBLASLt's workspace leave of the device), on a device with
// nothing else on it; a run reads the free memory, which the CUDA context has
// already taken a little of.
template <class Model, class Config>
int plan_auto_batch(const ModelFamily<Model, Config>& f, Model* model, int T, int recompute, long total_batch_tokens) {
    const long sequences_per_rank = auto_sequences_per_rank(total_batch_tokens, T, model->dist->num_processes);
    size_t free_bytes = 0, device_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &device_bytes));
    const size_t fixed = total_bytes(parameter_buffers(model)) + CUBLASLT_WORKSPACE_BYTES;
    const size_t available = device_bytes > fixed ? (size_t)((device_bytes - fixed) * 0.98) : 0;
    const int max_B = (int)(sequences_per_rank > 0 ? std::min(sequences_per_rank, 4096L) : 4096);
    const int B = largest_fitting_batch(f, model, T, recompute, available, max_B, sequences_per_rank);
    if (B == 0)
        llmc::failf("-b auto: not even B=1 fits at T=%d beside the weights and optimizer state (%.1f of %.1f MiB); "
                    "try -r 3, a smaller -t or more ranks with -z 1 or 2",
                    T, fixed / 1048576.0, device_bytes / 1048576.0);
    print0("-b auto: B=%d, the largest micro-batch whose activations fit in 98%% of the %.1f MiB the rest leaves\n", B,
           (device_bytes - fixed) / 1048576.0);
    return B;
}

// --memory-plan 1: the plan of -e at -b, -t, -r, after the checks a run makes of the
// flags that need no data; nothing allocated.
template <class Model, class Config>
void print_plan_only(Run<Model, Config>* run) {
    Model* model = &run->model;
    const ModelFamily<Model, Config>& f = *run->family;
    f.set_config(model, read_config(f, run->opt.init));
    f.configure_model(model);
    const int B = run->opt.B > 0
                      ? run->opt.B
                      : plan_auto_batch(f, model, run->opt.T, run->opt.recompute, run->opt.total_batch_tokens);
    check_run_settings(run, B);
    print_memory_plan(f, model, B, run->opt.T, run->opt.recompute);
}

// Whether the run reads the val data (-j, and -v > 0).
inline bool reads_val(const TrainOptions& opt) { return opt.val_pattern && opt.val_every > 0; }

// Every rank of a job runs with the same flags (each flag's value as parsed,
// in the table's order) and the same data, compared before the first
// collective that depends on them (-b auto's, the model's, the data's).
template <class Model, class Config>
void agree_on_flags_and_data(Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    if (run->dist->num_processes == 1) return;
    run->watchdog->mark("comparing the ranks' flags and data");
    std::vector<AgreedValue> values = run->flag_values;
    // (every rank lists both, read or not, so that the lists have one length)
    const bool reads_train = !opt.memory_plan_only, reads_validation = reads_train && reads_val(opt);
    values.push_back({"the -i data", reads_train ? shards_identity(opt.train_pattern) : "(not read)"});
    values.push_back({"the -j data", reads_validation ? shards_identity(opt.val_pattern) : "(not read)"});
    require_ranks_agree(values, run->dist);
}

// ... and starts from the same model (-e, or the checkpoint resumed): its
// shape and weights, before -b auto's trial step, whose collectives would not
// match between models of different shapes.
template <class Model, class Config>
void agree_on_model(Run<Model, Config>* run) {
    Model& model = run->model;
    if (run->dist->num_processes == 1) return;
    run->watchdog->mark("comparing the ranks' models");
    require_ranks_agree(
        {{"the model's shape", model_summary(run) + ", " + std::to_string(model.num_parameters) + " parameters"}},
        run->dist);
    // (after the shape: under ZeRO-3 the hash gathers the layers, collectives of the shape's sizes)
    require_ranks_agree({{"the model's weights", weights_identity(&model)}}, run->dist);
}

// The largest B the data holds (for -b auto): the train loader reads N x B
// sequences per micro-batch, the val loader B per rank, where it is read. A B
// larger than the device alone would allow is capped with a note.
template <class Model, class Config>
int data_batch_cap(Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    const int N = run->dist->num_processes;
    const int doc = run->model.doc_token;
    const uint64_t train = dataloader_count_sequences(opt.train_pattern, opt.T, run->packing, doc);
    const uint64_t val = reads_val(opt) ? dataloader_count_sequences(opt.val_pattern, opt.T, run->packing, doc)
                                        : UINT64_MAX;
    const bool by_val = val < train / N;
    const uint64_t cap = std::min<uint64_t>({train / N, val, (uint64_t)INT_MAX});
    const char* which = by_val ? "val data (-j; -v 0 does not read it)" : "train data (read N x B at a time)";
    if (cap == 0) llmc::failf("-b auto: the %s holds too few sequences of T=%d for B=1", which, opt.T);
    if (cap < 4096)
        print0("-b auto: B at most %llu: the %s holds %llu sequences of T=%d\n", (unsigned long long)cap, which,
               (unsigned long long)(by_val ? val : train), opt.T);
    return (int)cap;
}

inline void check_doc_token(const TrainOptions& opt, int V) {
    if (opt.doc_token >= V)
        llmc::failf("--doc-token %d: not a token of the model's vocabulary (V=%d)", opt.doc_token, V);
}

// The token that starts a document, for --packing slots, --doc-mask,
// --doc-positions, samples (-s) and HellaSwag's padding (-h): --doc-token; else
// the EOT that a built-in-corpus shard records (the first train shard); else
// the family's for its vocabulary (document_start_token). Where none is known
// (-1) and a flag needs one, the run stops and asks for --doc-token: a wrong
// token would silently mix or split documents.
template <class Model, class Config>
int document_token_for_run(const Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    const int V = run->family->vocab_size(&run->model);
    check_doc_token(opt, V);
    if (opt.doc_token >= 0) return opt.doc_token;
    MarkovShardInfo corpus;
    const std::vector<std::string> shards = dataloader_find_shards(opt.train_pattern);
    const bool recorded = markov_corpus_info(shards[0].c_str(), &corpus) && corpus.eot >= 0 && corpus.eot < V;
    const int token = recorded ? corpus.eot : run->family->document_start_token(&run->model);
    const char* needs = document_token_user(opt);
    if (token < 0 && needs)
        llmc::failf("%s: the token that starts a document is not known for %s with V=%d; give it with --doc-token <id>",
                    needs, run->family->name, V);
    return token;
}

// The document token from the model's shape alone (read_config: a descriptor,
// a model file's header, a folder's config.json), before its weights are read
// or drawn: a --doc-token outside the vocabulary, or a vocabulary whose token
// is not known, stops the run before a load of minutes or a large allocation.
// (A resumed run has read its checkpoint's files once already, for their
// checksums.) Where -e is neither a model file nor a descriptor, the load
// says so.
template <class Model, class Config>
void decide_document_token(Run<Model, Config>* run, const char* weights, bool from_file) {
    if (!from_file && !init_is_descriptor(*run->family, weights)) return;
    run->family->set_config(&run->model, read_config(*run->family, weights));
    run->model.doc_token = document_token_for_run(run);
}

// A resumed run trains the checkpoint's model (its config, read by
// decide_document_token): a -e of another shape contradicts it and is refused,
// naming both, rather than dropped without a word.
template <class Model, class Config>
void check_init_matches_checkpoint(Run<Model, Config>* run) {
    if (!run->init_given) return;
    const Config init = read_config(*run->family, run->opt.init);
    if (!run->family->same_config(init, run->family->config(&run->model)))
        llmc::failf("-e %s: not the model of the checkpoint of step %d in %s (%s); -y 1 resumes that one (leave -e "
                    "out, or give another -o)",
                    run->opt.init, run->resume_step, run->opt.output_dir, model_summary(run).c_str());
}

// The model: the newest complete checkpoint of -o that passes its checks
// (with -y 1), else -e (a model file or a descriptor); then its activations.
template <class Model, class Config>
void build_model(Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    Model* model = &run->model;
    CheckpointFolder& folder = run->folder;
    // the data is there before the model is built (minutes for a large one)
    const char* const patterns[] = {opt.train_pattern,
                                    opt.val_pattern};  // (nvcc: no braced list in a template's range-for)
    for (const char* pattern : patterns)
        if (pattern) dataloader_find_shards(pattern);
    if (opt.output_dir) {
        folder.dir = opt.output_dir;
        folder.keep_last = opt.checkpoint_keep;
        folder.folder_files = run->family->model_folder_files;
        folder.lock = claim_output_dir(opt.output_dir, run->dist);
    }
    if (opt.output_dir && !opt.resume) refuse_foreign_checkpoints(opt.output_dir, run->dist);
    run->resume_step = opt.resume ? choose_resume_step(opt.output_dir, run->dist, folder.folder_files, &folder.run_id)
                                  : -1;
    // (only rank 0 writes DONE markers and deletes)
    if (opt.resume && folder.run_id.empty() && run->dist->rank == 0)
        folder.run_id = checkpoint_unfinished_run_id(opt.output_dir);  // no complete checkpoint: the run's first
    if (folder.run_id.empty()) folder.run_id = checkpoint_new_run_id();
    if (opt.resume && run->dist->rank == 0)
        checkpoint_remove_unfinished(opt.output_dir, folder.run_id, folder.folder_files);
    struct stat st;
    const std::string weights =
        run->resume_step >= 0 ? model_path(opt.output_dir, run->resume_step, folder.folder_files) : opt.init;
    const bool from_file = !init_is_descriptor(*run->family, weights.c_str()) && stat(weights.c_str(), &st) == 0;
    decide_document_token(run, weights.c_str(), from_file);
    if (run->resume_step >= 0) {
        check_init_matches_checkpoint(run);
        folder.proven.push_back(run->resume_step);  // every rank checked its files against the DONE
        run->resumed = load_checkpoint(*run->family, model, opt.output_dir, run->resume_step);
        print0("resuming from step %d of %s%s\n", run->resume_step, opt.output_dir,
               run->init_given ? "" : ", its model (no -e given)");
    } else {
        if (opt.resume) print0("no complete checkpoint in %s: starting from -e\n", opt.output_dir);
        if (from_file) run->family->init_from_model_file(model, opt.init);
        else run->family->init_from_descriptor(model, opt.init, opt.seed);
    }
    agree_on_model(run);
    run->start_step = std::max(run->resume_step, 0);
    run->initial_gap = run->resumed.initial_val_gap;
    run->watchdog->mark(opt.B == 0 ? "-b auto: choosing the micro-batch (a trial step)" : "allocating the activations");
    if (opt.B == 0)
        run->opt.B =
            choose_micro_batch(*run->family, model, opt.T, opt.recompute, opt.total_batch_tokens, data_batch_cap(run));
}

// B_global = B_micro x N x A sequences per step (a batch ramp raises A from a
// smaller start up to it), the data, and what evaluation and sampling need.
template <class Model, class Config>
void open_data(Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    Model* model = &run->model;
    const int N = run->dist->num_processes, rank = run->dist->rank, V = run->family->vocab_size(model);
    const int grad_accum_steps = check_run_settings(run, opt.B);
    const long micro_tokens_all = (long)opt.B * opt.T * N, tokens_per_step = micro_tokens_all * grad_accum_steps;
    run->ramp = BatchRamp{opt.ramp_tokens, opt.ramp_steps, tokens_per_step, micro_tokens_all, run->ramp_lr};
    if (model->B == 0)
        allocate_activations(*run->family, model, opt.B, opt.T, grad_accum_steps,
                             opt.recompute);  // (-b auto allocated them)
    run->watchdog->mark("opening the data");
    // Every rank reads the whole global micro-batch (N x B sequences) and
    // trains on its B of them (next_step_batch). Val batches are split by rank.
    dataloader_init(&run->train_loader, opt.train_pattern, N * opt.B, opt.T, 0, 1, V, false, opt.seed, run->packing,
                    model->doc_token);
    if (run->resume_step >= 0) dataloader_restore(&run->train_loader, run->resumed.train_data);
    if (reads_val(opt))
        dataloader_init(&run->val_loader, opt.val_pattern, opt.B, opt.T, rank, N, V, false, opt.seed, run->packing,
                        model->doc_token);
    run->steps = opt.max_steps > 0 ? opt.max_steps
                                   : std::max(1L, (long)(run->train_loader.num_tokens / tokens_per_step));
    const int resumed = run->resume_step;
    if (resumed > run->steps)
        llmc::failf("-x %d: the run resumed from step %d is already past it (give -x > %d, or another -o)", run->steps,
                    resumed, resumed);
    // a step reads at most tokens_per_step / T sequences (fewer in a ramp)
    const uint64_t next_sequence = run->resumed.train_data.next_sequence;
    if (resumed >= 0 && next_sequence > (uint64_t)resumed * (tokens_per_step / opt.T))
        llmc::failf("%s: data position %llu is beyond the %ld sequences that %d steps read",
                    checkpoint_state_path(opt.output_dir, resumed, rank).c_str(), (unsigned long long)next_sequence,
                    (long)resumed * (tokens_per_step / opt.T), resumed);
    run->scheduler.total_steps = run->steps;
    if (opt.hellaswag) {
        try {
            run->hellaswag = hellaswag_load(opt.hellaswag_file);
            hellaswag_check_vocab(run->hellaswag, V, opt.hellaswag_file);
        } catch (const llmc::Error& e) {
            llmc::failf("-h 1: %s", e.what());
        }
    }
    if (opt.sample_every > 0 && rank == 0) run->tokenizer = load_tokenizer(opt, V);
    int floor_vocab = 0;  // a val shard of the built-in corpus carries its loss floor
    run->has_floor = opt.val_pattern && markov_corpus_floor(opt.val_pattern, &run->loss_floor, &floor_vocab);
    if (opt.resume && rank == 0)  // what is in the way of a checkpoint is found before any step
        checkpoint_check_ahead(run->folder.dir, run->start_step, run->steps, opt.checkpoint_every, opt.checkpoint_keep,
                               run->folder.run_id, run->folder.folder_files);
}

// What the run is, before its first step; what the device decides (the
// family's adapt_to_device) too.
template <class Model, class Config>
void print_run(Run<Model, Config>* run) {
    const TrainOptions& opt = run->opt;
    Model& model = run->model;
    const int N = run->dist->num_processes;
    const long tokens_per_step = run->ramp.target_tokens;
    print0("model: %s, %zu parameters, %s\n", model_summary(run).c_str(), model.num_parameters, PRECISION_NAME);
    print0("batch: B=%d x T=%d x N=%d x A=%d = %ld tokens per step\n", opt.B, opt.T, N,
           (int)(tokens_per_step / run->ramp.micro_tokens), tokens_per_step);
    if (model.doc_mask || model.doc_positions)
        print0("documents: starting at token %d; attention %s; positions %s\n", model.doc_token,
               model.doc_mask ? "within each document" : "across documents",
               model.doc_positions ? "restart at each document" : "0..T-1 per sequence");
    if (opt.ramp_tokens > 0)
        print0("batch ramp: %ld tokens per step at step 0 (A=%d), %ld from step %d; lr scaling %s\n",
               run->ramp.tokens(0), run->ramp.grad_accum_steps(0), tokens_per_step, opt.ramp_steps,
               RAMP_LR_NAMES[opt.ramp_lr]);
    print0("ranks: %d (ZeRO-%d)\n", N, model.zero_stage);
    print_optimizer_memory(model);
    print_memory_plan(*run->family, &model, opt.B, opt.T, opt.recompute);
    print0("train: %s (%zu tokens), %d steps\n", opt.train_pattern, run->train_loader.num_tokens, run->steps);
    if (run->has_floor) print0("loss floor of the val data: %.6f nats/token\n", run->loss_floor);
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, run->dist->local_rank));
    run->peak_flops = gpu_peak_bf16_flops(props.name);
    run->compute_major = props.major;
    run->flops_token = run->family->flops_per_token(&model, opt.T);
}

// The val loss (with the gap to the floor where known) and HellaSwag at every
// -v steps and the last; a sample at every -s steps and the last.
template <class Model, class Config>
void evaluate_and_log(Run<Model, Config>* run, int step, bool last) {
    const TrainOptions& opt = run->opt;
    Model* model = &run->model;
    run->watchdog->mark("the evaluation or sample at step " + std::to_string(step));
    if (reads_val(opt) && (step % opt.val_every == 0 || last)) {
        const double val_loss = evaluate(*run->family, model, &run->val_loader, opt.val_batches);
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
            const double accuracy = evaluate_hellaswag(*run->family, model, run->hellaswag, &scored);
            print0("step %d: HellaSwag accuracy %.4f (%ld of %zu examples fit T=%d)\n", step, accuracy, scored,
                   run->hellaswag.size(), opt.T);
            run->log.record(step, "eval", "hellaswag_acc", accuracy);
        }
    }
    // (ZeRO-3: every rank runs the sample's forwards, whose gathers are collectives; rank 0 prints it)
    const bool samples = run->dist->rank == 0 || stages_weights(model);
    if (opt.sample_every > 0 && step > 0 && (step % opt.sample_every == 0 || last) && samples) {
        const std::vector<int> sample = generate(*run->family, model, opt.sample_tokens, opt.temperature, opt.top_k,
                                                 splitmix64((uint64_t)opt.seed ^ ((uint64_t)step << 32)));
        print0("step %d: sample: %s\n", step, sample_text(sample, run->tokenizer.get()).c_str());
    }
}

// The device time of one optimizer step: step_timer_start before it,
// step_timer_ms after it.
template <class Model, class Config>
void step_timer_start(Run<Model, Config>* run) {
    if (!run->step_start) {
        cudaCheck(cudaEventCreate(&run->step_start));
        cudaCheck(cudaEventCreate(&run->step_end));
    }
    cudaCheck(cudaEventRecord(run->step_start, run->model.stream));
}
template <class Model, class Config>
float step_timer_ms(Run<Model, Config>* run) {
    float ms = 0;
    cudaCheck(cudaEventRecord(run->step_end, run->model.stream));
    cudaCheck(cudaEventSynchronize(run->step_end));
    cudaCheck(cudaEventElapsedTime(&ms, run->step_start, run->step_end));
    return ms;
}

// The step line on stdout and its log records.
template <class Model, class Config>
void log_step(Run<Model, Config>* run, int step, const StepResult& r, float lr, float ms) {
    const int N = run->dist->num_processes;
    run->watchdog->step_took(ms);
    const long step_tokens = run->ramp.tokens(step);
    run->recent_ms = run->timed_steps++ == 0 ? ms : 0.9 * run->recent_ms + 0.1 * ms;
    const double tok_per_s = step_tokens / (ms / 1000.0);
    double mfu = 0;
    char mfu_text[32] = "n/a";
    if (mfu_percent(tok_per_s / N, run->flops_token, run->peak_flops, &mfu))
        snprintf(mfu_text, sizeof mfu_text, "%.1f%%", mfu);
    const double util = 100.0 * r.num_targets / step_tokens;  // token slots that carry a counted target
    print0("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %ld tok/step | util %.1f%% | %.1f ms | %.0f tok/s | "
           "MFU %s | ETA %s\n",
           step + 1, run->steps, r.loss, r.grad_norm, lr, step_tokens, util, ms, tok_per_s, mfu_text,
           format_duration(run->recent_ms / 1000.0 * (run->steps - step - 1)).c_str());
    run->log.train_record(step, r.loss, r.grad_norm, lr, step_tokens, util / 100, ms, tok_per_s);
}

// A step whose loss or gradient norm is not finite changed nothing (see
// adamw.cuh): it stops the run, or with --skip-nonfinite 1 is skipped.
template <class Model, class Config>
void skip_nonfinite_step(Run<Model, Config>* run, int step, const StepResult& r) {
    if (!run->opt.skip_nonfinite)
        llmc::failf("step %d: loss %f, gradient norm %f: not finite; stopping, the weights of step %d and the "
                    "checkpoints are intact (lower -l, check the data, or --skip-nonfinite 1)",
                    step + 1, r.loss, r.grad_norm, step);
    if (++run->nonfinite_in_a_row >= SKIP_NONFINITE_MAX)
        llmc::failf("step %d: loss %f, gradient norm %f: not finite, %d steps in a row; stopping (--skip-nonfinite 1 "
                    "stops there), the weights of the last finite step and the checkpoints are intact (lower -l or "
                    "check the data)",
                    step + 1, r.loss, r.grad_norm, SKIP_NONFINITE_MAX);
    run->model.adam_step--;  // the step never happened for the optimizer
    print0("step %4d/%d | loss %f | norm %f | skipped: not finite\n", step + 1, run->steps, r.loss, r.grad_norm);
}

// The line of a step taken, or, where its loss or gradient norm is not
// finite, its skip (or the run stops).
template <class Model, class Config>
void report_step(Run<Model, Config>* run, int step, const StepResult& r, float lr, float ms) {
    if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
        run->nonfinite_in_a_row = 0;
        log_step(run, step, r, lr, ms);
    } else {
        skip_nonfinite_step(run, step, r);
    }
}

// A step with no counted target (every target masked: --packing slots with a
// document of one token) has no loss and no gradient, yet AdamW would move the
// weights (momentum, decay): it is not taken, and the AdamW step count stays.
template <class Model, class Config>
void skip_empty_step(Run<Model, Config>* run, int step) {
    print0("step %4d/%d | skipped: no counted target (every target of the step is masked)\n", step + 1, run->steps);
}

// A checkpoint after `step` steps: every -n steps, at the end, or (always)
// when a signal asked the run to stop; never twice for one step.
template <class Model, class Config>
void maybe_checkpoint(Run<Model, Config>* run, int step, bool always = false) {
    const TrainOptions& opt = run->opt;
    const bool due = (opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0) || step == run->steps || always;
    if (!opt.output_dir || !due || run->saved_step == step) return;
    run->watchdog->mark("the checkpoint of step " + std::to_string(step));
    const ResumeInfo info{resume_magic(run->model.optimizer), run->model.adam_step,
                          dataloader_position(&run->train_loader), run->initial_gap};
    save_checkpoint(*run->family, &run->model, &run->folder, step, info);
    run->saved_step = step;
    print0("checkpoint: step %d in %s\n", step, opt.output_dir);
}

// The learning rate of a step: the schedule's, times the batch ramp's factor.
template <class Model, class Config>
float learning_rate(const Run<Model, Config>* run, int step) {
    return (float)(run->scheduler.at(step) * run->ramp.lr_factor(step));
}

// A stop signal (SIGTERM, SIGINT, SIGUSR1) to any rank, asked by every rank
// before each step but the first and the last: a checkpoint of the steps so
// far, and true: the loop ends.
template <class Model, class Config>
bool stopped_by_signal(Run<Model, Config>* run, int step) {
    const bool last = step == run->steps;
    run->watchdog->mark("the stop-signal check before step " + std::to_string(step + 1));
    if (step == run->start_step || last || !stop_requested(run->dist)) return false;
    maybe_checkpoint(run, step, true);
    print0("stopped by a signal after step %d%s\n", step,
           run->opt.output_dir ? "; resume with -y 1" : " (no -o: nothing saved)");
    return true;
}

// The start of every trainer's main: no rank waits forever, from before MPI's
// start-up on (a rank stopped there holds up every other: the rank is the
// launcher's, the timeout read from argv ahead of the flags); the ranks; stop
// signals; the flags (the family's table, O its options), which every rank
// must share, as the data they name.
template <class O, class Model, class Config>
void start_run(Run<Model, Config>* run, int* argc, char*** argv, const std::vector<Flag<O>>& flags, O* options) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines, promptly, also into a pipe or a Slurm log
    run->watchdog =
        new Watchdog(launcher_rank(), prescan_stall_timeout(*argc, *argv));  // (kept until exit, with its thread)
    run->watchdog->mark("MPI/NCCL start-up");
    distributed_init(&run->ranks, argc, argv);
    g_dist = run->dist = &run->ranks;
    install_signal_handlers();
    run->watchdog->mark("reading the flags");
    configure_run(run, *argc, *argv, flags, options);
    run->watchdog->configure(run->dist->rank, run->opt.stall_timeout);
    agree_on_flags_and_data(run);
    // building the model and -b auto's trial step too (a stopped rank stalls a collective in them)
    run->watchdog->mark("building the model");
}

// main.log and main.jsonl in -o (rank 0), appended to on a resume.
template <class Model, class Config>
void open_log(Run<Model, Config>* run) {
    if (run->opt.output_dir && run->dist->rank == 0) run->log.open(run->opt.output_dir, run->resume_step);
}

// The end of a trainer's main: the log closed, the data, the model and the
// ranks freed. Returns main's exit status.
template <class Model, class Config>
int end_run(Run<Model, Config>* run) {
    if (!run->opt.memory_plan_only) {
        run->log.close();
        if (run->step_start) {
            cudaCheck(cudaEventDestroy(run->step_start));
            cudaCheck(cudaEventDestroy(run->step_end));
        }
        dataloader_free(&run->train_loader);
        if (reads_val(run->opt)) dataloader_free(&run->val_loader);
        run->family->free_model(&run->model);
        matmul_teardown();
    }
    run->watchdog->mark("the end of the run");
    distributed_free(&run->ranks);
    return 0;
}
