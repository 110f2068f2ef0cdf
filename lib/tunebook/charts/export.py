"""Charts written to files: png, svg and pdf through vl-convert (imported only when
exporting), and html that needs no network."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import altair as alt

from tunebook.charts.base import _VL_VERSION


# --- export -------------------------------------------------------------------------------
def _vlc():  # imported when exporting: a machine without vl-convert can still draw charts
    import vl_convert

    return vl_convert


_EXPORTERS = {
    "png": lambda spec: _vlc().vegalite_to_png(spec, _VL_VERSION, scale=2),
    "svg": lambda spec: _vlc().vegalite_to_svg(spec, _VL_VERSION).encode("utf-8"),
    "pdf": lambda spec: _vlc().vegalite_to_pdf(spec, _VL_VERSION),
}


def save_chart(chart: alt.TopLevelMixin, path_stem: Path,
               formats: Iterable[str] = ("png", "svg")) -> list[Path]:
    """Write ``<path_stem>.<fmt>`` for each format (png, svg, pdf, html) with vl-convert."""
    formats, path_stem = list(formats), Path(path_stem)
    unknown = [f for f in formats if f != "html" and f not in _EXPORTERS]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; use png, svg, pdf or html")
    written = save_spec(chart.to_json(), path_stem, [f for f in formats if f != "html"])
    if "html" in formats:
        path = path_stem.parent / f"{path_stem.name}.html"
        path.write_text(offline_html(chart), encoding="utf-8")
        written.append(path)
    return written


def save_spec(spec: str | dict, path_stem: Path, formats: Iterable[str] = ("png", "svg"),
              ) -> list[Path]:
    """Write a Vega-Lite spec (a chart's JSON) as ``<path_stem>.<fmt>`` for png/svg/pdf."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        if fmt not in _EXPORTERS:
            raise ValueError(f"unknown format {fmt!r}; use png, svg or pdf")
        path = path_stem.parent / f"{path_stem.name}.{fmt}"
        path.write_bytes(_EXPORTERS[fmt](spec))
        written.append(path)
    return written


def offline_html(chart: alt.TopLevelMixin) -> str:
    """A standalone HTML page with vega, vega-lite and vega-embed inlined (no network)."""
    return chart.to_html(inline=True)
