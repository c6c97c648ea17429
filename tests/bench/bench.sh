#!/usr/bin/env bash
# make bench: speed figures side by side with PyTorch on this machine's CPU.
#   1. cifar-prep images/s against its floor (prep_floor) and the seed's loading path (bench_prep.sh)
#   2. training images/s of the seed model, batch 256, on 1 thread and on $THREADS
#      (default: every core) with the scaling between them, against PyTorch
#      (tests/bench/torch_anchor.py with Debian's python3-torch), per-op breakdown
#   3. cifar-train from an LMDB, 1 epoch: the default (1 worker, every core),
#      --threads 1, and 2 workers x 1 thread; the all-reduce cost per step
#   4. 2 CPU ranks over Gloo and over MPI (TCP) beside 2 over shared memory, alternating
#      (bench_mpi.sh); 2 nodes over Gloo (network namespaces) beside both, alternating
#      (bench_multinode.sh)
#   5. peak private memory and epoch speed, records read in place against the
#      in-memory copy (bench_memory.sh; BENCH_MEMORY=0 skips its several minutes)
#   6. background snapshots: throughput with --save-interval 5s against off, work
#      lost per SIGKILL over 20 random kills (bench_snapshots.sh)
# Each timed pair runs alternately, RUNS times (default 3), so that other work on the
# machine falls on both alike; every run is printed, then the range.
# Environment: BIN (commands), BENCH_TRAIN (bench_train program), PREP_FLOOR (prep_floor program), PYTHON_TORCH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
BENCH_TRAIN=${BENCH_TRAIN:-$repo/build/cpu/bench/bench_train}
PYTHON_TORCH=${PYTHON_TORCH:-/usr/bin/python3}
ANCHOR=${ANCHOR:-$repo/tests/bench/torch_anchor.py}
STEPS=${BENCH_STEPS:-20}
THREADS=${BENCH_THREADS:-$(nproc)}
RUNS=${BENCH_RUNS:-3}
work=$(mktemp -d /tmp/cifar-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

column() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; } # the field's value on every line
field() { column "$1" | head -1; }
range() { sort -g | awk '{ v[NR] = $1 } END { printf "%.0f to %.0f", v[1], v[NR] }'; }

echo "== 1. cifar-prep"
"$here/bench_prep.sh"

echo
echo "== 2. training step, seed model, batch 256, data in memory: 1 thread and $THREADS threads against PyTorch, $RUNS runs each, alternating"
# Anchors: Debian's PyTorch 1.13 eager ($PYTHON_TORCH) and, where PYTHON_TORCH2 names a
# python with PyPI's torch 2.x (what a user would install), its eager and
# torch.compile runs. Every anchor runs in every round, beside ours, so that other
# work on the machine falls on all alike.
anchor() { # file, python, args...
  local out=$1 py=$2; shift 2
  local line; line=$("$py" "$ANCHOR" --device cpu --batch 256 --threads "$THREADS" --steps "$STEPS" --warmup 3 "$@" 2>/dev/null | tail -1)
  echo "$line"; echo "$line" >> "$work/$out"
}
have_torch() { [ -f "$ANCHOR" ] && "$1" -c 'import torch' 2>/dev/null; }
anchors=()
declare -A anchor_name=([torch1]="PyTorch 1.13 eager" [torch2]="PyTorch 2.x eager" [torch2c]="PyTorch 2.x torch.compile")
declare -A anchor_py=([torch1]="$PYTHON_TORCH" [torch2]="${PYTHON_TORCH2:-}" [torch2c]="${PYTHON_TORCH2:-}")
declare -A anchor_args=([torch1]="" [torch2]="" [torch2c]="--compile")
if have_torch "$PYTHON_TORCH"; then anchors+=(torch1); else echo "SKIP PyTorch 1.13 anchor: $ANCHOR or torch for $PYTHON_TORCH missing"; fi
if [ -n "${PYTHON_TORCH2:-}" ]; then
  if have_torch "$PYTHON_TORCH2"; then anchors+=(torch2 torch2c); else echo "SKIP PyTorch 2.x anchor: no torch for PYTHON_TORCH2=$PYTHON_TORCH2"; fi
else
  echo "SKIP PyTorch 2.x anchor: set PYTHON_TORCH2 to a python with PyPI's torch (e.g. a venv: pip install torch)"
