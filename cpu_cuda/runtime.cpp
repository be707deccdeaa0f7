// The CUDA-on-CPU runtime: device memory, streams, events, errors, the virtual
// device, and kernel execution (see README.md in this folder for the model).
//
// Kernel execution in one paragraph: a launch hands its blocks to a pool of
// worker threads (one per core). A worker runs one block at a time; each GPU
// thread of the block is a fiber on a small stack. A fiber runs until it
// reaches a barrier or a warp collective, then switches straight to the next
// runnable fiber of its warp; a thread that finishes runs the next one that
// has not started yet on the same stack, as a plain call (run to completion). When every lane of a warp is
// parked, the pending collectives are resolved (each lane's result computed) and
// the warp runs again; when every thread of the block waits at __syncthreads the
// barrier opens. Anything else - a barrier some threads never reach, lanes that
// wait at different collectives - is reported with the kernel's name and block.
#include <cuda_runtime.h>
#include <boost/context/detail/fcontext.hpp>

#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <cpucuda.h>

#include "internal.h"

#if defined(__SANITIZE_ADDRESS__) || defined(CPUCUDA_ASAN_PROGRAM)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CPUCUDA_ASAN 1
#undef ASAN_POISON_MEMORY_REGION
#undef ASAN_UNPOISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(a, n) __asan_poison_memory_region((a), (n))
#define ASAN_UNPOISON_MEMORY_REGION(a, n) __asan_unpoison_memory_region((a), (n))
#endif

// Context switching. On x86-64 the runtime has its own switch: it saves only
// the callee-saved integer registers and the stack pointer. Boost's
// jump_fcontext also saves and restores the x87 control word and MXCSR
// (fnstcw/fldcw are slow, serialising instructions, most of the cost of a
// switch); every fiber of this runtime runs with the worker thread's floating
// point environment, and kernels cannot change it (there is no CUDA API to),
// so there is nothing to save. Elsewhere Boost.Context's fcontext is used.
#if defined(__x86_64__) && !defined(CPUCUDA_BOOST_SWITCH)
namespace bctx {
typedef void* fcontext_t;
struct transfer_t {
    fcontext_t fctx;  // the context that jumped (to resume it later)
    void* data;       // what it passed
};
extern "C" transfer_t cpucuda_jump_context(fcontext_t to, void* data);
extern "C" void cpucuda_context_entry();
// A fresh context on the stack below `top`: the first jump to it calls fn with
// the jumper's context and data (fn must never return).
inline fcontext_t make_fcontext(void* top, size_t, void (*fn)(transfer_t)) {
    uintptr_t t = (uintptr_t)top & ~(uintptr_t)15;
    void** sp = (void**)(t - 72);  // r12..rbp, return address, 16 bytes of padding
    sp[0] = (void*)fn;             // r12: what the entry calls
    for (int i = 1; i < 6; i++) sp[i] = nullptr;
    sp[6] = (void*)&cpucuda_context_entry;
    sp[7] = sp[8] = nullptr;
    return sp;
}
inline transfer_t jump_fcontext(fcontext_t to, void* data) { return cpucuda_jump_context(to, data); }
}  // namespace bctx
// cpucuda_jump_context(to, data): pushes the callee-saved registers, leaves its
// stack pointer (the context to resume) in rax and `data` in rdx - the two
// halves of the returned transfer_t - and pops the target's registers.
// cpucuda_context_entry runs on a fresh stack (16-byte aligned) and calls
// fn(transfer_t{rax, rdx}) from r12.
asm(R"(
    .text
    .p2align 4
    .globl cpucuda_jump_context
    .hidden cpucuda_jump_context
    .type cpucuda_jump_context,@function
cpucuda_jump_context:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r15
    pushq %r14
    pushq %r13
    pushq %r12
    movq %rsp, %rax
    movq %rdi, %rsp
    popq %r12
    popq %r13
    popq %r14
    popq %r15
    popq %rbx
    popq %rbp
    movq %rsi, %rdx
    ret
    .cfi_endproc
    .size cpucuda_jump_context, .-cpucuda_jump_context

    .p2align 4
    .globl cpucuda_context_entry
    .hidden cpucuda_context_entry
    .type cpucuda_context_entry,@function
cpucuda_context_entry:
    .cfi_startproc
    .cfi_undefined rip
    movq %rax, %rdi
    movq %rdx, %rsi
    callq *%r12
    ud2
    .cfi_endproc
    .size cpucuda_context_entry, .-cpucuda_context_entry
)");
#else
namespace bctx = boost::context::detail;
#endif

namespace cpucuda {

__thread ThreadCtx* tls_thread = nullptr;
__thread BlockCtx tls_block;
static uintptr_t tls_block_offset = 0;  // of tls_block in the executable's thread-local block

// ----------------------------------------------------------------------------
// Configuration (environment variables, read once)
// ----------------------------------------------------------------------------
static long env_long(const char* name, long fallback, long lo, long hi) {
    const char* s = getenv(name);
    if (!s || !*s) return fallback;
    char* end = nullptr;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "cpu_cuda: %s=%s is not an integer in [%ld, %ld]\n", name, s, lo, hi);
        exit(2);
    }
    return v;
}

struct Config {
    int workers;
    int device_count;
    size_t stack_bytes;
    size_t total_memory;
    int sm_count;
    int blocks_per_sm;            // the most blocks the occupancy API reports per SM
    size_t smem_per_block;        // default dynamic limit of a kernel
    size_t smem_per_block_optin;  // the most cudaFuncSetAttribute can grant
    Schedule schedule = Schedule::Forward;
    uint64_t seed = 0;
    StreamMode stream_mode = StreamMode::Sync;
    bool initcheck;
    bool thread_loops;  // kernels whose threads never meet run as loops (set_thread_loops)

    Config() {
        int cores = (int)std::max(1u, std::thread::hardware_concurrency());
        workers = (int)env_long("CPUCUDA_WORKERS", cores, 1, 1024);
#ifdef CPUCUDA_RACECHECK
        workers = 1;  // racecheck's shadow is not locked (racecheck.cpp)
#endif
        initcheck = env_long("CPUCUDA_INITCHECK", 0, 0, 1) != 0;
        thread_loops = env_long("CPUCUDA_THREAD_LOOPS", 1, 0, 1) != 0;
        device_count = (int)env_long("CPUCUDA_DEVICE_COUNT", 8, 1, 64);
        stack_bytes = (size_t)env_long("CPUCUDA_STACK_KB", 64, 16, 65536) * 1024;
        total_memory = (size_t)env_long("CPUCUDA_DEVICE_MEMORY_MB", 16384, 1, 1L << 24) << 20;
        sm_count = (int)env_long("CPUCUDA_SM_COUNT", 132, 1, 4096);
        blocks_per_sm = (int)env_long("CPUCUDA_BLOCKS_PER_SM", 4, 1, 32);
        smem_per_block = (size_t)env_long("CPUCUDA_SMEM_PER_BLOCK_KB", 48, 1, 1024) * 1024;
        smem_per_block_optin = (size_t)env_long("CPUCUDA_SMEM_OPTIN_KB", 227, 1, 1024) * 1024;
        smem_per_block_optin = std::max(smem_per_block_optin, smem_per_block);
        const char* m = getenv("CPUCUDA_STREAMS");
        if (m && *m) {
            if (std::string(m) == "deferred") stream_mode = StreamMode::Deferred;
            else if (std::string(m) != "sync") {
                fprintf(stderr, "cpu_cuda: CPUCUDA_STREAMS=%s: expected sync or deferred\n", m);
                exit(2);
            }
        }
        const char* s = getenv("CPUCUDA_SCHEDULE");
        if (s && *s && !parse_schedule(s, &schedule, &seed)) {
            fprintf(stderr, "cpu_cuda: CPUCUDA_SCHEDULE=%s: expected forward, reverse or random:SEED\n", s);
            exit(2);
        }
    }
    static bool parse_schedule(const char* s, Schedule* out, uint64_t* seed) {
        std::string v(s);
        if (v == "forward") {
            *out = Schedule::Forward;
            return true;
        }
        if (v == "reverse") {
            *out = Schedule::Reverse;
            return true;
        }
        if (v.rfind("random:", 0) == 0 && v.size() > 7) {
            char* end = nullptr;
            *seed = strtoull(v.c_str() + 7, &end, 10);
            *out = Schedule::Random;
            return *end == 0;
        }
        return false;
    }
};
static Config& config() {
    static Config c;
    return c;
}

void set_schedule(Schedule s, uint64_t seed) {
    config().schedule = s;
    config().seed = seed;
}
Schedule get_schedule() { return config().schedule; }

