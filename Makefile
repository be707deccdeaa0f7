# Two builds of the same CUDA sources:
#   CPU (always): g++ through the CUDA-on-CPU runtime in cpu_cuda/ -> build/cpu/
#   GPU (nvcc):   the real toolkit for GPU_ARCH (default 90)       -> build/gpu/
# `make test` runs every CPU test, compiles every CUDA program with nvcc (the
# trainers for sm_90, their kernels for sm_80 too; skipped, saying so, where nvcc is absent) and
# runs the GPU tests where a GPU is present.

CUDA_HOME ?= /usr/local/cuda
GPU_ARCH  ?= 90
NVCC      ?= $(CUDA_HOME)/bin/nvcc
PYTHON    ?= python3
CXX       ?= g++
MPICXX    ?= mpicxx
MPI_INC   ?= /usr/lib/x86_64-linux-gnu/openmpi/include
MPI_LIB   ?= /usr/lib/x86_64-linux-gnu/openmpi/lib

RT_DIR  := cpu_cuda
RT_SRCS := $(wildcard $(RT_DIR)/*.cpp)
RT_HDRS := $(wildcard $(RT_DIR)/*.h $(RT_DIR)/include/*.h $(RT_DIR)/include/*/*.h)

# --- CPU build --------------------------------------------------------------
# The toolkit's headers (the CPU runtime declares CUDA's API through them):
# $(CUDA_HOME)/include where the toolkit is installed, else the same headers
# that dev/install_deps.sh gathers from NVIDIA's PyPI wheels.
CUDA_HEADERS_DIR ?= deps/cuda-headers/include
CUDA_INC   := $(if $(wildcard $(CUDA_HOME)/include/cuda_bf16.h),$(CUDA_HOME)/include,$(CUDA_HEADERS_DIR))
CPU_INC    := -I$(RT_DIR)/include -I$(CUDA_INC) -I.
# -fno-math-errno: CUDA's math functions never set errno, so sqrtf and friends
# compile to plain instructions (no errno branch), as on the device.
# -fpeel-loops: loops of a constant trip count unrolled whole, as nvcc does
# under #pragma unroll, so that a thread's register arrays (the fp32
# attention's accumulators of a row) stay in registers rather than on the
# stack; it reorders no sum (docs/benchmarks.md: measured, and why not -O3).
CPU_CXXFLAGS ?= -O2 -fpeel-loops -g1 -std=c++17 -fno-math-errno -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-sign-compare -pthread
# WERROR=1 (CI: .ci/run): a warning of the CPU or host builds fails the build.
WERROR ?= 0
WERROR_FLAGS := $(if $(filter 1,$(WERROR)),-Werror)
CPU_CXXFLAGS += $(WERROR_FLAGS)
# oneDNN (-ldnnl, built on OpenMP: -lgomp) runs the bf16 matmuls where the CPU has bf16 instructions
CPU_LIBS   := -lopenblas -ldnnl -lgomp -lboost_context -pthread
# -Og: the instrumented units compile in about 60% of -O1's time and run within 6% of it
# (test_gpt2: 32 s against 55 s to compile, 55 s against 52 s to run, CPU seconds)
ASAN_FLAGS := -Og -g1 -fsanitize=address,undefined -fno-omit-frame-pointer -DBOOST_USE_ASAN
# racecheck: kernels get ThreadSanitizer's instrumentation (a call per load and
# store), whose hooks are cpu_cuda/racecheck.cpp; libtsan is not linked.
# -O1: at -O2 gcc's line table gives some kernel code inlined into a second
# launch's thread function the file of the kernel but a line of cuda_runtime.h.
RACE_FLAGS := -DCPUCUDA_RACECHECK
RACE_INSTRUMENT := -O1 -fsanitize=thread --param tsan-instrument-func-entry-exit=0

# CUDA programs are found by name in these folders (both builds), so a name
# is unique across them.
vpath %.cu cpu_cuda cpu_cuda/test cpu_cuda/test/sanitizer test/kernels test/model dev .

