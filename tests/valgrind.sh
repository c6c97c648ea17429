#!/usr/bin/env bash
# tests/valgrind.sh: memcheck over a short prep, train (fresh and resumed) and eval on
# tiny data. Any invalid read/write, use of uninitialised memory or definite leak fails
# (--error-exitcode). Slow (each command runs ~30x slower), so not part of CI:
#   make test-valgrind          (BIN=bin by default)
# Leaks still reachable at exit from OpenMP/OpenBLAS thread pools are not errors.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
command -v valgrind >/dev/null || { echo "valgrind: not installed (apt-get install valgrind)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

VG=(valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --track-origins=yes --child-silent-after-fork=no
    --suppressions=tests/valgrind.supp)

check() { # name command...
    local name=$1; shift
    local start=$SECONDS
    if "${VG[@]}" --log-file="$T/$name.vg" "$@" > "$T/$name.out" 2> "$T/$name.err"; then
        echo "valgrind: $name: clean ($((SECONDS - start)) s)"
    else
        echo "valgrind: $name: FAILED (status $?)" >&2
        cat "$T/$name.vg" "$T/$name.err" >&2
        exit 1
    fi
}

"$BIN/cifar-synth" "$T/data" --train 64 --test 16 --size 8 --jpeg-fraction 0.5 --seed 2 >/dev/null
echo '{"n_channels":[4,8],"bottlenecks":[2,4],"n_blocks":[1,1],"first_kernel_size":3}' > "$T/model.json"
check prep "$BIN/cifar-prep" --quiet --threads 2 "$T/data"
TRAIN=(--quiet --threads 2 --batch-size 16 --save-every 1 --model "$T/model.json" --run-dir "$T/run")
check train "$BIN/cifar-train" "${TRAIN[@]}" --epochs 1 "$T/data/cifar10.lmdb"
check train-resume "$BIN/cifar-train" "${TRAIN[@]}" --epochs 2 "$T/data/cifar10.lmdb"
check eval "$BIN/cifar-eval" --quiet --threads 2 "$(tail -1 "$T/train-resume.out")"
# Bad inputs take the error paths.
head -c 300 "$(tail -1 "$T/train-resume.out")" > "$T/cut.safetensors"
if "${VG[@]}" --log-file="$T/bad.vg" "$BIN/cifar-eval" --quiet "$T/cut.safetensors" >/dev/null 2>&1; then
    echo "valgrind: eval of a truncated snapshot succeeded" >&2; exit 1
elif [ $? -eq 99 ]; then
    echo "valgrind: eval of a truncated snapshot: memcheck errors" >&2; cat "$T/bad.vg" >&2; exit 1
fi
echo "valgrind: eval-bad-snapshot: clean"
echo "valgrind: all clean"