static std::atomic<uint64_t> loop_launch_count{0};
void set_thread_loops(bool on) { config().thread_loops = on; }
uint64_t loop_launches() { return loop_launch_count.load(); }

bool initcheck_on() { return config().initcheck; }
void poison(void* p, size_t bytes) {
    uint16_t* h = (uint16_t*)p;
    for (size_t i = 0; i < bytes / 2; i++) h[i] = kPoison16;
    if (bytes & 1) ((unsigned char*)p)[bytes - 1] = (unsigned char)kPoison16;
}

const TlsSymbols& tls_symbols() {
    static const TlsSymbols syms = [] {
        TlsSymbols t;
        int fd = open("/proc/self/exe", O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            if (fd >= 0) close(fd);
            return t;
        }
        void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return t;
        const char* base = (const char*)m;
        const Elf64_Ehdr* eh = (const Elf64_Ehdr*)base;
        const Elf64_Phdr* ph = (const Elf64_Phdr*)(base + eh->e_phoff);
        for (int i = 0; i < eh->e_phnum; i++)
            if (ph[i].p_type == PT_TLS) t.size = ph[i].p_memsz;
        const Elf64_Shdr* sh = (const Elf64_Shdr*)(base + eh->e_shoff);
        for (int i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != SHT_SYMTAB) continue;
            const Elf64_Sym* sym = (const Elf64_Sym*)(base + sh[i].sh_offset);
            const char* names = base + sh[sh[i].sh_link].sh_offset;
            bool cu_file = false;
            for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++) {
                const char* name = names + sym[k].st_name;
                const int type = ELF64_ST_TYPE(sym[k].st_info), bind = ELF64_ST_BIND(sym[k].st_info);
                if (type == STT_FILE) {
                    const size_t n = strlen(name);
                    cu_file = n > 3 && !strcmp(name + n - 3, ".cu");
                }
                if (type != STT_TLS || sym[k].st_shndx == SHN_UNDEF || (bind == STB_LOCAL && !cu_file)) continue;
                if (!strncmp(name, "_ZGVZ", 5)) t.guards.push_back(sym[k].st_value);
                else if (!strncmp(name, "_ZZ", 3) && sym[k].st_size)
                    t.shared.push_back({sym[k].st_value, sym[k].st_size});
                else if (!strcmp(name, "_ZN7cpucuda9tls_blockE")) tls_block_offset = sym[k].st_value;
            }
        }
        munmap(m, (size_t)st.st_size);
        std::sort(t.guards.begin(), t.guards.end());
        return t;
    }();
    return syms;
}
uintptr_t executable_tls_base() {
    tls_symbols();
    return (uintptr_t)&tls_block - tls_block_offset;
}

bool streams_deferred() { return config().stream_mode == StreamMode::Deferred; }
void set_stream_mode(StreamMode m) {
    synchronize_device();  // nothing queued crosses the switch
    config().stream_mode = m;
}
StreamMode get_stream_mode() { return config().stream_mode; }

// ----------------------------------------------------------------------------
// Errors. The last error is per host thread, as in the real runtime; a kernel
// failure (divergent barrier, bad collective) is reported on stderr when it
// happens and returned by the next synchronising call or cudaGetLastError.
// ----------------------------------------------------------------------------
static thread_local cudaError_t last_error = cudaSuccess;
static std::atomic<int> pending_kernel_error{cudaSuccess};

cudaError_t record(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}
cudaError_t take_pending() {
    int e = pending_kernel_error.exchange(cudaSuccess);
    return record((cudaError_t)e);
}

// ----------------------------------------------------------------------------
// Device memory: host memory, counted against the virtual device's size, with a
// table of live allocations so that copies can check which side a pointer is on.
// ----------------------------------------------------------------------------
static std::mutex mem_mutex;
static std::map<uintptr_t, size_t> device_allocs;  // start -> size
static std::map<uintptr_t, size_t> pinned_allocs;  // cudaMallocHost: start -> size
static size_t mem_in_use = 0, mem_peak = 0;

static bool inside(const std::map<uintptr_t, size_t>& table, const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    uintptr_t a = (uintptr_t)p;
    auto it = table.upper_bound(a);
    if (it == table.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}
bool is_device_ptr(const void* p, size_t n) { return inside(device_allocs, p, n); }
bool is_pinned_host_ptr(const void* p, size_t n) { return inside(pinned_allocs, p, n); }

MemoryStats memory_stats() {
    std::lock_guard<std::mutex> lock(mem_mutex);
    return {mem_in_use, mem_peak, config().total_memory, device_allocs.size()};
}
void reset_peak_memory() {
    std::lock_guard<std::mutex> lock(mem_mutex);
    mem_peak = mem_in_use;
}

// ----------------------------------------------------------------------------
// Fibers and the block scheduler
// ----------------------------------------------------------------------------
enum class FiberState : uint8_t { Runnable, AtBarrier, AtWarp, Done };

// One cp.async issued and not landed yet; `group` is the number of commits
// before it, so it belongs to commit group `group` once that is committed.
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned bytes, group;
#ifdef CPUCUDA_RACECHECK
    uintptr_t pc;  // where it was issued
#endif
};

struct Fiber : ThreadCtx {
    bctx::fcontext_t ctx = nullptr;  // saved context while switched out
    FiberState state = FiberState::Runnable;
    // pending warp collective
    WarpOp op = WarpOp::Sync;
    unsigned mask = 0;
    int param = 0, width = 32;
    uint64_t value = 0, result = 0;
    WarpWideFn wide_fn = nullptr;  // WarpOp::Wide: the operation, and its name for reports
    const char* wide_name = nullptr;
    TileReduceFn reduce_fn = nullptr;  // WarpOp::TileReduce: the tile's reduction (value: its io)
#ifdef CPUCUDA_RACECHECK
    uintptr_t wide_pc = 0;  // where the lane called it
#endif
    // cp.async copies not landed yet (see cp_async)
    std::vector<AsyncCopy> async_copies;
    unsigned async_commits = 0;
    // pending block barrier
    int pred = 0, barrier_result = 0;
    unsigned stack = 0;  // the worker's stack it runs on, while started and not done
};

struct LaunchState {
    LaunchSpec spec;
    void (*entry)(void* closure);
    void* closure;
    // set when the block's threads run as one loop (LaunchSpec::threads_never_meet)
    void (*loop)(void* closure, ThreadCtx* const* order, unsigned n);
    unsigned nthreads;
    uint64_t nblocks;
    uint64_t launch_id;
    std::atomic<uint64_t> next_block{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::string error;
};

static const char* op_name(WarpOp op) {
    switch (op) {
        case WarpOp::Sync: return "__syncwarp";
        case WarpOp::ShflIdx: return "__shfl_sync";
        case WarpOp::ShflUp: return "__shfl_up_sync";
        case WarpOp::ShflDown: return "__shfl_down_sync";
        case WarpOp::ShflXor: return "__shfl_xor_sync";
        case WarpOp::Ballot: return "__ballot_sync";
        case WarpOp::Any: return "__any_sync";
        case WarpOp::All: return "__all_sync";
        case WarpOp::Wide: return "a warp-wide matrix instruction";
        case WarpOp::TileReduce: return "cg::reduce";
    }
    return "?";
}

// Per OS thread: fibers and stacks for one block at a time.
struct Worker {
    std::vector<Fiber> fibers;
    std::vector<ThreadCtx*> loop_order;  // a looped block's threads in the schedule's order (empty: not yet)
    bool loop_order_forward = false;     // loop_order is the forward schedule's
    dim3 numbered{0, 0, 0};              // the block shape the fibers' tid, lane and warp are for
    bool looping = false;                // running a block as a loop: nothing may park
    bool in_tile_reduce = false;         // running a cg::reduce operator, in the scheduler: nothing may park
    char* stacks = nullptr;  // [guard page | stack] x capacity
    size_t stack_stride = 0;
    unsigned capacity = 0;
    std::vector<char*> stack_top, stack_bottom;  // per stack; bottom: just above the guard page
    std::vector<unsigned> free_stacks;           // stacks no started thread holds
    char* dyn_smem = nullptr;
    bctx::fcontext_t sched_ctx = nullptr;
#ifdef CPUCUDA_ASAN
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
#endif

    // the block being run
    LaunchState* launch = nullptr;
    unsigned nthreads = 0, nwarps = 0;
    unsigned warp_pos = 0, lane_pos = 0;  // scan position in warp_order / lane_order
    std::vector<unsigned> warp_order;
    unsigned lane_order[32];
    std::mt19937_64 rng;
    bool failed = false;
#ifdef CPUCUDA_RACECHECK
    race::SyncClock sync;
#endif

