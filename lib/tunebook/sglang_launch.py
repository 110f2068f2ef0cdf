"""`python -m tunebook.sglang_launch ARGS…`: SGLang's server (`sglang.launch_server ARGS…`)
with the API key taken from the environment (tunebook.peer.KEY_ENV) instead of the command
line, where every user of the machine could read it and tunebook would store it."""

from __future__ import annotations

import os
import runpy
import sys

if __name__ == "__main__":
    key = os.environ.pop("TUNEBOOK_SGLANG_API_KEY", None)  # tunebook.peer.KEY_ENV
    if key:
        sys.argv += ["--api-key", key]  # this process's argv only; /proc shows the original
    try:  # the version line tunebook.peer.parse_startup reads (SGLang prints none of its own)
        from importlib.metadata import version

        print(f"tunebook: sglang {version('sglang')}", flush=True)
    except Exception:  # noqa: BLE001 - a wheel without metadata: the row says None
        pass
    sys.argv[0] = "sglang.launch_server"
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
