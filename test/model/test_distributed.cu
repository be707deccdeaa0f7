// Data parallelism: the trainer's own train_step on N ranks (CPU runtime, NCCL
// on MPI, one process per rank).
//
//   mpirun -np N test_distributed DIR   runs every split with this N, checks the
//                                       communication, writes results to DIR
//   test_distributed --compare DIR      compares the results of every N with the
//                                       single-process big batch
//
// One optimizer step is 8 sequences (or 6, for N = 3) of T tokens, split as
// B_micro x N x A. The targets are masked very unevenly: some sequences keep
// one target, some none, some 30%, so ranks and micro-batches hold very
// different token counts. Every split must give the losses and weights of one
// process that takes all 8 sequences at once (B = 8, A = 1).
//
// Communication is read from the CPU runtime's NCCL counters, per optimizer
// step: the same for A = 1, 2, 4, 8 (so nothing is sent on micro-batches
// 0..A-2) and exactly one gradient's worth: an all-reduce of the fp32 buffer
// (ZeRO-0), or a reduce-scatter plus the all-reduce of the slice tails (ZeRO-1)
// and an all-gather of the weights. ZeRO-2 reduces every micro-batch (A
// gradients' worth per step, into the shard and added there): the same losses
// and weights, bitwise ZeRO-1's with A = 1. ZeRO-3 sums as ZeRO-2 and gathers
// each layer's weights before its forward and its backward (2A all-gathers of
// the layers per step, one of the rest after the update): bitwise ZeRO-2's.
#define TESTING
#include "train_gpt.cu"
#include "test/test_util.h"
#ifdef CPUCUDA
#include "cpucuda.h"  // memory_stats
#include "cpucuda_nccl.h"
#else  // a GPU build runs N = 1 only (one GPU lent): no collectives to count
struct CpuCudaNcclCounters {
    uint64_t calls[5], bytes[5];
};
enum {
    CPUCUDA_NCCL_ALLREDUCE,
    CPUCUDA_NCCL_REDUCESCATTER,
    CPUCUDA_NCCL_ALLGATHER,
    CPUCUDA_NCCL_BROADCAST,
    CPUCUDA_NCCL_REDUCE
};
static void cpucuda_nccl_reset_counters(ncclComm_t) {}
static void cpucuda_nccl_get_counters(ncclComm_t, CpuCudaNcclCounters* c) { memset(c, 0, sizeof *c); }
#endif

#include <map>

// A split changes only the fp32 summation order of the gradients: the summed
// gradient of the first step agrees per tensor to 1e-6 (TOL_GRAD), losses and
// norms to 1e-7 in the fp32 build. Final weights are compared two ways: max
// |got - ref| over all weights relative to max |ref| (TOL_PARAMS), and per
// tensor (TOL_TENSOR). Adam divides each gradient by its own RMS, so an entry
// whose gradient nearly cancels turns the 1e-7 into a visible difference of
// its update: after 5 steps 2.3e-5 over all weights, 4.6e-4 on fcprojw and the
// biases, and exactly as much between two splits of one process (A = 3 vs
// A = 1), so it is the split, not the ranks. ZeRO-1 against ZeRO-0 with the
// same split differs only in the norm's summation order: <= 2e-6.
#if defined(ENABLE_FP32)
static const double TOL_GRAD = 1e-5, TOL_LOSS = 1e-5, TOL_NORM = 1e-5, TOL_PARAMS = 5e-5, TOL_TENSOR = 1e-3;
#else
// bf16 weights: stochastic rounding of slightly different new weights can
// land on the other neighbour, and the next forward differs by a bf16 ulp here
// and there. Even the first gradients can: the CPU runtime's matmul may differ
// in the last fp32 bit for the same row when B changes (OpenBLAS picks its
// kernel by shape), one activation gradient then rounds to the other bf16
// neighbour, and the tensor-core attention carries that to every gradient
// upstream (measured at B = 2 vs 8: gradients 1.5e-3, losses 1.6e-5, norms
// 3.0e-4, weights 9.9e-3, tensors 4.4e-2). The fp32 build checks the split itself.
static const double TOL_GRAD = 5e-3, TOL_LOSS = 1e-4, TOL_NORM = 1e-3, TOL_PARAMS = 2e-2, TOL_TENSOR = 1e-1;
#endif

static const char* MODEL = "L=2,C=64,H=4,V=250,maxT=32";
static const int T = 32, STEPS = 5;
static const float LR = 2e-3f;

