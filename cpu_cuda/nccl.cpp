// NCCL for the CUDA-on-CPU runtime: the real NCCL API (nccl.h from the CUDA
// toolkit) implemented on host memory.
//
// Two builds of this file:
//   plain g++                 single-rank communicators only; every collective
//                             is a copy.
//   -DCPUCUDA_WITH_MPI        one NCCL rank per MPI process (run under mpirun);
//                             multi-rank collectives move data with MPI.
//
// Semantics:
//  - Device memory is host memory in this runtime, so buffers are plain
//    pointers. Every call runs on the calling thread before it returns, after
//    the work it depends on in stream order (with CPUCUDA_STREAMS=deferred,
//    exactly that work: see internal.h), so MPI calls stay in program order.
//  - Reductions are done by this file, not by MPI: for each element the rank
//    inputs are combined in rank order 0,1,...,n-1 (for fp16/bf16 in fp32,
//    rounded once at the end; for integers with wrap-around), so results are
//    bitwise deterministic, identical on every rank, independent of MPI's
//    algorithm choice, and equal to a host reference that sums in rank order.
//    MPI only moves bytes (MPI_Alltoall(v), MPI_Allgather(v), MPI_Bcast,
//    MPI_Gatherv), so no user-defined MPI_Ops are needed.
//    ncclAvg = sum, then divide by nranks (integer division for integers).
//  - ncclGroupStart/ncclGroupEnd: calls in between are argument-checked when
//    issued (errors are returned then) and executed, in call order, at the
//    outermost ncclGroupEnd. Groups nest. Group state is per thread, as in NCCL.
//  - Counters (cpucuda_nccl.h) count a call when it executes.
//  - Errors return the ncclResult_t NCCL would return, write a one-line
//    message to stderr ("cpucuda nccl: ...") and keep it for ncclGetLastError.
//  - ncclCommInitRank with MPI: every process of MPI_COMM_WORLD must call it
//    (the communicator is MPI_Comm_split(MPI_COMM_WORLD, 0, rank)), with the
//    same nranks == the number of processes and the same ncclUniqueId; a
//    communicator with nranks == 1 needs no MPI and is made locally.
//    If MPI is not initialised, ncclCommInitRank initialises it and finalises
//    it at exit; MPI the program initialised itself is left to the program.
//
// Not implemented (link errors if used): send/recv, all-to-all, gather,
// scatter, comm split/shrink, user reduction ops (ncclRedOpCreatePreMulSum),
// buffer registration, ncclMemAlloc. fp8 data types return ncclInvalidArgument.
// ncclCommInitAll supports ndev == 1 only.
//
// Memory: a multi-rank communicator keeps its temporaries (about one call's
// buffer size: count elements for all-reduce, nranks*recvcount for
// reduce-scatter) for reuse until ncclCommDestroy. Counts above 2^30 elements
// are moved in pieces (MPI counts are int); CPUCUDA_NCCL_CHUNK_ELEMS (read at
// ncclCommInitRank) lowers the piece size so tests can reach that code.
#include <nccl.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "cpucuda_nccl.h"
#include "internal.h"

#ifdef CPUCUDA_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

struct ncclComm {
    int nranks = 1;
    int rank = 0;
    int device = 0;
#ifdef CPUCUDA_WITH_MPI
    MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL for a single-rank communicator
#endif
    CpuCudaNcclCounters counters{};
    size_t chunk_elems = 0;                        // max elements per MPI call
    std::vector<unsigned char> scratch_a, scratch_b;  // reused temporaries
};

namespace {

// ---- bookkeeping -------------------------------------------------------------

// First bytes of every id made by ncclGetUniqueId (the rest is random).
const char kIdTag[16] = "cpucuda-ncclid1";

std::mutex g_mu;                  // guards g_live
std::set<ncclComm*> g_live;       // communicators made and not yet destroyed

thread_local std::string t_last_error;

bool is_live(const ncclComm* c) {
    if (!c) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    return g_live.count(const_cast<ncclComm*>(c)) != 0;
}

void register_comm(ncclComm* c) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.insert(c);
}

bool unregister_comm(ncclComm* c) {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_live.erase(c) != 0;
}

