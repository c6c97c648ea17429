#!/usr/bin/env bash
# variants.sh: the tests whose claims depend on floating-point rounding (learning,
# accuracy, loss, tolerances against references), run again under every CPU
# instruction-set variant of the ops forced (CIFAR_CPU_ISA) and under other OpenBLAS
# kernels (OPENBLAS_CORETYPE) than the one this CPU picks, so that a threshold tuned to
# one machine's rounding fails here before it fails on a user's machine (make
# test-variants; .ci/run).
#
#   BIN=bin UNIT_DIR=build/cpu/tests [BATS_ENV="VAR=value ..."] tests/variants.sh
#
# The unit tests: test_reference (the executor against PyTorch), test_model, test_ops
# (finite differences in double: OpenBLAS's dgemm; float ops against double),
# test_bn_nhwc (the GPU batch norm's arithmetic against the CPU ops). The bats tests:
# train.bats's learning test, torch.bats's accuracy against cifar-eval and the
# reference check, eval.bats's loss over other batch sizes.
#
# OpenBLAS kernels: Sandybridge (AVX, no FMA: runs on every x86-64 CI machine and
# differs from any recent CPU's own pick) and a second one that differs from this CPU's
# own (OPENBLAS_VERBOSE=2 names it): Haswell, or SkylakeX where the CPU's own is
# Haswell and it has AVX-512. A variant or kernel this machine cannot run is not run,
# and the end of the output says so in capitals (NOT RUN), never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BIN:?set BIN, the folder of the commands}" "${UNIT_DIR:?set UNIT_DIR, the folder of the unit test binaries}"
UNIT_TESTS="test_reference test_model test_ops test_bn_nhwc"
BATS_TESTS=(
    "tests/train.bats:trains, learns, writes metrics"
    "tests/torch.bats:accuracy equals cifar-eval|rebuilds tests/data/reference.bin"
    "tests/eval.bats:paths: the snapshot from stdin"
)
failed=() not_run=() passed=()

cpu_has() { # flags...: every one in /proc/cpuinfo
    local f
    for f in "$@"; do grep -qw "$f" /proc/cpuinfo || return 1; done
}

# The OpenBLAS kernel a command gets: OpenBLAS prints "Core: NAME" when it loads with
# OPENBLAS_VERBOSE=2 (an empty OPENBLAS_CORETYPE is not the default: "Core not found").
blas_core() { # [OPENBLAS_CORETYPE value]: without one, the CPU's own
    if [ $# = 1 ]; then local OPENBLAS_CORETYPE=$1; export OPENBLAS_CORETYPE; fi
    OPENBLAS_VERBOSE=2 "$BIN/cifar-eval" --help 2>&1 | sed -n 's/^Core: //p' | head -1
}

# One configuration: every unit test, then the bats tests, with the given environment.
run_config() { # label, env assignments...
    local label=$1 t spec out rc=0
    shift
    echo "== variants: $label"
    for t in $UNIT_TESTS; do
        out=$(env "$@" "$UNIT_DIR/$t" 2>&1) || rc=$?
        if [ "$rc" = 2 ] && [[ "$out" == *"CIFAR_CPU_ISA="*"runs at most"* ]]; then
            not_run+=("$label: $out")
            echo "variants: NOT RUN: $label: $out"
            return 0
        fi
        echo "$out" | grep -E "checks, [0-9]+ failures|worst|loss|^FAIL|SKIP" | sed "s/^/  $t: /"
        [ "$rc" = 0 ] || { failed+=("$label: $t (exit $rc)"); rc=0; }
    done
    for spec in "${BATS_TESTS[@]}"; do
        env "$@" BIN="$BIN" PYTHON_TORCH="${PYTHON_TORCH:-/usr/bin/python3}" \
            bats -f "${spec#*:}" "${spec%%:*}" 2>&1 | sed 's/^/  /' || failed+=("$label: ${spec%%:*}")
    done
    passed+=("$label")
}

run_isa() { # generic | avx2 | avx512
    run_config "CIFAR_CPU_ISA=$1" CIFAR_CPU_ISA="$1"
}

run_blas() { # OpenBLAS core type
    local got
    got=$(blas_core "$1")
    if [ "$got" != "$1" ]; then
        not_run+=("OPENBLAS_CORETYPE=$1: OpenBLAS runs ${got:-an unknown kernel} instead")
        echo "variants: NOT RUN: OPENBLAS_CORETYPE=$1: OpenBLAS runs ${got:-an unknown kernel} instead"
        return 0
    fi
    # the own convolutions: their GEMMs are what another OpenBLAS kernel changes
    run_config "OPENBLAS_CORETYPE=$1 CIFAR_CPU_CONV=own" OPENBLAS_CORETYPE="$1" CIFAR_CPU_CONV=own
}

own=$(blas_core)
echo "variants: this CPU's OpenBLAS kernel is ${own:-unknown}"
run_isa generic
run_isa avx2
run_isa avx512
# the AVX-512 variant's own convolutions (its default runs them through oneDNN where it loads)
run_config "CIFAR_CPU_ISA=avx512 CIFAR_CPU_CONV=own" CIFAR_CPU_ISA=avx512 CIFAR_CPU_CONV=own
run_blas Sandybridge
if [ "$own" != Haswell ]; then
    run_blas Haswell
elif cpu_has avx512f avx512bw avx512vl avx512dq; then
    run_blas SkylakeX
else
    not_run+=("a second AVX2 kernel: the CPU's own is Haswell and it has no AVX-512 for SkylakeX")
fi

echo "== variants: summary"
for p in "${passed[@]}"; do echo "variants: run: $p"; done
for n in "${not_run[@]}"; do echo "variants: NOT RUN ON THIS MACHINE: $n"; done
for f in "${failed[@]}"; do echo "variants: FAILED: $f"; done
[ "${#failed[@]}" = 0 ]
