#!/usr/bin/env bats
# CPU ranks started by mpirun use the MPI communicator (libcifar-mpi.so): TCP only
# (--mca btl tcp,self, as between two machines), the final weights are bit-identical
# to the launcher's shared-memory workers with the same options; a rank SIGKILLed
# mid-epoch ends the job with a clear message, and the rerun resumes to the
# uninterrupted run's weights; a stopped rank cannot hang the job past the timeout.

bats_require_minimum_version 1.5.0
load helpers


setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 256 --test 70 --size 16 --seed 3
    export LMDB="$DATA/cifar10.lmdb"
}

setup() {
    # make deps installs Open MPI (DEB_BUILD) and make builds libcifar-mpi.so with it:
    # their absence fails, it is no reason to skip
    command -v mpirun >/dev/null || { echo "no mpirun on PATH (make deps installs openmpi-bin)"; return 1; }
    [ -f "$BIN/libcifar-mpi.so" ] || { echo "$BIN/libcifar-mpi.so not built (make's MPI probe failed: make MPI=1 shows why)"; return 1; }
    # make test-asan: Open MPI's libraries have no frame pointers; the slow unwinder lets
    # tests/lsan.supp recognise their allocations
    if [ -n "${CIFAR_ASAN:-}" ]; then export ASAN_OPTIONS="${ASAN_OPTIONS:-}:fast_unwind_on_malloc=0"; fi
}

# A snapshot holds weights, options and progress, no communicator or timing: the
# whole files must be equal.
same_file() { cmp "$1" "$2"; }

TRAIN_ARGS=(--threads 1 --batch-size 32 --epochs 3 --save-every 1 --seed 7)

mpi_train() { # np, run-dir, extra args...
    local np=$1 dir=$2; shift 2
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl tcp,self \
        "$BIN/cifar-train" "${TRAIN_ARGS[@]}" --run-dir "$dir" "$@" "$LMDB"
}

shm_train() { # nproc, run-dir, extra args...
    local np=$1 dir=$2; shift 2
    timeout 120 "$BIN/cifar-train" --quiet --nproc-per-node "$np" --device cpu "${TRAIN_ARGS[@]}" \
        --run-dir "$dir" "$@" "$LMDB"
}

@test "mpirun -np 2 over TCP: final weights bit-identical to 2 shared-memory workers" {
    run --separate-stderr mpi_train 2 "$BATS_TEST_TMPDIR/mpi"
    assert_success
    mpi_final=${lines[-1]}
    [[ "$stderr" == *"2 processes"*"comm mpi"* ]] || { echo "$stderr"; false; }
    shm_final=$(shm_train 2 "$BATS_TEST_TMPDIR/shm" | tail -1)
    echo "mpi $mpi_final, shm $shm_final"
    same_file "$mpi_final" "$shm_final"
    [ "$(grep -c '"comm":"mpi"' "$BATS_TEST_TMPDIR/mpi/metrics.jsonl")" -eq 3 ]
    [ "$(grep -c '"comm":"shm"' "$BATS_TEST_TMPDIR/shm/metrics.jsonl")" -eq 3 ]
    # the evaluation counts every test image once: same test metrics on both
    diff <(sed 's/"images_per_s".*//' "$BATS_TEST_TMPDIR/mpi/metrics.jsonl") \
         <(sed 's/"images_per_s".*//' "$BATS_TEST_TMPDIR/shm/metrics.jsonl")
}

@test "mpirun -np 3 (uneven slices) equals 3 shared-memory workers" {
    mpi_final=$(mpi_train 3 "$BATS_TEST_TMPDIR/mpi" --quiet --epochs 1 | tail -1)
    shm_final=$(shm_train 3 "$BATS_TEST_TMPDIR/shm" --epochs 1 | tail -1)
    same_file "$mpi_final" "$shm_final"
}

@test "--comm shm under mpirun: the ranks of one machine share memory instead" {
    run --separate-stderr mpi_train 2 "$BATS_TEST_TMPDIR/run" --epochs 1 --comm shm
    assert_success
    [[ "$stderr" == *"comm shm"* ]] || { echo "$stderr"; false; }
    grep -q '"comm":"shm"' "$BATS_TEST_TMPDIR/run/metrics.jsonl"
}

@test "a rank SIGKILLed mid-epoch: mpirun ends the job naming it; the rerun resumes to the same weights" {
    use_test_build
    ref=$(shm_train 2 "$BATS_TEST_TMPDIR/ref" | tail -1)
    dir="$BATS_TEST_TMPDIR/crash"
    step=$(( 4 * (RANDOM % 2 + 1) + RANDOM % 3 + 1 ))   # 4 steps per epoch: inside epoch 2 or 3
    echo "rank 1 dies after step $step"
    start=$(date +%s)
    CIFAR_TEST_DIE_AFTER_STEPS=$step CIFAR_TEST_DIE_RANK=1 CIFAR_COMM_TIMEOUT=20 \
        run --separate-stderr mpi_train 2 "$dir" --quiet
    elapsed=$(( $(date +%s) - start ))
    echo "$stderr"
    assert_failure
    [ "$status" -ne 124 ]               # ended by mpirun, not by our timeout
    [ "$elapsed" -lt 60 ]
    [[ "$stderr" == *"rank 1"*"signal 9"* ]]
    [ -z "$(leftover_processes)" ]
    run --separate-stderr mpi_train 2 "$dir"
    assert_success
    [[ "$stderr" == *"resuming from"* ]] || { echo "$stderr"; false; }
    same_file "${lines[-1]}" "$ref"
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 3 ]
}

