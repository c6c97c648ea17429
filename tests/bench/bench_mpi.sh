#!/usr/bin/env bash
# bench_mpi.sh: data-parallel training images/s with 2 CPU ranks over shared memory
# (the launcher's workers), over Gloo (--comm gloo, TCP on 127.0.0.1) and over MPI
# (TCP only, --mca btl tcp,self, as between two machines), 1 thread each, 1 epoch of
# synthetic images, batch 256: BENCH_ROUNDS rounds (default 3), the three in turn in
# every round, then each one's range; the final weights must be identical. Then,
# with BENCH_COMM (tests' test_comm), the all-reduce cost of each communicator.
# Environment: BIN (commands), BENCH_IMAGES=8192, BENCH_ROUNDS=3, BENCH_COMM,
# CIFAR_MPI_LIB, CIFAR_GLOO_LIB. A communicator that is not built is left out, saying so.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
IMAGES=${BENCH_IMAGES:-8192}
ROUNDS=${BENCH_ROUNDS:-3}
comms=(shm)
if [ -f "$BIN/libcifar-gloo.so" ]; then comms+=(gloo); else echo "bench_mpi.sh: $BIN/libcifar-gloo.so not built: Gloo not measured"; fi
if command -v mpirun >/dev/null && [ -f "$BIN/libcifar-mpi.so" ]; then comms+=(mpi); else echo "bench_mpi.sh: no mpirun or no $BIN/libcifar-mpi.so: MPI not measured"; fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d /tmp/cifar-bench-mpi.XXXXXX)
trap 'rm -rf "$work"' EXIT

# shellcheck source=tests/bench/bench_lib.bash
. "$here/bench_lib.bash"

echo "== shared memory, Gloo and MPI (TCP): cifar-train, 2 ranks x 1 thread, 1 epoch of $IMAGES synthetic images, batch 256, $ROUNDS rounds"
"$BIN/cifar-synth" "$work/data" --train "$IMAGES" --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
train() { # comm, run-dir
    local args=(--quiet --epochs 1 --threads 1 --device cpu --run-dir "$2" "$work/data.lmdb")
    case $1 in
    mpi) mpirun -np 2 --oversubscribe --mca btl tcp,self "$BIN/cifar-train" "${args[@]}" ;;
    *) "$BIN/cifar-train" --nproc-per-node 2 --comm "$1" "${args[@]}" ;;
    esac >/dev/null
}
declare -A figures
for round in $(seq 1 "$ROUNDS"); do
  for c in "${comms[@]}"; do
    rm -rf "$work/$c"
    train "$c" "$work/$c"
    figures[$c]="${figures[$c]:-} $(field images_per_s < "$work/$c/metrics.jsonl")"
    if [ "$c" != shm ] && ! cmp -s "$(ls "$work"/shm/snapshot-*.safetensors)" "$(ls "$work/$c"/snapshot-*.safetensors)"; then
      echo "final weights of $c: DIFFERENT from shm's (they must be identical)"
      exit 1
    fi
  done
done
for c in "${comms[@]}"; do
  # shellcheck disable=SC2086
  printf '%s\n' ${figures[$c]} | sort -g | awk -v c="$c" '{ v[NR] = $1 } END {
    printf "2 ranks over %-5s %8.1f .. %8.1f images/s (%d rounds:", c, v[1], v[NR], NR
    for (i = 1; i <= NR; i++) printf " %.1f", v[i]; print ")" }'
done
echo "final weights: identical (${comms[*]})"
if [ -x "${BENCH_COMM:-}" ]; then
  echo "all-reduce cost, 2 processes (the seed model's gradient is 58,042 floats):"
  echo "  shared memory:"
  "$BENCH_COMM" bench 2>&1 | grep allreduce | sed 's/^/    /'
  if [[ " ${comms[*]} " == *" gloo "* ]]; then
    echo "  Gloo (TCP, 127.0.0.1):"
    CIFAR_GLOO_LIB=${CIFAR_GLOO_LIB:-$BIN/libcifar-gloo.so} "$BENCH_COMM" bench gloo 2>&1 | grep allreduce | sed 's/^/    /'
  fi
  if [[ " ${comms[*]} " == *" mpi "* ]] && [ -f "${CIFAR_MPI_LIB:-}" ]; then
    echo "  MPI (TCP):"
    mpirun -np 2 --oversubscribe --mca btl tcp,self "$BENCH_COMM" worker mpi-bench "$work" 2>&1 \
      | grep allreduce | sed 's/^/    /'
  fi
fi
