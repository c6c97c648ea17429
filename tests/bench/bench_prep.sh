#!/usr/bin/env bash
# bench_prep.sh [N]: cifar-prep against its floor and the seed's loading path.
#
# Makes N (default 10,000) 32x32 RGB PNGs with cifar-synth (--jpeg-fraction 0),
# then times, alternating so that the machine's load falls on both alike, RUNS
# (default 3) runs each of:
#   cifar-prep --threads $THREADS (default 2): whole process (start, JSON, decode,
#     LMDB write, fdatasync, rename); the previous output is removed before each
#     run, untimed (replacing it would add the unlink of the old file);
#   the floor, prep_floor --threads $THREADS ($PREP_FLOOR, built by make bench):
#     read every file and inflate its IDAT with zlib, no libpng, no output;
# and the seed's path: json.load plus matplotlib's plt.imread of every file, as
# CIFAR10_IMG.__getitem__ does (/work/shared/seed/cifar10DataLoader.py), in
# $PYTHON_TORCH, RUNS runs (interpreter start and imports excluded: a favour to
# the seed). All on a warm page cache. Prints each run, the range and best of
# each, images/s, and the ratios prep/floor and seed/prep (wall and CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/bin}
PY=${PYTHON_TORCH:-/usr/bin/python3}
N=${1:-10000}
THREADS=${THREADS:-2}
RUNS=${RUNS:-3}
PREP_FLOOR=${PREP_FLOOR:-$PWD/build/cpu/bench/prep_floor}
[ -x "$PREP_FLOOR" ] || { echo "bench_prep: $PREP_FLOOR: not built (make bench builds it; or set PREP_FLOOR)" >&2; exit 2; }
TEST_N=$((N / 6))
TRAIN_N=$((N - TEST_N))

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_prep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "bench_prep: making $N 32x32 PNGs ($TRAIN_N train + $TEST_N test) in $tmp" >&2
"$BIN/cifar-synth" "$tmp/data" --train "$TRAIN_N" --test "$TEST_N" --size 32 --jpeg-fraction 0 --seed 1 >/dev/null

# Wall time is what a user sees; CPU time (user + sys, all threads) is what the
# work costs, and stays meaningful on a machine shared with other jobs.
# time_run NAME CMD...: appends "NAME wall cpu" (seconds, ms resolution) to $tmp/runs.
time_run() {
    local name=$1 t
    shift
    t=$( { TIMEFORMAT='%3R %3U %3S'; time "$@" >/dev/null; } 2>&1 | tail -1)
    echo "$name $t" | awk '{ printf "%s %.3f %.3f\n", $1, $2, $3 + $4 }' >> "$tmp/runs"
}
: > "$tmp/runs"
for r in $(seq 1 "$RUNS"); do
    rm -f "$tmp/data/cifar10.lmdb"
    time_run prep "$BIN/cifar-prep" --quiet --threads "$THREADS" "$tmp/data"
    time_run floor "$PREP_FLOOR" --threads "$THREADS" "$tmp/data/train_cifar10" "$tmp/data/test_cifar10"
done
awk '{ printf "bench_prep: %-5s run: %.3fs wall, %.3fs CPU\n", $1, $2, $3 }' "$tmp/runs" >&2
# stat NAME COLUMN: "min max" over the runs
stat() { awk -v n="$1" -v c="$2" '$1 == n { v = $c; if (lo == "" || v < lo) lo = v; if (v > hi) hi = v } END { print lo, hi }' "$tmp/runs"; }
read -r best_prep worst_prep <<< "$(stat prep 2)"
read -r best_prep_cpu worst_prep_cpu <<< "$(stat prep 3)"
read -r best_floor worst_floor <<< "$(stat floor 2)"
read -r best_floor_cpu worst_floor_cpu <<< "$(stat floor 3)"

best_seed=$("$PY" - "$tmp/data" "$RUNS" <<'PY'
import json, sys, time
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
root, runs = sys.argv[1], int(sys.argv[2])
best = best_cpu = None
for r in range(runs):
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for split in ('train', 'test'):
        data = json.load(open(f'{root}/annotations/cifar10_{split}.json'))
        assert len(data['images']) == len(data['categories'])
        folder = f'{root}/{split}_cifar10/'
        for name in data['images']:
            img = plt.imread(folder + name)
            n += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f'bench_prep: seed path (plt.imread) run {r + 1}: {dt:.3f}s wall, {cpu:.3f}s CPU', file=sys.stderr)
    best = dt if best is None else min(best, dt)
    best_cpu = cpu if best_cpu is None else min(best_cpu, cpu)
print(best, best_cpu)
PY
)

read -r best_seed best_seed_cpu <<< "$best_seed"
load=$(cut -d' ' -f1 /proc/loadavg)
echo "$N $THREADS $best_prep $worst_prep $best_prep_cpu $best_floor $worst_floor $best_floor_cpu $best_seed $best_seed_cpu $(nproc) $load" | awk '{
    n = $1; t = $2; p = $3; pw = $4; pc = $5; f = $6; fw = $7; fc = $8; s = $9; sc = $10;
    printf "cifar-prep (--threads %d): %8.0f images/s wall, best of runs (%.3fs to %.3fs for %d images; %.3fs CPU)\n", t, n / p, p, pw, n, pc;
    printf "floor (read + inflate):   %8.0f images/s wall, best of runs (%.3fs to %.3fs; %.3fs CPU)\n", n / f, f, fw, fc;
    printf "ratio prep/floor: %.2fx wall (best runs), %.2fx CPU\n", p / f, pc / fc;
    printf "seed plt.imread:          %8.0f images/s wall (%.3fs)\n", n / s, s;
    printf "ratio seed/prep (wall): %.1fx\n", s / p;
    printf "per CPU-second: cifar-prep %.0f images, seed %.0f images (ratio %.1fx); on %d idle cores cifar-prep would reach about %.0f images/s, %.1fx the seed\n",
        n / pc, n / sc, sc / pc, t, t * n / pc, t * sc / pc;
    printf "machine: %d cores, load average %s (a loaded machine lowers the wall-time figures)\n", $11, $12;
}'
