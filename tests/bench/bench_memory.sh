#!/usr/bin/env bash
# bench_memory.sh: private memory and epoch speed with records read in place from
# the LMDB map (issue 15), against the in-memory copy (CIFAR_DATA_IN_MEMORY=1,
# the behaviour before).
#
# Makes two synthetic SIZExSIZE RGB sets with cifar-synth (SMALL and BIG images in
# all, a sixth of each as the test split) and prints, at the same batch:
#   - peak private memory (RssAnon, sampled every 20 ms from /proc) of cifar-train
#     (EPOCHS epochs, seed model) and of cifar-eval (test split) on each set, and
#     the big-minus-small difference as a fraction of the big set's pixel bytes;
#   - the same for cifar-train with the in-memory copy;
#   - total private memory of 2 ranks (launcher + workers, --nproc-per-node 2,
#     THREADS/2 threads each) against 1 rank, in place and copied;
#   - epoch images/s in place and copied (metrics.jsonl, the last epoch: warm map);
#   - the one pass that finds and verifies every record at load, from a warm page
#     cache and from a cold one (the file's pages dropped with posix_fadvise), and
#     the CRC-32C cost alone (checksums verified vs. a version-1 copy of the file).
# Environment: BIN (bin), TEST_BIN (the test build of cifar-train, make test-build),
# SMALL (1000), BIG (60000), SIZE (64), BATCH (64), THREADS (2), EPOCHS (1), KEEP=1
# keeps the work folder, TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/bin}
# the test build of cifar-train (make test-build), for its stop after step 1
TEST_BIN=${TEST_BIN:?set TEST_BIN, the folder of make test-build (build/MODE/test-bin; make bench sets it)}
PY=${PYTHON:-/usr/bin/python3}
SMALL=${SMALL:-1000}
BIG=${BIG:-60000}
SIZE=${SIZE:-64}
BATCH=${BATCH:-64}
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-1}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_memory.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
say() { echo "bench_memory: $*" >&2; }

make_set() { # name images
    local test_n=$(($2 / 6))
    say "making $2 ${SIZE}x${SIZE} images ($(($2 - test_n)) train + $test_n test) in $tmp/$1"
    "$BIN/cifar-synth" "$tmp/$1" --train $(($2 - test_n)) --test "$test_n" --size "$SIZE" \
        --jpeg-fraction 0 --seed 1 >/dev/null
    "$BIN/cifar-prep" --quiet --threads "$THREADS" "$tmp/$1" >/dev/null
}

