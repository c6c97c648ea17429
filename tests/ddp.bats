#!/usr/bin/env bats
# Data-parallel training with 2 CPU worker processes and the torchrun-style
# launcher: identical parameters on every rank, evaluation counted once, restarts
# after a crash that end bit-identical to an uninterrupted run, a crash loop that
# gives up naming the rank, a permanent failure that is not retried, a stopped
# worker that cannot hang the job, SIGTERM to the launcher that leaves a snapshot
# and no process behind, and the run folder's lock held across restarts.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 384 --test 100 --size 16 --seed 5
    export LMDB="$DATA/cifar10.lmdb"
}

ddp() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" "$@" "$LMDB"
}

# The same in the background, with $! the launcher itself (not a subshell): stdout in
# $BATS_TEST_TMPDIR/out, stderr in $BATS_TEST_TMPDIR/err.
ddp_bg() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" "$@" "$LMDB" \
        > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" &
}

# The launcher gave up at once on a permanent failure: exit 1, the worker's reason
# printed once, one attempt, nothing left running.
assert_gave_up_at_once() { # reason
    echo "$stderr"
    assert_failure 1
    [ "$(echo "$stderr" | grep -c -- "$1")" -eq 1 ]
    [ "$(echo "$stderr" | grep -c 'giving up at once: rank [0-9]* exited with code 3')" -eq 1 ]
    [[ "$stderr" != *"restarting"* ]]
    [ -z "$(leftover_processes)" ]
}

# The workers of a launcher (its children).
workers_of() { pgrep -P "$1" || [ $? -eq 1 ]; }
two_workers() { [ "$(workers_of "$1" | wc -l)" -eq 2 ]; }

@test "2 workers: identical parameters on both ranks after every step" {
    use_test_build
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
    use_test_build
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
    ref=$(ddp "$BATS_TEST_TMPDIR/ref" --epochs 20 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/crash"
    ddp_bg "$dir" --epochs 20 --save-every 1
    launcher=$!
    random_moment "$dir" 14   # at least 6 epochs before the end: the workers still run
    victim=$(workers_of "$launcher" | shuf -n 1)
    [ -n "$victim" ] || { echo "no worker left to kill"; false; }
    kill -9 "$victim"
    status=0
    wait "$launcher" || status=$?
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -eq 0 ]
    grep -q "(pid $victim) killed by SIGKILL" "$BATS_TEST_TMPDIR/err"
    grep -q "restarting the group (1/3)" "$BATS_TEST_TMPDIR/err"
    grep -q '"restarts":1' "$dir/metrics.jsonl"
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 20 ]
    [ "$(data_checksum "$(tail -1 "$BATS_TEST_TMPDIR/out")")" = "$(data_checksum "$ref")" ]
    [ -z "$(leftover_processes)" ]
}

@test "a worker that always crashes: max-restarts+1 attempts, then exit 1 naming rank and signal" {
    use_test_build
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

@test "a permanent failure under the launcher (a snapshot of another model): one attempt, the reason once" {
    dir="$BATS_TEST_TMPDIR/run"
    ddp "$dir" --epochs 1 >/dev/null
    small_model "$BATS_TEST_TMPDIR/small.json"
    run --separate-stderr ddp "$dir" --epochs 2 --model "$BATS_TEST_TMPDIR/small.json"
    assert_gave_up_at_once 'another model or dataset'
}

@test "the launcher holds the run folder's lock across restarts; a second launcher is refused" {
    use_test_build
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_TEST_DIE_AFTER_STEPS=8 CIFAR_TEST_DIE_RANK=0 ddp_bg "$dir" --epochs 30 --save-every 1
    launcher=$!
    wait_until 100 grep -q "^pid $launcher on host " "$dir/lock"
    # after the restart (the second group's rank 0 runs without taking the lock itself)
    wait_until 300 grep -q "restarting the group" "$BATS_TEST_TMPDIR/err"
    run --separate-stderr ddp "$dir" --epochs 30 --save-every 1
    kill -0 "$launcher"   # the refusal came while the job ran
    assert_failure 1
    [[ "$stderr" == *"$dir: the run folder is in use by another cifar-train (pid $launcher on host "* ]]
    status=0
    wait "$launcher" || status=$?
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -eq 0 ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 30 ]
    [ -z "$(leftover_processes)" ]
}

