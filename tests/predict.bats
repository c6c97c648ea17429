#!/usr/bin/env bats
# cifar-predict: images (arguments or stdin) through a snapshot, one line per image
# in order; the classes agree with cifar-eval on the same images, --top K ranks
# a softmax that sums to 1, --json says the same, batches do not change the
# answer; every bad input is one clear error: bad usage exits 2, a missing or
# corrupt snapshot or image, or an image of another shape, exits 1 naming the
# file with nothing on stdout.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_named_dataset "$DATA" '["cat","dog","bird"]' --train 64 --test 20 --size 8 --classes 3 --seed 4
    small_model "$BATS_FILE_TMPDIR/small.json"
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$BATS_FILE_TMPDIR/run" "$DATA/cifar10.lmdb" > "$BATS_FILE_TMPDIR/final"
    export SNAP
    SNAP=$(tail -1 "$BATS_FILE_TMPDIR/final")
    # the test images in record order, and their labels
    "$PY" -c 'import json, sys
a = json.load(open(sys.argv[1]))
for f, c in zip(a["images"], a["categories"]): print(f"{sys.argv[2]}/{f}\t{c}")' \
        "$DATA/annotations/cifar10_test.json" "$DATA/test_cifar10" > "$BATS_FILE_TMPDIR/labels"
    cut -f1 "$BATS_FILE_TMPDIR/labels" > "$BATS_FILE_TMPDIR/images"
    export IMAGES="$BATS_FILE_TMPDIR/images" LABELS="$BATS_FILE_TMPDIR/labels"
}

# cifar-predict must fail with `status` and one stderr line matching the regexp, no stdout.
predict_fails() { # status regexp args...
    local want=$1 re=$2
    shift 2
    run --separate-stderr "$BIN/cifar-predict" --quiet "$@"
    [ "$status" -eq "$want" ] || { echo "status $status, wanted $want: $stderr"; return 1; }
    [ "$(echo "$stderr" | wc -l)" -eq 1 ] || { echo "expected one line: $stderr"; return 1; }
    [[ "$stderr" =~ ^cifar-predict:\ $re ]] || { echo "no match for '$re': $stderr"; return 1; }
    [ -z "$output" ] || { echo "stdout: $output"; return 1; }
}

@test "--help lists every option and exits 0" {
    run "$BIN/cifar-predict" --help
    assert_success
    assert_output --partial "usage: cifar-predict [OPTIONS] SNAPSHOT|RUN_DIR [IMAGE...]"
    for opt in --top --json --resize --device --batch-size --threads --weights --quiet --help; do
        assert_output --partial -- "$opt"
    done
}

@test "--weights: an --ema snapshot's moving average by default, the trained weights with raw (as cifar-eval)" {
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --ema 0.5 --run-dir "$BATS_TEST_TMPDIR/ema" "$DATA/cifar10.lmdb" > "$BATS_TEST_TMPDIR/final"
    snap=$(tail -1 "$BATS_TEST_TMPDIR/final")
    hits() { # predict args...: images whose top class is their label
        "$BIN/cifar-predict" --quiet --threads 1 "$@" "$snap" < "$IMAGES" | cut -f2 |
            paste - <(cut -f2 "$LABELS") | awk -F'\t' '{ split("cat dog bird", n, " "); if ($1 == n[$2 + 1]) h++ } END { print h + 0 }'
    }
    correct() { "$BIN/cifar-eval" --quiet --json --threads 1 "$@" "$snap" | sed 's/.*"correct":\([0-9]*\).*/\1/'; }
    [ "$(hits)" = "$(correct)" ]
    [ "$(hits --weights raw)" = "$(correct --weights raw)" ]
    # the two are other weights: their probabilities differ
    img=$(head -1 "$IMAGES")
    [ "$("$BIN/cifar-predict" --quiet "$snap" "$img")" != "$("$BIN/cifar-predict" --quiet --weights raw "$snap" "$img")" ]
    predict_fails 2 "--weights: unknown value" --weights mean "$snap" "$img"
}

