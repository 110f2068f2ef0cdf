"""What an extra vLLM release costs here (issue 47): its folder on disk and its install time (as
`tunebook vllm add` recorded them), and what a launcher pays once per release: importing that
vLLM's API server module. Each release's import is timed in a fresh interpreter, alternating
releases, REPEATS times; the ratio is taken within this one run (machines are noisy).

    .venv/bin/python benchmarks/vllm_versions.py [--repeats 3] [--out docs/vllm-versions.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from tunebook.servers import versions  # noqa: E402

MODULE = "vllm.entrypoints.openai.api_server"


def import_s(pythonpath: str | None) -> float:
    env = {**os.environ}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import {MODULE}"], env=env, check=True,
                   capture_output=True)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("docs/vllm-versions.json"))
    args = ap.parse_args()
    dist, current = versions.installed()
    beside = versions.listed()
    releases = [(current, None)] + [(b["version"], str(versions.folder(b["version"])))
                                    for b in beside]
    times: dict[str, list[float]] = {v: [] for v, _ in releases}
    for _ in range(args.repeats):
        for v, path in releases:
            times[v].append(round(import_s(path), 2))
    med = {v: statistics.median(t) for v, t in times.items()}
    out = {
        "command": "python benchmarks/vllm_versions.py " + " ".join(sys.argv[1:]),
        "installed": f"{dist} {current}",
        "import_s": times,
        "import_median_s": med,
        "import_ratio_to_installed": {v: round(m / med[current], 2) for v, m in med.items()},
        "beside": [{k: b[k] for k in ("version", "packages", "install_s", "bytes")}
                   for b in beside],
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
