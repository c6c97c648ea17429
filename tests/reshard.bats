#!/usr/bin/env bats
# Resharded resume (README "Resume with another world size"): a snapshot taken in the
# middle of an epoch by 4 ranks, resumed by 2 or 3, continues the epoch from its
# position (the images it trained are the split, each once: metrics.jsonl's
# "images" and "world_sizes"; the step count is the rest of the epoch at the new
# world size, not a redone epoch); the same sequence of world sizes twice gives
# cmp-identical snapshots; a resume at the same world size is the straight run, byte
# for byte, and its snapshots carry no "epoch_position".
#
# The numbers: 384 training images, --batch-size 8 per rank. 4 ranks: 96 each, 12
# steps an epoch; the snapshot at step 3 (--save-every-steps 3) stands at position
# 3 x 8 x 4 = 96, leaving 288 = 2 x 144 = 3 x 96 images: 18 steps of 2 ranks or 12 of
# 3, no padding, so each epoch trains exactly 384.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 384 --test 64 --size 8 --seed 3
    export LMDB="$DATA/cifar10.lmdb"
    export MODEL="$BATS_FILE_TMPDIR/small.json"
    small_model "$MODEL"
    # The 4-rank run every test starts from: 2 epochs, a snapshot every 3 steps.
    export REF4="$BATS_FILE_TMPDIR/ref4"
    ranks 4 "$REF4" > "$BATS_FILE_TMPDIR/ref4.out"
}

# cifar-train with K processes on one node, the options every run here shares
# (--quiet unless LOUD is set).
ranks() { # K, run-dir, extra args...
    local k=$1 dir=$2 quiet=--quiet
    shift 2
    if [ -n "${LOUD:-}" ]; then quiet=; fi
    "$BIN/cifar-train" $quiet --nproc-per-node "$k" --threads 1 --batch-size 8 --model "$MODEL" \
        --epochs 2 --save-every 10 --save-every-steps 3 --keep 0 --run-dir "$dir" "$@" "$LMDB"
}

# A run folder holding only SRC's snapshot of step STEP (and its metrics): what a
# resume from that snapshot starts from.
from_snapshot() { # src-dir, step, dst-dir
    mkdir -p "$3"
    cp "$1/snapshot-$(printf %06d "$2").safetensors" "$3/"
    if [ -f "$1/metrics.jsonl" ]; then cp "$1/metrics.jsonl" "$3/"; fi
}

# Epoch E's line of RUN_DIR/metrics.jsonl.
epoch_line() { # run-dir, epoch
    sed -n "$2p" "$1/metrics.jsonl"
}

# How often TEXT appears in the snapshot's header (its JSON, where __metadata__ lives).
header_count() { # snapshot, text
    head -c 65536 "$1" | grep -acF -- "$2" || [ $? -eq 1 ]
}

@test "4 ranks stopped mid-epoch, resumed with 2 and with 3: the epoch goes on from its position, each image once" {
    [ "$(tail -1 "$BATS_FILE_TMPDIR/ref4.out")" = "$REF4/snapshot-000024.safetensors" ]
    for k in 2 3; do
        dir="$BATS_TEST_TMPDIR/to$k"
        from_snapshot "$REF4" 3 "$dir"
        LOUD=1 run --separate-stderr ranks "$k" "$dir" --max-restarts 0
        echo "$stderr"
        assert_success
        # epoch 1: 3 steps of 4 ranks, then 288 / (8 x k); epoch 2: 384 / (8 x k)
        want=$(( 3 + 288 / (8 * k) + 384 / (8 * k) ))
        [ "${lines[-1]}" = "$dir/snapshot-$(printf %06d "$want").safetensors" ]
        [[ "$stderr" == *"resuming a partial epoch at image 96 of 384 with $k processes (the snapshot's had 4): the 288 images left are dealt to them, each once; the global batch is now 8 x $k"* ]]
        line=$(epoch_line "$dir" 1)
        [[ "$line" == *"\"world_size\":$k,\"world_sizes\":[4,$k],\"images\":384,"* ]] || { echo "$line"; false; }
        line=$(epoch_line "$dir" 2)
        [[ "$line" == *"\"world_size\":$k,\"world_sizes\":[$k],\"images\":384,"* ]] || { echo "$line"; false; }
    done
}

