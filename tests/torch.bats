#!/usr/bin/env bats
# The PyTorch side (python/cifar_resnet.py): the README's load-evaluate-export block
# runs as written, the module's accuracy on a trained snapshot of the seed's network
# equals cifar-eval's and three wrong rebuilds of the network (each loads with
# strict=True) do not, and tests/make_reference.py rebuilds tests/data/reference.bin
# with the module; an --ema snapshot loads its moving average, as cifar-eval does.
# python3-torch is in `make deps`: nothing here skips.

bats_require_minimum_version 1.5.0
load helpers

REPO=$(cd "$BATS_TEST_DIRNAME/.." && pwd)

setup_file() {
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 1024 --test 256 --size 16 --seed 11
    export LMDB="$DATA/cifar10.lmdb"
    # the seed's network (the default shape), trained far enough to tell networks apart
    "$BIN/cifar-train" --quiet --epochs 6 --batch-size 64 --threads 2 \
        --run-dir "$BATS_FILE_TMPDIR/run" "$LMDB" > "$BATS_FILE_TMPDIR/final"
    export SNAP
    SNAP=$(tail -1 "$BATS_FILE_TMPDIR/final")
}

# The fenced python block between <!-- pytorch --> and <!-- /pytorch --> in README.md.
readme_pytorch_block() {
    awk '/<!-- pytorch -->/ { on = 1; next } /<!-- \/pytorch -->/ { on = 0 }
         on && /^```/ { fence = !fence; next }
         on && fence' "$REPO/README.md"
}

correct_of() { # snapshot: cifar-eval's count of correct test images
    "$BIN/cifar-eval" --quiet --json --threads 2 "$1" | sed 's/.*"correct":\([0-9]*\).*/\1/'
}

@test "README's PyTorch block: load, evaluate and export to ONNX, run as written" {
    run readme_pytorch_block
    assert_success
    assert_output --partial "cifar_resnet.load("
    assert_output --partial "torch.onnx.export("
    [ "${#lines[@]}" -le 4 ]
    # the block as written, in a copy of python/, with the README's snapshot path
    # replaced by this test's and a batch of dataset pixels as `images`
    mkdir -p "$BATS_TEST_TMPDIR/w/run/demo"
    cp -r "$REPO/python" "$BATS_TEST_TMPDIR/w/python"
    ln -s "$SNAP" "$BATS_TEST_TMPDIR/w/run/demo/snapshot-000376.safetensors"
    { echo 'import torch'
      echo 'images = torch.randint(0, 256, (5, 16, 16, 3), dtype=torch.uint8)'
      readme_pytorch_block
      echo 'assert predicted.shape == (5,), predicted.shape'
      echo 'print("predicted", predicted.tolist())'
    } > "$BATS_TEST_TMPDIR/w/example.py"
    cd "$BATS_TEST_TMPDIR/w"
    run "$PY" example.py
    assert_success
    assert_output --partial "predicted ["
    # an ONNX model (a protobuf ModelProto: ir_version first, producer pytorch) of the network
    [ "$(head -c 1 model.onnx | od -An -tx1 | tr -d ' ')" = 08 ]
    for op in pytorch Conv Relu ReduceMean Gemm; do
        grep -qa "$op" model.onnx || { echo "model.onnx: no $op"; false; }
    done
}

# cifar-eval and the module compute the same network in float32 with other kernels: a
# prediction can differ only where two logits tie to within rounding (~1e-5 relative),
# so "within 2 images of 256" (0 here). Each wrong rebuild changes the function itself.
@test "the module's accuracy equals cifar-eval's; three wrong rebuilds that load strictly do not" {
    want=$(correct_of "$SNAP")
    echo "# cifar-eval: $want/256 correct" >&3
    [ "$want" -ge 64 ] # a trained network (chance: 26), or the comparison means little
    run "$PY" "$BATS_TEST_DIRNAME/eval_torch.py" "$SNAP" "$LMDB"
    assert_success
    echo "# cifar_resnet: ${output% *}/256" >&3
    got=${output% *}
    [ "${output#* }" = 256 ]
    diff=$((got - want))
    [ "${diff#-}" -le 2 ]
    for guess in relu-stem stride-1x1 stride-every-stage; do
        run "$PY" "$BATS_TEST_DIRNAME/eval_torch.py" "$SNAP" "$LMDB" "$guess"
        assert_success
        echo "# $guess: ${output% *}/256" >&3
        diff=$((${output% *} - want))
        [ "${diff#-}" -gt 2 ]
    done
}

@test "tests/make_reference.py rebuilds tests/data/reference.bin with python/cifar_resnet.py" {
    run "$PY" "$BATS_TEST_DIRNAME/make_reference.py" --check "$BATS_TEST_DIRNAME/data/reference.bin"
    assert_success
    assert_output --partial "matches"
}

@test "cifar_resnet.load takes an --ema snapshot's moving average, as cifar-eval does" {
    "$BIN/cifar-train" --quiet --epochs 2 --batch-size 64 --threads 2 --ema 0.9 --ema-warmup \
        --run-dir "$BATS_TEST_TMPDIR/ema" "$LMDB" > "$BATS_TEST_TMPDIR/final"
    snap=$(tail -1 "$BATS_TEST_TMPDIR/final")
    want=$(correct_of "$snap")
    run "$PY" "$BATS_TEST_DIRNAME/eval_torch.py" "$snap" "$LMDB"
    assert_success
    echo "# cifar-eval (the average): $want/256, cifar_resnet: ${output% *}/256" >&3
    diff=$((${output% *} - want))
    [ "${diff#-}" -le 2 ]
}