    ~Worker() {
        if (stacks) munmap(stacks, stack_stride * capacity);
        free(dyn_smem);
    }

    void reserve(unsigned n) {
        if (n <= capacity) return;
        if (stacks) munmap(stacks, stack_stride * capacity);
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        stack_stride = page + (config().stack_bytes + page - 1) / page * page;
        void* m =
            mmap(nullptr, stack_stride * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cpu_cuda: cannot map %u fiber stacks\n", n);
            abort();
        }
        stacks = (char*)m;
        for (unsigned i = 0; i < n; i++) mprotect(stacks + i * stack_stride, page, PROT_NONE);
        capacity = n;
        fibers.resize(n);
        // Each stack starts a different number of cache lines below its top:
        // stacks a whole number of pages apart would put every fiber's live
        // frame in the same L1 set (and few L2 sets), and a warp's 32 fibers
        // would evict one another at every switch.
        stack_top.resize(n);
        stack_bottom.resize(n);
        free_stacks.reserve(n);
        for (unsigned i = 0; i < n; i++) {
            stack_bottom[i] = stacks + i * stack_stride + page;
            stack_top[i] = stacks + (i + 1) * stack_stride - (i % 64) * 64;
        }
    }
    unsigned lanes_in_warp(unsigned w) const { return std::min(32u, nthreads - w * 32); }
};

static __thread Worker* tls_worker = nullptr;  // fast access from fibers

#ifndef CPUCUDA_ASAN
// A fiber that overruns its stack hits the guard page below it. Say so (on an
// alternate signal stack) instead of dying with a bare segmentation fault.
static struct sigaction previous_segv;
static void on_segv(int sig, siginfo_t* info, void* uctx) {
    Worker* w = tls_worker;
    if (w && w->stacks && w->launch) {
        const char* a = (const char*)info->si_addr;
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (a >= w->stacks && a < w->stacks + w->stack_stride * w->capacity &&
            (size_t)(a - w->stacks) % w->stack_stride < page) {
            char msg[512];
            int n = snprintf(msg, sizeof msg,
                             "cpu_cuda: stack overflow in a thread of kernel '%s' (fiber stacks are %zu KiB; "
                             "raise CPUCUDA_STACK_KB)\n",
                             w->launch->spec.name, config().stack_bytes / 1024);
            if (write(2, msg, (size_t)n) < 0) {}
            abort();
        }
    }
    if (previous_segv.sa_flags & SA_SIGINFO) previous_segv.sa_sigaction(sig, info, uctx);
    signal(SIGSEGV, SIG_DFL);  // not ours: let the fault happen again, unhandled
}
static void install_overflow_handler() {
    static thread_local std::vector<char> alt_stack(64 * 1024);
    stack_t ss = {};
    ss.ss_sp = alt_stack.data();
    ss.ss_size = alt_stack.size();
    sigaltstack(&ss, nullptr);
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa = {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &previous_segv);
    });
}
#else
static void install_overflow_handler() {}  // AddressSanitizer reports overflows itself
#endif

static Worker& this_worker() {
    static thread_local std::unique_ptr<Worker> owner;  // freed when its thread ends
    if (!tls_worker) {
        owner.reset(new Worker());
        tls_worker = owner.get();
        install_overflow_handler();
    }
    return *tls_worker;
}

void* dynamic_shared_memory() {
    Worker& w = this_worker();
    if (!w.dyn_smem) {
        w.dyn_smem = (char*)aligned_alloc(128, config().smem_per_block_optin);
        if (!w.dyn_smem) abort();
    }
    return w.dyn_smem;
}

static void fail_block(Worker& w, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const uint3 b = tls_block.block_idx;
    char full[1400];
    snprintf(full, sizeof full, "cpu_cuda: kernel '%s' block (%u,%u,%u): %s", w.launch->spec.name, b.x, b.y, b.z, msg);
    w.failed = true;
    LaunchState& L = *w.launch;
    std::lock_guard<std::mutex> lock(L.error_mutex);
    if (!L.failed.exchange(true)) L.error = full;
}

[[noreturn]] void device_trap(const char* what) {
    fprintf(stderr, "cpu_cuda: %s in kernel '%s'\n", what,
            tls_worker && tls_worker->launch ? tls_worker->launch->spec.name : "?");
    abort();
}

static void shuffle_lanes(Worker& w) {
    for (unsigned i = 0; i < 32; i++) w.lane_order[i] = i;
    if (config().schedule == Schedule::Reverse) std::reverse(w.lane_order, w.lane_order + 32);
    if (config().schedule == Schedule::Random) std::shuffle(w.lane_order, w.lane_order + 32, w.rng);
}
static void order_warps(Worker& w) {
    w.warp_order.resize(w.nwarps);
    for (unsigned i = 0; i < w.nwarps; i++) w.warp_order[i] = i;
    if (config().schedule == Schedule::Reverse) std::reverse(w.warp_order.begin(), w.warp_order.end());
    if (config().schedule == Schedule::Random) std::shuffle(w.warp_order.begin(), w.warp_order.end(), w.rng);
}

// Result of one lane's shuffle; false when it reads a lane outside the group.
static bool shuffle_source(const Fiber& f, unsigned lane, unsigned group, unsigned* src) {
    const unsigned width = (unsigned)f.width, seg = lane & ~(width - 1), in_seg = lane & (width - 1);
    switch (f.op) {
        case WarpOp::ShflIdx: *src = seg + ((unsigned)f.param & (width - 1)); break;
        case WarpOp::ShflUp: *src = in_seg >= (unsigned)f.param ? lane - f.param : lane; break;
        case WarpOp::ShflDown: *src = in_seg + (unsigned)f.param < width ? lane + f.param : lane; break;
        case WarpOp::ShflXor: {
            unsigned s = lane ^ (unsigned)f.param;
            *src = (s >= seg + width) ? lane : s;  // later segments read back the own value
            break;
        }
        default: *src = lane;
    }
    return (group >> *src) & 1u;
}

#ifdef CPUCUDA_RACECHECK
// Lanes `group` of warp `wi` completed a collective: ordered from now on.
static void race_warp_sync(Worker& w, unsigned wi, unsigned group, unsigned present) {
    race::WarpClock& c = w.sync.warps[wi];
    const uint64_t t = ++w.sync.clock;
    if (group == present) {
        c.full = t;
        return;
    }
    if (!c.pairs) c.pairs = (uint64_t*)calloc(32 * 32, sizeof(uint64_t));
    for (unsigned a = 0; a < 32; a++)
        if ((group >> a) & 1u)
            for (unsigned b = 0; b < 32; b++)
                if ((group >> b) & 1u) c.pairs[a * 32 + b] = t;
}
void race_ldmatrix_row(unsigned lane, const void* row) {
    const unsigned wi = tls_thread->warp;  // the last lane to arrive runs the instruction
    race::access_as((uint16_t)(wi * 32 + lane), (uintptr_t)row, 16, false, tls_worker->fibers[wi * 32 + lane].wide_pc);
}
#else
static inline void race_warp_sync(Worker&, unsigned, unsigned, unsigned) {}
#endif

// Lane `l` waits at a warp-wide instruction that not every lane of the warp
// reached (PTX's `.aligned`: all lanes must execute the same instruction).
static int report_wide_divergence(Worker& w, unsigned wi, const Fiber* lanes, unsigned n, unsigned l) {
    const Fiber& f = lanes[l];
    for (unsigned m = 0; m < 32; m++) {
        const Fiber* g = m < n ? &lanes[m] : nullptr;
        if (g && g->state == FiberState::AtWarp && g->op == WarpOp::Wide && g->wide_fn == f.wide_fn) continue;
        const char* where = !g                                  ? "does not exist (partial warp)"
                            : g->state == FiberState::Done      ? "has exited"
                            : g->state == FiberState::AtBarrier ? "waits at __syncthreads"
                            : g->op == WarpOp::Wide             ? g->wide_name
                                                                : op_name(g->op);
        fail_block(w, "warp %u: lane %u waits at %s but lane %u %s%s", wi, l, f.wide_name, m,
                   g && g->state == FiberState::AtWarp ? "waits at " : "", where);
        return -1;
    }
    fail_block(w, "warp %u: lane %u waits at %s with other lanes at other collectives", wi, l, f.wide_name);
    return -1;
}