struct Split {
    int global_sequences, B, N, A, zero;
    std::string name() const {
        char s[96];
        snprintf(s, sizeof s, "g%d_B%d_N%d_A%d_z%d", global_sequences, B, N, A, zero);
        return s;
    }
};
static const Split SPLITS[] = {
    {8, 8, 1, 1, 0}, {8, 1, 1, 8, 0}, {8, 2, 1, 4, 0},                                      // one process
    {8, 1, 2, 4, 0}, {8, 2, 2, 2, 0}, {8, 1, 2, 4, 1}, {8, 2, 2, 2, 1}, {8, 4, 2, 1, 0},    // N = 2
    {8, 4, 2, 1, 1}, {8, 4, 2, 1, 2}, {8, 2, 2, 2, 2}, {8, 1, 2, 4, 2},                     //
    {8, 1, 4, 2, 0}, {8, 2, 4, 1, 0}, {8, 1, 4, 2, 1}, {8, 2, 4, 1, 1},                     // N = 4
    {8, 2, 4, 1, 2}, {8, 1, 4, 2, 2},                                                       //
    {8, 4, 2, 1, 3}, {8, 2, 2, 2, 3}, {8, 1, 2, 4, 3}, {8, 2, 4, 1, 3}, {8, 1, 4, 2, 3},    // ZeRO-3
    {6, 6, 1, 1, 0}, {6, 2, 1, 3, 0},                                                       // one process
    {6, 1, 3, 2, 0}, {6, 2, 3, 1, 0}, {6, 1, 3, 2, 1}, {6, 2, 3, 1, 1},                     // N = 3: C = 64 is
    {6, 2, 3, 1, 2}, {6, 1, 3, 2, 2}, {6, 2, 3, 1, 3}, {6, 1, 3, 2, 3},                     // not a multiple of 3
};

// Tokens of step k, sequence s (T + 1 of them), and the mask: sequence s
// keeps every target (s % 4 == 2, 3), 30% of them (s % 4 == 1), one (s % 4 == 0,
// odd steps) or none (s % 4 == 0, even steps).
static void global_batch(int step, int sequences, std::vector<int>* inputs, std::vector<int>* targets) {
    inputs->assign((size_t)sequences * T, 0);
    targets->assign((size_t)sequences * T, -1);
    for (int s = 0; s < sequences; s++) {
        std::vector<int> tok(T + 1);
        for (int t = 0; t <= T; t++) tok[t] = (int)(splitmix64(((uint64_t)step * 64 + s) * 1024 + t) % 250);
        for (int t = 0; t < T; t++) {
            (*inputs)[s * T + t] = tok[t];
            const uint64_t h = splitmix64(((uint64_t)step << 32) + s * T + t + 77);
            bool keep = s % 4 >= 2;
            if (s % 4 == 1) keep = h % 10 < 3;
            if (s % 4 == 0) keep = step % 2 == 1 && t == T / 2;
            (*targets)[s * T + t] = keep ? tok[t + 1] : -1;
        }
    }
}

struct StepCounters {
    CpuCudaNcclCounters c;
    bool operator==(const StepCounters& o) const { return memcmp(&c, &o.c, sizeof c) == 0; }
};

struct Result {
    std::vector<float> losses, norms, master;
    std::vector<float> first_gradient;  // the summed gradient of step 0 (ZeRO-0), as every rank holds it
    std::vector<StepCounters> counters;
};

