#!/usr/bin/env bash
# bench_multinode.sh: training images/s of 2 CPU ranks x 1 thread, the same run three
# ways: 2 nodes over Gloo (two hosts made of network namespaces by tests/netns.bash,
# an agent each: --nnodes 2 --nproc-per-node 1 --rdzv-endpoint), shared memory on one
# node (--nproc-per-node 2), and MPI over TCP (mpirun -np 2 --mca btl tcp,self), 1
# epoch of synthetic images, batch 256; RUNS rounds (default 3), the three alternating
# in each round so that other work on the machine falls on all alike; every run
# printed, then the range. The final weights of each round must be identical.
# Needs root and `ip` for the namespaces and bin/libcifar-gloo.so (make with libgloo-dev);
# prints a line saying what is not measured otherwise.
# Environment: BIN (commands), BENCH_IMAGES=4096, BENCH_RUNS=3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
IMAGES=${BENCH_IMAGES:-4096}
RUNS=${BENCH_RUNS:-3}
echo "== 2 nodes over Gloo (network namespaces) against shared memory and MPI: 2 ranks x 1 thread, 1 epoch of $IMAGES synthetic images, batch 256, $RUNS rounds alternating"
[ -f "$BIN/libcifar-gloo.so" ] || { echo "bench_multinode.sh: Gloo not built ($BIN/libcifar-gloo.so missing; make deps installs libgloo-dev): the 2-node Gloo run is not measured"; exit 0; }
# shellcheck source=../netns.bash
source "$repo/tests/netns.bash"
why=$(netns_unusable)
[ -z "$why" ] || { echo "bench_multinode.sh: $why: the 2-node Gloo run is not measured"; exit 0; }
have_mpi=0
if command -v mpirun >/dev/null && [ -f "$BIN/libcifar-mpi.so" ]; then have_mpi=1; fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d /tmp/cifar-bench-multinode.XXXXXX)
NETNS_LOGS="$work/hosts"
netns_setup 2   # its EXIT trap removes the hosts
trap 'netns_teardown; rm -rf "$work"' EXIT

"$BIN/cifar-synth" "$work/data" --train "$IMAGES" --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
train=("$BIN/cifar-train" --quiet --epochs 1 --threads 1 --device cpu --batch-size 256)
ips() { sed -n 's/.*"images_per_s": *\([0-9.e+-]*\).*/\1/p' "$1/metrics.jsonl" | head -1; }
range() { sort -g | awk '{ v[NR] = $1 } END { printf "%.0f to %.0f images/s", v[1], v[NR] }'; }

gloo_run() { # run-dir
    local port=$((20000 + RANDOM % 20000)) i
    for i in 1 2; do
        netns_run "$i" "gloo-$i" "${train[@]}" --nnodes 2 --nproc-per-node 1 --comm gloo \
            --rdzv-endpoint "$(netns_addr 1):$port" --rdzv-id "bench-$port" --run-dir "$1" "$work/data.lmdb"
        [ "$i" -eq 2 ] || netns_deadline 30 grep -q "serving the rendezvous store" "$NETNS_LOGS/gloo-1.log"
    done
    for i in 1 2; do
        if ! netns_wait "gloo-$i" 600 || [ "$NETNS_STATUS" -ne 0 ]; then cat "$NETNS_LOGS/gloo-$i.log"; exit 1; fi
    done
}
shm_run() { "${train[@]}" --nproc-per-node 2 --run-dir "$1" "$work/data.lmdb" >/dev/null; }
mpi_run() {
    mpirun -np 2 --oversubscribe --mca btl tcp,self "${train[@]}" --comm mpi --run-dir "$1" "$work/data.lmdb" >/dev/null
}
final() { ls "$1"/snapshot-*.safetensors | tail -1; }
same_weights() { # dir dir
    cmp -s <(head -c 65536 "$(final "$1")" | grep -ao '"data_checksum":"[0-9a-f]*"') \
        <(head -c 65536 "$(final "$2")" | grep -ao '"data_checksum":"[0-9a-f]*"')
}

kinds=(gloo shm)
if [ "$have_mpi" -eq 1 ]; then kinds+=(mpi); else echo "bench_multinode.sh: no mpirun or $BIN/libcifar-mpi.so: MPI not measured"; fi
for r in $(seq "$RUNS"); do
    echo "-- round $r (load $(cut -d' ' -f1 /proc/loadavg))"
    for k in "${kinds[@]}"; do
        "${k}_run" "$work/$k-$r"
        v=$(ips "$work/$k-$r")
        echo "$k: $v images/s"
        echo "$v" >> "$work/$k.ips"
        if [ "$k" != gloo ] && ! same_weights "$work/gloo-$r" "$work/$k-$r"; then
            echo "final weights of gloo and $k in round $r: DIFFERENT (they must be identical)"
            exit 1
        fi
    done
done
echo "2 nodes over Gloo (TCP between namespaces): $(range < "$work/gloo.ips")"
echo "2 ranks over shared memory, one node:       $(range < "$work/shm.ips")"
[ "$have_mpi" -eq 0 ] || echo "2 ranks over MPI (TCP), one node:           $(range < "$work/mpi.ips")"
echo "final weights: identical in every round"
