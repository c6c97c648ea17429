#!/usr/bin/python3
"""make_reference.py: PyTorch reference data for tests/test_reference.c.

Run from the repository root with Debian's python3 (torch 1.13, CPU):

    /usr/bin/python3 tests/make_reference.py [OUT]          (default tests/data/reference.bin)
    /usr/bin/python3 tests/make_reference.py --check [FILE]  compare, don't write (torch.bats)

It builds the project's PyTorch model (python/cifar_resnet.py: the seed's
nn.Sequential(ResNetBase(...), nn.Linear(...)), created in the seed's order, so the
same torch.manual_seed gives the same initial weights as the seed's resnet.py) with
the seed Config ([16,32,64] channels, [8,16,16] bottlenecks, [6,6,6] blocks, first
kernel 3, 10 classes), and records one small batch (4 x 3x32x32). On one machine
the file it writes is byte for byte the one the seed's resnet.py writes (checked when
the module replaced it); the committed file, made on another machine, differs from
both only in gradients that are zero analytically (float64 rounding noise, below
3e-15). --check recomputes and compares within CHECK_REL/CHECK_ABS (below).

Precision: the initial state and the input are drawn in float32 (so the file
holds them exactly), then everything is computed in float64 and stored rounded
to float32. A float32 computation of this 56-layer ReLU network is not a sharp
reference: rounding flips a few ReLU masks, and PyTorch's own float32 gradients
differ from float64 by up to ~1% (more after SGD steps on one batch, which are
chaotic here). The C test therefore runs the model code in double against these
values with tight tolerances, and the float build with float32-sized ones.

Contents:

  - the input (NCHW, as PyTorch holds it) and the labels;
  - every state_dict entry at the start, in state_dict order ("init/<key>"). The BN
    affine parameters and running statistics are perturbed away from their
    default 1/0 values first so that a mixed-up gamma, beta, mean or var cannot
    go unnoticed;
  - train-mode logits and mean cross-entropy loss, every parameter gradient
    ("grad/<key>"), and the BN running statistics after that forward
    ("stats1/<key>");
  - every state_dict entry after 3 SGD steps on the same batch ("step3/<key>",
    torch.optim.SGD lr 0.1, momentum 0.9, weight_decay 5e-4; step 1 uses the
    gradients above), and the eval-mode logits after them.

File format (all integers little-endian uint64, floats little-endian float32):

    magic       8 bytes  "CIFREF01"
    version     u64      1
    config_len  u64      bytes of the JSON text that follows
    config      JSON     model Config fields + img_*/num_classes + batch, lr,
                         momentum, weight_decay, steps, label_smoothing
    n_tensors   u64
    n_tensors times:
        name_len u64, name bytes (no terminator),
        ndim     u64, shape u64[ndim],
        data     float32[prod(shape)]   (a 0-dim tensor holds 1 value; integer
                                         tensors such as labels and
                                         num_batches_tracked are stored as exact
                                         float32 values)
    The file ends right after the last tensor.
"""
import json
import os
import struct
import sys

import torch
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import cifar_resnet  # noqa: E402  (the project's PyTorch model: python/cifar_resnet.py)

MAGIC = b"CIFREF01"
VERSION = 1

# The seed's shape (the strides are its defaults and were never in the file's config),
# then the run: the JSON text the file holds, in this order.
CONFIG = {
    **{key: value for key, value in cifar_resnet.DEFAULT_SHAPE.items()
       if key not in ("stem_stride", "first_block_stride")},
    "batch": 4,
    "lr": 0.1,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "steps": 3,
    "label_smoothing": 0.0,
    "precision": "float64",
}


def build_model(cfg):
    return cifar_resnet.build({key: cfg[key] for key in cifar_resnet.DEFAULT_SHAPE if key in cfg})