@test "a SIGKILLed launcher: its workers stop, nothing is left running, the rerun resumes" {
    dir="$BATS_TEST_TMPDIR/run"
    ddp_bg "$dir" --epochs 40 --save-every 1
    launcher=$!
    wait_until 300 test -s "$dir/metrics.jsonl"
    kill -9 "$launcher"
    status=0
    wait "$launcher" || status=$?
    [ "$status" -eq 137 ]
    # the workers get SIGTERM (PR_SET_PDEATHSIG), snapshot and exit; then the lock is free
    wait_until 300 no_leftover_processes
    ls "$dir"/snapshot-*.safetensors
    run --separate-stderr "$BIN/cifar-train" --nproc-per-node 2 --threads 1 --batch-size 32 \
        --run-dir "$dir" --epochs 3 --save-every 1 "$LMDB"
    echo "$stderr"
    assert_success
    [[ "$stderr" == *"resuming from"* ]]
    [ -f "${lines[-1]}" ]
}

@test "a stopped (SIGSTOP) worker does not hang the job past the collective timeout" {
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_COMM_TIMEOUT=3 ddp_bg "$dir" --max-restarts 0 --epochs 50
    launcher=$!
    wait_until 50 two_workers "$launcher"
    sleep 0.5
    victim=$(workers_of "$launcher" | tail -1)
    victim_env=$(tr '\0' '\n' < "/proc/$victim/environ")
    kill -STOP "$victim"
    start=$(date +%s)
    status=0
    wait "$launcher" || status=$?   # not `run wait`: run's subshell cannot wait for our child
    elapsed=$(( $(date +%s) - start ))
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -eq 1 ]
    [ "$elapsed" -lt 30 ]
    grep -q "timed out" "$BATS_TEST_TMPDIR/err"
    # The message names who: rank, pid, host, and the last step it reported.
    rank=$(echo "$victim_env" | sed -n 's/^RANK=//p')
    grep -q "waiting for rank $rank (pid $victim on host $(hostname), last step [0-9]*)" "$BATS_TEST_TMPDIR/err"
    [ -z "$(leftover_processes)" ]
}

