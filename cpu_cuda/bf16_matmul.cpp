// bf16 products on the CPU's bf16 dot-product units, for cuBLASLt on the CPU
// (cublaslt.cpp): oneDNN's matmul primitive, bf16 operands, fp32 result.
//
// The math, per element: out[i][j] = sum over l < k of op(A)[i][l] * op(B)[l][j],
// accumulated in fp32, as cuBLASLt's CUBLAS_COMPUTE_32F promises. On AVX512-BF16
// (vdpbf16ps) each instruction adds two exact bf16 x bf16 products to an fp32
// lane, rounding to nearest even; subnormal inputs and sums are flushed to zero
// (the instruction ignores MXCSR). The result is deterministic: a primitive is
// single-threaded and its blocking depends on the shape alone, so the same call
// gives the same bits every time. It is not the bits of the widened operands'
// sgemm (the order of the sums differs); CPUCUDA_NATIVE_BF16=0 or
// set_native_bf16_matmul(false) takes that path instead.
//
// Used only where oneDNN runs it on bf16 instructions (AVX512-BF16 or AMX): a
// probe at first use creates one primitive and reads which implementation
// oneDNN chose. Elsewhere oneDNN would emulate bf16 slower than sgemm does, so
// the widened path stays. The test is per CPU, not per shape: a slice whose
// operand rows are not dense (its leading dimension is the whole matrix's) gets
// `gemm:jit`, a name without the ISA, which runs the same bf16 instructions on
// such a CPU (measured: about 200 GF/s a core, like `brg:avx512_core_bf16`;
// 37 GF/s with DNNL_MAX_CPU_ISA=AVX512_CORE, where it emulates them).
//
// Threads: the calling worker runs the primitive alone. oneDNN is built on
// OpenMP here; each calling thread asks for a team of one, so no OpenMP
// threads are started (they would spin after each call and take the cores
// from the kernels that follow, like OpenBLAS's own threads).

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cpucuda.h"
#include "internal.h"

