#!/usr/bin/env bash
# resume.sh: fault tolerance, shown on a small synthetic dataset.
#
#   pipelines/resume.sh
#
# A. Crash and rerun: cifar-train is SIGKILLed (a crash, an OOM kill, a preempted
#    node) once its first snapshot is on disk; the same command, run again, resumes
#    from the latest snapshot (it logs "resuming from ...") and finishes the run.
# B. Worker failure under the launcher: two worker processes, a snapshot every step;
#    rank 1's is SIGKILLed once the first snapshot is on disk; the launcher stops the other, restarts the
#    group from the latest snapshot (--max-restarts), and the run ends normally with
#    "restarts":1 in its metrics.
# Both runs are then evaluated with cifar-eval.
#
# Environment (all optional): BIN=(../bin, PREFIX/bin or PATH) WORK=data/resume-demo RUN_DIR=run/resume-demo
#   EPOCHS=6 TRAIN_IMAGES=2000 TEST_IMAGES=200 SIZE=16 BATCH=64
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=resume.sh

case "${1:-}" in
  -h|--help) sed -n '2,18s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
  '') ;;
  *) echo "$me: no arguments (settings come from the environment); see --help" >&2; exit 2 ;;
esac

. "$here/cifar-bin.sh"
WORK=${WORK:-data/resume-demo}
RUN_DIR=${RUN_DIR:-run/resume-demo}
EPOCHS=${EPOCHS:-6}
TRAIN_IMAGES=${TRAIN_IMAGES:-2000}
TEST_IMAGES=${TEST_IMAGES:-200}
SIZE=${SIZE:-16}
BATCH=${BATCH:-64}
for c in cifar-synth cifar-prep cifar-train cifar-eval; do
  [ -x "$BIN/$c" ] || { echo "$me: $BIN/$c: not built; run make first" >&2; exit 1; }
done

say() { printf '\n== %s\n' "$*" >&2; }
# Wait (up to 10 minutes) for a snapshot in $1 while process $2 is alive.
wait_snapshot() {
  for _ in $(seq 30000); do
    compgen -G "$1/snapshot-*.safetensors" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}
# The pid of the child of process $1 whose environment says RANK=$2 (the launcher's
# worker of that rank), from /proc.
rank_pid() {
  local p
  for p in $(cat "/proc/$1/task/$1/children" 2>/dev/null); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

rm -rf "$WORK" "$RUN_DIR"
mkdir -p "$RUN_DIR"
"$BIN/cifar-synth" "$WORK" --train "$TRAIN_IMAGES" --test "$TEST_IMAGES" --size "$SIZE" >/dev/null
lmdb=$("$BIN/cifar-prep" --quiet "$WORK" | tail -1)

# ---- A: crash, then the same command again ----
a=$RUN_DIR/crash
cmd=("$BIN/cifar-train" --device cpu --epochs "$EPOCHS" --batch-size "$BATCH"
     --save-every 1 --run-dir "$a" "$lmdb")
say "A. ${cmd[*]}  (killed with SIGKILL after its first snapshot)"
"${cmd[@]}" >/dev/null 2>"$RUN_DIR/crash.log" &
pid=$!
wait_snapshot "$a" "$pid" || { echo "$me: no snapshot appeared; see $RUN_DIR/crash.log" >&2; exit 1; }
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
echo "killed after: $(cd "$a" && printf '%s ' snapshot-*.safetensors)" >&2
say "A. the same command again: it resumes"
"${cmd[@]}" >"$RUN_DIR/rerun.out" 2>"$RUN_DIR/rerun.log" ||
  { echo "$me: the resumed run failed; see $RUN_DIR/rerun.log" >&2; exit 1; }
grep -E "resuming|epoch [0-9]+/[0-9]+:" "$RUN_DIR/rerun.log" >&2 || true
final_a=$(tail -1 "$RUN_DIR/rerun.out")
if [ -z "$final_a" ] || [ ! -f "$final_a" ]; then echo "$me: the resumed run failed" >&2; exit 1; fi

# ---- B: one worker dies; the launcher restarts the group ----
b=$RUN_DIR/launcher
cmd=("$BIN/cifar-train" --device cpu --nproc-per-node 2 --threads 1 --max-restarts 2
     --epochs "$EPOCHS" --batch-size "$BATCH" --save-every 1 --save-every-steps 1 --run-dir "$b"
     "$lmdb")
# A snapshot every step: the kill comes right after the first one, with most of the
# run still ahead however short it is.
say "B. ${cmd[*]}  (rank 1's worker SIGKILLed after the first snapshot, as a crash would)"
"${cmd[@]}" >"$RUN_DIR/launcher.out" 2>"$RUN_DIR/launcher.log" &
launcher=$!
wait_snapshot "$b" "$launcher" || { echo "$me: no snapshot appeared; see $RUN_DIR/launcher.log" >&2; exit 1; }
too_short() { echo "$me: rank 1's worker had already ended: the run is too short to kill (raise EPOCHS); see $RUN_DIR/launcher.log" >&2; exit 1; }
worker=$(rank_pid "$launcher" 1) || too_short
kill -KILL "$worker" 2>/dev/null || too_short
echo "killed rank 1 (pid $worker) after: $(cd "$b" && printf '%s ' snapshot-*.safetensors)" >&2
wait "$launcher" || { echo "$me: the launcher gave up; see $RUN_DIR/launcher.log" >&2; exit 1; }
grep -iE "restart|resuming" "$RUN_DIR/launcher.log" >&2 || true
final_b=$(tail -1 "$RUN_DIR/launcher.out")
echo "last metrics line: $(tail -1 "$b/metrics.jsonl")" >&2

say "evaluation"
for s in "$final_a" "$final_b"; do
  echo "$s: $("$BIN/cifar-eval" --quiet --device cpu "$s" | sed -n 's/^accuracy: //p')"
done