@test "the same sequence of world sizes twice (4, 2, 3): cmp-identical snapshots; a resharded mid-epoch snapshot records its position" {
    for copy in a b; do
        two="$BATS_TEST_TMPDIR/$copy-2"
        from_snapshot "$REF4" 3 "$two"
        ranks 2 "$two" > /dev/null
        # step 6: 3 steps of 4 ranks then 3 of 2, position 96 + 3 x 8 x 2 = 144
        mid="$two/snapshot-000006.safetensors"
        [ "$(header_count "$mid" '"epoch_position":"{\"version\":1,\"consumed\":144,\"world_sizes\":[4,2]}"')" -eq 1 ]
        three="$BATS_TEST_TMPDIR/$copy-3"
        from_snapshot "$two" 6 "$three"
        final=$(ranks 3 "$three" | tail -1)
        # epoch 1: 3 + 3 + 240 / 24 = 16 steps, epoch 2: 384 / 24 = 16
        [ "$final" = "$three/snapshot-000032.safetensors" ]
        line=$(epoch_line "$three" 1)
        [[ "$line" == *'"world_size":3,"world_sizes":[4,2,3],"images":384,'* ]] || { echo "$line"; false; }
    done
    cmp "$BATS_TEST_TMPDIR/a-3/snapshot-000032.safetensors" "$BATS_TEST_TMPDIR/b-3/snapshot-000032.safetensors"
    # and every snapshot of the 3-rank leg, the mid-epoch ones included
    for f in "$BATS_TEST_TMPDIR"/a-3/snapshot-*.safetensors; do
        [ "$(data_checksum "$f")" = "$(data_checksum "$BATS_TEST_TMPDIR/b-3/${f##*/}")" ]
    done
    # not the weights of the 4-to-2 leg's own end: the world sizes shaped them
    [ "$(data_checksum "$BATS_TEST_TMPDIR/a-3/snapshot-000032.safetensors")" != \
      "$(data_checksum "$BATS_TEST_TMPDIR/a-2/snapshot-000045.safetensors")" ]
}

@test "resumed mid-epoch at the same world size: the straight run's snapshots byte for byte, no epoch_position" {
    for step in 3 9; do
        dir="$BATS_TEST_TMPDIR/from$step"
        from_snapshot "$REF4" "$step" "$dir"
        final=$(ranks 4 "$dir" | tail -1)
        [ "$final" = "$dir/snapshot-000024.safetensors" ]
        cmp "$final" "$REF4/snapshot-000024.safetensors"
    done
    line=$(epoch_line "$REF4" 1)
    [[ "$line" == *'"world_size":4,"world_sizes":[4],"images":384,'* ]] || { echo "$line"; false; }
    # a run at one world size writes the metadata it always wrote
    [ "$(header_count "$REF4/snapshot-000003.safetensors" epoch_position)" -eq 0 ]
    [ "$(header_count "$REF4/snapshot-000003.safetensors" '"step_in_epoch":"3"')" -eq 1 ]
}

@test "a damaged epoch_position: the snapshot is skipped for the previous one; a newer version of it stops the run naming it" {
    two="$BATS_TEST_TMPDIR/two"
    from_snapshot "$REF4" 3 "$two"
    ranks 2 "$two" > /dev/null
    dir="$BATS_TEST_TMPDIR/damaged"
    from_snapshot "$REF4" 3 "$dir"
    for bad in '"{\"version\":1,\"consumed\":\"144\",\"world_sizes\":[4,2]}"' \
               '"{\"version\":1,\"consumed\":144,\"world_sizes\":[4,3]}"' \
               '"{\"version\":1,\"consumed\":144,\"world_sizes\":[2]}"' '"[4,2]"'; do
        snapshot_edit "$two/snapshot-000006.safetensors" "$dir/snapshot-000006.safetensors" \
            "h['__metadata__']['epoch_position'] = $bad"
        run --separate-stderr "$BIN/cifar-eval" --quiet --threads 1 "$dir/snapshot-000006.safetensors"
        [ "$status" -ne 0 ]
        [[ "$stderr" == *'snapshot metadata "epoch_position" is malformed'* ]] || { echo "$bad: $stderr"; false; }
    done
    # resumed: the damaged one is named and skipped, the 4-rank one of step 3 used
    LOUD=1 run --separate-stderr ranks 3 "$dir" --max-restarts 0
    assert_success
    [[ "$stderr" == *"snapshot-000006.safetensors: skipping this snapshot: snapshot metadata \"epoch_position\" is malformed"* ]] ||
        { echo "$stderr"; false; }
    [[ "$stderr" == *"resuming from $dir/snapshot-000003.safetensors"* ]]
    [ "${lines[-1]}" = "$dir/snapshot-000031.safetensors" ]   # 3 + 288 / 24, then 384 / 24
    newer="$BATS_TEST_TMPDIR/newer"
    mkdir "$newer"
    snapshot_edit "$two/snapshot-000006.safetensors" "$newer/snapshot-000006.safetensors" \
        "h['__metadata__']['epoch_position'] = h['__metadata__']['epoch_position'].replace('\"version\":1', '\"version\":2')"
    run --separate-stderr ranks 1 "$newer" --max-restarts 0
    [ "$status" -ne 0 ]
    [[ "$stderr" == *'its "epoch_position" was written by a newer version (version 2; this program reads 1): upgrade cifar-train'* ]] ||
        { echo "$stderr"; false; }
    [ "$(data_checksum "$newer/snapshot-000006.safetensors")" = "$(data_checksum "$two/snapshot-000006.safetensors")" ]
}
