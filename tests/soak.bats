#!/usr/bin/env bats
# Soak: 20 SIGKILLs of random workers at random moments of a 2-worker CPU run under the
# launcher (--max-restarts 25). Every kill must be recovered by a group restart that
# resumes from the last complete snapshot, and the final weights, momentum and BN
# buffers must be bit-identical to an uninterrupted run's (equal data_checksum).

bats_require_minimum_version 1.5.0
load helpers

KILLS=${SOAK_KILLS:-20}

setup_file() {
    export T="$BATS_FILE_TMPDIR"
    make_dataset "$T/data" --train 1024 --test 64 --size 8 --seed 21
    small_model "$T/model.json"
    # Long enough to take all the kills: ~10 s of training uninterrupted, where the
    # kills leave ~4 s of progress between them.
    export EPOCHS=${SOAK_EPOCHS:-1000}
}

train_args() {
    echo --quiet --nproc-per-node 2 --threads 1 --batch-size 32 --epochs "$EPOCHS" \
        --save-every 1 --keep 3 --model "$T/model.json" --max-restarts 25
}

workers_of() { # launcher pid: its worker pids, sorted
    pgrep -P "$1" | sort | tr '\n' ' '
}

@test "20 SIGKILLs of random workers during a 2-worker run: all recovered, final weights exact" {
    # shellcheck disable=SC2046
    start=$(date +%s%N)
    ref=$("$BIN/cifar-train" $(train_args) --run-dir "$T/ref" "$T/data/cifar10.lmdb" | tail -1)
    [ -f "$ref" ]
    # Each group lives a random moment of at most ref/(2*KILLS) before its kill, so
    # the kills together let through at most half of the uninterrupted run's work:
    # the run cannot end before the last kill, whatever the machine's speed.
    window_ms=$(( ($(date +%s%N) - start) / 1000000 / (2 * KILLS) ))
    [ "$window_ms" -ge 20 ] || window_ms=20
    dir="$T/soak"
    # shellcheck disable=SC2046
    "$BIN/cifar-train" $(train_args) --run-dir "$dir" "$T/data/cifar10.lmdb" \
        > "$T/out" 2> "$T/err" &
    launcher=$!
    kills=0
    RANDOM=$$
    while [ "$kills" -lt "$KILLS" ] && kill -0 "$launcher" 2>/dev/null; do
        # A running group of two workers, then a random moment of its life.
        group=$(workers_of "$launcher")
        if [ "$(echo "$group" | wc -w)" -ne 2 ]; then sleep 0.02; continue; fi
        sleep "$(awk -v ms=$((RANDOM % window_ms)) 'BEGIN { printf "%.3f", ms / 1000 }')"
        [ "$(workers_of "$launcher")" = "$group" ] || continue
        # shellcheck disable=SC2206
        pids=($group)
        victim=${pids[$((RANDOM % 2))]}
        kill -9 "$victim" 2>/dev/null || continue
        kills=$((kills + 1))
        # Wait until the launcher has replaced the group (or finished).
        for _ in $(seq 500); do
            now=$(workers_of "$launcher")
            [ -n "$now" ] && [ "$now" != "$group" ] && break
            kill -0 "$launcher" 2>/dev/null || break
            sleep 0.01
        done
    done
    status=0
    wait "$launcher" || status=$?
    echo "kills: $kills; restarts: $(grep -c 'restarting the group' "$T/err");" \
        "slow stops: $(grep -c 'did not stop within' "$T/err")"
    [ "$status" -eq 0 ] || { echo "status $status"; tail -20 "$T/err"; false; }
    [ "$kills" -eq "$KILLS" ] || { echo "the run ended after $kills kills: raise SOAK_EPOCHS"; false; }
    [ "$(grep -c 'restarting the group' "$T/err")" -eq "$KILLS" ]
    final=$(tail -1 "$T/out")
    [ "$(data_checksum "$final")" = "$(data_checksum "$ref")" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq "$EPOCHS" ]
    [ -z "$(ls -A "$dir" | grep -- '\.tmp-')" ]
    # No worker outlived the launcher, no shared-memory segment was left behind.
    left=$(pgrep -f -- "--run-dir $dir" || [ $? -eq 1 ])   # 1: none; pgrep's own errors (2, 3) fail here
    [ -z "$left" ]
}
