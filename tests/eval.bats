#!/usr/bin/env bats
# cifar-eval: the report (text and --json) agrees with itself and with the
# training loop, the snapshot and data paths (argument, stdin, the dataset the
# snapshot records, --data, --split), and every bad input is one clear error:
# bad usage exits 2, a missing, corrupt or foreign snapshot or dataset exits 1
# naming the file.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 256 --test 96 --size 12 --seed 3
    export LMDB="$DATA/cifar10.lmdb"
    small_model "$BATS_FILE_TMPDIR/small.json"
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 64 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$BATS_FILE_TMPDIR/run" "$LMDB" > "$BATS_FILE_TMPDIR/final"
    export SNAP
    SNAP=$(tail -1 "$BATS_FILE_TMPDIR/final")
    export METRICS="$BATS_FILE_TMPDIR/run/metrics.jsonl"
}

@test "--help lists the options and exits 0" {
    run "$BIN/cifar-eval" --help
    assert_success
    for opt in --data --split --json --device --batch-size --threads --weights --quiet; do
        assert_output --partial -- "$opt"
    done
}

@test "bad usage exits 2 with one line naming the option" {
    for args in "--device tpu $SNAP" "--batch-size 0 $SNAP" "--batch-size x $SNAP" "--threads -1 $SNAP" \
        "--no-such-option $SNAP" "$SNAP $SNAP" "--weights mean $SNAP"; do
        # shellcheck disable=SC2086
        run --separate-stderr "$BIN/cifar-eval" $args
        [ "$status" -eq 2 ] || { echo "$args: status $status: $stderr"; false; }
        [ -n "$stderr" ]
        [ -z "$output" ]
    done
    run --separate-stderr "$BIN/cifar-eval" --batch-size 0 "$SNAP"
    [[ "$stderr" == "cifar-eval: --batch-size: expected an integer in [1, 1000000], got '0'" ]]
    run --separate-stderr "$BIN/cifar-eval" --device tpu "$SNAP"
    [[ "$stderr" == "cifar-eval: --device: unknown value 'tpu' (auto, cpu, cuda)" ]]
    run --separate-stderr "$BIN/cifar-eval" < /dev/null
    assert_failure 2
    [[ "$stderr" == *"no SNAPSHOT given and none on stdin"* ]]
}

