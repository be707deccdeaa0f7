// The built-in variables are macros of cuda_runtime.h in the CUDA-on-CPU runtime.
#pragma once
#include <cuda_runtime.h>
