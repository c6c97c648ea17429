#!/usr/bin/env bats
# What a new user meets in the first hour, each with the answer a careful tool
# gives: a closed log pipe or terminal, a stopped training in a pipeline, resuming
# with other options, --epochs below a finished run's, a misspelt --model key, the
# wrong kind of input to each command, --version, the environment and exit
# statuses in --help, more threads than cores, and what several ranks print.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 256 --test 64 --size 12 --seed 5
    export LMDB="$DATA/cifar10.lmdb"
    export MODEL="$BATS_FILE_TMPDIR/small.json"
    small_model "$MODEL"
}

# A small training (4 steps an epoch); extra args go before the dataset.
train() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --batch-size 64 --threads 1 --model "$MODEL" --run-dir "$dir" "$@" "$LMDB"
}

@test "--version on every command: one line, exit 0" {
    for c in cifar-prep cifar-train cifar-eval cifar-predict cifar-synth cifar-unpack; do
        run --separate-stderr "$BIN/$c" --version
        assert_success
        [ "${#lines[@]}" -eq 1 ]
        [[ "${lines[0]}" =~ ^$c\ \(cifar\)\ [^\ ]+$ ]] || fail "$c --version: ${lines[0]}"
        [ -z "$stderr" ]
        run "$BIN/$c" --help
        assert_output --partial "--version"
    done
}

@test "a misspelt key in the --model file is an error naming it and the known keys" {
    echo '{"n_channel":[8,16],"bottlenecks":null,"n_blocks":[1,1]}' > "$BATS_TEST_TMPDIR/typo.json"
    run --separate-stderr "$BIN/cifar-train" --quiet --epochs 1 --batch-size 64 \
        --model "$BATS_TEST_TMPDIR/typo.json" --run-dir "$BATS_TEST_TMPDIR/run" "$LMDB"
    assert_failure 1
    [ -z "$output" ]
    [[ "$stderr" == *"typo.json: unknown key \"n_channel\" (the keys are n_channels, bottlenecks, n_blocks,"* ]] ||
        fail "$stderr"
    [ ! -e "$BATS_TEST_TMPDIR/run/metrics.jsonl" ]
}

@test "a training stopped by a signal prints no path: the next stage fails saying the previous one stopped" {
    use_test_build
    dir="$BATS_TEST_TMPDIR/run"
    # The signal arrives in step 6 of 12 (mid-epoch 2), through the real handler.
    run bash -c "CIFAR_TEST_SIGINT_AFTER_STEPS=6 '$BIN/cifar-train' --quiet --epochs 3 --batch-size 64 \
        --threads 1 --model '$MODEL' --run-dir '$dir' '$LMDB' 2>'$BATS_TEST_TMPDIR/train.err' |
        '$BIN/cifar-eval' --quiet"
    assert_failure
    assert_output --partial "cifar-eval: no SNAPSHOT given, and the previous stage of the pipeline printed none"
    assert_output --partial "failed or was stopped"
    refute_output --partial "accuracy:"
    # cifar-train kept a snapshot and said on stderr what it is and what to rerun
    run cat "$BATS_TEST_TMPDIR/train.err"
    assert_output --partial "stopped by signal 2 in epoch 2/3 (step 2 of 4): snapshot $dir/snapshot-000006.safetensors written"
    assert_output --partial "rerun the same command to resume"
    [ -f "$dir/snapshot-000006.safetensors" ]
    # alone, its stdout is empty and its status 130
    CIFAR_TEST_SIGINT_AFTER_STEPS=2 run --separate-stderr train "$BATS_TEST_TMPDIR/alone" --quiet --epochs 3
    assert_failure 130
    [ -z "$output" ]
    # the rerun finishes and prints the final snapshot
    run --separate-stderr train "$dir" --quiet --epochs 3
    assert_success
    [ "${lines[-1]}" = "$dir/snapshot-000012.safetensors" ]
}

