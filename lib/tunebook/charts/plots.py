"""Altair charts of a results frame (schema.COLUMNS + engine-knob columns), and of the manual.

The charts live one family per module of tunebook.charts: ``base`` (sizes, colours, the
conventions every chart of measured data follows, small helpers, display labels),
``measured`` (measured series and declarative curves), ``manual`` (the manual's numbers),
``starts`` (engine starts), ``slo`` (the SLO search), ``export`` (files) and ``workload`` (a
workload file's profile). This module re-exports their public API for notebooks, figures and
tests, which read ``from tunebook.charts import plots as charts`` and call ``charts.<name>``;
nothing inside tunebook.charts imports it.
"""

from __future__ import annotations

from tunebook.charts.base import (
    FAILURE_COLOUR,
    HEIGHT,
    PALETTE,
    PERCENTILES,
    REFERENCE_FILL,
    REFERENCE_STROKE,
    WIDTH,
    axis_title,
    display_label,
    fmt,
    labelled,
    require,
    titled,
    wrap,
)
from tunebook.charts.export import offline_html, save_chart, save_spec
from tunebook.charts.manual import (
    PANEL_WIDTH,
    Ratio,
    beside,
    label_lines,
    manual_panel,
    ratio_bars,
    ratio_first,
    ref_bars,
    ref_text,
    reference_lines,
    wrapped_labels,
)
from tunebook.charts.measured import (
    Curves,
    Saturation,
    curves,
    latency_percentiles,
    overlay,
    scaling,
    scaling_ratios,
)
from tunebook.charts.slo import bound_words, knob_text, slo_configs, slo_points
from tunebook.charts.starts import PHASE_COLOURS, PHASE_WORDS, start_phases
from tunebook.charts.workload import ASKED, SENT, workload_profile

__all__ = [
    "ASKED", "Curves", "FAILURE_COLOUR", "HEIGHT", "PALETTE", "PANEL_WIDTH", "PERCENTILES",
    "PHASE_COLOURS", "PHASE_WORDS", "REFERENCE_FILL", "REFERENCE_STROKE", "Ratio", "SENT",
    "Saturation", "WIDTH", "axis_title", "beside", "bound_words", "curves", "display_label", "fmt",
    "knob_text", "label_lines", "labelled", "latency_percentiles", "manual_panel", "offline_html",
    "overlay", "ratio_bars", "ratio_first", "ref_bars", "ref_text", "reference_lines", "require",
    "save_chart", "save_spec", "scaling", "scaling_ratios", "slo_configs", "slo_points",
    "start_phases", "titled", "workload_profile", "wrap", "wrapped_labels",
]
