// Attention kernels alone (llmc/kernels/attention.cuh) at GPT-2 d12 shapes: ms per
// call and TFLOP/s for the forward, the backward and the two together.
//   usage: bench_attention [B[,B...]] [T] [NH] [HS] [iters] [NKV]
//   (NKV: key/value heads of grouped-query attention, a divisor of NH; default NH)
//   e.g.   build/gpu/sm_90/bench_attention               (B = 16, 32, 64; T=1024 NH=12 HS=64, 20 iters)
//          build/cpu/bench_attention                     (CPU runtime: B=1 T=128 NH=2 HS=64, 1 iter)
// Compare with PyTorch's SDPA: python3 dev/bench_attention_sdpa.py (same lines).
//
// FLOP convention (FlashAttention papers): causal attention does half of the
// T x T work, so the forward's two matmuls (Q K^T, P V) count
// 2 x 2*B*NH*T*T*HS / 2 = 2*B*NH*T^2*HS, and the backward's five count 2.5x
// that. These are nominal FLOPs: a kernel may do more (the backward recomputes
// P), and the softmax is not counted. forward+backward is the sum of the two
// timings.
//
// Then the same with document masking (--doc-mask) on documents of mean
// length T/8 (lengths 1 .. T/4 - 1 from a fixed seed): its time as a fraction
// of the causal time (the masked kernels skip the tiles before each document).
//
// Inputs (qkv, dout) are uniform in [-1, 1) (then rounded to floatX), from a
// fixed seed. Every output must be finite, else `error:` and exit 1, so a
// broken kernel cannot benchmark silently; the printed means are a checksum.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <string>
#include <vector>
#include "llmc/kernels/attention.cuh"
#include "dev/bench_timing.h"

static void fail(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(EXIT_FAILURE);
}

static const char* USAGE = "usage: bench_attention [B[,B...]] [T] [NH] [HS] [iters] [NKV]";

static int parse_positive(const char* s) {
    char* end = nullptr;
    const long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v <= 0 || v > 1 << 30) fail("'%s': not a positive integer (%s)", s, USAGE);
    return (int)v;
}

static std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    size_t begin = 0;
    while (true) {
        const size_t comma = s.find(',', begin);
        out.push_back(parse_positive(s.substr(begin, comma - begin).c_str()));
        if (comma == std::string::npos) return out;
        begin = comma + 1;
    }
}

// A stateless hash per element: the same inputs for every B and every run.
__global__ void fill_uniform(floatX* x, size_t n, uint32_t seed) {
    const BlockChunk chunk = block_chunk(n);
    for (size_t i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
        const uint32_t r = hash_u32((uint32_t)i ^ hash_u32(seed + (uint32_t)(i >> 32)));
        x[i] = from_float<floatX>((r >> 8) * (2.0f / 16777216.0f) - 1.0f);  // 24 bits: exact in fp32
    }
}

static floatX* random_device(size_t n, uint32_t seed, cudaStream_t stream) {
    floatX* d = nullptr;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    fill_uniform<<<chunked_grid_blocks(n, 256), 256, 0, stream>>>(d, n, seed);
    cudaCheck(cudaGetLastError());
    return d;
}

// Mean |x| over a device buffer; exits if any element is NaN or infinite.
template <class T>
static double mean_abs_finite(const T* d, size_t n, const char* what) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = to_float(h[i]);
        if (!std::isfinite(v)) fail("attention: %s[%zu] = %g is not finite", what, i, v);
        sum += std::fabs(v);
    }
    return sum / n;
}

struct Shape {
    int B, T, NH, HS, NKV;
};

// "NH=12" for multi-head attention, "NH=32 NKV=8" for grouped-query attention
static std::string heads(const Shape& s) {
    return "NH=" + std::to_string(s.NH) + (s.NKV != s.NH ? " NKV=" + std::to_string(s.NKV) : "");
}

static void print_line(const Shape& s, const char* pass, double flop, double ms) {
    printf("attention llmc B=%d T=%d %s HS=%d %-16s %.3e FLOP %9.3f ms %8.2f TFLOP/s\n", s.B, s.T, heads(s).c_str(),
           s.HS, pass, flop, ms, flop / (ms * 1e-3) / 1e12);
}