fi
: > "$work/t1"; : > "$work/tn"; for a in "${anchors[@]}"; do : > "$work/$a"; done
for r in $(seq "$RUNS"); do
  echo "-- run $r (load $(cut -d' ' -f1 /proc/loadavg))"
  one=$("$BENCH_TRAIN" --batch 256 --threads 1 --steps "$STEPS" 2>/dev/null)
  echo "ours, 1 thread:  $one"; echo "$one" >> "$work/t1"
  if [ "$r" -lt "$RUNS" ]; then
    many=$("$BENCH_TRAIN" --batch 256 --threads "$THREADS" --steps "$STEPS" 2>/dev/null)
  else # the last run shows where the time goes
    many=$("$BENCH_TRAIN" --batch 256 --threads "$THREADS" --steps "$STEPS")
  fi
  echo "ours, $THREADS threads: $many"; echo "$many" >> "$work/tn"
  for a in "${anchors[@]}"; do
    printf '%s: ' "${anchor_name[$a]}"
    # shellcheck disable=SC2086 # the extra arguments are words
    anchor "$a" "${anchor_py[$a]}" ${anchor_args[$a]}
  done
done
for f in images_per_s images_per_s_median images_per_s_peak; do
  a=$(column "$f" < "$work/t1" | range); b=$(column "$f" < "$work/tn" | range)
  best1=$(column "$f" < "$work/t1" | sort -g | tail -1); bestn=$(column "$f" < "$work/tn" | sort -g | tail -1)
  awk -v f="$f" -v a="$a" -v b="$b" -v x="$best1" -v y="$bestn" -v t="$THREADS" \
    'BEGIN { printf "%-20s 1 thread %s, %d threads %s images/s; scaling (best against best) %.2fx\n", f, a, t, b, y / x }'
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ours_best=$(column images_per_s < "$work/tn" | sort -g | tail -1)
ours_median=$(column images_per_s < "$work/tn" | median)
for a in "${anchors[@]}"; do
  their_best=$(column images_per_s < "$work/$a" | sort -g | tail -1)
  their_median=$(column images_per_s < "$work/$a" | median)
  awk -v n="${anchor_name[$a]}" -v r="$(column images_per_s < "$work/$a" | range)" -v ob="$ours_best" -v om="$ours_median" \
      -v tb="$their_best" -v tm="$their_median" \
    'BEGIN { printf "ours / %s (%s images/s): best against best %.2fx, median against median %.2fx\n", n, r, ob / tb, om / tm }'
done

echo
echo "== 3. cifar-train from an LMDB, 1 epoch of 8192 synthetic images, batch 256 per worker, $RUNS runs each"
"$BIN/cifar-synth" "$work/data" --train 8192 --test 512 --seed 3 >/dev/null 2>&1
"$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
run_ips() { # name, args...
  local dir="$work/run-$1-$r"; shift
  "$BIN/cifar-train" --quiet --device cpu --epochs 1 --run-dir "$dir" "$@" "$work/data.lmdb" >/dev/null
  field images_per_s < "$dir/metrics.jsonl"
}
: > "$work/default"; : > "$work/one"; : > "$work/two"
for r in $(seq "$RUNS"); do
  d=$(run_ips default); o=$(run_ips one --threads 1); t=$(run_ips two --nproc-per-node 2 --threads 1)
  echo "run $r: default (1 worker, $(nproc) threads) $d, --threads 1 $o, 2 workers x 1 thread $t images/s (load $(cut -d' ' -f1 /proc/loadavg))"
  echo "$d" >> "$work/default"; echo "$o" >> "$work/one"; echo "$t" >> "$work/two"
done
d=$(sort -g "$work/default" | tail -1); o=$(sort -g "$work/one" | tail -1); t=$(sort -g "$work/two" | tail -1)
echo "default: $(range < "$work/default"); --threads 1: $(range < "$work/one"); 2 workers x 1 thread: $(range < "$work/two") images/s"
awk -v d="$d" -v o="$o" -v t="$t" 'BEGIN { printf "best runs: default / 1 thread %.2fx, 2 workers / 1 thread %.2fx, default / 2 workers %.2f\n", d / o, t / o, d / t }'
if [ -x "${BENCH_COMM:-}" ]; then
  echo "all-reduce cost (shared memory, 2 processes; the seed model's gradient is 58,042 floats):"
  "$BENCH_COMM" bench 2>&1 | grep allreduce
fi

echo
echo "== 4. CPU ranks over Gloo and MPI (TCP) beside shared memory"
CIFAR_MPI_LIB=${CIFAR_MPI_LIB:-$BIN/libcifar-mpi.so} "$here/bench_mpi.sh"
echo
BIN="$BIN" "$here/bench_multinode.sh"

echo
if [ "${BENCH_MEMORY:-1}" = 1 ]; then
  echo "== 5. private memory with the dataset read in place (a 60,000-image 64x64 set; several minutes; BENCH_MEMORY=0 skips)"
  "$here/bench_memory.sh"
else
  echo "== 5. memory: skipped (BENCH_MEMORY=0)"
fi

echo
echo "== 6. snapshots written in the background (bench_snapshots.sh)"
"$here/bench_snapshots.sh"
