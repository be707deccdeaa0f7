// Data parallelism: one process per GPU, started by mpirun or srun; NCCL moves
// the gradients, MPI only starts the ranks and shares the NCCL id.
//
// Built with MULTI_GPU (the default of `make train_gpt`; `make NO_MULTI_GPU=1`
// builds a single-GPU trainer with neither MPI nor NCCL). A program built with
// MULTI_GPU and started without mpirun runs as one rank.
//
// Every collective here runs on the communication stream, ordered against the
// compute stream by events, so the host never waits for communication.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <sys/resource.h>
#include "llmc/kernels/cuda_common.h"
#ifdef MULTI_GPU
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#endif

struct Distributed {
    int rank = 0;            // this process, 0..num_processes-1
    int num_processes = 1;   // N
    int local_rank = 0;      // rank among the processes on this node: the GPU it uses
    cudaStream_t comm_stream = nullptr;  // collectives (created when N > 1)
    cudaEvent_t compute_ready = nullptr; // recorded on the compute stream, awaited by comm_stream
    cudaEvent_t comm_done = nullptr;     // recorded on comm_stream, awaited by the compute stream
#ifdef MULTI_GPU
    ncclComm_t comm = nullptr;
#endif
};

// The rank the launcher gives this process (Open MPI, MPICH/Hydra, PMIx, Slurm's
// srun), as the text of its variable; nullptr without a launcher.
inline const char* launcher_rank_variable() {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
        if (const char* v = getenv(name)) return v;
    return nullptr;
}
// That rank, for messages before MPI is up; 0 without a launcher.
inline int launcher_rank() {
    const char* v = launcher_rank_variable();
    return v ? atoi(v) : 0;
}

#ifdef MULTI_GPU
// Errors throw llmc::Error, like cudaCheck.
inline void nccl_check(ncclResult_t r, const char* file, int line, const char* call) {
    if (r != ncclSuccess)
        llmc::fail(std::string("NCCL ") + ncclGetErrorString(r) + " at " + file + ":" + std::to_string(line) + ": " +
                   call);
}
#define ncclCheck(call) nccl_check((call), __FILE__, __LINE__, #call)

// MPI is initialised and not yet finalised.
inline bool mpi_running() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}

// A rank that exits early (a bad flag, a missing file, a NaN: main prints the
// llmc::Error and returns EXIT_FAILURE) would leave the others waiting in a
// collective forever; aborting the MPI job at its exit stops them all.
// (One rank alone just exits: its error line stays the only output.)
inline void distributed_abort_at_exit() {
    int size = 1;
    if (mpi_running()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
    }
}

// The local rank from the launcher's environment (Open MPI, MPICH/Hydra,
// Slurm's srun), else from the processes sharing this node's memory.
inline int distributed_local_rank() {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
        if (const char* v = getenv(name)) return atoi(v);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
}

// MPI's start-up writes shared-memory files of several MiB (Open MPI's PMIx
// store; in its launcher too): under a smaller file-size limit it ends in
// SIGXFSZ or MPI's own abort, with no line of ours. Refused before MPI_Init.
constexpr rlim_t kMinFileSizeLimit = rlim_t(16) << 20;

inline void refuse_small_file_size_limit() {
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= kMinFileSizeLimit)
        return;
    llmc::fail("the file-size limit (ulimit -f) is " + std::to_string(limit.rlim_cur / 1024) +
               " KiB: MPI's start-up "
               "writes shared-memory files of several MiB; give it at least " +
               std::to_string(kMinFileSizeLimit >> 20) + " MiB (ulimit -f unlimited)");
}
#endif

// Where no GPU can be used (none, no driver, or a driver older than this build's CUDA
// runtime), the first CUDA call of the program says so and why, and names the program's
// CPU build, which runs without one (the CPU runtime always has its one device).
inline void require_usable_gpu(const char* program) {
    int devices = 0;
    const cudaError_t err = cudaGetDeviceCount(&devices);
    if (err == cudaSuccess && devices > 0) return;
    const std::string why = err == cudaSuccess ? "no CUDA device" : cudaGetErrorString(err);
    std::string name = program ? program : "";
    name = name.substr(name.find_last_of('/') + 1);
    if (name != "train_gpt" && name != "train_llama3") name = "train_gpt";
    llmc::fail("no usable GPU found (" + why + "); " + name + "_cpu runs without one (make " + name + "_cpu)");
}

