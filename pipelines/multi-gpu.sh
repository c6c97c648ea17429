#!/usr/bin/env bash
# multi-gpu.sh: data-parallel training on every GPU of this machine.
#
#   pipelines/multi-gpu.sh LMDB            (an LMDB from cifar-prep, e.g. cifar10.sh --prep-only)
#   DATA=dir pipelines/multi-gpu.sh        (a seed-layout folder: cifar-prep runs first)
#
# One worker process per visible GPU (cifar-train --nproc-per-node gpu; restrict with
# CUDA_VISIBLE_DEVICES), each with BATCH images per step, gradients averaged with
# NCCL: the global batch is BATCH x GPUs, so the default 128 x 4 GPUs = 512 matches
# the seed's 2 x 256. Then cifar-eval on one GPU. Without a GPU it still runs: one
# CPU worker (NPROC=2 DEVICE=cpu for two CPU workers over shared memory).
#
# Environment (all optional): BIN=(../bin, PREFIX/bin or PATH) NPROC=gpu DEVICE=auto EPOCHS=30 BATCH=128
#   LR=0.1 RUN_DIR=run/multi-gpu MAX_RESTARTS=3 TRAIN_ARGS="--precision bf16 ..."
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=multi-gpu.sh

case "${1:-}" in
  -h|--help) sed -n '2,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
esac
[ $# -le 1 ] || { echo "$me: give at most one LMDB; see --help" >&2; exit 2; }

. "$here/cifar-bin.sh"
NPROC=${NPROC:-gpu}
DEVICE=${DEVICE:-auto}
EPOCHS=${EPOCHS:-30}
BATCH=${BATCH:-128}
LR=${LR:-0.1}
RUN_DIR=${RUN_DIR:-run/multi-gpu}
MAX_RESTARTS=${MAX_RESTARTS:-3}
TRAIN_ARGS=${TRAIN_ARGS:-}

if [ $# -eq 1 ]; then
  [ -f "$1" ] || { echo "$me: $1: no such LMDB file" >&2; exit 1; }
  source_cmd=(echo "$1")
elif [ -n "${DATA:-}" ]; then
  source_cmd=("$BIN/cifar-prep" "$DATA" -f)
else
  echo "$me: give an LMDB or DATA=dir; see --help" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "$me: GPUs: $(nvidia-smi -L | wc -l) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all})" >&2
else
  echo "$me: no GPU found: the workers train on the CPU" >&2
fi

# shellcheck disable=SC2206 # TRAIN_ARGS is a list of options, split on purpose
extra=($TRAIN_ARGS)
mkdir -p "$RUN_DIR"
"${source_cmd[@]}" \
  | "$BIN/cifar-train" --nproc-per-node "$NPROC" --device "$DEVICE" --max-restarts "$MAX_RESTARTS" \
      --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" --run-dir "$RUN_DIR" ${extra[@]+"${extra[@]}"} \
  | "$BIN/cifar-eval" --device "$DEVICE" \
  | tee "$RUN_DIR/eval.txt"
if command -v gnuplot >/dev/null; then "$here/plot.sh" "$RUN_DIR" >/dev/null; fi
