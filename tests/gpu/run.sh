#!/usr/bin/env bash
# tests/gpu/run.sh: the checks that need a GPU, in one go (well under 8 minutes on
# one H100/H200). Run from anywhere on the GPU machine; on a first run skip the bench:
#
#   SKIP_BENCH=1 tests/gpu/run.sh   (logs and a summary under $OUT when set, else /tmp)
#
#   1. build: `make CUDA=1` (commands and unit tests) into $BUILD and $BIN (default
#      build/ and bin/). The Makefile finds cuDNN, cuBLAS and NCCL in $CUDA_HOME or in
#      the Python packages nvidia-cudnn-cu13, nvidia-cublas, nvidia-nccl-cu13 of
#      $PYTHON_GPU (default python3; PYTHONPATH counts) and sets rpaths to them; the
#      step checks that every library of libcifar-cuda.so resolves (ldd) and that the
#      log has no compiler or linker warning. The Debian libraries the build needs
#      (libpng, libturbojpeg, lmdb, cJSON, OpenBLAS) must be installed, or their .deb
#      files must sit in $CIFAR_DEBS (default: .debs in the repository; make them with
#      tests/gpu/fetch_debs.sh where apt works): they are unpacked under /tmp, not /.
#      Without a GPU (nvidia-smi lists none) the script stops here: exit 77;
#   2. test_ops_cuda: every CUDA op against the CPU op, the augmentation bit for
#      bit, the CUDA engine against the CPU engine (CUDA graph path included);
#      2b. test_comm_nccl: NCCL with a one-rank communicator (init, all-reduce mean,
#      broadcasts over 1 MiB, barrier, destroy), the only NCCL one GPU can run;
#   3. training: synthetic data -> cifar-prep -> cifar-train 3 epochs on the CPU and
#      on the GPU (fp32, deterministic), per-epoch train loss compared; the same GPU run
#      with CIFAR_CUDA_GRAPH=0 (eager) as a control, and with CIFAR_CUDA_DATA=stream:50
#      (both splits streamed through pinned buffers instead of resident on the GPU,
#      gathered one step ahead), whose curves must equal the resident run's; and the
#      GPU run with --precision bf16 (bfloat16 activations and convs, fp32 weights, BN
#      statistics and loss), whose train loss must stay within 5% + 0.02 of the fp32
#      GPU run's and its test accuracy within 5 points, epoch by epoch, and whose fp32
#      snapshot cifar-eval reads on the CPU;
#   4. resume: the GPU run's snapshot continued one epoch on the CPU and one on the
#      GPU (the layout conversion of the conv weights, end to end), and cifar-eval
#      of the snapshot on both devices (same hits);
#   5. `make bench-gpu` (skip with SKIP_BENCH=1). The PyTorch side needs
#      ../shared/bench/torch_anchor.py and ../shared/seed (they do not travel to a
#      lent device machine: copy both folders into an ignored folder of the repo
#      and set ANCHOR=that/bench/torch_anchor.py).
# Every stage runs under a timeout (seconds: T_BUILD 900, T_TEST 180, T_TRAIN 180 per
# run, T_EVAL 60, T_BENCH 420 for tf32 and bf16), so a hang costs one stage, not the
# machine's lease.
# Exit status: 0 when every check passed, 1 otherwise (the summary says which), 77 when
# the build passed and there is no GPU to run the rest on.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/cifar-gpu-check}
mkdir -p "$out"
work=$(mktemp -d /tmp/cifar-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME
PY=${PYTHON_GPU:-python3}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build}
BIN=$(mkdir -p "${BIN:-bin}" && cd "${BIN:-bin}" && pwd)
T_BUILD=${T_BUILD:-900} T_TEST=${T_TEST:-180} T_TRAIN=${T_TRAIN:-180} T_EVAL=${T_EVAL:-60} T_BENCH=${T_BENCH:-420}
summary="$out/summary.txt"
: >"$summary"
failed=0
say() { echo "$*" | tee -a "$summary"; }
pass() { say "PASS $*"; }
fail() { say "FAIL $*"; failed=1; }
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }
# stage SECONDS COMMAND...: the command under a timeout that says so when it fires.
stage() {
    local secs=$1 rc
    shift
    timeout -k 10 "$secs" "$@"
    rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then say "TIMEOUT after ${secs}s: $*"; fi
    return $rc
}