// A warp-wide instruction (mma.sync, ldmatrix: `.sync.aligned`) runs once all 32
// lanes have arrived at the same one: `fn` sees every lane's operands at once.
static int release_wide(Worker& w, unsigned wi, Fiber* lanes, unsigned n) {
    void* io[32];
    for (unsigned l = 0; l < n; l++) {
        if (lanes[l].wide_fn != lanes[0].wide_fn) return report_wide_divergence(w, wi, lanes, n, 0);
        io[l] = (void*)lanes[l].value;
    }
    if (n != 32) {
        fail_block(w, "warp %u: %s needs all 32 lanes, but the warp has only %u threads", wi, lanes[0].wide_name, n);
        return -1;
    }
    if (const char* error = lanes[0].wide_fn(io)) {
        fail_block(w, "warp %u: %s: %s", wi, lanes[0].wide_name, error);
        return -1;
    }
    race_warp_sync(w, wi, 0xffffffffu, 0xffffffffu);
    for (unsigned l = 0; l < n; l++) lanes[l].state = FiberState::Runnable;
    return (int)n;
}

// cg::reduce: every lane of the tile of `width` lanes from `first` has arrived
// at it. The operator runs here, in the scheduler, for every lane (see
// refuse_meeting). False after reporting lanes at different cg::reduce calls.
static bool run_tile_reduce(Worker& w, unsigned wi, Fiber* lanes, unsigned first, unsigned width) {
    void* io[32];
    for (unsigned l = first; l < first + width; l++) {
        if (lanes[l].reduce_fn != lanes[first].reduce_fn) {
            fail_block(w, "warp %u: lanes %u and %u of one tile wait at different cg::reduce calls", wi, first, l);
            return false;
        }
        io[l - first] = (void*)lanes[l].value;
    }
    w.in_tile_reduce = true;
    lanes[first].reduce_fn(io, width);
    w.in_tile_reduce = false;
    return true;
}

// Resolves the collectives of warp `wi` whose lanes have all arrived. Returns the
// number of lanes released, or -1 after reporting a divergence.
static int release_warp(Worker& w, unsigned wi) {
    Fiber* lanes = &w.fibers[wi * 32];
    const unsigned n = w.lanes_in_warp(wi);
    const unsigned present = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
    // The common case first: every lane at the same collective with the same
    // mask (covering every lane) and width - what the general loop below
    // would find, without its per-lane bookkeeping. Shuffles within a full
    // group never read outside it.
    {
        const Fiber& f = lanes[0];
        const WarpOp op = f.op;
        const unsigned mask = f.mask;
        const int width = f.width;
        bool uniform = (mask & present) == present && width >= 1 && width <= 32 && !(width & (width - 1));
        for (unsigned l = 0; l < n && uniform; l++)
            uniform = lanes[l].state == FiberState::AtWarp && lanes[l].op == op && lanes[l].mask == mask &&
                      lanes[l].width == width;
        if (uniform && op == WarpOp::Wide) return release_wide(w, wi, lanes, n);
        if (uniform) {
            switch (op) {
                case WarpOp::Sync:
                    for (unsigned l = 0; l < n; l++) lanes[l].result = 0;
                    break;
                case WarpOp::TileReduce:  // every tile of the warp (a partial warp: the general loop reports it)
                    uniform = n == 32;
                    for (unsigned first = 0; first < 32 && uniform; first += (unsigned)width)
                        if (!run_tile_reduce(w, wi, lanes, first, (unsigned)width)) return -1;
                    break;
                case WarpOp::Ballot:
                case WarpOp::Any:
                case WarpOp::All: {
                    uint64_t ballot = 0;
                    for (unsigned l = 0; l < n; l++)
                        if (lanes[l].value) ballot |= 1ull << l;
                    const uint64_t r = op == WarpOp::Ballot ? ballot
                                       : op == WarpOp::Any  ? (uint64_t)(ballot != 0)
                                                            : (uint64_t)(ballot == (uint64_t)present);
                    for (unsigned l = 0; l < n; l++) lanes[l].result = r;
                    break;
                }
                case WarpOp::ShflXor:
                    if (width == 32 && n == 32) {  // butterflies: the reductions' shuffle
                        for (unsigned l = 0; l < 32; l++) {
                            const unsigned src = l ^ (unsigned)lanes[l].param;
                            lanes[l].result = lanes[src < 32 ? src : l].value;
                        }
                        break;
                    }
                    [[fallthrough]];
                default: {
                    unsigned src[32];
                    for (unsigned l = 0; l < n && uniform; l++) uniform = shuffle_source(lanes[l], l, present, &src[l]);
                    if (!uniform) break;  // a lane reads outside the warp: the general loop reports it
                    for (unsigned l = 0; l < n; l++) lanes[l].result = lanes[src[l]].value;
                }
            }
        }
        if (uniform) {
            for (unsigned l = 0; l < n; l++) lanes[l].state = FiberState::Runnable;
            race_warp_sync(w, wi, present, present);
            return (int)n;
        }
    }
    unsigned done_groups = 0;  // lanes already resolved in this call
    int released = 0;
    for (unsigned l = 0; l < n; l++) {
        Fiber& f = lanes[l];
        if (f.state != FiberState::AtWarp || ((done_groups >> l) & 1u)) continue;
        const unsigned group = f.mask & present;
        if (f.op == WarpOp::Wide) return report_wide_divergence(w, wi, lanes, n, l);
        if (!((f.mask >> l) & 1u)) {
            fail_block(w, "warp %u lane %u calls %s with mask 0x%08x that excludes itself", wi, l, op_name(f.op),
                       f.mask);
            return -1;
        }
        if (f.width < 1 || f.width > 32 || (f.width & (f.width - 1))) {
            fail_block(w, "warp %u lane %u: %s width %d is not a power of two <= 32", wi, l, op_name(f.op), f.width);
            return -1;
        }
        bool complete = true;
        for (unsigned m = 0; m < n; m++) {
            if (!((group >> m) & 1u)) continue;
            const Fiber& g = lanes[m];
            if (g.state == FiberState::AtWarp && g.mask == f.mask && g.op == f.op) continue;
            if (g.state == FiberState::Runnable) {
                complete = false;
                break;
            }
            const char* where = g.state == FiberState::Done        ? "has exited"
                                : g.state == FiberState::AtBarrier ? "waits at __syncthreads"
                                                                   : op_name(g.op);
            fail_block(w, "warp %u: lane %u waits at %s(mask 0x%08x) but lane %u %s%s", wi, l, op_name(f.op), f.mask, m,
                       where, g.state == FiberState::AtWarp ? " with another mask or operation" : "");
            return -1;
        }
        if (!complete) continue;
        if (f.op == WarpOp::TileReduce) {
            const unsigned width = (unsigned)f.width, first = l / width * width;
            const unsigned tile = width == 32 ? 0xffffffffu : ((1u << width) - 1u) << first;
            if (f.mask != tile || group != tile) {
                fail_block(w, "warp %u lane %u: cg::reduce over a tile of %u lanes with mask 0x%08x%s", wi, l, width,
                           f.mask, group != f.mask ? ", which names lanes the warp does not have" : "");
                return -1;
            }
            if (!run_tile_reduce(w, wi, lanes, first, width)) return -1;
        }
        uint64_t ballot = 0;
        for (unsigned m = 0; m < n; m++)
            if (((group >> m) & 1u) && lanes[m].value) ballot |= 1ull << m;
        for (unsigned m = 0; m < n; m++) {
            if (!((group >> m) & 1u)) continue;
            Fiber& g = lanes[m];
            switch (g.op) {
                case WarpOp::Sync:
                case WarpOp::TileReduce: g.result = 0; break;
                case WarpOp::Ballot: g.result = ballot; break;
                case WarpOp::Any: g.result = ballot != 0; break;
                case WarpOp::All: g.result = ballot == (uint64_t)group; break;
                default: {
                    unsigned src;
                    if (!shuffle_source(g, m, group, &src)) {
                        fail_block(w, "warp %u lane %u: %s reads lane %u, which is not in mask 0x%08x", wi, m,
                                   op_name(g.op), src, g.mask);
                        return -1;
                    }
                    g.result = lanes[src].value;
                }
            }
            g.state = FiberState::Runnable;
            released++;
        }
        race_warp_sync(w, wi, group, present);
        done_groups |= group;
    }
    return released;
}

