"""The suite's background replots (conftest.Replot) run on a thread beside the quick lane's
tests, some of which patch process-wide names for a moment: sys.executable (test_gguf_model:
pip cannot download, as offline) and subprocess.Popen (test_launcher). A replot started then
ran `/bin/false -m tunebook.cli …` (exit 1, no output). A replot starts with the interpreter,
Popen and environment of the session's start, whatever a test has patched meanwhile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPLOTS, Replot


def test_a_replot_started_while_a_test_patches_the_process_is_the_sessions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = Replot(*REPLOTS["cpu-ch08"], tmp_path)
    r.params = tmp_path / "missing.yaml"  # the CLI then exits at once, saying why (exit 2)

    def no_popen(*a: object, **k: object) -> None:
        raise OSError("a test's Popen")

    monkeypatch.setattr(sys, "executable", "/bin/false")
    monkeypatch.setattr(subprocess, "Popen", no_popen)
    r.run()
    rc, out = r.wait(60)
    assert rc == 2 and "missing.yaml" in out, (rc, out)
