"""Wall time of one sweep, local (one engine at a time) vs on a local Ray cluster with N engine
slots (issue 16). Not a test: one run each, from empty compile caches, same params.

    .venv/bin/python benchmarks/ray_sweep.py [--slots 2] [--out docs/ray-bench.md]

On a CPU machine the slots split the cores (each engine pinned to its share), so the gain is
what overlapping starts and client time buys, not more compute; on a GPU box each slot is its
own GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tunebook.core import hardware
from tunebook.servers import compile_cache

REPO = Path(__file__).resolve().parents[1]


PARAMS = {
    "experiment": "ray-bench", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
    "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
    "engine_grid": [{"max_num_seqs": n} for n in (4, 8, 16, 32)],
    "load": {"users": [1, 4], "input_len": 128, "output_len": 32, "prompts_per_user": 2,
             "num_warmups": 1},
}


def sweep(params: Path, out: Path, ray_slots: int | None) -> tuple[float, str]:
    if compile_cache.enabled():
        compile_cache.clear()
    cmd = [sys.executable, "-m", "tunebook.cli", "sweep", str(params), "--outputs", str(out),
           "-q"]
    if ray_slots:
        cmd += ["--ray", "--ray-slots", str(ray_slots)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib"), "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return took, p.stdout.strip().splitlines()[-1].split("; table:")[0]  # no machine path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "ray-bench.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tunebook-ray-bench-") as tmp:
        params = Path(tmp) / "ray-bench.yaml"
        params.write_text(yaml.safe_dump(PARAMS))
        local_s, local_line = sweep(params, Path(tmp) / "local", None)
        ray_s, ray_line = sweep(params, Path(tmp) / "ray", args.slots)
    m = hardware.machine()
    runs = len(PARAMS["engine_grid"]) * len(PARAMS["load"]["users"])
    text = f"""# A sweep on Ray vs local: wall time

`python benchmarks/ray_sweep.py --slots {args.slots}` ({m['hardware']}, {m['vllm_package']},
tunebook {m['tunebook_commit']}, {time.strftime('%Y-%m-%d')}); one run each, from empty compile
caches: {len(PARAMS['engine_grid'])} engine configs × {len(PARAMS['load']['users'])} load points
= {runs} runs of qwen3-tiny.

| | wall s | result |
|---|---|---|
| local (one engine at a time) | {local_s:.0f} | {local_line} |
| Ray, local cluster, {args.slots} engine slots | {ray_s:.0f} | {ray_line} |

**Ray ÷ local wall time: {ray_s / local_s:.2f}**
"""
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
