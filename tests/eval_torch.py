#!/usr/bin/python3
"""eval_torch.py: a snapshot's accuracy through python/cifar_resnet.py, for torch.bats.

    eval_torch.py SNAPSHOT DATA.lmdb [GUESS]

Reads the split "test" of DATA.lmdb with mdb_dump (lmdb-utils), normalises it with
the snapshot's statistics (cifar_resnet.normalize), runs the model in eval mode and
prints "correct total". GUESS evaluates one of the wrong rebuilds a user made from
the README's prose instead (each loads with strict=True: same tensors, other
network): relu-stem (a ReLU after the stem's BN), stride-1x1 (the first block's
stride on its 1x1 conv1 instead of the 3x3 conv2), stride-every-stage (the first
block of every stage strided, not only the network's first).
"""
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import cifar_resnet  # noqa: E402
from dataset_record import parse_dump  # noqa: E402


def apply_guess(model, guess):
    base = model[0]
    if guess == "relu-stem":
        bn = base.bn
        base.bn = torch.nn.Sequential(bn, torch.nn.ReLU())
        # the Sequential renames bn's tensors (bn.0.weight): the strict load came first
    elif guess == "stride-1x1":
        first = base.blocks[0]
        first.conv1.stride, first.conv2.stride = first.conv2.stride, (1, 1)
    elif guess == "stride-every-stage":
        cin = base.conv.out_channels
        for block in base.blocks:
            if block.conv3.out_channels != cin:  # a stage's first block
                block.conv2.stride = (2, 2)
                block.shortcut.conv.stride = (2, 2)
            cin = block.conv3.out_channels
    elif guess is not None:
        sys.exit(f"eval_torch.py: unknown guess {guess}")
    return model


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    snapshot, lmdb = sys.argv[1], sys.argv[2]
    model, meta = cifar_resnet.load(snapshot)  # strict=True, eval mode
    model = apply_guess(model, sys.argv[3] if len(sys.argv) == 4 else None)
    shape = cifar_resnet.model_shape(meta)
    dump = subprocess.run(["mdb_dump", "-n", "-s", "test", lmdb], check=True,
                          capture_output=True, text=True).stdout
    labels, pixels = zip(*parse_dump(dump.splitlines(keepends=True), "test"))
    hwc = (shape["img_height"], shape["img_width"], shape["img_channels"])
    images = torch.frombuffer(bytearray(b"".join(pixels)), dtype=torch.uint8).reshape(len(labels), *hwc)
    with torch.no_grad():
        predicted = model(cifar_resnet.normalize(images, meta)).argmax(dim=1)
    correct = int((predicted == torch.tensor(labels)).sum())
    print(correct, len(labels))


if __name__ == "__main__":
    main()
