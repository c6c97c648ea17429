# cifar toolchain: cifar-prep | cifar-train | cifar-eval
#
#   make              build bin/ (with CUDA when $(CUDA_HOME) has nvcc, cuDNN, cuBLAS, NCCL)
#   make CUDA=0       CPU-only build
#   make MPI=0        without the MPI communicator (default: built when mpicc links a probe)
#   make deps         install the Debian packages the project needs (apt-get as root)
#   make test         every test: C unit tests, then the bats suites
#   make pipeline     synthetic (or DATA=dir) dataset -> prep | train | eval
#   make plot RUN=dir training curves of a run: dir/metrics.jsonl -> dir/curves.png
#   make bench        speed figures side by side with PyTorch (CPU)
#   make fuzz         libFuzzer targets, each for FUZZ_SECONDS
#   make test-asan    the unit tests and bats suites built with ASan+UBSan (build/asan/)
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

# Debian packages: to build, to test, and for the side-by-side benchmark.
DEB_BUILD = gcc make libc6-dev libpng-dev libturbojpeg0-dev liblmdb-dev libcjson-dev libopenblas-dev \
            libopenmpi-dev openmpi-bin
DEB_TEST = bats bats-assert bats-support python3-numpy python3-torch clang libclang-rt-14-dev gnuplot-nox
DEB_BENCH = python3-matplotlib
DEB_ALL = $(DEB_BUILD) $(DEB_TEST) $(DEB_BENCH)

# ---- CUDA detection: compile and link a probe against cuDNN, cuBLAS and NCCL ----
ifeq ($(CUDA),auto)
CUDA_PROBE := $(shell printf '#include <cudnn.h>\n#include <cublas_v2.h>\n#include <nccl.h>\nint main(void){return (int)cudnnGetVersion()==0;}\n' > /tmp/cifar-cuda-probe-$$$$.cu && \
  $(NVCC) -o /tmp/cifar-cuda-probe-$$$$ /tmp/cifar-cuda-probe-$$$$.cu -L$(CUDA_HOME)/lib64 -lcudnn -lcublas -lnccl >/dev/null 2>&1 && echo 1 || echo 0; \
  rm -f /tmp/cifar-cuda-probe-$$$$ /tmp/cifar-cuda-probe-$$$$.cu)
override CUDA := $(CUDA_PROBE)
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

ifeq ($(CUDA),1)
MODE = cuda
else
MODE = cpu
endif
OBJ = $(BUILD)/$(MODE)

CFLAGS_BASE = $(OPT) -g -std=gnu11 -Wall -Wextra -fopenmp -Ishared -MMD -MP
CFLAGS += $(CFLAGS_BASE)
LDLIBS = -lpng -lturbojpeg -llmdb -lcjson -lopenblas -lm -lpthread
LDFLAGS += -fopenmp

