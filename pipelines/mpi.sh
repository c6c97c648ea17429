#!/usr/bin/env bash
# mpi.sh: data-parallel training on CPUs, on one or several machines, with Open MPI.
#
#   pipelines/mpi.sh LMDB                               (NP=2 ranks on this machine)
#   NP=8 HOSTFILE=hosts pipelines/mpi.sh /shared/cifar10.lmdb   (ranks spread over hosts)
#
# mpirun starts NP cifar-train ranks (on the hosts of HOSTFILE, Open MPI's format:
# "node1 slots=4"); each finds its rank in OMPI_COMM_WORLD_*, trains on the CPU with
# cores/ranks-per-node threads, and the gradients are averaged by the MPI
# communicator (shared memory inside a node, TCP or InfiniBand between nodes).
# The LMDB and RUN_DIR must be on a filesystem every host sees, and cifar-train at
# the same path on every host. When a rank dies, mpirun ends the job; this script
# runs it again (up to RETRIES times) and the ranks resume from the latest snapshot.
# Then cifar-eval evaluates the final snapshot here. Under Slurm use instead:
#   srun --mpi=pmix cifar-train --device cpu ... LMDB
#
# Environment (all optional): BIN=bin NP=2 HOSTFILE= EPOCHS=30 BATCH=128 LR=0.1
#   RUN_DIR=run/mpi RETRIES=2 TRAIN_ARGS="--threads 4 ..." MPIRUN_ARGS="--mca btl tcp,self ..."
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=mpi.sh

case "${1:-}" in
  -h|--help) sed -n '2,19s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
esac
[ $# -eq 1 ] || { echo "$me: give the LMDB (on a filesystem every host sees); see --help" >&2; exit 2; }
lmdb=$1
[ -f "$lmdb" ] || { echo "$me: $lmdb: no such LMDB file" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "$me: no mpirun: install Open MPI (make deps: openmpi-bin)" >&2; exit 1; }

. "$here/cifar-bin.sh"
NP=${NP:-2}
HOSTFILE=${HOSTFILE:-}
EPOCHS=${EPOCHS:-30}
BATCH=${BATCH:-128}
LR=${LR:-0.1}
RUN_DIR=${RUN_DIR:-run/mpi}
RETRIES=${RETRIES:-2}
TRAIN_ARGS=${TRAIN_ARGS:-}
MPIRUN_ARGS=${MPIRUN_ARGS:-}
[ -f "$BIN/libcifar-mpi.so" ] || [ -f "$BIN/../lib/cifar/libcifar-mpi.so" ] || {
  echo "$me: $BIN/libcifar-mpi.so is missing: build with Open MPI installed (make deps && make)" >&2; exit 1; }

# Open MPI refuses root unless told; containers often run as root.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck disable=SC2206 # option lists, split on purpose
extra=($TRAIN_ARGS)
# shellcheck disable=SC2206
mpi_extra=($MPIRUN_ARGS)
hosts=()
[ -z "$HOSTFILE" ] || hosts=(--hostfile "$HOSTFILE")
# Open MPI binds a rank to one core by default: its threads would share that core
case "$MPIRUN_ARGS" in *bind-to*|*map-by*) ;; *) mpi_extra=(--bind-to none ${mpi_extra[@]+"${mpi_extra[@]}"}) ;; esac
mkdir -p "$RUN_DIR"
echo "$me: $NP ranks${HOSTFILE:+ on the hosts of $HOSTFILE}, run $RUN_DIR" >&2

for attempt in $(seq 0 "$RETRIES"); do
  # --oversubscribe: more ranks than slots is allowed (slow, but what was asked)
  rc=0
  mpirun -np "$NP" ${hosts[@]+"${hosts[@]}"} --oversubscribe ${mpi_extra[@]+"${mpi_extra[@]}"} \
    "$BIN/cifar-train" --device cpu --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" \
    --run-dir "$RUN_DIR" ${extra[@]+"${extra[@]}"} "$lmdb" > "$RUN_DIR/final.txt" || rc=$?
  [ "$rc" -ne 0 ] || break
  # exit status 2 is bad usage: the same command would fail the same way
  [ "$rc" -ne 2 ] || { echo "$me: cifar-train refused its options (exit 2); not retrying" >&2; exit 2; }
  if [ "$attempt" -eq "$RETRIES" ]; then
    echo "$me: training failed $((RETRIES + 1)) times; see the messages above" >&2
    exit 1
  fi
  echo "$me: the job failed (exit $rc); running it again to resume from the latest snapshot ($((attempt + 1))/$RETRIES)" >&2
done
tail -1 "$RUN_DIR/final.txt" | "$BIN/cifar-eval" --device cpu | tee "$RUN_DIR/eval.txt"
if command -v gnuplot >/dev/null; then "$here/plot.sh" "$RUN_DIR" >/dev/null; fi