# CUDA test programs (portable .cu files; each builds for CPU and GPU):
#   cpu_cuda/test/  the CUDA-on-CPU runtime itself (kernel language, streams,
#                  cuBLASLt, NCCL, its checking modes)
#   test/kernels/  one program per kernel header of llmc/ against plain C++
#   test/model/    the trainers' models (train_gpt.cu, train_llama3.cu) against PyTorch's numbers
TEST_CU    := $(wildcard cpu_cuda/test/test_*.cu test/kernels/test_*.cu test/model/test_*.cu)
TEST_NAMES := $(basename $(notdir $(TEST_CU)))
KERNEL_TESTS := $(basename $(notdir $(wildcard test/kernels/test_*.cu)))
# the programs also built in fp32 (build/cpu-fp32): those whose numbers depend on floatX
FP32_TESTS := $(filter-out test_ptx,$(KERNEL_TESTS)) test_gpt2 test_llama3 test_training test_distributed
# Programs that run as several ranks (NCCL across MPI processes) link Open MPI
# and are compiled with MULTI_GPU; the rest run single-process.
MPI_PROGRAMS := test_nccl test_distributed train_gpt train_llama3 lesson
# The model tests run one head size (their models have HS 16): every build of them compiles
# the attention kernels for it alone (llmc/kernels/attention.cuh's ATTENTION_HEAD_SIZES); the other
# programs compile all 8.
HEAD_SIZE_16_PROGRAMS := test_gpt2 test_llama3 test_training test_distributed
head_sizes = $(if $(filter $(1),$(HEAD_SIZE_16_PROGRAMS)),-DATTENTION_HEAD_SIZES=16)
comma := ,
# nvcc splits a -D value at commas unless each is escaped: -D'ATTENTION_HEAD_SIZES=64\,128'
nvcc_head_sizes = $(if $(1),'-DATTENTION_HEAD_SIZES=$(subst $(comma),\$(comma),$(1))')
# The sanitizer build's trainers run only the models of the tests that use them (test_train_cli,
# test_fuzz_loaders): GPT-2's at head sizes 16 (the tiny models) and 64 (d12), Llama 3's at 16.
# Attention at every size runs under the sanitizer in test_attention.
asan_head_sizes = $(or $(call head_sizes,$(1)),$(if $(filter train_gpt,$(1)),-DATTENTION_HEAD_SIZES=16$(comma)64),$(if \
                    $(filter train_llama3,$(1)),-DATTENTION_HEAD_SIZES=16))
