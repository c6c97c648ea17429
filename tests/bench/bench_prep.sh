#!/usr/bin/env bash
# bench_prep.sh [N]: cifar-prep against the seed's loading path on the same files.
#
# Makes N (default 10,000) 32x32 RGB PNGs with cifar-synth (--jpeg-fraction 0),
# times `cifar-prep --threads $THREADS` (default 2) on them, best of 3, whole
# process (start, JSON, decode, LMDB write, fsync), and then the seed's path:
# json.load plus matplotlib's plt.imread of every file, as CIFAR10_IMG.__getitem__
# does (/work/shared/seed/cifar10DataLoader.py), in $PYTHON_TORCH, best of 3 too
# (interpreter start and imports excluded: a favour to the seed). Both run on a
# warm page cache. Prints images/s of each and the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/bin}
PY=${PYTHON_TORCH:-/usr/bin/python3}
N=${1:-10000}
THREADS=${THREADS:-2}
RUNS=${RUNS:-3}
TEST_N=$((N / 6))
TRAIN_N=$((N - TEST_N))

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_prep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "bench_prep: making $N 32x32 PNGs ($TRAIN_N train + $TEST_N test) in $tmp" >&2
"$BIN/cifar-synth" "$tmp/data" --train "$TRAIN_N" --test "$TEST_N" --size 32 --jpeg-fraction 0 --seed 1 >/dev/null

# Wall time is what a user sees; CPU time (user + sys, all threads) is what the
# work costs, and stays meaningful on a machine shared with other jobs.
best_prep="" best_prep_cpu=""
for r in $(seq 1 "$RUNS"); do
    /usr/bin/time -f "%e %U %S" -o "$tmp/time" \
        "$BIN/cifar-prep" --quiet --force --threads "$THREADS" "$tmp/data" >/dev/null
    read -r dt usr sys < "$tmp/time"
    cpu=$(echo "$usr + $sys" | bc -l)
    echo "bench_prep: cifar-prep run $r: ${dt}s wall, ${cpu}s CPU" >&2
    if [ -z "$best_prep" ] || [ "$(echo "$dt < $best_prep" | bc -l)" = 1 ]; then best_prep=$dt; fi
    if [ -z "$best_prep_cpu" ] || [ "$(echo "$cpu < $best_prep_cpu" | bc -l)" = 1 ]; then best_prep_cpu=$cpu; fi
done

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
echo "$N $best_prep $best_seed $THREADS $best_prep_cpu $best_seed_cpu $(nproc) $load" | awk '{
    n = $1; p = $2; s = $3; pc = $5; sc = $6;
    printf "cifar-prep (--threads %d): %8.0f images/s wall (%.3fs for %d images, best of runs)\n", $4, n / p, p, n;
    printf "seed plt.imread:          %8.0f images/s wall (%.3fs)\n", n / s, s;
    printf "ratio (wall): %.1fx\n", s / p;
    printf "per CPU-second: cifar-prep %.0f images, seed %.0f images (ratio %.1fx); on %d idle cores cifar-prep would reach about %.0f images/s, %.1fx the seed\n",
        n / pc, n / sc, sc / pc, $4, $4 * n / pc, $4 * sc / pc;
    printf "machine: %d cores, load average %s (a loaded machine lowers the wall-time ratio)\n", $7, $8;
}'
