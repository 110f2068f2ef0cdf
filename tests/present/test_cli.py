from pathlib import Path

import pytest

from conftest import Replot
from tunebook.cli import EXIT_BAD_PARAMS, EXIT_LOCKED, EXIT_OK, main

REPO = Path(__file__).resolve().parents[2]


def test_plan_is_a_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["plan", str(REPO / "params" / "quickstart.yaml"), "--outputs", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == EXIT_OK and "8 to run" in out and "--max-num-seqs 4" in out
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.parametrize("cmd", [["plan"], ["run", "--dry-run"]])
def test_a_search_is_planned_as_a_search(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         cmd: list[str]) -> None:
    """Params with slo/search run their search (20_slo, `tune`): the dry run describes it,
    not the base config's sweep over every level, which is not what runs."""
    assert main([cmd[0], str(REPO / "params" / "slo.yaml"), "--outputs", str(tmp_path),
                 *cmd[1:]]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("search slo: maximise output_tok_s subject to ") and "todo" not in out
    assert not any(tmp_path.iterdir())


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


@pytest.mark.parametrize("argv", [["sweep", "--dry-run"], ["sweep"], ["tune", "--dry-run"],
                                  ["tune"]])
def test_a_mistyped_model_is_refused_by_every_command(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path, argv: list[str]) -> None:
    """sweep and tune check the model as plan and run do: before anything is written (tune
    used to create the experiment and let the search's first trial fail), and the preset
    meant is named."""
    p = tmp_path / "p.yaml"
    p.write_text("experiment: x\nmodel: qwen3-8\nload: {users: [1, 2]}\n"
                 "slo: ['p99_tpot_ms <= 50']\nsearch: {knobs: {max_num_seqs: [1, 2]}}\n")
    out = tmp_path / "out"
    assert main([argv[0], str(p), "--outputs", str(out), *argv[1:]]) == EXIT_BAD_PARAMS
    assert f"{p}: model: cannot resolve model 'qwen3-8' (did you mean 'qwen3-8b'?)" in \
        capsys.readouterr().err
    assert not out.exists()


def test_unknown_model_in_engine_grid_exit_2(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("experiment: x\nmodel: qwen3-tiny\nengine_grid:\n  - {}\n"
                   "  - {model: /no/such/model/folder}\nload: {users: [1]}\n")
    assert main(["plan", str(bad), "--outputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "engine_grid[1].model" in err and str(bad) in err


def test_claims_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2] / "outputs" / "h200"
    assert main(["claims", str(root), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.3 |" in out and "NVIDIA H200" in out
    assert {p.name for p in tmp_path.iterdir()} == {"claims.csv", "claims.md", "claims.html",
                                                    "claims.json"}
    assert main(["claims", str(tmp_path)]) == 2  # no experiments there: a clear refusal


@pytest.fixture()
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TUNEBOOK_WAIT_S", "0")  # `--wait` sets it in-process: undone after


@pytest.mark.usefixtures("_state")
def test_lock_refuses_an_overlapping_run_of_the_same_experiment(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A second scheduled run while the first still holds the experiment: exit 3 at once,
    naming the holder; nothing is started or written."""
    from tunebook.measure.locks import experiment_lock

    params = REPO / "params" / "quickstart.yaml"
    with experiment_lock(tmp_path / "quickstart"):
        rc = main(["sweep", str(params), "--outputs", str(tmp_path)])
    assert rc == EXIT_LOCKED
    err = capsys.readouterr().err
    assert "experiment quickstart is in use by pid" in err
    assert not list((tmp_path / "quickstart" / "runs").glob("*.json"))


@pytest.mark.usefixtures("_state")
def test_machine_lock_refuses_or_waits(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    """Another experiment holding the machine (its accelerator): refused at once, or after
    --wait seconds."""
    import time

    from tunebook.measure.locks import machine_lock

    params = REPO / "params" / "quickstart.yaml"
    with machine_lock():
        t0 = time.monotonic()
        rc = main(["sweep", str(params), "--outputs", str(tmp_path), "--wait", "3"])
        waited = time.monotonic() - t0
    assert rc == EXIT_LOCKED and waited >= 3
    assert "this machine's accelerator is in use" in capsys.readouterr().err


def test_index_and_compare_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import shutil

    for machine in ("cpu", "h200"):
        shutil.copytree(REPO / "outputs" / machine / "ch01", tmp_path / machine / "ch01")
    assert main(["index", str(tmp_path)]) == EXIT_OK
    page = (tmp_path / "index.html").read_text()
    assert 'href="cpu/ch01/report.html"' in page and 'href="h200/ch01/report.html"' in page
    assert "NVIDIA H200" in page and "<script" not in page
    assert "href='overview.html'" in page  # the overview, from the same claims
    over = (tmp_path / "overview.html").read_text()
    assert over.count('data-figure="1.3"') == 2 and over.count("<tr id=") == 26
    assert 'href="h200/ch01/report.html#fig-1-3"' in over  # the committed report's anchor
    (tmp_path / "index.html").unlink()
    assert main(["index", "--outputs", str(tmp_path)]) == EXIT_OK  # as the other commands say
    assert (tmp_path / "index.html").read_text() == page
    out = tmp_path / "cmp.html"
    assert main(["compare", str(tmp_path / "cpu" / "ch01"), str(tmp_path / "h200" / "ch01"),
                 "--out", str(out)]) == EXIT_OK
    html = out.read_text()
    assert "<td>cpu/ch01</td>" in html and "<td>h200/ch01</td>" in html
    assert "cpu/ch01 \\u00b7 default" in html or "cpu/ch01 · default" in html
    assert "https://cdn" not in html  # vega inlined: opens offline
    assert main(["compare", str(tmp_path / "cpu" / "ch01"), "--out", str(out)]) == \
        EXIT_BAD_PARAMS


def test_export_writes_png_and_svg(tmp_path: Path) -> None:
    assert main(["export", str(REPO / "outputs" / "h200" / "ch01"), "--out",
                 str(tmp_path)]) == EXIT_OK
    pngs, svgs = sorted(tmp_path.glob("*.png")), sorted(tmp_path.glob("*.svg"))
    assert pngs and len(pngs) == len(svgs)
    assert pngs[0].read_bytes()[:4] == b"\x89PNG" and b"<svg" in svgs[0].read_bytes()[:500]


@pytest.mark.replot("h200-ch01")
def test_replot_redraws_stored_results_without_an_engine(replots: dict[str, Replot],
                                                         tmp_path: Path) -> None:
    """Results brought back from the H200: the notebook runs again on them alone (the replot
    of a copy of outputs/h200/ch01 ran in the background: see conftest)."""
    from tunebook.present import report

    r = replots["h200-ch01"]
    rc, out = r.wait()
    assert rc == EXIT_OK, out
    ipynb = report.latest_notebook(r.exp)
    assert report.notebook_parameters(ipynb)["dry_run"] is True
    assert sorted((r.exp / "engines").iterdir()) == r.engine_logs_before  # nothing started
    html = (r.exp / "report.html").read_text()
    assert "NVIDIA H200" in html and "nothing starts" in html
    assert main(["run", str(REPO / "params" / "ch01.yaml"), "--outputs",
                 str(tmp_path / "empty"), "--replot"]) == EXIT_BAD_PARAMS


def test_tune_dry_run_says_what_a_run_would_resume_from(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    """The committed CPU search: the dry run counts its stored points, configs and engine time
    as the search's own summary did (benchmark.json), and writes nothing."""
    import json

    bench = REPO / "outputs" / "cpu" / "slo-bench"
    summary = json.loads((bench / "benchmark.json").read_text())["search"]
    before = sorted(p.name for p in (bench / "slo-search").rglob("*"))
    assert main(["tune", str(REPO / "params" / "slo.yaml"), "-p", "experiment", "slo-search",
                 "--outputs", str(bench), "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert (f"stored in slo-search/: {summary['points']} points ok on "
            f"{summary['engine_starts']} engine configs, {summary['engine_s']:,.0f} s") in out
    assert sorted(p.name for p in (bench / "slo-search").rglob("*")) == before
    assert main(["tune", str(REPO / "params" / "slo.yaml"), "--outputs",
                 str(tmp_path), "--dry-run"]) == EXIT_OK
    assert "stored in" not in capsys.readouterr().out


@pytest.mark.parametrize(("env", "said"), [
    ({"TUNEBOOK_WAIT_S": "soon"}, "TUNEBOOK_WAIT_S='soon': expected seconds to wait"),
    ({"TUNEBOOK_DEADLINE": "abc"}, "TUNEBOOK_DEADLINE='abc': expected a unix time"),
    ({"TUNEBOOK_RAY": "local", "TUNEBOOK_RAY_SLOTS": "-1"},
     "TUNEBOOK_RAY_SLOTS='-1': expected engines at once, 1 or more"),
])
def test_a_bad_environment_variable_is_said_before_anything_is_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        env: dict[str, str], said: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "out"
    assert main(["sweep", str(REPO / "params" / "quickstart.yaml"), "--outputs", str(out)]) \
        == EXIT_BAD_PARAMS
    assert f"tunebook: {said}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--wait", "-3"], ["--ray-slots", "0"],
                                   ["--ray-slots", "two"]])
def test_bad_numbers_in_flags_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     flags: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(REPO / "params" / "quickstart.yaml"), "--outputs", str(tmp_path),
              "--dry-run", *flags])
    assert e.value.code == EXIT_BAD_PARAMS
    assert f"argument {flags[0]}: expected" in capsys.readouterr().err


def test_engines_phases_reads_stored_starts(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    """`tunebook engines --phases`: one line per stored engine start, its phases summing to
    its start; a folder that does not exist is bad input, not an empty table."""
    exp = REPO / "outputs" / "cpu" / "ch01"
    assert main(["engines", "--phases", str(exp)]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"== {exp}: where each engine start's time went")
    header, first = lines[1].split(), lines[2].split()
    assert header[0:2] == ["engine", "config"] and "total_s" in header
    phases = [float(x) for x in first[1:header.index("total_s") - 1]]
    assert sum(phases) == pytest.approx(float(first[header.index("total_s") - 1]), abs=1.0)
    assert main(["engines", "--phases", str(tmp_path / "nope")]) == EXIT_BAD_PARAMS
    assert "no such folder" in capsys.readouterr().err


def test_a_restarted_config_is_charged_its_first_start(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    """A search resumed in a second call started a config again (warm, shorter): the stored
    progress charges the start an uninterrupted search would have paid, the first."""
    from tunebook.results.store import Store

    store = Store(tmp_path / "slo")
    for run, users, t0, start_s in (("a", 4, "2026-01-01T00:00:00Z", 100.0),
                                    ("b", 8, "2026-01-01T01:00:00Z", 60.0)):
        store.save_run({"row": {"run_id": run, "status": "ok", "engine_config_id": "e1",
                                "max_concurrency": users, "startup_s": start_s,
                                "started_at": t0, "finished_at": t0.replace(":00Z", ":10Z")}})
    assert main(["tune", str(REPO / "params" / "slo.yaml"), "--outputs", str(tmp_path),
                 "--dry-run"]) == EXIT_OK
    assert "stored in slo/: 2 points ok on 1 engine config, 120 s of engine time" in \
        capsys.readouterr().out  # 100 s (the first start) + 2 × 10 s of runs
    # run a again later (ok again): the search reads its latest attempt, counted once
    store.save_run({"row": {"run_id": "a", "status": "ok", "engine_config_id": "e1",
                            "max_concurrency": 4, "startup_s": 50.0,
                            "started_at": "2026-01-01T02:00:00Z",
                            "finished_at": "2026-01-01T02:00:10Z"}})
    assert main(["tune", str(REPO / "params" / "slo.yaml"), "--outputs", str(tmp_path),
                 "--dry-run"]) == EXIT_OK
    assert "2 points ok on 1 engine config, 80 s of engine time" in capsys.readouterr().out


QUIET_EXIT = """
import atexit, sys, threading, time
import triton._C.libtriton  # what vLLM loads: its teardown prints nanobind's leak lines
from tunebook.cli import _quiet_exit

def late():
    time.sleep(0.3)
    print("thread finished", file=sys.stderr)

def boom():
    raise RuntimeError("a real error at exit")

atexit.register(lambda: print("atexit ran", file=sys.stderr))
atexit.register(boom)
threading.Thread(target=late).start()
print("buffered stdout", end="")
_quiet_exit(3)
"""


def test_quiet_exit_skips_teardown_only() -> None:
    """The command's exit skips the interpreter's teardown (where triton's bindings print
    dozens of nanobind lines) and nothing before it: threads joined, atexit handlers run and
    their errors shown, output flushed, the exit code kept. That the lines are gone is checked
    on real sweeps' output (tests/measure/test_faults.py): a script this small does not leak."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", QUIET_EXIT], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 3, p.stderr[-2000:]
    assert p.stdout == "buffered stdout"
    for said in ("thread finished", "atexit ran", "RuntimeError: a real error at exit"):
        assert said in p.stderr, p.stderr[-2000:]