// Records a message for ncclGetLastError, prints it (unless quiet) and returns r.
ncclResult_t vrecord(bool print, ncclResult_t r, const char* fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    t_last_error = buf;
    if (print) {
        fprintf(stderr, "cpucuda nccl: %s\n", buf);
        fflush(stderr);
    }
    return r;
}

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord(true, r, fmt, ap);
    va_end(ap);
    return r;
}

// Same as fail() but prints only when `print` (used where all ranks reach the
// same verdict, so that one of them reports it).
[[maybe_unused]] __attribute__((format(printf, 3, 4))) ncclResult_t fail_quiet_unless(bool print, ncclResult_t r,
                                                                                      const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord(print, r, fmt, ap);
    va_end(ap);
    return r;
}

size_t default_chunk_elems() {
    // Elements per MPI call (MPI counts are int). Overridable for testing the
    // chunked code paths with small buffers.
    size_t chunk = size_t(1) << 30;
    if (const char* s = getenv("CPUCUDA_NCCL_CHUNK_ELEMS")) {
        long long v = atoll(s);
        if (v >= 1 && v <= (1ll << 30)) chunk = (size_t)v;
    }
    return chunk;
}

[[maybe_unused]] uint64_t fnv1a(const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

bool id_has_tag(const ncclUniqueId& id) { return memcmp(id.internal, kIdTag, sizeof kIdTag) == 0; }

int current_device() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    return dev;
}

ncclComm* new_comm(int nranks, int rank, int device) {
    ncclComm* c = new ncclComm();
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    c->chunk_elems = default_chunk_elems();
    register_comm(c);
    return c;
}

// ---- data types and reductions -------------------------------------------------

size_t type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8:
        case ncclUint8: return 1;
        case ncclFloat16:
        case ncclBfloat16: return 2;
        case ncclInt32:
        case ncclUint32:
        case ncclFloat32: return 4;
        case ncclInt64:
        case ncclUint64:
        case ncclFloat64: return 8;
        default: return 0;
    }
}

// Accumulator type and conversions for each element type.
template <class T> struct Acc {
    using type = T;
    static T load(T x) { return x; }
    static T store(T x) { return x; }
};
template <> struct Acc<__half> {
    using type = float;
    static float load(__half x) { return __half2float(x); }
    static __half store(float x) { return __float2half_rn(x); }
};
template <> struct Acc<__nv_bfloat16> {
    using type = float;
    static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __nv_bfloat16 store(float x) { return __float2bfloat16(x); }
};

template <class A, int OP>
inline A combine(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        if constexpr (OP == ncclSum || OP == ncclAvg) return (A)(U)((U)a + (U)b);   // wraps
        else if constexpr (OP == ncclProd) return (A)(U)((U)a * (U)b);             // wraps
        else if constexpr (OP == ncclMax) return a > b ? a : b;
        else return a < b ? a : b;
    } else {
        if constexpr (OP == ncclSum || OP == ncclAvg) return a + b;
        else if constexpr (OP == ncclProd) return a * b;
        else if constexpr (OP == ncclMax) return std::fmax(a, b);
        else return std::fmin(a, b);
    }
}

// out[e] = rows[0][e] op rows[1][e] op ... op rows[n-1][e], left to right,
// where rows[i] starts at element i*stride of `rows`.
template <class T, int OP>
void reduce_rows(const void* rows_v, size_t stride, int n, size_t len, void* out_v) {
    using AT = Acc<T>;
    using A = typename AT::type;
    const T* rows = (const T*)rows_v;
    T* out = (T*)out_v;
    for (size_t e = 0; e < len; e++) {
        A a = AT::load(rows[e]);
        for (int i = 1; i < n; i++) a = combine<A, OP>(a, AT::load(rows[(size_t)i * stride + e]));
        if constexpr (OP == ncclAvg) {
            if constexpr (std::is_integral_v<A>) a = (A)(a / n);
            else a = a / (A)n;
        }
        out[e] = AT::store(a);
    }
}

typedef void (*ReduceFn)(const void*, size_t, int, size_t, void*);

