// racecheck: the build in build/cpu-racecheck (CPUCUDA_RACECHECK). Its kernels
// are compiled with gcc's ThreadSanitizer instrumentation (-fsanitize=thread)
// but not linked with libtsan: every load and store of kernel code calls the
// __tsan_readN/__tsan_writeN hooks defined here, which check it against a
// shadow of the last write and the last read of each 2-byte unit. What the
// runtime reads and writes for a kernel (ldmatrix rows, cp.async copies)
// comes in through access_as.
//
// Why not libtsan with its fiber API: gcc 12's runtime has 256 thread slots;
// a block of 1024 threads is 1024 live fibers, so slots are stolen at almost
// every switch (1.8 us a switch at 2048 fibers against 0.3 us at 128, measured
// here), and a thread whose slot is taken loses the history its races would
// be found with. CUDA's ordering inside a block is simple enough to check
// directly: an access is ordered after another thread's if a __syncthreads
// opened since, or, in the same warp, a collective (shuffle, vote, __syncwarp,
// mma/ldmatrix) that both lanes took part in completed since.
//
// Shadow: a direct-mapped table, tagged by address: an entry pushed out by
// another address forgets its history (a missed race, never a false one).
// Between blocks of one launch nothing orders global memory (atomics are
// neither checked nor order anything); each block has its own shared memory.
// Launches are ordered. The build runs one worker thread: the shadow is not
// locked, and the order of blocks does not matter to the check.
//
// With CPUCUDA_INITCHECK=1, a read of 2 or more bytes of device or shared
// memory that still holds the poison pattern (see runtime.cpp) is reported too.
#ifdef CPUCUDA_RACECHECK
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "internal.h"

namespace cpucuda {
namespace race {

struct Access {
    uint64_t launch;  // 0: none
    uint64_t clock;   // the worker's sync clock when it happened
    uintptr_t pc;
    uint32_t block;   // linear block index
    uint16_t tid;     // linear thread index
};
struct Entry {
    uintptr_t unit;  // address / 2; 0: empty
    Access write, read;
};
constexpr size_t kEntries = size_t(1) << 21;

static Entry* table() {
    static Entry* t = [] {
        void* m = mmap(nullptr, kEntries * sizeof(Entry), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cpu_cuda: racecheck cannot map its shadow table\n");
            abort();
        }
        return (Entry*)m;
    }();
    return t;
}

// The block being run (one worker thread: see above).
static RaceBlock cur;
static bool in_block = false;

// Thread-local storage of the executable (where static __shared__ lives) of
// the thread running the block: [tls_lo, tls_hi).
static uintptr_t tls_lo = 0, tls_hi = 0;

// The guard byte of a class-type __shared__ variable (see TlsSymbols) is set
// by the first GPU thread of a block to pass the declaration and read by the
// others: the runtime's doing, not the kernel's, so it is not checked.
static bool is_guard(uintptr_t a) {
    const auto& g = tls_symbols().guards;
    return std::binary_search(g.begin(), g.end(), a - tls_lo);
}

// CPUCUDA_RACECHECK_SKIP=k1,k2: kernels (by base name) left unchecked, for
// tests that run a deliberately broken kernel among correct ones.
static bool skipped(const char* kernel) {
    static const std::set<std::string> names = [] {
        std::set<std::string> n;
        const char* v = getenv("CPUCUDA_RACECHECK_SKIP");
        for (std::string item; v && *v; v++) {
            if (*v != ',') item += *v;
            if (*v == ',' || !v[1]) n.insert(item), item.clear();
        }
        return n;
    }();
    return !names.empty() && names.count(kernel_base_name(kernel));
}

void block_begin(const RaceBlock& b) {
    cur = b;
    in_block = !skipped(b.kernel);
    tls_lo = executable_tls_base();  // launches may come from several threads
    tls_hi = tls_lo + tls_symbols().size;
}
void block_end() { in_block = false; }

// --- reports -------------------------------------------------------------------
static std::mutex report_mutex;
static int reports = 0;
static std::set<std::tuple<const char*, uintptr_t, uintptr_t>> reported;

static std::string where(uintptr_t pc) {
    Dl_info info;
    if (!dladdr((void*)pc, &info) || !info.dli_fname) return "?";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "?";
    exe[n] = 0;
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "addr2line -i -e '%s' 0x%lx 2>/dev/null", exe,
             (unsigned long)(pc - 1 - (uintptr_t)info.dli_fbase));
    // innermost first: the first line outside the runtime's headers (cp.async
    // and ldmatrix are inline functions of cpucuda_ptx.h)
    std::string out;
    if (FILE* f = popen(cmd, "r")) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            const bool runtime_header = strstr(line, "cpu_cuda/include/") != nullptr;
            if (out.empty() || !runtime_header) out = line;
            if (!runtime_header) break;
        }
        pclose(f);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    const size_t d = out.find(" (discriminator");
    if (d != std::string::npos) out.resize(d);
    return out.empty() ? "?" : out;
}
static void on_exit_status() {
    if (!reports) return;
    fprintf(stderr, "cpu_cuda: racecheck build: %d hazard%s reported\n", reports, reports == 1 ? "" : "s");
    fflush(nullptr);
    _exit(1);  // a hazard fails the program even where its results looked right
}
static void count_report() {
    if (!reports++) atexit(on_exit_status);
}
static std::string thread_name(uint32_t linear_block, uint16_t tid) {
    const dim3 b = cur.block_dim, g = cur.grid_dim;
    char s[160];
    snprintf(s, sizeof s, "thread (%u,%u,%u) of block (%u,%u,%u)", tid % b.x, tid / b.x % b.y, tid / (b.x * b.y),
             linear_block % g.x, linear_block / g.x % g.y, linear_block / (g.x * g.y));
    return s;
}