@test "bad usage exits 2 with one line" {
    img=$(head -1 "$IMAGES")
    predict_fails 2 "--top: expected an integer in \[1, 1000000\], got '0'$" --top 0 "$SNAP" "$img"
    predict_fails 2 "--top: expected an integer" --top x "$SNAP" "$img"
    predict_fails 2 "--batch-size: expected an integer" --batch-size 0 "$SNAP" "$img"
    predict_fails 2 "--threads: expected an integer" --threads 0 "$SNAP" "$img"
    predict_fails 2 "--device: unknown value 'tpu' \(auto, cpu, cuda\)$" --device tpu "$SNAP" "$img"
    predict_fails 2 "give a SNAPSHOT \(or RUN_DIR\) and images" < /dev/null
    predict_fails 2 "no IMAGE given and none on stdin" "$SNAP" < /dev/null
    tabbed="$BATS_TEST_TMPDIR/a$(printf '\t')b.png"
    cp "$img" "$tabbed"
    predict_fails 2 "image 1: its path holds a tab or newline: use --json$" "$SNAP" "$tabbed"
    run --separate-stderr "$BIN/cifar-predict" --quiet --json "$SNAP" "$tabbed"
    assert_success
    run --separate-stderr "$BIN/cifar-predict" --no-such-option "$SNAP" "$img"
    assert_failure 2
}

@test "one line per image, in order, named classes; the classes agree with cifar-eval's accuracy" {
    # shellcheck disable=SC2046
    run --separate-stderr "$BIN/cifar-predict" --quiet --threads 1 "$SNAP" $(cat "$IMAGES")
    assert_success
    [ -z "$stderr" ]
    [ "${#lines[@]}" -eq 20 ]
    [ "$(echo "$output" | cut -f1)" = "$(cat "$IMAGES")" ]
    echo "$output" | awk -F'\t' 'NF != 3 || $2 !~ /^(cat|dog|bird)$/ || !($3 > 0.33 && $3 <= 1) { print "bad line: " $0; bad = 1 } END { exit bad }'
    # the images in the dataset's order, in one batch as cifar-eval runs them: the same logits
    hits=$(paste <(echo "$output" | cut -f2) <(cut -f2 "$LABELS") |
        awk -F'\t' '($1 == "cat" && $2 == 0) || ($1 == "dog" && $2 == 1) || ($1 == "bird" && $2 == 2) { h++ } END { print h + 0 }')
    correct=$("$BIN/cifar-eval" --quiet --json --threads 1 "$SNAP" | sed 's/.*"correct":\([0-9]*\).*/\1/')
    [ "$hits" -eq "$correct" ] || { echo "predict: $hits hits, cifar-eval: $correct"; false; }
}

@test "--top K: K classes a line, most likely first, the probabilities of all K sum to 1" {
    run --separate-stderr "$BIN/cifar-predict" --quiet --top 3 "$SNAP" $(head -5 "$IMAGES")
    assert_success
    [ "${#lines[@]}" -eq 5 ]
    echo "$output" | awk -F'\t' '
        NF != 7 { print "fields: " $0; exit 1 }
        { s = $3 + $5 + $7
          if (!($3 >= $5 && $5 >= $7)) { print "not sorted: " $0; exit 1 }
          # each is printed to 6 decimals: the sum is within 3 x 5e-7 of 1
          if (s < 1 - 2e-6 || s > 1 + 2e-6) { print "sum " s ": " $0; exit 1 }
          if ($2 == $4 || $4 == $6 || $2 == $6) { print "a class twice: " $0; exit 1 } }'
    # the first class is the one --top 1 prints; a K above the classes is all of them
    top1=$("$BIN/cifar-predict" --quiet "$SNAP" $(head -5 "$IMAGES") | cut -f2)
    [ "$(echo "$output" | cut -f2)" = "$top1" ]
    run --separate-stderr "$BIN/cifar-predict" --quiet --top 50 "$SNAP" $(head -5 "$IMAGES")
    assert_success
    [ "$(echo "$output" | awk -F'\t' '{ print NF }' | sort -u)" = "7" ]
}

@test "--json: one object per image with the same classes and probabilities as the text" {
    text=$("$BIN/cifar-predict" --quiet --top 2 "$SNAP" $(head -4 "$IMAGES"))
    run --separate-stderr "$BIN/cifar-predict" --quiet --top 2 --json "$SNAP" $(head -4 "$IMAGES")
    assert_success
    [ "${#lines[@]}" -eq 4 ]
    echo "$output" | "$PY" -c '
import json, sys
text = [l.split("\t") for l in sys.argv[1].splitlines()]
names = ["cat", "dog", "bird"]
for line, want in zip(sys.stdin, text):
    r = json.loads(line)
    assert r["path"] == want[0], (r, want)
    for t, (c, p) in zip(r["top"], zip(want[1::2], want[2::2])):
        assert t["class"] == c and names[t["index"]] == c, (t, c)
        assert abs(t["probability"] - float(p)) <= 5e-7, (t, p)
' "$text"
}

