#!/usr/bin/env bats
# cifar-train's TensorBoard event files (RUN_DIR/tb), read back with PyPI's
# tensorboard (the pinned venv of make deps, $TB_PYTHON; tests/tb_read.py):
# every scalar of metrics.jsonl and every --log-every step through TensorBoard's
# own EventAccumulator; after a kill and a resume, the records of all files
# continue without a duplicate and equal an uninterrupted run's; a torn last
# record is dropped on the next start; the generated protobuf-c code is what
# protoc-c makes of tb_event.proto.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 384 --test 128 --size 16 --seed 11
    export LMDB="$DATA/cifar10.lmdb"
    small_model "$BATS_FILE_TMPDIR/small.json"
}

setup() {
    # no skip: the venv is made by make deps (and make test-bats)
    [ -x "${TB_PYTHON:-}" ] || { echo "TB_PYTHON ('${TB_PYTHON:-}') is not a python: run make deps"; false; }
}

train() { # run-dir, extra args... (384 images, batch 64: 6 steps an epoch)
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --batch-size 64 --threads 2 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$dir" "$@" "$LMDB"
}

tb() { "$TB_PYTHON" "$BATS_TEST_DIRNAME/tb_read.py" "$@"; }

@test "EventAccumulator reads every epoch scalar of metrics.jsonl and the loss and lr every --log-every steps" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 3 --log-every 4 >/dev/null
    run tb metrics "$dir"
    assert_success
    assert_output "OK: 3 epochs x 10 scalars match metrics.jsonl"
    run tb accumulate "$dir"
    assert_success
    [ "$(grep -c '^train/loss ' <<< "$output")" -eq 4 ]
    [ "$(grep '^train/loss ' <<< "$output" | cut -d' ' -f2 | tr '\n' ' ')" = "4 8 12 16 " ]
    [ "$(grep '^train/lr ' <<< "$output" | cut -d' ' -f2 | tr '\n' ' ')" = "4 8 12 16 " ]
    # the epochs end at steps 6, 12, 18
    [ "$(grep '^epoch/test_acc ' <<< "$output" | cut -d' ' -f2 | tr '\n' ' ')" = "6 12 18 " ]
    grep '^train/loss ' <<< "$output" | awk '{ if (!($3 > 0 && $3 < 100)) exit 1 }'
    # rerunning the finished run adds no event and no file
    train "$dir" --epochs 3 --log-every 4 >/dev/null
    [ "$(ls "$dir/tb" | wc -l)" -eq 1 ]
    run tb metrics "$dir"
    assert_success
    # the default: every 50 steps (none in 18)
    train "$BATS_TEST_TMPDIR/default" --epochs 3 >/dev/null
    run tb accumulate "$BATS_TEST_TMPDIR/default"
    assert_success
    [ -z "$(grep "^train/" <<< "$output")" ]
    [ "$(grep -c '^epoch/' <<< "$output")" -eq 30 ]
}

@test "with --val-fraction the validation loss and accuracy are epoch scalars too" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 2 --val-fraction 0.25 >/dev/null
    grep -q '"val_acc"' "$dir/metrics.jsonl"
    run tb metrics "$dir"
    assert_success
    assert_output "OK: 2 epochs x 12 scalars match metrics.jsonl"
}

@test "killed mid-epoch and rerun: the events continue without a duplicate, equal to an uninterrupted run's" {
    use_test_build
    train "$BATS_TEST_TMPDIR/ref" --epochs 3 --log-every 2 >/dev/null
    dir="$BATS_TEST_TMPDIR/killed"
    # dies after step 10; the snapshot of epoch 1 (step 6) is the resume point
    CIFAR_TEST_DIE_AFTER_STEPS=10 run train "$dir" --epochs 3 --save-every 1 --log-every 2
    assert_failure
    run tb records "$dir"
    assert_success
    grep -q ' train/loss 10 ' <<< "$output"   # the steps after the snapshot were logged
    train "$dir" --epochs 3 --save-every 1 --log-every 2 >/dev/null
    [ "$(ls "$dir/tb" | wc -l)" -eq 2 ]
    run tb records "$dir"
    assert_success
    records=$output
    # each (tag, step) once over both files
    [ -z "$(grep -v ' file_version ' <<< "$records" | awk '{ print $2, $3 }' | sort | uniq -d)" ]
    # the same scalars as the uninterrupted run's, bit for bit (wall-clock ones aside)
    same() { grep -v -e ' file_version ' -e ' epoch/images_per_s ' -e ' epoch/seconds ' | cut -d' ' -f2- | sort; }
    run tb records "$BATS_TEST_TMPDIR/ref"
    assert_success
    [ "$(same <<< "$records")" = "$(same <<< "$output")" ]
    [ "$(same <<< "$records" | grep -c '^train/loss ')" -eq 9 ]
}

@test "a torn last record is dropped when the run starts again; the file is whole again" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 1 --log-every 3 >/dev/null
    file=$(ls "$dir"/tb/events.out.tfevents.*)
    cp "$file" "$BATS_TEST_TMPDIR/whole"
    # half of a record, as a crash in the middle of a write leaves it
    head -c 30 "$BATS_TEST_TMPDIR/whole" | tail -c 22 >> "$file"
    train "$dir" --epochs 2 --log-every 3 >/dev/null
    cmp "$file" "$BATS_TEST_TMPDIR/whole"
    run tb metrics "$dir"
    assert_success
    assert_output "OK: 2 epochs x 10 scalars match metrics.jsonl"
}

@test "--log-every is in --help; bad values exit 2" {
    run "$BIN/cifar-train" --help
    assert_success
    assert_output --partial "--log-every N"
    assert_output --partial "tb/ (TensorBoard event files)"
    run "$BIN/cifar-train" --log-every x "$LMDB"
    assert_failure 2
}

@test "shared/format/tb_event.pb-c.{c,h} are what protoc-c makes of tb_event.proto (make proto)" {
    command -v protoc-c || { echo "protoc-c is missing: run make deps (protobuf-c-compiler)"; false; }
    out="$BATS_TEST_TMPDIR/gen"
    mkdir -p "$out"
    src="$BATS_TEST_DIRNAME/../shared/format"
    (cd "$src" && protoc-c --c_out="$out" tb_event.proto)
    diff "$out/tb_event.pb-c.c" "$src/tb_event.pb-c.c"
    diff "$out/tb_event.pb-c.h" "$src/tb_event.pb-c.h"
}