// Picks the fiber to run next in the current block, resolving collectives and
// barriers as they complete. nullptr: the block is finished or has failed.
static Fiber* pick_next(Worker& w) {
    for (;;) {
        if (w.failed) return nullptr;
        if (w.warp_pos < w.nwarps) {
            const unsigned wi = w.warp_order[w.warp_pos];
            const unsigned n = w.lanes_in_warp(wi);
            while (w.lane_pos < 32) {
                unsigned lane = w.lane_order[w.lane_pos++];
                if (lane < n && w.fibers[wi * 32 + lane].state == FiberState::Runnable)
                    return &w.fibers[wi * 32 + lane];
            }
            int released = release_warp(w, wi);
            if (released < 0) return nullptr;
            if (released > 0) {
                w.lane_pos = 0;
                if (config().schedule == Schedule::Random) shuffle_lanes(w);
                continue;
            }
            for (unsigned l = 0; l < n; l++) {
                const Fiber& f = w.fibers[wi * 32 + l];
                if (f.state == FiberState::AtWarp) {  // a group that can never complete
                    fail_block(w, "warp %u lane %u waits at %s(mask 0x%08x) for lanes that never arrive", wi, l,
                               op_name(f.op), f.mask);
                    return nullptr;
                }
            }
            w.warp_pos++;
            w.lane_pos = 0;
            continue;
        }
        // Every warp is parked at the block barrier or done.
        unsigned done = 0, waiting = 0, first_done = 0;
        int count = 0;
        for (unsigned i = 0; i < w.nthreads; i++) {
            const Fiber& f = w.fibers[i];
            if (f.state == FiberState::Done) {
                if (!done++) first_done = i;
            } else {
                waiting++;
                count += f.pred;
            }
        }
        if (waiting == 0) return nullptr;
        if (done) {
            const uint3 t = w.fibers[first_done].tid;
            fail_block(w,
                       "divergent __syncthreads: %u of %u threads wait at the barrier, but %u "
                       "threads exited without reaching it (first: thread (%u,%u,%u))",
                       waiting, w.nthreads, done, t.x, t.y, t.z);
            return nullptr;
        }
        for (unsigned i = 0; i < w.nthreads; i++) {
            w.fibers[i].state = FiberState::Runnable;
            w.fibers[i].barrier_result = count;
        }
#ifdef CPUCUDA_RACECHECK
        w.sync.barrier = ++w.sync.clock;
#endif
        w.warp_pos = 0;
        w.lane_pos = 0;
        if (config().schedule == Schedule::Random) order_warps(w);
    }
}

// --- context switching ------------------------------------------------------------
// Whoever jumps passes itself (a Fiber*, or nullptr for the scheduler) as data;
// the side that wakes up stores the jumper's continuation there.
static void on_resume(Worker& w, bctx::transfer_t t) {
    if (t.data) static_cast<Fiber*>(t.data)->ctx = t.fctx;
    else w.sched_ctx = t.fctx;
}

#ifdef CPUCUDA_ASAN
// AddressSanitizer must be told which stack is live after each switch.
static void asan_before_jump(Worker& w, Fiber* to, void** fake, bool dying) {
    if (to)
        __sanitizer_start_switch_fiber(dying ? nullptr : fake, w.stack_bottom[to->stack],
                                       (size_t)(w.stack_top[to->stack] - w.stack_bottom[to->stack]));
    else __sanitizer_start_switch_fiber(dying ? nullptr : fake, w.sched_stack_bottom, w.sched_stack_size);
}
#endif

static void fiber_main(bctx::transfer_t t);
static void land_async_copies(Fiber* f, unsigned pending);

// Switches from `self` (nullptr: the scheduler) to `next` (nullptr: back to
// the scheduler). A thread that has not started yet gets a free stack first;
// a dying thread's stack is free once it has jumped (nothing runs in between).
static void jump_to(Worker& w, Fiber* self, Fiber* next, bool dying) {
    bctx::fcontext_t target;
    if (next) {
        if (!next->ctx) {
            next->stack = w.free_stacks.back();
            w.free_stacks.pop_back();
            char* top = w.stack_top[next->stack];
#ifdef CPUCUDA_ASAN
            // A stack left by a thread that died in a switch still carries the
            // poisoned redzones of its last frames (they never returned).
            ASAN_UNPOISON_MEMORY_REGION(w.stack_bottom[next->stack], (size_t)(top - w.stack_bottom[next->stack]));
#endif
            next->ctx = bctx::make_fcontext(top, (size_t)(top - w.stack_bottom[next->stack]), fiber_main);
        }
        target = next->ctx;
        next->ctx = nullptr;
    } else {
        target = w.sched_ctx;
    }
    if (dying) w.free_stacks.push_back(self->stack);
    tls_thread = next;
#ifdef CPUCUDA_ASAN
    void* fake = nullptr;
    asan_before_jump(w, next, &fake, dying);
#else
    (void)dying;
#endif
    bctx::transfer_t t = bctx::jump_fcontext(target, self);
#ifdef CPUCUDA_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    on_resume(w, t);
}

// The current fiber parks (its state already set) and the next one runs.
static void park(Fiber* self) {
    Worker& w = *tls_worker;
    Fiber* next = pick_next(w);
    if (next == self) return;  // released by its own arrival (e.g. a one-lane group)
    jump_to(w, self, next, false);
}

static void fiber_main(bctx::transfer_t t) {
    Worker& w = *tls_worker;
#ifdef CPUCUDA_ASAN
    if (!t.data) {
        const void* bottom;
        size_t size;
        __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
        w.sched_stack_bottom = bottom;
        w.sched_stack_size = size;
    } else {
        __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
    }
#endif
    on_resume(w, t);
    Fiber* self = static_cast<Fiber*>(tls_thread);
    Fiber* next;
    for (;;) {
        w.launch->entry(w.launch->closure);
        self->async_commits++;  // a thread's last copies land even if it never waited
        land_async_copies(self, 0);
        self->state = FiberState::Done;
        next = pick_next(w);
        if (!next || next->ctx) break;
        // Run to completion: the next thread has not started, so it runs right
        // here, on this stack, as a plain call - no switch, no new stack. Only
        // a thread that parks keeps its stack; the threads after it start on
        // stacks of their own (jump_to). The order is pick_next's either way.
        next->stack = self->stack;
        self = next;
        tls_thread = next;
    }
    jump_to(w, self, next, true);  // never comes back
    abort();
}

// Where threads cannot meet: a kernel run as a loop (cudapp.py's analysis
// missed the operation), or a cg::reduce operator, which runs in the
// scheduler for every lane at once. Never computed on: the program stops,
// naming what was reached.
[[noreturn]] static void refuse_meeting_at(const Worker& w, const char* what) {
    char message[160];
    if (w.looping)
        snprintf(message, sizeof message,
                 "%s reached in a kernel that cudapp.py judged to have threads that never meet", what);
    else snprintf(message, sizeof message, "%s reached in the operator of a cg::reduce", what);
    device_trap(message);
}
static inline void refuse_meeting(const char* what) {  // on every meeting: the test inline, the report not
    const Worker* w = tls_worker;
    if (w && (w->looping || w->in_tile_reduce)) refuse_meeting_at(*w, what);
}

int block_barrier(int pred) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("__syncthreads outside a kernel");
    refuse_meeting("__syncthreads");
    self->state = FiberState::AtBarrier;
    self->pred = pred;
    park(self);
    return self->barrier_result;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("warp collective outside a kernel");
    refuse_meeting(op_name(op));
    self->state = FiberState::AtWarp;
    self->op = op;
    self->mask = mask;
    self->value = value;
    self->param = param;
    self->width = width;
    park(self);
    return self->result;
}

void warp_wide(const char* name, WarpWideFn fn, void* io) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("warp-wide matrix instruction outside a kernel");
    refuse_meeting(name);
    self->state = FiberState::AtWarp;
    self->op = WarpOp::Wide;
    self->mask = 0xffffffffu;
    self->width = 32;
    self->value = (uint64_t)io;
    self->wide_fn = fn;
    self->wide_name = name;
#ifdef CPUCUDA_RACECHECK
    self->wide_pc = (uintptr_t)__builtin_return_address(0);
#endif
    park(self);
}

void run_as(ThreadCtx* thread) { tls_thread = thread; }

void tile_reduce(TileReduceFn fn, void* io, unsigned mask, int width) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("cg::reduce outside a kernel");
    refuse_meeting("cg::reduce");
    self->state = FiberState::AtWarp;
    self->op = WarpOp::TileReduce;
    self->mask = mask;
    self->value = (uint64_t)io;
    self->param = 0;
    self->width = width;
    self->reduce_fn = fn;
    park(self);
}

// op(n) with n = a cp.async's size: cp_async_16's 16 bytes as a compile-time
// constant, so that a memcpy or memset of them is one load and one store, not a
// call into libc.
template <class Op>
static inline void with_async_size(unsigned bytes, Op op) {
    if (bytes == 16) op(std::integral_constant<size_t, 16>{});
    else op((size_t)bytes);
}