@test "a rank 20% slower than the median two epochs running is named; metrics.jsonl has rank_seconds and slowest_rank" {
    use_test_build
    dir="$BATS_TEST_TMPDIR/run"
    # rank 1 sleeps 100 ms after each of its 6 steps an epoch: 0.6 s of "compute"
    # against a few ms for rank 0, far beyond 20% on any machine
    CIFAR_TEST_SLOW_RANK=1 run --separate-stderr \
        "$BIN/cifar-train" --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" --epochs 3 "$LMDB"
    assert_success
    for e in 1 2 3; do
        line=$(sed -n "${e}p" "$dir/metrics.jsonl")
        [[ "$line" == *'"slowest_rank":1,'* ]] || { echo "$line"; false; }
        [[ "$line" =~ \"rank_seconds\":\[[0-9.]+,[0-9.]+\] ]] || { echo "$line"; false; }
    done
    echo "$stderr" | grep "straggler"
    # named from the second slow epoch on, not after the first
    [ "$(echo "$stderr" | grep -c "straggler: rank 1's steps took .* for [23] epochs running")" -eq 2 ]
    [ "$(echo "$stderr" | grep -c "straggler")" -eq 2 ]
}

@test "2 workers, --save-interval on rank 0's clock: both ranks take the snapshot at the same step, it resumes exactly" {
    use_test_build
    ref=$(ddp "$BATS_TEST_TMPDIR/ref" --epochs 2 --save-every 10 | tail -1)
    dir="$BATS_TEST_TMPDIR/run"
    # Rank 0's test clock says 1 s per step; rank 1 never reads a clock: it learns the
    # step from rank 0 in the next collective.
    CIFAR_TEST_STEP_SECONDS=1 CIFAR_COMM_TIMEOUT=30 ddp "$dir" --epochs 2 --save-every 10 \
        --save-interval 4s --keep 0 --max-restarts 0 > /dev/null
    [ -f "$dir/snapshot-000004.safetensors" ]
    # Both ranks took part in the same collectives (the snapshot's broadcast included):
    # their progress boards end with the same count.
    entered() { grep -o 'step=[0-9]* entered=[0-9]*' "$dir/ranks/rank-$1"; }
    [ "$(entered 0)" = "$(entered 1)" ] || { entered 0; entered 1; false; }
    [ "$(data_checksum "$dir/snapshot-000012.safetensors")" = "$(data_checksum "$ref")" ]
    copy="$BATS_TEST_TMPDIR/from4"
    mkdir "$copy"
    cp "$dir/snapshot-000004.safetensors" "$dir/metrics.jsonl" "$copy/"
    resumed=$(ddp "$copy" --epochs 2 --save-every 10 | tail -1)
    [ "$(data_checksum "$resumed")" = "$(data_checksum "$ref")" ]
}

@test "SIGTERM or SIGUSR1 to the launcher: passed on, a snapshot is written, 128+N, nothing is left running, rerun resumes" {
    for sig in TERM:143 USR1:138; do
        dir="$BATS_TEST_TMPDIR/run-${sig%%:*}"
        ddp_bg "$dir" --epochs 40 --save-every 100
        launcher=$!
        wait_until 100 test -s "$dir/metrics.jsonl"
        kill -"${sig%%:*}" "$launcher"
        status=0
        wait "$launcher" || status=$?
        [ "$status" -eq "${sig##*:}" ] || { echo "SIG${sig%%:*}: status $status"; cat "$BATS_TEST_TMPDIR/err"; false; }
        [ -z "$(leftover_processes)" ]
        ls "$dir"/snapshot-*.safetensors
        run --separate-stderr ddp "$dir" --epochs 2 --save-every 100
        assert_success
        [[ "$stderr" == *"resuming from"* ]] || [ -z "$stderr" ]
        [ -f "${lines[-1]}" ]
    done
}

@test "--log-dir: LOG_DIR/attempt_K/rank_R.log per worker and attempt, timestamped; --local-ranks-filter and --redirects choose what the terminal shows" {
    use_test_build
    dir="$BATS_TEST_TMPDIR/run"
    logs="$BATS_TEST_TMPDIR/logs"
    # rank 1 is killed after step 3 of the first attempt: a second attempt follows
    CIFAR_TEST_DIE_AFTER_STEPS=3 CIFAR_TEST_DIE_RANK=1 run --separate-stderr \
        "$BIN/cifar-train" --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" --epochs 2 \
        --log-dir "$logs" --local-ranks-filter 1 "$LMDB"
    assert_success
    [ "${lines[-1]}" = "$dir/snapshot-000012.safetensors" ]   # stdout still ends with the path
    for f in attempt_0/rank_0.log attempt_0/rank_1.log attempt_1/rank_0.log attempt_1/rank_1.log; do
        [ -s "$logs/$f" ] || { ls -R "$logs"; false; }
        # every line: [UTC time rank R out|err]
        [ -z "$(grep -v '^\[20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]\{3\}Z rank [01] \(out\|err\)\] ' "$logs/$f")" ]
    done
    grep -q "rank 0 err\] cifar-train: training " "$logs/attempt_0/rank_0.log"
    grep -q "rank 0 out\] $dir/snapshot-000012.safetensors" "$logs/attempt_1/rank_0.log"
    grep -q "rank 0 err\] cifar-train: training " "$logs/attempt_1/rank_0.log"
    grep -q "rank 1 err\] cifar-train: " "$logs/attempt_1/rank_1.log"
    # the terminal: rank 1's lines, marked; none of rank 0's
    echo "$stderr" | grep -q '^\[rank 1\] cifar-train: '
    [ -z "$(echo "$stderr" | grep '^\[rank 0\]')" ]
    # --redirects 2: the workers' stderr only in the files
    run --separate-stderr "$BIN/cifar-train" --nproc-per-node 2 --threads 1 --batch-size 32 \
        --run-dir "$BATS_TEST_TMPDIR/run2" --epochs 1 --log-dir "$BATS_TEST_TMPDIR/logs2" --redirects 2 "$LMDB"
    assert_success
    [ -z "$(echo "$stderr" | grep '^\[rank')" ]
    grep -q "rank 1 err\] cifar-train: " "$BATS_TEST_TMPDIR/logs2/attempt_0/rank_1.log"
    # bad values: exit 2
    run "$BIN/cifar-train" --nproc-per-node 2 --redirects 3 "$LMDB"
    assert_failure 2
    assert_output --partial "--redirects needs --log-dir"
    run "$BIN/cifar-train" --nproc-per-node 2 --local-ranks-filter 5 "$LMDB"
    assert_failure 2
    assert_output --partial "expected local ranks in 0..1"
}

@test "a torchrun-style CPU rank of a job spanning nodes with --comm shm: the permanent status, and why" {
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29593 \
        run --separate-stderr timeout 60 "$BIN/cifar-train" --quiet --device cpu --comm shm --epochs 1 \
        --run-dir "$BATS_TEST_TMPDIR/run" "$LMDB"
    assert_failure 3
    [[ "$stderr" == *"CPU workers on several nodes: the shared-memory communicator needs every rank on one machine (world size 2, 1 on this node)"* ]] || { echo "$stderr"; false; }
    [[ "$stderr" == *"--comm gloo (their default)"*"mpirun or srun --mpi=pmix"* ]]
}

# The worker of the launcher whose RANK is r.
worker_rank() { # launcher r
    local p
    for p in $(workers_of "$1"); do
        if tr '\0' '\n' < "/proc/$p/environ" | grep -qx "RANK=$2"; then echo "$p"; return 0; fi
    done
    return 1
}

@test "SIGTERM to a rank waiting for a stopped peer ends the wait at once (exit 143), not after the timeout" {
    dir="$BATS_TEST_TMPDIR/run"
    CIFAR_COMM_TIMEOUT=300 ddp_bg "$dir" --max-restarts 0 --epochs 50
    launcher=$!
    wait_until 50 two_workers "$launcher"
    sleep 0.5
    rank0=$(worker_rank "$launcher" 0)
    rank1=$(worker_rank "$launcher" 1)
    kill -STOP "$rank1"
    sleep 0.5                       # rank 0 now waits for rank 1 in a collective
    kill -TERM "$rank0"
    # Within 10 s (the grace is half a second; the collective timeout is 300 s).
    wait_until 100 grep -q "rank 0: stopped by signal 15 while waiting for its peers" "$BATS_TEST_TMPDIR/err"
    kill -CONT "$rank1"
    status=0
    wait "$launcher" || status=$?
    cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -ne 0 ]
    [ -z "$(leftover_processes)" ]
}

# A port free on 127.0.0.1 right now.
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

@test "--rdzv-endpoint on one node: a worker SIGKILLed starts round 1 from the snapshot, identical weights" {
    use_test_build
    ref=$(ddp "$BATS_TEST_TMPDIR/ref" --epochs 4 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/crash"
    run --separate-stderr env CIFAR_TEST_DIE_AFTER_STEPS=7 CIFAR_TEST_DIE_RANK=1 \
        "$BIN/cifar-train" --nproc-per-node 2 --threads 1 --batch-size 32 --run-dir "$dir" \
        --epochs 4 --save-every 1 --rdzv-endpoint "127.0.0.1:$(free_port)" --rdzv-id ddp-bats \
        --rdzv-timeout 1 --max-restarts 1 "$LMDB"
    echo "$stderr"
    assert_success
    [[ "$stderr" == *"serving the rendezvous store at 127.0.0.1:"* ]]
    [[ "$stderr" == *"round 0 stops: rank 1 (pid "*") on node 0 ("*") killed by SIGKILL"* ]]
    [[ "$stderr" == *"round 1: node 0 of 1, world size 2"* ]]
    [ "$(data_checksum "${lines[-1]}")" = "$(data_checksum "$ref")" ]
    grep -q '"restarts":1' "$dir/metrics.jsonl"
    [ -z "$(leftover_processes)" ]
}

@test "a torchrun option the launcher does not take is refused in one line naming it" {
    run --separate-stderr "$BIN/cifar-train" --nproc-per-node 2 --monitor-interval 5 "$LMDB"
    assert_failure 2
    [ "$(echo "$stderr" | wc -l)" -eq 1 ]
    [[ "$stderr" == *"--monitor-interval: a torchrun option cifar-train does not take"* ]]
}

metrics_lines() { [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ]; }

@test "two agents on 127.0.0.1 (--nnodes 1:2, Gloo): one node killed mid-run, the other finishes alone in round 1" {
    dir="$BATS_TEST_TMPDIR/run"
    port=$(free_port)
    agent() { # name
        "$BIN/cifar-train" --nproc-per-node 1 --threads 1 --batch-size 32 --device cpu --run-dir "$dir" \
            --epochs 40 --save-every 1 --nnodes 1:2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id ddp-two \
            --rdzv-timeout 5 "$LMDB" > "$BATS_TEST_TMPDIR/$1.out" 2> "$BATS_TEST_TMPDIR/$1.err" &
    }
    # --rdzv-timeout 5: round 0 closes as soon as both are in (MAX), and b has 5 s to
    # come on a loaded machine before a round of a alone would start without it
    agent a
    a=$!
    wait_until 100 grep -q "serving the rendezvous store" "$BATS_TEST_TMPDIR/a.err"
    agent b
    b=$!
    wait_until 300 metrics_lines "$dir" 2
    pkill -KILL -P "$b"     # the whole node: its worker, then its agent
    kill -KILL "$b"
    status=0
    wait "$a" || status=$?
    cat "$BATS_TEST_TMPDIR/a.err"
    [ "$status" -eq 0 ]
    grep -q "round 0: node 0 of 2, world size 2" "$BATS_TEST_TMPDIR/a.err"
    # whichever the store heard first: node 1's closed connection, or rank 0's failed collective
    grep -qE "round 0 stops: (node 1 \(.*\) lost|rank 0 \(pid [0-9]+\) on node 0)" "$BATS_TEST_TMPDIR/a.err"
    grep -q "round 1: node 0 of 1, world size 1" "$BATS_TEST_TMPDIR/a.err"
    head -1 "$dir/metrics.jsonl" | grep -q '"world_size":2,.*"comm":"gloo"'
    tail -1 "$dir/metrics.jsonl" | grep -q '"world_size":1,.*"restarts":1'
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 40 ]
    [ -z "$(leftover_processes)" ]
}
