#!/usr/bin/env bats
# make bench's side-by-side section (tests/bench/bench_vs_torch.sh) and its bf16 accuracy
# script (tests/bench/bench_accuracy.sh), on stand-ins so that nothing here is timed or
# machine-dependent: a fake python for every PyTorch anchor (its images/s depend on the
# anchor's options only), a fake bench_train, a cifar-train wrapper that refuses bf16 or
# trains it as fp32 (cifar-train itself decides bf16 by the processor), and cpuinfo files
# with and without avx512_bf16. What is checked is the bench's bookkeeping: every anchor
# in every round, each missing anchor named, bf16 reported only where the processor has
# it (else one line), a refusal said once with cifar-train's reason, the best PyTorch
# configuration and the ratios against it.

bats_require_minimum_version 1.5.0
load helpers

BENCH=$BATS_TEST_DIRNAME/bench

setup_file() {
    local d=$BATS_FILE_TMPDIR
    make_dataset "$d/data" --train 256 --test 64 --size 16 --seed 4
    export BENCH_LMDB=$d/data/cifar10.lmdb
    # python: "-c CODE" (the bench asks for torch) succeeds; otherwise torch_anchor.py's
    # line, 100 images/s + 10 for --channels-last, + 20 for --amp bf16, + 30 for --compile
    cat > "$d/python" <<'EOF'
#!/bin/sh
[ "$1" = -c ] && exit 0
[ -n "$FAKE_ANCHOR_FAIL" ] && { echo "torch_anchor: broken on purpose" >&2; exit 1; }
ips=100
case " $* " in *" --channels-last "*) ips=$((ips + 10)) ;; esac
case " $* " in *" --amp bf16 "*) ips=$((ips + 20)) ;; esac
case " $* " in *" --compile "*) ips=$((ips + 30)) ;; esac
echo "{\"impl\": \"fake\", \"images_per_s\": $ips}"
EOF
    cat > "$d/bench_train" <<'EOF'
#!/bin/sh
echo '{"impl":"fake","images_per_s":500.0,"images_per_s_median":510.0,"images_per_s_peak":520.0}'
EOF
    # cifar-train that refuses bf16 (FAKE_BF16=refuse, exit 2 as for bad usage) or trains
    # it as fp32 (FAKE_BF16=accept); every other command is the real one
    mkdir "$d/bin"
    cat > "$d/bin/cifar-train" <<EOF
#!/bin/bash
args=()
for a in "\$@"; do
    if [ "\$a" = bf16 ]; then
        [ "\$FAKE_BF16" = accept ] || { echo "cifar-train: bf16 refused on purpose ---> HINT: none" >&2; exit 2; }
        a=fp32
    fi
    args+=("\$a")
done
exec "$BIN/cifar-train" "\${args[@]}"
EOF
    for c in cifar-eval cifar-synth cifar-prep; do ln -s "$BIN/$c" "$d/bin/$c"; done
    chmod +x "$d/python" "$d/bench_train" "$d/bin/cifar-train"
    printf 'model name\t: Test CPU\nflags\t\t: fpu avx2 avx512f\n' > "$d/cpuinfo-fp32"
    printf 'model name\t: Test CPU\nflags\t\t: fpu avx2 avx512f avx512_bf16\n' > "$d/cpuinfo-bf16"
    export BIN=$d/bin BENCH_TRAIN=$d/bench_train PYTHON_TORCH=$d/python PYTHON_TORCH2=$d/python
    export BENCH_STEPS=1 BENCH_THREADS=1
}

# The bench's lines that start with $1, counted.
count_lines() { # prefix
    grep -c -F -x -e "$1" <(cut -d: -f1 <<< "$output")
}

ANCHORS=("PyTorch 1.13 eager" "PyTorch 2.x eager" "PyTorch 2.x --channels-last" "PyTorch 2.x --amp bf16"
    "PyTorch 2.x --compile" "PyTorch 2.x --compile --amp bf16 --channels-last")

@test "bench_vs_torch: every anchor and our fp32 row in every round, ranges, the best PyTorch and the ratios; no bf16 where the processor lacks it" {
    BENCH_RUNS=3 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-fp32 run -0 "$BENCH/bench_vs_torch.sh"
    for a in "${ANCHORS[@]}"; do
        [ "$(count_lines "$a")" = 3 ] || { echo "anchor $a: not in each of the 3 rounds"; false; }
    done
    for o in "ours, bench_train 1 thread" "ours, bench_train 1 threads" "ours, cifar-train fp32"; do
        [ "$(count_lines "$o")" = 3 ] || { echo "row $o: not in each of the 3 rounds"; false; }
    done
    assert_line "bf16: not measured: this processor lacks AVX512-BF16 and AMX (no avx512_bf16 or amx_bf16 in $BATS_FILE_TMPDIR/cpuinfo-fp32): fp32 only"
    refute_output --partial "cifar-train --precision bf16"
    assert_line --regexp '^PyTorch 2.x --compile --amp bf16 --channels-last +160 to 160, median 160$'
    assert_line --regexp '^PyTorch 2.x --channels-last +110 to 110, median 110$'
    assert_line --regexp '^ours, cifar-train fp32 +[0-9]+ to [0-9]+, median [0-9]+$'
    assert_line "best PyTorch configuration here (the highest median): PyTorch 2.x --compile --amp bf16 --channels-last"
    assert_line --regexp '^ours / the best PyTorch: cifar-train fp32 [0-9.]+x median against median, [0-9.]+x best against best; aim >= 2x: (met|not met)$'
    assert_line --regexp '^ours / PyTorch 2.x --amp bf16: bench_train 1 threads 4.17x median against median, 4.17x best against best; cifar-train fp32 '
    assert_line --regexp '^bench_train images_per_s +1 thread 500 to 500, 1 threads 500 to 500; scaling \(best against best\) 1.00x$'
}

