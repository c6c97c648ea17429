#!/usr/bin/env bats
# cifar-train and cifar-eval on the CPU: usage, the output contract, training that
# learns, snapshots PyTorch loads, resume (rerun, larger --epochs, after SIGKILL at
# a random moment, after SIGINT), bit-identical weights after a resume, corrupt and
# foreign snapshots, a NaN loss, and cifar-eval's report.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

BIN=${BIN:-$BATS_TEST_DIRNAME/../bin}
PY=${PYTHON_TORCH:-/usr/bin/python3}

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    "$BIN/cifar-synth" "$DATA" --train 384 --test 128 --size 16 --seed 11 >/dev/null
    "$BIN/cifar-prep" --quiet "$DATA" >/dev/null
    export LMDB="$DATA/cifar10.lmdb"
    export BIG="$BATS_FILE_TMPDIR/big"
    "$BIN/cifar-synth" "$BIG" --train 1024 --test 256 --size 16 --seed 11 >/dev/null
    "$BIN/cifar-prep" --quiet "$BIG" >/dev/null
}

# The FNV-1a checksum of a snapshot's whole data section (every tensor, momentum
# included): equal checksums mean bit-identical weights and optimizer state.
data_checksum() { # snapshot
    head -c 65536 "$1" | grep -ao '"data_checksum":"[0-9a-f]*"'
}

train() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --batch-size 64 --threads 2 --run-dir "$dir" "$@" "$LMDB"
}

# The same in the background, with $! the cifar-train process itself (not a subshell).
train_bg() { # output file, run-dir, extra args...
    local out=$1 dir=$2; shift 2
    "$BIN/cifar-train" --quiet --batch-size 64 --threads 2 --run-dir "$dir" "$@" "$LMDB" > "$out" 2>&1 &
}

@test "--help lists the options and exits 0" {
    run "$BIN/cifar-train" --help
    assert_success
    assert_output --partial "--epochs"
    assert_output --partial "--nproc-per-node"
    assert_output --partial "--save-every"
    run "$BIN/cifar-eval" --help
    assert_success
    assert_output --partial "--json"
}

@test "bad usage exits 2 with a message" {
    run "$BIN/cifar-train" --epochs zero "$LMDB"
    assert_failure 2
    assert_output --partial "--epochs"
    run "$BIN/cifar-train" --schedule wiggly "$LMDB"
    assert_failure 2
    run "$BIN/cifar-eval" --device tpu x.safetensors
    assert_failure 2
}

@test "a missing or foreign dataset is named in the error" {
    run "$BIN/cifar-train" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/none.lmdb"
    assert_failure 1
    assert_output --partial "none.lmdb"
    echo "not an lmdb" > "$BATS_TEST_TMPDIR/junk.lmdb"
    run "$BIN/cifar-train" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/junk.lmdb"
    assert_failure 1
    assert_output --partial "junk.lmdb"
}

@test "trains, learns, writes metrics, snapshots and the final path last on stdout" {
    LMDB="$BIG/cifar10.lmdb" run --separate-stderr train "$BATS_TEST_TMPDIR/run" --epochs 6 --save-every 2 --keep 2
    assert_success
    final=${lines[-1]}
    [ -f "$final" ]
    [ "$(wc -l < "$BATS_TEST_TMPDIR/run/metrics.jsonl")" -eq 6 ]
    [ "$(ls "$BATS_TEST_TMPDIR/run"/snapshot-*.safetensors | wc -l)" -eq 2 ]
    acc=$(tail -1 "$BATS_TEST_TMPDIR/run/metrics.jsonl" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
    echo "test accuracy after 6 epochs: $acc"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.7) }'
    # cifar-eval agrees with the training loop's own evaluation.
    run "$BIN/cifar-eval" --quiet --json "$final"
    assert_success
    evacc=$(echo "$output" | sed 's/.*"accuracy":\([0-9.]*\).*/\1/')
    awk -v a="$acc" -v b="$evacc" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }'
}

