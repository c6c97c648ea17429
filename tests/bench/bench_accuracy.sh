#!/usr/bin/env bash
# bench_accuracy.sh (make bench, section 7; alone: make bench-accuracy): test accuracy
# after the same epochs, cifar-train --precision bf16 against --precision fp32 on the
# CPU. For each seed of SEEDS both precisions train from the same initial weights on the
# same batches (the seed fixes both); each run's final snapshot is scored by cifar-eval
# (in fp32). Printed: every run's accuracy and last train loss, the difference of each
# pair (bf16 - fp32), and the mean difference against the spread between seeds. Not a
# test: nothing is asserted.
# Data: ACC_LMDB when given (real CIFAR-10: pipelines/cifar10.sh makes its LMDB), else
# cifar-synth's ten shapes on noisy backgrounds (ACC_TRAIN, ACC_TEST images, ACC_CHANNELS
# channels): grayscale by default, which at these sizes stays below 100% (README's
# recipe table: 72.7% to 89.2% over three seeds), where the RGB set reaches 100% in a
# few epochs and could not show a difference.
# bf16 only where the processor has AVX512-BF16 or AMX; elsewhere, or where cifar-train
# refuses it, one line says why and only fp32 is reported.
# Environment: BIN, ACC_LMDB, ACC_TRAIN (600), ACC_TEST (1000), ACC_CHANNELS (1),
# ACC_EPOCHS (15), ACC_BATCH (64), ACC_SEEDS ("0 1 2"), BENCH_THREADS (every core),
# BENCH_CPUINFO (/proc/cpuinfo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/bench/bench_lib.bash
. "$here/bench_lib.bash"
BIN=${BIN:-$repo/bin}
EPOCHS=${ACC_EPOCHS:-15}
BATCH=${ACC_BATCH:-64}
read -r -a seeds <<< "${ACC_SEEDS:-0 1 2}"
THREADS=${BENCH_THREADS:-$(nproc)}
CPUINFO=${BENCH_CPUINFO:-/proc/cpuinfo}
work=$(mktemp -d /tmp/cifar-bench-acc.XXXXXX)
trap 'rm -rf "$work"' EXIT

if [ -n "${ACC_LMDB:-}" ]; then
  lmdb=$ACC_LMDB
  echo "data: $lmdb"
else
  train=${ACC_TRAIN:-600} test=${ACC_TEST:-1000} channels=${ACC_CHANNELS:-1}
  "$BIN/cifar-synth" "$work/data" --train "$train" --test "$test" --channels "$channels" --seed 5 >/dev/null 2>&1
  "$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
  lmdb=$work/data.lmdb
  echo "data: cifar-synth, $train train and $test test images, 32x32, $channels channel(s) (not CIFAR-10: no claim about it)"
fi
precisions=(fp32)
bf16_have=$(cpu_bf16_features "$CPUINFO")
if [ -n "$bf16_have" ]; then precisions+=(bf16); else bf16_lacking_line "$CPUINFO"; fi

# Trains one run and prints "ACCURACY TRAIN_LOSS" (accuracy in %); status 2 when
# cifar-train refuses bf16 as bad usage (its stderr in $work/err), 1 on any other failure.
train_and_score() { # precision, seed
  local dir=$work/run-$1-$2 rc=0
  "$BIN/cifar-train" --quiet --device cpu --threads "$THREADS" --epochs "$EPOCHS" --batch-size "$BATCH" \
      --seed "$2" --precision "$1" --run-dir "$dir" "$lmdb" >/dev/null 2>"$work/err" || rc=$?
  if [ "$rc" != 0 ]; then
    if [ "$rc" = 2 ] && [ "$1" = bf16 ]; then return 2; fi
    echo "bench_accuracy: cifar-train --precision $1 --seed $2 failed (exit $rc):" >&2; tail -5 "$work/err" >&2
    return 1
  fi
  "$BIN/cifar-eval" --quiet --json --device cpu --threads "$THREADS" "$dir" > "$work/eval.json"
  awk -v a="$(field accuracy < "$work/eval.json")" -v l="$(tail -1 "$dir/metrics.jsonl" | field train_loss)" \
    'BEGIN { printf "%.2f %.4f\n", 100 * a, l }'
}

echo "-- ${#seeds[@]} seeds, $EPOCHS epochs each, batch $BATCH, $THREADS threads: ${precisions[*]} alternating"
: > "$work/pairs"
for s in "${seeds[@]}"; do
  line="seed $s:"
  fp32=$(train_and_score fp32 "$s")
  line+=" fp32 accuracy ${fp32% *}% (last train loss ${fp32#* })"
  if [ "${#precisions[@]}" = 2 ]; then
    rc=0; bf16=$(train_and_score bf16 "$s") || rc=$?
    if [ "$rc" = 2 ]; then
      bf16_refused_line "$work/err"; precisions=(fp32)
    elif [ "$rc" != 0 ]; then
      exit 1
    else
      line+=", bf16 ${bf16% *}% (${bf16#* })"
      line+=$(awk -v a="${bf16% *}" -v b="${fp32% *}" 'BEGIN { printf ", bf16 - fp32 %+.2f points", a - b }')
      echo "${fp32% *} ${bf16% *}" >> "$work/pairs"
    fi
  fi
  echo "$line"
done
if [ -s "$work/pairs" ]; then
  awk '{ f[NR] = $1; b[NR] = $2; d += $2 - $1; sf += $1; sb += $2 }
       END { lo = f[1]; hi = f[1]; for (i = 1; i <= NR; i++) { if (f[i] < lo) lo = f[i]; if (f[i] > hi) hi = f[i] }
             printf "mean over %d seeds: fp32 %.2f%%, bf16 %.2f%%, bf16 - fp32 %+.2f points (fp32 alone spans %.2f to %.2f%% across the seeds)\n",
                    NR, sf / NR, sb / NR, d / NR, lo, hi }' "$work/pairs"
fi