// Trains STEPS steps of `split` on this rank, as main does: rank r takes rows
// [r*B, (r+1)*B) of each global micro-batch of N*B sequences.
static Result train(const Split& split, const Distributed* dist) {
#ifdef CPUCUDA
    matmul_teardown();  // the earlier splits' cuBLASLt workspace: the plan below counts this one's
    cpucuda::reset_peak_memory();
    const size_t before = cpucuda::memory_stats().in_use;
#endif
    GPT2 model;
    model.dist = dist;
    model.zero_stage = split.zero;
    init_from_descriptor(&model, MODEL, 7);
    allocate_activations(GPT2_FAMILY, &model, split.B, T, split.A);
    OptimizerSettings opt;
    opt.weight_decay = 0.1f;
    opt.grad_clip = 0.5f;  // active on some steps
    const size_t micro = (size_t)split.B * T;
    Result res;
    for (int step = 0; step < STEPS; step++) {
        std::vector<int> gx, gy, x(split.A * micro), y(split.A * micro);
        global_batch(step, split.global_sequences, &gx, &gy);
        for (int i = 0; i < split.A; i++) {
            const size_t row = ((size_t)i * split.N + dist->rank) * micro;
            memcpy(&x[i * micro], &gx[row], micro * sizeof(int));
            memcpy(&y[i * micro], &gy[row], micro * sizeof(int));
        }
        const StepBatch batch{x.data(), y.data(), split.A, count_unmasked(gy.data(), gy.size())};
        if (step == 0 && split.zero == 0) {  // the gradient alone, then the same step for real
            accumulate_gradients(&model, batch);
            if (split.N > 1) compute_after_comm(dist, model.stream);
            res.first_gradient.resize(model.num_parameters);
            cudaCheck(cudaMemcpy(res.first_gradient.data(), model.grads_memory, model.num_parameters * 4,
                                 cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemset(model.grads_memory, 0, model.num_parameters * 4));
        }
        if (split.N > 1) cpucuda_nccl_reset_counters(dist->comm);
        const StepResult r = train_step(&model, batch, LR, opt);
        if (split.N > 1) {
            StepCounters c;
            cpucuda_nccl_get_counters(dist->comm, &c.c);
            res.counters.push_back(c);
        }
        res.losses.push_back(r.loss);
        res.norms.push_back(r.grad_norm);
    }
#ifdef CPUCUDA
    // the memory plan (ZeRO-3: the weight staging and shard at their sizes) is what the steps allocated
    const size_t peak = cpucuda::memory_stats().peak - before;
    const size_t planned = memory_plan(GPT2_FAMILY, &model, split.B, T, 0).total;
    if (dist->rank == 0 && split.zero >= 2)
        CHECK(planned == peak, "%s: the memory plan, %zu bytes, is the runtime's peak allocation over the steps, %zu",
              split.name().c_str(), planned, peak);
#endif
    res.master = gather_master_weights(&model);
    // every rank must hold bitwise the same weights the forward reads (ZeRO-3: as gathered)
    const std::vector<floatX> weights = gather_weights(&model);
    uint64_t hash = 1469598103934665603ull;
    const unsigned char* bytes = (const unsigned char*)weights.data();
    for (size_t i = 0; i < weights.size() * sizeof(floatX); i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
    const std::vector<uint64_t> hashes = host_all_gather(&hash, 1, dist);
    if (dist->rank == 0)
        CHECK(std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; }),
              "%s: all %d ranks hold bitwise the same weights after %d steps", split.name().c_str(), split.N, STEPS);
    // what one optimizer step must send, from the slice plan
    if (split.N > 1 && dist->rank == 0) {
        const size_t n = model.num_parameters, N = split.N;
        const int micro_reductions = split.zero >= 2 ? split.A : 1;
        size_t scattered = 0, tails = 0, layers_scattered = 0;
        for (const GradientSlice& s : model.slices) {
            scattered += s.part * N;
            tails += s.tail;
            if (s.layer < model.num_layers) layers_scattered += s.part * N;
        }
        // ZeRO-3: the layers' weights gathered before each forward and backward, the rest after the update
        const size_t gathered = split.zero == 3 ? scattered - layers_scattered + 2 * split.A * layers_scattered
                                                : scattered;
        const CpuCudaNcclCounters& c = res.counters[0].c;
        const uint64_t ar = c.bytes[CPUCUDA_NCCL_ALLREDUCE], rs = c.bytes[CPUCUDA_NCCL_REDUCESCATTER];
        const uint64_t ag = c.bytes[CPUCUDA_NCCL_ALLGATHER], loss_bytes = 4, norm_bytes = split.zero ? 4 : 0;
        const double ratio = (double)(ar + rs - loss_bytes - norm_bytes) / (4.0 * n);
        bool same_every_step = true;
        for (const StepCounters& s : res.counters) same_every_step &= s == res.counters[0];
        if (split.zero == 0)
            CHECK(ar == 4 * n + loss_bytes && rs == 0 && ag == 0 && c.calls[CPUCUDA_NCCL_BROADCAST] == 0 &&
                      c.calls[CPUCUDA_NCCL_REDUCE] == 0 && same_every_step,
                  "%s: per step one all-reduce of the fp32 gradients (%zu bytes) and the loss; gradient bytes "
                  "reduced / gradient bytes = %.2f; the same every step",
                  split.name().c_str(), 4 * n, ratio);
        else  // ZeRO-2, 3: every micro-batch's gradient (A of them); ZeRO-1: the last one's, the sum
            CHECK(rs == 4 * scattered * micro_reductions &&
                      ar == 4 * tails * micro_reductions + loss_bytes + norm_bytes && ag == sizeof(floatX) * gathered &&
                      same_every_step && fabs(ratio - micro_reductions) < 1e-12,
                  "%s: per step %d x (a reduce-scatter of %zu fp32 + an all-reduce of the %zu tail elements) "
                  "(gradient bytes reduced / gradient bytes = %.2f), all-gathers of %zu weights (%zu bytes); the "
                  "same every step",
                  split.name().c_str(), micro_reductions, scattered, tails, ratio, gathered, (size_t)ag);
    }
    free_model(&model);
    return res;
}

