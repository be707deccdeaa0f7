// Minimal test harness shared by every test program (CPU runtime and GPU builds).
// Each CHECK names what it checks; the program prints one line per case and a
// final "<program>: N passed, M failed" line that test/run_tests.sh adds up.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>

struct TestTally { int passed = 0, failed = 0; };
static TestTally g_tally;

// Records one named case. Prints PASS/FAIL with an optional detail string.
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        bool ok_ = (cond);                                                     \
        printf("%s ", ok_ ? "PASS" : "FAIL");                                  \
        printf(__VA_ARGS__);                                                   \
        if (!ok_) printf("   [%s:%d: %s]", __FILE__, __LINE__, #cond);         \
        printf("\n");                                                          \
        fflush(stdout);                                                        \
        if (ok_) g_tally.passed++; else g_tally.failed++;                      \
    } while (0)

// Aborts on an unexpected CUDA API error: the test cannot go on meaningfully.
#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            printf("FAIL %s returned %s at %s:%d\n", #call,                    \
                   cudaGetErrorString(e_), __FILE__, __LINE__);                \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

// Prints the tally line and returns the process exit code.
static inline int test_summary(const char* program) {
    printf("%s: %d passed, %d failed\n", program, g_tally.passed, g_tally.failed);
    return g_tally.failed == 0 ? 0 : 1;
}

// Largest |a-b| / max(|b|, floor) over n elements.
template <class A, class B>
static double max_rel_diff(const A* a, const B* b, size_t n, double floor = 1e-6) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double x = (double)a[i], y = (double)b[i];
        double d = std::fabs(x - y) / std::fmax(std::fabs(y), floor);
        if (!(d <= worst)) worst = d;  // NaN propagates as "worst"
    }
    return worst;
}
