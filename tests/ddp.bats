#!/usr/bin/env bats
# Data-parallel training with 2 CPU worker processes and the torchrun-style
# launcher: identical parameters on every rank, evaluation counted once, restarts
# after a crash that end bit-identical to an uninterrupted run, a crash loop that
# gives up naming the rank, a stopped worker that cannot hang the job, and SIGTERM
# to the launcher that leaves a snapshot and no process behind.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

BIN=${BIN:-$BATS_TEST_DIRNAME/../bin}

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    "$BIN/cifar-synth" "$DATA" --train 384 --test 100 --size 16 --seed 5 >/dev/null
    "$BIN/cifar-prep" --quiet "$DATA" >/dev/null
    export LMDB="$DATA/cifar10.lmdb"
}

data_checksum() { head -c 65536 "$1" | grep -ao '"data_checksum":"[0-9a-f]*"'; }

ddp() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" "$@" "$LMDB"
}

# Processes whose command line mentions this test's run folder.
leftover_processes() { pgrep -f "$BATS_TEST_TMPDIR" || true; }

@test "2 workers: identical parameters on both ranks after every step" {
    mkdir -p "$BATS_TEST_TMPDIR/h"
    CIFAR_TEST_PARAM_HASH_DIR="$BATS_TEST_TMPDIR/h" ddp "$BATS_TEST_TMPDIR/run" --epochs 2 >/dev/null
    [ "$(wc -l < "$BATS_TEST_TMPDIR/h/rank-0.txt")" -eq 12 ]  # 384 / 2 / 32 = 6 steps x 2 epochs
    diff "$BATS_TEST_TMPDIR/h/rank-0.txt" "$BATS_TEST_TMPDIR/h/rank-1.txt"
}

@test "2 workers: metrics say so, and the test accuracy equals cifar-eval's on the final snapshot" {
    final=$(ddp "$BATS_TEST_TMPDIR/run" --epochs 3 | tail -1)
    last=$(tail -1 "$BATS_TEST_TMPDIR/run/metrics.jsonl")
    [[ "$last" == *'"world_size":2'* ]]
    [[ "$last" == *'"restarts":0'* ]]
    acc=$(echo "$last" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
    evacc=$("$BIN/cifar-eval" --quiet --json "$final" | sed 's/.*"accuracy":\([0-9.]*\).*/\1/')
    echo "train loop $acc, cifar-eval $evacc"
    awk -v a="$acc" -v b="$evacc" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }'
}

@test "a worker SIGKILLed mid-run: one restart, final weights equal an uninterrupted run's" {
    ref=$(ddp "$BATS_TEST_TMPDIR/ref" --epochs 4 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/crash"
    step=$(( (RANDOM % 20) + 3 ))
    run --separate-stderr env CIFAR_TEST_DIE_AFTER_STEPS=$step CIFAR_TEST_DIE_RANK=1 \
        "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" \
        --epochs 4 --save-every 1 "$LMDB"
    assert_success
    [[ "$stderr" == *"rank 1"*"SIGKILL"* ]] || { echo "$stderr"; false; }
    [ "$(data_checksum "${lines[-1]}")" = "$(data_checksum "$ref")" ]
    grep -q '"restarts":1' "$dir/metrics.jsonl"
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 4 ]
    [ -z "$(leftover_processes)" ]
}

@test "a worker killed from outside at a random moment: the group restarts and ends identical" {
    ref=$(ddp "$BATS_TEST_TMPDIR/ref" --epochs 5 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/crash"
    "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" \
        --epochs 5 --save-every 1 "$LMDB" > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" &
    launcher=$!
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 1.2 }')"
    victim=$(pgrep -P "$launcher" | shuf -n 1 || true)
    [ -n "$victim" ] && kill -9 "$victim" || true
    wait "$launcher"
    [ "$(data_checksum "$(tail -1 "$BATS_TEST_TMPDIR/out")")" = "$(data_checksum "$ref")" ]
    [ -z "$(leftover_processes)" ]
}

@test "a worker that always crashes: max-restarts+1 attempts, then exit 1 naming rank and signal" {
    run --separate-stderr env CIFAR_TEST_DIE_AFTER_STEPS=2 CIFAR_TEST_DIE_RANK=1 CIFAR_TEST_DIE_ATTEMPTS=100 \
        "$BIN/cifar-train" --quiet --nproc-per-node 2 --max-restarts 2 --threads 1 --batch-size 32 \
        --run-dir "$BATS_TEST_TMPDIR/run" --epochs 2 "$LMDB"
    assert_failure 1
    echo "$stderr"
    [ "$(echo "$stderr" | grep -c 'restarting the group')" -eq 2 ]
    [[ "$stderr" == *"rank 1"*"SIGKILL"* ]]
    [[ "$stderr" == *"3 attempts"* ]]
    [ -z "$(leftover_processes)" ]
}

@test "a stopped (SIGSTOP) worker does not hang the job past the collective timeout" {
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_COMM_TIMEOUT=3 "$BIN/cifar-train" --quiet --nproc-per-node 2 --max-restarts 0 --threads 1 \
        --batch-size 32 --run-dir "$dir" --epochs 50 "$LMDB" > /dev/null 2> "$BATS_TEST_TMPDIR/err" &
    launcher=$!
    for _ in $(seq 50); do [ "$(pgrep -P "$launcher" | wc -l)" -eq 2 ] && break; sleep 0.1; done
    sleep 0.5
    victim=$(pgrep -P "$launcher" | tail -1)
    kill -STOP "$victim"
    start=$(date +%s)
    status=0
    wait "$launcher" || status=$?   # not `run wait`: run's subshell cannot wait for our child
    elapsed=$(( $(date +%s) - start ))
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -eq 1 ]
    [ "$elapsed" -lt 30 ]
    grep -q "timed out" "$BATS_TEST_TMPDIR/err"
    [ -z "$(leftover_processes)" ]
}

@test "SIGTERM to the launcher: a snapshot is written, nothing is left running, rerun resumes" {
    dir="$BATS_TEST_TMPDIR/run"
    "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" \
        --epochs 40 --save-every 100 "$LMDB" > /dev/null 2> "$BATS_TEST_TMPDIR/err" &
    launcher=$!
    for _ in $(seq 100); do [ -s "$dir/metrics.jsonl" ] && break; sleep 0.1; done
    kill -TERM "$launcher"
    status=0
    wait "$launcher" || status=$?
    [ "$status" -eq 143 ]
    [ -z "$(leftover_processes)" ]
    ls "$dir"/snapshot-*.safetensors
    run --separate-stderr ddp "$dir" --epochs 2 --save-every 100
    assert_success
    [[ "$stderr" == *"resuming from"* ]] || [ -z "$stderr" ]
    [ -f "${lines[-1]}" ]
}
