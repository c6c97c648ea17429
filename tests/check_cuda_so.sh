#!/bin/sh
# check_cuda_so.sh LIB: libcifar-cuda.so must import only from libc, the C/C++
# runtimes and the CUDA libraries (cudart, cuDNN, cuBLAS, NCCL): nothing from the
# executable that loads it (it gets the program's callbacks through
# cifar_cuda_init, shared/backend-cuda/cuda_host.h). Prints each offending symbol; exit 1.
set -eu
lib=${1:?usage: check_cuda_so.sh path/to/libcifar-cuda.so}
[ -f "$lib" ] || { echo "check_cuda_so: $lib: no such file" >&2; exit 1; }
syms=$(nm -D --undefined-only "$lib") || { echo "check_cuda_so: nm failed on $lib" >&2; exit 1; }
bad=$(printf '%s\n' "$syms" | awk '
  $1 == "w" { next }                       # weak references (gmon, TM clones)
  $1 != "U" { next }
  {
    name = $2; ver = ""
    if (index(name, "@")) { ver = substr(name, index(name, "@") + 1); sub(/^@/, "", ver); name = substr(name, 1, index(name, "@") - 1) }
    if (ver ~ /^(GLIBC|GLIBCXX|CXXABI|GCC)_/) next
    if (ver ~ /^lib(cudart|cudnn|cublas|cublasLt|nccl)/) next
    if (name ~ /^(cuda|__cuda|cudnn|cublas|nccl)/) next
    print name
  }')
count=$(printf '%s\n' "$syms" | grep -c ' U ' || true)
if [ -n "$bad" ]; then
  echo "check_cuda_so: FAIL: $lib imports symbols that are not libc, C++ runtime or CUDA:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
echo "check_cuda_so: $lib imports $count symbols, all from libc, the C/C++ runtime or CUDA libraries"