@test "paths on stdin (blank lines ignored) give what the arguments give; batches do not change it" {
    want=$("$BIN/cifar-predict" --quiet --top 3 --json "$SNAP" $(cat "$IMAGES"))
    run --separate-stderr bash -c "{ head -7 '$IMAGES'; echo; tail -n +8 '$IMAGES'; } | '$BIN/cifar-predict' --quiet --top 3 --json '$SNAP'"
    assert_success
    [ "$output" = "$want" ]
    # other batch sizes: another GEMM shape, equal up to rounding (compared per class index)
    run --separate-stderr "$BIN/cifar-predict" --quiet --top 3 --json --batch-size 3 "$SNAP" $(cat "$IMAGES")
    assert_success
    "$PY" -c '
import json, sys
a, b = ([json.loads(l) for l in s.splitlines()] for s in sys.argv[1:3])
assert len(a) == len(b) == 20
for x, y in zip(a, b):
    px = {t["index"]: t["probability"] for t in x["top"]}
    py = {t["index"]: t["probability"] for t in y["top"]}
    assert px.keys() == py.keys() and all(abs(px[k] - py[k]) < 1e-4 for k in px), (x, y)
' "$want" "$output"
}

@test "a snapshot of a dataset without names prints the class numbers" {
    make_dataset "$BATS_TEST_TMPDIR/plain" --train 32 --test 4 --size 8 --classes 3
    snap=$("$BIN/cifar-train" --quiet --epochs 1 --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$BATS_TEST_TMPDIR/run" "$BATS_TEST_TMPDIR/plain/cifar10.lmdb" | tail -1)
    run --separate-stderr "$BIN/cifar-predict" --quiet --top 3 "$snap" "$BATS_TEST_TMPDIR"/plain/test_cifar10/*
    assert_success
    [ "${#lines[@]}" -eq 4 ]
    echo "$output" | awk -F'\t' '$2 !~ /^[0-2]$/ || $4 !~ /^[0-2]$/ || $6 !~ /^[0-2]$/ { print; exit 1 }'
}

@test "bad images: missing, a folder, not an image, truncated, corrupt, another size or channel count" {
    good=$(head -1 "$IMAGES")
    png=$(grep '\.png$' "$IMAGES" | head -1)
    jpg=$(grep '\.jpg$' "$IMAGES" | head -1)
    t=$BATS_TEST_TMPDIR
    predict_fails 1 "$t/none.png: cannot read the image \(No such file or directory\)$" "$SNAP" "$good" "$t/none.png"
    predict_fails 1 "$t: not a regular file$" "$SNAP" "$t"
    echo "hello" > "$t/text.png"
    predict_fails 1 "$t/text.png: not a PNG or JPEG image$" "$SNAP" "$t/text.png"
    head -c 100 "$png" > "$t/cut.png"
    predict_fails 1 "$t/cut.png: " "$SNAP" "$t/cut.png"
    head -c 200 "$jpg" > "$t/cut.jpg"
    predict_fails 1 "$t/cut.jpg: " "$SNAP" "$t/cut.jpg"
    "$BIN/cifar-synth" "$t/big" --train 2 --test 2 --size 10 --jpeg-fraction 0 >/dev/null
    predict_fails 1 "$t/big/test_cifar10/img_000000.png: the image is 10x10x3 \(HxWxC\), the snapshot's model takes 8x8x3" \
        "$SNAP" "$t/big/test_cifar10/img_000000.png"
    "$BIN/cifar-synth" "$t/gray" --train 2 --test 2 --size 8 --channels 1 --jpeg-fraction 0 >/dev/null
    predict_fails 1 "$t/gray/test_cifar10/img_000000.png: the image is 8x8x1 \(HxWxC\), the snapshot's model takes 8x8x3" \
        "$SNAP" "$t/gray/test_cifar10/img_000000.png"
}


# Record i of DATA's test split as PNGs in $BATS_TEST_TMPDIR: NAME.png as it is, and
# NAME-MODE.png for each MODE of tests/png_write.py.
record_pngs() { # i name modes...
    local i=$1 name=$2 px
    shift 2
    px=$(mdb_dump -n -s test "$DATA/cifar10.lmdb" | "$PY" "$BATS_TEST_DIRNAME/dataset_record.py" records test |
        sed -n "$((i + 1))p" | cut -d' ' -f2)
    "$PY" "$BATS_TEST_DIRNAME/png_write.py" "$BATS_TEST_TMPDIR/$name.png" 8 8 3 "$px"
    for m in "$@"; do
        "$PY" "$BATS_TEST_DIRNAME/png_write.py" "$BATS_TEST_TMPDIR/$name-$m.png" 8 8 3 "$px" "$m"
    done
}

# cifar-predict's --json lines without their paths.
classes_only() { sed 's/^{"path":"[^"]*",//'; }

@test "--resize: a 2x image reads as its original, a gray one as its RGB copy; without it both are refused" {
    t=$BATS_TEST_TMPDIR
    record_pngs 3 a up2 gray gray3
    record_pngs 7 b up2
    # the record as a PNG gives what the dataset's image gives (the same pixels)
    [ "$("$BIN/cifar-predict" --quiet --json --top 3 "$SNAP" "$t/a.png" | classes_only)" = \
      "$("$BIN/cifar-predict" --quiet --json --top 3 "$SNAP" "$(sed -n 4p "$IMAGES")" | classes_only)" ]
    # halving averages each 2x2 block of equal pixels: exactly the original
    want=$("$BIN/cifar-predict" --quiet --json --top 3 "$SNAP" "$t/a.png" "$t/b.png" | classes_only)
    run --separate-stderr "$BIN/cifar-predict" --quiet --json --top 3 --resize "$SNAP" "$t/a-up2.png" "$t/b-up2.png"
    assert_success
    [ "$(echo "$output" | classes_only)" = "$want" ]
    # gray to RGB copies the channel: as the RGB image with R = G = B
    want=$("$BIN/cifar-predict" --quiet --json --top 3 "$SNAP" "$t/a-gray3.png" | classes_only)
    run --separate-stderr "$BIN/cifar-predict" --quiet --json --top 3 --resize "$SNAP" "$t/a-gray.png"
    assert_success
    [ "$(echo "$output" | classes_only)" = "$want" ]
    predict_fails 1 "$t/a-up2.png: the image is 16x16x3 \(HxWxC\), the snapshot's model takes 8x8x3 ---> HINT: .*--resize" \
        "$SNAP" "$t/a-up2.png"
    predict_fails 1 "$t/a-gray.png: the image is 8x8x1 \(HxWxC\)" "$SNAP" "$t/a-gray.png"
}

@test "--resize to a gray model: RGB with R = G = B reads as the gray image (BT.601 luma sums to 1)" {
    t=$BATS_TEST_TMPDIR
    make_dataset "$t/gray" --train 32 --test 4 --size 8 --channels 1 --classes 3
    snap=$("$BIN/cifar-train" --quiet --epochs 1 --batch-size 16 --threads 1 --model "$BATS_FILE_TMPDIR/small.json" \
        --run-dir "$t/run" "$t/gray/cifar10.lmdb" | tail -1)
    record_pngs 2 c gray gray3
    want=$("$BIN/cifar-predict" --quiet --json --top 3 "$snap" "$t/c-gray.png" | classes_only)
    run --separate-stderr "$BIN/cifar-predict" --quiet --json --top 3 --resize "$snap" "$t/c-gray3.png"
    assert_success
    [ "$(echo "$output" | classes_only)" = "$want" ]
}

@test "bad snapshots: missing, garbage, truncated: exit 1 naming the file" {
    img=$(head -1 "$IMAGES")
    t=$BATS_TEST_TMPDIR
    predict_fails 1 "$t/none.safetensors: " "$t/none.safetensors" "$img"
    echo "garbage" > "$t/bad.safetensors"
    predict_fails 1 "$t/bad.safetensors: " "$t/bad.safetensors" "$img"
    head -c 5000 "$SNAP" > "$t/bad.safetensors"
    predict_fails 1 "$t/bad.safetensors: .*truncated" "$t/bad.safetensors" "$img"
}

@test "--device auto falls back to the CPU with one line naming why; --device cuda is refused" {
    [ ! -e /dev/nvidia0 ] || skip_because "a GPU is present: the fallback is not exercised"
    img=$(head -1 "$IMAGES")
    run --separate-stderr "$BIN/cifar-predict" "$SNAP" "$img"
    assert_success
    [ "$(echo "$stderr" | grep -c 'no usable GPU (.*): running on the CPU')" -eq 1 ] || { echo "$stderr"; false; }
    predict_fails 1 "--device cuda: " --device cuda "$SNAP" "$img"
}
