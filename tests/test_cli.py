from pathlib import Path

import pytest

from tunebook.cli import EXIT_BAD_PARAMS, EXIT_OK, main

REPO = Path(__file__).resolve().parents[1]


def test_plan_is_a_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["plan", str(REPO / "params" / "quickstart.yaml"), "--outputs", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == EXIT_OK and "8 to run" in out and "--max-num-seqs 4" in out
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_run_dry_run_with_override(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["run", str(REPO / "params" / "quickstart.yaml"), "-p", "load.users", "[1]",
               "--outputs", str(tmp_path), "--dry-run"])
    assert rc == EXIT_OK and "2 run(s)" in capsys.readouterr().out


def test_bad_params_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: x\nmodel: qwen3-tiny\nload: {users: [0]}\n")
    assert main(["run", str(bad), "--outputs", str(tmp_path)]) == EXIT_BAD_PARAMS
    err = capsys.readouterr().err
    assert f"{bad}: load.users[0]" in err


def test_unknown_model_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("experiment: x\nmodel: no-such-model\n")
    assert main(["run", str(p), "--outputs", str(tmp_path)]) == EXIT_BAD_PARAMS
    assert "qwen3-tiny" in capsys.readouterr().err  # the error lists the presets
    assert not (tmp_path / "x" / "engines").exists()