template <class T>
ReduceFn reduce_fn_for(ncclRedOp_t op) {
    switch (op) {
        case ncclSum: return reduce_rows<T, ncclSum>;
        case ncclProd: return reduce_rows<T, ncclProd>;
        case ncclMax: return reduce_rows<T, ncclMax>;
        case ncclMin: return reduce_rows<T, ncclMin>;
        case ncclAvg: return reduce_rows<T, ncclAvg>;
        default: return nullptr;
    }
}

[[maybe_unused]] ReduceFn reduce_fn(ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
        case ncclInt8: return reduce_fn_for<int8_t>(op);
        case ncclUint8: return reduce_fn_for<uint8_t>(op);
        case ncclInt32: return reduce_fn_for<int32_t>(op);
        case ncclUint32: return reduce_fn_for<uint32_t>(op);
        case ncclInt64: return reduce_fn_for<int64_t>(op);
        case ncclUint64: return reduce_fn_for<uint64_t>(op);
        case ncclFloat16: return reduce_fn_for<__half>(op);
        case ncclFloat32: return reduce_fn_for<float>(op);
        case ncclFloat64: return reduce_fn_for<double>(op);
        case ncclBfloat16: return reduce_fn_for<__nv_bfloat16>(op);
        default: return nullptr;
    }
}

// ---- queued operations ---------------------------------------------------------

enum Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };

const char* kind_name(Kind k) {
    switch (k) {
        case kAllReduce: return "ncclAllReduce";
        case kReduceScatter: return "ncclReduceScatter";
        case kAllGather: return "ncclAllGather";
        case kBroadcast: return "ncclBroadcast";
        case kReduce: return "ncclReduce";
    }
    return "?";
}

int counter_index(Kind k) {
    switch (k) {
        case kAllReduce: return CPUCUDA_NCCL_ALLREDUCE;
        case kReduceScatter: return CPUCUDA_NCCL_REDUCESCATTER;
        case kAllGather: return CPUCUDA_NCCL_ALLGATHER;
        case kBroadcast: return CPUCUDA_NCCL_BROADCAST;
        case kReduce: return CPUCUDA_NCCL_REDUCE;
    }
    return 0;
}

struct Op {
    Kind kind;
    const void* send;
    void* recv;
    size_t count;        // count / recvcount / sendcount as passed
    ncclDataType_t type;
    ncclRedOp_t op;      // reductions only
    int root;            // broadcast / reduce only
    ncclComm* comm;
    cudaStream_t stream;
};

thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group_ops;

// Bytes the counters add for one call (see cpucuda_nccl.h).
uint64_t counted_bytes(const Op& o) {
    size_t es = type_size(o.type);
    switch (o.kind) {
        case kReduceScatter:
        case kAllGather: return (uint64_t)o.count * o.comm->nranks * es;
        default: return (uint64_t)o.count * es;
    }
}

// ---- MPI transport -------------------------------------------------------------

#ifdef CPUCUDA_WITH_MPI

bool g_we_initialized_mpi = false;

void finalize_mpi_at_exit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

ncclResult_t ensure_mpi(const char* fn) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return fail(ncclInvalidUsage, "%s: MPI has already been finalized", fn);
    if (!initialized) {
        if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return fail(ncclSystemError, "%s: MPI_Init failed", fn);
        if (!g_we_initialized_mpi) {
            g_we_initialized_mpi = true;
            atexit(finalize_mpi_at_exit);
        }
    }
    return ncclSuccess;
}

ncclResult_t mpi_ok(int rc, const char* fn, const char* what) {
    if (rc == MPI_SUCCESS) return ncclSuccess;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fail(ncclSystemError, "%s: %s failed: %s", fn, what, msg);
}

#define MPI_TRY(call, what)                         \
    do {                                            \
        ncclResult_t r_ = mpi_ok((call), fn, what); \
        if (r_ != ncclSuccess) return r_;           \
    } while (0)

MPI_Datatype mpi_bytes_type(size_t es) {
    switch (es) {
        case 1: return MPI_UINT8_T;
        case 2: return MPI_UINT16_T;
        case 4: return MPI_UINT32_T;
        default: return MPI_UINT64_T;
    }
}

