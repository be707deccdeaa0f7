// llmc/run/family.h: what the run's services (llmc/run/) need to know of a
// model family, as one table of functions and texts that a trainer fills and
// passes to them. A trainer calls its own forward and backward in its own
// loop; the services call a family only through this table (evaluation,
// sampling, -b auto's trial step, checkpoints, the memory plan), so every name
// they use is declared here. test/model/test_run_seam.cu fills it for the
// smallest family (docs/new_family.md).
//
// Model derives from Parameters (llmc/step/params.h) and MicroBatches
// (llmc/step/train_step.h); Config is its shape.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/formats/checkpoint.h"
#include "llmc/step/params.h"
#include "llmc/step/train_step.h"

template <class Model, class Config>
struct ModelFamily {
    // ---- texts: --help and the model line
    const char* name;            // "GPT-2"
    const char* init_default;    // -e's default
    const char* init_help;       // -e's help
    const char* doc_token_help;  // --doc-token's help: the family's token that starts a document
    const char* recompute_help;  // -r's help: what each level recomputes
    const char* builtin_init;    // the model trained on the built-in corpus (no -i)
    // a checkpoint's model: {} for llm.c's one file model_%08d.bin, else the
    // files of the folder model_%08d/
    std::vector<std::string> model_folder_files;

    // ---- the step (the trainer's own loop calls its functions directly)
    void (*forward)(Model*);                             // logits for model->inputs
    void (*cross_entropy)(Model*, float scale, bool write_dlogits);  // scale x the losses into stats->loss_sum
    void (*accumulate_gradients)(Model*, const StepBatch&);  // forward and backward of a step, no update

    // ---- the model's shape
    bool (*parse_descriptor)(const char* text, Config*);  // a -e descriptor ("d12"); false: not one
    Config (*model_file_config)(const char* path);        // a model file's (or folder's) shape, checked
    bool (*same_config)(const Config&, const Config&);
    // the model's shape is its member `config`
    Config (*config)(const Model*) = [](const Model* m) { return m->config; };
    void (*set_config)(Model*, const Config&) = [](Model* m, const Config& c) {
        m->config = c;
    };  // before configure_model
    std::string (*describe)(const Config&);  // its shape, for the "model:" line and errors
    void (*configure_model)(Model*);         // sizes for model->config, nothing allocated
    int (*vocab_size)(const Model*);         // V, the real tokens
    int (*max_seq_len)(const Model*);
    int (*document_start_token)(const Model*);  // the token that begins a document; -1: not known
    double (*flops_per_token)(const Model*, int T);  // for MFU (llmc/run/mfu.h)

    // ---- weights and files
    void (*init_from_descriptor)(Model*, const char* descriptor, uint64_t seed);
    void (*init_from_model_file)(Model*, const char* path);
    // the weights: gather_weights' (every rank gathers; one writes)
    std::vector<CheckpointFile> (*write_model_file)(const Model*, const std::vector<floatX>& weights,
                                                    const std::string& path);

    // ---- activations
    std::vector<DeviceBuffer> (*activation_buffers)(Model*, int B, int T, int recompute);  // the plan's rows
    bool (*try_allocate_activations)(Model*, int B, int T, int max_grad_accum_steps, int recompute);
    void (*free_activations)(Model*);
    void (*free_model)(Model*);
    const float* (*device_losses)(const Model*);  // (B, T) per-token losses of the last cross_entropy
    void (*read_logits)(const Model*, int position, float* logits);  // V logits of sequence 0 at position
};
