#!/usr/bin/env bash
# make bench: speed figures side by side with PyTorch on this machine's CPU.
#   1. cifar-prep images/s against its floor (prep_floor) and the seed's loading path (bench_prep.sh)
#   2. training images/s of the seed model, batch 256, against PyTorch on this CPU
#      (bench_vs_torch.sh): bench_train on 1 thread and on BENCH_THREADS (default: every
#      core) with the scaling and a per-op breakdown, cifar-train fp32 and, where the
#      processor has AVX512-BF16 or AMX, --precision bf16; anchors: Debian's PyTorch
#      1.13 eager and, with PYTHON_TORCH2, PyTorch 2.x eager, --channels-last, --amp
#      bf16, --compile and all three; the ratios against the best of them
#   3. cifar-train from an LMDB, 1 epoch: the default (1 worker, every core),
#      --threads 1, and 2 workers x 1 thread; the all-reduce cost per step
#   4. 2 CPU ranks over Gloo and over MPI (TCP) beside 2 over shared memory, alternating
#      (bench_mpi.sh); 2 nodes over Gloo (network namespaces) beside both, alternating
#      (bench_multinode.sh)
#   5. peak private memory and epoch speed, records read in place against the
#      in-memory copy (bench_memory.sh; BENCH_MEMORY=0 skips its several minutes)
#   6. background snapshots: throughput with --save-interval 5s against off, work
#      lost per SIGKILL over 20 random kills (bench_snapshots.sh)
#   7. test accuracy after the same epochs, --precision bf16 against fp32, on the
#      CPU (bench_accuracy.sh; BENCH_ACCURACY=0 skips)
# Each timed pair runs alternately, RUNS times (default 3), so that other work on the
# machine falls on both alike; every run is printed, then the range.
# Environment: BIN (commands), BENCH_TRAIN (bench_train program), PREP_FLOOR (prep_floor program),
# PYTHON_TORCH, PYTHON_TORCH2, BENCH_RUNS, BENCH_STEPS, BENCH_THREADS, BENCH_MEMORY, BENCH_ACCURACY.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
RUNS=${BENCH_RUNS:-3}
work=$(mktemp -d /tmp/cifar-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

# shellcheck source=tests/bench/bench_lib.bash
. "$here/bench_lib.bash"

echo "== 1. cifar-prep"
"$here/bench_prep.sh"
# sections 2 and 3 train on this
"$BIN/cifar-synth" "$work/data" --train 8192 --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null

echo
echo "== 2. training, seed model, batch 256, against PyTorch on this CPU: fp32 and bf16, $RUNS rounds, alternating (bench_vs_torch.sh)"
BENCH_LMDB=$work/data.lmdb "$here/bench_vs_torch.sh"

echo
echo "== 3. cifar-train from an LMDB, 1 epoch of 8192 synthetic images, batch 256 per worker, $RUNS runs each"
run_ips() { # name, args...
  local dir="$work/run-$1-$r"; shift
  "$BIN/cifar-train" --quiet --device cpu --epochs 1 --run-dir "$dir" "$@" "$work/data.lmdb" >/dev/null
  field images_per_s < "$dir/metrics.jsonl"
}
: > "$work/default"; : > "$work/one"; : > "$work/two"
for r in $(seq "$RUNS"); do
  d=$(run_ips default); o=$(run_ips one --threads 1); t=$(run_ips two --nproc-per-node 2 --threads 1)
  echo "run $r: default (1 worker, $(nproc) threads) $d, --threads 1 $o, 2 workers x 1 thread $t images/s (load $(cut -d' ' -f1 /proc/loadavg))"
  echo "$d" >> "$work/default"; echo "$o" >> "$work/one"; echo "$t" >> "$work/two"
done
d=$(sort -g "$work/default" | tail -1); o=$(sort -g "$work/one" | tail -1); t=$(sort -g "$work/two" | tail -1)
echo "default: $(range < "$work/default"); --threads 1: $(range < "$work/one"); 2 workers x 1 thread: $(range < "$work/two") images/s"
awk -v d="$d" -v o="$o" -v t="$t" 'BEGIN { printf "best runs: default / 1 thread %.2fx, 2 workers / 1 thread %.2fx, default / 2 workers %.2f\n", d / o, t / o, d / t }'
if [ -x "${BENCH_COMM:-}" ]; then
  echo "all-reduce cost (shared memory, 2 processes; the seed model's gradient is 58,042 floats):"
  "$BENCH_COMM" bench 2>&1 | grep allreduce
fi

echo
echo "== 4. CPU ranks over Gloo and MPI (TCP) beside shared memory"
CIFAR_MPI_LIB=${CIFAR_MPI_LIB:-$BIN/libcifar-mpi.so} "$here/bench_mpi.sh"
echo
BIN="$BIN" "$here/bench_multinode.sh"

echo
if [ "${BENCH_MEMORY:-1}" = 1 ]; then
  echo "== 5. private memory with the dataset read in place (a 60,000-image 64x64 set; several minutes; BENCH_MEMORY=0 skips)"
  "$here/bench_memory.sh"
else
  echo "== 5. memory: skipped (BENCH_MEMORY=0)"
fi

echo
echo "== 6. snapshots written in the background (bench_snapshots.sh)"
"$here/bench_snapshots.sh"

echo
if [ "${BENCH_ACCURACY:-1}" = 1 ]; then
  echo "== 7. test accuracy after the same epochs, --precision bf16 against fp32 (bench_accuracy.sh; BENCH_ACCURACY=0 skips)"
  "$here/bench_accuracy.sh"
else
  echo "== 7. bf16 accuracy: skipped (BENCH_ACCURACY=0)"
fi