@test "the text report: accuracy equal to the training loop's, per class and a confusion matrix" {
    run --separate-stderr "$BIN/cifar-eval" --quiet "$SNAP"
    assert_success
    [ -z "$stderr" ]
    assert_line "snapshot: $SNAP"
    assert_line "data: $LMDB (split test, 96 images)"
    assert_line --regexp '^accuracy: [0-9.]+% \([0-9]+/96\), mean loss [0-9.]+$'
    [ "$(echo "$output" | grep -c '^  class ')" -eq 10 ]
    [ "$(echo "$output" | grep -cE '^  [ 0-9]{2}:( +[0-9]+){10}$')" -eq 10 ]
    correct=$(echo "$output" | sed -n 's/^accuracy: .*(\([0-9]*\)\/96).*/\1/p')
    acc=$(tail -1 "$METRICS" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
    awk -v a="$acc" -v c="$correct" 'BEGIN { d = a - c / 96; exit !(d < 1e-6 && d > -1e-6) }'
}

@test "class names: the snapshot carries the dataset's, the report and --json use them" {
    make_named_dataset "$BATS_TEST_TMPDIR/named" '["cat","dog","bird"]' --train 48 --test 12 --size 8 --classes 3
    "$BIN/cifar-train" --quiet --epochs 1 --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$BATS_TEST_TMPDIR/run" "$BATS_TEST_TMPDIR/named/cifar10.lmdb" > "$BATS_TEST_TMPDIR/final"
    snap=$(tail -1 "$BATS_TEST_TMPDIR/final")
    head -c 65536 "$snap" | grep -aq '"classes":"\[\\"cat\\",\\"dog\\",\\"bird\\"\]"'
    run --separate-stderr "$BIN/cifar-eval" --quiet "$snap"
    assert_success
    assert_line --regexp '^   0 cat  +[0-9.]+% \([0-9]+/[0-9]+\)$'
    assert_line --regexp '^   2 bird +[0-9.]+% \([0-9]+/[0-9]+\)$'
    assert_line --regexp '^        +cat +dog +bird$'
    assert_line --regexp '^  bird:( +[0-9]+){3}$'
    run --separate-stderr "$BIN/cifar-eval" --quiet --json "$snap"
    assert_success
    echo "$output" | "$PY" -c 'import json, sys; r = json.load(sys.stdin); assert r["classes"] == ["cat", "dog", "bird"], r'
    # a snapshot of a dataset without names: numbers, no "classes" key
    run --separate-stderr "$BIN/cifar-eval" --quiet --json "$SNAP"
    echo "$output" | "$PY" -c 'import json, sys; r = json.load(sys.stdin); assert "classes" not in r, r'
}

@test "--json: one document whose counts add up and agree with the text report" {
    run --separate-stderr "$BIN/cifar-eval" --quiet --json "$SNAP"
    assert_success
    [ "${#lines[@]}" -eq 1 ]
    echo "$output" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
k = len(r["confusion"])
assert k == 10 and all(len(row) == k for row in r["confusion"]), r["confusion"]
total = sum(map(sum, r["confusion"]))
diag = sum(r["confusion"][i][i] for i in range(k))
assert total == r["images"] == 96, total
assert diag == r["correct"], (diag, r["correct"])
assert abs(r["accuracy"] - r["correct"] / 96) < 1e-12
for i in range(k):
    n = sum(r["confusion"][i])
    assert abs(r["per_class"][i] - (r["confusion"][i][i] / n if n else 0)) < 1e-12, i
assert r["split"] == "test" and r["snapshot"] == sys.argv[1], r
' "$SNAP"
    text=$("$BIN/cifar-eval" --quiet "$SNAP" | sed -n 's/^accuracy: .*(\([0-9]*\)\/96).*/\1/p')
    [ "$(echo "$output" | sed 's/.*"correct":\([0-9]*\).*/\1/')" = "$text" ]
}

@test "paths: the snapshot from stdin, --data, --split, and the same result every time" {
    want=$("$BIN/cifar-eval" --quiet --json "$SNAP")
    run --separate-stderr bash -c "printf 'noise\n%s\n' '$SNAP' | '$BIN/cifar-eval' --quiet --json"
    assert_success
    [ "$output" = "$want" ]
    # other batches sum the loss in another order: equal but for its last digits
    run "$BIN/cifar-eval" --quiet --json --data "$LMDB" --batch-size 7 --threads 1 "$SNAP"
    assert_success
    no_loss() { sed 's/"loss":[0-9.e+-]*,//'; }
    [ "$(echo "$output" | no_loss)" = "$(echo "$want" | no_loss)" ]
    loss() { sed 's/.*"loss":\([0-9.e+-]*\),.*/\1/'; }
    awk -v a="$(echo "$output" | loss)" -v b="$(echo "$want" | loss)" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'
    run "$BIN/cifar-eval" --quiet --json --split train "$SNAP"
    assert_success
    assert_output --partial '"split":"train","images":256'
}

@test "a missing snapshot: exit 1 naming it" {
    run --separate-stderr "$BIN/cifar-eval" "$BATS_TEST_TMPDIR/none.safetensors"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $BATS_TEST_TMPDIR/none.safetensors: "* ]] || { echo "$stderr"; false; }
    [ -z "$output" ]
}

@test "a corrupt snapshot: garbage, a truncated file, a flipped data byte: exit 1 naming it" {
    bad="$BATS_TEST_TMPDIR/bad.safetensors"
    echo "garbage" > "$bad"
    run --separate-stderr "$BIN/cifar-eval" "$bad"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $bad: "* ]] || { echo "$stderr"; false; }
    head -c 5000 "$SNAP" > "$bad"
    run --separate-stderr "$BIN/cifar-eval" "$bad"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $bad: "*"truncated"* ]] || { echo "$stderr"; false; }
    cp "$SNAP" "$bad"
    size=$(stat -c %s "$bad")
    printf '\x5a' | dd of="$bad" bs=1 seek=$((size - 50)) conv=notrunc status=none
    cmp -s "$bad" "$SNAP" && { echo "the byte did not change"; false; }
    run --separate-stderr "$BIN/cifar-eval" "$bad"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $bad: "*"checksum"* ]] || { echo "$stderr"; false; }
    [ -z "$output" ]
}

@test "a wrong dataset: another image shape, a missing split, not an LMDB, a moved dataset" {
    make_dataset "$BATS_TEST_TMPDIR/other" --train 16 --test 16 --size 8
    run --separate-stderr "$BIN/cifar-eval" --data "$BATS_TEST_TMPDIR/other/cifar10.lmdb" "$SNAP"
    assert_failure 1
    [[ "$stderr" == *"other/cifar10.lmdb: the dataset is 8x8x3/10"*"expects 12x12x3/10"* ]] || { echo "$stderr"; false; }
    run --separate-stderr "$BIN/cifar-eval" --split validation "$SNAP"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $LMDB: the dataset has no \"validation\" split"* ]] || { echo "$stderr"; false; }
    echo "not an lmdb" > "$BATS_TEST_TMPDIR/junk.lmdb"
    run --separate-stderr "$BIN/cifar-eval" --data "$BATS_TEST_TMPDIR/junk.lmdb" "$SNAP"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: $BATS_TEST_TMPDIR/junk.lmdb: "* ]] || { echo "$stderr"; false; }
    # the recorded dataset is gone: the message says to give --data
    cp -r "$DATA" "$BATS_TEST_TMPDIR/d"
    dir="$BATS_TEST_TMPDIR/run"
    snap=$("$BIN/cifar-train" --quiet --epochs 1 --batch-size 64 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$dir" "$BATS_TEST_TMPDIR/d/cifar10.lmdb" | tail -1)
    rm -r "$BATS_TEST_TMPDIR/d"
    run --separate-stderr "$BIN/cifar-eval" "$snap"
    assert_failure 1
    [[ "$stderr" == *"d/cifar10.lmdb: "*"give --data"* ]] || { echo "$stderr"; false; }
    run "$BIN/cifar-eval" --quiet --data "$LMDB" "$snap"
    assert_success
}

