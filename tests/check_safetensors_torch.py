#!/usr/bin/python3
"""Load a cifar-train snapshot into the project's PyTorch model, strictly.

    /usr/bin/python3 tests/check_safetensors_torch.py run/snapshot-000030.safetensors

This is what a user with plain PyTorch (1.13 here, no `safetensors` package) does
with a snapshot, through python/cifar_resnet.py (the module the README shows): parse
the safetensors layout with json + struct (every size and the data checksum
checked), build nn.Sequential(ResNetBase(...), nn.Linear(n_channels[-1], K)) for the
"model" JSON in __metadata__ (the seed Config when absent) and
load_state_dict(strict=True), refusing a dtype the model does not have. The
"optimizer.*" tensors are training state, not model weights, and are left out.
A snapshot of a run with --ema also holds the moving average as a second state
dict under "ema.": it must load strictly into the same model too. Here also:
every loaded tensor equals the file's bit for bit.

Prints "OK ..." and exits 0, or prints the reason and exits 1.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import cifar_resnet  # noqa: E402


def fail(reason):
    print(f"check_safetensors_torch: {reason}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print("usage: check_safetensors_torch.py FILE.safetensors", file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    import torch

    try:
        meta, tensors = cifar_resnet.read_safetensors(path)
        prefixes = ["", "ema."] if cifar_resnet.has_ema(tensors) else [""]
        states = [cifar_resnet.model_state(path, tensors, p) for p in prefixes]
        models = [cifar_resnet.load_state(path, meta, s) for s in states]
    except (OSError, cifar_resnet.SnapshotError) as e:
        fail(str(e))
    for prefix, model, state in zip(prefixes, models, states):
        loaded = model.state_dict()
        for name, t in state.items():
            if not torch.equal(loaded[name], t):
                fail(f"{path}: tensor {prefix}{name}: values changed on loading")
    state, model = states[0], models[0]
    ema = len(states[1]) if len(states) > 1 else 0
    skipped = len(tensors) - len(state) - ema
    n_params = sum(p.numel() for p in model.parameters())
    shape = cifar_resnet.model_shape(meta)
    print(
        f"OK {path}: {len(state)} tensors loaded strictly ({n_params} parameters), "
        f"{skipped} optimizer tensors ignored, {ema} moving-average tensors loaded strictly too, "
        f"model {json.dumps(shape, separators=(',', ':'))}"
    )


if __name__ == "__main__":
    main()
