// The in-process part of the lesson (dev/lesson.py prints the tables): the
// trainer's own accumulate_gradients, update_parameters and train_step, run where a
// claim needs what the command line cannot show.
//
//   lesson normalisation            claim 2: the global count G against the
//                                   mean of micro-batch means, packed and padded
//   lesson frozen                   claim 3: the weights and the optimizer's
//                                   step count after each micro-batch
//   mpirun -np 2 lesson bytes       claim 6: NCCL bytes per optimizer step for
//                                   A = 1, 2, 4, 8, ZeRO-0 and ZeRO-1
//
// Each prints one JSON object per line (rank 0 only).
#define TESTING
#include "train_gpt.cu"
#include "llmc/data/markov_corpus.h"
#ifdef CPUCUDA
#include "cpucuda_nccl.h"
#endif

static const char* MODEL = "L=2,C=64,H=4,V=256,maxT=64";
static const char* CORPUS = "build/markov";  // the trainer's built-in corpus
static const int T = 64, SEQUENCES = 8;      // one global batch: 8 sequences of 64 tokens

// The first 8 sequences of the built-in corpus, packed (every target counts)
// or as slots (one document per sequence, padded with masked targets).
static void first_batch(DataPacking packing, std::vector<int>* x, std::vector<int>* y) {
    markov_corpus_write(CORPUS, MARKOV_DEFAULT_SEED, MARKOV_DEFAULT_TRAIN_TOKENS, MARKOV_DEFAULT_VAL_TOKENS,
                        MARKOV_DEFAULT_VOCAB);
    DataLoader loader;
    // the corpus's documents start at its EOT, V-1
    dataloader_init(&loader, markov_corpus_train_path(CORPUS).c_str(), SEQUENCES, T, 0, 1, MARKOV_DEFAULT_VOCAB, false,
                    1337, packing, MARKOV_DEFAULT_VOCAB - 1);
    dataloader_next_batch(&loader);
    x->assign(loader.inputs, loader.inputs + SEQUENCES * T);
    y->assign(loader.targets, loader.targets + SEQUENCES * T);
    dataloader_free(&loader);
}

static GPT2* new_model(int B, int A, const Distributed* d = &SINGLE_PROCESS, int zero = 0,
                       Optimizer optimizer = Optimizer::AdamW) {
    GPT2* m = new GPT2;
    m->dist = d;
    m->zero_stage = zero;
    m->optimizer = (int)optimizer;
    init_from_descriptor(m, MODEL, 1337);
    allocate_activations(GPT2_FAMILY, m, B, T, A);
    return m;
}

template <typename T_>
static std::vector<float> to_host(const T_* d, size_t n) {
    std::vector<T_> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T_), cudaMemcpyDeviceToHost));
    return std::vector<float>(h.begin(), h.end());
}

// The gradient buffer (then zeroed) and the loss accumulate_gradients left.
static std::vector<float> take_gradient(GPT2* m, float* loss) {
    std::vector<float> g = to_host(m->grads_memory, m->num_parameters);
    *loss = to_host(&m->stats->loss_sum, 1)[0];
    cudaCheck(cudaMemset(m->grads_memory, 0, m->num_parameters * sizeof(float)));
    return g;
}

static double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); i++) d = std::max(d, (double)fabsf(a[i] - b[i]));
    return d;
}
static double max_abs(const std::vector<float>& a) { return max_abs_diff(a, std::vector<float>(a.size(), 0.0f)); }

// Claim 2. The same 8 sequences as one micro-batch (the reference), as 4
// micro-batches of 2 normalised by the global count G (the trainer), and as
// 4 micro-batches each normalised by its own count then divided by A (the
// common mistake: each micro-batch's mean, averaged).
static void normalisation() {
    const int B = 2, A = SEQUENCES / B;
    GPT2* one = new_model(SEQUENCES, 1);
    GPT2* split = new_model(B, A);
    for (DataPacking packing : {DataPacking::Packed, DataPacking::Slots}) {
        std::vector<int> x, y;
        first_batch(packing, &x, &y);
        const size_t micro = (size_t)B * T;
        float loss_ref, loss_right, loss_wrong = 0;
        accumulate_gradients(one, whole_batch(one, x.data(), y.data(), 1));
        const std::vector<float> ref = take_gradient(one, &loss_ref);
        const StepBatch batch = whole_batch(split, x.data(), y.data(), A);
        accumulate_gradients(split, batch);
        const std::vector<float> right = take_gradient(split, &loss_right);
        std::string counts;
        for (int i = 0; i < A; i++) {  // scale 1 / (G_i x A), gradients still summed in the buffer
            const long G_i = count_unmasked(y.data() + i * micro, micro);
            accumulate_gradients(split, StepBatch{x.data() + i * micro, y.data() + i * micro, 1, G_i * A});
            loss_wrong += to_host(&split->stats->loss_sum, 1)[0];
            counts += (i ? "," : "") + std::to_string(G_i);
        }
        float unused;
        const std::vector<float> wrong = take_gradient(split, &unused);
        printf("{\"claim\": 2, \"data\": \"%s\", \"counts\": [%s], \"G\": %ld, \"loss_one\": %.9g, "
               "\"loss_global\": %.9g, \"loss_mean_of_means\": %.9g, \"grad_err_global\": %.3e, "
               "\"grad_err_mean_of_means\": %.3e}\n",
               packing == DataPacking::Packed ? "packed" : "slots", counts.c_str(), batch.global_targets, loss_ref,
               loss_right, loss_wrong, max_abs_diff(right, ref) / max_abs(ref),
               max_abs_diff(wrong, ref) / max_abs(ref));
    }
}

