// cg::reduce lives in ../cooperative_groups.h in the CUDA-on-CPU runtime.
#pragma once
#include <cooperative_groups.h>
