// Instantiates the Llama 3 kernels (llmc/rmsnorm.cuh, rope.cuh, swiglu.cuh),
// which train_gpt.cu does not use yet, for dev/sass_report.py: each launcher
// below instantiates its kernels at both pack widths (16-byte and 1 element).
// Compiled with -c only (no main): it lives outside dev/*.cu, which the
// Makefile builds into programs.
#include "llmc/rmsnorm.cuh"
#include "llmc/rope.cuh"
#include "llmc/swiglu.cuh"

void llama3_kernels_for_sass(floatX* x, float* f, const int* positions, cudaStream_t stream) {
    rmsnorm_forward(x, f, x, x, 1, 8, 1e-5f, stream);
    fused_residual_rmsnorm_forward(x, x, f, x, x, x, 1, 8, 1e-5f, stream);
    rmsnorm_backward(x, f, f, x, x, x, f, 1, 8, stream);
    rope_forward(x, x, f, positions, 1, 1, 1, 16, 16, 1, stream);
    rope_backward(x, x, f, positions, 1, 1, 1, 16, 16, 1, stream);
    swiglu_forward(x, x, 1, 8, stream);
    swiglu_backward(x, x, x, 1, 8, stream);
}