# Total RssAnon (kB) of a process and its children.
tree_rss_anon() { # pid
    local total=0 v p
    for p in "$1" $(pgrep -P "$1" || true); do
        v=$(awk '/^RssAnon:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

# Run a command in the background; print the peak of its tree's RssAnon (kB).
peak_of() { # log cmd...
    local log=$1 peak=0 v pid; shift
    "$@" > "$log" 2>&1 &
    pid=$!
    while grep -q '^RssAnon:' "/proc/$pid/status" 2>/dev/null; do
        v=$(tree_rss_anon "$pid")
        [ "$v" -gt "$peak" ] && peak=$v
        sleep 0.02
    done
    wait "$pid" || { say "failed: $* (see $log)"; tail -5 "$log" >&2; exit 1; }
    echo "$peak"
}

train_cmd() { # run-dir lmdb extra...
    local dir=$1 data=$2; shift 2
    rm -rf "$dir"
    echo "$BIN/cifar-train" --device cpu --batch-size "$BATCH" --epochs "$EPOCHS" --save-every "$EPOCHS" \
        --run-dir "$dir" "$@" "$data"
}

last_epoch_ips() { # run-dir
    tail -1 "$1/metrics.jsonl" | sed 's/.*"images_per_s":\([0-9.]*\).*/\1/'
}

mb() { echo "$(($1 / 1024)) MB"; }

make_set small "$SMALL"
make_set big "$BIG"
big_pixels_kb=$((BIG * SIZE * SIZE * 3 / 1024))

declare -A R
for set in small big; do
    for mode in 0 1; do
        say "cifar-train on $set, CIFAR_DATA_IN_MEMORY=$mode"
        R[train_${set}_$mode]=$(CIFAR_DATA_IN_MEMORY=$mode peak_of "$tmp/train-$set-$mode.log" \
            $(train_cmd "$tmp/run-$set-$mode" "$tmp/$set/cifar10.lmdb" --threads "$THREADS"))
        R[ips_${set}_$mode]=$(last_epoch_ips "$tmp/run-$set-$mode")
    done
    say "cifar-eval on $set"
    snap=$(ls "$tmp/run-$set-0"/snapshot-*.safetensors | tail -1)
    R[eval_$set]=$(peak_of "$tmp/eval-$set.log" "$BIN/cifar-eval" --device cpu --quiet --threads "$THREADS" \
        --batch-size "$BATCH" --data "$tmp/$set/cifar10.lmdb" "$snap")
    R[evalcopy_$set]=$(CIFAR_DATA_IN_MEMORY=1 peak_of "$tmp/evalcopy-$set.log" "$BIN/cifar-eval" --device cpu \
        --quiet --threads "$THREADS" --batch-size "$BATCH" --data "$tmp/$set/cifar10.lmdb" "$snap")
done
for mode in 0 1; do
    say "cifar-train on big, 2 ranks, CIFAR_DATA_IN_MEMORY=$mode"
    R[ranks2_$mode]=$(CIFAR_DATA_IN_MEMORY=$mode peak_of "$tmp/train2-$mode.log" \
        $(train_cmd "$tmp/run2-$mode" "$tmp/big/cifar10.lmdb" --nproc-per-node 2 \
            --threads $(( THREADS > 1 ? THREADS / 2 : 1 ))))
done

# The load pass: warm (the first run above, right after cifar-prep wrote the file),
# cold (the file's pages dropped), and without checksums (a version-1 copy).
split_seconds() { # log split
    sed -n "s/.*split \"$2\": .* in \([0-9.]*\) s$/\1/p" "$1" | head -1
}
drop_cache() { "$PY" -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"; }

big_lmdb="$tmp/big/cifar10.lmdb"
warm_log="$tmp/train-big-0.log"
drop_cache "$big_lmdb"
if command -v fincore >/dev/null; then say "page cache before the cold pass: $(fincore -n -o RES "$big_lmdb")"; fi
say "load pass, cold: cifar-train on big with the file's pages dropped"
rm -rf "$tmp/cold"
CIFAR_TEST_SIGINT_AFTER_STEPS=1 "$TEST_BIN/cifar-train" --device cpu --epochs 1 --batch-size "$BATCH" \
    --threads "$THREADS" --run-dir "$tmp/cold" "$big_lmdb" > /dev/null 2> "$tmp/cold.log" || true
v1="$tmp/big-v1.lmdb"
cc -D_GNU_SOURCE -O1 -o "$tmp/lmdb_poke" tests/lmdb_poke.c -llmdb
"$tmp/lmdb_poke" v1 "$big_lmdb" "$v1"
cat "$v1" > /dev/null
say "load pass without checksums (version-1 copy), warm"
rm -rf "$tmp/v1run"
CIFAR_TEST_SIGINT_AFTER_STEPS=1 "$TEST_BIN/cifar-train" --device cpu --epochs 1 --batch-size "$BATCH" \
    --threads "$THREADS" --run-dir "$tmp/v1run" "$v1" > /dev/null 2> "$tmp/v1.log" || true
load_warm=$(split_seconds "$warm_log" train)
load_cold=$(split_seconds "$tmp/cold.log" train)
load_v1=$(split_seconds "$tmp/v1.log" train)
epoch_s=$(tail -1 "$tmp/run-big-0/metrics.jsonl" | sed 's/.*"seconds":\([0-9.]*\).*/\1/')

frac() { echo "scale=1; 100 * ($1 - $2) / $big_pixels_kb" | bc -l; }
echo "bench_memory: ${SIZE}x${SIZE}x3 images, batch $BATCH, $THREADS threads, $EPOCHS epoch(s); big set pixels $(mb $big_pixels_kb)"
echo "| peak RssAnon | $SMALL images | $BIG images | difference, of the big set's pixel bytes |"
echo "| --- | --- | --- | --- |"
echo "| cifar-train, in place | $(mb ${R[train_small_0]}) | $(mb ${R[train_big_0]}) | $(frac ${R[train_big_0]} ${R[train_small_0]})% |"
echo "| cifar-train, copied (before) | $(mb ${R[train_small_1]}) | $(mb ${R[train_big_1]}) | $(frac ${R[train_big_1]} ${R[train_small_1]})% |"
echo "| cifar-eval, in place | $(mb ${R[eval_small]}) | $(mb ${R[eval_big]}) | $(frac ${R[eval_big]} ${R[eval_small]})% |"
echo "| cifar-eval, copied (before) | $(mb ${R[evalcopy_small]}) | $(mb ${R[evalcopy_big]}) | $(frac ${R[evalcopy_big]} ${R[evalcopy_small]})% |"
echo "2 ranks on the big set, total RssAnon: in place $(mb ${R[ranks2_0]}) (1 rank $(mb ${R[train_big_0]})), copied $(mb ${R[ranks2_1]}) (1 rank $(mb ${R[train_big_1]}))"
echo "epoch images/s (last epoch): big in place ${R[ips_big_0]}, copied ${R[ips_big_1]}; small in place ${R[ips_small_0]}, copied ${R[ips_small_1]}"
echo "load pass over the big train split (find + verify every record): warm ${load_warm} s, cold ${load_cold} s, without checksums ${load_v1} s; one epoch ${epoch_s} s"
