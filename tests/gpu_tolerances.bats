#!/usr/bin/env bats
# tests/gpu/run.sh's comparisons of training curves (tests/gpu/tolerances.sh derives
# each tolerance), run here on recorded curves through run.sh --check-curves, no GPU:
# good runs that differ only in the order of their sums pass (even where they end 3
# chaotic epochs 40% apart, which the old 3% + 0.01 rule failed), and each planted
# fault fails with a line that names it.

bats_require_minimum_version 1.5.0
load helpers

REC="$BATS_TEST_DIRNAME/data/gpu_curves"
RUN_SH="$BATS_TEST_DIRNAME/gpu/run.sh"

# scale FILE FIELD FACTOR: FILE with FIELD multiplied by FACTOR on every line.
scale() {
    awk -v f="$2" -v k="$3" '{ if (match($0, "\"" f "\":[-0-9.e+]*")) {
        v = substr($0, RSTART + length(f) + 3, RLENGTH - length(f) - 3);
        $0 = substr($0, 1, RSTART - 1) "\"" f "\":" sprintf("%.6f", v * k) substr($0, RSTART + RLENGTH) } print }' "$1"
}

# A folder of good curves: fp32 "GPU" = another summation order of the CPU run, bf16
# = the fp32 GPU's scaled by 1% (inside BF16_REL), the same-arithmetic runs copies.
setup() {
    D="$BATS_TEST_TMPDIR/curves"
    mkdir -p "$D"
    cp "$REC/lr0_cpu_haswell.jsonl" "$D/lr0_cpu.jsonl"
    cp "$REC/lr0_cpu_sandybridge.jsonl" "$D/lr0_gpu.jsonl"
    scale "$REC/lr0_cpu_sandybridge.jsonl" train_loss 1.01 | scale /dev/stdin test_loss 0.99 >"$D/lr0_bf16.jsonl"
    cp "$REC/epochs3_cpu_auto.jsonl" "$D/cpu.jsonl"
    for f in gpu eager twokernel stream; do cp "$REC/epochs3_cpu_sandybridge.jsonl" "$D/$f.jsonl"; done
    cp "$REC/epochs3_cpu_nehalem.jsonl" "$D/bf16.jsonl"
    export OUT="$BATS_TEST_TMPDIR/out"
}

@test "recorded good curves pass every comparison" {
    run "$RUN_SH" --check-curves "$D"
    assert_success
    refute_output --partial FAIL
    assert_output --partial "PASS --lr 0: GPU fp32 train and test loss within FP32_REL=1e-2"
    assert_output --partial "PASS --lr 0: GPU bf16 train and test loss within BF16_REL=0.05"
    assert_output --partial "PASS 3 epochs, gpu: learns"
    assert_output --partial "PASS GPU stream: test_acc within SAME_REL=1e-4"
    # the pair the old rule (epoch by epoch within 3% + 0.01) would have failed
    run awk 'BEGIN { exit !(0.818497 - 0.583791 > 0.03 * 0.818497 + 0.01) }'
    assert_success
}

@test "the chance floor is chance plus six binomial standard deviations" {
    . "$BATS_TEST_DIRNAME/gpu/tolerances.sh"
    run tol_chance_floor 512
    assert_output 0.1795
    run tol_chance_floor 10000
    assert_output 0.1180
}

@test "a GPU fp32 forward 2% off the CPU's at --lr 0 fails" {
    scale "$REC/lr0_cpu_sandybridge.jsonl" train_loss 1.02 >"$D/lr0_gpu.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL --lr 0: GPU fp32 against the CPU: train_loss"
}

@test "a GPU test loss (BN running statistics) 2% off at --lr 0 fails" {
    scale "$REC/lr0_cpu_sandybridge.jsonl" test_loss 0.98 >"$D/lr0_gpu.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL --lr 0: GPU fp32 against the CPU: test_loss"
}

@test "bf16 10% off fp32 at --lr 0 fails" {
    scale "$REC/lr0_cpu_sandybridge.jsonl" train_loss 1.10 >"$D/lr0_bf16.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL --lr 0: GPU bf16 against GPU fp32: train_loss"
}

@test "a run that does not learn fails, and one that only guesses fails" {
    printf '{"epoch":1,"train_loss":2.31,"train_acc":0.1,"test_loss":2.30,"test_acc":0.11}\n' >"$D/gpu.jsonl"
    cp "$D/gpu.jsonl" "$D/eager.jsonl"
    cp "$D/gpu.jsonl" "$D/twokernel.jsonl"
    cp "$D/gpu.jsonl" "$D/stream.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL 3 epochs, gpu: does not learn: last train loss 2.31"
    # low loss but chance accuracy (a broken test pass)
    printf '{"epoch":1,"train_loss":0.5,"train_acc":0.8,"test_loss":2.30,"test_acc":0.17}\n' >"$D/bf16.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_output --partial "FAIL 3 epochs, bf16: does not learn: last train loss 0.5 (want < 1.1513), last test accuracy 0.17 (want > 0.1795)"
}

@test "a streamed run one test image off the resident run fails" {
    scale "$REC/epochs3_cpu_sandybridge.jsonl" test_acc 1.004 >"$D/stream.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL GPU stream: test_acc"
    refute_output --partial "FAIL GPU eager"
}

@test "a missing curve fails instead of passing" {
    rm "$D/lr0_bf16.jsonl" "$D/twokernel.jsonl"
    run "$RUN_SH" --check-curves "$D"
    assert_failure
    assert_output --partial "FAIL --lr 0: GPU bf16 against GPU fp32: train_loss"
    assert_output --partial "FAIL GPU twokernel: train_loss"
}

@test "run.sh --preflight: its first lines say what was found and what is missing" {
    run "$RUN_SH" --preflight
    # a GPU machine finds one, this one may not: either way the line is there
    assert_line --index 0 --partial "== 0. pre-flight"
    assert_line --regexp '^(found:   GPU: GPU 0|missing: GPU \(nvidia-smi lists none)'
    assert_line --regexp '^found:   gcc: [0-9]'
    assert_line --regexp '^found:   glibc: [0-9]'
    assert_line --regexp '^lookup:  '
    assert_line --regexp '^pre-flight: (nothing missing|missing: )'
    # a Python that is not there is named, and the status says so
    PYTHON_GPU=/nonexistent/python3 run "$RUN_SH" --preflight
    assert_failure
    assert_line --partial "missing: python (/nonexistent/python3)"
    assert_line --regexp '^pre-flight: missing: .*python \(/nonexistent/python3\)'
}
