# cifar toolchain: cifar-prep | cifar-train | cifar-eval (cifar-predict for single images)
#
#   make              build bin/ (with CUDA when nvcc, cuDNN, cuBLAS and NCCL are found: see CUDA detection)
#   make CUDA=0       CPU-only build
#   make MPI=0        without the MPI communicator (default: built when mpicc links a probe)
#   make GLOO=0       without the Gloo communicator (default: built when g++ links a probe with libgloo)
#   make DNNL=0       without oneDNN (the AVX-512 fp32 convs and --precision bf16 on the CPU; default: built when a probe links)
#   make deps         install the Debian packages the project needs (apt-get as root)
#   make test         every test: C unit tests, then the bats suites, then what was skipped and why
#   make pipeline     synthetic (or DATA=dir) dataset -> prep | train | eval
#   make plot RUN=dir training curves of a run: dir/metrics.jsonl -> dir/curves.png
#   make bench        speed figures side by side with PyTorch (CPU), bf16 accuracy against fp32
#   make fuzz         libFuzzer targets, each for FUZZ_SECONDS
#   make test-asan    the unit tests and bats suites built with ASan+UBSan (build/asan/)
#   make test-variants  the learning and tolerance tests under each CPU variant and other BLAS kernels
#   make test-valgrind  memcheck on a short prep, train and eval (slow; not in CI)

CUDA_HOME ?= /usr/local/cuda
CUDA ?= auto
CC ?= gcc
BIN ?= bin
BUILD ?= build
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
              -gencode=arch=compute_90,code=compute_90
OPT ?= -O2
PYTHON_TORCH ?= /usr/bin/python3
# a python with PyPI's torch 2.x for make bench's PyTorch 2.x anchors (eager, --channels-last,
# --amp bf16, --compile and all three); empty: skipped, each named in the output
PYTHON_TORCH2 ?=

# Debian packages, by the target that needs them (make pipeline: BUILD + PIPELINE;
# make install: BUILD + INSTALL; make test: all but BENCH; make deps: all). Open MPI and
# Gloo are in BUILD: the build probes them (the MPI communicator, libcifar-mpi.so; the
# Gloo communicator, libcifar-gloo.so, C++: g++); so is oneDNN (--precision bf16 on the CPU).
DEB_BUILD = gcc make libc6-dev libpng-dev libturbojpeg0-dev liblmdb-dev libcjson-dev libopenblas-dev \
            libopenmpi-dev openmpi-bin libprotobuf-c-dev g++ libgloo-dev libdnnl-dev
DEB_PIPELINE = gnuplot-nox
DEB_INSTALL = help2man man-db
DEB_TEST = bats bats-assert bats-support python3-numpy python3-pil python3-torch clang libclang-rt-14-dev lmdb-utils \
           python3-venv protobuf-c-compiler
DEB_BENCH = python3-matplotlib
DEB_ALL = $(DEB_BUILD) $(DEB_PIPELINE) $(DEB_INSTALL) $(DEB_TEST) $(DEB_BENCH)