static void bench_shape(const Shape& s, int iters, cudaStream_t stream) {
    const size_t C = (size_t)s.NH * s.HS, W = (size_t)(s.NH + 2 * s.NKV) * s.HS, rows = (size_t)s.B * s.T;
    floatX* qkv = random_device(rows * W, 1, stream);
    floatX* dout = random_device(rows * C, 2, stream);
    floatX *out, *dqkv;
    float *lse, *scratch;
    cudaCheck(cudaMalloc(&out, rows * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dqkv, rows * W * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, rows * s.NH * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, attention_backward_scratch_floats(s.B, s.T, s.NH) * sizeof(float)));

    auto forward = [&] { attention_forward(out, lse, qkv, nullptr, s.B, s.T, s.NH, s.NKV, s.HS, stream); };
    auto backward = [&] {
        attention_backward(dqkv, scratch, dout, qkv, out, lse, nullptr, s.B, s.T, s.NH, s.NKV, s.HS, stream);
    };
    forward();  // warm-up: first launch of each kernel, first touch of every buffer
    backward();
    const double fwd_ms = time_ms(forward, iters, stream);
    const double bwd_ms = time_ms(backward, iters, stream);
    cudaCheck(cudaDeviceSynchronize());

    // checked before any number is printed: a broken kernel gets no timings
    const double out_mean = mean_abs_finite(out, rows * C, "out");
    const double lse_mean = mean_abs_finite(lse, rows * s.NH, "lse");
    const double dqkv_mean = mean_abs_finite(dqkv, rows * W, "dqkv");
    printf("check B=%d: out, lse, dqkv finite; mean |out| %.6e, |lse| %.6e, |dqkv| %.6e\n", s.B, out_mean, lse_mean,
           dqkv_mean);
    const double fwd_flop = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
    print_line(s, "forward", fwd_flop, fwd_ms);
    print_line(s, "backward", 2.5 * fwd_flop, bwd_ms);
    print_line(s, "forward+backward", 3.5 * fwd_flop, fwd_ms + bwd_ms);

    std::vector<int> tokens(rows, 1);
    uint32_t seed = 12345;
    const int max_len = std::max(1, s.T / 4 - 1);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t += 1 + (int)((seed = hash_u32(seed)) % max_len)) tokens[(size_t)b * s.T + t] = 0;
    std::vector<int2> spans(rows);
    document_spans(spans.data(), tokens.data(), s.B, s.T, 0);
    int2* docs;
    cudaCheck(cudaMalloc(&docs, rows * sizeof(int2)));
    cudaCheck(cudaMemcpy(docs, spans.data(), rows * sizeof(int2), cudaMemcpyHostToDevice));
    auto masked = [&] {
        attention_forward(out, lse, qkv, docs, s.B, s.T, s.NH, s.NKV, s.HS, stream);
        attention_backward(dqkv, scratch, dout, qkv, out, lse, docs, s.B, s.T, s.NH, s.NKV, s.HS, stream);
    };
    masked();
    const double masked_ms = time_ms(masked, iters, stream);
    printf("attention llmc B=%d T=%d %s HS=%d documents of mean length %d: forward+backward %.3f ms, %.2f of the "
           "causal time\n",
           s.B, s.T, heads(s).c_str(), s.HS, std::max(1, s.T / 8), masked_ms, masked_ms / (fwd_ms + bwd_ms));
    cudaCheck(cudaFree(docs));

    for (void* p : {(void*)qkv, (void*)dout, (void*)out, (void*)dqkv, (void*)lse, (void*)scratch})
        cudaCheck(cudaFree(p));
}

static int bench(int argc, char** argv) {
#ifdef CPUCUDA
    // fibers run every GPU thread on the CPU: GPU shapes would take hours
    std::vector<int> Bs = {1};
    Shape s = {1, 128, 2, 64, 0};
    int iters = 1;
#else
    std::vector<int> Bs = {16, 32, 64};
    Shape s = {16, 1024, 12, 64, 0};
    int iters = 20;
#endif
    if (argc > 7) fail("%s", USAGE);
    if (argc > 1) Bs = parse_list(argv[1]);
    if (argc > 2) s.T = parse_positive(argv[2]);
    if (argc > 3) s.NH = parse_positive(argv[3]);
    if (argc > 4) s.HS = parse_positive(argv[4]);
    if (argc > 5) iters = parse_positive(argv[5]);
    s.NKV = argc > 6 ? parse_positive(argv[6]) : s.NH;

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %s, %d iters per pass\n", prop.name, PRECISION_NAME, iters);
#ifdef CPUCUDA
    printf("CPU runtime: smoke test, not a GPU number\n");
#endif
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    for (int B : Bs) {
        s.B = B;
        bench_shape(s, iters, stream);
    }
    cudaCheck(cudaStreamDestroy(stream));
    return 0;
}

// a CUDA or cuBLASLt error (llmc::Error) is one line "error: ..." and exit status 1
int main(int argc, char** argv) { return llmc::run_main(bench, argc, argv); }
