#!/usr/bin/env bats
# The Gloo communicator (--comm gloo, libcifar-gloo.so): 2 workers on this machine
# end with a snapshot byte for byte the same as 2 shared-memory workers' (sums in
# rank order; mpi.bats shows MPI's equal shm's too); torchrun-style ranks that span
# nodes and the launcher's CPU workers on several nodes use it by default; where the library is missing, --comm gloo and the
# launcher's --nnodes on the CPU say why in one line.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 256 --test 70 --size 16 --seed 3
    export LMDB="$DATA/cifar10.lmdb"
}

setup() {
    # make deps installs libgloo-dev (DEB_BUILD) and make builds libcifar-gloo.so with
    # it: its absence fails, it is no reason to skip
    [ -f "$BIN/libcifar-gloo.so" ] || { echo "$BIN/libcifar-gloo.so not built (make's Gloo probe failed: make GLOO=1 shows why)"; return 1; }
}

TRAIN_ARGS=(--quiet --device cpu --threads 1 --batch-size 32 --epochs 2 --save-every 1 --seed 7)

launcher_train() { # comm, run-dir, extra args...
    local comm=$1 dir=$2; shift 2
    timeout 120 "$BIN/cifar-train" --nproc-per-node 2 --comm "$comm" "${TRAIN_ARGS[@]}" \
        --run-dir "$dir" "$@" "$LMDB"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

@test "--comm gloo, 2 workers: the final snapshot is byte for byte 2 shared-memory workers'" {
    gloo_final=$(launcher_train gloo "$BATS_TEST_TMPDIR/gloo" | tail -1)
    shm_final=$(launcher_train shm "$BATS_TEST_TMPDIR/shm" | tail -1)
    echo "gloo $gloo_final, shm $shm_final"
    cmp "$gloo_final" "$shm_final"
    [ "$(grep -c '"comm":"gloo"' "$BATS_TEST_TMPDIR/gloo/metrics.jsonl")" -eq 2 ]
    [ "$(grep -c '"comm":"shm"' "$BATS_TEST_TMPDIR/shm/metrics.jsonl")" -eq 2 ]
}

@test "torchrun-style ranks on two nodes (LOCAL_WORLD_SIZE=1) use Gloo by default, same snapshot as shm" {
    local port; port=$(free_port)
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            CIFAR_JOB_ID="gloo-bats-$$" timeout 120 "$BIN/cifar-train" "${TRAIN_ARGS[@]}" \
            --run-dir "$BATS_TEST_TMPDIR/nodes" "$LMDB" > "$BATS_TEST_TMPDIR/out-$r" 2> "$BATS_TEST_TMPDIR/err-$r" &
    done
    wait %1 || { cat "$BATS_TEST_TMPDIR"/err-*; false; }
    wait %2 || { cat "$BATS_TEST_TMPDIR"/err-*; false; }
    [ "$(grep -c '"comm":"gloo"' "$BATS_TEST_TMPDIR/nodes/metrics.jsonl")" -eq 2 ]
    shm_final=$(launcher_train shm "$BATS_TEST_TMPDIR/shm" | tail -1)
    cmp "$(tail -1 "$BATS_TEST_TMPDIR/out-0")" "$shm_final"
}

@test "the launcher's --nnodes 2 --device cpu (two launchers here, one worker each): Gloo, same snapshot as shm" {
    local port; port=$(free_port)
    for n in 0 1; do
        CIFAR_JOB_ID="gloo-nodes-$$" timeout 120 "$BIN/cifar-train" --nnodes 2 --node-rank $n --nproc-per-node 1 \
            --master-addr 127.0.0.1 --master-port "$port" "${TRAIN_ARGS[@]}" \
            --run-dir "$BATS_TEST_TMPDIR/node$n" "$LMDB" > "$BATS_TEST_TMPDIR/out-$n" 2> "$BATS_TEST_TMPDIR/err-$n" &
    done
    wait %1 || { cat "$BATS_TEST_TMPDIR"/err-*; false; }
    wait %2 || { cat "$BATS_TEST_TMPDIR"/err-*; false; }
    [ "$(grep -c '"world_size":2,.*"comm":"gloo"' "$BATS_TEST_TMPDIR/node0/metrics.jsonl")" -eq 2 ]
    shm_final=$(launcher_train shm "$BATS_TEST_TMPDIR/shm" | tail -1)
    cmp "$(tail -1 "$BATS_TEST_TMPDIR/out-0")" "$shm_final"
}

@test "CIFAR_GLOO_LIB=/nonexistent: --comm gloo fails at once (permanent) saying the library cannot be loaded" {
    CIFAR_GLOO_LIB=/nonexistent run --separate-stderr launcher_train gloo "$BATS_TEST_TMPDIR/run"
    echo "$stderr"
    assert_failure 1
    [ "$(echo "$stderr" | grep -c 'the Gloo communicator is not available: cannot load libcifar-gloo.so: /nonexistent: cannot open shared object file')" -ge 1 ]
    [[ "$stderr" == *"giving up at once"* ]]
    [[ "$stderr" != *"restarting"* ]]
}

@test "CIFAR_GLOO_LIB=/nonexistent: the launcher's --nnodes 2 on the CPU is refused before any worker, naming why and mpirun" {
    CIFAR_GLOO_LIB=/nonexistent run --separate-stderr "$BIN/cifar-train" --nnodes 2 --node-rank 1 \
        --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$(free_port)" "${TRAIN_ARGS[@]}" \
        --run-dir "$BATS_TEST_TMPDIR/run" "$LMDB"
    echo "$stderr"
    assert_failure 2
    [[ "$stderr" == *"--nnodes 2 on the CPU: the workers' Gloo communicator is not available: cannot load libcifar-gloo.so: /nonexistent"* ]]
    [[ "$stderr" == *"mpirun -np N --hostfile H"* ]]
    [ ! -e "$BATS_TEST_TMPDIR/run/ranks" ]
}
