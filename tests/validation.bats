#!/usr/bin/env bats
# cifar-train --val-fraction and --early-stop: the hold-out's size, val_loss and
# val_acc in every metrics line, best.safetensors (the epoch of the best val_acc,
# never pruned by --keep, written atomically), the same hold-out and the same
# best after a resume (bit-identical), early stopping and its rerun; cifar-eval
# and cifar-predict given a RUN_DIR take its best snapshot, else its newest.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 120 --test 24 --size 8 --classes 3 --seed 6
    export LMDB="$DATA/cifar10.lmdb"
    small_model "$BATS_FILE_TMPDIR/small.json"
}

train() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$dir" "$@" "$LMDB"
}

# "epoch val_acc" of each metrics line
val_accs() { # run-dir
    sed 's/^{"epoch":\([0-9]*\),.*"val_acc":\([0-9.]*\),.*/\1 \2/' "$1/metrics.jsonl"
}

# A snapshot's "best_val" metadata: [accuracy,epoch]
best_val() { # snapshot
    head -c 65536 "$1" | grep -ao '"best_val":"[^"]*"'
}

@test "--help documents --val-fraction and --early-stop; bad values exit 2" {
    run "$BIN/cifar-train" --help
    assert_success
    assert_output --partial "--val-fraction F"
    assert_output --partial "--early-stop N"
    for args in "--val-fraction 1" "--val-fraction -0.1" "--val-fraction x" "--early-stop -1" \
        "--early-stop 2" "--val-fraction 0.0001"; do
        # shellcheck disable=SC2086
        run --separate-stderr train "$BATS_TEST_TMPDIR/run" --epochs 1 $args
        [ "$status" -eq 2 ] || { echo "$args: status $status: $stderr"; false; }
        [ "$(echo "$stderr" | wc -l)" -eq 1 ] || { echo "$args: $stderr"; false; }
    done
    run --separate-stderr train "$BATS_TEST_TMPDIR/run" --early-stop 2
    [[ "$stderr" == "cifar-train: --early-stop needs a validation split: give --val-fraction" ]]
    run --separate-stderr train "$BATS_TEST_TMPDIR/run" --val-fraction 0.0001
    [[ "$stderr" == "cifar-train: --val-fraction 0.0001 holds out none of the 120 train images: give a larger fraction" ]]
}

@test "val_loss and val_acc each epoch; best.safetensors is the best epoch's state and --keep never prunes it" {
    dir="$BATS_TEST_TMPDIR/run"
    # --schedule const: the learning rate does not depend on --epochs (see the reference run below)
    run --separate-stderr "$BIN/cifar-train" --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$dir" --epochs 4 --save-every 1 --keep 1 --schedule const --val-fraction 0.25 "$LMDB"
    assert_success
    # 0.25 of each of the 3 classes' records, each rounded: 30 of 120, give or take 3 x 0.5
    held=$(echo "$stderr" | sed -n 's/.*validation: \([0-9]*\) of the 120 train images held out.*/\1/p')
    [ "$held" -ge 29 ] || { echo "held out: '$held'"; false; }
    [ "$held" -le 31 ] || { echo "held out: '$held'"; false; }
    [ "$(grep -c '"test_acc":[0-9.]*,"val_loss":[0-9.]*,"val_acc":[0-9.]*,"lr"' "$dir/metrics.jsonl")" -eq 4 ]
    # the first epoch with the highest val_acc
    best=$(val_accs "$dir" | sort -k2,2gr -k1,1n | head -1 | cut -d' ' -f1)
    [ -f "$dir/best.safetensors" ]
    [[ "$(best_val "$dir/best.safetensors")" == *",$best]\"" ]] || { best_val "$dir/best.safetensors"; val_accs "$dir"; false; }
    head -c 65536 "$dir/best.safetensors" | grep -aq "\"epochs\":\"$best\""
    # --keep 1: one numbered snapshot besides best.safetensors
    [ "$(ls "$dir" | grep -c '^snapshot-')" -eq 1 ]
    [ -z "$(ls "$dir" | grep tmp-)" ]
    # best.safetensors holds that epoch's weights: equal to a run stopped there
    ref=$(train "$BATS_TEST_TMPDIR/ref" --epochs "$best" --schedule const --val-fraction 0.25 | tail -1)
    [ "$(data_checksum "$dir/best.safetensors")" = "$(data_checksum "$ref")" ]
    # the hold-out is not trained on: the train loss averages over the other images
    echo "$stderr" | grep -q "training $LMDB: 4 epochs from 0, $((120 - held)) images"
}

