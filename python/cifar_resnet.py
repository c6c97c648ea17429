"""cifar_resnet.py: the network cifar-train trains, in PyTorch, and its snapshots.

    import sys; sys.path.insert(0, "python")        # this folder of the repository
    import cifar_resnet, torch
    model, meta = cifar_resnet.load("run/demo/snapshot-000376.safetensors")
    logits = model(cifar_resnet.normalize(images, meta))   # images: uint8 N x H x W x C
    torch.onnx.export(model, cifar_resnet.example_input(meta), "model.onnx")

The network is the seed's (its resnet.py ResNetBase + nn.Linear, as the README's
"The model" says): a stem conv (first_kernel_size, stride stem_stride, padding k//2)
and its BN with NO ReLU after them; stages of blocks, where only the very first block
of the whole network has a stride (first_block_stride), on its 3x3 conv (conv2 in a
bottleneck block, conv1 in a basic one) and on its 1x1 projection shortcut; a
projection shortcut (1x1 conv + BN) wherever the stride or the channel count changes;
ReLU after the residual add; a global mean pool; a linear classifier. The state_dict
keys are the snapshot's tensor names (0.conv.weight, 0.blocks.3.conv2.weight, ...,
1.weight), so load_state_dict(strict=True) takes a snapshot as it is. The modules are
created in the seed's order, so torch.manual_seed gives the seed's initial weights
(tests/make_reference.py relies on it).

Plain PyTorch (1.13 and newer); no safetensors package: the file is parsed with json
and struct, its sizes and data checksum (FNV-1a 64) checked.
"""
import json
import struct

import torch
from torch import nn

# The seed's Config (../shared/seed/config.py upstream) and the dataset's defaults:
# the shape of a snapshot whose metadata does not say.
DEFAULT_SHAPE = {
    "n_channels": [16, 32, 64],
    "bottlenecks": [8, 16, 16],
    "n_blocks": [6, 6, 6],
    "first_kernel_size": 3,
    "stem_stride": 2,
    "first_block_stride": 2,
    "img_channels": 3,
    "img_height": 32,
    "img_width": 32,
    "num_classes": 10,
}

SNAPSHOT_FORMAT = "cifar-snapshot"
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


class SnapshotError(ValueError):
    """A file that is not a readable cifar-train snapshot; the message names it."""


# ------------------------------------------------------------------ the network


class ShortcutProjection(nn.Module):
    """1x1 conv (with the block's stride) + BN, where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=1, stride=stride)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


def shortcut(cin, cout, stride):
    if stride != 1 or cin != cout:
        return ShortcutProjection(cin, cout, stride)
    return nn.Identity()


class ResidualBlock(nn.Module):
    """Basic block: 3x3 (stride) - BN - ReLU - 3x3 - BN, + shortcut, ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, kernel_size=3, stride=1, padding=1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = shortcut(cin, cout, stride)
        self.act2 = nn.ReLU()

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(y)) + self.shortcut(x))


