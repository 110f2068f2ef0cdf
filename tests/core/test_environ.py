"""What an import sets in os.environ is not passed on as the user's (config.user_environ)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tunebook.core import config
from tunebook.models.presets import resolve_model
from tunebook.servers.vllm import Engine


@pytest.fixture
def imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """envsetter imported through config.import_module: it changed a variable the user had
    set and added one, with no record of earlier imports (restored after the test)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setattr(config, "_SET_BY_IMPORTS", {})
    monkeypatch.delenv(config.SET_BY_IMPORTS_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "envsetter", raising=False)
    monkeypatch.setenv("ENVSETTER_CHANGED", "by the user")
    monkeypatch.delenv("ENVSETTER_ADDED", raising=False)
    config.import_module("envsetter")


def test_an_imports_variables_stay_out_of_engines(imported: None, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    env = config.user_environ()
    assert env["ENVSETTER_CHANGED"] == "by the user" and "ENVSETTER_ADDED" not in env
    e = Engine(resolve_model("qwen3-tiny"), {}, {}, tmp_path / "e.log")
    assert e.server_env()["ENVSETTER_CHANGED"] == "by the user"
    assert "ENVSETTER_ADDED" not in e.server_env()
    # set again after the import, by the user or a test: theirs
    monkeypatch.setenv("ENVSETTER_ADDED", "by the user")
    assert config.user_environ()["ENVSETTER_ADDED"] == "by the user"


def test_a_process_started_from_it_knows_them_too(imported: None) -> None:
    """A papermill kernel or a spawned sweep inherits os.environ as the import left it: the
    variables the import set are not that process's user's either (else its engines get
    /tmp's Inductor cache and differ from the launcher they would fork from)."""
    lib = str(Path(config.__file__).parents[2])
    out = subprocess.run(
        [sys.executable, "-c", "import json; from tunebook.core import config; "
                               "print(json.dumps(config.user_environ()))"],
        env={**os.environ, "PYTHONPATH": lib}, capture_output=True, text=True, check=True)
    child = json.loads(out.stdout)
    assert child["ENVSETTER_CHANGED"] == "by the user" and "ENVSETTER_ADDED" not in child


def test_an_import_still_running_is_not_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine started while vLLM's client is imported on a thread gets none of what the
    import has set so far (seen on a busy box: the second engine of a sweep got
    /tmp/torchinductor_root for its compile cache, and a launcher of its own)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setattr(config, "_SET_BY_IMPORTS", {})
    monkeypatch.delenv(config.SET_BY_IMPORTS_ENV, raising=False)
    monkeypatch.delenv("ENVSETTER_SLOW", raising=False)
    monkeypatch.delitem(sys.modules, "envsetter_slow", raising=False)
    import envsetter_gate

    t = threading.Thread(target=config.import_module, args=("envsetter_slow",), daemon=True)
    t.start()
    try:
        assert envsetter_gate.SET.wait(30)
        assert os.environ["ENVSETTER_SLOW"] == "by the import"  # set, the import not done
        monkeypatch.setenv("TUNEBOOK_TEST_OWN", "by tunebook")  # tunebook's own, meanwhile
        env = config.user_environ()
        assert "ENVSETTER_SLOW" not in env and env["TUNEBOOK_TEST_OWN"] == "by tunebook"
    finally:
        envsetter_gate.GO.set()
        t.join(30)
    assert "ENVSETTER_SLOW" not in config.user_environ()  # done: recorded as the import's
    assert "TUNEBOOK_TEST_OWN" not in config._SET_BY_IMPORTS
