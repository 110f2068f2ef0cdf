"""How busy the whole machine was while a command ran: /proc/stat sampled every few seconds
(Linux), so a suite's idle cores show where they were — the work bound (busy CPU s / cores)
beside the wall clock. Every process counts, the command's or not: run it on a box left alone.

    python benchmarks/busy_time.py --every 5 --out /tmp/busy.tsv -- make test

Prints the command's wall time, busy, idle and stolen CPU s (steal: time a virtual machine's
host ran something else while this one waited: a noisy neighbour, not this box's work), and the
busy share per tenth of the run; --out keeps every sample (seconds since start, busy, idle and
stolen CPU s in that interval). Beside them, what could stall a process without showing as busy:
the seconds some task waited on I/O or on memory (Linux PSI, /proc/pressure: "some"), the
seconds of iowait within the idle ones, and the major page faults (a page read back from disk)."""

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
IOWAIT_FIELD, STEAL_FIELD = 4, 7


def _cpu_fields() -> list[int]:
    """The whole machine's line of /proc/stat: clock ticks since boot per kind of time."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def cpu_seconds(fields: list[int] | None = None) -> tuple[float, float, float]:
    """(busy, idle, stolen) CPU seconds of the whole machine since boot."""
    f = fields or _cpu_fields()
    return (sum(f[i] for i in BUSY_FIELDS) * TICK_S, sum(f[i] for i in IDLE_FIELDS) * TICK_S,
            f[STEAL_FIELD] * TICK_S)


def not_idle_seconds() -> float:
    """CPU seconds the machine has not been idle since boot: busy + stolen (what cpu_per_test.py,
    model_starts.py and engine_spin.py count)."""
    busy, _, stolen = cpu_seconds()
    return busy + stolen


def stalls(fields: list[int] | None = None) -> tuple[float, float, float, int]:
    """(iowait CPU s, I/O pressure s, memory pressure s, major faults) since boot: zeros where
    the kernel has no PSI."""
    f = fields or _cpu_fields()

    def some_s(kind: str) -> float:
        try:
            line = Path(f"/proc/pressure/{kind}").read_text().split("\n", 1)[0]
        except OSError:
            return 0.0
        return int(line.rsplit("total=", 1)[1]) / 1e6

    vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return f[IOWAIT_FIELD] * TICK_S, some_s("io"), some_s("memory"), int(vm["pgmajfault"])


# seconds since start; busy, idle, stolen CPU s; iowait CPU s, I/O and memory pressure s,
# major faults (each in the interval)
Sample = tuple[float, ...]
COLUMNS = ("t_s", "busy_cpu_s", "idle_cpu_s", "stolen_cpu_s", "iowait_cpu_s", "io_some_s",
           "memory_some_s", "major_faults")


def _now() -> tuple[float, ...]:
    fields = _cpu_fields()  # one read of /proc/stat for both
    return (*cpu_seconds(fields), *stalls(fields))


def sample(every_s: float, stop: threading.Event, out: list[Sample]) -> None:
    t0, last = time.monotonic(), _now()
    while True:
        ended = stop.wait(every_s)
        now = _now()
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
    t0, started = time.monotonic(), time.time()
    t.start()
    rc = subprocess.call(cmd)
    wall = time.monotonic() - t0
    stop.set()
    t.join()
    busy, idle, stolen, iowait, io_s, mem_s, faults = (sum(s[k] for s in samples)
                                                       for k in range(1, len(COLUMNS)))
    cores = os.cpu_count() or 1
    print(f"busy_time: exit {rc}, started {time.strftime('%H:%M:%S', time.gmtime(started))} "
          f"UTC (the TSV's t_s counts from then), wall {wall:.0f} s, busy {busy:.0f} CPU s, "
          f"idle {idle:.0f} CPU s, stolen {stolen:.0f} CPU s on {cores} cores (busy / cores: "
          f"{busy / cores:.0f} s)", file=sys.stderr)
    print(f"busy_time: stalls: iowait {iowait:.0f} CPU s (of the idle), some task waiting on "
          f"I/O {io_s:.0f} s and on memory {mem_s:.0f} s, {faults:.0f} major faults",
          file=sys.stderr)
    tenths = [[] for _ in range(10)]
    for s in samples:
        tenths[min(9, int(10 * s[0] / max(wall, 1e-9)))].append(s)
    shares = [sum(x[1] for x in g) / max(1e-9, sum(x[1] + x[2] + x[3] for x in g))
              for g in tenths if g]
    print("busy_time: busy share per tenth of the run: "
          + " ".join(f"{x:.0%}" for x in shares), file=sys.stderr)
    if a.out:
        a.out.write_text("\t".join(COLUMNS) + "\n" + "".join(
            f"{s[0]:.1f}\t" + "\t".join(f"{x:.2f}" for x in s[1:-1]) + f"\t{s[-1]:.0f}\n"
            for s in samples))
    return rc


if __name__ == "__main__":
    sys.exit(main())
