"""Read a cifar-train run's TensorBoard events back with PyPI's tensorboard.

    TB_PYTHON tests/tb_read.py accumulate RUN_DIR   # EventAccumulator's scalars
    TB_PYTHON tests/tb_read.py records RUN_DIR      # every record of every file
    TB_PYTHON tests/tb_read.py metrics RUN_DIR      # the epoch scalars = metrics.jsonl

accumulate: TensorBoard's own EventAccumulator on RUN_DIR/tb (what the
dashboard shows), one line per scalar: "TAG STEP VALUE" (VALUE with repr, a
float32 widened), sorted by tag then step. records: every event of every file
in name order through tensorboard's RawEventFileLoader and its Event proto (no
purging and no conversion, so a duplicate would show), one line "FILE TAG STEP VALUE" per scalar and "FILE
file_version VERSION" for the first event of a file. Exits 1 with the reason
when the folder has no event file.
metrics: through EventAccumulator, every numeric field F of every line of
RUN_DIR/metrics.jsonl is the one scalar "epoch/F" of that epoch (its step: the
"epoch/epoch" scalar whose value is the line's epoch), within the precision
metrics.jsonl prints it with plus a float32 rounding; and there are no other
epoch scalars. Prints "OK ..." or the first difference (exit 1).
"""
import glob
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2


def accumulate(tb_dir):
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag in sorted(acc.Tags()["scalars"]):
        for ev in acc.Scalars(tag):
            print(tag, ev.step, repr(ev.value))


def records(tb_dir):
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        name = os.path.basename(path)
        for raw in event_file_loader.RawEventFileLoader(path).Load():
            ev = event_pb2.Event.FromString(raw)
            if ev.HasField("file_version"):
                print(name, "file_version", ev.file_version)
            for v in ev.summary.value:
                print(name, v.tag, ev.step, repr(v.simple_value))


# metrics.jsonl's numeric fields and the absolute precision it prints them with
# (lr: %.6g, relative); val_loss and val_acc only in runs with a validation split
PRINTED = {"train_loss": 5e-7, "train_acc": 5e-7, "test_loss": 5e-7, "test_acc": 5e-7,
           "images_per_s": 0.05, "seconds": 5e-4, "world_size": 0, "restarts": 0, "epoch": 0,
           "lr": None, "val_loss": 5e-7, "val_acc": 5e-7}


def metrics(tb_dir):
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"] if tag.startswith("epoch/")}
    lines = [json.loads(line) for line in open(os.path.join(os.path.dirname(tb_dir), "metrics.jsonl"))]
    step_of = {int(ev.value): ev.step for ev in scalars.get("epoch/epoch", [])}
    fields = [f for f in PRINTED if f in lines[0]]
    want_tags = {"epoch/" + f for f in fields}
    if set(scalars) != want_tags:
        sys.exit(f"tb_read.py: epoch tags {sorted(scalars)}, expected {sorted(want_tags)}")
    for tag, events in scalars.items():
        if len(events) != len(lines):
            sys.exit(f"tb_read.py: {tag} has {len(events)} events for {len(lines)} epochs")
    for line in lines:
        step = step_of.get(line["epoch"])
        if step is None:
            sys.exit(f"tb_read.py: no epoch/epoch event for epoch {line['epoch']}")
        for field in fields:
            want = float(line[field])
            printed = PRINTED[field] if PRINTED[field] is not None else 5e-6 * abs(want)
            tol = printed + 1.2e-7 * abs(want)  # and the float32 of simple_value
            got = [ev.value for ev in scalars["epoch/" + field] if ev.step == step]
            if len(got) != 1 or abs(got[0] - want) > tol:
                sys.exit(f"tb_read.py: epoch {line['epoch']} {field}: metrics.jsonl {want}, events {got} at step {step}")
    print(f"OK: {len(lines)} epochs x {len(want_tags)} scalars match metrics.jsonl")


def main():
    mode, run_dir = sys.argv[1], sys.argv[2]
    tb_dir = os.path.join(run_dir, "tb")
    if not glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")):
        print(f"tb_read.py: no event file in {tb_dir}", file=sys.stderr)
        sys.exit(1)
    {"accumulate": accumulate, "records": records, "metrics": metrics}[mode](tb_dir)


if __name__ == "__main__":
    main()