@test "PyTorch loads the snapshot into the seed model with strict=True" {
    "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch not installed"
    [ -f "${SEED_DIR:-$BATS_TEST_DIRNAME/../../shared/seed}/resnet.py" ] ||
        skip "the seed's resnet.py is not in ../shared/seed beside this checkout (set SEED_DIR)"
    final=$(train "$BATS_TEST_TMPDIR/run" --epochs 1 | tail -1)
    run "$PY" "$BATS_TEST_DIRNAME/check_safetensors_torch.py" "$final"
    assert_success
    assert_output --partial "OK"
}

@test "the pipeline reads paths from stdin: prep | train | eval" {
    cp -r "$DATA" "$BATS_TEST_TMPDIR/d"
    rm -f "$BATS_TEST_TMPDIR/d/cifar10.lmdb"
    run bash -c "'$BIN/cifar-prep' --quiet '$BATS_TEST_TMPDIR/d' | '$BIN/cifar-train' --quiet --epochs 1 --batch-size 64 --run-dir '$BATS_TEST_TMPDIR/run' | '$BIN/cifar-eval' --quiet"
    assert_success
    assert_output --partial "accuracy:"
    assert_output --partial "confusion matrix"
}

@test "rerunning a finished run changes nothing; a larger --epochs continues" {
    dir="$BATS_TEST_TMPDIR/run"
    first=$(train "$dir" --epochs 2 | tail -1)
    sum1=$(data_checksum "$first")
    again=$(train "$dir" --epochs 2 | tail -1)
    [ "$again" = "$first" ]
    [ "$(data_checksum "$again")" = "$sum1" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 2 ]
    more=$(train "$dir" --epochs 3 | tail -1)
    [ "$more" != "$first" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 3 ]
}

@test "SIGKILL at a random moment, rerun: weights bit-identical to an uninterrupted run" {
    ref=$(train "$BATS_TEST_TMPDIR/ref" --epochs 4 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/killed"
    train_bg /dev/null "$dir" --epochs 4 --save-every 1
    pid=$!
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 1.0 + rand() * 3 }')"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || true
    resumed=$(train "$dir" --epochs 4 --save-every 1 | tail -1)
    [ "$(data_checksum "$resumed")" = "$(data_checksum "$ref")" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 4 ]
    [ -z "$(ls "$dir" | grep tmp-)" ]
}

@test "SIGKILL after a fixed step mid-epoch, rerun: bit-identical" {
    ref=$(train "$BATS_TEST_TMPDIR/ref" --epochs 3 --save-every 1 | tail -1)
    dir="$BATS_TEST_TMPDIR/killed"
    CIFAR_TEST_DIE_AFTER_STEPS=10 run train "$dir" --epochs 3 --save-every 1
    assert_failure
    resumed=$(train "$dir" --epochs 3 --save-every 1 | tail -1)
    [ "$(data_checksum "$resumed")" = "$(data_checksum "$ref")" ]
}

@test "SIGINT finishes the step, writes a snapshot mid-epoch, and the rerun resumes exactly" {
    ref=$(train "$BATS_TEST_TMPDIR/ref" --epochs 3 --save-every 10 | tail -1)
    dir="$BATS_TEST_TMPDIR/int"
    # The signal arrives during step 9 of 18 (mid-epoch 2), through the real handler.
    CIFAR_TEST_SIGINT_AFTER_STEPS=9 run --separate-stderr train "$dir" --epochs 3 --save-every 10
    [ "$status" -eq 130 ] || { echo "$stderr"; false; }
    [[ "$stderr" == *"stopped by signal"* ]] || [ -z "$stderr" ]
    [ -f "$dir/snapshot-000009.safetensors" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 1 ]
    resumed=$(train "$dir" --epochs 3 --save-every 10 | tail -1)
    [ "$(data_checksum "$resumed")" = "$(data_checksum "$ref")" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 3 ]
}

