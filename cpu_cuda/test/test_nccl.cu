// NCCL collectives checked against values computed on the host.
//
// Runs under `mpirun -np 1|2|4` on the CPU runtime (every rank uses device 0)
// and under `mpirun -np 1` on a real GPU with real NCCL. Only public
// CUDA/NCCL/MPI calls are used, except the CPU runtime's communication
// counters and behaviour real NCCL does not define, which are under
// #ifdef CPUCUDA.
//
// Every rank evaluates every check; the verdicts are combined over MPI and
// rank 0 prints one PASS/FAIL line per check and the summary.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "test/test_util.h"
#ifdef CPUCUDA
#include "cpucuda_nccl.h"
#endif

static int g_rank = 0, g_nranks = 1;
static bool g_any_failed = false;
static const char* g_label = "";  // prefix of every case name

// Combines `ok` over all ranks; rank 0 records it as one case.
static void check_all_ranks(bool ok, const char* cond, const char* file, int line, const char* what) {
    int bad = ok ? 0 : 1, nbad = 0;
    int first = ok ? g_nranks : g_rank, first_bad = 0;
    MPI_Allreduce(&bad, &nbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&first, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (nbad) g_any_failed = true;
    if (g_rank == 0) {
        CHECK(nbad == 0, "%s%s", g_label, what);
        if (nbad)
            printf("     %d of %d rank(s) failed, first rank %d: %s at %s:%d\n", nbad, g_nranks, first_bad, cond, file,
                   line);
    }
}

#define CHECK_ALL(cond, ...)                                       \
    do {                                                           \
        char what_[256];                                           \
        snprintf(what_, sizeof what_, __VA_ARGS__);                \
        check_all_ranks((cond), #cond, __FILE__, __LINE__, what_); \
    } while (0)

#define NCCL_OK(call)                                                                                          \
    do {                                                                                                       \
        ncclResult_t r_ = (call);                                                                              \
        if (r_ != ncclSuccess) {                                                                               \
            printf("FAIL rank %d: %s returned %s at %s:%d\n", g_rank, #call, ncclGetErrorString(r_), __FILE__, \
                   __LINE__);                                                                                  \
            fflush(stdout);                                                                                    \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                                      \
        }                                                                                                      \
    } while (0)

// ---- element types ------------------------------------------------------------

template <class T> struct NcclType;
template <> struct NcclType<int8_t> {
    static constexpr ncclDataType_t value = ncclInt8;
    static const char* name() { return "int8"; }
};
template <> struct NcclType<uint8_t> {
    static constexpr ncclDataType_t value = ncclUint8;
    static const char* name() { return "uint8"; }
};
template <> struct NcclType<int32_t> {
    static constexpr ncclDataType_t value = ncclInt32;
    static const char* name() { return "int32"; }
};
template <> struct NcclType<uint32_t> {
    static constexpr ncclDataType_t value = ncclUint32;
    static const char* name() { return "uint32"; }
};
template <> struct NcclType<int64_t> {
    static constexpr ncclDataType_t value = ncclInt64;
    static const char* name() { return "int64"; }
};
template <> struct NcclType<uint64_t> {
    static constexpr ncclDataType_t value = ncclUint64;
    static const char* name() { return "uint64"; }
};
template <> struct NcclType<__half> {
    static constexpr ncclDataType_t value = ncclFloat16;
    static const char* name() { return "fp16"; }
};
template <> struct NcclType<float> {
    static constexpr ncclDataType_t value = ncclFloat32;
    static const char* name() { return "fp32"; }
};
template <> struct NcclType<double> {
    static constexpr ncclDataType_t value = ncclFloat64;
    static const char* name() { return "fp64"; }
};
template <> struct NcclType<__nv_bfloat16> {
    static constexpr ncclDataType_t value = ncclBfloat16;
    static const char* name() { return "bf16"; }
};

template <class T> static T from_f(float v) { return (T)v; }
template <> __half from_f<__half>(float v) { return __float2half(v); }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <class T> static double to_d(T x) { return (double)x; }
template <> double to_d<__half>(__half x) { return (double)__half2float(x); }
template <> double to_d<__nv_bfloat16>(__nv_bfloat16 x) { return (double)__bfloat162float(x); }

// ---- device buffers --------------------------------------------------------------

template <class T>
struct DevBuf {
    T* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t n_) : n(n_) { CUDA_OK(cudaMalloc((void**)&p, (n ? n : 1) * sizeof(T))); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    void upload(const std::vector<T>& h) {
        CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> h(n);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

template <class T>
static bool same_values(const std::vector<T>& got, const std::vector<double>& want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); i++)
        if (to_d(got[i]) != want[i]) return false;
    return true;
}

// Small integers: every sum/average below is exact in every type used.
static int value_of(int rank, size_t i, int salt) {
    return (int)((i * 7 + (size_t)rank * 13 + (size_t)salt * 5) % 17) - 8;
}

// ---- all-reduce ---------------------------------------------------------------------

enum Ref { kSum, kAvg, kMax, kMin };

template <class T>
static std::vector<double> host_reduce(const std::vector<std::vector<double>>& in, Ref op) {
    std::vector<double> out(in[0]);
    for (size_t r = 1; r < in.size(); r++)
        for (size_t i = 0; i < out.size(); i++) {
            double x = in[r][i];
            if (op == kSum || op == kAvg) out[i] += x;
            else if (op == kMax) out[i] = x > out[i] ? x : out[i];
            else out[i] = x < out[i] ? x : out[i];
        }
    if (op == kAvg)
        for (double& v : out) {
            if (std::is_integral<T>::value) v = (double)((long long)v / (long long)in.size());
            else v = (double)to_d(from_f<T>((float)(v / in.size())));
        }
    return out;
}

static const char* op_name(Ref op) { return op == kSum ? "sum" : op == kAvg ? "avg" : op == kMax ? "max" : "min"; }
static ncclRedOp_t nccl_op(Ref op) {
    return op == kSum ? ncclSum : op == kAvg ? ncclAvg : op == kMax ? ncclMax : ncclMin;
}

// Every rank's input for element i; `nonneg` keeps values >= 0 (unsigned types, integer avg).
template <class T>
static std::vector<std::vector<double>> make_inputs(size_t n, int salt, bool nonneg) {
    std::vector<std::vector<double>> in(g_nranks, std::vector<double>(n));
    for (int r = 0; r < g_nranks; r++)
        for (size_t i = 0; i < n; i++) {
            int v = value_of(r, i, salt);
            in[r][i] = nonneg ? (double)(v + 8) / 2 : v;
            if (std::is_integral<T>::value) in[r][i] = (double)(long long)in[r][i];
        }
    return in;
}

template <class T>
static std::vector<T> to_host(const std::vector<double>& v) {
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = from_f<T>((float)v[i]);
    return h;
}

template <class T>
static void test_allreduce(ncclComm_t comm, Ref op, size_t n, bool in_place, bool nonneg, int salt) {
    auto in = make_inputs<T>(n, salt, nonneg);
    auto want = host_reduce<T>(in, op);
    DevBuf<T> send(n), recv(n);
    send.upload(to_host<T>(in[g_rank]));
    T* dst = in_place ? send.p : recv.p;
    NCCL_OK(ncclAllReduce(send.p, dst, n, NcclType<T>::value, nccl_op(op), comm, 0));
    auto got = in_place ? send.download() : recv.download();
    CHECK_ALL(same_values(got, want), "all-reduce %s %s n=%zu%s", NcclType<T>::name(), op_name(op), n,
              in_place ? " in place" : "");
}

// ---- reduce-scatter ---------------------------------------------------------------------

template <class T>
static void test_reduce_scatter(ncclComm_t comm, Ref op, size_t recvcount, bool in_place, int salt) {
    const size_t total = recvcount * g_nranks;
    auto in = make_inputs<T>(total, salt, false);
    auto full = host_reduce<T>(in, op);
    std::vector<double> want(full.begin() + g_rank * recvcount, full.begin() + (g_rank + 1) * recvcount);
    DevBuf<T> send(total), recv(recvcount);
    send.upload(to_host<T>(in[g_rank]));
    T* dst = in_place ? send.p + g_rank * recvcount : recv.p;
    NCCL_OK(ncclReduceScatter(send.p, dst, recvcount, NcclType<T>::value, nccl_op(op), comm, 0));
    std::vector<T> got;
    if (in_place) {
        auto all = send.download();
        got.assign(all.begin() + g_rank * recvcount, all.begin() + (g_rank + 1) * recvcount);
    } else {
        got = recv.download();
    }
    CHECK_ALL(same_values(got, want), "reduce-scatter %s %s recvcount=%zu%s", NcclType<T>::name(), op_name(op),
              recvcount, in_place ? " in place" : "");
}

// ---- all-gather ---------------------------------------------------------------------------

// Exact in bf16 (< 256) for up to 8 ranks.
static double gather_value(int rank, size_t k) { return rank * 32.0 + (double)(k % 31); }

template <class T>
static void test_all_gather(ncclComm_t comm, size_t sendcount, bool in_place) {
    const size_t total = sendcount * g_nranks;
    std::vector<double> want(total), mine(sendcount);
    for (int q = 0; q < g_nranks; q++)
        for (size_t k = 0; k < sendcount; k++) want[q * sendcount + k] = gather_value(q, k);
    for (size_t k = 0; k < sendcount; k++) mine[k] = gather_value(g_rank, k);
    DevBuf<T> send(sendcount), recv(total);
    if (in_place) {
        std::vector<double> init(total, -1.0);  // other ranks' parts must be overwritten
        for (size_t k = 0; k < sendcount; k++) init[g_rank * sendcount + k] = mine[k];
        recv.upload(to_host<T>(init));
        NCCL_OK(ncclAllGather(recv.p + g_rank * sendcount, recv.p, sendcount, NcclType<T>::value, comm, 0));
    } else {
        send.upload(to_host<T>(mine));
        recv.upload(to_host<T>(std::vector<double>(total, -1.0)));
        NCCL_OK(ncclAllGather(send.p, recv.p, sendcount, NcclType<T>::value, comm, 0));
    }
    CHECK_ALL(same_values(recv.download(), want), "all-gather %s sendcount=%zu%s", NcclType<T>::name(), sendcount,
              in_place ? " in place" : "");
}

// ---- broadcast -------------------------------------------------------------------------------

static void test_broadcast(ncclComm_t comm, size_t n, int root) {
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++) want[i] = 1000.0 + root * 10 + (double)(i % 50);  // fp32 / int32 only
    DevBuf<float> send(n), recv(n);
    send.upload(to_host<float>(g_rank == root ? want : std::vector<double>(n, -2.0)));
    recv.upload(to_host<float>(std::vector<double>(n, -3.0)));
    NCCL_OK(ncclBroadcast(send.p, recv.p, n, ncclFloat32, root, comm, 0));
    CHECK_ALL(same_values(recv.download(), want), "broadcast fp32 n=%zu from root %d", n, root);

    DevBuf<int32_t> buf(n);
    buf.upload(to_host<int32_t>(g_rank == root ? want : std::vector<double>(n, -4.0)));
    NCCL_OK(ncclBroadcast(buf.p, buf.p, n, ncclInt32, root, comm, 0));
    CHECK_ALL(same_values(buf.download(), want), "broadcast int32 n=%zu from root %d in place", n, root);
}

// ---- reduce --------------------------------------------------------------------------------

static void test_reduce(ncclComm_t comm, size_t n, int root, bool in_place) {
    auto in = make_inputs<float>(n, 15, false);
    auto want = host_reduce<float>(in, kSum);
    DevBuf<float> send(n), recv(n);
    send.upload(to_host<float>(in[g_rank]));
    recv.upload(std::vector<float>(n, -5.0f));
    float* dst = in_place ? send.p : recv.p;
    NCCL_OK(ncclReduce(send.p, dst, n, ncclFloat32, ncclSum, root, comm, 0));
    // Only the root's output is defined.
    bool ok = g_rank != root || same_values(in_place ? send.download() : recv.download(), want);
    CHECK_ALL(ok, "reduce fp32 sum n=%zu to root %d%s", n, root, in_place ? " in place" : "");
}

// ---- determinism ------------------------------------------------------------------------------

static uint64_t fnv(const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

// Values whose sum depends on the order of additions: the result must still be
// bitwise the same on every rank and on every repetition.
static void test_determinism(ncclComm_t comm) {
    const size_t n = 4099;
    std::vector<float> h(n);
    uint32_t s = 12345u + 7919u * (uint32_t)g_rank;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float mant = (float)(s >> 8) / (float)(1u << 24);
        h[i] = (mant - 0.5f) * ((s & 3) == 0 ? 1e6f : (s & 3) == 1 ? 1.0f : 1e-3f);
    }
    DevBuf<float> send(n), recv(n);
    send.upload(h);
    uint64_t first = 0;
    bool repeat_same = true;
    for (int rep = 0; rep < 3; rep++) {
        NCCL_OK(ncclAllReduce(send.p, recv.p, n, ncclFloat32, ncclSum, comm, 0));
        auto got = recv.download();
        uint64_t hsh = fnv(got.data(), n * sizeof(float));
        if (rep == 0) first = hsh;
        else repeat_same = repeat_same && hsh == first;
    }
    CHECK_ALL(repeat_same, "all-reduce fp32 sum is bitwise repeatable");
    unsigned long long lo = first, hi = first;
    unsigned long long mn = 0, mx = 0;
    MPI_Allreduce(&lo, &mn, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&hi, &mx, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    CHECK_ALL(mn == mx, "all-reduce fp32 sum is bitwise identical on every rank");
#ifdef CPUCUDA
    // The CPU runtime adds the ranks' inputs in rank order, in fp32.
    std::vector<float> want(n, 0.0f);
    for (int q = 0; q < g_nranks; q++) {
        uint32_t t = 12345u + 7919u * (uint32_t)q;
        for (size_t i = 0; i < n; i++) {
            t = t * 1664525u + 1013904223u;
            float mant = (float)(t >> 8) / (float)(1u << 24);
            float v = (mant - 0.5f) * ((t & 3) == 0 ? 1e6f : (t & 3) == 1 ? 1.0f : 1e-3f);
            want[i] = q == 0 ? v : want[i] + v;
        }
    }
    auto got = recv.download();
    CHECK_ALL(memcmp(got.data(), want.data(), n * sizeof(float)) == 0,
              "all-reduce fp32 sum equals the fp32 sum in rank order (CPU runtime)");
#endif
}

// ---- groups -------------------------------------------------------------------------------------

static void test_group(ncclComm_t comm) {
    const size_t n = 300, rc = 21, sc = 13;
    auto ar_in = make_inputs<float>(n, 3, false);
    auto ar_want = host_reduce<float>(ar_in, kSum);
    auto rs_in = make_inputs<float>(rc * g_nranks, 4, false);
    auto rs_full = host_reduce<float>(rs_in, kMax);
    std::vector<double> rs_want(rs_full.begin() + g_rank * rc, rs_full.begin() + (g_rank + 1) * rc);
    std::vector<double> ag_mine(sc), ag_want(sc * g_nranks);
    for (size_t k = 0; k < sc; k++) ag_mine[k] = gather_value(g_rank, k);
    for (int q = 0; q < g_nranks; q++)
        for (size_t k = 0; k < sc; k++) ag_want[q * sc + k] = gather_value(q, k);

    DevBuf<float> ar(n), rs_send(rc * g_nranks), rs_recv(rc);
    DevBuf<int32_t> ag_send(sc), ag_recv(sc * g_nranks);
    ar.upload(to_host<float>(ar_in[g_rank]));
    rs_send.upload(to_host<float>(rs_in[g_rank]));
    ag_send.upload(to_host<int32_t>(ag_mine));

#ifdef CPUCUDA
    CpuCudaNcclCounters before, during;
    NCCL_OK(cpucuda_nccl_get_counters(comm, &before));
#endif
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(ar.p, ar.p, n, ncclFloat32, ncclSum, comm, 0));
    NCCL_OK(ncclGroupStart());  // nested
    NCCL_OK(ncclReduceScatter(rs_send.p, rs_recv.p, rc, ncclFloat32, ncclMax, comm, 0));
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(ncclAllGather(ag_send.p, ag_recv.p, sc, ncclInt32, comm, 0));
#ifdef CPUCUDA
    NCCL_OK(cpucuda_nccl_get_counters(comm, &during));
    CHECK_ALL(memcmp(&before, &during, sizeof before) == 0,
              "group: nothing runs (or is counted) before the outermost ncclGroupEnd");
#endif
    NCCL_OK(ncclGroupEnd());
    CHECK_ALL(same_values(ar.download(), ar_want), "group: all-reduce fp32 sum in place");
    CHECK_ALL(same_values(rs_recv.download(), rs_want), "group (nested): reduce-scatter fp32 max");
    CHECK_ALL(same_values(ag_recv.download(), ag_want), "group: all-gather int32");
}

// ---- errors ------------------------------------------------------------------------------------

static void test_errors(ncclComm_t comm) {
    DevBuf<float> a(16), b(16);
    ncclResult_t r;
    r = ncclBroadcast(a.p, b.p, 16, ncclFloat32, g_nranks, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "broadcast with root = nranks -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclBroadcast(a.p, b.p, 16, ncclFloat32, -1, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "broadcast with root = -1 -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclAllReduce(a.p, b.p, 16, (ncclDataType_t)99, ncclSum, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce with datatype 99 -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclAllReduce(a.p, b.p, 16, ncclFloat32, ncclSum, (ncclComm_t)NULL, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce on a NULL comm -> ncclInvalidArgument (got %d)", (int)r);
    const char* s = ncclGetErrorString(ncclInvalidArgument);
    CHECK_ALL(s != NULL && strlen(s) > 0, "ncclGetErrorString(ncclInvalidArgument) = \"%s\"", s ? s : "(null)");
#ifdef CPUCUDA
    // (Real NCCL takes op values past ncclNumOps as user-defined ops.)
    r = ncclAllReduce(a.p, b.p, 16, ncclFloat32, (ncclRedOp_t)77, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce with op 77 -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclAllReduce(a.p, b.p, 16, ncclFloat8e4m3, ncclSum, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce fp8 -> ncclInvalidArgument on the CPU runtime (got %d)", (int)r);
    r = ncclAllReduce(a.p, b.p, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce with an overflowing count -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclAllReduce(NULL, b.p, 16, ncclFloat32, ncclSum, comm, 0);
    CHECK_ALL(r == ncclInvalidArgument, "all-reduce with sendbuff NULL -> ncclInvalidArgument (got %d)", (int)r);
    r = ncclGroupEnd();
    CHECK_ALL(r == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart -> ncclInvalidUsage (got %d)", (int)r);
    const char* last = ncclGetLastError(comm);
    CHECK_ALL(last != NULL && strstr(last, "ncclGroupEnd") != NULL, "ncclGetLastError names the failed call: \"%s\"",
              last ? last : "(null)");
#endif
}

// ---- counters (CPU runtime only) ------------------------------------------------------------------

#ifdef CPUCUDA
static void test_counters(ncclComm_t comm) {
    const size_t n = 1000, rc = 37, sc = 29, nb = 50;
    DevBuf<float> a(n), b(n), rs(rc * g_nranks), rr(rc);
    DevBuf<__nv_bfloat16> ag_s(sc), ag_r(sc * g_nranks);
    a.upload(std::vector<float>(n, 1.0f));
    rs.upload(std::vector<float>(rc * g_nranks, 1.0f));
    NCCL_OK(cpucuda_nccl_reset_counters(comm));
    CpuCudaNcclCounters c;
    NCCL_OK(cpucuda_nccl_get_counters(comm, &c));
    bool zero = true;
    for (int k = 0; k < CPUCUDA_NCCL_NUM_COLLS; k++) zero = zero && c.calls[k] == 0 && c.bytes[k] == 0;
    CHECK_ALL(zero, "counters are zero after cpucuda_nccl_reset_counters");

    NCCL_OK(ncclAllReduce(a.p, b.p, n, ncclFloat32, ncclSum, comm, 0));
    NCCL_OK(ncclAllReduce(a.p, a.p, n / 2, ncclFloat32, ncclAvg, comm, 0));
    NCCL_OK(ncclReduceScatter(rs.p, rr.p, rc, ncclFloat32, ncclSum, comm, 0));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllGather(ag_s.p, ag_r.p, sc, ncclBfloat16, comm, 0));
    NCCL_OK(ncclBroadcast(a.p, b.p, nb, ncclFloat32, g_nranks - 1, comm, 0));
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(ncclBcast(a.p, nb, ncclFloat32, 0, comm, 0));
    NCCL_OK(ncclReduce(a.p, b.p, 10, ncclFloat32, ncclMax, 0, comm, 0));
    // Rejected calls are not counted.
    ncclResult_t r = ncclAllReduce(a.p, b.p, n, (ncclDataType_t)99, ncclSum, comm, 0);
    (void)r;
    NCCL_OK(cpucuda_nccl_get_counters(comm, &c));
    const uint64_t N = (uint64_t)g_nranks;
    CHECK_ALL(c.calls[CPUCUDA_NCCL_ALLREDUCE] == 2 && c.bytes[CPUCUDA_NCCL_ALLREDUCE] == (n + n / 2) * 4,
              "counters: all-reduce calls=%llu bytes=%llu (want 2, %llu)",
              (unsigned long long)c.calls[CPUCUDA_NCCL_ALLREDUCE], (unsigned long long)c.bytes[CPUCUDA_NCCL_ALLREDUCE],
              (unsigned long long)((n + n / 2) * 4));
    CHECK_ALL(c.calls[CPUCUDA_NCCL_REDUCESCATTER] == 1 && c.bytes[CPUCUDA_NCCL_REDUCESCATTER] == rc * N * 4,
              "counters: reduce-scatter calls=%llu bytes=%llu (want 1, recvcount*nranks*4 = %llu)",
              (unsigned long long)c.calls[CPUCUDA_NCCL_REDUCESCATTER],
              (unsigned long long)c.bytes[CPUCUDA_NCCL_REDUCESCATTER], (unsigned long long)(rc * N * 4));
    CHECK_ALL(c.calls[CPUCUDA_NCCL_ALLGATHER] == 1 && c.bytes[CPUCUDA_NCCL_ALLGATHER] == sc * N * 2,
              "counters: all-gather calls=%llu bytes=%llu (want 1, sendcount*nranks*2 = %llu)",
              (unsigned long long)c.calls[CPUCUDA_NCCL_ALLGATHER], (unsigned long long)c.bytes[CPUCUDA_NCCL_ALLGATHER],
              (unsigned long long)(sc * N * 2));
    CHECK_ALL(c.calls[CPUCUDA_NCCL_BROADCAST] == 2 && c.bytes[CPUCUDA_NCCL_BROADCAST] == 2 * nb * 4,
              "counters: broadcast calls=%llu bytes=%llu (want 2, %llu)",
              (unsigned long long)c.calls[CPUCUDA_NCCL_BROADCAST], (unsigned long long)c.bytes[CPUCUDA_NCCL_BROADCAST],
              (unsigned long long)(2 * nb * 4));
    CHECK_ALL(c.calls[CPUCUDA_NCCL_REDUCE] == 1 && c.bytes[CPUCUDA_NCCL_REDUCE] == 40,
              "counters: reduce calls=%llu bytes=%llu (want 1, 40)", (unsigned long long)c.calls[CPUCUDA_NCCL_REDUCE],
              (unsigned long long)c.bytes[CPUCUDA_NCCL_REDUCE]);
    r = cpucuda_nccl_get_counters((ncclComm_t)NULL, &c);
    CHECK_ALL(r == ncclInvalidArgument, "cpucuda_nccl_get_counters(NULL) -> ncclInvalidArgument (got %d)", (int)r);
}

// Communicator setup errors the CPU runtime reports (real NCCL would hang).
static void test_init_errors() {
    if (g_nranks < 2) return;
    ncclUniqueId own;
    NCCL_OK(ncclGetUniqueId(&own));  // deliberately not broadcast
    ncclComm_t bad = (ncclComm_t)&own;
    ncclResult_t r = ncclCommInitRank(&bad, g_nranks, own, g_rank);
    CHECK_ALL(r == ncclInvalidUsage && bad == NULL,
              "ncclCommInitRank with a different id on each rank -> ncclInvalidUsage (got %d)", (int)r);
    ncclUniqueId id;
    if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    r = ncclCommInitRank(&bad, g_nranks + 1, id, g_rank);
    CHECK_ALL(r == ncclInvalidUsage, "ncclCommInitRank with nranks != number of processes -> ncclInvalidUsage (got %d)",
              (int)r);
}

// A second communicator that moves data in chunks of 7 elements, so that the
// CPU runtime's chunked paths (used for > 2^30 elements) run on small buffers.
static void test_chunked() {
    setenv("CPUCUDA_NCCL_CHUNK_ELEMS", "7", 1);
    ncclUniqueId id;
    if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCL_OK(ncclCommInitRank(&comm, g_nranks, id, g_rank));
    unsetenv("CPUCUDA_NCCL_CHUNK_ELEMS");
    g_label = "chunks of 7: ";
    test_allreduce<float>(comm, kSum, 103, false, false, 11);
    test_allreduce<__nv_bfloat16>(comm, kAvg, 103, true, false, 12);
    test_reduce_scatter<float>(comm, kSum, 23, false, 13);
    test_reduce_scatter<int32_t>(comm, kMax, 23, true, 14);
    test_all_gather<float>(comm, 19, false);
    test_all_gather<int32_t>(comm, 19, true);
    test_broadcast(comm, 45, g_nranks > 1 ? 1 : 0);
    test_reduce(comm, 61, g_nranks - 1, false);
    g_label = "";
    NCCL_OK(ncclCommDestroy(comm));
}
#endif

// ---- main --------------------------------------------------------------------------------------

template <class T>
static void test_sum_type(ncclComm_t comm) {
    test_allreduce<T>(comm, kSum, 129, false, !std::is_signed<T>::value, 1);
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);

    ncclUniqueId id;
    if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    CUDA_OK(cudaSetDevice(0));
    ncclComm_t comm;
    NCCL_OK(ncclCommInitRank(&comm, g_nranks, id, g_rank));

    int count = -1, rank = -1, dev = -1, version = 0;
    NCCL_OK(ncclCommCount(comm, &count));
    NCCL_OK(ncclCommUserRank(comm, &rank));
    NCCL_OK(ncclCommCuDevice(comm, &dev));
    NCCL_OK(ncclGetVersion(&version));
    CHECK_ALL(count == g_nranks && rank == g_rank, "ncclCommCount/ncclCommUserRank match the MPI layout (%d ranks)",
              g_nranks);
    CHECK_ALL(dev == 0, "ncclCommCuDevice is the device set before init");
    CHECK_ALL(version >= 20000, "ncclGetVersion = %d", version);

    // All-reduce: every op on fp32, bf16, int32; out of place and in place.
    const Ref ops[] = {kSum, kAvg, kMax, kMin};
    for (Ref op : ops) {
        test_allreduce<float>(comm, op, 1000, false, false, 0);
        test_allreduce<__nv_bfloat16>(comm, op, 1000, false, false, 0);
        test_allreduce<int32_t>(comm, op, 1000, false, op == kAvg, 0);
    }
    test_allreduce<float>(comm, kSum, 1001, true, false, 2);
    test_allreduce<__nv_bfloat16>(comm, kAvg, 1001, true, false, 2);
    test_allreduce<int32_t>(comm, kMax, 1001, true, false, 2);
    test_allreduce<float>(comm, kSum, 3, false, false, 5);  // fewer elements than ranks
    test_allreduce<float>(comm, kSum, 0, false, false, 5);  // empty
    test_sum_type<int8_t>(comm);
    test_sum_type<uint8_t>(comm);
    test_sum_type<uint32_t>(comm);
    test_sum_type<int64_t>(comm);
    test_sum_type<uint64_t>(comm);
    test_sum_type<__half>(comm);
    test_sum_type<double>(comm);

    // Reduce-scatter and all-gather, out of place and in place.
    test_reduce_scatter<float>(comm, kSum, 37, false, 6);
    test_reduce_scatter<float>(comm, kAvg, 37, false, 7);
    test_reduce_scatter<float>(comm, kSum, 37, true, 8);
    test_reduce_scatter<__nv_bfloat16>(comm, kAvg, 37, true, 9);
    test_reduce_scatter<int32_t>(comm, kMin, 37, false, 10);
    test_all_gather<float>(comm, 29, false);
    test_all_gather<float>(comm, 29, true);
    test_all_gather<__nv_bfloat16>(comm, 29, true);
    test_all_gather<int64_t>(comm, 29, false);

    // Broadcast from the last rank (non-zero when there is more than one).
    test_broadcast(comm, 77, g_nranks - 1);
    if (g_nranks > 2) test_broadcast(comm, 10, 1);
    test_reduce(comm, 501, g_nranks - 1, false);
    test_reduce(comm, 501, 0, true);

    test_determinism(comm);
    test_group(comm);
    test_errors(comm);
#ifdef CPUCUDA
    test_counters(comm);
    test_init_errors();
    test_chunked();
#endif

    NCCL_OK(ncclCommDestroy(comm));
    int rc = 0;
    if (g_rank == 0) rc = test_summary("test_nccl");
    rc = g_any_failed ? 1 : rc;
    MPI_Finalize();
    return rc;
}
