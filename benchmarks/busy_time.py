"""How busy the whole machine was while a command ran: /proc/stat sampled every few seconds
(Linux), so a suite's idle cores show where they were — the work bound (busy CPU s / cores)
beside the wall clock. Every process counts, the command's or not: run it on a box left alone.

    python benchmarks/busy_time.py --every 5 --out /tmp/busy.tsv -- make test

Prints the command's wall time, busy, idle and stolen CPU s (steal: time a virtual machine's
host ran something else while this one waited: a noisy neighbour, not this box's work), and the
busy share per tenth of the run; --out keeps every sample (seconds since start, busy, idle and
stolen CPU s in that interval)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
IDLE_FIELDS = (3, 4)  # idle, iowait
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq
STEAL_FIELD = 7


def cpu_seconds() -> tuple[float, float, float]:
    """(busy, idle, stolen) CPU seconds of the whole machine since boot (cpu_per_test.py and
    model_starts.py count busy + stolen, as the CPU time that was not idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[i] for i in BUSY_FIELDS) * TICK_S,
            sum(fields[i] for i in IDLE_FIELDS) * TICK_S, fields[STEAL_FIELD] * TICK_S)


Sample = tuple[float, float, float, float]  # seconds since start; busy, idle, stolen CPU s


def sample(every_s: float, stop: threading.Event, out: list[Sample]) -> None:
    t0, last = time.monotonic(), cpu_seconds()
    while True:
        ended = stop.wait(every_s)
        now = cpu_seconds()
        out.append((time.monotonic() - t0, *(a - b for a, b in zip(now, last, strict=True))))
        last = now
        if ended:
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--out", type=Path, help="a TSV of every sample")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command after --")
    samples: list[Sample] = []
    stop = threading.Event()
    t = threading.Thread(target=sample, args=(a.every, stop, samples), daemon=True)
    t0 = time.monotonic()
    t.start()
    rc = subprocess.call(cmd)
    wall = time.monotonic() - t0
    stop.set()
    t.join()
    busy, idle, stolen = (sum(s[k] for s in samples) for k in (1, 2, 3))
    cores = os.cpu_count() or 1
    print(f"busy_time: exit {rc}, wall {wall:.0f} s, busy {busy:.0f} CPU s, idle {idle:.0f} "
          f"CPU s, stolen {stolen:.0f} CPU s on {cores} cores (busy / cores: "
          f"{busy / cores:.0f} s)", file=sys.stderr)
    tenths = [[] for _ in range(10)]
    for s in samples:
        tenths[min(9, int(10 * s[0] / max(wall, 1e-9)))].append(s)
    shares = [sum(x[1] for x in g) / max(1e-9, sum(x[1] + x[2] + x[3] for x in g))
              for g in tenths if g]
    print("busy_time: busy share per tenth of the run: "
          + " ".join(f"{x:.0%}" for x in shares), file=sys.stderr)
    if a.out:
        a.out.write_text("t_s\tbusy_cpu_s\tidle_cpu_s\tstolen_cpu_s\n" + "".join(
            f"{t_s:.1f}\t{b:.2f}\t{i:.2f}\t{st:.2f}\n" for t_s, b, i, st in samples))
    return rc


if __name__ == "__main__":
    sys.exit(main())
