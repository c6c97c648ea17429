#!/usr/bin/env bash
# make bench: speed figures side by side with PyTorch on this machine's CPU.
#   1. cifar-prep images/s against its floor (prep_floor) and the seed's loading path (bench_prep.sh)
#   2. training images/s of the seed model, batch 256, 2 threads, against PyTorch
#      (../shared/bench/torch_anchor.py with Debian's python3-torch), per-op breakdown
#   3. data parallel: 2 workers x 1 thread against 1 worker x 2 threads, and the
#      all-reduce cost per step
#   4. 2 CPU ranks over MPI (TCP) beside 2 over shared memory (bench_mpi.sh)
#   5. peak private memory and epoch speed, records read in place against the
#      in-memory copy (bench_memory.sh; BENCH_MEMORY=0 skips its several minutes)
# Environment: BIN (commands), BENCH_TRAIN (bench_train program), PREP_FLOOR (prep_floor program), PYTHON_TORCH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
BENCH_TRAIN=${BENCH_TRAIN:-$repo/build/cpu/bench/bench_train}
PYTHON_TORCH=${PYTHON_TORCH:-/usr/bin/python3}
ANCHOR=${ANCHOR:-$repo/../shared/bench/torch_anchor.py}
STEPS=${BENCH_STEPS:-20}
THREADS=${BENCH_THREADS:-2}
work=$(mktemp -d /tmp/cifar-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p" | head -1; }

echo "== 1. cifar-prep"
"$here/bench_prep.sh"

echo
echo "== 2. training step, seed model, batch 256, $THREADS threads, data in memory"
ours=$("$BENCH_TRAIN" --batch 256 --threads "$THREADS" --steps "$STEPS")
echo "$ours"
ours_ips=$(echo "$ours" | field images_per_s)
if [ -f "$ANCHOR" ] && "$PYTHON_TORCH" -c 'import torch' 2>/dev/null; then
  # PyTorch as it comes, and with the passive OpenMP wait cifar-train uses: the
  # ratio is taken against the faster of the two, so it is never flattered.
  theirs=$("$PYTHON_TORCH" "$ANCHOR" --device cpu --batch 256 --threads "$THREADS" --steps "$STEPS" --warmup 3)
  echo "$theirs (default OpenMP wait policy)"
  passive=$(OMP_WAIT_POLICY=passive "$PYTHON_TORCH" "$ANCHOR" --device cpu --batch 256 --threads "$THREADS" --steps "$STEPS" --warmup 3)
  echo "$passive (OMP_WAIT_POLICY=passive)"
  theirs_ips=$( (echo "$theirs" | field images_per_s; echo "$passive" | field images_per_s) | sort -g | tail -1)
  awk -v a="$ours_ips" -v b="$theirs_ips" 'BEGIN { printf "training ratio cifar-train / pytorch-eager (CPU, best of the two): %.2fx (%.1f vs %.1f images/s)\n", a / b, a, b }'
else
  echo "PyTorch anchor not run: $ANCHOR or torch for $PYTHON_TORCH missing"
fi

echo
echo "== 3. data parallel on this machine (cifar-train, 1 epoch of 8192 synthetic images, batch 256)"
"$BIN/cifar-synth" "$work/data" --train 8192 --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
run_ips() { # name, args...
  local dir="$work/run-$1"; shift
  "$BIN/cifar-train" --quiet --epochs 1 --run-dir "$dir" "$@" "$work/data.lmdb" >/dev/null
  field images_per_s < "$dir/metrics.jsonl"
}
one=$(run_ips one --threads 2)
two=$(run_ips two --nproc-per-node 2 --threads 1)
echo "1 worker x 2 threads: $one images/s"
echo "2 workers x 1 thread: $two images/s"
awk -v a="$two" -v b="$one" 'BEGIN { printf "ratio 2x1 / 1x2: %.2f\n", a / b }'
if [ -x "${BENCH_COMM:-}" ]; then
  echo "all-reduce cost (shared memory, 2 processes; the seed model's gradient is 58,042 floats):"
  "$BENCH_COMM" bench 2>&1 | grep allreduce
fi

echo
echo "== 4. CPU ranks over MPI (TCP) beside shared memory"
CIFAR_MPI_LIB=${CIFAR_MPI_LIB:-$BIN/libcifar-mpi.so} "$here/bench_mpi.sh"

echo
if [ "${BENCH_MEMORY:-1}" = 1 ]; then
  echo "== 5. private memory with the dataset read in place (a 60,000-image 64x64 set; several minutes; BENCH_MEMORY=0 skips)"
  "$here/bench_memory.sh"
else
  echo "== 5. memory: skipped (BENCH_MEMORY=0)"
fi