static void report_race(const Access& before, bool before_write, uint16_t tid, bool now_write, bool shared,
                        uintptr_t addr, unsigned size, uintptr_t pc) {
    std::lock_guard<std::mutex> lock(report_mutex);
    if (!reported.insert({cur.kernel, before.pc, pc}).second) return;
    count_report();
    const std::string me = thread_name(cur.block, tid);
    const char* between = before.block != cur.block ? "nothing orders the blocks of a launch"
                                                    : "no __syncthreads, __syncwarp or warp collective between";
    fprintf(stderr,
            "cpu_cuda: racecheck: kernel '%s': %s memory race at 0x%lx: %s %s %u bytes at %s, "
            "%s %s them at %s (%s)\n",
            cur.kernel, shared ? "shared" : "global", (unsigned long)addr, me.c_str(), now_write ? "writes" : "reads",
            size, where(pc).c_str(), thread_name(before.block, before.tid).c_str(), before_write ? "wrote" : "read",
            where(before.pc).c_str(), between);
}

static void report_uninitialised(uint16_t me, uintptr_t addr, unsigned size, uintptr_t pc) {
    std::lock_guard<std::mutex> lock(report_mutex);
    if (!reported.insert({cur.kernel, 0, pc}).second) return;
    count_report();
    fprintf(stderr,
            "cpu_cuda: initcheck: kernel '%s': %s reads %u bytes at 0x%lx at %s that nothing wrote "
            "(they hold the poison pattern)\n",
            cur.kernel, thread_name(cur.block, me).c_str(), size, (unsigned long)addr, where(pc).c_str());
}

// --- the check ---------------------------------------------------------------------
// Whether `a` (by another thread) is ordered before the current thread's access.
static bool ordered(const Access& a, bool shared, uint16_t me) {
    if (a.launch != cur.launch) return true;
    if (a.block != cur.block) return shared;  // another block's shared memory is another memory
    if (a.tid == me) return true;
    if (cur.sync->barrier > a.clock) return true;
    const unsigned w = me / 32, other = a.tid / 32u;
    if (w != other) return false;
    const WarpClock& wc = cur.sync->warps[w];
    return wc.full > a.clock || (wc.pairs && wc.pairs[(a.tid % 32) * 32 + me % 32] > a.clock);
}

