#!/usr/bin/env bash
# make bench-gpu: training images/s of the seed model on one GPU, cifar-train
# against PyTorch (tests/bench/torch_anchor.py, eager and --compile), at batch
# 256 and 1024, tf32 on both sides (PyTorch's default lets cuDNN use TF32), then
# bf16 on both sides (cifar-train --precision bf16 against torch_anchor.py --amp bf16,
# autocast: bf16 convs, fp32 weights; PyTorch's BN runs in fp32 under autocast).
#
# cifar-train's figure is the images/s of its second epoch (the first one holds
# cuDNN's algorithm search and the CUDA graph capture) over 16384 synthetic images
# held on the GPU; PyTorch's is torch_anchor.py's timed steps after its warm-up,
# random uint8 data on the GPU. Both do crop+flip+normalise on the device.
# Also printed per batch: the kernels of the captured step (the engine's count) and
# the split of an eager step's GPU time by phase (CIFAR_CUDA_PHASES=1).
# Environment: BIN (commands), PYTHON_GPU (python3 with a CUDA PyTorch),
# ANCHOR (torch_anchor.py), BENCH_STEPS (PyTorch steps, default 50),
# BENCH_BATCHES (default "256 1024"), BENCH_PRECISIONS (default "tf32 bf16").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
PY=${PYTHON_GPU:-python3}
ANCHOR=${ANCHOR:-$repo/tests/bench/torch_anchor.py}
STEPS=${BENCH_STEPS:-50}
BATCHES=${BENCH_BATCHES:-256 1024}
PRECISIONS=${BENCH_PRECISIONS:-tf32 bf16}
work=$(mktemp -d /tmp/cifar-bench-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! nvidia-smi >/dev/null 2>&1; then
    echo "bench-gpu: needs a GPU (nvidia-smi fails) and a CUDA build (make CUDA=1)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'

"$BIN/cifar-synth" "$work/data" --train 16384 --test 256 --seed 5 >/dev/null 2>&1
lmdb=$("$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" | tail -1)

ours_ips() { # batch, precision
    local dir="$work/run-$1-$2"
    "$BIN/cifar-train" --device cuda --precision "$2" --epochs 2 --batch-size "$1" \
        --save-every 2 --run-dir "$dir" "$lmdb" >/dev/null 2>"$work/train-$1-$2.log"
    sed -n 's/.*"images_per_s":\([0-9.e+]*\).*/\1/p' "$dir/metrics.jsonl" | sed -n 2p
}

# The split of a step's GPU time (CUDA events between phases, eager steps: the graph
# cannot be split) from one more epoch with CIFAR_CUDA_PHASES=1.
phase_split() { # batch, precision
    local log="$work/phases-$1-$2.log"
    if ! CIFAR_CUDA_PHASES=1 "$BIN/cifar-train" --device cuda --precision "$2" --epochs 1 \
        --batch-size "$1" --save-every 1 --run-dir "$work/phases-$1-$2" "$lmdb" >/dev/null 2>"$log"; then
        echo "phase split: the CIFAR_CUDA_PHASES=1 run failed: $(tail -1 "$log")"
        return
    fi
    sed -n 's/.*cuda engine: \(GPU time per step.*\)/\1/p' "$log" | head -1
}

kernels_per_step() { # batch, precision: from the engine's line at graph capture
    sed -n 's/.*CUDA graph of one step: \([0-9]*\) kernels per step.*/\1/p' "$work/train-$1-$2.log" | head -1
}

have_torch=0
if [ -f "$ANCHOR" ] && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    have_torch=1
else
    echo "PyTorch anchor not run: $ANCHOR missing or no CUDA PyTorch for $PY (set ANCHOR / PYTHON_GPU)"
fi
theirs_ips() { # batch, extra args...
    local b=$1; shift
    "$PY" "$ANCHOR" --device cuda --batch "$b" --steps "$STEPS" --warmup 10 "$@" 2>/dev/null |
        sed -n 's/.*"images_per_s": *\([0-9.e+]*\).*/\1/p' | tail -1
}

for p in $PRECISIONS; do
    amp=none
    [ "$p" = bf16 ] && amp=bf16
    for b in $BATCHES; do
        o=$(ours_ips "$b" "$p")
        echo "ours batch $b $p: cifar-train cuda $p ${o:-n/a} images/s, $(kernels_per_step "$b" "$p") kernels per step"
        echo "ours batch $b $p: $(phase_split "$b" "$p")"
        if [ "$have_torch" = 1 ]; then
            e=$(theirs_ips "$b" --amp "$amp")
            c=$(theirs_ips "$b" --amp "$amp" --compile)
            echo "pytorch batch $b $p: eager ${e:-n/a} images/s, compile ${c:-n/a} images/s (--amp $amp)"
            awk -v o="$o" -v e="$e" -v c="$c" -v b="$b" -v p="$p" 'BEGIN {
                printf "ratio batch %d %s: cifar-train / eager %s, cifar-train / compile %s\n", b, p,
                       (e > 0 ? sprintf("%.2fx", o / e) : "n/a"), (c > 0 ? sprintf("%.2fx", o / c) : "n/a") }'
        fi
    done
done
