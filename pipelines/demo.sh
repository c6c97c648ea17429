#!/usr/bin/env bash
# demo.sh: the whole job in one pipeline, on a synthetic dataset or yours.
#
#   pipelines/demo.sh                      (what `make pipeline` runs)
#   DATA=/path/to/seed-layout pipelines/demo.sh
#
# Makes a small synthetic dataset with cifar-synth (unless DATA names a folder in
# the seed's layout), then runs
#     cifar-prep DATA | cifar-train ... | cifar-eval
# as one shell pipeline, draws RUN_DIR/curves.png and prints the accuracy and the
# wall time. Each run starts afresh (RESUME=1 continues the previous one instead).
#
# Environment (all optional):
#   BIN=dir            the commands (default: ../bin, else PREFIX/bin, else PATH)
#   DATA=dir           a dataset in the seed's layout (default: synthetic, in data/demo)
#   EPOCHS=8           training epochs
#   NPROC=1            worker processes (cifar-train --nproc-per-node: N, gpu or auto)
#   DEVICE=auto        auto (GPU when usable) | cpu | cuda
#   BATCH=64           images per process per step
#   THREADS=           CPU threads per process (default: cores / processes)
#   TRAIN_IMAGES=3000 TEST_IMAGES=1000 SIZE=32   the synthetic dataset
#   LMDB=data/NAME.lmdb  RUN_DIR=run/NAME        outputs (NAME: demo, or DATA's name)
#   RESUME=0           1: keep RUN_DIR and resume from its latest snapshot
#   TRAIN_ARGS=        extra cifar-train options, e.g. "--schedule step --lr 0.05"
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=demo.sh

case "${1:-}" in
  -h|--help) sed -n '2,25s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
  '') ;;
  *) echo "$me: no arguments (settings come from the environment); see --help" >&2; exit 2 ;;
esac

. "$here/cifar-bin.sh"
EPOCHS=${EPOCHS:-8}
NPROC=${NPROC:-1}
DEVICE=${DEVICE:-auto}
BATCH=${BATCH:-64}
THREADS=${THREADS:-}
TRAIN_IMAGES=${TRAIN_IMAGES:-3000}
TEST_IMAGES=${TEST_IMAGES:-1000}
SIZE=${SIZE:-32}
RESUME=${RESUME:-0}
TRAIN_ARGS=${TRAIN_ARGS:-}

for c in cifar-synth cifar-prep cifar-train cifar-eval; do
  [ -x "$BIN/$c" ] || { echo "$me: $BIN/$c: not built; run make (or make CUDA=0) first" >&2; exit 1; }
done

start=$(date +%s.%N)
if [ -n "${DATA:-}" ]; then
  [ -f "$DATA/annotations/cifar10_train.json" ] || {
    echo "$me: $DATA: not the seed's layout (no annotations/cifar10_train.json)" >&2
    echo "---> HINT: for the official CIFAR-10 download use pipelines/cifar10.sh" >&2
    exit 1
  }
  name=$(basename "$(cd "$DATA" && pwd)")
else
  name=demo
  DATA=data/demo
  echo "$me: synthetic dataset: $TRAIN_IMAGES train + $TEST_IMAGES test images, ${SIZE}x$SIZE RGB, 10 classes -> $DATA" >&2
  rm -rf "$DATA"
  "$BIN/cifar-synth" "$DATA" --train "$TRAIN_IMAGES" --test "$TEST_IMAGES" --size "$SIZE" >/dev/null
fi
LMDB=${LMDB:-data/$name.lmdb}
RUN_DIR=${RUN_DIR:-run/$name}
mkdir -p "$(dirname "$LMDB")"
if [ "$RESUME" != 1 ]; then rm -rf "$RUN_DIR"; fi

train_opts=(--epochs "$EPOCHS" --batch-size "$BATCH" --device "$DEVICE" --run-dir "$RUN_DIR")
[ "$NPROC" = 1 ] || train_opts+=(--nproc-per-node "$NPROC")
[ -z "$THREADS" ] || train_opts+=(--threads "$THREADS")
# shellcheck disable=SC2206 # TRAIN_ARGS is a list of options, split on purpose
[ -z "$TRAIN_ARGS" ] || train_opts+=($TRAIN_ARGS)

echo "$me: $BIN/cifar-prep $DATA -o $LMDB -f | $BIN/cifar-train ${train_opts[*]} | $BIN/cifar-eval --device $DEVICE" >&2
mkdir -p "$RUN_DIR"
"$BIN/cifar-prep" "$DATA" -o "$LMDB" -f \
  | "$BIN/cifar-train" "${train_opts[@]}" \
  | "$BIN/cifar-eval" --device "$DEVICE" \
  | tee "$RUN_DIR/eval.txt"

curves=
if command -v gnuplot >/dev/null; then
  curves=$("$here/plot.sh" "$RUN_DIR" | tail -1)
else
  echo "$me: gnuplot not installed: no curves.png (sudo apt-get install gnuplot-nox)" >&2
fi
end=$(date +%s.%N)
acc=$(sed -n 's/^accuracy: \([0-9.]*%\).*/\1/p' "$RUN_DIR/eval.txt")
wall=$(awk -v a="$start" -v b="$end" 'BEGIN { s = b - a; printf "%d:%02d", s / 60, s % 60 }')
echo
echo "demo: test accuracy $acc after $EPOCHS epochs on $name, wall time $wall (prep + train + eval)"
echo "demo: run folder $RUN_DIR (snapshots, metrics.jsonl, eval.txt${curves:+, curves.png})"
