"""Where tunebook reads and writes, and the ``TUNEBOOK_*`` variables that move it: one place.

Every other module asks here instead of computing paths from its own ``__file__`` (which
breaks once the package is installed without ``-e``: site-packages has no notebooks/).

    TUNEBOOK_HOME       the project folder (notebooks/, params/, outputs/); default: the
                        checkout this package sits in, else the current directory
    TUNEBOOK_OUTPUTS    where experiments land; default <home>/outputs
    TUNEBOOK_CACHE      built offline model folders; default <home>/.cache/models
                        (vLLM's compile caches too: tunebook.servers.compile_cache)
    TUNEBOOK_COMPILE_CACHE  0: engines keep vLLM's own compile-cache defaults
    TUNEBOOK_SMOLLM2_GGUF  a local SmolLM2-135M-Instruct.Q4_1.gguf (the smollm2-135m
                        presets' weights) for machines without a package index
    TUNEBOOK_STATE_DIR  pid files of running engines and the machine lock;
                        default ~/.cache/tunebook
    TUNEBOOK_BATCH      set: text progress for logs (papermill, cron) instead of live bars
    TUNEBOOK_WAIT_S     seconds to wait for another sweep holding the machine (--wait)
    TUNEBOOK_COMMIT     the tunebook commit to record when there is no git checkout
    TUNEBOOK_FAST_START unset or 1: vLLM engines forked from a process that has imported
                        vLLM (tunebook.servers.launcher); api: the API server only;
                        0: plain starts
    TUNEBOOK_LAUNCHER   set by tunebook, not by you: its launchers' folders (os.pathsep), so
                        the processes it starts (a papermill kernel, a spawned sweep) fork
                        from the one that fits
    TUNEBOOK_SET_BY_IMPORTS  set by tunebook, not by you: what imports in its process set in
                        the environment (see user_environ), for the processes it starts
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path
from types import ModuleType

HOME_ENV = "TUNEBOOK_HOME"
OUTPUTS_ENV = "TUNEBOOK_OUTPUTS"
CACHE_ENV = "TUNEBOOK_CACHE"
SMOLLM2_GGUF_ENV = "TUNEBOOK_SMOLLM2_GGUF"
STATE_DIR_ENV = "TUNEBOOK_STATE_DIR"
BATCH_ENV = "TUNEBOOK_BATCH"
WAIT_ENV = "TUNEBOOK_WAIT_S"
COMMIT_ENV = "TUNEBOOK_COMMIT"
# A unix time by which the process will be stopped (a lent device's per-call limit, set by
# scripts/h200_run.sh): a sweep starts no engine it has no time to use (tunebook.measure.sweep).
DEADLINE_ENV = "TUNEBOOK_DEADLINE"

_PACKAGE = Path(__file__).resolve().parents[1]  # lib/tunebook (this file is in core/)


# What library imports in this process set in os.environ, as (before, after): importing vLLM's
# client sets TORCHINDUCTOR_CACHE_DIR to /tmp/torchinductor_<user>, LD_LIBRARY_PATH to cv2's
# folder, TORCHINDUCTOR_COMPILE_THREADS... Passed on, they would override tunebook's compile
# cache for every engine started after the first load point, and make each such engine differ
# from the launcher that should fork it. A process tunebook starts (a papermill kernel, a
# spawned sweep) inherits them in its environment: SET_BY_IMPORTS_ENV tells it which they are.
SET_BY_IMPORTS_ENV = "TUNEBOOK_SET_BY_IMPORTS"
_IMPORTS_LOCK = threading.Lock()
# os.environ before each import that is still running: vLLM's client is imported on a thread
# while an engine starts (tunebook.measure.client.preload), and an engine started meanwhile
# must not get what that import has set so far (seen on a busy box: the second engine of a
# sweep got /tmp/torchinductor_root for its compile cache, and a launcher of its own)
_in_flight: dict[str, str] | None = None  # one at a time: _IMPORTS_LOCK
OWN_PREFIX = "TUNEBOOK_"  # tunebook's own variables: set by tunebook, never by an import


def _inherited() -> dict[str, tuple[str | None, str]]:
    try:
        said = json.loads(os.environ.get(SET_BY_IMPORTS_ENV) or "{}")
        return {k: (before, after) for k, (before, after) in said.items()}
    except (ValueError, TypeError):  # not ours to judge: nothing is taken back
        return {}


_SET_BY_IMPORTS: dict[str, tuple[str | None, str]] = _inherited()


def import_module(name: str) -> ModuleType:
    """Import `name`, remembering what its import set in os.environ (user_environ leaves it
    out). Imports of vLLM or torch in a tunebook process go through here."""
    global _in_flight
    with _IMPORTS_LOCK:
        before = _in_flight = dict(os.environ)
        try:
            return importlib.import_module(name)
        finally:
            for k, v in os.environ.items():
                if before.get(k) != v and k not in _SET_BY_IMPORTS \
                        and not k.startswith(OWN_PREFIX):
                    _SET_BY_IMPORTS[k] = (before.get(k), v)
            if _SET_BY_IMPORTS:
                os.environ[SET_BY_IMPORTS_ENV] = json.dumps(_SET_BY_IMPORTS)
            _in_flight = None  # after the record: user_environ knows one or the other


def user_environ() -> dict[str, str]:
    """os.environ as the user (or a test) set it: a variable that a library import set keeps
    its value from before the import, unless something set it again since."""
    env = dict(os.environ)
    if (before := _in_flight) is not None:  # an import running: what it has set so far is its
        for k in {*env, *before}:
            if env.get(k) != before.get(k) and not k.startswith(OWN_PREFIX):
                if k in before:
                    env[k] = before[k]
                else:
                    env.pop(k, None)
    for k, (before, after) in _SET_BY_IMPORTS.items():
        if env.get(k) == after:
            if before is None:
                env.pop(k, None)
            else:
                env[k] = before
    return env


class EnvError(ValueError):
    """A TUNEBOOK_* environment variable that cannot be read (said before any engine starts)."""


def _checkout() -> Path | None:
    """The source checkout holding this package (lib/tunebook), if it is one."""
    root = _PACKAGE.parents[1]
    return root if (root / "notebooks").is_dir() and (root / "lib" / "tunebook").is_dir() else None


def home() -> Path:
    """The project folder: notebooks/, params/ and (by default) outputs/ live here."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return _checkout() or Path.cwd().resolve()