namespace cpucuda {
namespace {

dnnl_engine_t engine() {
    static dnnl_engine_t e = [] {
        dnnl_engine_t made = nullptr;
        if (dnnl_engine_create(&made, dnnl_cpu, 0) != dnnl_success) made = nullptr;
        return made;
    }();
    return e;
}

// The calling thread's stream, with OpenMP told to use this thread only.
// Every stream made is also listed in a table that is never destroyed: a
// worker's stream outlives the worker (LeakSanitizer sees it reachable).
dnnl_stream_t thread_stream() {
    thread_local dnnl_stream_t s = [] {
        omp_set_num_threads(1);
        dnnl_stream_t made = nullptr;
        if (engine() == nullptr || dnnl_stream_create(&made, engine(), dnnl_stream_default_flags) != dnnl_success)
            return (dnnl_stream_t) nullptr;
        static std::mutex mu;
        static std::vector<dnnl_stream_t>* all = new std::vector<dnnl_stream_t>;
        std::lock_guard<std::mutex> lock(mu);
        all->push_back(made);
        return made;
    }();
    return s;
}

// One product's shape and strides: out (rows x cols, column-major, leading
// dimension ldo) = op(A) op(B).
struct Shape {
    int64_t rows, cols, k, lda, ldb, ldo;
    bool ta, tb;
    auto tie() const { return std::tie(rows, cols, k, lda, ldb, ldo, ta, tb); }
    bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

struct Primitive {
    dnnl_primitive_t prim = nullptr;  // null: oneDNN has no implementation for the shape
    dnnl_memory_desc_t src, wei, dst, scratch;
    size_t scratch_bytes = 0;
    bool on_bf16_units = false;  // its name says bf16 instructions (read by the probe)
};

// oneDNN's matmul is row-major: dst[cols][rows] = src[cols][k] x wei[k][rows],
// where dst is `out` read row by row (column j of out is row j of dst), src is
// op(B) transposed and wei is op(A) transposed, each described by its strides.
Primitive create(const Shape& s) {
    Primitive p;
    const dnnl_dims_t src_dims = {s.cols, s.k}, wei_dims = {s.k, s.rows}, dst_dims = {s.cols, s.rows};
    const dnnl_dims_t src_strides = {s.tb ? 1 : s.ldb, s.tb ? s.ldb : 1};
    const dnnl_dims_t wei_strides = {s.ta ? 1 : s.lda, s.ta ? s.lda : 1};
    const dnnl_dims_t dst_strides = {s.ldo, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = nullptr;
    dnnl_primitive_desc_t pd = nullptr;
    bool ok = engine() != nullptr &&
              dnnl_memory_desc_init_by_strides(&p.src, 2, src_dims, dnnl_bf16, src_strides) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&p.wei, 2, wei_dims, dnnl_bf16, wei_strides) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&p.dst, 2, dst_dims, dnnl_f32, dst_strides) == dnnl_success &&
              dnnl_matmul_desc_init(&md, &p.src, &p.wei, nullptr, &p.dst) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &md, attr, engine(), nullptr) == dnnl_success;
    if (ok) {
        const char* impl = nullptr;
        ok = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl != nullptr;
        p.on_bf16_units = ok && (strstr(impl, "avx512_core_bf16") != nullptr || strstr(impl, "amx") != nullptr);
        const dnnl_memory_desc_t* scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (scratch != nullptr) p.scratch = *scratch, p.scratch_bytes = dnnl_memory_desc_get_size(scratch);
        ok = ok && dnnl_primitive_create(&p.prim, pd) == dnnl_success;
        if (!ok) p.prim = nullptr;
    }
    if (pd != nullptr) dnnl_primitive_desc_destroy(pd);
    if (attr != nullptr) dnnl_primitive_attr_destroy(attr);
    return p;
}

// Primitives by shape, made once (creating one costs far more than running a
// small product) and kept for the life of the process: the table is never
// destroyed, so that no exit-time destructor runs while a worker may still
// multiply, and LeakSanitizer sees the primitives reachable.
const Primitive& primitive_for(const Shape& s) {
    static std::mutex mu;
    static std::map<Shape, Primitive>* made = new std::map<Shape, Primitive>;
    std::lock_guard<std::mutex> lock(mu);
    auto it = made->find(s);
    if (it == made->end()) it = made->emplace(s, create(s)).first;
    return it->second;
}

bool bf16_units_present() {
    static const bool present = [] {
        if (thread_stream() == nullptr) return false;
        const Primitive& p = primitive_for(Shape{64, 64, 64, 64, 64, 64, false, false});
        return p.prim != nullptr && p.on_bf16_units;
    }();
    return present;
}

bool env_native_on() {
    const char* v = getenv("CPUCUDA_NATIVE_BF16");
    if (v == nullptr || !*v || strcmp(v, "1") == 0) return true;
    if (strcmp(v, "0") == 0) return false;
    fprintf(stderr, "cpu_cuda: CPUCUDA_NATIVE_BF16=%s: expected 0 or 1\n", v);
    exit(2);
}

std::atomic<bool>& native_wanted() {
    static std::atomic<bool> wanted{env_native_on()};
    return wanted;
}

}  // namespace

bool native_bf16_on() { return native_wanted().load(std::memory_order_relaxed) && bf16_units_present(); }

bool set_native_bf16_matmul(bool on) {
    native_wanted() = on;
    return native_bf16_on();
}

bool native_bf16_product(bool ta, bool tb, int64_t rows, int64_t cols, int64_t k, const uint16_t* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, float* out, int64_t ldo) {
    dnnl_stream_t stream = thread_stream();
    if (stream == nullptr) return false;
    const Primitive& p = primitive_for(Shape{rows, cols, k, lda, ldb, ldo, ta, tb});
    if (p.prim == nullptr) return false;
    thread_local std::vector<unsigned char> scratch;
    if (scratch.size() < p.scratch_bytes) scratch.resize(p.scratch_bytes);
    const int nargs = p.scratch_bytes > 0 ? 4 : 3;
    dnnl_memory_t mem[4] = {};
    bool ok = dnnl_memory_create(&mem[0], &p.src, engine(), const_cast<uint16_t*>(b)) == dnnl_success &&
              dnnl_memory_create(&mem[1], &p.wei, engine(), const_cast<uint16_t*>(a)) == dnnl_success &&
              dnnl_memory_create(&mem[2], &p.dst, engine(), out) == dnnl_success &&
              (nargs == 3 || dnnl_memory_create(&mem[3], &p.scratch, engine(), scratch.data()) == dnnl_success);
    if (ok) {
        const dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}, {DNNL_ARG_SCRATCHPAD, mem[3]}};
        ok = dnnl_primitive_execute(p.prim, stream, nargs, args) == dnnl_success &&
             dnnl_stream_wait(stream) == dnnl_success;
    }
    for (dnnl_memory_t m : mem)
        if (m != nullptr) dnnl_memory_destroy(m);
    return ok;
}

}  // namespace cpucuda