@test "bench_vs_torch: where the processor has bf16, cifar-train's bf16 row in every round and its ratio against the best PyTorch" {
    FAKE_BF16=accept BENCH_RUNS=2 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-bf16 run -0 "$BENCH/bench_vs_torch.sh"
    assert_line "bf16: the processor has avx512_bf16 ($BATS_FILE_TMPDIR/cpuinfo-bf16)"
    [ "$(count_lines "ours, cifar-train --precision bf16")" = 2 ]
    [ "$(count_lines "ours, cifar-train fp32")" = 2 ]
    assert_line --regexp '^ours / the best PyTorch: cifar-train --precision bf16 [0-9.]+x median against median, [0-9.]+x best against best; aim >= 2x: (met|not met)$'
    refute_output --partial "not measured"
}

@test "bench_vs_torch: cifar-train refusing bf16 is said once with its reason, and fp32 only is reported" {
    FAKE_BF16=refuse BENCH_RUNS=2 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-bf16 run -0 "$BENCH/bench_vs_torch.sh"
    assert_line "bf16: not measured: cifar-train refuses --precision bf16 here (exit 2): cifar-train: bf16 refused on purpose ---> HINT: none"
    [ "$(grep -c "not measured" <<< "$output")" = 1 ]
    [ "$(count_lines "ours, cifar-train fp32")" = 2 ]
    refute_output --partial "cifar-train --precision bf16"
}

@test "bench_vs_torch: without PYTHON_TORCH2 each PyTorch 2.x anchor is named as missing and the bench still runs" {
    PYTHON_TORCH2='' BENCH_RUNS=1 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-fp32 run -0 "$BENCH/bench_vs_torch.sh"
    for a in "${ANCHORS[@]:1}"; do
        assert_line "SKIP anchor $a: set PYTHON_TORCH2 to a python with PyPI's torch 2.x (a venv: pip install torch)"
        [ "$(count_lines "$a")" = 0 ]
    done
    [ "$(count_lines "PyTorch 1.13 eager")" = 1 ]
    assert_line "best PyTorch configuration here (the highest median): PyTorch 1.13 eager"
    PYTHON_TORCH2=/bin/false BENCH_RUNS=1 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-fp32 run -0 "$BENCH/bench_vs_torch.sh"
    assert_line "SKIP anchor PyTorch 2.x --compile: no torch for PYTHON_TORCH2=/bin/false"
}

@test "bench_vs_torch: an anchor that fails fails the bench with its error" {
    FAKE_ANCHOR_FAIL=1 BENCH_RUNS=1 BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-fp32 run -1 "$BENCH/bench_vs_torch.sh"
    assert_output --partial "bench: PyTorch 1.13 eager failed:"
    assert_output --partial "torch_anchor: broken on purpose"
}

@test "bench_accuracy: both precisions per seed, their difference and the mean; fp32 only, said once, where the processor lacks bf16" {
    export ACC_TRAIN=128 ACC_TEST=64 ACC_EPOCHS=1 ACC_BATCH=64 ACC_SEEDS="0 1"
    FAKE_BF16=accept BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-bf16 run -0 "$BENCH/bench_accuracy.sh"
    # bf16 is fp32 here (the wrapper): same seed, same weights, a difference of 0
    assert_line --regexp '^seed 0: fp32 accuracy ([0-9.]+)% \(last train loss [0-9.]+\), bf16 [0-9.]+% \([0-9.]+\), bf16 - fp32 \+0.00 points$'
    assert_line --regexp '^seed 1: fp32 accuracy '
    assert_line --regexp '^mean over 2 seeds: fp32 [0-9.]+%, bf16 [0-9.]+%, bf16 - fp32 \+0.00 points \(fp32 alone spans [0-9.]+ to [0-9.]+% across the seeds\)$'
    BENCH_CPUINFO=$BATS_FILE_TMPDIR/cpuinfo-fp32 run -0 "$BENCH/bench_accuracy.sh"
    assert_line "bf16: not measured: this processor lacks AVX512-BF16 and AMX (no avx512_bf16 or amx_bf16 in $BATS_FILE_TMPDIR/cpuinfo-fp32): fp32 only"
    assert_line --regexp '^seed 1: fp32 accuracy [0-9.]+% \(last train loss [0-9.]+\)$'
    refute_output --partial "mean over"
}
