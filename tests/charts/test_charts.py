"""Charts build valid Vega-Lite, surface failed runs, and export offline (no engine)."""

from __future__ import annotations

import json
import math
import re

import altair as alt
import pandas as pd
import pytest

from tunebook import figures
from tunebook.charts import plots as charts
from tunebook.core import schema
from tunebook.figures.ch01_engine import startup_table

USERS = (1, 2, 4, 8)


@pytest.fixture
def results() -> pd.DataFrame:
    """A SYNTHETIC results frame (made-up numbers, not measurements): two engine configs x
    users 1, 2, 4, 8, two repeats of each, plus one engine_failed config."""
    rows = []
    for label, seqs, speed in (("max_num_seqs=4", 4, 40.0), ("max_num_seqs=256", 256, 50.0)):
        for users in USERS:
            for repeat in (0, 1):
                scale = users if users <= seqs else seqs
                rows.append({
                    "status": "ok", "engine_label": label, "max_num_seqs": seqs,
                    "repeat": repeat, "max_concurrency": users,
                    "output_tok_s": speed * scale + repeat,
                    "p50_tpot_ms": 20.0 + users, "p90_tpot_ms": 25.0 + users,
                    "p99_tpot_ms": 30.0 + 2 * users, "median_tpot_ms": 20.0 + users,
                    "vllm_version": "0.32.0", "model_runner": "V1",
                    "attention_backend": "CPU_ATTN", "weights_gib": 0.5,
                    "kv_cache_gib": 4.0, "kv_pool_tokens": 29120, "max_concurrency_x": 7.1,
                    "hardware": "CPU (synthetic)", "model": "synthetic",
                })
    rows.append({"status": "engine_failed", "engine_label": "kv_cache_dtype=fp8",
                 "max_num_seqs": 256, "repeat": 0, "max_concurrency": 8,
                 "error": "engine did not start", "error_hint": "use kv_cache_dtype=auto"})
    df = pd.DataFrame(rows)
    for c in schema.COLUMNS:  # every schema column, typed as the store types them
        if c.name not in df:
            df[c.name] = None
        df[c.name] = df[c.name].astype(c.dtype)
    return df


def _spec(chart: alt.TopLevelMixin) -> dict:
    assert isinstance(chart, alt.TopLevelMixin)
    chart.to_dict(validate=True)  # raises on an invalid spec
    return json.loads(chart.to_json())


def _data_text(chart) -> str:
    return json.dumps(_spec(chart).get("datasets", {}), ensure_ascii=False)


def test_scaling(results):
    chart = charts.scaling(results)
    spec = _spec(chart)
    text = json.dumps(spec, ensure_ascii=False)
    assert "tok/s" in text and "log" in text and "engine_label" in text
    data = _data_text(chart)
    assert "engine_failed: kv_cache_dtype=fp8" in data  # the note
    assert "engine did not start" in data  # the failed cross's tooltip
    assert "errorbar" in text  # two repeats -> min-max bars


def test_scaling_single_repeat_has_no_error_bars(results):
    spec = _spec(charts.scaling(results[results.repeat == 0], y="output_tok_s_per_user"))
    assert "errorbar" not in json.dumps(spec)


def test_scaling_with_no_ok_rows_still_renders(results):
    failed = results[results.status != "ok"]
    assert "engine_failed" in _data_text(charts.scaling(failed))
    assert _spec(charts.scaling(results.iloc[0:0]))


def test_ok_rows_without_the_metric_or_a_label_are_surfaced(results):
    df = results.copy()
    df.loc[0, "output_tok_s"] = float("nan")
    df.loc[1, "engine_label"] = pd.NA
    data = _data_text(charts.scaling(df))
    assert "ok but no output_tok_s" in data and "(no label)" in data


def test_latency_percentiles(results):
    chart = charts.latency_percentiles(results, "tpot")
    data = _data_text(chart)
    assert all(p in data for p in ("p50", "p90", "p99")) and "engine_failed" in data
    with pytest.raises(ValueError):
        charts.latency_percentiles(results, "bogus")


def test_manual_panel_is_labelled_reference():
    chart = figures.get("1.3").reference_panel()
    text = json.dumps(_spec(chart), ensure_ascii=False)
    assert "reference" in text and "vLLM manual Fig 1.3" in text and "DGX Spark" in text
    data = _spec(chart)["datasets"]
    values = {row["ref"]: row["value"] for rows in data.values() for row in rows}
    assert values["output_ratio_64_vs_1"] == 8.0 and values["tpot_ratio_64_vs_1"] == 7.5
    assert "each user waited about 7.5" in text  # the claim, wrapped into the subtitle