# ---- CUDA detection ----
# cuDNN, cuBLAS and NCCL are each taken from the first folder (with include/ and lib64/,
# lib/ or lib/<multiarch>/) that has both the header and a versioned library: $(CUDNN_HOME),
# $(CUBLAS_HOME), $(NCCL_HOME) when set; $(CUDA_HOME); the folders of NVIDIA's pip packages
# on $(PYTHON_NV)'s sys.path, PYTHONPATH included (nvidia/cudnn of nvidia-cudnn-cu13,
# nvidia/cu13 of nvidia-cublas 13, nvidia/cublas of 12.x, nvidia/nccl of nvidia-nccl-cu13);
# /usr. They are linked by their versioned names (-l:libcudnn.so.9: pip ships no
# libcudnn.so) with an rpath to each folder, and only their own headers are symlinked into
# $(CUDA_INC): a pip include folder can also hold CUDA runtime headers of another version
# than nvcc's, so it is never put on the include path whole. A probe program then compiles
# and links against the three with $(LDFLAGS), the way libcifar-cuda.so is linked.
PYTHON_NV ?= python3
CUDA_INC = $(BUILD)/cuda-include
comma := ,
ifneq ($(CUDA),0)
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
NV_SITES := $(shell $(PYTHON_NV) -c 'import os, sys; print(" ".join(p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))))' 2>/dev/null)
# $(call cuda_soname,DIR,NAME): the shortest versioned file name of libNAME in DIR (libcudnn.so.9)
cuda_soname = $(firstword $(sort $(notdir $(wildcard $(1)/lib$(2).so.[0-9]*))))
cuda_libdirs = $(1)/lib64 $(1)/lib $(if $(MULTIARCH),$(1)/lib/$(MULTIARCH))
# $(call cuda_find,NAME,HEADER,PREFIXES): "libdir|includedir|soname" from the first prefix with both
cuda_find = $(firstword $(foreach p,$(3),$(if $(wildcard $(p)/include/$(2)),$(foreach d,$(call cuda_libdirs,$(p)),$(if $(call cuda_soname,$(d),$(1)),$(d)|$(p)/include|$(call cuda_soname,$(d),$(1)))))))
cuda_part = $(word $(2),$(subst |, ,$(1)))
cuda_uniq = $(if $(1),$(firstword $(1)) $(call cuda_uniq,$(filter-out $(firstword $(1)),$(1))))
CUDNN_FOUND := $(call cuda_find,cudnn,cudnn.h,$(CUDNN_HOME) $(CUDA_HOME) $(NV_SITES:%=%/nvidia/cudnn) /usr)
CUBLAS_FOUND := $(call cuda_find,cublas,cublas_v2.h,$(CUBLAS_HOME) $(CUDA_HOME) $(NV_SITES:%=%/nvidia/cu13) $(NV_SITES:%=%/nvidia/cublas) /usr)
NCCL_FOUND := $(call cuda_find,nccl,nccl.h,$(NCCL_HOME) $(CUDA_HOME) $(NV_SITES:%=%/nvidia/nccl) /usr)
CUDART_FOUND := $(call cuda_find,cudart,cuda_runtime.h,$(CUDA_HOME))
# nvrtc (optional): cuDNN 9's runtime-compiled engines dlopen libnvrtc.so.<major> (and
# nvrtc its libnvrtc-builtins) by soname, found only through the RUNPATH of cuDNN's own
# library ($$ORIGIN/../../cu13/lib in pip's tree), LD_LIBRARY_PATH or the loader's
# cache, never through $(CUDA_HOME)/lib64; without it those engines drop out silently
# and the algorithm lists shrink. So it is looked up like the others (NVRTC_HOME,
# CUDA_HOME, pip's nvidia/cu13 of nvidia-cuda-nvrtc 13 and nvidia/cuda_nvrtc of 12.x,
# /usr) and linked with --no-as-needed (with an rpath): loaded with libcifar-cuda.so,
# cuDNN's dlopen then finds it by soname among the loaded libraries.
NVRTC_FOUND := $(call cuda_find,nvrtc,nvrtc.h,$(NVRTC_HOME) $(CUDA_HOME) $(NV_SITES:%=%/nvidia/cu13) $(NV_SITES:%=%/nvidia/cuda_nvrtc) /usr)
NVRTC_BUILTINS := $(if $(NVRTC_FOUND),$(call cuda_soname,$(call cuda_part,$(NVRTC_FOUND),1),nvrtc-builtins))
NVRTC_SAY = $(if $(NVRTC_FOUND),$(NVRTC_SAY_FOUND),$(NVRTC_SAY_MISSING))
NVRTC_SAY_FOUND = $(call cuda_part,$(NVRTC_FOUND),3) $(NVRTC_BUILTINS) in $(call cuda_part,$(NVRTC_FOUND),1) [linked: cuDNN's runtime-compiled engines find it]
NVRTC_SAY_MISSING = not found [cuDNN's runtime-compiled engines unavailable: set NVRTC_HOME or pip install nvidia-cuda-nvrtc]
NVRTC_LIBS = $(if $(NVRTC_FOUND),-Wl$(comma)--push-state$(comma)--no-as-needed -l:$(call cuda_part,$(NVRTC_FOUND),3) \
             $(if $(NVRTC_BUILTINS),-l:$(NVRTC_BUILTINS)) -Wl$(comma)--pop-state)
CUDA_MISSING := $(if $(wildcard $(NVCC)),,nvcc) $(if $(CUDART_FOUND),,cudart) $(if $(CUDNN_FOUND),,cuDNN) \
                $(if $(CUBLAS_FOUND),,cuBLAS) $(if $(NCCL_FOUND),,NCCL)
CUDA_HEADERS := $(sort $(wildcard $(call cuda_part,$(CUDNN_FOUND),2)/cudnn*.h \
                $(call cuda_part,$(CUBLAS_FOUND),2)/cublas*.h $(call cuda_part,$(NCCL_FOUND),2)/nccl*))
CUDA_LIB_DIRS := $(call cuda_uniq,$(foreach f,$(CUDART_FOUND) $(CUDNN_FOUND) $(CUBLAS_FOUND) $(NCCL_FOUND) $(NVRTC_FOUND),$(call cuda_part,$(f),1)))
CUDA_LIBS = $(CUDA_LIB_DIRS:%=-L%) \
            $(addprefix -Wl$(comma)-rpath$(comma),$(filter-out /usr/lib /usr/lib64 /usr/lib/$(MULTIARCH),$(CUDA_LIB_DIRS))) \
            $(foreach f,$(CUDNN_FOUND) $(CUBLAS_FOUND) $(NCCL_FOUND) $(CUDART_FOUND),-l:$(call cuda_part,$(f),3)) \
            $(NVRTC_LIBS) -lstdc++
# The headers' links, redone only when the list changes (parallel makes may read them).
ifeq ($(strip $(CUDA_MISSING)),)
CUDA_INC_DONE := $(shell list='$(CUDA_HEADERS)'; [ "$$(cat $(CUDA_INC)/.sources 2>/dev/null)" = "$$list" ] || \
  { rm -rf $(CUDA_INC) && mkdir -p $(CUDA_INC) && ln -s $$list $(CUDA_INC)/ && echo "$$list" > $(CUDA_INC)/.sources; })
endif
endif

ifeq ($(CUDA),auto)
ifeq ($(strip $(CUDA_MISSING)),)
CUDA_PROBE := $(shell d=$$(mktemp -d /tmp/cifar-cuda-probe.XXXXXX) && \
  printf '\043include <cudnn.h>\n\043include <cublas_v2.h>\n\043include <nccl.h>\nint main(void){return (int)cudnnGetVersion()==0;}\n' > $$d/p.cu && \
  $(NVCC) -I$(CUDA_INC) -c $$d/p.cu -o $$d/p.o >/dev/null 2>&1 && \
  $(CC) $(LDFLAGS) -o $$d/p $$d/p.o $(CUDA_LIBS) >/dev/null 2>&1 && echo 1 || echo 0; rm -rf $$d)
CUDA_WHY := $(if $(filter 1,$(CUDA_PROBE)),,the probe program did not compile or link: make CUDA=1 shows why)
else
CUDA_PROBE := 0
CUDA_WHY := not found: $(strip $(CUDA_MISSING))
endif
override CUDA := $(CUDA_PROBE)
else ifeq ($(CUDA),1)
ifneq ($(strip $(CUDA_MISSING)),)
$(error CUDA=1: not found: $(strip $(CUDA_MISSING)) (looked in CUDA_HOME=$(CUDA_HOME), CUDNN_HOME/CUBLAS_HOME/NCCL_HOME, the nvidia/ folders of $(PYTHON_NV)'s sys.path [$(NV_SITES)], /usr))
endif
endif

# ---- MPI detection: compile and link a probe with mpicc (Open MPI's or MPICH's wrapper) ----
MPI ?= auto
MPICC ?= mpicc
ifeq ($(MPI),auto)
MPI_PROBE := $(shell printf '#include <mpi.h>\nint main(int c, char **v){MPI_Init(&c, &v); return MPI_Finalize();}\n' > /tmp/cifar-mpi-probe-$$$$.c && \
  $(MPICC) -o /tmp/cifar-mpi-probe-$$$$ /tmp/cifar-mpi-probe-$$$$.c >/dev/null 2>&1 && echo 1 || echo 0; \
  rm -f /tmp/cifar-mpi-probe-$$$$ /tmp/cifar-mpi-probe-$$$$.c)
override MPI := $(MPI_PROBE)
endif

# ---- Gloo detection: compile and link a C++ probe against libgloo's TCP transport ----
GLOO ?= auto
ifeq ($(GLOO),auto)
GLOO_PROBE := $(shell printf '#include <gloo/transport/tcp/device.h>\nint main(){gloo::transport::tcp::attr a("127.0.0.1"); return gloo::transport::tcp::CreateDevice(a) ? 0 : 1;}\n' > /tmp/cifar-gloo-probe-$$$$.cc && \
  $(CXX) -std=c++17 -o /tmp/cifar-gloo-probe-$$$$ /tmp/cifar-gloo-probe-$$$$.cc -lgloo >/dev/null 2>&1 && echo 1 || echo 0; \
  rm -f /tmp/cifar-gloo-probe-$$$$ /tmp/cifar-gloo-probe-$$$$.cc)
override GLOO := $(GLOO_PROBE)
endif

# ---- oneDNN detection (the AVX-512 fp32 convs, --precision bf16 on the CPU: shared/backend-cpu/conv_dnnl.c) ----
# Compile and link a probe against libdnnl (Debian's libdnnl-dev 2.x: the C API of
# dnnl.h with the convolution descriptors of 2.x); without it the build and every
# command still work (fp32 with the own convs) and --precision bf16 on the CPU says why
# it is unavailable.
DNNL ?= auto
ifeq ($(DNNL),auto)
DNNL_PROBE := $(shell printf '\043include <dnnl.h>\nint main(void){dnnl_convolution_desc_t d; (void)d; return dnnl_version()->major < 2;}\n' > /tmp/cifar-dnnl-probe-$$$$.c && \
  $(CC) -o /tmp/cifar-dnnl-probe-$$$$ /tmp/cifar-dnnl-probe-$$$$.c -ldnnl >/dev/null 2>&1 && echo 1 || echo 0; \
  rm -f /tmp/cifar-dnnl-probe-$$$$ /tmp/cifar-dnnl-probe-$$$$.c)
override DNNL := $(DNNL_PROBE)
endif

ifeq ($(CUDA),1)
MODE = cuda
else
MODE = cpu
endif
OBJ = $(BUILD)/$(MODE)

CFLAGS_BASE = $(OPT) -g -std=gnu11 -Wall -Wextra -fopenmp -Ishared -MMD -MP
CFLAGS += $(CFLAGS_BASE)
LDLIBS = -lpng -lturbojpeg -llmdb -lcjson -lopenblas -lprotobuf-c -lm -lpthread
LDFLAGS += -fopenmp
ifeq ($(DNNL),1)
# oneDNN's headers only: conv_dnnl.c dlopens libdnnl.so.2 when the AVX-512 variant is
# picked, so the commands run where libdnnl2 is absent (bf16 then says why)
CFLAGS += -DCIFAR_DNNL
# ... except in the ASan build (make test-asan sets DNNL_AT_START=1): LeakSanitizer's
# exit check cannot stop the world once oneDNN (its static TLS) was dlopened late
# ("Tracer caught signal 11"), so there the library is loaded at start and the dlopen
# finds it already there
ifeq ($(DNNL_AT_START),1)
LDLIBS += -Wl,--no-as-needed -ldnnl -Wl,--as-needed
endif
endif

# comm_mpi.c needs mpi.h: it goes into $(BIN)/libcifar-mpi.so (below), not libcifar.a.
MPI_C = shared/comm/comm_mpi.c
# comm_nccl_cuda.c needs nccl.h: it goes into $(BIN)/libcifar-cuda.so with the other GPU code.
NCCL_C = shared/comm/comm_nccl_cuda.c
# shared/backend-cuda/ holds everything in libcifar-cuda.so plus its loader
# (cuda_loader.c, which dlopens the library from the commands: in libcifar.a).
CUDA_LOADER_C = shared/backend-cuda/cuda_loader.c
SHARED_C = $(filter-out $(MPI_C) $(NCCL_C),$(wildcard shared/core/*.c shared/format/*.c shared/data/*.c \
             shared/model/*.c shared/backend-cpu/*.c shared/comm/*.c)) $(CUDA_LOADER_C)
# CUDA builds: everything that touches CUDA, cuDNN, cuBLAS or NCCL (shared/backend-cuda/, shared/comm/comm_nccl_cuda.c)
# goes into $(BIN)/libcifar-cuda.so, with its own copy of the device-neutral network
# executor (shared/model/net.c); shared/backend-cuda/cuda_loader.c dlopens it on demand: the
# commands link none of those libraries, start as fast as CPU builds and run where
# they are missing. The library imports nothing from the command: the command hands
# it a table of callbacks (shared/backend-cuda/cuda_host.h).
CUDA_SO =
CUDA_OBJS =
ifeq ($(CUDA),1)
CFLAGS += -DCIFAR_CUDA -I$(CUDA_INC) -I$(CUDA_HOME)/include
NVFLAGS = $(OPT) -std=c++17 $(CUDA_ARCHS) -Ishared -I$(CUDA_INC) -DCIFAR_CUDA -Xcompiler -Wall,-Wextra,-fopenmp,-fPIC \
          --expt-relaxed-constexpr -Werror all-warnings -MMD -MP
CUDA_OBJS = $(patsubst %.c,$(OBJ)/%.pic.o,$(filter-out $(CUDA_LOADER_C),$(wildcard shared/backend-cuda/*.c)) $(NCCL_C) shared/model/net.c) \
            $(patsubst %.cu,$(OBJ)/%.cu.o,$(wildcard shared/backend-cuda/*.cu))
CUDA_SO = $(BIN)/libcifar-cuda.so
LDLIBS += -ldl
endif

# MPI builds: the MPI communicator (comm_mpi.c, linked with libmpi by mpicc) is
# $(BIN)/libcifar-mpi.so, which shared/comm/mpi_loader.c dlopens when a CPU job
# runs under mpirun or srun --mpi=pmix: the commands link no MPI library and run
# where Open MPI is not installed (as with libcifar-cuda.so).
MPI_SO =
ifeq ($(MPI),1)
CFLAGS += -DCIFAR_MPI
MPI_SO = $(BIN)/libcifar-mpi.so
ifneq ($(CUDA),1)
LDLIBS += -ldl
endif
endif

# Gloo builds: the Gloo communicator (comm_gloo.cc, the project's only C++, linked
# with libgloo) is $(BIN)/libcifar-gloo.so, which shared/comm/gloo_loader.c dlopens
# for --comm gloo (the default of CPU ranks on several nodes and under torchrun):
# the commands link no C++ or Gloo library.
GLOO_C = shared/comm/comm_gloo.cc
GLOO_SO =
ifeq ($(GLOO),1)
CFLAGS += -DCIFAR_GLOO
GLOO_SO = $(BIN)/libcifar-gloo.so
ifeq ($(filter -ldl,$(LDLIBS)),)
LDLIBS += -ldl
endif
endif

LIB = $(OBJ)/libcifar.a
LIB_OBJS = $(SHARED_C:%.c=$(OBJ)/%.o)

# The CPU's float arithmetic that the CUDA kernels reproduce bit for bit (the
# augmentation, ema.h's moving average in the CPU engine, the tests' references of
# both) is never contracted into FMAs, whatever -march OPT carries: GCC contracts
# across statements by default in its GNU C modes (-ffp-contract=fast) wherever the
# target has an FMA, clang within an expression; the kernels round every operation
# (__fmul_rn, __fadd_rn: never merged into an FMA, CUDA Math API). Baseline x86-64
# has no FMA, so this changes nothing in the default build.
FP_EXACT_OBJS = $(OBJ)/shared/data/augment.o $(OBJ)/shared/backend-cpu/engine_cpu.o \
                $(OBJ)/tests/test_augment.o $(OBJ)/tests/test_ops_cuda.o
$(FP_EXACT_OBJS): CFLAGS += -ffp-contract=off

COMMANDS = cifar-prep cifar-train cifar-eval cifar-predict cifar-synth cifar-unpack
prep_SRC = $(wildcard prep/*.c)
train_SRC = $(wildcard train/*.c)
eval_SRC = $(wildcard eval/*.c)
predict_SRC = $(wildcard predict/*.c)
synth_SRC = pipelines/cifar-synth.c
unpack_SRC = pipelines/cifar-unpack.c

# test_comm_nccl needs the NCCL of a CUDA build and a GPU: built in CUDA builds
# only, run by make test-gpu (and tests/gpu/run.sh), not by test-unit.
TEST_SRC = $(filter-out tests/test_comm_nccl.c,$(wildcard tests/test_*.c))
TEST_BINS = $(TEST_SRC:tests/%.c=$(OBJ)/tests/%)
GPU_TEST_BINS =
FAULTINJECT = $(OBJ)/tests/libfaultinject.so

.PHONY: proto all build-info deps deps-check deps-pipeline deps-install install uninstall man test test-unit test-gpu test-bats test-build test-variants test-asan test-valgrind pipeline bench bench-accuracy bench-snapshots bench-gpu fuzz clean plot
all: build-info $(COMMANDS:%=$(BIN)/%)

build-info:
	@echo "build: $(MODE) (CUDA=$(CUDA), CUDA_HOME=$(CUDA_HOME)$(if $(CUDA_WHY),: $(CUDA_WHY)), MPI=$(MPI), GLOO=$(GLOO), DNNL=$(DNNL)) -> $(BIN)/"
ifeq ($(CUDA),1)
	@echo "build: $(foreach f,$(CUDNN_FOUND) $(CUBLAS_FOUND) $(NCCL_FOUND),$(call cuda_part,$(f),3) in $(call cuda_part,$(f),1);)"
	@echo "build: nvrtc $(NVRTC_SAY)"
endif

$(OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(OBJ)/%.pic.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(OBJ)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

ifeq ($(CUDA),1)
$(CUDA_SO): $(CUDA_OBJS)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -shared -Wl,-Bsymbolic -o $@ $^ $(CUDA_LIBS)

# The CUDA op and NCCL tests link the library itself (and hand it the callbacks).
GPU_TEST_BINS = $(OBJ)/tests/test_comm_nccl
$(OBJ)/tests/test_ops_cuda $(OBJ)/tests/test_comm_nccl: $(OBJ)/tests/%: $(OBJ)/tests/%.o $(LIB) $(CUDA_SO)
	$(CC) $(LDFLAGS) -o $@ $(OBJ)/tests/$*.o $(LIB) $(LDLIBS) \
	    -L$(BIN) -Wl,-rpath,$(abspath $(BIN)) -lcifar-cuda

# The CUDA loader's hand-over on the CPU (tests/test_loader_cuda.c): loader_cuda.cu
# compiled as host C++ and linked with the test's fake CUDA runtime; no GPU needed.
LOADER_HOST_O = $(OBJ)/tests/loader_cuda.host.o
$(LOADER_HOST_O): shared/backend-cuda/loader_cuda.cu shared/backend-cuda/loader_cuda.h shared/backend-cuda/cuda_check.h shared/data/dataset.h
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 $(OPT) -g -Wall -Wextra -Werror -Ishared -I$(CUDA_INC) -I$(CUDA_HOME)/include \
	    -DCIFAR_CUDA -c $< -o $@
$(OBJ)/tests/test_loader_cuda: $(OBJ)/tests/test_loader_cuda.o $(LOADER_HOST_O) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lstdc++
endif

ifeq ($(MPI),1)
$(OBJ)/mpi/%.pic.o: %.c
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -fPIC -c $< -o $@

$(MPI_SO): $(MPI_C:%.c=$(OBJ)/mpi/%.pic.o)
	@mkdir -p $(BIN)
	$(MPICC) -shared -Wl,-Bsymbolic -o $@ $^
endif

ifeq ($(GLOO),1)
$(OBJ)/gloo/%.pic.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(OPT) -g -std=c++17 -Wall -Wextra -Werror -fPIC -Ishared -MMD -MP -c $< -o $@

$(GLOO_SO): $(GLOO_C:%.cc=$(OBJ)/gloo/%.pic.o)
	@mkdir -p $(BIN)
	$(CXX) $(filter -fsanitize=%,$(LDFLAGS)) -shared -Wl,-Bsymbolic -Wl,--no-undefined -o $@ $^ -lgloo -lpthread
endif

# --version prints the tree's VERSION (below): version.o is rebuilt when it changes,
# and only then (the stamp is rewritten only when its text differs).
VERSION_STAMP = $(OBJ)/version-stamp
$(VERSION_STAMP): version-check
	@mkdir -p $(dir $@)
	@echo '$(VERSION)' | cmp -s - $@ || echo '$(VERSION)' > $@
.PHONY: version-check
version-check: ;
$(OBJ)/shared/core/version.o: $(VERSION_STAMP)
$(OBJ)/shared/core/version.o: CFLAGS += -DCIFAR_VERSION='"$(VERSION)"'

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# cifar-prep links only what it uses: no OpenBLAS (whose thread pool would start,
# and spin, in every prep) and no OpenMP runtime.
cifar-prep_LINK = $(LIB) -Wl,--as-needed $(LDLIBS)
define command_rule
$(BIN)/$(1): $(patsubst %.c,$(OBJ)/%.o,$(2)) $(LIB) $(CUDA_SO) $(MPI_SO) $(GLOO_SO)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $$@ $(patsubst %.c,$(OBJ)/%.o,$(2)) \
	    $(if $($(1)_LINK),$($(1)_LINK),$(LIB) $(LDLIBS))
endef
$(eval $(call command_rule,cifar-prep,$(prep_SRC)))
$(eval $(call command_rule,cifar-train,$(train_SRC)))
$(eval $(call command_rule,cifar-eval,$(eval_SRC)))
$(eval $(call command_rule,cifar-predict,$(predict_SRC)))
$(eval $(call command_rule,cifar-synth,$(synth_SRC)))
$(eval $(call command_rule,cifar-unpack,$(unpack_SRC)))

# The test build of cifar-train, never installed: the shipped one's objects with
# train/test_hooks_none.o swapped for tests/train_hooks.o (the CIFAR_TEST_* fault
# injection, train/test_hooks.h), in $(TEST_BIN) beside links to everything else in
# $(BIN) (the other commands, and the libraries the commands look for next to
# themselves). The bats tests that set a CIFAR_TEST_ variable run it (use_test_build in
# tests/helpers.bash), and so do the benchmarks that stop a run after a given step.
TEST_BIN = $(OBJ)/test-bin
TRAIN_HOOKED_OBJS = $(filter-out $(OBJ)/train/test_hooks_none.o,$(train_SRC:%.c=$(OBJ)/%.o)) \
    $(OBJ)/tests/train_hooks.o
$(TEST_BIN)/cifar-train: $(TRAIN_HOOKED_OBJS) $(LIB) $(CUDA_SO) $(MPI_SO) $(GLOO_SO)
	@mkdir -p $(TEST_BIN)
	$(CC) $(LDFLAGS) -o $@ $(TRAIN_HOOKED_OBJS) $(LIB) $(LDLIBS)
test-build: all $(TEST_BIN)/cifar-train
	@for f in $(abspath $(BIN))/*; do [ "$${f##*/}" = cifar-train ] || ln -sfn "$$f" $(TEST_BIN)/; done

$(OBJ)/tests/%: $(OBJ)/tests/%.o $(LIB)
	$(CC) $(LDFLAGS) $(TEST_LDFLAGS) -o $@ $^ $(LDLIBS)

# ---- dependencies ----
# $(call apt_ensure,PACKAGES): install the missing ones (as root), or say how and fail.
apt_ensure = missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "deps: missing$$missing; run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

deps:
	@$(call apt_ensure,$(DEB_ALL)); echo "deps: all Debian packages present"
	@$(MAKE) --no-print-directory $(TB_STAMP)

# PyPI's tensorboard (and what it needs), pinned in $(TB_REQUIREMENTS), in a venv of Debian's python3 (python3-venv), for the
# tests that read cifar-train's event files back with TensorBoard's own reader
# (tests/tensorboard.bats); made by make deps and make test. Not under $(BUILD)
# (make test-asan builds elsewhere and reads the same venv); make clean removes it.
TB_VENV ?= build/tb-venv
TB_REQUIREMENTS = tests/tensorboard-requirements.txt
TB_PYTHON = $(TB_VENV)/bin/python
TB_STAMP = $(TB_VENV)/.installed
$(TB_STAMP): $(TB_REQUIREMENTS)
	/usr/bin/python3 -m venv --clear $(TB_VENV)
	$(TB_PYTHON) -m pip install --quiet --disable-pip-version-check -r $(TB_REQUIREMENTS)
	$(TB_PYTHON) -c 'from tensorboard.backend.event_processing import event_accumulator'
	touch $@

# Called by test (and test-asan), pipeline and install: each installs only what it uses.
deps-check:
	@$(call apt_ensure,$(DEB_BUILD) $(DEB_PIPELINE) $(DEB_INSTALL) $(DEB_TEST))
	@$(MAKE) --no-print-directory $(TB_STAMP)
deps-pipeline:
	@$(call apt_ensure,$(DEB_BUILD) $(DEB_PIPELINE))
deps-install:
	@$(call apt_ensure,$(DEB_BUILD) $(DEB_INSTALL))

# ---- tests ----
# Both end with the list of skipped tests and why (tests/skip_summary.sh).
test: deps-check
	@$(MAKE) --no-print-directory all test-bins
	@tests/skip_summary.sh $(BUILD)/test.log $(MAKE) --no-print-directory test-unit test-bats

test-bins: $(TEST_BINS) $(GPU_TEST_BINS) test-build

test-unit: $(TEST_BINS) $(CUDA_SO) $(MPI_SO) $(GLOO_SO)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; CIFAR_MPI_LIB=$(abspath $(MPI_SO)) CIFAR_GLOO_LIB=$(abspath $(GLOO_SO)) $$t; done
ifeq ($(CUDA),1)
	@echo "== tests/check_cuda_so.sh"; tests/check_cuda_so.sh $(CUDA_SO)
endif

# The GPU op cases and the GPU engine against the CPU (tests/test_ops_cuda.c), then
# NCCL with one rank (tests/test_comm_nccl.c); exits
# 77 with one line saying why when no GPU is usable (or in a CPU-only build).
test-gpu: $(TEST_BINS) $(GPU_TEST_BINS) $(CUDA_SO)
ifeq ($(CUDA),1)
	@$(OBJ)/tests/test_ops_cuda --gpu-only && $(OBJ)/tests/test_comm_nccl
else
	@echo "test-gpu: SKIP: CPU-only build (CUDA=$(CUDA)): no GPU code to test"; exit 77
endif

BATS_FILES ?= tests/*.bats
test-bats: all test-build $(FAULTINJECT) $(OBJ)/tests/test_comm $(TB_STAMP)
	BIN=$(abspath $(BIN)) TEST_BIN=$(abspath $(TEST_BIN)) PYTHON_TORCH=$(PYTHON_TORCH) FAULTINJECT=$(abspath $(FAULTINJECT)) \
	  TB_PYTHON=$(abspath $(TB_PYTHON)) \
	  TEST_COMM=$(abspath $(OBJ)/tests/test_comm) bats $(BATS_FILES)

# The learning, accuracy and tolerance tests again under every CPU variant of the ops
# (CIFAR_CPU_ISA) and other OpenBLAS kernels (OPENBLAS_CORETYPE): tests/variants.sh.
test-variants: all $(TEST_BINS)
	BIN=$(abspath $(BIN)) UNIT_DIR=$(abspath $(OBJ)/tests) PYTHON_TORCH=$(PYTHON_TORCH) tests/variants.sh

# The LD_PRELOAD shim of tests/hardening.bats (failing or SIGKILLing writes); never sanitized.
$(FAULTINJECT): tests/faultinject.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -Wall -Wextra -fPIC -shared -o $@ $< -ldl

# Everything again with AddressSanitizer + UndefinedBehaviorSanitizer in build/asan/: any
# error, UB or leak fails the test that hit it. CIFAR_ASAN=1 lets the bats suites skip what
# cannot run sanitized (ulimit -v: ASan reserves terabytes of address space).
ASAN_OPT = -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_ENV = CIFAR_ASAN=1 OMPI_MCA_mca_base_component_disable_dlclose=1 \
  ASAN_OPTIONS=detect_leaks=1:verify_asan_link_order=0:detect_stack_use_after_return=0:abort_on_error=0:exitcode=86 \
  LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(abspath tests/ubsan.supp)
ASAN_MAKE = $(MAKE) --no-print-directory CUDA=0 BUILD=build/asan BIN=build/asan/bin OPT="$(ASAN_OPT)" \
  LDFLAGS="-fopenmp -fsanitize=address,undefined" DNNL_AT_START=1
ASAN_BATS = tests/*.bats
test-asan: deps-check
	@$(ASAN_MAKE) all test-bins
	@$(ASAN_ENV) tests/skip_summary.sh build/asan/test.log $(ASAN_MAKE) test-unit test-bats BATS_FILES="$(ASAN_BATS)"

test-valgrind: all
	BIN=$(abspath $(BIN)) tests/valgrind.sh

# ---- pipeline, bench, fuzz ----
pipeline: deps-pipeline
	@$(MAKE) --no-print-directory all
	BIN=$(abspath $(BIN)) pipelines/demo.sh

plot:
	@test -n "$(RUN)" || { echo "make plot RUN=dir: give the run folder (cifar-train --run-dir)" >&2; exit 2; }
	pipelines/plot.sh $(RUN)

bench: all test-build $(OBJ)/bench/bench_train $(OBJ)/bench/prep_floor $(OBJ)/tests/test_comm
	BIN=$(abspath $(BIN)) TEST_BIN=$(abspath $(TEST_BIN)) BENCH_TRAIN=$(abspath $(OBJ)/bench/bench_train) BENCH_COMM=$(abspath $(OBJ)/tests/test_comm) PREP_FLOOR=$(abspath $(OBJ)/bench/prep_floor) PYTHON_TORCH=$(PYTHON_TORCH) PYTHON_TORCH2=$(PYTHON_TORCH2) tests/bench/bench.sh

# Test accuracy after the same epochs, --precision bf16 against fp32 on the CPU (ACC_* settings)
bench-accuracy: all
	BIN=$(abspath $(BIN)) tests/bench/bench_accuracy.sh

# Background snapshots alone: throughput with --save-interval 5s against off, work lost per SIGKILL
bench-snapshots: all test-build
	BIN=$(abspath $(BIN)) TEST_BIN=$(abspath $(TEST_BIN)) tests/bench/bench_snapshots.sh

# GPU images/s against PyTorch eager and --compile (the GPU machine's python3 with torch 2.x)
bench-gpu: all
	BIN=$(abspath $(BIN)) tests/bench/bench_gpu.sh

FUZZ_SECONDS ?= 30
fuzz:
	tests/fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BIN) $(TB_VENV)

# The protobuf-c code of TensorBoard's event (shared/format/tb_event.proto), kept in
# the repository so that building needs libprotobuf-c only; tests/tensorboard.bats
# checks that it is what protoc-c makes of the .proto.
proto:
	cd shared/format && protoc-c --c_out=. tb_event.proto

# ---- install, uninstall ----
# make install [PREFIX=/usr/local] [DESTDIR=staging]:
#   PREFIX/bin/             the commands
#   PREFIX/lib/cifar/       libcifar-cuda.so (CUDA builds), found by the commands
#                           relative to their own path (bin/../lib/cifar/)
#   PREFIX/share/cifar/     the pipeline scripts (they find the commands in ../../bin or on PATH)
#   PREFIX/share/man/man1/  one page per command, made by help2man from its --help
# make uninstall removes exactly these files (and the two cifar/ folders).
PREFIX ?= /usr/local
VERSION ?= $(shell git describe --tags --always 2>/dev/null || echo unversioned)
INSTALL_BIN = $(DESTDIR)$(PREFIX)/bin
INSTALL_LIB = $(DESTDIR)$(PREFIX)/lib/cifar
INSTALL_SHARE = $(DESTDIR)$(PREFIX)/share/cifar
INSTALL_MAN = $(DESTDIR)$(PREFIX)/share/man/man1
PIPELINE_SCRIPTS = demo.sh cifar10.sh multi-gpu.sh resume.sh mpi.sh plot.sh slurm.sbatch
PIPELINE_DATA = cifar-bin.sh curves.gp
MAN_PAGES = $(COMMANDS:%=$(BUILD)/man/%.1)
cifar-prep_WHAT = convert a PNG/JPEG dataset into one LMDB file
cifar-train_WHAT = train the seed's ResNet on a cifar-prep LMDB, on CPUs or GPUs
cifar-eval_WHAT = evaluate a cifar-train snapshot on a test split
cifar-predict_WHAT = classify PNG/JPEG images with a cifar-train snapshot
cifar-synth_WHAT = make a synthetic dataset in the seed's layout
cifar-unpack_WHAT = convert the CIFAR-10 binary distribution into the seed's layout

man: $(MAN_PAGES)

# help2man reads the page from --help (a SYNOPSIS from its first "usage:" line), so
# a page never says other than the command. The shim capitalises "usage:" for it.
$(BUILD)/man/%.1: $(BIN)/%
	@mkdir -p $(BUILD)/man/shim
	@printf '#!/bin/sh\nout=$$("%s" "$$@") || exit 1\nprintf "%%s\\n" "$$out" | sed "s/^usage:/Usage:/"\n' \
	    "$(abspath $<)" > $(BUILD)/man/shim/$*
	@chmod +x $(BUILD)/man/shim/$*
	help2man --no-info --version-string="$(VERSION)" --name="$($*_WHAT)" \
	    --output=$@.tmp $(BUILD)/man/shim/$* && mv $@.tmp $@

# make print-VAR: a variable's value (tests/install.bats asks for CUDA_SO)
print-%:
	@echo '$($*)'

install: deps-install all
	@$(MAKE) --no-print-directory man
	install -d $(INSTALL_BIN) $(INSTALL_SHARE) $(INSTALL_MAN)
	install -m 755 $(COMMANDS:%=$(BIN)/%) $(INSTALL_BIN)/
	install -m 644 $(MAN_PAGES) $(INSTALL_MAN)/
	install -m 755 $(PIPELINE_SCRIPTS:%=pipelines/%) $(INSTALL_SHARE)/
	install -m 644 $(PIPELINE_DATA:%=pipelines/%) $(INSTALL_SHARE)/
	$(if $(CUDA_SO)$(MPI_SO)$(GLOO_SO),install -d $(INSTALL_LIB) && install -m 755 $(CUDA_SO) $(MPI_SO) $(GLOO_SO) $(INSTALL_LIB)/)
	@echo "installed under $(DESTDIR)$(PREFIX) (man cifar-train; pipelines in $(PREFIX)/share/cifar/)"

uninstall:
	rm -f $(COMMANDS:%=$(INSTALL_BIN)/%) $(COMMANDS:%=$(INSTALL_MAN)/%.1) \
	    $(PIPELINE_SCRIPTS:%=$(INSTALL_SHARE)/%) $(PIPELINE_DATA:%=$(INSTALL_SHARE)/%) \
	    $(INSTALL_LIB)/libcifar-cuda.so $(INSTALL_LIB)/libcifar-mpi.so $(INSTALL_LIB)/libcifar-gloo.so
	@for d in $(INSTALL_SHARE) $(INSTALL_LIB); do \
	  if [ -d $$d ]; then rmdir --ignore-fail-on-non-empty $$d || exit 1; fi; \
	done

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- benchmark programs (not tests) ----
$(OBJ)/bench/bench_train: tests/bench/bench_train.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
# cifar-prep's floor: read + inflate the IDAT of every PNG (zlib only)
$(OBJ)/bench/prep_floor: tests/bench/prep_floor.c
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -Wall -Wextra -o $@ $< -lz -lpthread
