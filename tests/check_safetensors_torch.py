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
Here also: every loaded tensor equals the file's bit for bit.

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
        state = cifar_resnet.model_state(path, tensors)
        model = cifar_resnet.load_state(path, meta, state)
    except (OSError, cifar_resnet.SnapshotError) as e:
        fail(str(e))
    loaded = model.state_dict()
    for name, t in state.items():
        if not torch.equal(loaded[name], t):
            fail(f"{path}: tensor {name}: values changed on loading")
    skipped = len(tensors) - len(state)
    n_params = sum(p.numel() for p in model.parameters())
    shape = cifar_resnet.model_shape(meta)
    print(
        f"OK {path}: {len(state)} tensors loaded strictly ({n_params} parameters), "
        f"{skipped} optimizer tensors ignored, model {json.dumps(shape, separators=(',', ':'))}"
    )


if __name__ == "__main__":
    main()