static void write_result(const std::string& path, const Result& r) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) FAIL("%s: cannot write (%s)", path.c_str(), strerror(errno));
    const uint64_t n = r.master.size(), has_gradient = !r.first_gradient.empty();
    fwrite(&n, 8, 1, f);
    fwrite(&has_gradient, 8, 1, f);
    fwrite(r.losses.data(), 4, STEPS, f);
    fwrite(r.norms.data(), 4, STEPS, f);
    fwrite(r.master.data(), 4, n, f);
    if (has_gradient) fwrite(r.first_gradient.data(), 4, n, f);
    fclose(f);
}

static bool read_result(const std::string& path, Result* r) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return false;
    uint64_t n = 0, has_gradient = 0;
    bool ok = fread(&n, 8, 1, f) == 1 && n < (1u << 30) && fread(&has_gradient, 8, 1, f) == 1;
    r->losses.resize(STEPS);
    r->norms.resize(STEPS);
    r->master.resize(ok ? n : 0);
    r->first_gradient.resize(ok && has_gradient ? n : 0);
    ok = ok && fread(r->losses.data(), 4, STEPS, f) == STEPS && fread(r->norms.data(), 4, STEPS, f) == STEPS &&
         fread(r->master.data(), 4, n, f) == n &&
         fread(r->first_gradient.data(), 4, r->first_gradient.size(), f) == r->first_gradient.size();
    fclose(f);
    return ok;
}

// Runs every split with this process count; per split, the counters of each
// step, and for each N and ZeRO stage 0 or 1, the counters must not depend on A
// (ZeRO-2's and 3's grow with A: train checks them).
static void run_splits(const std::string& dir, const Distributed* dist) {
    std::map<std::pair<int, int>, std::pair<std::string, StepCounters>> by_stage;  // (global, zero) -> first split
    for (const Split& split : SPLITS) {
        if (split.N != dist->num_processes) continue;
        const Result r = train(split, dist);
        if (dist->rank != 0) continue;
        write_result(dir + "/" + split.name() + ".bin", r);
        if (split.N == 1 || split.zero >= 2) continue;
        const auto key = std::make_pair(split.global_sequences, split.zero);
        auto it = by_stage.find(key);
        if (it == by_stage.end()) {
            by_stage[key] = {split.name(), r.counters[0]};
            continue;
        }
        const CpuCudaNcclCounters& c = r.counters[0].c;
        CHECK(r.counters[0] == it->second.second,
              "%s: the same collectives as %s (%llu all-reduce, %llu reduce-scatter, %llu all-gather calls per step): "
              "independent of A, so none on micro-batches 0..A-2",
              split.name().c_str(), it->second.first.c_str(), (unsigned long long)c.calls[CPUCUDA_NCCL_ALLREDUCE],
              (unsigned long long)c.calls[CPUCUDA_NCCL_REDUCESCATTER],
              (unsigned long long)c.calls[CPUCUDA_NCCL_ALLGATHER]);
    }
}

// Per tensor: max |got - ref| / max |ref|; the worst tensor. The key part of
// qkvb (columns C..2C of each layer) has a gradient that is exactly 0 in exact
// arithmetic (softmax ignores a constant shift of the scores): only rounding
// noise is there, which Adam turns into steps of up to lr, so it is left out
// here and bounded in absolute terms (*key_bias_abs).
static double tensor_diff(const std::vector<float>& got, const std::vector<float>& ref, double* key_bias_abs,
                          const char** worst_name) {
    GPT2Config c;
    parse_descriptor(MODEL, &c);
    size_t offset = 0;
    double worst = 0;
    *key_bias_abs = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        double diff = 0, scale = 0;
        for (size_t i = 0; i < parameter_size(k, c); i++) {
            const double d = fabsf(got[offset + i] - ref[offset + i]);
            const size_t column = i % (3 * c.channels);
            if (k == 5 && column >= (size_t)c.channels && column < 2 * (size_t)c.channels) {
                *key_bias_abs = std::max(*key_bias_abs, d);
                continue;
            }
            diff = std::max(diff, d);
            scale = std::max(scale, (double)fabsf(ref[offset + i]));
        }
        if (scale > 0 && diff / scale > worst) {
            worst = diff / scale;
            *worst_name = PARAMETERS[k].name;
        }
        offset += parameter_size(k, c);
    }
    return worst;
}