// Balanced split of len elements over n ranks.
inline size_t seg_off(size_t j, size_t len, size_t n) { return j * (len / n) + std::min(j, len % n); }
inline size_t seg_len(size_t j, size_t len, size_t n) { return len / n + (j < len % n ? 1 : 0); }

unsigned char* scratch(std::vector<unsigned char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
}

// All-reduce (to_root < 0) or reduce to root (to_root >= 0): per chunk, each
// rank receives everybody's piece of its segment (MPI_Alltoallv), reduces it in
// rank order, then the segments are gathered to every rank or to the root.
ncclResult_t mpi_reduce_common(ncclComm* c, const Op& o, int to_root) {
    const char* fn = kind_name(o.kind);
    const size_t es = type_size(o.type);
    const int n = c->nranks, r = c->rank;
    const MPI_Datatype dt = mpi_bytes_type(es);
    const ReduceFn f = reduce_fn(o.type, o.op);
    std::vector<int> scounts(n), sdispls(n), rcounts(n), rdispls(n);
    for (size_t off = 0; off < o.count; off += c->chunk_elems) {
        const size_t len = std::min(c->chunk_elems, o.count - off);
        for (int j = 0; j < n; j++) {
            scounts[j] = (int)seg_len(j, len, n);
            sdispls[j] = (int)seg_off(j, len, n);
        }
        const size_t mine = seg_len(r, len, n);
        for (int i = 0; i < n; i++) {
            rcounts[i] = (int)mine;
            rdispls[i] = (int)(i * mine);
        }
        unsigned char* rows = scratch(c->scratch_a, n * mine * es);
        const unsigned char* sbuf = (const unsigned char*)o.send + off * es;
        MPI_TRY(
            MPI_Alltoallv(sbuf, scounts.data(), sdispls.data(), dt, rows, rcounts.data(), rdispls.data(), dt, c->mpi),
            "MPI_Alltoallv");
        if (to_root < 0) {
            unsigned char* rbuf = (unsigned char*)o.recv + off * es;
            f(rows, mine, n, mine, rbuf + (size_t)sdispls[r] * es);
            MPI_TRY(
                MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rbuf, scounts.data(), sdispls.data(), dt, c->mpi),
                "MPI_Allgatherv");
        } else {
            unsigned char* seg = scratch(c->scratch_b, mine * es);
            f(rows, mine, n, mine, seg);
            unsigned char* rbuf = r == to_root ? (unsigned char*)o.recv + off * es : nullptr;
            MPI_TRY(MPI_Gatherv(seg, (int)mine, dt, rbuf, scounts.data(), sdispls.data(), dt, to_root, c->mpi),
                    "MPI_Gatherv");
        }
    }
    return ncclSuccess;
}

ncclResult_t mpi_reduce_scatter(ncclComm* c, const Op& o) {
    const char* fn = kind_name(o.kind);
    const size_t es = type_size(o.type);
    const int n = c->nranks;
    const MPI_Datatype dt = mpi_bytes_type(es);
    const ReduceFn f = reduce_fn(o.type, o.op);
    const size_t rc = o.count;
    const size_t chunk = std::max<size_t>(1, c->chunk_elems / n);
    for (size_t off = 0; off < rc; off += chunk) {
        const size_t len = std::min(chunk, rc - off);
        const unsigned char* sbuf;
        if (len == rc) {
            sbuf = (const unsigned char*)o.send;  // one step: the input is already n x len
        } else {
            unsigned char* pack = scratch(c->scratch_b, n * len * es);
            for (int j = 0; j < n; j++)
                memcpy(pack + j * len * es, (const unsigned char*)o.send + (j * rc + off) * es, len * es);
            sbuf = pack;
        }
        unsigned char* rows = scratch(c->scratch_a, n * len * es);
        MPI_TRY(MPI_Alltoall(sbuf, (int)len, dt, rows, (int)len, dt, c->mpi), "MPI_Alltoall");
        // In place (recv == send + rank*recvcount) is safe: this chunk of the
        // input has been read by MPI_Alltoall before it is overwritten here.
        f(rows, len, n, len, (unsigned char*)o.recv + off * es);
    }
    return ncclSuccess;
}