def test_manual_panel_without_numbers():
    assert "states no numbers" in json.dumps(_spec(figures.get("1.2").reference_panel()))


def test_beside(results):
    chart = charts.beside(charts.scaling(results), figures.get("3.1").reference_panel())
    assert isinstance(chart, alt.HConcatChart)
    assert "output_tok_s_cap16_32_users" in _data_text(chart)


def test_scaling_ratios(results):
    ratios = charts.scaling_ratios(results, "output_tok_s", 1, 8)
    assert set(ratios) == {"max_num_seqs=4", "max_num_seqs=256", "kv_cache_dtype=fp8"}
    assert ratios["max_num_seqs=256"] == pytest.approx(400.5 / 50.5)
    assert math.isnan(ratios["kv_cache_dtype=fp8"])  # never ran
    assert all(math.isnan(v) for v in charts.scaling_ratios(results, "output_tok_s", 1, 64)
               .values())
    assert all(math.isnan(v) for v in charts.scaling_ratios(results, "no_such", 1, 8).values())
    assert charts.scaling_ratios(pd.DataFrame(), "output_tok_s", 1, 8) == {}


def test_ratio_bars(results):
    ratios = [charts.Ratio("output, 8 ÷ 1 users", 8.0,
                           charts.scaling_ratios(results, "output_tok_s", 1, 8)),
              charts.Ratio("TPOT, 8 ÷ 1 users", 7.5, {"max_num_seqs=4": 1.4}, "≈"),
              charts.Ratio("no manual number", None, {"max_num_seqs=4": 2.0})]
    data = _data_text(charts.ratio_bars(ratios, "t"))
    assert "manual (reference)" in data and "measured here" in data and "not measured" in data
    assert "8×" in data and "≈ 7.5×" in data
    rows = [r for v in _spec(charts.ratio_bars(ratios, "t"))["datasets"].values() for r in v
            if "ratio" in r]
    # a ratio the manual does not state gets no manual bar
    assert not [r for r in rows if r["ratio"] == "no manual number"
                and r["source"].startswith("manual")]


def test_a_band_claim_gets_dots_on_a_zoomed_axis():
    """Within 3%: bars from 0 would make a 3.5% gap a few pixels; dots on an axis zoomed to
    the band (and every value) show it."""
    ratios = [charts.Ratio("8 users", None, {"": 0.965}, "≈"),
              charts.Ratio("32 users", 1.0, {"": 0.982}, "≈")]
    spec = _spec(charts.ratio_bars(ratios, "t", band=(0.97, 1.03)))
    marks = [layer["mark"] for layer in spec["layer"]]
    assert any(isinstance(m, dict) and m["type"] == "point" for m in marks)
    assert not any(isinstance(m, dict) and m["type"] == "bar" for m in marks)
    y = next(layer["encoding"]["y"] for layer in spec["layer"]
             if isinstance(layer["mark"], dict) and layer["mark"]["type"] == "point")
    low, high = y["scale"]["domain"]
    assert y["scale"]["zero"] is False and low < 0.965 and high > 1.03 and low > 0.9
    plain = _spec(charts.ratio_bars(ratios, "t"))  # no band: bars from 0, as before
    assert any(isinstance(layer["mark"], dict) and layer["mark"]["type"] == "bar"
               for layer in plain["layer"])


def test_ratio_first_puts_the_ratio_on_top(results):
    head = charts.ratio_bars([charts.Ratio("x", 2.0, {"a": 1.5})], "ratio")
    chart = charts.ratio_first(head, charts.scaling(results), figures.get("1.3").reference_panel())
    spec = _spec(chart)
    assert "vconcat" in spec and "hconcat" in spec["vconcat"][0]
    assert spec["vconcat"][0]["hconcat"][0]["title"]["text"] == "ratio"


def test_display_label():
    assert charts.display_label("kv_cache_memory_bytes=21474836480") == "KV pool 20 GiB"
    assert (charts.display_label("kv_cache_memory_bytes=1073741824, kv_cache_dtype=fp8")
            == "KV pool 1 GiB, kv_cache_dtype=fp8")
    assert (charts.display_label('speculative_config={"method": "ngram", '
                                 '"num_speculative_tokens": 3}') == "spec ngram ×3")
    assert charts.display_label("max_num_seqs=4") == "max_num_seqs=4"
    assert charts.display_label("default") == "default"