// cp.async: the copy is queued and lands at the cp.async.wait_group that
// covers it (or when the thread exits). Until then the destination holds a
// poison pattern (0xFF bytes: NaN as bf16 and as fp32), so reading it early -
// a missing wait, or a missing __syncthreads after another thread's wait -
// gives wrong results here as it can on a GPU.
void cp_async(void* dst, const void* src, unsigned bytes) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("cp.async outside a kernel");
    refuse_meeting("cp.async");
    if (((uintptr_t)dst | (uintptr_t)src) % bytes) {
        fail_block(*tls_worker,
                   "thread (%u,%u,%u): cp.async of %u bytes from %p to %p: addresses must be "
                   "%u-byte aligned",
                   self->tid.x, self->tid.y, self->tid.z, bytes, src, dst, bytes);
        return;
    }
    with_async_size(bytes, [&](auto n) { std::memset(dst, 0xFF, n); });
#ifdef CPUCUDA_RACECHECK
    // the copy may happen any time until the wait: it reads and writes now, and writes when it lands
    const uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    const uint16_t me = (uint16_t)(self->warp * 32 + self->lane);
    race::access_as(me, (uintptr_t)src, bytes, false, pc);
    race::access_as(me, (uintptr_t)dst, bytes, true, pc);
    self->async_copies.push_back({dst, src, bytes, self->async_commits, pc});
#else
    self->async_copies.push_back({dst, src, bytes, self->async_commits});
#endif
}
void cp_async_commit() {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("cp.async.commit_group outside a kernel");
    refuse_meeting("cp.async.commit_group");
    self->async_commits++;
}
// Lands every copy of the groups committed before the `pending` most recent
// ones (copies not yet committed to a group stay in flight, as in PTX).
static void land_async_copies(Fiber* f, unsigned pending) {
    if (f->async_copies.empty()) return;
    const unsigned done = f->async_commits > pending ? f->async_commits - pending : 0;
    size_t kept = 0;
    for (const AsyncCopy& c : f->async_copies) {
        if (c.group < done) {
            with_async_size(c.bytes, [&](auto n) { std::memcpy(c.dst, c.src, n); });
#ifdef CPUCUDA_RACECHECK
            race::access_as((uint16_t)(f->warp * 32 + f->lane), (uintptr_t)c.dst, c.bytes, true, c.pc);
#endif
        } else {
            f->async_copies[kept++] = c;
        }
    }
    f->async_copies.resize(kept);
}
void cp_async_wait(int pending) {
    Fiber* self = static_cast<Fiber*>(tls_thread);
    if (!self) device_trap("cp.async.wait_group outside a kernel");
    refuse_meeting("cp.async.wait_group");
    land_async_copies(self, (unsigned)pending);
}

unsigned active_mask() {
    refuse_meeting("__activemask");
    Worker& w = *tls_worker;
    const unsigned wi = tls_thread->warp;
    unsigned m = 0;
    for (unsigned l = 0; l < w.lanes_in_warp(wi); l++)
        if (w.fibers[wi * 32 + l].state != FiberState::Done) m |= 1u << l;
    return m;
}

// A block whose threads never meet: each thread runs to completion, one after
// another in the order pick_next would take them (warps in warp_order, lanes in
// lane_order, which nothing reshuffles when no thread parks), on the worker's
// own stack, the kernel inlined into the loop (KernelClosure::run_threads).
static void run_loop(Worker& w, LaunchState& L) {
    if (w.loop_order.empty()) {
        for (unsigned wi : w.warp_order) {
            const unsigned n = w.lanes_in_warp(wi);
            for (unsigned l : w.lane_order)
                if (l < n) w.loop_order.push_back(&w.fibers[wi * 32 + l]);
        }
    }
    w.looping = true;
    L.loop(L.closure, w.loop_order.data(), (unsigned)w.loop_order.size());
    w.looping = false;
}

// Each thread's threadIdx, lane and warp: they depend on the block's shape
// alone, so a worker numbers its threads again only when the shape changes.
static void number_threads(Worker& w, dim3 b) {
    if (b.x == w.numbered.x && b.y == w.numbered.y && b.z == w.numbered.z) return;
    w.loop_order.clear();
    for (unsigned i = 0; i < w.nthreads; i++) {
        Fiber& f = w.fibers[i];
        f.tid = make_uint3(i % b.x, i / b.x % b.y, i / (b.x * b.y));
        f.lane = i % 32;
        f.warp = i / 32;
    }
    w.numbered = b;
}

static void run_block(Worker& w, LaunchState& L, uint64_t linear) {
    const dim3 g = L.spec.grid;
    tls_block.block_idx = make_uint3((unsigned)(linear % g.x), (unsigned)(linear / g.x % g.y),
                                     (unsigned)(linear / ((uint64_t)g.x * g.y)));
    tls_block.block_dim = make_uint3(L.spec.block.x, L.spec.block.y, L.spec.block.z);
    tls_block.grid_dim = make_uint3(g.x, g.y, g.z);
    w.launch = &L;
    w.failed = false;
    w.nthreads = L.nthreads;
    w.nwarps = (L.nthreads + 31) / 32;
    w.reserve(L.nthreads);
    number_threads(w, L.spec.block);
    if (!L.loop) {
        for (unsigned i = 0; i < L.nthreads; i++) {
            Fiber& f = w.fibers[i];
            f.state = FiberState::Runnable;
            f.ctx = nullptr;
            f.pred = 0;
            f.async_copies.clear();
            f.async_commits = 0;
        }
        w.free_stacks.clear();
        for (unsigned i = L.nthreads; i-- > 0;) w.free_stacks.push_back(i);  // stack 0 is taken first
    }
    if (config().schedule == Schedule::Random)
        w.rng.seed(config().seed * 0x9E3779B97F4A7C15ull + L.launch_id * 1000003ull + linear);
    // Under the forward schedule a looped block takes its threads in the same
    // order as the last one of its shape: run_loop keeps that order.
    const bool forward = config().schedule == Schedule::Forward;
    if (!(L.loop && forward && w.loop_order_forward && w.loop_order.size() == L.nthreads)) {
        order_warps(w);
        shuffle_lanes(w);
        w.loop_order.clear();
        w.loop_order_forward = forward;
    }
    w.warp_pos = 0;
    w.lane_pos = 0;
#ifdef CPUCUDA_ASAN
    if (L.spec.smem < config().smem_per_block_optin)
        ASAN_POISON_MEMORY_REGION((char*)dynamic_shared_memory() + L.spec.smem,
                                  config().smem_per_block_optin - L.spec.smem);
#endif
    // a block finds in shared memory only what it writes itself
    if (config().initcheck) {
        if (L.spec.smem) poison(dynamic_shared_memory(), L.spec.smem);
        const uintptr_t tls = executable_tls_base();
        for (const auto& v : tls_symbols().shared) poison((void*)(tls + v.first), v.second);
    }
#ifdef CPUCUDA_RACECHECK
    {
        race::RaceBlock rb;
        rb.kernel = L.spec.name;
        rb.launch = L.launch_id + 1;
        rb.block = (uint32_t)linear;
        rb.block_dim = L.spec.block;
        rb.grid_dim = g;
        rb.stacks_lo = (uintptr_t)w.stacks;
        rb.stacks_hi = (uintptr_t)w.stacks + w.stack_stride * w.capacity;
        rb.dyn_lo = (uintptr_t)w.dyn_smem;
        rb.dyn_hi = (uintptr_t)w.dyn_smem + (w.dyn_smem ? config().smem_per_block_optin : 0);
        rb.sync = &w.sync;
        race::block_begin(rb);
    }
#endif
    if (L.loop) {
        run_loop(w, L);
    } else {
        Fiber* first = pick_next(w);
        if (first) jump_to(w, nullptr, first, false);
    }
#ifdef CPUCUDA_RACECHECK
    race::block_end();
#endif
#ifdef CPUCUDA_ASAN
    ASAN_UNPOISON_MEMORY_REGION(dynamic_shared_memory(), config().smem_per_block_optin);
#endif
    tls_thread = nullptr;
    w.launch = nullptr;
}

// Each worker takes a run of consecutive blocks at a time, a 2 x workers-th of
// what is left (guided scheduling: long runs first, single blocks at the end,
// so no worker idles long while another finishes). Consecutive blocks of an
// element-wise kernel cover consecutive addresses, so a worker walks each array
// as one stream that the hardware prefetcher follows; blocks dealt one at a
// time would leave a block-sized gap between a worker's blocks (AdamW over 124M
// parameters, fp32, 2 workers: 141 ms against 204 ms). CUDA promises no order.
static void work_on(LaunchState& L) {
    Worker& w = this_worker();
    if (L.spec.smem) dynamic_shared_memory();  // allocate before any fiber runs
    const uint64_t share = 2 * (uint64_t)config().workers;
    for (;;) {
        const uint64_t seen = L.next_block.load(std::memory_order_relaxed);
        if (seen >= L.nblocks) return;
        const uint64_t want = std::max<uint64_t>(1, (L.nblocks - seen) / share);
        const uint64_t b = L.next_block.fetch_add(want);
        if (b >= L.nblocks) return;
        const uint64_t end = std::min(L.nblocks, b + want);
        for (uint64_t k = b; k < end; k++) {
            if (L.failed.load(std::memory_order_relaxed)) return;
            run_block(w, L, k);
        }
    }
}