static inline bool poisoned(uintptr_t a, unsigned size) {
    if (size < 2 || (a & 1) || (size & 1)) return false;
    for (unsigned i = 0; i < size; i += 2)
        if (*(const uint16_t*)(a + i) != kPoison16) return false;
    return true;
}

void access_as(uint16_t me, uintptr_t a, unsigned size, bool write, uintptr_t pc) {
    if (!in_block) return;
    if (a - cur.stacks_lo < cur.stacks_hi - cur.stacks_lo) return;  // the fibers' own stacks
    const bool dyn = a - cur.dyn_lo < cur.dyn_hi - cur.dyn_lo;
    const bool shared = dyn || a - tls_lo < tls_hi - tls_lo;
    if (size == 1 && shared && !dyn && is_guard(a)) return;
    if (!write && initcheck_on() && poisoned(a, size)) report_uninitialised(me, a, size, pc);
    const Access now{cur.launch, cur.sync->clock, pc, cur.block, me};
    Entry* t = table();
    for (uintptr_t u = a >> 1, end = (a + size + 1) >> 1; u < end; u++) {
        Entry& e = t[(u ^ (u >> 21)) & (kEntries - 1)];
        if (e.unit != u) {
            e.unit = u;
            e.write.launch = e.read.launch = 0;
        }
        if (e.write.launch && !ordered(e.write, shared, me)) {
            report_race(e.write, true, me, write, shared, a, size, pc);
            e.write.launch = 0;  // one report per hazard, not one per unit
        }
        if (write) {
            if (e.read.launch && !ordered(e.read, shared, me))
                report_race(e.read, false, me, true, shared, a, size, pc);
            e.write = now;
            e.read.launch = 0;
        } else {
            e.read = now;
        }
    }
}

}  // namespace race
}  // namespace cpucuda

// --- the instrumentation's entry points (gcc -fsanitize=thread) ---------------------------
// An access of kernel code, by the GPU thread running (none on the host).
static inline void access(uintptr_t a, unsigned size, bool write, uintptr_t pc) {
    if (const cpucuda::ThreadCtx* t = cpucuda::tls_thread)
        cpucuda::race::access_as((uint16_t)(t->warp * 32 + t->lane), a, size, write, pc);
}
#define RET (uintptr_t)__builtin_return_address(0)
extern "C" {
void __tsan_init() {}
#define CPUCUDA_RW(N)                                                               \
    void __tsan_read##N(void* p) { access((uintptr_t)p, N, false, RET); }           \
    void __tsan_write##N(void* p) { access((uintptr_t)p, N, true, RET); }           \
    void __tsan_unaligned_read##N(void* p) { access((uintptr_t)p, N, false, RET); } \
    void __tsan_unaligned_write##N(void* p) { access((uintptr_t)p, N, true, RET); }
CPUCUDA_RW(1)
CPUCUDA_RW(2)
CPUCUDA_RW(4)
CPUCUDA_RW(8)
CPUCUDA_RW(16)
void __tsan_read_range(void* p, unsigned long n) { access((uintptr_t)p, (unsigned)n, false, RET); }
void __tsan_write_range(void* p, unsigned long n) { access((uintptr_t)p, (unsigned)n, true, RET); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

// Atomics: done, sequentially consistent, and not tracked.
#define CPUCUDA_ATOMIC(N, T)                                                                                         \
    T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }             \
    void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }             \
    T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }     \
    T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
    int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                             \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                      \
    }                                                                                                                \
    int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                               \
        return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                       \
    }                                                                                                                \
    T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                                   \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                            \
        return c;                                                                                                    \
    }
CPUCUDA_ATOMIC(8, char)
CPUCUDA_ATOMIC(16, short)
CPUCUDA_ATOMIC(32, int)
CPUCUDA_ATOMIC(64, long)
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}
#endif  // CPUCUDA_RACECHECK