class BottleneckResidualBlock(nn.Module):
    """1x1 - BN - ReLU - 3x3 (the stride) - BN - ReLU - 1x1 - BN, + shortcut, ReLU."""

    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, kernel_size=1, stride=1)
        self.bn1 = nn.BatchNorm2d(mid)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(mid, mid, kernel_size=3, stride=stride, padding=1)
        self.bn2 = nn.BatchNorm2d(mid)
        self.act2 = nn.ReLU()
        self.conv3 = nn.Conv2d(mid, cout, kernel_size=1, stride=1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = shortcut(cin, cout, stride)
        self.act3 = nn.ReLU()

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        y = self.act2(self.bn2(self.conv2(y)))
        return self.act3(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNetBase(nn.Module):
    """The stem and the blocks, ending in the global mean pool (N x n_channels[-1])."""

    def __init__(self, shape):
        super().__init__()
        k, chans, mids = shape["first_kernel_size"], shape["n_channels"], shape["bottlenecks"]
        self.conv = nn.Conv2d(shape["img_channels"], chans[0], kernel_size=k,
                              stride=shape["stem_stride"], padding=k // 2)
        self.bn = nn.BatchNorm2d(chans[0])  # no ReLU after the stem (the seed's model)
        blocks, cin = [], chans[0]
        for stage, cout in enumerate(chans):
            for index in range(shape["n_blocks"][stage]):
                # the stride: the network's very first block only, not every stage's
                stride = shape["first_block_stride"] if not blocks else 1
                if mids is None:
                    blocks.append(ResidualBlock(cin, cout, stride))
                else:
                    blocks.append(BottleneckResidualBlock(cin, mids[stage], cout, stride))
                cin = cout
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        x = self.blocks(self.bn(self.conv(x)))
        return x.view(x.shape[0], x.shape[1], -1).mean(dim=-1)


def model_shape(meta=None):
    """The network's shape: a snapshot's "model" metadata (JSON) over DEFAULT_SHAPE."""
    shape = dict(DEFAULT_SHAPE)
    text = (meta or {}).get("model")
    if text is not None:
        try:
            given = json.loads(text)
        except json.JSONDecodeError as e:
            raise SnapshotError(f'__metadata__ "model" is not JSON: {e}') from None
        shape.update({key: given[key] for key in DEFAULT_SHAPE if key in given})
    return shape


def build(shape=None):
    """nn.Sequential(ResNetBase, nn.Linear): the keys of a snapshot's state_dict."""
    shape = model_shape() if shape is None else {**DEFAULT_SHAPE, **shape}
    return nn.Sequential(ResNetBase(shape), nn.Linear(shape["n_channels"][-1], shape["num_classes"]))


# ----------------------------------------------------------------- the snapshot


def fnv1a64(data):
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return h


def read_safetensors(path, verify_checksum=True):
    """(metadata, {name: (dtype, shape, bytes)} in file order), every size checked."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SnapshotError(f"{path}: too short for a safetensors file ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SnapshotError(f"{path}: header length {n} but only {len(blob) - 8} bytes follow")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SnapshotError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SnapshotError(f"{path}: header is not a JSON object")
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    if meta.get("format", SNAPSHOT_FORMAT) != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{path}: format {meta['format']!r}, not a {SNAPSHOT_FORMAT}")
    want = meta.get("data_checksum")
    if verify_checksum and want is not None and f"{fnv1a64(data):016x}" != want:
        raise SnapshotError(f"{path}: data checksum {fnv1a64(data):016x} != the header's {want}")
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise SnapshotError(f"{path}: tensor {name}: data_offsets {begin},{end} "
                                f"outside the data section ({len(data)} bytes)")
        tensors[name] = (entry["dtype"], entry["shape"], data[begin:end])
    return meta, tensors


TORCH_DTYPES = {"F32": torch.float32, "I64": torch.int64}


def to_tensor(path, name, dtype, shape, raw):
    if dtype not in TORCH_DTYPES:
        raise SnapshotError(f"{path}: tensor {name}: unexpected dtype {dtype}")
    numel = 1
    for d in shape:
        numel *= d
    if numel * torch.tensor([], dtype=TORCH_DTYPES[dtype]).element_size() != len(raw):
        raise SnapshotError(f"{path}: tensor {name}: shape {shape} does not match {len(raw)} bytes")
    if numel == 0:
        return torch.empty(shape, dtype=TORCH_DTYPES[dtype])
    # bytearray: frombuffer wants a writable buffer; the copy owns its memory
    return torch.frombuffer(bytearray(raw), dtype=TORCH_DTYPES[dtype]).reshape(shape).clone()


def model_state(path, tensors, prefix=""):
    """The model's state_dict of read_safetensors' tensors: the "optimizer.*" ones
    (momentum: training state) and the moving average's "ema.*" left out; with
    prefix "ema.", the moving average (cifar-train --ema), the prefix stripped."""
    if prefix:
        return {name[len(prefix):]: to_tensor(path, name, *entry) for name, entry in tensors.items()
                if name.startswith(prefix)}
    return {name: to_tensor(path, name, *entry) for name, entry in tensors.items()
            if not name.startswith(("optimizer.", "ema."))}


def has_ema(tensors):
    """Whether the snapshot carries a moving average of its weights (cifar-train --ema)."""
    return any(name.startswith("ema.") for name in tensors)


def load(path, weights="ema"):
    """(model in eval mode, metadata): the snapshot loaded with strict=True. weights
    "ema": the moving average when the snapshot has one (as cifar-eval), else the
    trained weights; "raw": the trained weights."""
    meta, tensors = read_safetensors(path)
    prefix = "ema." if weights == "ema" and has_ema(tensors) else ""
    return load_state(path, meta, model_state(path, tensors, prefix)), meta


def load_state(path, meta, state):
    """The model for meta's shape with `state` loaded strictly, in eval mode; refuses a
    dtype the model does not have (load_state_dict would convert it)."""
    model = build(model_shape(meta))
    expected = model.state_dict()
    # load_state_dict converts dtypes silently: an F32 step counter must fail here
    for name, t in state.items():
        if name in expected and expected[name].dtype != t.dtype:
            raise SnapshotError(f"{path}: tensor {name}: dtype {t.dtype}, the model has "
                                f"{expected[name].dtype}")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise SnapshotError(f"{path}: load_state_dict(strict=True) failed: "
                            + " ".join(str(e).split())) from None
    return model.eval()


# ---------------------------------------------------------------------- inputs


def normalize(images, meta):
    """uint8 pixels N x H x W x C (as in the dataset and in image files) -> the
    network's float input N x C x H x W: /255, then the snapshot's per-channel
    normalize_mean and normalize_std (cifar-train's --normalize)."""
    x = torch.as_tensor(images).to(torch.float32).permute(0, 3, 1, 2) / 255.0
    mean = torch.tensor(json.loads(meta["normalize_mean"]), dtype=torch.float32)
    std = torch.tensor(json.loads(meta["normalize_std"]), dtype=torch.float32)
    return (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def example_input(meta, batch=1):
    """A zero input of the snapshot's image shape, e.g. for torch.onnx.export."""
    shape = model_shape(meta)
    return torch.zeros(batch, shape["img_channels"], shape["img_height"], shape["img_width"])