// Everything the optimizer owns, as one vector: the weights the forward reads,
// the fp32 master weights, AdamW's m and v.
static std::vector<float> optimizer_view(const GPT2* m) {
    std::vector<float> all = to_host(m->params_memory, m->num_parameters);
    for (const float* p : {m->master_weights, m->adam_m, m->adam_v}) {
        const std::vector<float> part = to_host(p, m->optimizer_elements);
        all.insert(all.end(), part.begin(), part.end());
    }
    return all;
}

// Claim 3. A step's micro-batches one at a time (accumulate_gradients with
// A = 1 and the global G, which is what its loop does for each), then the
// update: the weights move only at the update. Against: an optimizer step
// after every micro-batch.
static void frozen() {
    const int B = 2, A = SEQUENCES / B;
    std::vector<int> x, y;
    first_batch(DataPacking::Packed, &x, &y);
    const size_t micro = (size_t)B * T;
    const long G = count_unmasked(y.data(), y.size());
    GPT2* m = new_model(B, A);
    const std::vector<float> w0 = to_host(m->params_memory, m->num_parameters), state0 = optimizer_view(m);
    OptimizerSettings opt;
    for (int i = 0; i < A; i++) {
        accumulate_gradients(m, StepBatch{x.data() + i * micro, y.data() + i * micro, 1, G});
        const std::vector<float> g = to_host(m->grads_memory, m->num_parameters);
        printf("{\"claim\": 3, \"after\": \"micro-batch %d of %d\", \"weight_change\": %.3e, \"state_change\": %.3e, "
               "\"adam_steps\": %d, \"grad_max\": %.6e}\n",
               i + 1, A, max_abs_diff(to_host(m->params_memory, m->num_parameters), w0),
               max_abs_diff(optimizer_view(m), state0), m->adam_step, max_abs(g));
    }
    const std::vector<float> grad = to_host(m->grads_memory, m->num_parameters);
    update_parameters(m, m->scratch.reduce, 1e-3f, opt);
    const std::vector<float> w1 = to_host(m->params_memory, m->num_parameters);
    printf("{\"claim\": 3, \"after\": \"update_parameters\", \"weight_change\": %.3e, \"state_change\": %.3e, "
           "\"adam_steps\": %d, \"grad_max\": %.6e}\n",
           max_abs_diff(w1, w0), max_abs_diff(optimizer_view(m), state0), m->adam_step, max_abs(grad));
    // the same 4 micro-batches with the optimizer stepping after each (4 steps of B = 2)
    GPT2* eager = new_model(B, 1);
    for (int i = 0; i < A; i++)
        train_step(eager, whole_batch(eager, x.data() + i * micro, y.data() + i * micro, 1), 1e-3f, opt);
    const std::vector<float> w_eager = to_host(eager->params_memory, eager->num_parameters);
    // and train_step over the whole batch in one call (the trainer's loop)
    GPT2* whole = new_model(B, A);
    train_step(whole, whole_batch(whole, x.data(), y.data(), A), 1e-3f, opt);
    const std::vector<float> w_whole = to_host(whole->params_memory, whole->num_parameters);
    printf("{\"claim\": 3, \"update_size\": %.3e, \"diff_train_step\": %.3e, \"diff_step_per_micro_batch\": %.3e, "
           "\"adam_steps_per_micro_batch\": %d}\n",
           max_abs_diff(w1, w0), max_abs_diff(w_whole, w1), max_abs_diff(w_eager, w1), eager->adam_step);
}