@test "a closed log pipe does not kill training: it finishes, with its snapshots" {
    dir="$BATS_TEST_TMPDIR/run"
    # head exits after the first line; every later write to the pipe fails
    run bash -c "'$BIN/cifar-train' --epochs 3 --save-every 1 --batch-size 64 --threads 1 --model '$MODEL' \
        --run-dir '$dir' '$LMDB' 2>&1 | head -1 >/dev/null; echo \"train: \${PIPESTATUS[0]}\""
    assert_output "train: 0"
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 3 ]
    [ -f "$dir/snapshot-000012.safetensors" ]
    # stdout's reader gone before the end (a pipe whose read end is closed before the
    # start): the path goes to stderr instead, exit 0
    ERR="$BATS_TEST_TMPDIR/err" run python3 -c 'import os, subprocess, sys
r, w = os.pipe()
os.close(r)
print("train:", subprocess.run(sys.argv[1:], stdout=w, stderr=open(os.environ["ERR"], "w")).returncode)' \
        "$BIN/cifar-train" --quiet --epochs 1 --batch-size 64 --threads 1 --model "$MODEL" \
        --run-dir "$BATS_TEST_TMPDIR/run2" "$LMDB"
    assert_output "train: 0"
    run cat "$BATS_TEST_TMPDIR/err"
    assert_output "cifar-train: warning: cannot print the final snapshot's path on stdout (Broken pipe): it is $BATS_TEST_TMPDIR/run2/snapshot-000004.safetensors"
}

@test "SIGHUP (a closed terminal) writes a snapshot and stops, as SIGTERM does" {
    dir="$BATS_TEST_TMPDIR/run"
    "$BIN/cifar-train" --quiet --epochs 200 --batch-size 64 --threads 1 --model "$MODEL" --run-dir "$dir" \
        "$LMDB" > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" &
    pid=$!   # cifar-train itself, not a subshell
    wait_until 600 epochs_done "$dir" 1
    kill -HUP "$pid"
    status=0
    wait "$pid" || status=$?
    [ "$status" -eq 129 ] || { cat "$BATS_TEST_TMPDIR/err"; false; }
    [ ! -s "$BATS_TEST_TMPDIR/out" ]
    grep -q "stopped by signal 1" "$BATS_TEST_TMPDIR/err"
    ls "$dir"/snapshot-*.safetensors
}

@test "--epochs below a finished run's: says what happened, exits 0 and prints the snapshot" {
    dir="$BATS_TEST_TMPDIR/run"
    final=$(train "$dir" --quiet --epochs 3 | tail -1)
    run --separate-stderr train "$dir" --epochs 2
    assert_success
    [ "${lines[-1]}" = "$final" ]
    [[ "$stderr" == *"already trained for 3 epochs, more than --epochs 2 asks: nothing to do"* ]] || fail "$stderr"
    [[ "$stderr" != *"already trained for 2 epochs"* ]]
    run --separate-stderr train "$dir" --epochs 3
    assert_success
    [ "${lines[-1]}" = "$final" ]
    [[ "$stderr" == *"already trained for 3 epochs (--epochs 3): nothing to do"* ]] || fail "$stderr"
}

@test "more processes x threads than cores: one warning" {
    cores=$(nproc)
    run --separate-stderr train "$BATS_TEST_TMPDIR/one" --epochs 1 --threads $((cores + 1))
    assert_success
    [ "$(grep -c "more threads than cores" <<< "$stderr")" -eq 1 ] || fail "$stderr"
    [[ "$stderr" == *"1 process x $((cores + 1)) threads = $((cores + 1)) threads on $cores cores"* ]] || fail "$stderr"
    # two workers of the launcher: still one line
    run --separate-stderr train "$BATS_TEST_TMPDIR/two" --epochs 1 --nproc-per-node 2 --device cpu --threads "$cores"
    assert_success
    [ "$(grep -c "more threads than cores" <<< "$stderr")" -eq 1 ] || fail "$stderr"
    # within the cores: none
    run --separate-stderr train "$BATS_TEST_TMPDIR/fits" --epochs 1 --threads 1
    assert_success
    [[ "$stderr" != *"more threads than cores"* ]]
    # cifar-eval too
    run --separate-stderr "$BIN/cifar-eval" --threads $((cores + 1)) "$BATS_TEST_TMPDIR/fits"
    assert_success
    [ "$(grep -c "more threads than cores" <<< "$stderr")" -eq 1 ] || fail "$stderr"
}