@test "a stopped (SIGSTOP) rank: the others time out, mpirun ends the job" {
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_COMM_TIMEOUT=3 mpi_train 2 "$dir" --quiet --epochs 200 > /dev/null 2> "$BATS_TEST_TMPDIR/err" &
    job=$!
    for _ in $(seq 100); do [ -s "$dir/metrics.jsonl" ] && break; sleep 0.1; done
    victim=$(pgrep -f "cifar-train.*$dir" | while read -r p; do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && echo "$p"; done | head -1)
    [ -n "$victim" ]
    kill -STOP "$victim"
    start=$(date +%s)
    status=0
    wait "$job" || status=$?
    elapsed=$(( $(date +%s) - start ))
    # cleanup, not a check: mpirun may leave the stopped rank behind, or may not
    kill -KILL "$victim" 2>/dev/null || true
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$elapsed" -lt 40 ]
    grep -q "collective timed out after 3 s (MPI" "$BATS_TEST_TMPDIR/err"
    # ... naming who: the stopped rank, its pid and host, and the last step it reported
    # (MPI may have let it into the collective before it stopped: then every rank is listed)
    grep -q "rank 1 (pid $victim on host $(hostname), last step [0-9]*)" "$BATS_TEST_TMPDIR/err"
}

@test "--comm checks its value and the device" {
    run --separate-stderr "$BIN/cifar-train" --comm tcp "$LMDB"
    assert_failure 2
    [[ "$stderr" == *"--comm: unknown value 'tcp'"* ]]
    run --separate-stderr env RANK=0 WORLD_SIZE=2 "$BIN/cifar-train" --device cpu --comm nccl \
        --run-dir "$BATS_TEST_TMPDIR/run" "$LMDB"
    assert_failure 2
    [[ "$stderr" == *"--comm nccl: the CPU trains with --comm shm, mpi or gloo"* ]] || { echo "$stderr"; false; }
}

@test "pipelines/mpi.sh: 2 ranks over TCP train, then the final snapshot is evaluated" {
    cd "$BATS_TEST_TMPDIR"
    NP=2 EPOCHS=1 BATCH=32 TRAIN_ARGS="--threads 1 --quiet" MPIRUN_ARGS="--mca btl tcp,self" BIN="$BIN" \
        run --separate-stderr timeout 120 "$BATS_TEST_DIRNAME/../pipelines/mpi.sh" "$LMDB"
    echo "$stderr"
    assert_success
    assert_output --partial "accuracy"
    grep -q '"comm":"mpi"' run/mpi/metrics.jsonl
    grep -q '"world_size":2' run/mpi/metrics.jsonl
    [ "$(grep -c safetensors run/mpi/final.txt)" -eq 1 ]
}

@test "pipelines/mpi.sh: bad usage is not retried" {
    cd "$BATS_TEST_TMPDIR"
    NP=2 TRAIN_ARGS="--schedule nope" BIN="$BIN" run --separate-stderr timeout 60 \
        "$BATS_TEST_DIRNAME/../pipelines/mpi.sh" "$LMDB"
    echo "$stderr"
    assert_failure 2
    [[ "$stderr" == *"not retrying"* ]]
    run "$BATS_TEST_DIRNAME/../pipelines/mpi.sh"
    assert_failure 2
}

@test "SIGTERM to a rank waiting for a stopped peer (MPI): the wait ends at once, exit 143 named" {
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_COMM_TIMEOUT=300 mpi_train 2 "$dir" --quiet --epochs 200 > /dev/null 2> "$BATS_TEST_TMPDIR/err" &
    job=$!
    for _ in $(seq 100); do [ -s "$dir/metrics.jsonl" ] && break; sleep 0.1; done
    rank_of() { pgrep -f "cifar-train.*$dir" | while read -r p; do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"; done | head -1; }
    victim=$(rank_of 1)
    waiter=$(rank_of 0)
    [ -n "$victim" ]
    [ -n "$waiter" ]
    kill -STOP "$victim"
    sleep 0.5                        # rank 0 now waits for rank 1 in a collective
    kill -TERM "$waiter"
    wait_until 100 grep -q "rank 0: stopped by signal 15 while waiting for its peers (MPI" "$BATS_TEST_TMPDIR/err"
    kill -KILL "$victim" 2>/dev/null || [ $? -eq 1 ] # cleanup: mpirun may have ended it already
    status=0
    wait "$job" || status=$?
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]            # ended, not by our 120 s timeout
}