// Starts this rank: MPI, the GPU of its local rank, the NCCL communicator
// (rank 0 makes the id, MPI broadcasts it) and the communication stream.
// A process that no launcher started is the one rank and never starts MPI:
// Open MPI's start-up of a lone process (a singleton, with its own daemon)
// costs a third of a second and writes shared-memory files, for nothing.
inline void distributed_init(Distributed* d, int* argc, char*** argv) {
    require_usable_gpu((*argv)[0]);
#ifdef MULTI_GPU
    if (!launcher_rank_variable()) {
        cudaCheck(cudaSetDevice(0));
        return;
    }
    refuse_small_file_size_limit();
    MPI_Init(argc, argv);
    atexit(distributed_abort_at_exit);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->num_processes);
    d->local_rank = distributed_local_rank();
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (d->num_processes > 1 && d->local_rank >= devices)
        llmc::fail("rank " + std::to_string(d->rank) + ": local rank " + std::to_string(d->local_rank) +
                   " has no GPU of its own (" + std::to_string(devices) +
                   " on this node); start at most one rank per GPU");
    cudaCheck(cudaSetDevice(d->local_rank));
    if (d->num_processes == 1) return;
    ncclUniqueId id;
    if (d->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclCheck(ncclCommInitRank(&d->comm, d->num_processes, id, d->rank));
    cudaCheck(cudaStreamCreate(&d->comm_stream));
    cudaCheck(cudaEventCreateWithFlags(&d->compute_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&d->comm_done, cudaEventDisableTiming));
#else
    (void)argc;
    (void)argv;
#endif
}

inline void distributed_free(Distributed* d) {
#ifdef MULTI_GPU
    if (d->num_processes > 1) {
        ncclCheck(ncclCommDestroy(d->comm));
        cudaCheck(cudaStreamDestroy(d->comm_stream));
        cudaCheck(cudaEventDestroy(d->compute_ready));
        cudaCheck(cudaEventDestroy(d->comm_done));
    }
    if (mpi_running()) MPI_Finalize();
#else
    (void)d;
#endif
}

// A clean early exit that every rank takes (--help): MPI is finalised first,
// so the exit is not taken for a failure. Not an error, hence no llmc::Error:
// the one exit in llmc/.
[[noreturn]] inline void distributed_exit_success() {
#ifdef MULTI_GPU
    if (mpi_running()) MPI_Finalize();
#endif
    exit(EXIT_SUCCESS);
}

// Communication waits for everything issued so far on the compute stream.
inline void comm_after_compute(const Distributed* d, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(d->compute_ready, compute));
    cudaCheck(cudaStreamWaitEvent(d->comm_stream, d->compute_ready, 0));
}
// The compute stream waits for every collective issued so far.
inline void compute_after_comm(const Distributed* d, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(d->comm_done, d->comm_stream));
    cudaCheck(cudaStreamWaitEvent(compute, d->comm_done, 0));
}

// ---- collectives on comm_stream (N > 1 only; sums, never averages) ----------
#ifdef MULTI_GPU
template <class T> inline ncclDataType_t nccl_type();
template <> inline ncclDataType_t nccl_type<float>() { return ncclFloat; }
template <> inline ncclDataType_t nccl_type<__nv_bfloat16>() { return ncclBfloat16; }