// --- the worker pool ---------------------------------------------------------------
// Helper threads sleep on a condition variable between jobs. A job is a
// function that every participating thread calls (the caller too); it takes
// its share of the work itself (blocks of a launch, chunks of a parallel_for).
class Pool {
  public:
    explicit Pool(int helpers) {
        for (int i = 0; i < helpers; i++) threads_.emplace_back([this] { loop(); });
    }
    ~Pool() {
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& t : threads_) t.join();
    }
    unsigned helpers() const { return (unsigned)threads_.size(); }
    // Runs job() on up to `want` helpers and on the calling thread; returns when
    // every call has returned. One job at a time (callers queue).
    void run(unsigned want, void (*job)(void*), void* arg) {
        std::lock_guard<std::mutex> one_job(run_mutex_);
        want = std::min(want, helpers());
        {
            std::lock_guard<std::mutex> lock(m_);
            job_ = job;
            arg_ = arg;
            busy_ = want;
            wanted_ = want;
            generation_++;
        }
        if (want == 1) cv_.notify_one();
        else if (want) cv_.notify_all();
        job(arg);
        std::unique_lock<std::mutex> lock(m_);
        done_cv_.wait(lock, [&] { return busy_ == 0; });
        job_ = nullptr;
    }

  private:
    void loop() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(m_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || (generation_ != seen && wanted_ > 0); });
            if (stop_) return;
            seen = generation_;
            wanted_--;
            void (*job)(void*) = job_;
            void* arg = arg_;
            lock.unlock();
            job(arg);
            lock.lock();
            if (--busy_ == 0) done_cv_.notify_all();
        }
    }
    std::vector<std::thread> threads_;
    std::mutex run_mutex_;
    std::mutex m_;
    std::condition_variable cv_, done_cv_;
    void (*job_)(void*) = nullptr;
    void* arg_ = nullptr;
    uint64_t generation_ = 0;
    unsigned busy_ = 0, wanted_ = 0;
    bool stop_ = false;
};

static Pool& pool() {
    static Pool p(config().workers - 1);
    return p;
}

int worker_count() { return config().workers; }

namespace {
struct ParallelFor {
    const std::function<void(int)>* fn;
    int tasks;
    std::atomic<int> next{0};
};
}  // namespace

void parallel_for(int tasks, const std::function<void(int)>& fn) {
    if (tasks <= 0) return;
    if (tasks == 1 || config().workers == 1) {
        for (int i = 0; i < tasks; i++) fn(i);
        return;
    }
    ParallelFor job;
    job.fn = &fn;
    job.tasks = tasks;
    pool().run((unsigned)tasks - 1,
               [](void* a) {
                   ParallelFor& j = *static_cast<ParallelFor*>(a);
                   for (int i; (i = j.next.fetch_add(1)) < j.tasks;) (*j.fn)(i);
               },
               &job);
}

// Per-kernel attributes set through cudaFuncSetAttribute, by kernel base name.
static std::mutex attr_mutex;
static std::unordered_map<std::string, size_t> max_dynamic_smem;

std::string kernel_base_name(const char* expr) {
    // The last identifier outside template arguments, before any top-level comma:
    // "ns::k<T, 4>" -> "k", "(const void*)k" -> "k".
    std::string last, cur;
    int angle = 0;
    for (const char* p = expr;; p++) {
        const bool ident = *p && (isalnum((unsigned char)*p) || *p == '_');
        if (ident && angle == 0) {
            cur += *p;
            continue;
        }
        if (!cur.empty()) last = cur, cur.clear();
        if (!*p || (*p == ',' && angle == 0)) break;
        if (*p == '<') angle++;
        if (*p == '>') angle--;
    }
    return last;
}

cudaError_t func_set_attribute(const char* text, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints only
    if (value < 0 || (size_t)value > config().smem_per_block_optin) return record(cudaErrorInvalidValue);
    // Launches name a kernel as written ("k<HS>"), not the instantiation, so a
    // name holds the largest grant of any of its instantiations: valid CUDA code
    // always launches; a missing opt-in is caught only when no sibling opted in.
    std::lock_guard<std::mutex> lock(attr_mutex);
    size_t& limit = max_dynamic_smem[kernel_base_name(text)];
    limit = std::max(limit, (size_t)value);
    return cudaSuccess;
}

static cudaError_t check_launch(const LaunchSpec& s) {
    const dim3 b = s.block, g = s.grid;
    if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024) return cudaErrorInvalidConfiguration;
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    size_t limit = config().smem_per_block;
    {
        std::lock_guard<std::mutex> lock(attr_mutex);
        auto it = max_dynamic_smem.find(kernel_base_name(s.name));
        if (it != max_dynamic_smem.end()) limit = it->second;
    }
    if (s.smem > limit) return cudaErrorInvalidValue;
    return cudaSuccess;
}

static std::atomic<uint64_t> launch_counter{0};
static std::mutex failure_mutex;
static std::string last_failure;

const char* last_kernel_failure() {
    std::lock_guard<std::mutex> lock(failure_mutex);
    return last_failure.c_str();
}
static std::mutex launch_mutex;  // one launch at a time: streams execute in issue order

// ---- profiling --------------------------------------------------------------
static std::atomic<bool> profiling{false};
static std::mutex profile_mutex;
static std::map<std::string, ProfileEntry>& profile_table() {
    static auto* table = new std::map<std::string, ProfileEntry>;  // outlives the atexit print
    return *table;
}
static void print_profile() {
    std::vector<ProfileEntry> entries = profile();
    double total = 0;
    for (auto& e : entries) total += e.seconds;
    fprintf(stderr, "cpu_cuda profile: %.3f s in kernels and matmuls\n", total);
    for (auto& e : entries)
        fprintf(stderr, "  %8.3f s %5.1f%% %8ld calls  %s\n", e.seconds, 100 * e.seconds / std::max(total, 1e-12),
                e.calls, e.name.c_str());
}
static const bool profile_from_env = [] {
    const char* v = getenv("CPUCUDA_PROFILE");
    if (v && std::string(v) == "1") {
        profiling = true;
        atexit(print_profile);
    }
    return true;
}();
bool profiling_on() { return profiling.load(std::memory_order_relaxed); }
void set_profiling(bool on) { profiling = on; }
double profile_clock() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void profile_add(const char* name, double seconds) {
    std::lock_guard<std::mutex> lock(profile_mutex);
    ProfileEntry& e = profile_table()[name];
    if (e.name.empty()) e.name = name;
    e.calls++;
    e.seconds += seconds;
}
std::vector<ProfileEntry> profile() {
    std::lock_guard<std::mutex> lock(profile_mutex);
    std::vector<ProfileEntry> v;
    for (auto& kv : profile_table()) v.push_back(kv.second);
    std::sort(v.begin(), v.end(), [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
    return v;
}
void reset_profile() {
    std::lock_guard<std::mutex> lock(profile_mutex);
    profile_table().clear();
}

// Runs every block of a kernel now.
static void execute(const LaunchSpec& spec, const KernelClosure& kernel, void* data) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    const double start = profiling_on() ? profile_clock() : 0;
    LaunchState L;
    L.spec = spec;
    L.entry = kernel.run_thread;
    L.closure = data;
#ifdef CPUCUDA_RACECHECK
    // racecheck leaves out a thread's own stack (the fibers' stacks), which a loop does not run on
    L.loop = nullptr;
#else
    L.loop = spec.threads_never_meet && config().thread_loops ? kernel.run_threads : nullptr;
#endif
    if (L.loop) loop_launch_count++;
    L.nthreads = spec.block.x * spec.block.y * spec.block.z;
    L.nblocks = (uint64_t)spec.grid.x * spec.grid.y * spec.grid.z;
    L.launch_id = launch_counter++;
    if (L.nblocks == 1 || config().workers == 1) work_on(L);
    else
        pool().run((unsigned)std::min<uint64_t>(config().workers - 1, L.nblocks - 1),
                   [](void* a) { work_on(*static_cast<LaunchState*>(a)); }, &L);
    if (profiling_on()) profile_add(spec.name, profile_clock() - start);
    if (L.failed) {
        fprintf(stderr, "%s\n", L.error.c_str());
        {
            std::lock_guard<std::mutex> lock(failure_mutex);
            last_failure = L.error;
        }
        int expected = cudaSuccess;
        pending_kernel_error.compare_exchange_strong(expected, cudaErrorLaunchFailure);
    }
}

// Checks the configuration now (errors belong to the launch, as in CUDA) and
// runs the kernel in stream order; a deferred stream keeps a copy of it.
void launch(const LaunchSpec& spec, const KernelClosure& kernel) {
    cudaError_t e = check_launch(spec);
    if (e != cudaSuccess) {
        record(e);
        return;
    }
    if (tls_thread) device_trap("kernel launch from inside a kernel (dynamic parallelism) is not supported");
    if (!streams_deferred()) return execute(spec, kernel, kernel.data);
    std::shared_ptr<void> copy(kernel.copy(kernel.data), kernel.destroy);
    enqueue(spec.stream, [spec, kernel, copy] { execute(spec, kernel, copy.get()); });
}

}  // namespace cpucuda

