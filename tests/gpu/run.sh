#!/usr/bin/env bash
# tests/gpu/run.sh: the checks that need a GPU, in one go (well under 8 minutes on
# one H100/H200). Run from anywhere on the GPU machine:
#
#   tests/gpu/run.sh            (logs and a summary under $OUT when set, else /tmp)
#
#   1. build: `make CUDA=1` (commands and unit tests). cuDNN, cuBLAS and NCCL are
#      taken from $CUDA_HOME when it has them, else from the Python packages
#      nvidia-cudnn-cu13, nvidia-cublas, nvidia-nccl-cu13 (headers for the build,
#      lib/ folders for LD_LIBRARY_PATH). The Debian libraries the build needs
#      (libpng, libturbojpeg, lmdb, cJSON, OpenBLAS) must be installed, or their
#      .deb files must sit in $CIFAR_DEBS (default: .debs in the repository; make
#      them here with tests/gpu/fetch_debs.sh): they are unpacked under /tmp, not /;
#   2. test_ops_cuda: every CUDA op against the CPU op, the augmentation bit for
#      bit, the CUDA engine against the CPU engine (CUDA graph path included);
#   3. training: synthetic data -> cifar-prep -> cifar-train 3 epochs on the CPU and
#      on the GPU (fp32, deterministic), per-epoch train loss compared;
#   4. resume: the GPU run's snapshot continued one epoch on the CPU and one on the
#      GPU (the layout conversion of the conv weights, end to end), and cifar-eval
#      of the snapshot on both devices (same hits);
#   5. `make bench-gpu` (skip with SKIP_BENCH=1). The PyTorch side needs
#      ../shared/bench/torch_anchor.py and ../shared/seed (they do not travel to a
#      lent device machine: copy both folders into an ignored folder of the repo
#      and set ANCHOR=that/bench/torch_anchor.py).
# Exit status: 0 when every check passed, 1 otherwise (the summary says which).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/cifar-gpu-check}
mkdir -p "$out"
work=$(mktemp -d /tmp/cifar-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PYTHON_GPU:-python3}
JOBS=${JOBS:-$(nproc)}
summary="$out/summary.txt"
: >"$summary"
failed=0
say() { echo "$*" | tee -a "$summary"; }
pass() { say "PASS $*"; }
fail() { say "FAIL $*"; failed=1; }
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }

# ---------------------------------------------------------------- libraries
inc_flags=""
lib_flags=""
ld_dirs=""
mkdir -p "$work/lib"

