#!/usr/bin/env bash
# bench_vs_torch.sh (make bench, section 2): training images/s of the seed model, batch
# 256, side by side with PyTorch on this machine's CPU, RUNS rounds (default 3); in every
# round each of our rows, then every anchor, so that other work on the machine falls on
# all alike. Every run is printed, then each row's range and median, and the ratios.
# Ours:
#   bench_train, 1 thread and THREADS (default every core): the step alone on data in
#     memory, as the anchors time theirs; the scaling between the two; the last round
#     prints where the time of a step goes, per op;
#   cifar-train --precision fp32 and --precision bf16 from an LMDB, 1 epoch of IMAGES
#     synthetic images (its training steps, the first one, data loading and augmentation
#     included; the evaluation not). bf16 only where the processor has AVX512-BF16 or
#     AMX (else one line says it lacks them, and fp32 only); where cifar-train refuses
#     bf16 (exit 2), one line with its reason.
# Anchors (tests/bench/torch_anchor.py, the same network and step): Debian's PyTorch 1.13
# eager (PYTHON_TORCH); with PYTHON_TORCH2 (a python with PyPI's torch 2.x) its eager,
# --channels-last, --amp bf16 (autocast), --compile and the three together. Each anchor
# that cannot run is named on one line. Last: our rows against the best PyTorch
# configuration (the highest median); the aim is >= 2x.
# Environment: BIN, BENCH_TRAIN, PYTHON_TORCH, PYTHON_TORCH2, ANCHOR, BENCH_STEPS (20),
# BENCH_THREADS, BENCH_RUNS (3), BENCH_IMAGES (8192), BENCH_LMDB (an LMDB to train on
# instead of making one), BENCH_CPUINFO (/proc/cpuinfo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/bench/bench_lib.bash
. "$here/bench_lib.bash"
BIN=${BIN:-$repo/bin}
BENCH_TRAIN=${BENCH_TRAIN:-$repo/build/cpu/bench/bench_train}
PYTHON_TORCH=${PYTHON_TORCH:-/usr/bin/python3}
PYTHON_TORCH2=${PYTHON_TORCH2:-}
ANCHOR=${ANCHOR:-$repo/tests/bench/torch_anchor.py}
STEPS=${BENCH_STEPS:-20}
THREADS=${BENCH_THREADS:-$(nproc)}
RUNS=${BENCH_RUNS:-3}
IMAGES=${BENCH_IMAGES:-8192}
CPUINFO=${BENCH_CPUINFO:-/proc/cpuinfo}
work=$(mktemp -d /tmp/cifar-bench-torch.XXXXXX)
trap 'rm -rf "$work"' EXIT

# ---- the anchors ----
anchors=()
declare -A anchor_name=([torch1]="PyTorch 1.13 eager" [torch2]="PyTorch 2.x eager"
  [torch2cl]="PyTorch 2.x --channels-last" [torch2bf16]="PyTorch 2.x --amp bf16"
  [torch2c]="PyTorch 2.x --compile" [torch2best]="PyTorch 2.x --compile --amp bf16 --channels-last")
declare -A anchor_args=([torch1]="" [torch2]="" [torch2cl]="--channels-last" [torch2bf16]="--amp bf16"
  [torch2c]="--compile" [torch2best]="--compile --amp bf16 --channels-last")
torch2_anchors=(torch2 torch2cl torch2bf16 torch2c torch2best)
declare -A anchor_py=([torch1]="$PYTHON_TORCH")
for a in "${torch2_anchors[@]}"; do anchor_py[$a]=$PYTHON_TORCH2; done
have_torch() { [ -f "$ANCHOR" ] && "$1" -c 'import torch' 2>/dev/null; }
missing_torch2() { # why
  local a
  for a in "${torch2_anchors[@]}"; do echo "SKIP anchor ${anchor_name[$a]}: $1"; done
}
if have_torch "$PYTHON_TORCH"; then anchors+=(torch1); else echo "SKIP anchor PyTorch 1.13 eager: $ANCHOR or torch for $PYTHON_TORCH missing"; fi
if [ -z "$PYTHON_TORCH2" ]; then
  missing_torch2 "set PYTHON_TORCH2 to a python with PyPI's torch 2.x (a venv: pip install torch)"
elif have_torch "$PYTHON_TORCH2"; then
  anchors+=("${torch2_anchors[@]}")
else
  missing_torch2 "no torch for PYTHON_TORCH2=$PYTHON_TORCH2"
fi
anchor_run() { # anchor: prints its JSON line; fails with its error when it fails
  local a=$1 line
  # shellcheck disable=SC2086 # the extra arguments are words
  if ! line=$("${anchor_py[$a]}" "$ANCHOR" --device cpu --batch 256 --threads "$THREADS" --steps "$STEPS" \
      --warmup 3 ${anchor_args[$a]} 2>"$work/err"); then
    echo "bench: ${anchor_name[$a]} failed:" >&2; tail -5 "$work/err" >&2; return 1
  fi
  tail -1 <<< "$line"
}

# ---- our rows ----
if [ -n "${BENCH_LMDB:-}" ]; then
  lmdb=$BENCH_LMDB
else
  "$BIN/cifar-synth" "$work/data" --train "$IMAGES" --test 512 --seed 3 >/dev/null 2>&1
  "$BIN/cifar-prep" --quiet "$work/data" -o "$work/data.lmdb" >/dev/null
  lmdb=$work/data.lmdb
fi
precisions=(fp32)
echo "processor: $(sed -n 's/^model name[[:space:]]*: *//p' "$CPUINFO" | head -1)"
bf16_have=$(cpu_bf16_features "$CPUINFO")
if [ -n "$bf16_have" ]; then
  echo "bf16: the processor has $bf16_have ($CPUINFO)"
  precisions+=(bf16)
