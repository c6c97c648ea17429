#!/usr/bin/python3
"""Load a cifar-train snapshot into the seed's PyTorch model, strictly.

    /usr/bin/python3 tests/check_safetensors_torch.py run/snapshot-000030.safetensors

This is what a user with plain PyTorch (1.13 here, no `safetensors` package)
does with a snapshot: parse the safetensors layout with json + struct, build the
seed network nn.Sequential(ResNetBase(...), nn.Linear(n_channels[-1], K)) and
load_state_dict(strict=True). The "optimizer.*" tensors are training state, not
model weights, and are left out. The network's shape comes from the "model"
JSON in __metadata__ (the seed Config's fields plus img_channels, num_classes),
else the seed Config with 3 image channels and 10 classes. The data checksum is
recomputed here too, independently of the C reader.

The seed code is found in ../shared/seed relative to the repository root, or
in $SEED_DIR. Prints "OK ..." and exits 0, or prints the reason and exits 1.
"""
import json
import os
import struct
import sys

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def fail(path, reason):
    print(f"check_safetensors_torch: {path}: {reason}", file=sys.stderr)
    sys.exit(1)


def fnv1a64(data):
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return h


def read_safetensors(path):
    """(metadata dict, {name: (dtype, shape, bytes)}) in header order."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(path, f"too short for a safetensors file ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        fail(path, f"header length {n} but only {len(blob) - 8} bytes follow")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(path, f"header is not valid JSON: {e}")
    data = blob[8 + n :]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            fail(path, f"tensor {name}: data_offsets {begin},{end} outside the data section")
        tensors[name] = (entry["dtype"], entry["shape"], data[begin:end])
    return meta, tensors, data


def to_torch(torch, name, dtype, shape, raw, path):
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    if dtype not in dtypes:
        fail(path, f"tensor {name}: unexpected dtype {dtype}")
    numel = 1
    for d in shape:
        numel *= d
    if numel * torch.tensor([], dtype=dtypes[dtype]).element_size() != len(raw):
        fail(path, f"tensor {name}: shape {shape} does not match {len(raw)} bytes")
    if numel == 0:
        return torch.empty(shape, dtype=dtypes[dtype])
    # bytearray: frombuffer wants a writable buffer; the copy keeps the tensor valid
    return torch.frombuffer(bytearray(raw), dtype=dtypes[dtype]).reshape(shape).clone()


def seed_modules(path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    seed_dir = os.environ.get("SEED_DIR", os.path.join(root, "..", "shared", "seed"))
    if not os.path.isfile(os.path.join(seed_dir, "resnet.py")):
        fail(path, f"seed code not found in {seed_dir} (set SEED_DIR)")
    sys.path.insert(0, seed_dir)
    import config  # noqa: E402  (the seed's Config)
    import resnet  # noqa: E402

    return config.Config, resnet.ResNetBase


def model_config(meta, seed_config, path):
    cfg = {
        "n_channels": list(seed_config.n_channels),
        "bottlenecks": list(seed_config.bottlenecks),
        "n_blocks": list(seed_config.n_blocks),
        "first_kernel_size": seed_config.first_kernel_size,
        "img_channels": 3,
        "num_classes": 10,
    }
    if "model" in meta:
        try:
            given = json.loads(meta["model"])
        except json.JSONDecodeError as e:
            fail(path, f'__metadata__ "model" is not JSON: {e}')
        for key in cfg:
            if key in given:
                cfg[key] = given[key]
    return cfg


def main():
    if len(sys.argv) != 2:
        print("usage: check_safetensors_torch.py FILE.safetensors", file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    meta, tensors, data = read_safetensors(path)
    want = meta.get("data_checksum")
    if want is not None and f"{fnv1a64(data):016x}" != want:
        fail(path, f"data checksum {fnv1a64(data):016x} != header's {want}")

    import torch
    from torch import nn

    seed_config, ResNetBase = seed_modules(path)
    cfg = model_config(meta, seed_config, path)
    model = nn.Sequential(
        ResNetBase(
            n_blocks=cfg["n_blocks"],
            n_channels=cfg["n_channels"],
            bottelnecks=cfg["bottlenecks"],
            img_channels=cfg["img_channels"],
            first_kernel_size=cfg["first_kernel_size"],
        ),
        nn.Linear(cfg["n_channels"][-1], cfg["num_classes"]),
    )
    state = {}
    skipped = 0
    for name, (dtype, shape, raw) in tensors.items():
        if name.startswith("optimizer."):
            skipped += 1
            continue
        state[name] = to_torch(torch, name, dtype, shape, raw, path)
    expected = model.state_dict()
    # load_state_dict converts dtypes silently: an F32 step counter must fail here
    for name, t in state.items():
        if name in expected and expected[name].dtype != t.dtype:
            fail(path, f"tensor {name}: dtype {t.dtype}, the model has {expected[name].dtype}")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        fail(path, "load_state_dict(strict=True) failed: " + " ".join(str(e).split()))
    loaded = model.state_dict()
    for name, t in state.items():
        if not torch.equal(loaded[name], t):
            fail(path, f"tensor {name}: values changed on loading")
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"OK {path}: {len(state)} tensors loaded strictly ({n_params} parameters), "
        f"{skipped} optimizer tensors ignored, model {json.dumps(cfg, separators=(',', ':'))}"
    )


if __name__ == "__main__":
    main()