ncclResult_t mpi_all_gather(ncclComm* c, const Op& o) {
    const char* fn = kind_name(o.kind);
    const size_t es = type_size(o.type);
    const int n = c->nranks, r = c->rank;
    const MPI_Datatype dt = mpi_bytes_type(es);
    const size_t sc = o.count;
    unsigned char* recv = (unsigned char*)o.recv;
    const bool in_place = (const unsigned char*)o.send == recv + (size_t)r * sc * es;
    const size_t chunk = std::max<size_t>(1, c->chunk_elems / n);
    if (sc <= chunk) {
        MPI_TRY(MPI_Allgather(in_place ? MPI_IN_PLACE : o.send, (int)sc, dt, recv, (int)sc, dt, c->mpi),
                "MPI_Allgather");
        return ncclSuccess;
    }
    for (size_t off = 0; off < sc; off += chunk) {
        const size_t len = std::min(chunk, sc - off);
        unsigned char* tmp = scratch(c->scratch_a, n * len * es);
        MPI_TRY(MPI_Allgather((const unsigned char*)o.send + off * es, (int)len, dt, tmp, (int)len, dt, c->mpi),
                "MPI_Allgather");
        for (int j = 0; j < n; j++) memcpy(recv + (j * sc + off) * es, tmp + j * len * es, len * es);
    }
    return ncclSuccess;
}

ncclResult_t mpi_broadcast(ncclComm* c, const Op& o) {
    const char* fn = kind_name(o.kind);
    const size_t es = type_size(o.type);
    const MPI_Datatype dt = mpi_bytes_type(es);
    unsigned char* recv = (unsigned char*)o.recv;
    if (c->rank == o.root && o.send != o.recv && o.count) memmove(recv, o.send, o.count * es);
    for (size_t off = 0; off < o.count; off += c->chunk_elems) {
        const size_t len = std::min(c->chunk_elems, o.count - off);
        MPI_TRY(MPI_Bcast(recv + off * es, (int)len, dt, o.root, c->mpi), "MPI_Bcast");
    }
    return ncclSuccess;
}

#undef MPI_TRY
#endif  // CPUCUDA_WITH_MPI

// One rank: every collective is a copy (the reduction of one input is itself).
ncclResult_t local_execute(const Op& o) {
    const size_t bytes = o.count * type_size(o.type);
    if (bytes && o.send != o.recv) memmove(o.recv, o.send, bytes);
    return ncclSuccess;
}

ncclResult_t execute(const Op& o) {
    if (!is_live(o.comm))
        return fail(ncclInvalidArgument, "%s: the communicator was destroyed before the call ran", kind_name(o.kind));
    ncclComm* c = o.comm;
    ncclResult_t r = ncclSuccess;
    if (c->nranks == 1) {
        r = local_execute(o);
    } else {
#ifdef CPUCUDA_WITH_MPI
        switch (o.kind) {
            case kAllReduce: r = mpi_reduce_common(c, o, -1); break;
            case kReduce: r = mpi_reduce_common(c, o, o.root); break;
            case kReduceScatter: r = mpi_reduce_scatter(c, o); break;
            case kAllGather: r = mpi_all_gather(c, o); break;
            case kBroadcast: r = mpi_broadcast(c, o); break;
        }
#else
        r = fail(ncclInternalError, "%s: multi-rank communicator without MPI", kind_name(o.kind));
#endif
    }
    if (r == ncclSuccess) {
        int k = counter_index(o.kind);
        c->counters.calls[k] += 1;
        c->counters.bytes[k] += counted_bytes(o);
    }
    return r;
}

// Runs a call at once, after the work on its stream that it depends on (in
// the runtime's deferred stream mode, only that work), so MPI calls keep
// program order on every rank.
ncclResult_t execute_in_stream_order(const Op& o) {
    ncclResult_t r = ncclSuccess;
    cpucuda::run_after_dependencies(o.stream, [&] { r = execute(o); });
    return r;
}

ncclResult_t issue(const Op& o) {
    if (t_group_depth > 0) {
        t_group_ops.push_back(o);
        return ncclSuccess;
    }
    return execute_in_stream_order(o);
}