def test_curves_spec(results):
    spec = charts.Curves(y=("output_tok_s", "median_tpot_ms"),
                         filter_by=(("max_num_seqs", 4),))
    chart = charts.curves(results, spec)
    data = _data_text(chart)
    assert "max_num_seqs=4" in data and "max_num_seqs=256" not in data
    assert len(_spec(chart)["hconcat"]) == 2  # one panel per y
    by_knob = charts.curves(results, charts.Curves(curve_by="max_num_seqs"))
    assert "max_num_seqs=256" in _data_text(by_knob)
    empty = charts.curves(results, charts.Curves(filter_by=(("no_such_column", 1),)))
    assert _spec(empty)


def test_startup_table(results):
    chart = startup_table(results)
    data = _data_text(chart)
    assert "CPU_ATTN" in data and "29,120" in data and "7.10×" in data
    assert "1 engine_failed" in data and "—" in data  # the failed config: shown, facts blank


def test_save_chart(results, tmp_path):
    panel = figures.get("1.3").reference_panel()
    paths = charts.save_chart(charts.beside(charts.scaling(results), panel), tmp_path / "fig")
    assert [p.name for p in paths] == ["fig.png", "fig.svg"]
    png, svg = (p.read_bytes() for p in paths)
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert b"<svg" in svg
    with pytest.raises(ValueError):
        charts.save_chart(panel, tmp_path / "x", formats=("png", "gif"))
    assert not (tmp_path / "x.png").exists()  # checked before anything is written


def test_offline_html(results):
    html = charts.offline_html(charts.scaling(results))
    assert "cdn.jsdelivr" not in html
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert "vegaEmbed" in html and "engine_failed" in html


def _rows_of(chart, column: str) -> list[dict]:
    """Every data row (of any layer) that has ``column``."""
    return [r for rows in _spec(chart)["datasets"].values() for r in rows if column in r]


def _subtitles(chart) -> list[str]:
    spec = _spec(chart)
    return [line for part in (spec.get("hconcat") or [spec])
            for line in part["title"].get("subtitle", [])]


def test_repeats_draw_the_95_percent_interval(results):
    chart = charts.scaling(results)
    text = json.dumps(_spec(chart), ensure_ascii=False)
    assert "mean of 2 repeats, bars = 95% CI" in text and "min–max" not in text
    assert '"ci_low"' in text and '"ci_high"' in text  # the bars' fields
    # each point has repeats v and v + 1: sd 0.7071, t(0.975, 1) = 12.706:
    # half width 12.706 * 0.7071 / sqrt(2) = 6.353 around the mean v + 0.5
    point = next(r for r in _rows_of(chart, "ci_low")
                 if r["engine_label"] == "max_num_seqs=4" and r["max_concurrency"] == 8)
    assert point["mean"] == 160.5 and point["runs"] == 2
    assert point["ci_high"] - point["mean"] == pytest.approx(6.353, abs=1e-3)
    assert point["min"] == 160 and point["max"] == 161  # still in the tooltip


def test_a_point_with_one_run_gets_no_bar(results):
    df = results.drop(results[(results.max_concurrency == 8) & (results.repeat == 1)].index)
    chart = charts.scaling(df)
    assert any("mean of 1–2 repeats, bars = 95% CI where ≥ 2" in s for s in _subtitles(chart))
    bars = [layer for layer in _spec(chart)["layer"]
            if isinstance(layer.get("mark"), dict) and layer["mark"]["type"] == "errorbar"]
    data = _spec(chart)["datasets"][bars[0]["data"]["name"]]
    assert data and all(r["max_concurrency"] != 8 for r in data)  # one run: no bar


def test_saturation_marks_peak_and_knee(results):
    chart = charts.curves(results, charts.Curves(y=("output_tok_s", "median_tpot_ms"),
                                                 saturation=True))
    marks = {(r["engine_label"], r["max_concurrency"], r["mark"]) for r in _rows_of(chart, "mark")
             if "knee_reason" in r}
    # max_num_seqs=4: 40.5, 80.5, 160.5, 160.5 tok/s at 1, 2, 4, 8 users: the cap binds at 4
    # users, so the peak (first of the tie) and the knee (no gain from 4 to 8) are both at 4.
    # max_num_seqs=256: linear up to 8 users, the highest load: peak there, knee beyond.
    assert marks == {("max_num_seqs=4", 4.0, "peak = knee"), ("max_num_seqs=256", 8.0, "peak")}
    placed = {(r["engine_label"], r["max_concurrency"], r["mean"]) for r in _rows_of(chart, "mark")}
    assert len(_spec(chart)["hconcat"]) == 2 and len(placed) == 4  # 2 marks on each panel
    subtitle = " ".join(_subtitles(chart))
    assert "knee = last load before one more user adds < 50%" in subtitle
    assert "knee beyond the measured range: max_num_seqs=256" in subtitle
    assert "peak at the largest load measured" in subtitle
    assert "engine_failed: kv_cache_dtype=fp8" in _data_text(chart)  # failures still shown
    # the TPOT panel marks the same load points at its own values
    tpot = [r for r in _rows_of(chart, "mark") if r["mean"] == 24.0]
    assert tpot and tpot[0]["max_concurrency"] == 4


