// Minimal test harness shared by every test program (CPU runtime and GPU builds).
// Each CHECK names what it checks; the program prints one line per check and a
// final "<program>: N passed, M failed" line that test/run_tests.sh adds up.
// A case is one call of a test function in main, written TEST_CASE(call):
// with TEST_FILTER=substring in the environment only the cases whose source
// text contains it run, e.g. TEST_FILTER='test_layernorm(37' runs
// test_layernorm(37, 40) and test_layernorm(37, 768).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

struct TestTally {
    int passed = 0, failed = 0;
};
static TestTally g_tally;
struct TestCases {
    int seen = 0, run = 0;
};
static TestCases g_cases;

static inline const char* test_filter() {
    const char* f = getenv("TEST_FILTER");
    return f && *f ? f : nullptr;
}
// Counts the case and says whether it runs under TEST_FILTER.
static inline bool test_case_selected(const char* name) {
    g_cases.seen++;
    const char* f = test_filter();
    if (f && !strstr(name, f)) return false;
    g_cases.run++;
    return true;
}
#define TEST_CASE(call)                      \
    do {                                     \
        if (test_case_selected(#call)) call; \
    } while (0)

// Records one named case. Prints PASS/FAIL with an optional detail string.
#define CHECK(cond, ...)                                               \
    do {                                                               \
        bool ok_ = (cond);                                             \
        printf("%s ", ok_ ? "PASS" : "FAIL");                          \
        printf(__VA_ARGS__);                                           \
        if (!ok_) printf("   [%s:%d: %s]", __FILE__, __LINE__, #cond); \
        printf("\n");                                                  \
        fflush(stdout);                                                \
        if (ok_) g_tally.passed++;                                     \
        else g_tally.failed++;                                         \
    } while (0)

// Aborts on an unexpected CUDA API error: the test cannot go on meaningfully.
#define CUDA_OK(call)                                                                                    \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            printf("FAIL %s returned %s at %s:%d\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

// Prints the tally line and returns the process exit code. Under TEST_FILTER
// it first says how many cases ran; a filter that selects none is an error
// (a typo must not pass as "0 failed").
static inline int test_summary(const char* program) {
    const char* f = test_filter();
    if (f && g_cases.seen == 0) printf("TEST_FILTER=%s: %s has no TEST_CASEs; every check ran\n", f, program);
    if (f && g_cases.seen > 0) printf("TEST_FILTER=%s: %d of %d cases ran\n", f, g_cases.run, g_cases.seen);
    printf("%s: %d passed, %d failed\n", program, g_tally.passed, g_tally.failed);
    if (f && g_cases.seen > 0 && g_cases.run == 0) return 1;
    return g_tally.failed == 0 ? 0 : 1;
}

// A path under build/ that no other process uses: test/run_tests.sh runs two
// programs at a time (its lanes), and the same test in two builds must not
// share a file.
static inline std::string scratch_path(const char* name) {
    return std::string("build/") + name + "." + std::to_string(getpid());
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