// Whole vector: max |got - ref| / max |ref|.
static double max_scaled_diff(const std::vector<float>& got, const std::vector<float>& ref) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        diff = std::max(diff, (double)fabsf(got[i] - ref[i]));
        scale = std::max(scale, (double)fabsf(ref[i]));
    }
    return diff / scale;
}

static void compare_results(const std::string& what, const Result& got, const Result& ref) {
    const double loss = max_rel_diff(got.losses.data(), ref.losses.data(), STEPS);
    const double norm = max_rel_diff(got.norms.data(), ref.norms.data(), STEPS);
    const double params = max_scaled_diff(got.master, ref.master);
    double key_bias = 0;
    const char* worst = "-";
    const double tensor = tensor_diff(got.master, ref.master, &key_bias, &worst);
    CHECK(loss <= TOL_LOSS && norm <= TOL_NORM && params <= TOL_PARAMS && tensor <= TOL_TENSOR &&
              key_bias <= STEPS * LR,
          "%s: %d losses (rel %.1e <= %.0e), norms (%.1e <= %.0e), final weights (%.1e <= %.0e; worst tensor %s "
          "%.1e <= %.0e; key bias, noise only, abs %.1e <= steps x lr)",
          what.c_str(), STEPS, loss, TOL_LOSS, norm, TOL_NORM, params, TOL_PARAMS, worst, tensor, TOL_TENSOR, key_bias);
    if (got.first_gradient.empty() || ref.first_gradient.empty()) return;
    double key_bias_grad = 0;
    const char* worst_grad = "-";
    const double grad = tensor_diff(got.first_gradient, ref.first_gradient, &key_bias_grad, &worst_grad);
    CHECK(grad <= TOL_GRAD, "%s: the summed gradient of step 1 (worst tensor %s %.1e <= %.0e)", what.c_str(),
          worst_grad, grad, TOL_GRAD);
}

static void compare(const std::string& dir) {
    for (const Split& split : SPLITS) {
        const Split big{split.global_sequences, split.global_sequences, 1, 1, 0};
        if (split.B == big.B && split.N == 1) continue;
        Result got, ref, zero0;
        if (!read_result(dir + "/" + big.name() + ".bin", &ref) ||
            !read_result(dir + "/" + split.name() + ".bin", &got)) {
            CHECK(false, "%s: results of it and of %s in %s (run `mpirun -np %d test_distributed %s` first)",
                  split.name().c_str(), big.name().c_str(), dir.c_str(), split.N, dir.c_str());
            continue;
        }
        char what[160];
        snprintf(what, sizeof what, "%s (B x N x A = %d x %d x %d, ZeRO-%d) vs one process, B = %d",
                 split.name().c_str(), split.B, split.N, split.A, split.zero, big.B);
        compare_results(what, got, ref);
        if (split.zero >= 1) {  // ZeRO-1 vs ZeRO-0, ZeRO-2 vs ZeRO-1, ZeRO-3 vs ZeRO-2 of the same split
            const Split same{split.global_sequences, split.B, split.N, split.A, split.zero - 1};
            const std::string title = split.name() + " vs " + same.name() + " (ZeRO-" + std::to_string(split.zero) +
                                      " vs ZeRO-" + std::to_string(split.zero - 1) + ")";
            const bool read = read_result(dir + "/" + same.name() + ".bin", &zero0);
            CHECK(read, "%s: its results in %s", title.c_str(), dir.c_str());
            if (read) compare_results(title, got, zero0);
            if (read && split.zero == 2 && split.A == 1)
                CHECK(got.losses == zero0.losses && got.norms == zero0.norms && got.master == zero0.master,
                      "%s, A = 1: losses, norms and final master weights bitwise equal", title.c_str());
            if (read && split.zero == 3)  // the same sums, the same weights gathered
                CHECK(got.losses == zero0.losses && got.norms == zero0.norms && got.master == zero0.master,
                      "%s, A = %d: losses, norms and final master weights bitwise equal", title.c_str(), split.A);
        }
    }
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--compare") == 0) {
        compare(argv[2]);
        return test_summary("test_distributed");
    }
    if (argc != 2) FAIL("usage: mpirun -np N test_distributed DIR | test_distributed --compare DIR");
    Distributed dist;
    distributed_init(&dist, &argc, &argv);
    mkdir(argv[1], 0755);
    run_splits(argv[1], &dist);
    distributed_free(&dist);
    if (dist.rank != 0) return 0;
    printf("ran %d steps of every split with N = %d\n", STEPS, dist.num_processes);
    return test_summary("test_distributed");
}