# comm_mpi.c needs mpi.h: it goes into $(BIN)/libcifar-mpi.so (below), not libcifar.a.
MPI_C = shared/dist/comm_mpi.c
SHARED_C = $(filter-out $(MPI_C),$(wildcard shared/util/*.c shared/io/*.c shared/data/*.c shared/nn/*.c shared/dist/*.c))
# CUDA builds: everything that touches CUDA, cuDNN, cuBLAS or NCCL (shared/cuda/)
# goes into $(BIN)/libcifar-cuda.so, which shared/nn/cuda_loader.c
# dlopens on demand: the commands link none of those libraries, start as fast as
# CPU builds and run where they are missing. The library calls back into the
# command (check_fail, comm_*), hence -rdynamic and the whole libcifar.a.
CUDA_SO =
CUDA_OBJS =
ifeq ($(CUDA),1)
CFLAGS += -DCIFAR_CUDA -I$(CUDA_HOME)/include
NVFLAGS = $(OPT) -std=c++17 $(CUDA_ARCHS) -Ishared -DCIFAR_CUDA -Xcompiler -Wall,-Wextra,-fopenmp,-fPIC \
          --expt-relaxed-constexpr -Werror all-warnings
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudnn -lcublas -lnccl -lcudart -lstdc++
CUDA_OBJS = $(patsubst %.c,$(OBJ)/%.pic.o,$(wildcard shared/cuda/*.c)) $(patsubst %.cu,$(OBJ)/%.cu.o,$(wildcard shared/cuda/*.cu))
CUDA_SO = $(BIN)/libcifar-cuda.so
LDLIBS += -ldl
endif
EXE_LDFLAGS = -rdynamic

# MPI builds: the MPI communicator (comm_mpi.c, linked with libmpi by mpicc) is
# $(BIN)/libcifar-mpi.so, which shared/dist/mpi_loader.c dlopens when a CPU job
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

LIB = $(OBJ)/libcifar.a
LIB_OBJS = $(SHARED_C:%.c=$(OBJ)/%.o)

COMMANDS = cifar-prep cifar-train cifar-eval cifar-synth cifar-unpack
prep_SRC = $(wildcard prep/*.c)
train_SRC = $(wildcard train/*.c)
eval_SRC = $(wildcard eval/*.c)
synth_SRC = pipelines/cifar-synth.c
unpack_SRC = pipelines/cifar-unpack.c

TEST_SRC = $(wildcard tests/test_*.c)
TEST_BINS = $(TEST_SRC:tests/%.c=$(OBJ)/tests/%)
FAULTINJECT = $(OBJ)/tests/libfaultinject.so

.PHONY: all build-info deps deps-check test test-unit test-bats test-asan test-valgrind pipeline bench bench-gpu fuzz clean plot
all: build-info $(COMMANDS:%=$(BIN)/%)

build-info:
	@echo "build: $(MODE) (CUDA=$(CUDA), CUDA_HOME=$(CUDA_HOME), MPI=$(MPI)) -> $(BIN)/"

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
	$(CC) -shared -Wl,-Bsymbolic -o $@ $^ $(CUDA_LIBS)

# The CUDA op tests link the GPU code directly.
$(OBJ)/tests/test_ops_cuda: $(OBJ)/tests/test_ops_cuda.o $(CUDA_OBJS) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
endif

ifeq ($(MPI),1)
$(OBJ)/mpi/%.pic.o: %.c
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -fPIC -c $< -o $@

$(MPI_SO): $(MPI_C:%.c=$(OBJ)/mpi/%.pic.o)
	@mkdir -p $(BIN)
	$(MPICC) -shared -Wl,-Bsymbolic -o $@ $^
endif

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

define command_rule
$(BIN)/$(1): $(patsubst %.c,$(OBJ)/%.o,$(2)) $(LIB) $(CUDA_SO) $(MPI_SO)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) $(EXE_LDFLAGS) -o $$@ $(patsubst %.c,$(OBJ)/%.o,$(2)) \
	    -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive $(LDLIBS)
endef
$(eval $(call command_rule,cifar-prep,$(prep_SRC)))
$(eval $(call command_rule,cifar-train,$(train_SRC)))
$(eval $(call command_rule,cifar-eval,$(eval_SRC)))
$(eval $(call command_rule,cifar-synth,$(synth_SRC)))
$(eval $(call command_rule,cifar-unpack,$(unpack_SRC)))

$(OBJ)/tests/%: $(OBJ)/tests/%.o $(LIB)
	$(CC) $(LDFLAGS) $(TEST_LDFLAGS) -o $@ $^ $(LDLIBS)

# ---- dependencies ----
deps:
	@missing=""; for p in $(DEB_ALL); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	else \
	  echo "deps: missing$$missing; run: sudo apt-get install -y$$missing"; exit 1; \
	fi

# Called by test and pipeline: installs only when something is missing.
deps-check:
	@for p in $(DEB_BUILD) $(DEB_TEST); do dpkg -s $$p >/dev/null 2>&1 || { $(MAKE) --no-print-directory deps; exit $$?; }; done

# ---- tests ----
test: deps-check
	@$(MAKE) --no-print-directory all test-bins
	@$(MAKE) --no-print-directory test-unit test-bats

test-bins: $(TEST_BINS)

test-unit: $(TEST_BINS) $(MPI_SO)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; CIFAR_MPI_LIB=$(abspath $(MPI_SO)) $$t; done

# test_comm loads libcifar-mpi.so, which calls back into it (die, xmalloc).
$(OBJ)/tests/test_comm: TEST_LDFLAGS = $(EXE_LDFLAGS)

BATS_FILES ?= tests/*.bats
test-bats: all $(FAULTINJECT) $(OBJ)/tests/test_comm
	BIN=$(abspath $(BIN)) PYTHON_TORCH=$(PYTHON_TORCH) FAULTINJECT=$(abspath $(FAULTINJECT)) \
	  TEST_COMM=$(abspath $(OBJ)/tests/test_comm) bats $(BATS_FILES)

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
  LDFLAGS="-fopenmp -fsanitize=address,undefined"
ASAN_BATS = tests/*.bats
test-asan: deps-check
	@$(ASAN_MAKE) all test-bins
	@$(ASAN_ENV) $(ASAN_MAKE) test-unit test-bats BATS_FILES="$(ASAN_BATS)"

test-valgrind: all
	BIN=$(abspath $(BIN)) tests/valgrind.sh

# ---- pipeline, bench, fuzz ----
pipeline: deps-check
	@$(MAKE) --no-print-directory all
	BIN=$(abspath $(BIN)) pipelines/demo.sh

plot:
	@test -n "$(RUN)" || { echo "make plot RUN=dir: give the run folder (cifar-train --run-dir)" >&2; exit 2; }
	pipelines/plot.sh $(RUN)

bench: all $(OBJ)/bench/bench_train $(OBJ)/tests/test_comm
	BIN=$(abspath $(BIN)) BENCH_TRAIN=$(abspath $(OBJ)/bench/bench_train) BENCH_COMM=$(abspath $(OBJ)/tests/test_comm) PYTHON_TORCH=$(PYTHON_TORCH) tests/bench/bench.sh

# GPU images/s against PyTorch eager and --compile (the GPU machine's python3 with torch 2.x)
bench-gpu: all
	BIN=$(abspath $(BIN)) tests/bench/bench_gpu.sh

FUZZ_SECONDS ?= 30
fuzz:
	tests/fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BIN)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- benchmark programs (not tests) ----
$(OBJ)/bench/bench_train: tests/bench/bench_train.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
