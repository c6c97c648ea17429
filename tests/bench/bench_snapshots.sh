#!/usr/bin/env bash
# bench_snapshots.sh (make bench, section 6; alone: make bench-snapshots): what the
# background snapshots cost and what they save, on the default CPU run (the seed
# model, batch 256, 1 worker on every core, 8192 synthetic images).
#   1. throughput with --save-interval 5s against --save-interval 0, RUNS rounds
#      (default 3) of one run each, alternating; the ratio of each round and of the
#      medians (the aim: >= 0.98: the write must not stall training);
#   2. work lost per SIGKILL: KILLS times (default 20) the run is killed at a random
#      moment (2 to 9 s after it started) and rerun; after each kill, the steps
#      between the newest snapshot and the last step done (CIFAR_TEST_STEP_LOG of
#      the test build of cifar-train records each step and its time), in steps and
#      in seconds of training at that attempt's median step time, against the bound
#      of one interval plus one step, and whether a write was in flight at the kill
#      (its temporary is left); at the end the final weights against an
#      uninterrupted run's (bit-identical or not).
# Environment: BIN, TEST_BIN (the test build of cifar-train, make test-build), RUNS (0
# skips 1.), KILLS, EPOCHS (default 2 for 1., KILL_EPOCHS 10 for 2.).
set -euo pipefail
shopt -s nullglob
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
# the test build of cifar-train (make test-build), for its step log
TEST_BIN=${TEST_BIN:?set TEST_BIN, the folder of make test-build (build/MODE/test-bin; make bench sets it)}
RUNS=${RUNS:-${BENCH_RUNS:-3}}
KILLS=${KILLS:-20}
EPOCHS=${EPOCHS:-2}
KILL_EPOCHS=${KILL_EPOCHS:-10}
INTERVAL=5
work=$(mktemp -d /tmp/cifar-bench-snap.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$BIN/cifar-synth" "$work/data" --train 8192 --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
train() { # run-dir, args...
  local dir=$1; shift
  "$BIN/cifar-train" --quiet --device cpu --run-dir "$dir" "$@" "$work/data.lmdb"
}
# images/s of a run folder: all its images over all its epochs' seconds
ips() { awk -F'"seconds":' '{ split($2, a, ","); s += a[1]; n++ } END { printf "%.1f", n * 8192 / s }' "$1/metrics.jsonl"; }
# shellcheck source=tests/bench/bench_lib.bash
. "$here/bench_lib.bash"
checksum() { head -c 65536 "$1" | grep -ao '"data_checksum":"[0-9a-f]*"'; }
step_of() { basename "$1" .safetensors | sed 's/^snapshot-0*//; s/^$/0/'; }

[ "$RUNS" -gt 0 ] || echo "-- 1. throughput: skipped (RUNS=0)"
[ "$RUNS" -eq 0 ] || echo "-- 1. throughput, $EPOCHS epochs per run, --save-interval ${INTERVAL}s against 0, $RUNS rounds alternating"
: > "$work/on"; : > "$work/off"; : > "$work/ratio"
for r in $(seq "$RUNS"); do
  # which goes first alternates too: a load that rises or falls over a round is shared
  if [ $((r % 2)) -eq 1 ]; then
    train "$work/off-$r" --epochs "$EPOCHS" --save-interval 0 > /dev/null
    train "$work/on-$r" --epochs "$EPOCHS" --save-interval "${INTERVAL}s" --keep 0 > /dev/null
  else
    train "$work/on-$r" --epochs "$EPOCHS" --save-interval "${INTERVAL}s" --keep 0 > /dev/null
    train "$work/off-$r" --epochs "$EPOCHS" --save-interval 0 > /dev/null
  fi
  off=$(ips "$work/off-$r"); on=$(ips "$work/on-$r")
  files=("$work/on-$r"/snapshot-*.safetensors)
  snaps=${#files[@]}
  echo "round $r: off $off, ${INTERVAL}s $on images/s ($snaps snapshots) (load $(cut -d' ' -f1 /proc/loadavg))"
  echo "$off" >> "$work/off"; echo "$on" >> "$work/on"
  awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f\n", a / b }' >> "$work/ratio"
done
[ "$RUNS" -eq 0 ] || awk -v on="$(median < "$work/on")" -v off="$(median < "$work/off")" \
    -v lo="$(sort -g "$work/ratio" | head -1)" -v hi="$(sort -g "$work/ratio" | tail -1)" \
  'BEGIN { printf "throughput --save-interval 5s / off: median against median %.3f, per round %.3f to %.3f\n", on / off, lo, hi }'

echo "-- 2. work lost per SIGKILL, --save-interval ${INTERVAL}s, $KILL_EPOCHS epochs, $KILLS kills at random moments"
ref=$(train "$work/ref" --epochs "$KILL_EPOCHS" --save-interval 0 | tail -1)
step_s=$(awk -F'"seconds":' '{ split($2, a, ","); s += a[1] } END { printf "%.4f", s / (NR * 32) }' "$work/ref/metrics.jsonl")
bound=$(awk -v t="$step_s" -v i="$INTERVAL" 'BEGIN { printf "%d", i / t + 1 }')
echo "uninterrupted: $(ips "$work/ref") images/s, $step_s s per step: the bound is $bound steps (${INTERVAL}s + one step)"
dir="$work/killed"
: > "$work/lost"; : > "$work/lost_s"; : > "$work/steps.log"
kills=0; over=0; in_flight=0
for k in $(seq "$KILLS"); do
  start=$(wc -l < "$work/steps.log")
  # the command itself in the background (not a function's subshell): $! is cifar-train
  CIFAR_TEST_STEP_LOG="$work/steps.log" "$TEST_BIN/cifar-train" --quiet --device cpu --run-dir "$dir" \
    --epochs "$KILL_EPOCHS" --save-interval "${INTERVAL}s" "$work/data.lmdb" > /dev/null 2>&1 &
  pid=$!
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 2 + 7 * rand() }')"
  kill -KILL "$pid" 2>/dev/null || { wait "$pid" || true; echo "kill $k: the run had finished"; break; }
  wait "$pid" 2>/dev/null || true # 137, the point
  kills=$((kills + 1))
  snaps=("$dir"/snapshot-*.safetensors) # nullglob: none before the first snapshot
  snap_step=0
  [ ${#snaps[@]} -eq 0 ] || snap_step=$(step_of "${snaps[-1]}")
  temps=("$dir"/*.tmp-*)
  flight=${#temps[@]}
  # this attempt's steps: the last one done, and the median time between two
  tail -n +"$((start + 1))" "$work/steps.log" > "$work/attempt.log"
  done_step=$(awk 'END { print NR ? $1 : 0 }' "$work/attempt.log")
  step_time=$(awk 'NR > 1 { print $2 - prev } { prev = $2 }' "$work/attempt.log" | median)
  [ -n "$step_time" ] || step_time=$step_s
  lost=$((done_step - snap_step))
  lost_s=$(awk -v l="$lost" -v t="$step_time" 'BEGIN { printf "%.1f", l * t }')
  ok=$(awk -v s="$lost_s" -v t="$step_time" -v i="$INTERVAL" 'BEGIN { print (s <= i + t + 0.05) ? "within" : "over" }')
  [ "$ok" = within ] || over=$((over + 1))
  [ "$flight" -eq 0 ] || in_flight=$((in_flight + 1))
  echo "kill $k: last step done $done_step, newest snapshot step $snap_step: $lost steps lost," \
       "$lost_s s at $step_time s per step, $ok the bound$([ "$flight" -eq 0 ] || echo "; a write was in flight")"
  echo "$lost" >> "$work/lost"; echo "$lost_s" >> "$work/lost_s"
done
final=$(train "$dir" --epochs "$KILL_EPOCHS" --save-interval "${INTERVAL}s" | tail -1)
same=$([ "$(checksum "$final")" = "$(checksum "$ref")" ] && echo "bit-identical" || echo "NOT bit-identical")
echo "work lost per SIGKILL over $kills kills: $(sort -g "$work/lost" | head -1) to $(sort -g "$work/lost" | tail -1) steps" \
     "(median $(median < "$work/lost")), $(sort -g "$work/lost_s" | head -1) to $(sort -g "$work/lost_s" | tail -1) s of training" \
     "(median $(median < "$work/lost_s")); over the bound (${INTERVAL}s + one step): $over; a write in flight at the kill: $in_flight"
echo "final weights after $kills kills: $same to the uninterrupted run's"
