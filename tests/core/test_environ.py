"""What an import sets in os.environ is not passed on as the user's (config.user_environ)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    monkeypatch.setenv("TUNEBOOK_TEST_CHANGED", "by the user")
    monkeypatch.delenv("TUNEBOOK_TEST_ADDED", raising=False)
    config.import_module("envsetter")


def test_an_imports_variables_stay_out_of_engines(imported: None, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    env = config.user_environ()
    assert env["TUNEBOOK_TEST_CHANGED"] == "by the user" and "TUNEBOOK_TEST_ADDED" not in env
    e = Engine(resolve_model("qwen3-tiny"), {}, {}, tmp_path / "e.log")
    assert e.server_env()["TUNEBOOK_TEST_CHANGED"] == "by the user"
    assert "TUNEBOOK_TEST_ADDED" not in e.server_env()
    # set again after the import, by the user or a test: theirs
    monkeypatch.setenv("TUNEBOOK_TEST_ADDED", "by the user")
    assert config.user_environ()["TUNEBOOK_TEST_ADDED"] == "by the user"


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
    assert child["TUNEBOOK_TEST_CHANGED"] == "by the user" and "TUNEBOOK_TEST_ADDED" not in child