inline void group_start() { ncclCheck(ncclGroupStart()); }
inline void group_end() { ncclCheck(ncclGroupEnd()); }
// recv[i] = sum over ranks of send[i] (in place when recv == send)
template <class T>
inline void all_reduce_sum(T* recv, const T* send, size_t n, const Distributed* d) {
    ncclCheck(ncclAllReduce(send, recv, n, nccl_type<T>(), ncclSum, d->comm, d->comm_stream));
}
// recv[i] = sum over ranks of send[rank * n + i]
template <class T>
inline void reduce_scatter_sum(T* recv, const T* send, size_t n, const Distributed* d) {
    ncclCheck(ncclReduceScatter(send, recv, n, nccl_type<T>(), ncclSum, d->comm, d->comm_stream));
}
// buffer[r * n + i] = rank r's buffer[r * n + i], for every r (in place)
template <class T>
inline void all_gather_in_place(T* buffer, size_t n, const Distributed* d) {
    ncclCheck(ncclAllGather(buffer + (size_t)d->rank * n, buffer, n, nccl_type<T>(), d->comm, d->comm_stream));
}
// root's recv[i] = sum over ranks of send[i] (recv is read on root only)
template <class T>
inline void reduce_sum_to(int root, T* recv, const T* send, size_t n, const Distributed* d) {
    ncclCheck(ncclReduce(send, recv, n, nccl_type<T>(), ncclSum, root, d->comm, d->comm_stream));
}
// buffer[i] = root's buffer[i], on every rank (in place)
template <class T>
inline void broadcast_in_place(int root, T* buffer, size_t n, const Distributed* d) {
    ncclCheck(ncclBroadcast(buffer, buffer, n, nccl_type<T>(), root, d->comm, d->comm_stream));
}
#else
inline void group_start() {}
inline void group_end() {}
template <class T> inline void all_reduce_sum(T*, const T*, size_t, const Distributed*) {}
template <class T> inline void reduce_scatter_sum(T*, const T*, size_t, const Distributed*) {}
template <class T> inline void all_gather_in_place(T*, size_t, const Distributed*) {}
template <class T> inline void reduce_sum_to(int, T*, const T*, size_t, const Distributed*) {}
template <class T> inline void broadcast_in_place(int, T*, size_t, const Distributed*) {}
#endif

// Host values summed over ranks (evaluation results: not on the training path).
inline double host_sum(double value, const Distributed* d) {
#ifdef MULTI_GPU
    if (d->num_processes > 1) MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#else
    (void)d;
#endif
    return value;
}

// Every rank's `count` values, rank by rank, on every rank (checkpoints: each rank's file
// size and hash for the DONE marker).
inline std::vector<uint64_t> host_all_gather(const uint64_t* mine, int count, const Distributed* d) {
    std::vector<uint64_t> all(mine, mine + count);
#ifdef MULTI_GPU
    if (d->num_processes > 1) {
        all.resize((size_t)count * d->num_processes);
        MPI_Allgather(mine, count, MPI_UINT64_T, all.data(), count, MPI_UINT64_T, MPI_COMM_WORLD);
    }
#else
    (void)d;
#endif
    return all;
}

// Every rank's text, rank by rank, on every rank (the values of a setting the
// ranks disagree on, for the error that names them).
inline std::vector<std::string> host_all_gather_text(const std::string& mine, const Distributed* d) {
    const uint64_t length = mine.size();
    const std::vector<uint64_t> lengths = host_all_gather(&length, 1, d);
    std::vector<std::string> all(lengths.size());
#ifdef MULTI_GPU
    if (d->num_processes > 1) {
        std::vector<int> counts(lengths.begin(), lengths.end()), offsets(lengths.size(), 0);
        for (size_t r = 1; r < counts.size(); r++) offsets[r] = offsets[r - 1] + counts[r - 1];
        std::string joined((size_t)offsets.back() + counts.back(), '\0');
        MPI_Allgatherv(mine.data(), (int)mine.size(), MPI_CHAR, &joined[0], counts.data(), offsets.data(), MPI_CHAR,
                       MPI_COMM_WORLD);
        for (size_t r = 0; r < all.size(); r++) all[r] = joined.substr(offsets[r], counts[r]);
        return all;
    }
#endif
    all[0] = mine;
    return all;
}

// Every rank has reached this point (checkpoints: all files durable before DONE).
inline void host_barrier(const Distributed* d) {
#ifdef MULTI_GPU
    if (d->num_processes > 1) MPI_Barrier(MPI_COMM_WORLD);
#else
    (void)d;
#endif
}

inline const char* distributed_build_note() {
#ifdef MULTI_GPU
    return "MPI + NCCL build: mpirun -np N (or srun) runs N ranks, one per GPU; without mpirun, one rank";
#else
    return "single-GPU build (made with NO_MULTI_GPU=1: no MPI, no NCCL)";
#endif
}
