"""Rendering: papermill executes a notebook into the experiment folder, nbconvert turns it into
a self-contained HTML file (charts are inline SVG: no CDN, no network), and the Altair
renderer used inside notebooks emits both the interactive Vega-Lite bundle (JupyterLab) and
a static SVG (for the shared HTML)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tunebook import config
from tunebook.store import replace_atomic, stamp

_SECRET_RE = re.compile(r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,})")


VEGALITE_MIME = "application/vnd.vegalite.v5+json"


def _svg(spec: dict[str, Any]) -> str | None:
    try:
        import vl_convert as vlc
    except ImportError:  # e.g. on the device: to_html adds the SVG when rendering
        return None
    return vlc.vegalite_to_svg(spec)


def _svg_and_spec(spec: dict[str, Any], **_: Any) -> dict[str, Any]:
    bundle: dict[str, Any] = {VEGALITE_MIME: spec,
                              "text/plain": "<altair chart: see the SVG / interactive view>"}
    svg = _svg(spec)
    if svg:
        bundle["image/svg+xml"] = svg
    return bundle


def enable_offline_charts() -> None:
    """Make every displayed Altair chart carry a static SVG (works in offline HTML)."""
    import altair as alt

    alt.renderers.register("tunebook", _svg_and_spec)
    alt.renderers.enable("tunebook")
    alt.data_transformers.disable_max_rows()


def notebook_path(name: str) -> Path:
    p = config.notebooks_dir() / f"{name}.ipynb"
    if not p.exists():
        raise FileNotFoundError(f"no notebook {name!r} under {config.notebooks_dir()}")
    return p


def execute(notebook: str, exp_dir: Path, parameters: dict[str, Any],
            progress: bool = True) -> Path:
    """Run a notebook with papermill into `exp_dir/notebooks/<name>__<stamp>.ipynb`."""
    import papermill as pm

    out = exp_dir / "notebooks" / f"{notebook}__{stamp()}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Only what the notebook declares: papermill would inject the rest with a warning.
    declared = pm.inspect_notebook(str(notebook_path(notebook)))
    parameters = {k: v for k, v in parameters.items() if k in declared}
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
    return out


def to_html(ipynb: Path, html: Path | None = None) -> Path:
    """A self-contained HTML file beside the executed notebook (and `report.html`, latest)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    for cell in nb.cells:  # the interactive spec has no renderer in plain HTML: keep an SVG
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if VEGALITE_MIME in data and "image/svg+xml" not in data:
                data["image/svg+xml"] = _svg(data[VEGALITE_MIME])
            if data.get("image/svg+xml"):
                data.pop(VEGALITE_MIME, None)
    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(nb)
    body = _SECRET_RE.sub("***", _offline(body))
    html = html or ipynb.with_suffix(".html")
    replace_atomic(html, body.encode())
    replace_atomic(ipynb.parent.parent / "report.html", body.encode())
    return html


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

    from tunebook import charts

    nb = nbformat.read(str(ipynb), as_version=4)
    written: list[Path] = []
    for i, cell in enumerate(nb.cells):
        n = 0
        for o in cell.get("outputs", []):
            spec = o.get("data", {}).get(VEGALITE_MIME)
            if spec:
                n += 1
                written += charts.save_spec(spec, Path(out_dir) / f"cell{i:02d}-{n}",
                                            formats or ["png", "svg"])
    return written


def latest_notebook(exp_dir: Path) -> Path:
    found = sorted((Path(exp_dir) / "notebooks").glob("*.ipynb"))
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
