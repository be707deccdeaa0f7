// The squared global gradient norm (llmc/kernels/global_norm.cuh) against a sum in
// double; a rerun is bitwise the same.
#include "llmc/kernels/global_norm.cuh"
#include "test/kernels/kernel_test.h"

static void test_global_norm(size_t n) {
    g_rng.seed(600 + (unsigned)n);
    const auto g = randf(n, -1, 1);
    Dev d;
    float* d_g = d.up(g);
    float* d_norm = d.up(std::vector<float>{12345.0f});
    float* d_scratch = d.alloc<float>(global_norm_scratch_floats());
    global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
    const float got = to_host(d_norm, 1)[0];
    double want = 0;
    for (float x : g) want += (double)x * x;
    const double e = std::fabs(got - want) / want;
    CHECK(e <= TOL_F32, "global_norm_squared n=%zu overwrites (rel err %.2e <= %.0e)", n, e, TOL_F32);
    global_norm_squared(d_norm, d_scratch, d_g, n, g_stream);
    const float again = to_host(d_norm, 1)[0];
    CHECK(memcmp(&got, &again, 4) == 0, "global_norm_squared n=%zu: bitwise identical rerun", n);
}

int main() {
    kernel_test_begin("test_global_norm");
    TEST_CASE(test_global_norm(1));
    TEST_CASE(test_global_norm(1000));
    TEST_CASE(test_global_norm(1000003));  // odd: one element per thread, 4 steps per lane
    TEST_CASE(test_global_norm(1200028));  // packs of 4; the last warps' segments empty
    TEST_CASE(test_global_norm(8000000));  // packs of 4, 8 steps per lane
    return kernel_test_end("test_global_norm");
}