// ---- argument checks -------------------------------------------------------------

ncclResult_t check_comm(const char* fn, ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (!is_live(comm))
        return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed or never initialised)", fn,
                    (void*)comm);
    return ncclSuccess;
}

ncclResult_t check_type(const char* fn, ncclDataType_t t) {
    if (type_size(t) != 0) return ncclSuccess;
    if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
        return fail(ncclInvalidArgument, "%s: fp8 datatype %d is not supported by the CPU runtime", fn, (int)t);
    return fail(ncclInvalidArgument, "%s: invalid datatype %d", fn, (int)t);
}

ncclResult_t check_op(const char* fn, ncclRedOp_t op) {
    if ((int)op >= 0 && (int)op < (int)ncclNumOps) return ncclSuccess;
    return fail(ncclInvalidArgument, "%s: invalid or unsupported reduction op %d", fn, (int)op);
}

// count elements times `mult` must fit in memory (in bytes).
ncclResult_t check_count(const char* fn, size_t count, size_t mult, ncclDataType_t t) {
    const size_t es = type_size(t);
    if (count > SIZE_MAX / es / mult) return fail(ncclInvalidArgument, "%s: count %zu is too large", fn, count);
    return ncclSuccess;
}

ncclResult_t check_ptr(const char* fn, const char* name, const void* p, size_t count) {
    if (count && !p) return fail(ncclInvalidArgument, "%s: %s is NULL", fn, name);
    return ncclSuccess;
}

ncclResult_t check_root(const char* fn, int root, const ncclComm* c) {
    if (root < 0 || root >= c->nranks)
        return fail(ncclInvalidArgument, "%s: root %d is out of range [0, %d)", fn, root, c->nranks);
    return ncclSuccess;
}

#define TRY(x)                            \
    do {                                  \
        ncclResult_t r_ = (x);            \
        if (r_ != ncclSuccess) return r_; \
    } while (0)

}  // namespace