# Folders of the pip packages that hold NVIDIA libraries (nvidia.cudnn, ...).
nvidia_dirs=$("$PY" - <<'EOF' 2>/dev/null
import importlib, os
seen = []
for name in ("nvidia.cudnn", "nvidia.cublas", "nvidia.nccl", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    for p in list(getattr(m, "__path__", [])) + ([os.path.dirname(m.__file__)] if getattr(m, "__file__", None) else []):
        if os.path.isdir(p) and p not in seen:
            seen.append(p)
print("\n".join(seen))
EOF
)

# find_lib NAME: $CUDA_HOME's lib$NAME.so, or one from the pip folders (linked as
# lib$NAME.so under $work/lib so that -l$NAME finds it).
find_lib() {
    local name=$1 f
    if [ -e "$CUDA_HOME/lib64/lib$name.so" ]; then ld_dirs="$ld_dirs:$CUDA_HOME/lib64"; return 0; fi
    for d in $nvidia_dirs; do
        f=$(find "$d" -name "lib$name.so*" -type f 2>/dev/null | sort | head -1)
        [ -n "$f" ] || f=$(find "$d" -name "lib$name.so*" 2>/dev/null | sort | head -1)
        if [ -n "$f" ]; then
            ln -sf "$f" "$work/lib/lib$name.so"
            ld_dirs="$ld_dirs:$(dirname "$f")"
            return 0
        fi
    done
    return 1
}

find_header() {
    local h=$1 f
    [ -e "$CUDA_HOME/include/$h" ] && return 0
    for d in $nvidia_dirs; do
        f=$(find "$d" -name "$h" -path '*include*' 2>/dev/null | head -1)
        if [ -n "$f" ]; then inc_flags="$inc_flags -I$(dirname "$f")"; return 0; fi
    done
    return 1
}

for h in cudnn.h cublas_v2.h nccl.h cuda_runtime.h; do
    find_header "$h" || fail "header $h: not in $CUDA_HOME/include nor in the nvidia Python packages"
done
for l in cudnn cublas cublasLt nccl cudart; do
    find_lib "$l" || fail "library lib$l.so: not in $CUDA_HOME/lib64 nor in the nvidia Python packages"
done
lib_flags="-L$work/lib"

# The Debian build dependencies: present, or unpacked from .deb files under /tmp.
deps_ok() {
    printf '#include <png.h>\n#include <turbojpeg.h>\n#include <lmdb.h>\n#include <cjson/cJSON.h>\n#include <cblas.h>\nint main(void){return 0;}\n' >"$work/deps.c"
    gcc $1 "$work/deps.c" -o "$work/deps" $2 -lpng -lturbojpeg -llmdb -lcjson -lopenblas >/dev/null 2>&1
}
dep_inc=""
dep_lib=""
if ! deps_ok "" ""; then
    debs=${CIFAR_DEBS:-$repo/.debs}
    if ls "$debs"/*.deb >/dev/null 2>&1; then
        root=/tmp/cifar-deps
        mkdir -p "$root"
        for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
        multi=$root/usr/lib/x86_64-linux-gnu
        dep_inc="-I$root/usr/include -I$root/usr/include/x86_64-linux-gnu"
        for d in "$root"/usr/include/x86_64-linux-gnu/openblas*; do [ -d "$d" ] && dep_inc="$dep_inc -I$d"; done
        dep_lib="-L$multi"
        for d in "$multi"/openblas*; do [ -d "$d" ] && dep_lib="$dep_lib -L$d" && ld_dirs="$ld_dirs:$d"; done
        ld_dirs="$ld_dirs:$multi"
        deps_ok "$dep_inc" "$dep_lib" || fail "build dependencies: still missing after unpacking $debs"
    else
        fail "build dependencies (libpng, libturbojpeg, lmdb, cJSON, OpenBLAS) missing and no .deb files in $debs (tests/gpu/fetch_debs.sh makes them)"
    fi
fi
export LD_LIBRARY_PATH="${ld_dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "libraries: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

# ---------------------------------------------------------------- 1. build
say "== 1. build (make CUDA=1) [$(elapsed)]"
if CFLAGS="$inc_flags $dep_inc" LDFLAGS="$lib_flags $dep_lib" \
   make -j"$JOBS" CUDA=1 NVCC="$CUDA_HOME/bin/nvcc $inc_flags" all test-bins >"$out/build.log" 2>&1; then
    warnings=$(grep -c -i 'warning' "$out/build.log")
    if [ "$warnings" = 0 ]; then pass "make CUDA=1, no warnings"; else fail "make CUDA=1: $warnings warning line(s), see build.log"; fi
else
    fail "make CUDA=1 (see build.log)"
    tail -30 "$out/build.log"
    exit 1
fi
BIN=$repo/bin

# ---------------------------------------------------------------- 2. unit test
say "== 2. test_ops_cuda [$(elapsed)]"
if timeout 180 build/cuda/tests/test_ops_cuda >"$out/test_ops_cuda.log" 2>&1; then
    if grep -q "no GPU, skipped" "$out/test_ops_cuda.log"; then fail "test_ops_cuda skipped: no GPU seen"; else pass "test_ops_cuda"; fi
else
    fail "test_ops_cuda (see test_ops_cuda.log)"
    grep FAIL "$out/test_ops_cuda.log" | head -20 | tee -a "$summary"
fi

# ---------------------------------------------------------------- 3. training
say "== 3. training, CPU vs GPU [$(elapsed)]"
log=$out/train.log
: >"$log"
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }
"$BIN/cifar-synth" "$work/data" --train 2048 --test 512 --seed 1 >>"$log" 2>&1 &&
    lmdb=$("$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" 2>>"$log" | tail -1)
if [ -z "${lmdb:-}" ] || [ ! -f "$lmdb" ]; then
    fail "synthetic data / cifar-prep (see train.log)"
else
    common=(--quiet --epochs 3 --batch-size 128 --seed 1 --save-every 1 --keep 0)
    "$BIN/cifar-train" "${common[@]}" --device cpu --run-dir "$work/cpu" "$lmdb" >>"$log" 2>&1 || fail "cifar-train --device cpu"
    "$BIN/cifar-train" "${common[@]}" --device cuda --precision fp32 --deterministic --run-dir "$work/gpu" "$lmdb" >>"$log" 2>&1 || fail "cifar-train --device cuda"
    cp "$work/cpu/metrics.jsonl" "$out/metrics_cpu.jsonl" 2>/dev/null
    cp "$work/gpu/metrics.jsonl" "$out/metrics_gpu.jsonl" 2>/dev/null
    cpu_loss=$(field train_loss <"$work/cpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
    gpu_loss=$(field train_loss <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
    say "train loss per epoch: cpu [$cpu_loss] gpu [$gpu_loss]"
    say "test acc per epoch:   cpu [$(field test_acc <"$work/cpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')] gpu [$(field test_acc <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')]"
    # fp32 on both: the curves may drift apart only by accumulated rounding.
    if awk -v a="$cpu_loss" -v b="$gpu_loss" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
            if (n != 3 || m != 3) exit 1;
            for (i = 1; i <= 3; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 0.03 * x[i] + 0.01) exit 1 } }'; then
        pass "GPU train loss within 3% of the CPU's, epoch by epoch"
    else
        fail "GPU train loss curve differs from the CPU's"
    fi

    # ------------------------------------------------------------ 4. resume
    say "== 4. resume and eval across devices [$(elapsed)]"
    cp -r "$work/gpu" "$work/gpu2"
    "$BIN/cifar-train" "${common[@]}" --epochs 4 --device cpu --run-dir "$work/gpu" "$lmdb" >>"$log" 2>&1 || fail "CPU resume of the GPU run"
    "$BIN/cifar-train" "${common[@]}" --epochs 4 --device cuda --precision fp32 --deterministic --run-dir "$work/gpu2" "$lmdb" >>"$log" 2>&1 || fail "GPU resume of the GPU run"
    l4c=$(field train_loss <"$work/gpu/metrics.jsonl" | sed -n 4p)
    l4g=$(field train_loss <"$work/gpu2/metrics.jsonl" | sed -n 4p)
    l3=$(field train_loss <"$work/gpu/metrics.jsonl" | sed -n 3p)
    say "epoch 4 after the GPU's epoch 3 (loss $l3): on the CPU $l4c, on the GPU $l4g"
    if awk -v a="$l4c" -v b="$l4g" -v c="$l3" 'BEGIN { if (a == "" || b == "") exit 1; d = a - b; if (d < 0) d = -d;
            exit !(d <= 0.03 * b + 0.01 && a < 1.5 * c) }'; then
        pass "CPU resume of a GPU snapshot continues the curve"
    else
        fail "CPU resume of a GPU snapshot (conv weight layout?)"
    fi
    snap=$(ls -1 "$work/gpu2"/*.safetensors 2>/dev/null | sort | tail -1)
    ec=$("$BIN/cifar-eval" --json --device cpu "$snap" 2>>"$log" | tr -d "\n")
    eg=$("$BIN/cifar-eval" --json --device cuda "$snap" 2>>"$log" | tr -d "\n")
    hc=$(echo "$ec" | sed -n 's/.*"correct":\([0-9]*\).*/\1/p')
    hg=$(echo "$eg" | sed -n 's/.*"correct":\([0-9]*\).*/\1/p')
    say "cifar-eval of $(basename "$snap"): cpu correct=$hc, cuda correct=$hg"
    if [ -n "$hc" ] && [ -n "$hg" ] && [ $(( hc > hg ? hc - hg : hg - hc )) -le 2 ]; then
        pass "cifar-eval agrees across devices (within 2 images of ties)"
    else
        fail "cifar-eval differs across devices"
    fi
fi

# ---------------------------------------------------------------- 5. bench
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    say "== 5. make bench-gpu [$(elapsed)]"
    if CFLAGS="$inc_flags $dep_inc" LDFLAGS="$lib_flags $dep_lib" \
       timeout 240 make --no-print-directory CUDA=1 NVCC="$CUDA_HOME/bin/nvcc $inc_flags" bench-gpu >"$out/bench_gpu.log" 2>&1; then
        grep -E '^(ours|pytorch|ratio)' "$out/bench_gpu.log" | tee -a "$summary"
        pass "make bench-gpu"
    else
        fail "make bench-gpu (see bench_gpu.log)"
    fi
fi

say "done in $(elapsed): $([ $failed = 0 ] && echo 'all checks passed' || echo 'some checks FAILED')"
exit $failed
