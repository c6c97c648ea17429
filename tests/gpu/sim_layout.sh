#!/usr/bin/env bash
# tests/gpu/sim_layout.sh: run a command on a simulated copy of the lent GPU machine's
# library layout, built from $CUDA_HOME's own files (no download), changing nothing on
# this machine:
#   - $CUDA_HOME keeps nvcc and the CUDA runtime but has no cuDNN, cuBLAS, NCCL or
#     nvrtc (headers and libraries hidden);
#   - those live in a Python package tree DIR/site-packages/nvidia/ laid out as pip's
#     nvidia-cudnn-cu13 (nvidia/cudnn), nvidia-cublas 13 and nvidia-cuda-nvrtc 13
#     (both nvidia/cu13) and nvidia-nccl-cu13 (nvidia/nccl) install them: {lib,include},
#     versioned sonames only
#     (libcudnn.so.9, no libcudnn.so), found through PYTHONPATH. nvidia/cu13/include also
#     holds a cuda_runtime.h that fails to compile, as a stand-in for runtime headers of
#     another CUDA version: adding the whole folder to the include path breaks the build.
#
#   tests/gpu/sim_layout.sh DIR COMMAND [ARG...]
#
# Hiding: in a private mount namespace (`unshare -m`, needs CAP_SYS_ADMIN), $CUDA_HOME's
# include/ and lib/ are covered by folders of symlinks to everything else. Where unshare
# is refused, CUDA_HOME for the command is DIR/cuda, a symlink tree without the three;
# nvcc (linked there) still searches its real include folder, and the dynamic loader's
# cache still knows $CUDA_HOME/lib, so the build and `ldd` must be checked to take the
# pip tree's files (tests/gpu/run.sh's caller does). The first line on stderr says which.
set -euo pipefail

hidden_name() { # the files of cuDNN, cuBLAS, NCCL and nvrtc
    case $1 in
        cudnn* | cublas* | nccl* | nvrtc* | libcudnn* | libcublas* | libnccl* | libnvrtc*) return 0 ;;
        *) return 1 ;;
    esac
}

# filtered_copy SRC DST TARGET: DST gets a symlink TARGET/<name> for every entry of SRC
# that is not cuDNN's, cuBLAS's, NCCL's or nvrtc's.
filtered_copy() {
    local src=$1 dst=$2 target=$3 f name
    rm -rf "$dst"
    mkdir -p "$dst"
    for f in "$src"/*; do
        name=${f##*/}
        hidden_name "$name" || ln -s "$target/$name" "$dst/$name"
    done
}

# pip_tree SITE ORIG: the nvidia/ package folders, their files linked from ORIG/{lib,include}.
pip_tree() {
    local site=$1 orig=$2 pkg pattern f
    rm -rf "$site"
    for pkg in cudnn:cudnn cu13:cublas cu13:nvrtc nccl:nccl; do
        pattern=${pkg#*:}
        pkg=${pkg%%:*}
        mkdir -p "$site/nvidia/$pkg/lib" "$site/nvidia/$pkg/include"
        for f in "$real/lib/lib$pattern"*.so.[0-9]*; do
            ln -s "$orig/lib/${f##*/}" "$site/nvidia/$pkg/lib/${f##*/}"
        done
        for f in "$real/include/$pattern"*; do
            ln -s "$orig/include/${f##*/}" "$site/nvidia/$pkg/include/${f##*/}"
        done
    done
    local h
    for h in cuda_runtime.h cuda_runtime_api.h driver_types.h; do
        printf '#error "%s of nvidia/cu13/include was used: that folder must not be on the include path"\n' \
            "$h" >"$site/nvidia/cu13/include/$h"
    done
}

# Inside the private mount namespace: cover include/ and lib/, then run the command.
if [ "${1:-}" = --inside ]; then
    sim=$2 real=$3
    shift 3
    for d in include lib; do
        mount --bind "$real/$d" "$sim/orig/$d"
        mount --bind "$sim/filtered/$d" "$real/$d"
    done
    exec env PYTHONPATH="$sim/site-packages${PYTHONPATH:+:$PYTHONPATH}" "$@"
fi

if [ $# -lt 2 ]; then
    echo "usage: tests/gpu/sim_layout.sh DIR COMMAND [ARG...]" >&2
    exit 2
fi
sim=$(mkdir -p "$1" && cd "$1" && pwd)
shift
cuda_home=${CUDA_HOME:-/usr/local/cuda}
real=$(readlink -f "$cuda_home")
[ -x "$real/bin/nvcc" ] || { echo "sim_layout: no nvcc in $cuda_home" >&2; exit 1; }
[ -e "$real/include/cudnn.h" ] || { echo "sim_layout: $cuda_home/include has no cudnn.h to move into the pip tree" >&2; exit 1; }
for d in include lib; do
    [ -d "$real/$d" ] && [ ! -L "$real/$d" ] || { echo "sim_layout: $real/$d is not a folder" >&2; exit 1; }
done

if unshare -m --propagation private true 2>/dev/null; then
    echo "sim_layout: private mount namespace: $cuda_home without cuDNN/cuBLAS/NCCL, pip tree in $sim/site-packages" >&2
    mkdir -p "$sim/orig/include" "$sim/orig/lib"
    filtered_copy "$real/include" "$sim/filtered/include" "$sim/orig/include"
    filtered_copy "$real/lib" "$sim/filtered/lib" "$sim/orig/lib"
    pip_tree "$sim/site-packages" "$sim/orig"
    exec unshare -m --propagation private "$0" --inside "$sim" "$real" "$@"
fi

echo "sim_layout: unshare -m refused: CUDA_HOME=$sim/cuda (symlink tree without cuDNN/cuBLAS/NCCL), pip tree in $sim/site-packages" >&2
rm -rf "$sim/cuda"
mkdir -p "$sim/cuda"
for f in "$real"/*; do
    case ${f##*/} in include | lib | lib64) ;; *) ln -s "$f" "$sim/cuda/${f##*/}" ;; esac
done
filtered_copy "$real/include" "$sim/cuda/include" "$real/include"
filtered_copy "$real/lib" "$sim/cuda/lib" "$real/lib"
ln -s lib "$sim/cuda/lib64"
pip_tree "$sim/site-packages" "$real"
exec env CUDA_HOME="$sim/cuda" PYTHONPATH="$sim/site-packages${PYTHONPATH:+:$PYTHONPATH}" "$@"