// ============================================================================
// The runtime API (declared by the toolkit's cuda_runtime_api.h)
// ============================================================================
using cpucuda::config;
using cpucuda::record;

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t p = cpucuda::take_pending();
    cudaError_t e = cpucuda::last_error;
    cpucuda::last_error = cudaSuccess;
    return e != cudaSuccess ? e : p;
}
cudaError_t cudaPeekAtLastError(void) {
    int p = cpucuda::pending_kernel_error.load();
    return cpucuda::last_error != cudaSuccess ? cpucuda::last_error : (cudaError_t)p;
}

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        default: return "cudaErrorUnknown";
    }
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorLaunchFailure: return "unspecified launch failure";
        case cudaErrorNotReady: return "device not ready";
        default: return "unknown error";
    }
}

// --- device -----------------------------------------------------------------------
static thread_local int current_device = 0;

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return record(cudaErrorInvalidValue);
    *count = config().device_count;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= config().device_count) return record(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    if (!d) return record(cudaErrorInvalidValue);
    *d = current_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (!p) return record(cudaErrorInvalidValue);
    if (d < 0 || d >= config().device_count) return record(cudaErrorInvalidDevice);
    const cpucuda::Config& c = config();
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cpu_cuda virtual device (%d workers)", c.workers);
    p->totalGlobalMem = c.total_memory;
    p->sharedMemPerBlock = c.smem_per_block;
    p->sharedMemPerBlockOptin = c.smem_per_block_optin;
    p->sharedMemPerMultiprocessor = c.smem_per_block_optin + 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = c.sm_count;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, d);
    if (e != cudaSuccess) return e;
    if (!value) return record(cudaErrorInvalidValue);
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
        case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
        default: return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    cpucuda::synchronize_device();
    return cpucuda::take_pending();
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

// The virtual device's occupancy: what threads per SM (2048) and shared
// memory allow, capped at CPUCUDA_BLOCKS_PER_SM (4). Grids sized from it stay
// small, which keeps the CPU build fast (every GPU thread is a fiber); kernel
// registers do not limit anything here.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func, int block_size,
                                                          size_t dynamic_smem) {
    if (!num_blocks || !func || block_size <= 0 || block_size > 1024) return cpucuda::record(cudaErrorInvalidValue);
    const cpucuda::Config& c = cpucuda::config();
    size_t blocks = std::min<size_t>(c.blocks_per_sm, 2048 / (size_t)block_size);
    if (dynamic_smem) blocks = std::min(blocks, (228u * 1024) / dynamic_smem);
    *num_blocks = (int)blocks;
    return cudaSuccess;
}

#undef cudaFuncSetAttribute
// The C entry point: kernels launched by this runtime are known by name, not by
// address, so the attribute cannot be tied to a launch from here. Code reaches
// the macro in cuda_runtime.h instead; this only validates.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (!func) return record(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
        (value < 0 || (size_t)value > config().smem_per_block_optin))
        return record(cudaErrorInvalidValue);
    return cudaSuccess;
}

// --- memory -----------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, size_t size) {
    if (!p) return record(cudaErrorInvalidValue);
    *p = nullptr;
    if (size == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(cpucuda::mem_mutex);
    if (size > config().total_memory - cpucuda::mem_in_use) return record(cudaErrorMemoryAllocation);
    void* m = nullptr;  // exactly `size` bytes, so the sanitizer build sees overruns
#ifndef CPUCUDA_ASAN
    // Large allocations start on a 2 MiB boundary and ask for transparent huge
    // pages: kernels stride through weights and optimizer state (one GPU
    // thread after another), which on 4 KiB pages is mostly TLB misses, and
    // the first touch of a fresh buffer costs one fault per 2 MiB, not per page.
    const size_t huge = 2u << 20;
    if (size >= huge) {
        if (posix_memalign(&m, huge, size) != 0) return record(cudaErrorMemoryAllocation);
        madvise(m, size, MADV_HUGEPAGE);
    } else
#endif
        if (posix_memalign(&m, 256, size) != 0)
        return record(cudaErrorMemoryAllocation);
    if (config().initcheck) cpucuda::poison(m, size);
    cpucuda::device_allocs[(uintptr_t)m] = size;
    cpucuda::mem_in_use += size;
    cpucuda::mem_peak = std::max(cpucuda::mem_peak, cpucuda::mem_in_use);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    cpucuda::synchronize_device();  // cudaFree waits for the device, as in CUDA
    {
        std::lock_guard<std::mutex> lock(cpucuda::mem_mutex);
        auto it = cpucuda::device_allocs.find((uintptr_t)p);
        if (it == cpucuda::device_allocs.end()) return record(cudaErrorInvalidValue);
        cpucuda::mem_in_use -= it->second;
        cpucuda::device_allocs.erase(it);
    }
    free(p);
    return cudaSuccess;
}
// Pinned host memory is recorded: a deferred stream may read or write it later,
// whereas copies to or from pageable memory complete before returning.
cudaError_t cudaMallocHost(void** p, size_t size) {
    if (!p) return record(cudaErrorInvalidValue);
    *p = nullptr;
    if (size == 0) return cudaSuccess;
    if (posix_memalign(p, 256, size) != 0) return record(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lock(cpucuda::mem_mutex);
    cpucuda::pinned_allocs[(uintptr_t)*p] = size;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) { return cudaMallocHost(p, size); }
cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    cpucuda::synchronize_device();
    {
        std::lock_guard<std::mutex> lock(cpucuda::mem_mutex);
        if (!cpucuda::pinned_allocs.erase((uintptr_t)p)) return record(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocManaged(void** p, size_t size, unsigned int) { return cudaMalloc(p, size); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    cpucuda::MemoryStats s = cpucuda::memory_stats();
    if (free_bytes) *free_bytes = s.total - s.in_use;
    if (total) *total = s.total;
    return cudaSuccess;
}

// A copy whose direction names a side the pointer is not on is an error, as on
// a GPU (where it would fault or corrupt); cudaMemcpyDefault accepts anything.
static cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return record(cudaErrorInvalidValue);
    const bool dst_dev = cpucuda::is_device_ptr(dst, n), src_dev = cpucuda::is_device_ptr(src, n);
    bool ok = true;
    switch (kind) {
        case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
        case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
        case cudaMemcpyDeviceToHost: ok = !dst_dev && src_dev; break;
        case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
        case cudaMemcpyDefault: break;
        default: return record(cudaErrorInvalidMemcpyDirection);
    }
    return ok ? cudaSuccess : record(cudaErrorInvalidValue);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess) return e;
    cpucuda::enqueue(nullptr, [=] {
        if (n) memmove(dst, src, n);
    });  // the legacy stream: runs now
    return cpucuda::take_pending();  // synchronising, like the real cudaMemcpy
}
// Copies that involve pageable host memory complete before returning (CUDA
// stages them synchronously); device-to-device and pinned copies are stream work.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess || n == 0) return e;
    auto pageable = [n](const void* p) { return !cpucuda::is_device_ptr(p, n) && !cpucuda::is_pinned_host_ptr(p, n); };
    if (pageable(dst) || pageable(src)) {
        cpucuda::synchronize_stream(stream);
        memmove(dst, src, n);
    } else {
        cpucuda::enqueue(stream, [=] { memmove(dst, src, n); });
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
    if (n && !cpucuda::is_device_ptr(p, n)) return record(cudaErrorInvalidValue);
    if (n) cpucuda::enqueue(stream, [=] { memset(p, value, n); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

}  // extern "C"