// ---- public API ------------------------------------------------------------------

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error (an MPI call failed)";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t /*comm*/) { return t_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    memcpy(uniqueId->internal, kIdTag, sizeof kIdTag);
    uint64_t seed = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
    seed ^= (uint64_t)(uintptr_t)uniqueId * 0x9e3779b97f4a7c15ull;
    try {
        std::random_device rd;
        seed ^= ((uint64_t)rd() << 32) ^ rd();
    } catch (...) {}
    std::mt19937_64 gen(seed);
    for (size_t i = sizeof kIdTag; i + 8 <= sizeof uniqueId->internal; i += 8) {
        uint64_t v = gen();
        memcpy(uniqueId->internal + i, &v, 8);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    const char* fn = "ncclCommInitRank";
    const bool tag_ok = id_has_tag(commId);
    if (nranks == 1 || nranks < 1) {
        // Made locally: no other process takes part.
        if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
        *comm = nullptr;
        if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks %d must be at least 1", fn, nranks);
        if (rank != 0) return fail(ncclInvalidArgument, "%s: rank %d is out of range [0, 1)", fn, rank);
        if (!tag_ok)
            return fail(ncclInvalidArgument,
                        "%s: the ncclUniqueId was not made by ncclGetUniqueId (was the id broadcast?)", fn);
        *comm = new_comm(1, 0, current_device());
        return ncclSuccess;
    }
#ifndef CPUCUDA_WITH_MPI
    if (comm) *comm = nullptr;
    return fail(ncclInvalidArgument,
                "%s: nranks=%d, but this CPU runtime was built without MPI and supports single-rank "
                "communicators only (link libcpucuda_mpi.a and run under mpirun for more ranks)",
                fn, nranks);
#else
    TRY(ensure_mpi(fn));
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm mc = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &mc) != MPI_SUCCESS)
        return fail(ncclSystemError, "%s: MPI_Comm_split failed", fn);
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);

    // Everybody learns what everybody passed, so that all reach the same verdict.
    struct Info {
        uint64_t id_hash;
        int32_t nranks, rank, tag_ok, comm_ok, world_rank, pad;
    };
    Info mine = {
        fnv1a(commId.internal, sizeof commId.internal), nranks, rank, tag_ok ? 1 : 0, comm ? 1 : 0, world_rank, 0};
    int size = 0, me = 0;
    MPI_Comm_size(mc, &size);
    MPI_Comm_rank(mc, &me);
    std::vector<Info> all(size);
    if (MPI_Allgather(&mine, (int)sizeof(Info), MPI_BYTE, all.data(), (int)sizeof(Info), MPI_BYTE, mc) != MPI_SUCCESS) {
        MPI_Comm_free(&mc);
        return fail(ncclSystemError, "%s: MPI_Allgather failed", fn);
    }
    const bool report = me == 0;  // one process prints the common verdict
    ncclResult_t r = ncclSuccess;
    for (const Info& in : all) {
        if (!in.comm_ok) {
            r = fail_quiet_unless(report, ncclInvalidArgument, "%s: MPI process %d passed comm = NULL", fn,
                                  in.world_rank);
            break;
        }
    }
    if (r == ncclSuccess) {
        for (const Info& in : all) {
            if (!in.tag_ok) {
                r = fail_quiet_unless(report, ncclInvalidUsage,
                                      "%s: MPI process %d passed an ncclUniqueId that ncclGetUniqueId did not "
                                      "make (was the id broadcast?)",
                                      fn, in.world_rank);
                break;
            }
        }
    }
    if (r == ncclSuccess) {
        for (const Info& in : all) {
            if (in.id_hash != all[0].id_hash) {
                r = fail_quiet_unless(report, ncclInvalidUsage,
                                      "%s: ranks passed different ncclUniqueIds (was the id broadcast?)", fn);
                break;
            }
        }
    }
    if (r == ncclSuccess) {
        for (const Info& in : all) {
            if (in.nranks != all[0].nranks) {
                r = fail_quiet_unless(report, ncclInvalidUsage,
                                      "%s: processes passed different nranks (%d on MPI process %d, %d on MPI "
                                      "process %d)",
                                      fn, all[0].nranks, all[0].world_rank, in.nranks, in.world_rank);
                break;
            }
        }
    }
    if (r == ncclSuccess && nranks != size) {
        r = fail_quiet_unless(report, ncclInvalidUsage,
                              "%s: nranks=%d but %d MPI processes called it (the CPU runtime runs one rank per "
                              "MPI process, and every process of MPI_COMM_WORLD must call ncclCommInitRank)",
                              fn, nranks, size);
    }
    if (r == ncclSuccess) {
        for (const Info& in : all) {
            if (in.rank < 0 || in.rank >= nranks) {
                r = fail_quiet_unless(report, ncclInvalidArgument,
                                      "%s: rank %d (MPI process %d) is out of range [0, %d)", fn, in.rank,
                                      in.world_rank, nranks);
                break;
            }
        }
    }
    if (r == ncclSuccess) {
        // Split by key = rank sorted the processes by rank, so a rank passed
        // twice shows up as two neighbours (all ranks are in range, size == nranks).
        for (int i = 1; i < size; i++) {
            if (all[i].rank == all[i - 1].rank) {
                r = fail_quiet_unless(report, ncclInvalidUsage,
                                      "%s: rank %d was passed by more than one process (MPI processes %d and %d)", fn,
                                      all[i].rank, all[i - 1].world_rank, all[i].world_rank);
                break;
            }
        }
    }
    if (r != ncclSuccess) {
        MPI_Comm_free(&mc);
        if (comm) *comm = nullptr;
        return r;
    }
    ncclComm* c = new_comm(nranks, rank, current_device());
    c->mpi = mc;
    *comm = c;
    return ncclSuccess;
#endif
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* /*config*/) {
    return ncclCommInitRank(comm, nranks, commId, rank);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
    const char* fn = "ncclCommInitAll";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (ndev != 1)
        return fail(ncclInvalidArgument,
                    "%s: ndev=%d; the CPU runtime supports ndev == 1 only (use one MPI process per rank)", fn, ndev);
    comm[0] = new_comm(1, 0, devlist ? devlist[0] : current_device());
    return ncclSuccess;
}

