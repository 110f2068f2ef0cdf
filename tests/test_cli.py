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


def test_unknown_model_in_engine_grid_exit_2(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("experiment: x\nmodel: qwen3-tiny\nengine_grid:\n  - {}\n"
                   "  - {model: /no/such/model/folder}\nload: {users: [1]}\n")
    assert main(["plan", str(bad), "--outputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "engine_grid[1].model" in err and str(bad) in err


def test_claims_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1] / "outputs" / "h200"
    assert main(["claims", str(root), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.3 |" in out and "NVIDIA H200" in out
    assert {p.name for p in tmp_path.iterdir()} == {"claims.csv", "claims.md", "claims.html",
                                                    "claims.json"}
    assert main(["claims", str(tmp_path)]) == 2  # no experiments there: a clear refusal