@test "a corrupt latest snapshot is reported and the previous one used" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 2 --save-every 1 >/dev/null
    latest=$(ls "$dir"/snapshot-*.safetensors | sort | tail -1)
    size=$(stat -c %s "$latest")
    printf '\xff' | dd of="$latest" bs=1 seek=$((size - 100)) conv=notrunc status=none
    run --separate-stderr train "$dir" --epochs 2 --save-every 1
    assert_success
    [[ "$stderr" == *"$(basename "$latest")"*"skipping"* ]] || { echo "$stderr"; false; }
    [[ "$stderr" == *"checksum"* ]]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 2 ]
}

@test "a snapshot of another model is refused with a clear message" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 1 >/dev/null
    echo '{"n_channels":[8,16],"bottlenecks":[4,8],"n_blocks":[1,1],"first_kernel_size":3}' > "$BATS_TEST_TMPDIR/small.json"
    run train "$dir" --epochs 2 --model "$BATS_TEST_TMPDIR/small.json"
    assert_failure 1
    assert_output --partial "another model"
    assert_output --partial "--run-dir"
}

@test "--model trains another shape; basic blocks when bottlenecks is null" {
    echo '{"n_channels":[8,16],"bottlenecks":null,"n_blocks":[1,2],"first_kernel_size":5}' > "$BATS_TEST_TMPDIR/basic.json"
    final=$(train "$BATS_TEST_TMPDIR/run" --epochs 1 --model "$BATS_TEST_TMPDIR/basic.json" | tail -1)
    run "$BIN/cifar-eval" --quiet "$final"
    assert_success
    assert_output --partial "accuracy:"
}

@test "a NaN loss stops training with a clear error and keeps the good snapshot" {
    dir="$BATS_TEST_TMPDIR/run"
    good=$(train "$dir" --epochs 1 | tail -1)
    sum=$(data_checksum "$good")
    CIFAR_TEST_NAN_AFTER_STEPS=8 run train "$dir" --epochs 3 --save-every 1
    assert_failure 1
    assert_output --partial "NaN"
    [ "$(ls "$dir"/snapshot-*.safetensors)" = "$good" ]
    [ "$(data_checksum "$good")" = "$sum" ]
}

@test "cifar-eval: bad snapshot and wrong dataset shape are clear errors" {
    echo "garbage" > "$BATS_TEST_TMPDIR/bad.safetensors"
    run "$BIN/cifar-eval" "$BATS_TEST_TMPDIR/bad.safetensors"
    assert_failure 1
    assert_output --partial "bad.safetensors"
    final=$(train "$BATS_TEST_TMPDIR/run" --epochs 1 | tail -1)
    "$BIN/cifar-synth" "$BATS_TEST_TMPDIR/other" --train 16 --test 16 --size 12 >/dev/null
    "$BIN/cifar-prep" --quiet "$BATS_TEST_TMPDIR/other" >/dev/null
    run "$BIN/cifar-eval" --data "$BATS_TEST_TMPDIR/other/cifar10.lmdb" "$final"
    assert_failure 1
    assert_output --partial "12x12x3"
}

@test "cifar-eval --json reports per-class accuracy and a confusion matrix that sum up" {
    final=$(train "$BATS_TEST_TMPDIR/run" --epochs 1 | tail -1)
    run "$BIN/cifar-eval" --quiet --json "$final"
    assert_success
    echo "$output" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
total = sum(sum(row) for row in r["confusion"])
diag = sum(r["confusion"][i][i] for i in range(len(r["confusion"])))
assert total == r["images"] == 128, total
assert diag == r["correct"], (diag, r["correct"])
assert len(r["per_class"]) == 10
'
}

@test "a snapshot written by a newer cifar-train stops the run and is kept as it is" {
    dir="$BATS_TEST_TMPDIR/run"
    latest=$(train "$dir" --epochs 2 --save-every 1 | tail -1)
    sed -i 's/"format_version":"1"/"format_version":"2"/' "$latest"
    grep -aq '"format_version":"2"' "$latest"
    before=$(sha256sum < "$latest")
    run train "$dir" --epochs 3 --save-every 1
    assert_failure 1
    assert_output --partial "newer version"
    [ "$(sha256sum < "$latest")" = "$before" ]
    [ "$(ls "$dir"/snapshot-*.safetensors | wc -l)" -eq 2 ]
}