@test "a resume holds out the same images: metrics, best.safetensors and the final weights bit-identical" {
    use_test_build
    ref=$(train "$BATS_TEST_TMPDIR/ref" --epochs 4 --save-every 1 --val-fraction 0.25 | tail -1)
    dir="$BATS_TEST_TMPDIR/killed"
    CIFAR_TEST_DIE_AFTER_STEPS=14 run train "$dir" --epochs 4 --save-every 1 --val-fraction 0.25
    assert_failure
    resumed=$(train "$dir" --epochs 4 --save-every 1 --val-fraction 0.25 | tail -1)
    [ "$(data_checksum "$resumed")" = "$(data_checksum "$ref")" ]
    [ "$(data_checksum "$dir/best.safetensors")" = "$(data_checksum "$BATS_TEST_TMPDIR/ref/best.safetensors")" ]
    [ "$(val_accs "$dir")" = "$(val_accs "$BATS_TEST_TMPDIR/ref")" ]
    strip() { sed 's/"lr".*//' "$1"; }
    [ "$(strip "$dir/metrics.jsonl")" = "$(strip "$BATS_TEST_TMPDIR/ref/metrics.jsonl")" ]
}

# The epoch at which --early-stop N must stop, from a metrics file: the first e with
# e - (the first epoch of the best val_acc up to e) >= N; 0 when none. val_acc values
# are multiples of 1/(held-out images), printed to 6 decimals: ties print as ties.
stop_epoch() { # run-dir N
    val_accs "$1" | awk -v n="$2" '{ if (!b || $2 > best) { best = $2; b = $1 } if ($1 - b >= n) { print $1; exit } } END { if ($1 - b < n) print 0 }'
}

@test "--early-stop N: stops N epochs after the best, exit 0; the rerun trains no more" {
    dir="$BATS_TEST_TMPDIR/run"
    # --lr 0: the weights stay; only the BN statistics move, so val_acc soon stops improving
    stop() { "$BIN/cifar-train" --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$dir" --epochs 20 --save-every 10 --lr 0 --val-fraction 0.25 "$@" "$LMDB"; }
    run --separate-stderr stop --early-stop 2
    assert_success
    e=$(stop_epoch "$dir" 2)
    [ "$e" -ge 3 ] || { echo "stop epoch $e"; val_accs "$dir"; false; }
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq "$e" ]
    [[ "$stderr" == *"early stop: no better val_acc in 2 epochs (best "*"% at epoch $((e - 2)), kept as $dir/best.safetensors)"* ]] || { echo "$stderr"; false; }
    final=${lines[-1]}
    head -c 65536 "$final" | grep -aq "\"epochs\":\"$e\""
    [[ "$(best_val "$dir/best.safetensors")" == *",$((e - 2))]\"" ]]
    run --separate-stderr stop --early-stop 2
    assert_success
    [ "${lines[-1]}" = "$final" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq "$e" ]
    [[ "$stderr" == *"already stopped early at epoch $e (--early-stop 2)"* ]] || { echo "$stderr"; false; }
    # a larger N continues from there, and stops by the same rule
    run --separate-stderr stop --quiet --early-stop 3
    assert_success
    lines_now=$(wc -l < "$dir/metrics.jsonl")
    [ "$lines_now" -gt "$e" ]
    e3=$(stop_epoch "$dir" 3)
    if [ "$e3" -eq 0 ]; then [ "$lines_now" -eq 20 ]; else [ "$e3" -eq "$lines_now" ]; fi
}