CPU_TESTS  := $(addprefix build/cpu/,$(TEST_NAMES))
ASAN_TESTS := $(addprefix build/cpu-asan/,$(TEST_NAMES))
# Host C++ programs (data tools and their tests; rules below), defined here
# because the `cpu` and `asan` targets list them.
HOST_SRCS  := $(wildcard data/*.cpp dev/*.cpp test/host/*.cpp)
HOST_BINS  := $(patsubst %.cpp,build/host/%,$(notdir $(HOST_SRCS)))
# the sanitizer build of the host tests and of the tools they run (test_fuzz_loaders: prepro;
# test_hellaswag_tool: hellaswag)
HOST_ASAN  := $(addprefix build/host-asan/,$(basename $(notdir $(wildcard test/host/test_*.cpp))) prepro hellaswag)
DEV_CU     := $(wildcard dev/*.cu cpu_cuda/*.cu)
# (the lesson runs in fp32 only: `make lesson`, build/cpu-fp32/lesson)
DEV_BINS   := $(addprefix build/cpu/,$(filter-out lesson,$(basename $(notdir $(DEV_CU)))))

.PHONY: all cpu asan racecheck gpu gpu-deps test check test-asan test-one bench bench-torch bench-muon lr-grid memory-table clean check-cuda-headers train_gpt_cpu train_llama3_cpu sass-report lesson \
        format format-check
.SECONDARY:

all: cpu

check-cuda-headers:
	@test -f $(CUDA_INC)/cuda_bf16.h || { echo "error: cuda_bf16.h is in neither $(CUDA_HOME)/include nor $(CUDA_HEADERS_DIR): the CPU build needs the CUDA toolkit's headers; run dev/install_deps.sh (it gathers them from PyPI) or set CUDA_HOME"; exit 1; }

# The trainers: `make train_gpt` (nvcc, for GPU_ARCH) and `make train_gpt_cpu`
# (the CPU runtime), the same for train_llama3. PRECISION=FP32 builds
# everything in fp32 instead of bf16.
PRECISION ?= BF16
ifeq ($(PRECISION),FP32)
  PRECISION_FLAGS := -DENABLE_FP32
  CPU_TRAINER := build/cpu-fp32/train_gpt
  CPU_LLAMA3  := build/cpu-fp32/train_llama3
else ifeq ($(PRECISION),BF16)
  CPU_TRAINER := build/cpu/train_gpt
  CPU_LLAMA3  := build/cpu/train_llama3
else
  $(error PRECISION=$(PRECISION): use BF16 (default) or FP32)
endif
LLMC_HDRS := $(wildcard llmc/*.h llmc/*/*.h llmc/*/*.cuh)

CPU_BINS := $(CPU_TESTS) $(DEV_BINS) $(HOST_BINS) build/cpu/train_gpt build/cpu/train_llama3 \
            $(addprefix build/cpu-fp32/,$(FP32_TESTS) train_gpt train_llama3 lesson llama3_logits)
cpu: check-cuda-headers $(CPU_BINS)
# What make test builds of it: all but the programs no test runs, whose units it compiles
# without code generation (build/cpu/X.syntax: g++ -fsyntax-only, a quarter of the time).
NOT_RUN_BY_TESTS := $(addprefix build/cpu/,llama3_logits bench_attention bench_cpu_cuda)
CPU_FOR_TESTS := $(filter-out $(NOT_RUN_BY_TESTS),$(CPU_BINS)) $(addsuffix .syntax,$(NOT_RUN_BY_TESTS))
build/cpu/%.syntax: build/cpu/%.ii
	$(CXX) $(CPU_CXXFLAGS) -fsyntax-only -x c++-cpp-output $< && touch $@

# .cu -> preprocessed C++ with <<<>>> launches and extern __shared__ rewritten.
# Variant directories: build/cpu (optimised), build/cpu-asan (sanitizers),
# build/cpu-fp32 and build/cpu-racecheck (below).
define cpu_variant
# $(1) = build dir, $(2) = compiler flags, $(3) = preprocessor flags,
# $(4) = flags for the CUDA units only (not the runtime), $(5) = include flags
# (default $(CPU_INC)), $(6) = the function giving a program's head sizes (default head_sizes),
# $(7) = compiler flags for the runtime's runtime.cpp (default $(2)), $(8) = the build dir whose
# runtime libraries its programs link (default $(1))
$(1)/%.ii: %.cu $(RT_HDRS) $(RT_DIR)/cudapp.py | check-cuda-headers
	@mkdir -p $$(@D)
	$(CXX) -std=c++17 -E -x c++ $(or $(5),$(CPU_INC)) -I$(MPI_INC) -DCPUCUDA $(3) $$(if $$(filter $$*,$(MPI_PROGRAMS)),-DMULTI_GPU) $$(call $(or $(6),head_sizes),$$*) \
	  -MMD -MP -MF $$@.d -MT $$@ $$< -o $$@.pp
	$(PYTHON) $(RT_DIR)/cudapp.py $$@.pp $$@.tmp && mv $$@.tmp $$@ && rm -f $$@.pp
$(1)/%.o: $(1)/%.ii
	$(CXX) $(2) $(4) -x c++-cpp-output -c $$< -o $$@
$(1)/rt/%.o: $(RT_DIR)/%.cpp $(RT_HDRS)
	@mkdir -p $$(@D)
	$(CXX) $$(if $$(filter runtime,$$*),$(or $(7),$(2)),$(2)) $(or $(5),$(CPU_INC)) -c $$< -o $$@
# (only nccl.cpp compiles differently with MPI: libcpucuda_mpi.a shares the other objects)
$(1)/rt-mpi/nccl.o: $(RT_DIR)/nccl.cpp $(RT_HDRS)
	@mkdir -p $$(@D)
	$(MPICXX) $(2) $(or $(5),$(CPU_INC)) -DCPUCUDA_WITH_MPI -c $$< -o $$@
$(1)/libcpucuda.a: $(patsubst $(RT_DIR)/%.cpp,$(1)/rt/%.o,$(RT_SRCS))
	ar rcs $$@ $$^
$(1)/libcpucuda_mpi.a: $(patsubst $(RT_DIR)/%.cpp,$(1)/rt/%.o,$(filter-out $(RT_DIR)/nccl.cpp,$(RT_SRCS))) $(1)/rt-mpi/nccl.o
	ar rcs $$@ $$^
$(1)/%: $(1)/%.o $(or $(8),$(1))/libcpucuda.a $(or $(8),$(1))/libcpucuda_mpi.a
	$$(if $$(filter $$*,$(MPI_PROGRAMS)),$(MPICXX),$(CXX)) $(2) $$< -o $$@ \
	  $$(if $$(filter $$*,$(MPI_PROGRAMS)),$(or $(8),$(1))/libcpucuda_mpi.a,$(or $(8),$(1))/libcpucuda.a) $(CPU_LIBS)
endef

# header dependencies of each preprocessed unit (written by -MMD)
-include $(wildcard build/cpu/*.ii.d build/cpu-asan/*.ii.d build/cpu-fp32/*.ii.d build/cpu-racecheck/*.ii.d build/cpu-pypi/*.ii.d)

$(eval $(call cpu_variant,build/cpu,$(CPU_CXXFLAGS)))
# Its runtime.cpp (the fibers, their switches and the launches: 40% of an ASan model test's
# time when instrumented) is compiled optimised and uninstrumented, told to annotate the
# fiber switches and poison the unused shared memory for the instrumented kernels
# (CPUCUDA_ASAN_PROGRAM); the runtime's other files (cuBLASLt, NCCL, PTX, streams) and every
# kernel stay instrumented. cpu_cuda/test/sanitizer/oob_kernel.cu checks both reports.
ASAN_RUNTIME_FLAGS := $(CPU_CXXFLAGS) -DCPUCUDA_ASAN_PROGRAM -DBOOST_USE_ASAN
$(eval $(call cpu_variant,build/cpu-asan,$(CPU_CXXFLAGS) $(ASAN_FLAGS),,,,asan_head_sizes,$(ASAN_RUNTIME_FLAGS)))
# build/cpu-fp32: every activation and weight in fp32 (PRECISION=FP32), for tight comparisons.
# (its runtime is the bf16 build's: ENABLE_FP32 concerns only the CUDA units)
$(eval $(call cpu_variant,build/cpu-fp32,$(CPU_CXXFLAGS),-DENABLE_FP32,,,,,build/cpu))
# build/cpu-racecheck: shared and global memory races reported (and, with
# CPUCUDA_INITCHECK=1, reads of never-written memory); see the runtime README.
$(eval $(call cpu_variant,build/cpu-racecheck,$(CPU_CXXFLAGS) $(RACE_FLAGS),$(RACE_FLAGS),$(RACE_INSTRUMENT)))
# build/cpu-pypi: the bf16 build against only the headers gathered from PyPI
# (CUDA_HEADERS_DIR), never the toolkit's; test/test_pypi_headers.sh builds it
# with the toolkit hidden. -O0 and attention for one head size: it proves the headers
# suffice, not speed nor the kernels.
pypi_head_sizes = -DATTENTION_HEAD_SIZES=64
$(eval $(call cpu_variant,build/cpu-pypi,$(filter-out -O2,$(CPU_CXXFLAGS)) -O0,,,-I$(RT_DIR)/include -I$(CUDA_HEADERS_DIR) -I.,pypi_head_sizes))

# --- host C++ programs (tokenizer, shard writer, data tools and their tests) ------
# Plain C++ (no CUDA): data/*.cpp, dev/*.cpp and test/host/*.cpp -> build/host/
vpath %.cpp data dev test/host
HOST_CXXFLAGS ?= -O2 -g1 -std=c++17 -Wall -Wno-sign-compare -pthread -I.
HOST_CXXFLAGS += $(WERROR_FLAGS)
build/host/%: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) -MMD -MP $< -o $@
build/host-asan/%: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) $(ASAN_FLAGS) -MMD -MP $< -o $@
-include $(wildcard build/host/*.d build/host-asan/*.d)

# --- GPU build (nvcc) ---------------------------------------------------------
# Links only what a driverless build machine has: cuBLASLt, NCCL, MPI (no -lnvidia-ml).
# NO_MULTI_GPU=1: a single-GPU build without MPI and NCCL.
# NCCL_HOME: an NCCL outside the system paths, e.g. the nvidia-nccl-cu13 wheel's
# site-packages/nvidia/nccl (which ships only libnccl.so.2).
ifeq ($(NO_MULTI_GPU),1)
  NVCC_FLAGS := -O3 -std=c++17 -I.
  NVCC_LIBS  := -lcublasLt
else ifneq ($(NCCL_HOME),)
  NVCC_FLAGS := -O3 -std=c++17 -I. -I$(MPI_INC) -I$(NCCL_HOME)/include -DMULTI_GPU
  NVCC_LIBS  := -lcublasLt -L$(NCCL_HOME)/lib -l:libnccl.so.2 -Xlinker -rpath=$(NCCL_HOME)/lib -L$(MPI_LIB) -lmpi
else
  NVCC_FLAGS := -O3 -std=c++17 -I. -I$(MPI_INC) -DMULTI_GPU
  NVCC_LIBS  := -lcublasLt -lnccl -L$(MPI_LIB) -lmpi
endif
GPU_SRCS   := $(TEST_CU) $(DEV_CU) train_gpt.cu train_llama3.cu
# Headers the GPU build takes from Debian packages (libxxhash-dev, nlohmann-json3-dev)
# that a bare GPU image lacks: `make gpu-deps` gathers them from this machine into an
# ignored folder that the device tool carries (carry=["build/gpu-deps"]); nvcc finds
# them there whenever the folder exists.
GPU_DEPS_DIR  ?= build/gpu-deps/include
GPU_DEPS_HDRS := xxhash.h xxh3.h nlohmann
NVCC_FLAGS    += $(if $(wildcard $(GPU_DEPS_DIR)),-isystem $(GPU_DEPS_DIR))
gpu-deps:
	rm -rf $(GPU_DEPS_DIR) && mkdir -p $(GPU_DEPS_DIR)
	cp -r $(addprefix /usr/include/,$(GPU_DEPS_HDRS)) $(GPU_DEPS_DIR)/
GPU_NAMES  := $(basename $(notdir $(GPU_SRCS)))

# Every build/gpu/ target X also depends on the headers it includes: nvcc writes them to
# X.d as it compiles (-MMD), and make reads them back, so a changed kernel header rebuilds
# the GPU programs that use it.
NVCC_DEPS = -MMD -MP -MF $@.d
-include $(shell find build/gpu -name '*.d' 2>/dev/null)
# build/gpu/sm_90/X: X built for GPU_ARCH, to run on a GPU (test/gpu_check.sh).
build/gpu/sm_$(GPU_ARCH)/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(call head_sizes,$*) $(NVCC_FLAGS) $(NVCC_DEPS) -arch=sm_$(GPU_ARCH) $< -o $@ $(NVCC_LIBS)
# build/gpu/check/X: X built for sm_90 (compile check, run by make test: the trainers, so
# that every kernel they run is compiled and assembled, attention at every head size in
# train_gpt's; train_llama3's at its published models' 64 and 128, since its attention is
# the same template (llmc/kernels/attention.cuh), whose other sizes train_gpt's build assembles).
# These builds are compiled, never run: their host code is left unoptimised (nvcc's -O3
# is the host compiler's; cicc and ptxas optimise device code either way, to the same SASS).
# ptxas -v's report is kept as X.ptxas for dev/sass_report.py --built.
NVCC_CHECK_FLAGS := $(filter-out -O3,$(NVCC_FLAGS))
check_head_sizes = $(if $(filter train_llama3,$(1)),$(call nvcc_head_sizes,64$(comma)128),$(call head_sizes,$(1)))
build/gpu/check/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(call check_head_sizes,$*) $(NVCC_CHECK_FLAGS) $(NVCC_DEPS) -gencode arch=compute_90,code=sm_90 -Xptxas -v \
	  $< -o $@ $(NVCC_LIBS) >$@.ptxas 2>&1; rc=$$?; grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack' $@.ptxas; \
	  [ $$rc = 0 ] || { rm -f $@; exit 1; }
# build/gpu/check80/X: X's device code assembled for sm_80 (the A100) as well, at the head
# sizes of the published models (GPT-2's 64; Llama 3's 64 and 128): every head size runs the
# same instructions, which build/gpu/check assembles at every size; no host compile (-cuda).
check80_head_sizes = $(call nvcc_head_sizes,$(if $(filter train_llama3,$(1)),64$(comma)128,64))
build/gpu/check80/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(call check80_head_sizes,$*) $(NVCC_CHECK_FLAGS) $(NVCC_DEPS) -gencode arch=compute_80,code=sm_80 -cuda $< -o $@
# build/gpu/check90/X: X's device code optimised and assembled for sm_90 (the kernel tests:
# each kernel at the shapes its test covers, on the architecture the project targets; sm_80
# is checked by the trainers' code above), with no host compile or link (-cuda: those of
# the full builds above, which link the same libraries).
# test_attention's kernels are those of llmc/kernels/attention.cuh, which build/gpu/check/train_gpt
# assembles at every head size: here at one.
check90_head_sizes = $(if $(filter test_attention,$(1)),-DATTENTION_HEAD_SIZES=64,$(call head_sizes,$(1)))
build/gpu/check90/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(call check90_head_sizes,$*) $(NVCC_CHECK_FLAGS) $(NVCC_DEPS) -gencode arch=compute_90,code=sm_90 -cuda $< -o $@
# NVCC_FRONT_END: a compile check of a program's own code, at a third of the cost:
# nvcc's host compile and its device front end down to PTX (compute_90), with the
# device optimiser and ptxas not run (-G -O0). For the programs whose kernels the
# full builds above already optimise and assemble for both architectures, at every head
# size: the front end compiles attention for one (the model tests' 16, else 64).
NVCC_FRONT_END := -O0 -G -gencode arch=compute_90,code=compute_90
front_head_sizes = $(or $(call head_sizes,$(1)),-DATTENTION_HEAD_SIZES=64)
# build/gpu/front/X: the other programs (tests of the runtime and the models,
# benchmarks), front end only, and stopped before the host compiler and the link (-cuda:
# X is the host code nvcc would hand g++): nvcc's C++ front end has checked host and
# device code, the PTX is checked; the g++ pass and the link, 40% of the time, are those
# of the full builds above.
build/gpu/front/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(call front_head_sizes,$*) $(NVCC_CHECK_FLAGS) $(NVCC_DEPS) $(NVCC_FRONT_END) -cuda $< -o $@

# build/gpu/single/train_gpt: the single-GPU trainer (no MPI, no NCCL), front end only.
build/gpu/single/%: %.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -I. $(call front_head_sizes,$*) $(NVCC_DEPS) $(NVCC_FRONT_END) $< -o $@ -lcublasLt

# ATTENTION_HEAD_SIZES=64 (or 64,128): the GPU trainer's attention only for those head
# sizes, in an eighth of the compile time per size left out (GPT-2's are all 64); with -B,
# since make does not see a changed variable.
ATTENTION_HS_FLAG := $(call nvcc_head_sizes,$(ATTENTION_HEAD_SIZES))
train_gpt: train_gpt.cu $(LLMC_HDRS)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAGS) $(ATTENTION_HS_FLAG) -arch=sm_$(GPU_ARCH) $< -o $@ $(NVCC_LIBS)
train_gpt_cpu: $(CPU_TRAINER)
	cp $< $@
train_llama3: train_llama3.cu $(LLMC_HDRS)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAGS) $(ATTENTION_HS_FLAG) -arch=sm_$(GPU_ARCH) $< -o $@ $(NVCC_LIBS)
train_llama3_cpu: $(CPU_LLAMA3)
	cp $< $@

gpu: $(addprefix build/gpu/sm_$(GPU_ARCH)/,$(GPU_NAMES))

# Per-kernel registers, spills, occupancy and instruction counts of the sm_90
# build of train_gpt.cu (needs cuobjdump and nvdisasm: dev/install_deps.sh).
sass-report:
	$(PYTHON) dev/sass_report.py --nvcc $(NVCC)

# --- tests ---------------------------------------------------------------------
# The sanitizer build of every test, plus the deliberately out-of-bounds kernel.
asan: $(ASAN_TESTS) $(HOST_ASAN) build/cpu-asan/oob_kernel build/cpu-asan/train_gpt build/cpu-asan/train_llama3

# The racecheck build of the kernel tests and the deliberately broken kernels
# of cpu_cuda/test/sanitizer (also in the normal build, for initcheck and the schedules).
SANITIZER_KERNELS := missing_sync_kernel unwritten_read_kernel warp_sync_kernel
racecheck: $(addprefix build/cpu-racecheck/,test_kernel_language test_cublaslt $(KERNEL_TESTS) \
             test_gpt2 test_training $(SANITIZER_KERNELS)) $(addprefix build/cpu/,$(SANITIZER_KERNELS))

test: check-cuda-headers $(CPU_FOR_TESTS) asan racecheck
	bash test/run_tests.sh

# The quick tier, for while editing (`make -j2 check`): builds only what it runs
# (the kernel tests, test_nccl and the trainers in bf16, test_gpt2 and test_llama3 in fp32) and runs
# run_tests.sh's check section.
CHECK_BINS := $(addprefix build/cpu/,$(KERNEL_TESTS) test_nccl train_gpt train_llama3) build/cpu-fp32/test_gpt2 \
              build/cpu-fp32/test_llama3
check: check-cuda-headers $(CHECK_BINS)
	TEST_SECTIONS=check bash test/run_tests.sh

test-asan: asan
	TEST_SECTIONS=asan bash test/run_tests.sh

# The lesson in numbers (README.md): one table per claim, a few minutes on 2 cores.
lesson: build/cpu-fp32/train_gpt build/cpu-fp32/lesson build/cpu/train_gpt
	$(PYTHON) dev/lesson.py

# One test program: `make test-one T=test_layernorm` builds and runs it. A CUDA
# test runs from build/$(BUILD) (cpu; or cpu-fp32, cpu-asan, cpu-racecheck),
# under `mpirun -np $(NP)` when NP is set (test_nccl; test_distributed also
# takes a results folder: ARGS=DIR); a host test from build/host; a script of
# test/trainer/ against build/$(BUILD)/train_gpt (test_llama3_*: train_llama3;
# test_hf: the builds it compares; test_finetune: build/cpu-fp32's); test_gpu_check, the dry run of test/gpu_check.sh. ARGS go to the
# program. TEST_FILTER=substring runs only the cases whose name contains it
# (TEST_CASE in test/test_util.h; docs/tests.md's "Running one test" lists who has them).
BUILD ?= cpu
HOST_TESTS    := $(basename $(notdir $(wildcard test/host/test_*.cpp)))
TRAINER_TESTS := $(basename $(notdir $(wildcard test/trainer/test_*)))
MPIRUN_ONE    := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np $(NP)
ifneq ($(filter $(T),$(TEST_NAMES)),)
  TEST_ONE_DEPS := build/$(BUILD)/$(T)
  TEST_ONE_CMD  := $(if $(NP),$(MPIRUN_ONE)) build/$(BUILD)/$(T) $(ARGS)
else ifneq ($(filter $(T),$(HOST_TESTS)),)
  TEST_ONE_DEPS := build/host/$(T)
  TEST_ONE_CMD  := SHARED_DATA=$${SHARED_DATA:-../shared/data} build/host/$(T) $(ARGS)
else ifeq ($(T),test_hf)
  TEST_ONE_DEPS := build/cpu-fp32/test_gpt2 build/cpu/test_gpt2 build/cpu/train_gpt
  TEST_ONE_CMD  := $(PYTHON) test/trainer/test_hf.py $(TEST_ONE_DEPS)
else ifeq ($(T),test_lesson)
  TEST_ONE_DEPS := build/cpu-fp32/train_gpt build/cpu/train_gpt build/cpu-fp32/lesson
  TEST_ONE_CMD  := $(PYTHON) test/trainer/test_lesson.py $(TEST_ONE_DEPS)
else ifeq ($(T),test_fuzz_loaders)
  TEST_ONE_DEPS := build/$(BUILD)/train_gpt build/$(BUILD)/train_llama3 build/host/write_llama3_random \
                   build/$(if $(findstring asan,$(BUILD)),host-asan,host)/prepro
  TEST_ONE_CMD  := $(PYTHON) test/trainer/test_fuzz_loaders.py build/$(BUILD)/train_gpt
else ifneq ($(filter test_llama3_cli test_llama3_ranks,$(T)),)
  TEST_ONE_DEPS := build/$(BUILD)/train_llama3
  TEST_ONE_CMD  := bash test/trainer/$(T).sh build/$(BUILD)/train_llama3
else ifeq ($(T),test_finetune)
  TEST_ONE_DEPS := build/cpu-fp32/train_llama3 build/cpu-fp32/llama3_logits build/host/prepro
  TEST_ONE_CMD  := bash test/trainer/test_finetune.sh build/cpu-fp32
else ifneq ($(filter $(T),$(TRAINER_TESTS)),)
  TEST_ONE_SCRIPT := $(wildcard test/trainer/$(T).*)
  TEST_ONE_DEPS := build/$(BUILD)/train_gpt
  TEST_ONE_CMD  := $(if $(filter %.py,$(TEST_ONE_SCRIPT)),$(PYTHON),bash) $(TEST_ONE_SCRIPT) build/$(BUILD)/train_gpt
else ifeq ($(T),test_gpu_check)
  TEST_ONE_CMD  := bash test/test_gpu_check.sh
endif
test-one: $(TEST_ONE_DEPS)
	$(if $(TEST_ONE_CMD),,$(error T=$(T) is not a test; one of: $(sort $(TEST_NAMES) $(HOST_TESTS) $(TRAINER_TESTS) test_gpu_check)))
	$(TEST_ONE_CMD)

# --- layout ---------------------------------------------------------------------
# Every C++/CUDA source laid out by clang-format 19.1.7 (pinned; dev/install_deps.sh
# installs it from PyPI) with .clang-format: `make format` rewrites them in place,
# `make format-check` (run by `make test`) lists those it would change, and without
# clang-format 19.1.7 says SKIP (dev/format_check.py).
CLANG_FORMAT ?= $(shell $(PYTHON) dev/format_check.py --find)
FORMAT_SRCS = $(sort $(wildcard *.cu *.cuh *.h *.cpp *.hpp) $(shell find llmc cpu_cuda test dev data -type f \
                \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \)))
format:
	@$(PYTHON) dev/format_check.py --clang-format "$(CLANG_FORMAT)" --fix $(FORMAT_SRCS)
format-check:
	@$(PYTHON) dev/format_check.py --clang-format "$(CLANG_FORMAT)" $(FORMAT_SRCS)

bench: build/cpu/bench_cpu_cuda
	./build/cpu/bench_cpu_cuda
	CPUCUDA_WORKERS=1 ./build/cpu/bench_cpu_cuda

# The CPU builds' d12 step next to PyTorch's, fp32 and bf16 autocast, at PyTorch's own defaults
# (docs/benchmarks.md); BENCH_TORCH_ARGS: descriptor, B, T, rounds, threads.
BENCH_TORCH_ARGS ?= d12 4 64 5 2
bench-torch: build/cpu/bench_train build/cpu-fp32/bench_train
	$(PYTHON) dev/bench_cpu_vs_torch.py $(BENCH_TORCH_ARGS)

# Tokens to the same val loss, AdamW against Muon, each at its best lr of a grid (docs/muon.md;
# about 25 minutes on 2 cores); BENCH_MUON_ARGS: dev/bench_muon_tokens.py's flags.
bench-muon: build/cpu-fp32/train_gpt build/host/prepro
	$(PYTHON) dev/bench_muon_tokens.py $(BENCH_MUON_ARGS)

# The best lr per tokens per step, AdamW and Muon (docs/lesson.md, claim 7; about 30 minutes on 2
# cores); LR_GRID_ARGS: dev/lr_scaling.py's flags.
lr-grid: build/cpu-fp32/train_gpt
	$(PYTHON) dev/lr_scaling.py $(LR_GRID_ARGS)

# The largest B per rank at T = 8192 for Llama 3.1 8B (8 ranks) and 70B (64 ranks) on 80 and
# 141 GiB, every ZeRO stage x recompute level: the trainer's own --memory-plan -b auto
# (docs/memory.md; a few minutes on 2 cores, nothing allocated).
memory-table: build/cpu/train_llama3
	$(PYTHON) dev/memory_table.py

clean:
	rm -rf build train_gpt train_gpt_cpu train_llama3 train_llama3_cpu