# The CIFAR_ variables the sources read that are not for users: set by the
# launcher for its workers, or by the tests. (The test build's CIFAR_TEST_* are in
# tests/train_hooks.c, not in the shipped sources.)
internal_variable() {
    case $1 in
    CIFAR_FAILURE_NOTES | CIFAR_RESTART_COUNT | CIFAR_RUN_DIR_LOCKED_BY | CIFAR_RUN_ID) return 0 ;;
    CIFAR_LOG_EVERY_RANK) return 0 ;;
    CIFAR_COMM_SLOT_BYTES) return 0 ;;
    esac
    return 1
}

@test "every environment variable a user may set is in a command's --help and in the docs" {
    repo=$(cd "$BATS_TEST_DIRNAME/.." && pwd)
    help=$("$BIN/cifar-train" --help; "$BIN/cifar-eval" --help)
    vars=$(grep -rhoE '"CIFAR_[A-Z0-9_]+"' "$repo/shared" "$repo/train" "$repo/eval" "$repo/prep" \
        "$repo/pipelines" | tr -d '"' | sort -u)
    [ -n "$vars" ]
    for v in $vars; do
        internal_variable "$v" && continue
        grep -qF -- "$v" <<< "$help" || fail "$v is read by the sources but in no --help"
        cat "$repo/README.md" "$repo"/docs/*.md | grep -qF -- "$v" || fail "$v is in no document"
    done
    for v in RANK WORLD_SIZE MASTER_ADDR SLURM_PROCID OMPI_COMM_WORLD_ OMP_WAIT_POLICY; do
        grep -qF -- "$v" <<< "$help" || fail "$v is in no --help"
    done
    # the man pages are made from --help (make install): they list them too
    man=$(help2man --no-info --version-string=test "$BIN/cifar-train"; help2man --no-info --version-string=test "$BIN/cifar-eval")
    for v in $vars; do
        internal_variable "$v" && continue
        grep -qF -- "$v" <<< "$man" || fail "$v is in no man page"
    done
}

@test "cifar-eval --help lists its exit statuses" {
    run "$BIN/cifar-eval" --help
    assert_success
    assert_output --partial "Exit status: 0 the report is printed; 1 failure"
    assert_output --partial "2 bad usage"
}

@test "cifar-eval given a dataset or the seed's layout names what it got and what it expects" {
    run --separate-stderr "$BIN/cifar-eval" --quiet "$LMDB"
    assert_failure 1
    [ -z "$output" ]
    [ "$stderr" = "cifar-eval: $LMDB: this is a cifar-prep dataset (LMDB), not a snapshot (safetensors) ---> HINT: give a snapshot (RUN_DIR/snapshot-*.safetensors) or a run folder; the dataset goes with --data" ]
    run --separate-stderr "$BIN/cifar-eval" --quiet "$DATA"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $DATA: this is a folder of images in the seed's layout"*"not a snapshot"*"run cifar-prep and cifar-train first"* ]] || fail "$stderr"
    # --data given a snapshot
    snap=$(train "$BATS_TEST_TMPDIR/run" --quiet --epochs 1 | tail -1)
    run --separate-stderr "$BIN/cifar-eval" --quiet --data "$snap" "$snap"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $snap: this is a snapshot (safetensors), not a cifar-prep dataset (LMDB)"* ]] || fail "$stderr"
}

@test "cifar-eval RUN_DIR evaluates the run's newest valid snapshot, and says which" {
    dir="$BATS_TEST_TMPDIR/run"
    final=$(train "$dir" --quiet --epochs 2 --save-every 1 | tail -1)
    run --separate-stderr "$BIN/cifar-eval" --json "$dir"
    assert_success
    [[ "$output" == *"\"snapshot\":\"$final\""* ]] || fail "$output"
    [[ "$stderr" == *"$dir: a run folder: evaluating $final"* ]] || fail "$stderr"
    expected=$("$BIN/cifar-eval" --quiet --json "$final")
    [ "$output" = "$expected" ]
    # a damaged newest snapshot is named and skipped: the one before is evaluated
    printf 'garbage' | dd of="$final" bs=1 seek=100 conv=notrunc status=none
    run --separate-stderr "$BIN/cifar-eval" --quiet --json "$dir"
    assert_success
    [[ "$output" == *"\"snapshot\":\"$dir/snapshot-000004.safetensors\""* ]] || fail "$output"
    [[ "$stderr" == *"$final: skipping this snapshot"* ]] || fail "$stderr"
    # a run folder with no snapshot yet
    mkdir "$BATS_TEST_TMPDIR/empty"
    touch "$BATS_TEST_TMPDIR/empty/metrics.jsonl"
    run --separate-stderr "$BIN/cifar-eval" --quiet "$BATS_TEST_TMPDIR/empty"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $BATS_TEST_TMPDIR/empty: a folder without best.safetensors or a snapshot that loads"* ]] ||
        fail "$stderr"
}

@test "cifar-train given the seed's layout says to run cifar-prep first; cifar-prep given a dataset says so" {
    cp -r "$DATA" "$BATS_TEST_TMPDIR/seed"
    rm "$BATS_TEST_TMPDIR/seed/cifar10.lmdb"
    run --separate-stderr "$BIN/cifar-train" --quiet --epochs 1 --run-dir "$BATS_TEST_TMPDIR/run" "$BATS_TEST_TMPDIR/seed"
    assert_failure 1
    [[ "$stderr" == "cifar-train: $BATS_TEST_TMPDIR/seed: this is a folder of images in the seed's layout"*"not a cifar-prep dataset (LMDB) ---> HINT: run cifar-prep first: cifar-prep DATA_DIR | cifar-train"* ]] ||
        fail "$stderr"
    # with the dataset cifar-prep wrote inside it: that file is named
    run --separate-stderr "$BIN/cifar-train" --quiet --epochs 1 --run-dir "$BATS_TEST_TMPDIR/run" "$DATA"
    assert_failure 1
    [[ "$stderr" == *"its dataset is $DATA/cifar10.lmdb"* ]] || fail "$stderr"
    [ ! -e "$BATS_TEST_TMPDIR/run/metrics.jsonl" ]
    # and cifar-prep given its own output
    run --separate-stderr "$BIN/cifar-prep" --quiet "$LMDB"
    assert_failure 1
    [ "$stderr" = "cifar-prep: $LMDB: this is a cifar-prep dataset (LMDB), not a folder of images in the seed's layout (annotations/ and the image folders) ---> HINT: it is cifar-prep's output already: give it to cifar-train" ]
}

@test "resuming with other options says what changed, once; another model or dataset shape is refused" {
    use_test_build
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --quiet --epochs 1 > /dev/null
    run --separate-stderr train "$dir" --quiet --epochs 2 --batch-size 32 --lr 0.05 --schedule step \
        --nesterov --label-smoothing 0.1 --seed 7
    assert_success
    [ "$(grep -c "other settings" <<< "$stderr")" -eq 1 ] || fail "$stderr"
    [[ "$stderr" == *"resuming with other settings than the snapshot's: --batch-size 64 -> 32, --lr 0.1 -> 0.05, --nesterov off -> on, --schedule cosine -> step, --label-smoothing 0 -> 0.1, --seed 0 -> 7"* ]] ||
        fail "$stderr"
    # the same options again: nothing to say
    run --separate-stderr train "$dir" --quiet --epochs 3 --batch-size 32 --lr 0.05 --schedule step \
        --nesterov --label-smoothing 0.1 --seed 7
    assert_success
    [[ "$stderr" != *"other settings"* ]] || fail "$stderr"
    # a partial epoch resumed with another batch size restarts, rather than skip samples
    CIFAR_TEST_SIGINT_AFTER_STEPS=2 run train "$BATS_TEST_TMPDIR/part" --quiet --epochs 2
    assert_failure 130
    run --separate-stderr train "$BATS_TEST_TMPDIR/part" --quiet --epochs 2 --batch-size 32
    assert_success
    [[ "$stderr" == *"--batch-size 64 -> 32"* ]] || fail "$stderr"
    [[ "$stderr" == *"the epoch restarts"* ]] || fail "$stderr"
    [ "${lines[-1]}" = "$BATS_TEST_TMPDIR/part/snapshot-000016.safetensors" ]
    # what cannot change: the dataset's shape (and the model: train.bats)
    make_dataset "$BATS_TEST_TMPDIR/other" --train 128 --test 32 --size 8 --seed 5
    run --separate-stderr "$BIN/cifar-train" --quiet --epochs 3 --batch-size 64 --model "$MODEL" \
        --run-dir "$dir" "$BATS_TEST_TMPDIR/other/cifar10.lmdb"
    assert_failure 1
    [[ "$stderr" == *"the snapshot is of another model or dataset: the snapshot has data 12x12x3/10"*"this run has data 8x8x3/10"* ]] ||
        fail "$stderr"
}

@test "two ranks: a line the same on every rank once, a line of one rank prefixed with it" {
    cores=$(nproc)
    run --separate-stderr train "$BATS_TEST_TMPDIR/run" --epochs 1 --nproc-per-node 2 --device cpu --threads "$cores"
    assert_success
    # the same on both ranks: once, unprefixed
    [ "$(grep -c 'split "train": 256 records' <<< "$stderr")" -eq 1 ] || fail "$stderr"
    [ "$(grep -c '^cifar-train: training ' <<< "$stderr")" -eq 1 ] || fail "$stderr"
    [ "$(grep -c '^cifar-train: epoch 1/1: train loss' <<< "$stderr")" -eq 1 ] || fail "$stderr"
    # this node's own (local rank 0): named by its rank
    [[ "$stderr" == *"cifar-train: rank 0: warning: 2 processes x $cores threads"* ]] || fail "$stderr"
    # nothing else from a second rank
    [[ "$stderr" != *"rank 1:"* ]] || fail "$stderr"
    # ranks started by another launcher (torchrun's variables) given launcher options:
    # they are ignored, said once for the job
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout 120 "$BIN/cifar-train" --nproc-per-node 2 --device cpu --threads 1 --epochs 1 --batch-size 64 \
            --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/torchrun" "$LMDB" > "$BATS_TEST_TMPDIR/rank$r.out" 2>&1 &
    done
    wait
    [ "$(cat "$BATS_TEST_TMPDIR"/rank*.out | grep -c "launcher options ignored")" -eq 1 ]
    grep -q "launcher options ignored: these processes are already the 2 ranks of a job" "$BATS_TEST_TMPDIR/rank0.out"
    [ ! -s "$BATS_TEST_TMPDIR/rank1.out" ] || { cat "$BATS_TEST_TMPDIR/rank1.out"; false; }
    [ "$(tail -1 "$BATS_TEST_TMPDIR/rank0.out")" = "$BATS_TEST_TMPDIR/torchrun/snapshot-000002.safetensors" ]
}

@test "the progress line shows the whole run's ETA beside the epoch's" {
    run --separate-stderr train "$BATS_TEST_TMPDIR/run" --epochs 3
    assert_success
    # not a terminal: the line at each epoch's end (and one every 10 s)
    [ "$(grep -cE '^cifar-train: epoch [123]/3 100% 256/256 img, .* took [0-9]+:[0-9]{2}, run ETA [0-9]+:[0-9]{2}$' <<< "$stderr")" -eq 3 ] ||
        fail "$stderr"
    [[ "$(grep 'epoch 3/3 100%' <<< "$stderr")" == *"run ETA 0:00" ]] || fail "$stderr"
}
