#!/usr/bin/python3
"""The moving average of two consecutive snapshots of a cifar-train --ema run.

    /usr/bin/python3 tests/check_ema.py DECAY BEFORE.safetensors AFTER.safetensors [WARMUP_STEP]

AFTER must be one optimizer step after BEFORE (a run of one step per epoch,
snapshots every epoch). For every float tensor of the state dict (weights and
BN running statistics): ema.X(after) == DECAY * ema.X(before) + (1 - DECAY) * X(after),
computed here in float32 one rounding per operation, as ema.h does, so bit for
bit; the step counters of the average are the model's. With WARMUP_STEP
(--ema-warmup; the step index of AFTER's update, 0 for the first), DECAY is
replaced by min(DECAY, 1 - (1 + WARMUP_STEP)^(-2/3)) rounded to float32 (ema.h's
ema_decay_at). Prints "OK ..." and exits
0, or names the first tensor that differs and exits 1. numpy only.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from cifar_resnet import read_safetensors  # noqa: E402

DTYPES = {"F32": np.float32, "I64": np.int64}


def arrays(path):
    _, tensors = read_safetensors(path)
    return {name: np.frombuffer(raw, dtype=DTYPES[dtype]) for name, (dtype, _, raw) in tensors.items()}


def main():
    decay = np.float32(float(sys.argv[1]))
    if len(sys.argv) > 4:
        decay = np.float32(min(float(decay), 1.0 - (1.0 + int(sys.argv[4])) ** (-2.0 / 3.0)))
    before, after = arrays(sys.argv[2]), arrays(sys.argv[3])
    names = [n for n in after if not n.startswith(("ema.", "optimizer."))]
    if not all("ema." + n in after and "ema." + n in before for n in names):
        print("check_ema: a snapshot lacks the ema. tensors", file=sys.stderr)
        sys.exit(1)
    floats = 0
    for n in names:
        got = after["ema." + n]
        if after[n].dtype == np.int64:
            want = after[n]
        else:
            want = decay * before["ema." + n] + (np.float32(1) - decay) * after[n]
            floats += want.size
        if not np.array_equal(got, want):
            i = int(np.argmax(got != want))
            print(f"check_ema: ema.{n}[{i}] = {got[i]!r}, the rule gives {want[i]!r}", file=sys.stderr)
            sys.exit(1)
    changed = sum(int(np.sum(after["ema." + n] != after[n])) for n in names)
    print(f"OK: {len(names)} tensors, {floats} floats follow the rule (decay {decay!r}); {changed} differ from the weights")
    if changed == 0 and decay > 0:
        print("check_ema: the average equals the weights", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
