// llmc/run/run_checkpoint.h: a training run's checkpoints, the same for every
// model family (the file formats are llmc/formats/checkpoint.h's). The family writes
// and reads its model, a file or a folder (write_model_file,
// init_from_model_file of its table, llmc/run/family.h); the state files,
// the DONE markers, the choice of the checkpoint to resume and the checks of a
// resume are here.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/data/dataloader.h"
#include "llmc/run/distributed.h"
#include "llmc/error.h"
#include "llmc/step/params.h"
#include "llmc/run/family.h"

// ---- model files ------------------------------------------------------------------
// A weight the build's floatX cannot hold (an fp32 file's weight beyond
// bf16's range, or Inf or NaN) would make the first step or checkpoint fail,
// every step since the last one lost: refused at load time instead.
inline void check_weights_representable(const std::vector<float>& weights, const char* path) {
    for (size_t i = 0; i < weights.size(); i++) {
        if (std::isfinite(to_float(from_float<floatX>(weights[i])))) continue;
        if (std::isfinite(weights[i]))
            llmc::failf("%s: weight %zu is %.9g, beyond %s's range (this build computes with %s weights)", path, i,
                        weights[i], PRECISION_NAME, PRECISION_NAME);
        llmc::failf("%s: weight %zu is %f, not finite", path, i, weights[i]);
    }
}

// Whether no value is Inf or NaN (a bf16 rounding can overflow to Inf).
template <class T>
bool all_finite(const std::vector<T>& values) {
    for (const T& x : values)
        if (!std::isfinite(to_float(x))) return false;
    return true;
}

// The n weights of a model file whose header is read (model_file_open), each
// checked to be one this build computes with.
inline std::vector<float> read_model_weights(FILE* f, const char* path, const ModelFileHeader& h, size_t n) {
    const std::vector<float> weights = model_file_read_weights(f, path, h, n);
    check_weights_representable(weights, path);
    return weights;
}

// Writes the weights the model computes with (version 5 = bf16, or 3 in the
// fp32 build; the fp32 master weights go to the state files) under the
// family's header (its version set here) through a temporary file, fsync and
// rename: an existing file is never half overwritten. Weights that are not
// all finite (a bf16 rounding can overflow to Inf) are refused: the error
// names the file and nothing is written. Returns the file's name, size and hash.
inline CheckpointFile write_model_weights(const std::vector<floatX>& weights, const std::string& path,
                                          ModelFileHeader h) {
    if (!all_finite(weights)) llmc::failf("%s: the model's weights hold Inf or NaN; not written", path.c_str());
    h.version = sizeof(floatX) == 2 ? MODEL_VERSION_BF16 : MODEL_VERSION_FP32;
    return model_file_write(path, h, weights.data(), weights.size());
}

// ---- checkpoints --------------------------------------------------------------------
// The model (rank 0: model_%08d.bin, or the folder model_%08d of the files
// the family's model_folder_files), state_%08d_%05d.bin (every rank: its master
// weights, m and v, and where the data stream stands), then DONE_%08d once
// every rank's files are durable (llmc/formats/checkpoint.h). Resuming from one
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
constexpr uint32_t RESUME_MAGIC_MUON = 0x4D505452;  // "RTPM": m holds Muon's momentum for its matrices
inline uint32_t resume_magic(int optimizer) {
    return optimizer == (int)Optimizer::Muon ? RESUME_MAGIC_MUON : RESUME_MAGIC;
}


// A checkpoint's model: the file model_%08d.bin, or the folder model_%08d/
// where the family's model is a folder of files (folder_files).
inline std::string model_path(const std::string& dir, int step, const std::vector<std::string>& folder_files) {
    return checkpoint_model_path(dir, step, !folder_files.empty());
}