def test_saturation_options(results):
    one = results[results.repeat == 0]
    for chart in (charts.scaling(one, saturation=True),
                  charts.latency_percentiles(results, "tpot", saturation=True),
                  charts.overlay({"cpu": one, "h200": results}, saturation=True),
                  charts.scaling(results, saturation=charts.Saturation(
                      latency="p99_tpot_ms", max_latency_multiple=1.5))):
        assert _rows_of(chart, "mark")
    strict = charts.scaling(results, saturation=charts.Saturation(
        latency="p99_tpot_ms", max_latency_multiple=1.5))
    assert "P99 TPOT > 1.5×" in " ".join(_subtitles(strict))
    assert "peak" not in json.dumps(_spec(charts.scaling(results)))  # off by default
    failed = results[results.status != "ok"]
    assert "engine_failed" in _data_text(charts.scaling(failed, saturation=True))


def test_where_the_search_went_has_a_panel_per_third_knob_value() -> None:
    """A 3-knob space (the H200's 20 configs): the first two knobs on the axes, one panel per
    value of the third, so no two configs share a cell; `null` reads 'default'."""
    from tunebook.charts import plots as charts

    space = {"quantization": [None, "fp8"], "max_num_seqs": [64, 1024],
             "max_num_batched_tokens": [2048, 8192]}
    configs = [{"knobs": {"quantization": q, "max_num_seqs": m, "max_num_batched_tokens": b},
                "score": 100.0 * (i + 1), "why": "full grid", "pruned": False, "points": []}
               for i, (q, m, b) in enumerate([(None, 64, 2048), ("fp8", 1024, 8192)])]
    summary = {"search": {"knobs": space, "objective": "output_tok_s"}, "configs": configs,
               "best": {"knobs": configs[1]["knobs"]}}
    spec = charts.slo_configs(summary).to_dict()
    panels = spec["hconcat"]
    assert [p["title"] for p in panels] == ["max_num_batched_tokens=2048",
                                            "max_num_batched_tokens=8192"]
    cells = [[row for layer in p["layer"] for row in spec["datasets"][layer["data"]["name"]]]
             for p in panels]
    assert {r["quantization"] for r in cells[0]} == {"default"}
    assert any("★" in r["label"] for r in cells[1]) and not any("★" in r["label"]
                                                               for r in cells[0])


def test_slo_points_put_the_bound_that_binds_on_x():
    """Two bounds, and the points miss only TTFT's: a chart of TPOT would show crosses left
    of its line, so x is p99_ttft_ms and the subtitle says why; configs of several knobs are
    named by their values under a title naming the knobs."""
    def pt(users: int, tok_s: float, tpot: float, ttft: float) -> dict:
        return {"users": users, "value": tok_s, "p99_tpot_ms": tpot, "p99_ttft_ms": ttft,
                "meets": tpot <= 40 and ttft <= 2000}

    summary = {
        "slo": ["p99_tpot_ms <= 40", "p99_ttft_ms <= 2000"],
        "search": {"objective": "output_tok_s",
                   "knobs": {"quantization": [None, "fp8"], "max_num_seqs": [256, 1024]}},
        "configs": [
            {"knobs": {"quantization": None, "max_num_seqs": 1024}, "pruned": False,
             "points": [pt(128, 5900, 20, 1600), pt(192, 5950, 25, 2600)]},
            {"knobs": {"quantization": "fp8", "max_num_seqs": 256}, "pruned": False,
             "points": [pt(192, 8300, 20, 1700), pt(256, 8400, 26, 2500)]}],
        "best": {"knobs": {"quantization": "fp8", "max_num_seqs": 256}, "users": 192,
                 "output_tok_s": 8300},
        "points": 4, "engine_starts": 2, "engine_s": 300, "grid_points": 16}
    spec = _spec(charts.slo_points(summary))
    x_fields = {layer["encoding"]["x"]["field"] for layer in spec["layer"]
                if "x" in layer.get("encoding", {})}
    assert x_fields == {"p99_ttft_ms"}
    assert any("x: P99 TTFT, the bound that binds: 2 of the 2 points that miss the SLO "
               "miss it" in t
               for t in spec["title"]["subtitle"])
    colour = spec["layer"][0]["encoding"]["color"]
    assert colour["title"] == "quantization · max_num_seqs"
    assert "fp8 · 256" in _data_text(charts.slo_points(summary))