static ncclResult_t destroy_comm(const char* fn, ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (!unregister_comm(comm))
        return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator", fn, (void*)comm);
    // Drop this thread's queued calls on it, so a later communicator at the
    // same address never runs them.
    t_group_ops.erase(
        std::remove_if(t_group_ops.begin(), t_group_ops.end(), [comm](const Op& o) { return o.comm == comm; }),
        t_group_ops.end());
#ifdef CPUCUDA_WITH_MPI
    if (comm->mpi != MPI_COMM_NULL) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm->mpi);
    }
#endif
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return destroy_comm("ncclCommDestroy", comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return destroy_comm("ncclCommAbort", comm); }

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return check_comm("ncclCommFinalize", comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    TRY(check_comm("ncclCommGetAsyncError", comm));
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    *asyncError = ncclSuccess;  // everything runs synchronously
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    TRY(check_comm("ncclCommCount", comm));
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    TRY(check_comm("ncclCommUserRank", comm));
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    TRY(check_comm("ncclCommCuDevice", comm));
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclAllReduce";
    TRY(check_comm(fn, comm));
    TRY(check_type(fn, datatype));
    TRY(check_op(fn, op));
    TRY(check_count(fn, count, 1, datatype));
    TRY(check_ptr(fn, "sendbuff", sendbuff, count));
    TRY(check_ptr(fn, "recvbuff", recvbuff, count));
    return issue(Op{kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclReduce";
    TRY(check_comm(fn, comm));
    TRY(check_type(fn, datatype));
    TRY(check_op(fn, op));
    TRY(check_root(fn, root, comm));
    TRY(check_count(fn, count, 1, datatype));
    TRY(check_ptr(fn, "sendbuff", sendbuff, count));
    if (comm->rank == root) TRY(check_ptr(fn, "recvbuff", recvbuff, count));
    return issue(Op{kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclReduceScatter";
    TRY(check_comm(fn, comm));
    TRY(check_type(fn, datatype));
    TRY(check_op(fn, op));
    TRY(check_count(fn, recvcount, (size_t)comm->nranks, datatype));
    TRY(check_ptr(fn, "sendbuff", sendbuff, recvcount));
    TRY(check_ptr(fn, "recvbuff", recvbuff, recvcount));
    return issue(Op{kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclAllGather";
    TRY(check_comm(fn, comm));
    TRY(check_type(fn, datatype));
    TRY(check_count(fn, sendcount, (size_t)comm->nranks, datatype));
    TRY(check_ptr(fn, "sendbuff", sendbuff, sendcount));
    TRY(check_ptr(fn, "recvbuff", recvbuff, sendcount));
    return issue(Op{kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclBroadcast";
    TRY(check_comm(fn, comm));
    TRY(check_type(fn, datatype));
    TRY(check_root(fn, root, comm));
    TRY(check_count(fn, count, 1, datatype));
    if (comm->rank == root) TRY(check_ptr(fn, "sendbuff", sendbuff, count));
    TRY(check_ptr(fn, "recvbuff", recvbuff, count));
    return issue(Op{kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclGroupStart() {
    t_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (t_group_depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
    if (--t_group_depth > 0) return ncclSuccess;
    std::vector<Op> ops;
    ops.swap(t_group_ops);
    // Run everything even after a failure so that ranks stay in step.
    ncclResult_t first = ncclSuccess;
    for (const Op& o : ops) {
        ncclResult_t r = execute_in_stream_order(o);
        if (first == ncclSuccess) first = r;
    }
    return first;
}

ncclResult_t cpucuda_nccl_get_counters(ncclComm_t comm, CpuCudaNcclCounters* out) {
    TRY(check_comm("cpucuda_nccl_get_counters", comm));
    if (!out) return fail(ncclInvalidArgument, "cpucuda_nccl_get_counters: out is NULL");
    *out = comm->counters;
    return ncclSuccess;
}

ncclResult_t cpucuda_nccl_reset_counters(ncclComm_t comm) {
    TRY(check_comm("cpucuda_nccl_reset_counters", comm));
    comm->counters = CpuCudaNcclCounters{};
    return ncclSuccess;
}

}  // extern "C"