else
  bf16_lacking_line "$CPUINFO"
fi
# cifar-train's images/s over one epoch at this precision; status 2 (its stderr kept in
# $work/err) when it refuses bf16 as bad usage, 1 (with its error) on any other failure.
train_ips() { # precision
  local dir=$work/run-$1-$r rc=0
  "$BIN/cifar-train" --quiet --device cpu --epochs 1 --batch-size 256 --threads "$THREADS" \
      --precision "$1" --run-dir "$dir" "$lmdb" >/dev/null 2>"$work/err" || rc=$?
  if [ "$rc" = 0 ]; then field images_per_s < "$dir/metrics.jsonl"; return 0; fi
  if [ "$rc" = 2 ] && [ "$1" = bf16 ]; then return 2; fi
  echo "bench: cifar-train --precision $1 failed (exit $rc):" >&2; tail -5 "$work/err" >&2; return 1
}
declare -A ours_name=([t1]="ours, bench_train 1 thread" [tn]="ours, bench_train $THREADS threads"
  [fp32]="ours, cifar-train fp32" [bf16]="ours, cifar-train --precision bf16")

# ---- the rounds ----
echo "-- $RUNS rounds; in each: ours, then every anchor (batch 256, $THREADS threads but the 1-thread row; bench_train and the anchors: the mean of $STEPS steps after 3 warm-up steps; cifar-train: 1 epoch of $IMAGES images)"
for k in t1 tn "${precisions[@]}" "${anchors[@]}"; do : > "$work/$k"; done
for r in $(seq "$RUNS"); do
  echo "-- round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  one=$("$BENCH_TRAIN" --batch 256 --threads 1 --steps "$STEPS" 2>/dev/null)
  echo "${ours_name[t1]}: $one"; echo "$one" >> "$work/t1"
  if [ "$r" -lt "$RUNS" ]; then
    many=$("$BENCH_TRAIN" --batch 256 --threads "$THREADS" --steps "$STEPS" 2>/dev/null)
  else # the last round shows where the time goes
    many=$("$BENCH_TRAIN" --batch 256 --threads "$THREADS" --steps "$STEPS")
  fi
  echo "${ours_name[tn]}: $many"; echo "$many" >> "$work/tn"
  for p in "${precisions[@]}"; do
    rc=0; ips=$(train_ips "$p") || rc=$?
    if [ "$rc" = 2 ]; then # refused: said once, in the first round; later, a failure
      if [ "$r" = 1 ]; then bf16_refused_line "$work/err"; precisions=(fp32); unset "ours_name[bf16]"; continue; fi
      cat "$work/err" >&2
    fi
    [ "$rc" = 0 ] || exit 1
    echo "${ours_name[$p]}: $ips images/s"; echo "{\"images_per_s\": $ips}" >> "$work/$p"
  done
  for a in "${anchors[@]}"; do
    line=$(anchor_run "$a")
    echo "${anchor_name[$a]}: $line"; echo "$line" >> "$work/$a"
  done
done

# ---- what the rounds say ----
echo "-- $RUNS rounds: ranges and medians, images/s (images_per_s: the mean step; bench_train also prints the median and fastest step)"
for f in images_per_s images_per_s_median images_per_s_peak; do
  awk -v f="$f" -v a="$(column "$f" < "$work/t1" | range)" -v b="$(column "$f" < "$work/tn" | range)" \
      -v x="$(column "$f" < "$work/t1" | largest)" -v y="$(column "$f" < "$work/tn" | largest)" -v t="$THREADS" \
    'BEGIN { printf "bench_train %-20s 1 thread %s, %d threads %s; scaling (best against best) %.2fx\n", f, a, t, b, y / x }'
done
ours=(tn "${precisions[@]}")
summary_row() { # file, name
  printf '%-52s %s, median %.0f\n' "$2" "$(column images_per_s < "$work/$1" | range)" \
    "$(column images_per_s < "$work/$1" | median)"
}
for k in "${ours[@]}"; do summary_row "$k" "${ours_name[$k]}"; done
for a in "${anchors[@]}"; do summary_row "$a" "${anchor_name[$a]}"; done
# our row k against anchor a: "NAME Xx median against median, Yx best against best"
ratio() { # ours, anchor
  awk -v n="${ours_name[$1]#ours, }" -v om="$(column images_per_s < "$work/$1" | median)" \
      -v ob="$(column images_per_s < "$work/$1" | largest)" -v tm="$(column images_per_s < "$work/$2" | median)" \
      -v tb="$(column images_per_s < "$work/$2" | largest)" \
    'BEGIN { printf "%s %.2fx median against median, %.2fx best against best", n, om / tm, ob / tb }'
}
[ "${#anchors[@]}" -gt 0 ] || { echo "no PyTorch anchor ran: no ratios"; exit 0; }
for a in "${anchors[@]}"; do
  line="ours / ${anchor_name[$a]}:"
  for k in "${ours[@]}"; do line+=" $(ratio "$k" "$a");"; done
  echo "${line%;}"
done
best=${anchors[0]}
for a in "${anchors[@]}"; do
  awk -v x="$(column images_per_s < "$work/$a" | median)" -v y="$(column images_per_s < "$work/$best" | median)" \
    'BEGIN { exit !(x > y) }' && best=$a
done
echo "best PyTorch configuration here (the highest median): ${anchor_name[$best]}"
for k in "${precisions[@]}"; do
  awk -v r="$(ratio "$k" "$best")" -v om="$(column images_per_s < "$work/$k" | median)" \
      -v tm="$(column images_per_s < "$work/$best" | median)" \
    'BEGIN { printf "ours / the best PyTorch: %s; aim >= 2x: %s\n", r, (om >= 2 * tm) ? "met" : "not met" }'
done