inline std::vector<float> device_to_host(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// Every rank calls it. Refuses (one error line, nothing written) when any
// weight or moment is not finite, or when the folder's lock may no longer keep
// another trainer out, or when something at the step's names is not the run's
// (checkpoint_clear_step: nothing deleted), so earlier checkpoints stay the
// newest. A DONE of this step from before (a resume that fell back past it)
// goes first: it must never vouch for files being rewritten. The new DONE lists
// every file's size and hash, and the run id, the owner; only the owner's
// checkpoints older than its newest -nk proven ones are pruned.
template <class Model, class Config>
void save_checkpoint(const ModelFamily<Model, Config>& f, Model* model, CheckpointFolder* folder, int step,
                     const ResumeInfo& info) {
    const Distributed* d = model->dist;
    const std::string& dir = folder->dir;
    const size_t local = model->optimizer_elements;
    sync_owned_state(model);  // ZeRO-0 replicas equal again where Muon's owners updated alone
    const std::vector<float> m = device_to_host(model->adam_m, local), v = device_to_host(model->adam_v, local);
    const std::vector<float> master = device_to_host(model->master_weights, local);
    if (!all_finite(m) || !all_finite(v) || !all_finite(master))
        llmc::failf("step %d: the optimizer state holds Inf or NaN; no checkpoint written (the earlier ones are kept)",
                    step);
    std::vector<CheckpointFile> model_files;
    const std::vector<floatX> weights = gather_weights(model);  // ZeRO-3: a collective, layer by layer
    if (d->rank == 0) {
        checkpoint_check_lock(&folder->lock);
        try {
            checkpoint_clear_step(dir, step, folder->run_id, folder->folder_files);
            model_files = f.write_model_file(model, weights, model_path(dir, step, f.model_folder_files));
        } catch (const llmc::Error& e) {
            llmc::failf("step %d: %s (the earlier checkpoints are kept)", step, e.what());
        }
    }
    host_barrier(d);  // no stale DONE of this step is left
    const TrainingStateHeader h{d->num_processes,      d->rank,           0, step, model->zero_stage, local,
                                model->num_parameters, sizeof(ResumeInfo)};
    const CheckpointFile state_file =
        state_write(checkpoint_state_path(dir, step, d->rank), h, m.data(), v.data(), master.data(), &info);
    const uint64_t mine[2] = {state_file.bytes, state_file.xxh64};
    const std::vector<uint64_t> states = host_all_gather(mine, 2, d);  // also: every rank's file is durable
    if (d->rank == 0) {
        DoneRecord done{folder->run_id, model_files};
        for (int r = 0; r < d->num_processes; r++) {
            const std::string path = checkpoint_state_path(dir, step, r);
            done.files.push_back(CheckpointFile{path.substr(dir.size() + 1), states[2 * r], states[2 * r + 1]});
        }
        checkpoint_write_done(dir, step, done);
        checkpoint_finish_step(dir, step);
        folder->proven.push_back(step);
        checkpoint_prune(dir, folder->keep_last, folder->run_id, folder->proven);
    }
}

// Why this rank cannot trust checkpoint `step` of dir ("" when it can): its DONE
// must list the model (each file of its folder) and every rank's state file,
// and the model's files and this rank's state must match the sizes and hashes
// it lists.
inline std::string checkpoint_problem(const std::string& dir, int step, const Distributed* d,
                                      const std::vector<std::string>& folder_files, DoneRecord* done) {
    std::string problem;
    if (!checkpoint_read_done(dir, step, done, &problem)) return problem;
    if (checkpoint_done_ranks(*done) > 0 && checkpoint_done_ranks(*done) != d->num_processes)
        llmc::failf("-y 1: checkpoint %d of %s was saved with %d processes, this run has %d (resume with as many)",
                    step, dir.c_str(), checkpoint_done_ranks(*done), d->num_processes);
    if (!checkpoint_done_covers(*done, step, d->num_processes, folder_files, &problem)) {
        const std::string state = checkpoint_state_path(dir, step, d->rank);
        if (state_file_is_llmc(state))
            problem += "; " + state +
                       " is llm.c's state, which this trainer does not resume (start from its model "
                       "with -e " +
                       model_path(dir, step, folder_files) + ")";
        return problem;
    }
    std::vector<std::string> mine = checkpoint_model_names(step, folder_files);
    mine.push_back(checkpoint_state_path("", step, d->rank).substr(1));
    DoneRecord check{done->run_id, {}};
    for (const CheckpointFile& f : done->files)
        if (std::find(mine.begin(), mine.end(), f.name) != mine.end()) check.files.push_back(f);
    checkpoint_verify_files(dir, check, &problem);
    return problem;
}

// The newest checkpoint of dir that every rank can trust (checkpoint_problem);
// one that is not is skipped with a warning line, falling back to the one
// before. -1: there is no DONE at all. All ranks take the same step (rank 0's
// list, checks agreed).
inline int choose_resume_step(const std::string& dir, const Distributed* d,
                              const std::vector<std::string>& folder_files, std::string* run_id) {
    const std::vector<int> steps = d->rank == 0 ? checkpoint_complete_steps(dir) : std::vector<int>();
    const int count = (int)host_sum(steps.size(), d);
    std::vector<std::string> skipped;  // printed once a checkpoint is chosen
    for (int i = 0; i < count; i++) {
        const int step = (int)host_sum(d->rank == 0 ? steps[i] : 0, d);
        DoneRecord done;
        const std::string problem = checkpoint_problem(dir, step, d, folder_files, &done);
        if (host_sum(problem.empty() ? 0 : 1, d) == 0) {
            for (const std::string& w : skipped) fprintf(stderr, "warning: %s; falling back\n", w.c_str());
            *run_id = done.run_id;
            return step;
        }
        // (each rank reports what it found itself)
        if (!problem.empty()) skipped.push_back("checkpoint " + std::to_string(step) + " not used: " + problem);
    }
    // one error line, not the warnings too: nothing is resumed
    if (count > 0)
        llmc::failf("-y 1: no complete checkpoint in %s passes its checks (%s)", dir.c_str(),
                    skipped.empty() ? "damaged as another rank reports" : skipped.front().c_str());
    return -1;
}

// How many of this rank's weights are not its fp32 master weight rounded to
// floatX: each must be the master's top 16 bits or one more (AdamW rounds
// stochastically, the initialisation to nearest), the master itself in the
// fp32 build. A model file of another step or run misses on nearly every
// element: this catches the swap where no checksum vouches for the pair
// (llm.c's empty DONE).
template <class Model>
size_t weights_off_master(Model* model, const std::vector<float>& master) {
    const std::vector<floatX> params = gather_weights(model);  // ZeRO-3: every rank calls it
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
template <class Model, class Config>
ResumeInfo load_checkpoint(const ModelFamily<Model, Config>& f, Model* model, const std::string& dir, int step) {
    const std::string path = model_path(dir, step, f.model_folder_files);
    f.init_from_model_file(model, path.c_str());
    const Distributed* d = model->dist;
    const size_t local = model->optimizer_elements;
    const TrainingStateHeader expected{d->num_processes,      d->rank,           0, step, model->zero_stage, local,
                                       model->num_parameters, sizeof(ResumeInfo)};
    std::vector<float> m(local), v(local), master(local);
    ResumeInfo info;
    const std::string state_path = checkpoint_state_path(dir, step, d->rank);
    state_read(state_path, expected, m.data(), v.data(), master.data(), &info);
    if (info.magic != RESUME_MAGIC && info.magic != RESUME_MAGIC_MUON)
        llmc::failf("%s: not written by this trainer", state_path.c_str());
    if (info.magic != resume_magic(model->optimizer))
        llmc::failf("%s: written with --optimizer %s; resume with it", state_path.c_str(),
                    OPTIMIZER_NAMES[info.magic == RESUME_MAGIC_MUON ? (int)Optimizer::Muon : (int)Optimizer::AdamW]);
    // (skipped non-finite steps leave the AdamW step behind the step, never ahead)
    if (info.adam_step < 0 || info.adam_step > step)
        llmc::failf("%s: AdamW step %d is outside 0..%d, the checkpoint's step", state_path.c_str(), info.adam_step,
                    step);
    if (const size_t off = weights_off_master(model, master))
        llmc::failf("%s: %zu of %zu weights are not the master weights of %s rounded: the two files are from different "
                    "checkpoints",
                    path.c_str(), off, local, state_path.c_str());
    if (model->zero_stage == 0) {  // every rank holds the same replica: a differing one would train apart
        XXH64_state_t h;
        XXH64_reset(&h, 0);
        const std::vector<float>* const states[] = {&m, &v,
                                                    &master};  // (nvcc: no braced list in a template's range-for)
        for (const std::vector<float>* a : states) XXH64_update(&h, a->data(), a->size() * sizeof(float));
        const uint64_t mine = XXH64_digest(&h);
        const std::vector<uint64_t> all = host_all_gather(&mine, 1, d);
        for (int r = 1; r < (int)all.size(); r++)  // (one per rank)
            if (all[r] != all[0])
                llmc::failf("%s: ZeRO-0 replicas differ: the optimizer state of rank %d is not rank 0's",
                            state_path.c_str(), r);
    }
    cudaCheck(cudaMemcpy(model->adam_m, m.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->adam_v, v.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->master_weights, master.data(), local * sizeof(float), cudaMemcpyHostToDevice));
    model->adam_step = info.adam_step;
    return info;
}