// The elements of Muon's matrices (every rank's owned ones).
static size_t muon_elements(const GPT2* m) {
    const std::vector<size_t> owned = muon_owner_elements(m);
    size_t sum = 0;
    for (size_t e : owned) sum += e;
    return sum;
}

// The elements of the per-layer tensors (ZeRO-3 gathers them before each
// layer's forward and backward).
static size_t layer_elements(const GPT2* m) {
    size_t sum = 0;
    for (const ParameterLayout& t : m->tensors) sum += t.per_layer ? t.size : 0;
    return sum;
}

// The fp32 gradient bytes a rank holds, from the memory plan's rows.
static size_t gradient_memory(GPT2* m) {
    size_t bytes = 0;
    for (const DeviceBuffer& b : parameter_buffers(m))
        if (b.ptr == (void**)&m->grads_memory || b.ptr == (void**)&m->grad_shard || b.ptr == (void**)&m->grad_receive)
            bytes += b.bytes;
    return bytes;
}

// Claim 6. Per optimizer step, the collectives the CPU runtime's NCCL ran:
// calls and bytes of each kind, B = 1 sequence per rank and micro-batch; with
// AdamW for A = 1, 2, 4, 8 (ZeRO-0, 1, 2: ZeRO-2 reduces every micro-batch),
// and with Muon (its matrices on owner ranks) for A = 1; and the fp32 gradient
// memory a rank holds (the buffer or ZeRO-2's staging, the shard, ZeRO-2's
// receive buffer).
static void bytes(int argc, char** argv) {
    Distributed dist;
    distributed_init(&dist, &argc, &argv);
#ifdef CPUCUDA
    const int N = dist.num_processes, B = 1;
    if (N < 2) FAIL("lesson bytes: run it on 2 or more ranks (mpirun -np 2)");
    const char* kinds[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"};
    struct Case {
        Optimizer optimizer;
        int zero, A;
    };
    std::vector<Case> cases;
    for (int zero : {0, 1, 2, 3})
        for (int A : {1, 2, 4, 8}) cases.push_back({Optimizer::AdamW, zero, A});
    for (int zero : {0, 1}) cases.push_back({Optimizer::Muon, zero, 1});
    for (const Case& k : cases) {
        const int zero = k.zero, A = k.A;
        GPT2* m = new_model(B, A, &dist, zero, k.optimizer);
        std::vector<int> x(A * B * T), y(A * B * T);
        for (size_t i = 0; i < x.size(); i++) x[i] = y[i] = (int)((i * 7 + dist.rank) % 256);
        OptimizerSettings opt;
        const long G = (long)x.size() * N;
        cpucuda_nccl_reset_counters(dist.comm);
        train_step(m, StepBatch{x.data(), y.data(), A, G}, 1e-3f, opt);
        cudaCheck(cudaDeviceSynchronize());
        CpuCudaNcclCounters c;
        cpucuda_nccl_get_counters(dist.comm, &c);
        std::string calls, sent;
        for (int k = 0; k < CPUCUDA_NCCL_NUM_COLLS; k++) {
            calls += std::string(k ? ", " : "") + "\"" + kinds[k] + "\": " + std::to_string(c.calls[k]);
            sent += std::string(k ? ", " : "") + "\"" + kinds[k] + "\": " + std::to_string(c.bytes[k]);
        }
        if (dist.rank == 0)
            printf("{\"claim\": 6, \"optimizer\": \"%s\", \"N\": %d, \"zero\": %d, \"A\": %d, \"B\": %d, "
                   "\"gradient_bytes\": %zu, \"gradient_memory\": %zu, \"muon_elements\": %zu, \"layer_elements\": "
                   "%zu, \"floatx_bytes\": %zu, "
                   "\"calls\": {%s}, \"bytes\": {%s}}\n",
                   OPTIMIZER_NAMES[(int)k.optimizer], N, zero, A, B, m->num_parameters * sizeof(float),
                   gradient_memory(m), muon_elements(m), layer_elements(m), sizeof(floatX), calls.c_str(),
                   sent.c_str());
        free_model(m);
        delete m;
    }
#else
    FAIL("lesson bytes: the collective counters are the CPU runtime's (build/cpu-fp32/lesson)");
#endif
    distributed_free(&dist);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const std::string mode = argc >= 2 ? argv[1] : "";
    if (mode == "normalisation") normalisation();
    else if (mode == "frozen") frozen();
    else if (mode == "bytes") bytes(argc, argv);
    else FAIL("usage: lesson normalisation | lesson frozen | mpirun -np 2 lesson bytes");
    return 0;
}
