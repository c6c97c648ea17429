#!/usr/bin/env python3
"""netns_switch.py: the hosts' switch in user space, for kernels without tc netem.

tests/netns.bash links its hosts through a kernel bridge and impairs the links with
`tc qdisc ... netem`; where the kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset),
it links them through this program instead: one TAP device per host (moved into the
host's namespace by netns.bash as its eth0), frames switched by learned MAC address
(flooded while unknown), each frame dropped with probability LOSS and delivered DELAY
after it was sent, in order (a fixed delay never reorders). That is what `netem loss
L% delay D` on each host's interface does to a frame: one loss draw and one delay per
hop from host to host.

    netns_switch.py --owner PID --control FILE --ready FILE TAP...

FILE holds "LOSS_PERCENT DELAY_MS" (read at start and on SIGUSR1, then copied to
FILE.applied: every frame the switch receives after that copy is treated so); READY
is written once every TAP exists. The switch ends on SIGTERM, or by itself within a second of
its owner's death (a harness killed hard leaves no switch behind)."""
import argparse
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
MAX_FRAME = 65536


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def read_control(path):
    """(loss probability, delay in seconds) from "LOSS_PERCENT DELAY_MS"."""
    try:
        with open(path) as f:
            words = f.read().split()
    except FileNotFoundError:
        return 0.0, 0.0
    if len(words) != 2:
        sys.exit(f"netns_switch.py: {path}: expected 'LOSS_PERCENT DELAY_MS', got {words}")
    return float(words[0]) / 100.0, float(words[1]) / 1000.0


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Switch:
    def __init__(self, fds, rng):
        self.fds = fds
        self.rng = rng
        self.where = {}   # source MAC -> the fd it came from
        self.queue = []   # (deliver at, sequence, fd, frame)
        self.seq = 0
        self.loss, self.delay = 0.0, 0.0

    def ports_for(self, src_fd, frame):
        dst = frame[0:6]
        fd = None if dst[0] & 1 else self.where.get(dst)  # multicast/broadcast: flood
        return [fd] if fd is not None else [f for f in self.fds if f != src_fd]

    def receive(self, fd, now):
        while True:
            try:
                frame = os.read(fd, MAX_FRAME)
            except (BlockingIOError, OSError):
                return  # nothing more (or the host's link is down)
            if len(frame) < 14:
                continue
            self.where[frame[6:12]] = fd
            for out in self.ports_for(fd, frame):
                if self.loss and self.rng.random() < self.loss:
                    continue
                self.seq += 1
                heapq.heappush(self.queue, (now + self.delay, self.seq, out, frame))

    def deliver_due(self, now):
        while self.queue and self.queue[0][0] <= now:
            _, _, fd, frame = heapq.heappop(self.queue)
            try:
                os.write(fd, frame)
            except OSError:
                pass  # that host's link is down: the frame is lost, as on a cut cable

    def wait_s(self, now):
        return max(0.0, min(1.0, self.queue[0][0] - now)) if self.queue else 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--owner", type=int, required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("taps", nargs="+")
    args = ap.parse_args()
    fds = [open_tap(name) for name in args.taps]
    sw = Switch(fds, random.Random(args.seed))
    def apply_control(*_):
        # In the handler itself: a poll that a signal interrupts is resumed (PEP 475),
        # and the frames it then returns must already see the new settings.
        sw.loss, sw.delay = read_control(args.control)
        with open(args.control) as f, open(args.control + ".applied.tmp", "w") as out:
            out.write(f.read())
        os.rename(args.control + ".applied.tmp", args.control + ".applied")
    apply_control()
    signal.signal(signal.SIGUSR1, apply_control)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(args.ready, "w") as f:
        f.write(f"{os.getpid()}\n")
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    last_owner_check = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_owner_check > 1.0:
            last_owner_check = now
            if not alive(args.owner):
                return
        for fd, _ in poller.poll(sw.wait_s(now) * 1000.0):
            sw.receive(fd, time.monotonic())
        sw.deliver_due(time.monotonic())


if __name__ == "__main__":
    main()