# ---------------------------------------------------------------- Debian libraries
# Present, or unpacked from .deb files under /tmp. The library folders are exported
# before the check: the linker finds libopenblas's own dependency (libgfortran) only
# through LD_LIBRARY_PATH or -rpath-link, and the commands need them at run time.
deps_ok() {
    printf '#include <png.h>\n#include <turbojpeg.h>\n#include <lmdb.h>\n#include <cjson/cJSON.h>\n#include <cblas.h>\nint main(void){return 0;}\n' >"$work/deps.c"
    gcc $1 "$work/deps.c" -o "$work/deps" $2 -lpng -lturbojpeg -llmdb -lcjson -lopenblas >"$work/deps.log" 2>&1
}
dep_inc=""
dep_lib=""
if ! deps_ok "" ""; then
    debs=${CIFAR_DEBS:-$repo/.debs}
    if ls "$debs"/*.deb >/dev/null 2>&1; then
        root=/tmp/cifar-deps
        mkdir -p "$root"
        for f in "$debs"/*.deb; do dpkg -x "$f" "$root" || fail "dpkg -x $f"; done
        multi=$root/usr/lib/$(gcc -print-multiarch)
        dep_inc="-I$root/usr/include -I$root/usr/include/$(gcc -print-multiarch)"
        for d in "$root"/usr/include/*/openblas*; do [ -d "$d" ] && dep_inc="$dep_inc -I$d"; done
        ld_dirs=$multi
        for d in "$multi"/openblas*; do [ -d "$d" ] && ld_dirs="$d:$ld_dirs"; done
        export LD_LIBRARY_PATH="$ld_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        dep_lib="-L${ld_dirs//:/ -L} -Wl,-rpath-link,$ld_dirs"
        if deps_ok "$dep_inc" "$dep_lib"; then
            say "build dependencies: unpacked from $debs into $root"
        else
            fail "build dependencies: still missing after unpacking $debs: $(grep -m1 -E 'error|cannot find' "$work/deps.log")"
        fi
    else
        fail "build dependencies (libpng, libturbojpeg, lmdb, cJSON, OpenBLAS) missing and no .deb files in $debs (tests/gpu/fetch_debs.sh makes them)"
    fi
fi
say "libraries: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# ---------------------------------------------------------------- 1. build
say "== 1. build (make CUDA=1) [$(elapsed)]"
build_make() {
    CFLAGS="$dep_inc" LDFLAGS="$dep_lib" stage "$1" make --no-print-directory -j"$JOBS" CUDA=1 \
        PYTHON_NV="$PY" BUILD="$BUILD" BIN="$BIN" "${@:2}"
}
if build_make "$T_BUILD" all test-bins >"$out/build.log" 2>&1; then
    grep '^build:' "$out/build.log" | tee -a "$summary"
    # Real diagnostics only (gcc/ld "x.c:1:2: warning:", nvcc "x.cu(1): warning #177-D:",
    # "nvcc warning :"), not make's echo of -Werror all-warnings.
    # make's own "Clock skew detected" / "modification time in the future" (a tree copied
    # from another machine's clock) are not the code's diagnostics either.
    grep -E -i '(^|[ :)])warning( #[0-9A-Za-z-]+)? ?:' "$out/build.log" |
        { grep -Ev '^make(\[[0-9]+\])?: ' || true; } >"$out/warnings.txt"
    warnings=$(wc -l <"$out/warnings.txt")
    if [ "$warnings" = 0 ]; then
        pass "make CUDA=1, no warnings"
    else
        fail "make CUDA=1: $warnings warning line(s), see build.log:"
        head -5 "$out/warnings.txt" | tee -a "$summary"
    fi
    ldd "$BIN/libcifar-cuda.so" >"$out/ldd.txt" 2>&1
    grep -E 'libcudnn|libcublas|libnccl|libcudart' "$out/ldd.txt" | sed 's/^[[:space:]]*/ldd: /; s/ (0x[0-9a-f]*)$//' | tee -a "$summary"
    if grep -q 'not found' "$out/ldd.txt"; then
        fail "libcifar-cuda.so: $(grep 'not found' "$out/ldd.txt" | tr -s ' \t\n' ' ')"
    else
        pass "libcifar-cuda.so: every library resolves (ldd)"
    fi
else
    fail "make CUDA=1 (see build.log)"
    tail -30 "$out/build.log"
    exit 1
fi
# Captured first: grep -q leaving early would kill nvidia-smi with SIGPIPE under pipefail.
smi=$(timeout 30 nvidia-smi -L 2>/dev/null || true)
if ! grep -q '^GPU' <<<"$smi"; then
    say "SKIP steps 2-5 (test_ops_cuda, test_comm_nccl, training, resume, bench) not run: no GPU (nvidia-smi lists none); the build step $([ $failed = 0 ] && echo passed || echo FAILED)"
    [ $failed = 0 ] && exit 77
    exit 1
fi
timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

# ---------------------------------------------------------------- 2. unit test
say "== 2. test_ops_cuda [$(elapsed)]"
# --gpu-only: a test that sees no usable GPU exits 77 (its SKIP line says why), a failure here.
stage "$T_TEST" "$BUILD/cuda/tests/test_ops_cuda" --gpu-only >"$out/test_ops_cuda.log" 2>&1
rc=$?
if [ $rc = 0 ]; then
    pass "test_ops_cuda"
else
    fail "test_ops_cuda exited $rc (see test_ops_cuda.log)"
    grep -E 'FAIL|SKIP' "$out/test_ops_cuda.log" | head -20 | tee -a "$summary"
fi

# ---------------------------------------------------------------- 2b. NCCL, one rank
# World size 1 never creates an NCCL communicator: this is the only NCCL a single GPU runs.
say "== 2b. test_comm_nccl (NCCL, one rank) [$(elapsed)]"
stage "$T_TEST" "$BUILD/cuda/tests/test_comm_nccl" >"$out/test_comm_nccl.log" 2>&1
rc=$?
if [ $rc = 0 ]; then
    pass "test_comm_nccl"
else
    fail "test_comm_nccl exited $rc (see test_comm_nccl.log)"
    grep -E 'FAIL|SKIP|NCCL|error' "$out/test_comm_nccl.log" | head -10 | tee -a "$summary"
fi

# ---------------------------------------------------------------- 3. training
say "== 3. training, CPU vs GPU [$(elapsed)]"
log=$out/train.log
: >"$log"
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }
stage "$T_EVAL" "$BIN/cifar-synth" "$work/data" --train 2048 --test 512 --seed 1 >>"$log" 2>&1 &&
    lmdb=$(stage "$T_EVAL" "$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" 2>>"$log" | tail -1)