def perturb_batchnorm(model, gen):
    """Move every BN away from gamma=1, beta=0, mean=0, var=1."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(0.5 + torch.rand(c, generator=gen))
                mod.bias.copy_(0.4 * torch.rand(c, generator=gen) - 0.2)
                mod.running_mean.copy_(0.2 * torch.rand(c, generator=gen) - 0.1)
                mod.running_var.copy_(0.5 + torch.rand(c, generator=gen))


class Writer:
    def __init__(self):
        self.entries = []

    def add(self, name, tensor):
        t = tensor.detach().to(torch.float32).contiguous().cpu()
        self.entries.append((name, list(t.shape), t.numpy().tobytes()))

    def add_state(self, prefix, state):
        for key, value in state.items():
            self.add(prefix + key, value)

    def write(self, path, config):
        cfg = json.dumps(config).encode()
        out = [MAGIC, struct.pack("<QQ", VERSION, len(cfg)), cfg,
               struct.pack("<Q", len(self.entries))]
        for name, shape, data in self.entries:
            nb = name.encode()
            out.append(struct.pack("<Q", len(nb)) + nb)
            out.append(struct.pack("<Q", len(shape)) + struct.pack("<%dQ" % len(shape), *shape))
            out.append(data)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(out))
        os.replace(tmp, path)


def read_reference(path):
    """{name: (shape, float32 values)} of a reference file written by Writer.write."""
    import numpy as np

    blob = open(path, "rb").read()
    if blob[:8] != MAGIC:
        sys.exit(f"{path}: not a {MAGIC.decode()} file")
    version, clen = struct.unpack_from("<QQ", blob, 8)
    if version != VERSION:
        sys.exit(f"{path}: version {version}, expected {VERSION}")
    pos = 24 + clen
    (count,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    out = {}
    for _ in range(count):
        (nlen,) = struct.unpack_from("<Q", blob, pos)
        name = blob[pos + 8:pos + 8 + nlen].decode()
        pos += 8 + nlen
        (ndim,) = struct.unpack_from("<Q", blob, pos)
        shape = list(struct.unpack_from("<%dQ" % ndim, blob, pos + 8))
        pos += 8 + 8 * ndim
        numel = int(np.prod(shape)) if ndim else 1
        if pos + 4 * numel > len(blob):
            sys.exit(f"{path}: tensor {name} runs past the end of the file")
        out[name] = (shape, np.frombuffer(blob, np.float32, numel, pos).astype(np.float64))
        pos += 4 * numel
    if pos != len(blob):
        sys.exit(f"{path}: {len(blob) - pos} bytes after the last tensor")
    return out


# --check's tolerance per tensor: |new - file| <= REL * max|file| + ABS. Everything is
# computed in float64 and stored rounded to float32: another machine's float64 result
# (other kernels' summation order: ~1e-16 relative, ~1e-10 after the 3 chaotic SGD
# steps) can round to the neighbouring float32, one ulp (<= 1.2e-7 of the largest
# value) away; REL allows 8 of them. ABS: the gradients that are zero analytically (the
# biases of convs followed by BN, the stem BN's beta) hold float64 rounding noise only
# (<= 3e-15 here), which differs between any two machines.
CHECK_REL = 1e-6
CHECK_ABS = 1e-12


def check_against(w, path):
    import numpy as np

    want = read_reference(path)
    if [e[0] for e in w.entries] != list(want):
        sys.exit(f"{path}: the tensor names or their order differ from the ones computed now")
    worst, exact = (0.0, ""), 0
    for name, shape, data in w.entries:
        ref_shape, ref = want[name]
        if shape != ref_shape:
            sys.exit(f"{path}: tensor {name}: shape {ref_shape}, computed {shape}")
        got = np.frombuffer(data, np.float32).astype(np.float64)
        err = float(np.abs(got - ref).max())
        bound = CHECK_REL * float(np.abs(ref).max()) + CHECK_ABS
        if err > bound:
            sys.exit(f"{path}: tensor {name}: max |computed - file| {err:.3g} > {bound:.3g}")
        exact += err == 0
        worst = max(worst, (err / bound, name))
    print(f"{path}: matches: {len(w.entries)} tensors, {exact} bit for bit; the largest "
          f"difference is {worst[0]:.2g} of its tolerance ({worst[1]})")


def compute(cfg):
    """The reference's tensors (a Writer) and the first loss."""
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    model = build_model(cfg)
    perturb_batchnorm(model, torch.Generator().manual_seed(99))
    n = cfg["batch"]
    x = torch.randn(n, cfg["img_channels"], cfg["img_height"], cfg["img_width"])
    labels = torch.randint(0, cfg["num_classes"], (n,))
    w = Writer()
    w.add("input", x)
    w.add("labels", labels)
    w.add_state("init/", model.state_dict())
    # float32 draws are exact in float64: from here on everything runs in float64
    model = model.double()
    x = x.double()

    crit = nn.CrossEntropyLoss(label_smoothing=cfg["label_smoothing"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    model.train()
    for step in range(cfg["steps"]):
        opt.zero_grad()
        logits = model(x)
        loss = crit(logits, labels)
        loss.backward()
        if step == 0:
            w.add("logits", logits)
            w.add("loss", loss)
            loss0 = float(loss)
            for key, p in model.named_parameters():
                w.add("grad/" + key, p.grad)
            w.add_state("stats1/", {k: v for k, v in model.state_dict().items()
                                    if k.endswith("running_mean") or k.endswith("running_var")})
        opt.step()
    w.add_state("step3/", model.state_dict())
    model.eval()
    with torch.no_grad():
        w.add("eval_logits", model(x))
    return w, loss0


def main():
    args = sys.argv[1:]
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    if len(args) > 1:
        sys.exit("usage: make_reference.py [--check] [FILE]  (default tests/data/reference.bin)")
    path = args[0] if args else os.path.join(REPO, "tests", "data", "reference.bin")
    w, loss0 = compute(CONFIG)
    if check:
        check_against(w, path)
        return
    w.write(path, CONFIG)
    print("%s: %d tensors, first loss %.6f" % (path, len(w.entries), loss0))


if __name__ == "__main__":
    main()