@test "every rank holds out the same images: 2 processes validate; a rank that disagrees stops the job" {
    dir="$BATS_TEST_TMPDIR/run"
    run --separate-stderr "$BIN/cifar-train" --quiet --nproc-per-node 2 --batch-size 16 --threads 1 \
        --model "$BATS_FILE_TMPDIR/small.json" --run-dir "$dir" --epochs 2 --val-fraction 0.25 "$LMDB"
    assert_success
    [ "$(grep -c '"val_loss":[0-9.]*,"val_acc":[0-9.]*,' "$dir/metrics.jsonl")" -eq 2 ]
    [ -f "$dir/best.safetensors" ]
    # two workers started by hand (torchrun style) with other fractions: rank 1 refuses
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            CIFAR_COMM_TIMEOUT=20 timeout 120 "$BIN/cifar-train" --quiet --device cpu --batch-size 16 --threads 1 \
            --model "$BATS_FILE_TMPDIR/small.json" --run-dir "$BATS_TEST_TMPDIR/hand" --epochs 1 \
            --val-fraction "0.2$((5 * (1 - r)))" "$LMDB" > "$BATS_TEST_TMPDIR/rank$r" 2>&1 &
        pids[r]=$!
    done
    s0=0 s1=0
    wait "${pids[0]}" || s0=$?
    wait "${pids[1]}" || s1=$?
    [ "$s1" -ne 0 ]
    [ "$s0" -ne 0 ]
    grep -q "rank 1: its validation hold-out differs from rank 0's ---> HINT: every rank must read the same dataset file with the same --val-fraction and --seed" "$BATS_TEST_TMPDIR/rank1" ||
        { cat "$BATS_TEST_TMPDIR/rank0" "$BATS_TEST_TMPDIR/rank1"; false; }
    [ ! -e "$BATS_TEST_TMPDIR/hand/metrics.jsonl" ]
}

@test "cifar-eval and cifar-predict take a RUN_DIR: its best snapshot, else its newest" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 3 --save-every 1 --keep 0 --val-fraction 0.25 > /dev/null
    img=$(ls "$DATA"/test_cifar10/* | head -1)
    run --separate-stderr "$BIN/cifar-eval" --quiet "$dir"
    assert_success
    assert_line "snapshot: $dir/best.safetensors"
    [ "$("$BIN/cifar-predict" --quiet --json --top 3 "$dir" "$img")" = \
      "$("$BIN/cifar-predict" --quiet --json --top 3 "$dir/best.safetensors" "$img")" ]
    # without best.safetensors: the newest snapshot that loads (a corrupt one is skipped)
    rm "$dir/best.safetensors"
    newest=$(ls "$dir"/snapshot-* | tail -1)
    echo garbage > "$dir/snapshot-999999.safetensors"
    run --separate-stderr "$BIN/cifar-eval" --quiet "$dir"
    assert_success
    assert_line "snapshot: $newest"
    [[ "$stderr" == *"snapshot-999999.safetensors: skipping this snapshot: "* ]] || { echo "$stderr"; false; }
    [ "$("$BIN/cifar-predict" --quiet --json "$dir" "$img" 2>/dev/null)" = \
      "$("$BIN/cifar-predict" --quiet --json "$newest" "$img")" ]
    # a folder without a snapshot: exit 1 naming it
    mkdir "$BATS_TEST_TMPDIR/empty"
    want="a folder without best.safetensors or a snapshot that loads"
    run --separate-stderr "$BIN/cifar-eval" --quiet "$BATS_TEST_TMPDIR/empty"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $BATS_TEST_TMPDIR/empty: $want"* ]] || { echo "$stderr"; false; }
    run --separate-stderr "$BIN/cifar-predict" --quiet "$BATS_TEST_TMPDIR/empty" "$img"
    assert_failure 1
    [[ "$stderr" == "cifar-predict: $BATS_TEST_TMPDIR/empty: $want"* ]] || { echo "$stderr"; false; }
}
