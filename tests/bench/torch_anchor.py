#!/usr/bin/env python3
"""PyTorch side of the side-by-side benchmark: the seed model (python/cifar_resnet.py's
default shape, the seed's resnet.py network; upstream /work/shared/bench/torch_anchor.py,
brought into the repository so that make bench needs nothing outside it) trained on
CIFAR-sized data that already sits on the device, as uint8, with crop+flip+normalize done
on the device per batch. Forward + backward + SGD(momentum 0.9) per step, batch per process.

  torch_anchor.py [--device cuda|cpu] [--batch 256] [--steps 50] [--compile] [--channels-last]
                  [--amp bf16] [--threads N]

Prints one JSON line: {"impl": "...", "device": ..., "batch": ..., "images_per_s": ...}.
On the GPU machine run it with that machine's python3 (PyTorch 2.x); on the CPU with
Debian's python3-torch (1.13: --compile is not available there)."""
import argparse, json, os, sys, time
import torch
from torch import nn
import torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import cifar_resnet  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--steps", type=int, default=50)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--compile", action="store_true")
p.add_argument("--channels-last", action="store_true")
p.add_argument("--amp", choices=["none", "bf16"], default="none")
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads: torch.set_num_threads(a.threads)
dev = torch.device(a.device)
torch.manual_seed(0)
if dev.type == "cuda": torch.backends.cudnn.benchmark = True

N, H, W, C = 50000, 32, 32, 3
data = torch.randint(0, 256, (N, C, H, W), dtype=torch.uint8, device=dev)
labels = torch.randint(0, 10, (N,), device=dev)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1)
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1)
model = cifar_resnet.build().to(dev)  # the seed Config, 3x32x32 images, 10 classes
mf = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=mf)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
lossf = nn.CrossEntropyLoss()

def batch(step):
    idx = torch.randint(0, N, (a.batch,), device=dev)
    x = F.pad(data[idx].float().div_(255), (4, 4, 4, 4))
    dy, dx = torch.randint(0, 9, (2,)).tolist()          # one crop offset per batch (cheap)
    x = x[:, :, dy:dy + H, dx:dx + W]
    flip = torch.rand(a.batch, device=dev) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    return ((x - mean) / std).contiguous(memory_format=mf), labels[idx]

def step(x, y):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp == "bf16"):
        loss = lossf(model(x), y)
    loss.backward()
    opt.step()
    return loss

run = torch.compile(step) if a.compile else step
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
for i in range(a.warmup): run(*batch(i))
sync(); t = time.perf_counter()
for i in range(a.steps): run(*batch(i))
sync(); dt = time.perf_counter() - t
impl = "pytorch-" + ("compile" if a.compile else "eager") + ("-cl" if a.channels_last else "") + ("-bf16" if a.amp == "bf16" else "")
print(json.dumps({"impl": impl, "torch": torch.__version__, "device": str(dev), "batch": a.batch,
                  "steps": a.steps, "images_per_s": round(a.steps * a.batch / dt, 1)}))
