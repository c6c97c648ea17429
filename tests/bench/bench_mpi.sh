#!/usr/bin/env bash
# bench_mpi.sh: data-parallel training images/s with 2 CPU ranks over MPI (TCP only,
# --mca btl tcp,self, as between two machines) beside 2 ranks over shared memory
# (the launcher's workers), 1 thread each, 1 epoch of synthetic images, batch 256;
# then, with BENCH_COMM (tests' test_comm) and CIFAR_MPI_LIB, the all-reduce cost
# of both communicators.
# Environment: BIN (commands), BENCH_IMAGES=8192, BENCH_COMM, CIFAR_MPI_LIB.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
IMAGES=${BENCH_IMAGES:-8192}
command -v mpirun >/dev/null || { echo "bench_mpi.sh: no mpirun (make deps installs openmpi-bin): MPI not measured"; exit 0; }
[ -f "$BIN/libcifar-mpi.so" ] || { echo "bench_mpi.sh: $BIN/libcifar-mpi.so not built: MPI not measured"; exit 0; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d /tmp/cifar-bench-mpi.XXXXXX)
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p" | head -1; }

echo "== MPI (TCP) against shared memory: cifar-train, 2 ranks x 1 thread, 1 epoch of $IMAGES synthetic images, batch 256"
"$BIN/cifar-synth" "$work/data" --train "$IMAGES" --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
ips() { field images_per_s < "$1/metrics.jsonl"; }
"$BIN/cifar-train" --quiet --epochs 1 --threads 1 --device cpu --nproc-per-node 2 --run-dir "$work/shm" \
    "$work/data.lmdb" >/dev/null
mpirun -np 2 --oversubscribe --mca btl tcp,self "$BIN/cifar-train" --quiet --epochs 1 --threads 1 \
    --device cpu --run-dir "$work/mpi" "$work/data.lmdb" >/dev/null
shm=$(ips "$work/shm")
mpi=$(ips "$work/mpi")
echo "2 ranks over shared memory: $shm images/s"
echo "2 ranks over MPI (TCP):     $mpi images/s"
awk -v a="$mpi" -v b="$shm" 'BEGIN { printf "ratio mpi / shm: %.2f\n", a / b }'
if cmp -s "$(ls "$work"/shm/snapshot-*.safetensors)" "$(ls "$work"/mpi/snapshot-*.safetensors)"; then
  echo "final weights: identical"
else
  echo "final weights: DIFFERENT (they must be identical)"
  exit 1
fi
if [ -x "${BENCH_COMM:-}" ] && [ -f "${CIFAR_MPI_LIB:-}" ]; then
  echo "all-reduce cost, 2 processes (the seed model's gradient is 58,042 floats):"
  echo "  shared memory:"
  "$BENCH_COMM" bench 2>&1 | grep allreduce | sed 's/^/    /'
  echo "  MPI (TCP):"
  mpirun -np 2 --oversubscribe --mca btl tcp,self "$BENCH_COMM" worker mpi-bench "$work" 2>&1 \
    | grep allreduce | sed 's/^/    /'
fi