if [ -z "${lmdb:-}" ] || [ ! -f "$lmdb" ]; then
    fail "synthetic data / cifar-prep (see train.log)"
else
    common=(--epochs 3 --batch-size 128 --seed 1 --save-every 1 --keep 0)
    gpu=(--device cuda --precision fp32 --deterministic)
    train() { stage "$T_TRAIN" "$BIN/cifar-train" --quiet "${common[@]}" "$@" "$lmdb" >>"$log" 2>&1; }
    # expect_line LOG REGEX WHAT: pass WHAT when a line of LOG matches REGEX, else fail.
    expect_line() {
        if grep -q "$2" "$1"; then
            pass "$3"
        else
            fail "$3: no line matching '$2' in $(basename "$1")"
        fi
    }
    # curves_close A B REL [ABS]: two series of 3 per-epoch values, B within REL of A
    # (relative) plus ABS (absolute, default 0).
    curves_close() {
        awk -v a="$1" -v b="$2" -v r="$3" -v f="${4:-0}" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
            if (n != 3 || m != 3) exit 1;
            for (i = 1; i <= 3; i++) { d = x[i] - y[i]; if (d < 0) d = -d; t = x[i] < 0 ? -x[i] : x[i];
                if (d > r * t + f) exit 1 } }'
    }
    train --device cpu --run-dir "$work/cpu" || fail "cifar-train --device cpu"
    train "${gpu[@]}" --run-dir "$work/gpu" || fail "cifar-train --device cuda"
    CIFAR_CUDA_GRAPH=0 train "${gpu[@]}" --run-dir "$work/eager" || fail "cifar-train --device cuda with CIFAR_CUDA_GRAPH=0"
    CIFAR_CUDA_BN_COOP=0 train "${gpu[@]}" --run-dir "$work/twokernel" ||
        fail "cifar-train --device cuda with CIFAR_CUDA_BN_COOP=0"
    cp "$work/cpu/metrics.jsonl" "$out/metrics_cpu.jsonl" 2>/dev/null
    cp "$work/gpu/metrics.jsonl" "$out/metrics_gpu.jsonl" 2>/dev/null
    cpu_loss=$(field train_loss <"$work/cpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
    gpu_loss=$(field train_loss <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
    say "train loss per epoch: cpu [$cpu_loss] gpu [$gpu_loss]"
    say "test acc per epoch:   cpu [$(field test_acc <"$work/cpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')] gpu [$(field test_acc <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')]"
    # fp32 on both: the curves may drift apart only by accumulated rounding.
    if curves_close "$cpu_loss" "$gpu_loss" 0.03 0.01; then
        pass "GPU train loss within 3% of the CPU's, epoch by epoch"
    else
        fail "GPU train loss curve differs from the CPU's"
    fi
    # same_curve DIR WHAT: the deterministic GPU run again, changed as WHAT says, whose
    # kernels do the same sums in the same order: its loss curve must be the GPU run's.
    same_curve() {
        local loss
        loss=$(field train_loss <"$1/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
        say "train loss per epoch: gpu $2 [$loss]"
        if curves_close "$gpu_loss" "$loss" 1e-4; then
            pass "GPU train loss $2 within 1e-4 of the GPU run's, epoch by epoch"
        else
            fail "GPU train loss $2 differs from the GPU run's"
        fi
    }
    same_curve "$work/eager" "without CUDA graphs (CIFAR_CUDA_GRAPH=0)"
    # bn_nhwc.h: the cooperative kernel keeps the two kernels' reduction order
    same_curve "$work/twokernel" "with two kernels per batch norm (CIFAR_CUDA_BN_COOP=0)"
    # The same run with both splits streamed from the dataset's map through pinned
    # batch slots (the loader handing 50 records over at a time: three pieces per
    # batch of 128 gathered on demand), CUDA graph included: the same batches, so the
    # resident run's curves. Not quiet: the engine's data line must say that both
    # splits streamed, and its last line that the batches were gathered one step
    # ahead (the epoch loops name batch i+1 before running batch i: 15 of 16 training
    # batches and 3 of 4 test batches per epoch; the first of each loop on demand).
    CIFAR_CUDA_DATA=stream:50 stage "$T_TRAIN" "$BIN/cifar-train" "${common[@]}" "${gpu[@]}" \
        --run-dir "$work/stream" "$lmdb" >"$out/train_stream.log" 2>&1 ||
        fail "cifar-train --device cuda with CIFAR_CUDA_DATA=stream:50 (see train_stream.log)"
    grep -h 'cuda engine: data:' "$out/train_stream.log" | head -1 | tee -a "$summary"
    expect_line "$out/train_stream.log" 'cuda engine: data: train [0-9.]* MiB streamed, test [0-9.]* MiB streamed' \
        "CIFAR_CUDA_DATA=stream:50: both splits streamed"
    # an H100/H200 has cooperative launch: the one-kernel batch norm must be the one used
    expect_line "$out/train_stream.log" 'batch norm: one cooperative kernel per training batch norm' \
        "one cooperative kernel per training batch norm (no fallback to two)"
    # "CUDA graph included" must be so: a failed capture falls back to eager steps,
    # whose curves match too, and the staged batches replayed through the graph's
    # fixed staging buffer would then go unchecked.
    if grep -q 'CUDA graph capture failed' "$out/train_stream.log"; then
        fail "CIFAR_CUDA_DATA=stream:50: $(grep -h 'CUDA graph capture failed' "$out/train_stream.log" | head -1)"
    elif grep -q 'cuda engine: CUDA graph of one step' "$out/train_stream.log"; then
        pass "CIFAR_CUDA_DATA=stream:50: the streamed steps were replayed through the CUDA graph"
    else
        fail "CIFAR_CUDA_DATA=stream:50: no 'CUDA graph of one step' line: the streamed run was never captured (train_stream.log)"
    fi
    ahead_line=$(grep -h 'cuda engine: streamed batches:' "$out/train_stream.log" | tail -1)
    say "${ahead_line:-no 'streamed batches' line in train_stream.log}"
    ahead=$(printf '%s\n' "$ahead_line" | sed -n 's/.*: \([0-9][0-9]*\) gathered ahead,.*/\1/p')
    late=$(printf '%s\n' "$ahead_line" | sed -n 's/.*, \([0-9][0-9]*\) still being gathered when run,.*/\1/p')
    demand=$(printf '%s\n' "$ahead_line" | sed -n 's/.*, \([0-9][0-9]*\) gathered on demand.*/\1/p')
    if [ -n "$ahead" ] && [ -n "$late" ] && [ -n "$demand" ] &&
        [ $((ahead + late)) -gt 0 ] && [ $((ahead + late)) -ge $((3 * demand)) ]; then
        pass "streamed batches gathered one step ahead: $((ahead + late)) prefetched ($late still being gathered when run), $demand on demand"
    else
        fail "streamed batches were not gathered ahead (want at least 3 prefetched per batch on demand): ${ahead_line:-no line}"
    fi
    cp "$work/stream/metrics.jsonl" "$out/metrics_stream.jsonl" 2>/dev/null
    for f in train_loss train_acc test_loss test_acc; do
        resident=$(field "$f" <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
        streamed=$(field "$f" <"$work/stream/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
        say "$f per epoch: gpu resident [$resident] streamed [$streamed]"
        if curves_close "$resident" "$streamed" 1e-4; then
            pass "GPU $f with the data streamed within 1e-4 of the resident run's, epoch by epoch"
        else
            fail "GPU $f with the data streamed (CIFAR_CUDA_DATA=stream:50) differs from the resident run's"
        fi
    done

    # bf16: another rounding (8 significant bits per activation), so not the fp32
    # curve to 1e-4, but within the tolerance docs/DESIGN.md states ("bf16").
    stage "$T_TRAIN" "$BIN/cifar-train" "${common[@]}" --device cuda --precision bf16 \
        --run-dir "$work/bf16" "$lmdb" >"$out/train_bf16.log" 2>&1 ||
        fail "cifar-train --device cuda --precision bf16 (see train_bf16.log)"
    grep -h 'cuda engine: device' "$out/train_bf16.log" | head -1 | tee -a "$summary"
    expect_line "$out/train_bf16.log" 'cuda engine: device .*bf16 activations, fp32 weights' \
        "--precision bf16: the engine runs bf16 activations with fp32 weights"
    cp "$work/bf16/metrics.jsonl" "$out/metrics_bf16.jsonl" 2>/dev/null
    # field, relative and absolute tolerance, what they mean
    for check in "train_loss 0.05 0.02 train loss within 5% + 0.02" \
        "test_acc 0 0.05 test accuracy within 5 points"; do
        read -r f rel abs what <<<"$check"
        a=$(field "$f" <"$work/gpu/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
        b=$(field "$f" <"$work/bf16/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
        say "$f per epoch: gpu fp32 [$a] gpu bf16 [$b]"
        if curves_close "$a" "$b" "$rel" "$abs"; then
            pass "bf16 $what of the fp32 GPU run's, epoch by epoch"
        else
            fail "bf16 $f not $what of the fp32 GPU run's"
        fi
    done
    bsnap=$(ls -1 "$work/bf16"/*.safetensors 2>/dev/null | sort | tail -1)
    be=$(stage "$T_EVAL" "$BIN/cifar-eval" --json --device cpu "$bsnap" 2>>"$log" | tr -d "\n")
    bacc=$(echo "$be" | sed -n 's/.*"accuracy":\([0-9.]*\).*/\1/p')
    blast=$(field test_acc <"$work/bf16/metrics.jsonl" 2>/dev/null | tail -1)
    say "cifar-eval --device cpu of the bf16 snapshot: accuracy ${bacc:-none} (bf16 run's last test_acc ${blast:-none})"
    if [ -n "$bacc" ] && [ -n "$blast" ] && awk -v a="$bacc" -v b="$blast" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05) }'; then
        pass "the bf16 run's fp32 snapshot evaluates on the CPU within 5 points of its own test accuracy"
    else
        fail "the bf16 run's snapshot on the CPU: accuracy ${bacc:-none} vs ${blast:-none}"
    fi

    # ------------------------------------------------------------ 4. resume
    say "== 4. resume and eval across devices [$(elapsed)]"
    cp -r "$work/gpu" "$work/gpu2"
    train --epochs 4 --device cpu --run-dir "$work/gpu" || fail "CPU resume of the GPU run"
    train --epochs 4 "${gpu[@]}" --run-dir "$work/gpu2" || fail "GPU resume of the GPU run"
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
    ec=$(stage "$T_EVAL" "$BIN/cifar-eval" --json --device cpu "$snap" 2>>"$log" | tr -d "\n")
    eg=$(stage "$T_EVAL" "$BIN/cifar-eval" --json --device cuda "$snap" 2>>"$log" | tr -d "\n")
    hc=$(echo "$ec" | sed -n 's/.*"correct":\([0-9]*\).*/\1/p')
    hg=$(echo "$eg" | sed -n 's/.*"correct":\([0-9]*\).*/\1/p')
    say "cifar-eval of $(basename "$snap"): cpu correct=$hc, cuda correct=$hg"
    # the rule's choice for the test split, with the free memory it weighed
    grep -h 'cuda engine: data:' "$log" | tail -1 | tee -a "$summary"
    if [ -n "$hc" ] && [ -n "$hg" ] && [ $(( hc > hg ? hc - hg : hg - hc )) -le 2 ]; then
        pass "cifar-eval agrees across devices (within 2 images of ties)"
    else
        fail "cifar-eval differs across devices"
    fi
fi

# ---------------------------------------------------------------- 5. bench
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    say "== 5. make bench-gpu [$(elapsed)]"
    if build_make "$T_BENCH" bench-gpu >"$out/bench_gpu.log" 2>&1; then
        grep -E '^(ours|pytorch|ratio)' "$out/bench_gpu.log" | tee -a "$summary"
        pass "make bench-gpu"
    else
        fail "make bench-gpu (see bench_gpu.log)"
    fi
fi

say "done in $(elapsed): $([ $failed = 0 ] && echo 'all checks passed' || echo 'some checks FAILED')"
exit $failed