@test "--weights: the moving average when the snapshot has one, the trained weights with raw" {
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 64 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --ema 0.8 --run-dir "$BATS_TEST_TMPDIR/ema" "$LMDB" > "$BATS_TEST_TMPDIR/final"
    ema_snap=$(tail -1 "$BATS_TEST_TMPDIR/final")
    run "$BIN/cifar-eval" --quiet "$ema_snap"
    assert_success
    assert_line "weights: ema (the moving average; --weights raw for the trained ones)"
    run "$BIN/cifar-eval" --quiet --json "$ema_snap"
    assert_success
    ema_json=$output
    [[ "$ema_json" == *'"weights":"ema"'* ]]
    run "$BIN/cifar-eval" --quiet --json --weights raw "$ema_snap"
    assert_success
    raw_json=$output
    [[ "$raw_json" == *'"weights":"raw"'* ]]
    # the two models differ: their mean losses do
    loss() { echo "$1" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
    [ "$(loss "$ema_json")" != "$(loss "$raw_json")" ]
    # the raw weights of an --ema run are those of the same run without it
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 64 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$BATS_TEST_TMPDIR/plain" "$LMDB" > "$BATS_TEST_TMPDIR/plain_final"
    run "$BIN/cifar-eval" --quiet --json "$(tail -1 "$BATS_TEST_TMPDIR/plain_final")"
    assert_success
    [[ "$output" == *'"weights":"raw"'* ]]
    [ "$(loss "$output")" = "$(loss "$raw_json")" ]
    # a snapshot without an average is evaluated as it is
    run "$BIN/cifar-eval" --quiet "$SNAP"
    assert_line "weights: raw (the trained weights)"
}

@test "--device auto falls back to the CPU with one line naming why; --device cuda is refused" {
    [ ! -e /dev/nvidia0 ] || skip_because "a GPU is present: the fallback is not exercised"
    run --separate-stderr "$BIN/cifar-eval" "$SNAP"
    assert_success
    [ "$(echo "$stderr" | grep -c 'no usable GPU (.*): running on the CPU')" -eq 1 ] || { echo "$stderr"; false; }
    run --separate-stderr "$BIN/cifar-eval" --quiet --device cuda "$SNAP"
    assert_failure 1
    [[ "$stderr" == "cifar-eval: --device cuda: "* ]] || { echo "$stderr"; false; }
    [ -z "$output" ]
}

@test "a busy run folder does not block cifar-eval" {
    dir="$BATS_FILE_TMPDIR/run"
    exec 9>>"$dir/lock"
    flock -n 9   # what a running cifar-train holds
    run "$BIN/cifar-eval" --quiet --json "$SNAP"
    exec 9>&-
    assert_success
}