def notebooks_dir() -> Path:
    return home() / "notebooks"


def params_dir() -> Path:
    return home() / "params"


def outputs_dir() -> Path:
    env = os.environ.get(OUTPUTS_ENV)
    return Path(env).expanduser().resolve() if env else home() / "outputs"


def model_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else home() / ".cache" / "models"


def workloads_dir() -> Path:
    """Prepared workload files (tunebook.inputs.workloads), named by their content."""
    return model_cache_dir() / "workloads"


def smollm2_gguf() -> Path | None:
    """The GGUF named by TUNEBOOK_SMOLLM2_GGUF, if set (tunebook.models.gguf checks it)."""
    env = os.environ.get(SMOLLM2_GGUF_ENV)
    return Path(env).expanduser() if env else None


def state_dir() -> Path:
    """Per-user state: ``engines/`` pid files and ``machine.lock``."""
    env = os.environ.get(STATE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tunebook"


def batch() -> bool:
    return bool(os.environ.get(BATCH_ENV))


def number_at_least(text: str, typ: type[int] | type[float], lo: float) -> int | float | None:
    """`text` as a number of `typ`, `lo` or more; None when it is not one (NaN included)."""
    try:
        value = typ(text.strip())
    except ValueError:
        return None
    return None if value != value or value < lo else value


def env_number(name: str, typ: type[int] | type[float], lo: float, what: str
               ) -> int | float | None:
    """A number from the environment, None when unset; a value that is not one (or is below
    `lo`) is an EnvError naming the variable, said before anything starts."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    value = number_at_least(raw, typ, lo)
    if value is None:
        raise EnvError(f"{name}={raw!r}: expected {what}")
    return value


def wait_s() -> float:
    """How long a sweep waits for another holding the machine (`--wait` sets it)."""
    return float(env_number(WAIT_ENV, float, 0, "seconds to wait, 0 or more (e.g. 600)") or 0)


def deadline() -> float | None:
    """DEADLINE_ENV as a unix time, None when unset."""
    value = env_number(DEADLINE_ENV, float, float("-inf"),
                       "a unix time in seconds (e.g. $(( $(date +%s) + 540 )))")
    return None if value is None else float(value)


def package_data(name: str) -> Path:
    """A file shipped inside the package (works installed or from a checkout)."""
    return _PACKAGE / "data" / name


def display_path(path: str | Path, start: str | Path | None = None) -> str:
    """A path as a shared report should show it: relative to the project (or ``start``) when
    it lies inside, else just its last two parts — never this machine's absolute layout."""
    p = Path(path).resolve()
    for base in ([Path(start).resolve()] if start else []) + [home()]:
        try:
            return p.relative_to(base).as_posix() or "."
        except ValueError:
            continue
    return "/".join(p.parts[-2:])
