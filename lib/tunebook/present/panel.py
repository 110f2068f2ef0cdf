"""The tuning panel (notebooks/10_tune.ipynb): pick a model, engine knobs and a load in
ipywidgets, press Run, watch progress and the chart grow point by point.

Replayable by construction: the widgets only ever edit a params mapping (`to_dict()`), which is
validated by `tunebook.inputs.params.parse` and run by the same `Sweep` as `tunebook run`.
Every run records that mapping under `<outputs>/<experiment>/inputs/`, and "Save as params"
writes it as a YAML file whose plan equals the panel's (see tests/present/test_panel.py). No
state lives in the widgets that the params file does not hold.

The engine stays up while only load settings change (an `EngineKeeper`); changing an engine
knob, the model or engine_env restarts it on the next Run. "Stop engine" (or the kernel's
exit) releases it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from tunebook.core.knobs import PANEL_KNOBS, PANEL_SPEC_METHODS
from tunebook.inputs import params as P
from tunebook.inputs.plan import Plan, make_plan
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions, SweepResult
from tunebook.models.presets import PRESETS
from tunebook.present import index, report
from tunebook.results.store import Store, stamp, write_new

# The engine knobs the panel offers, and their choices, are tunebook.core.knobs' (PANEL_KNOBS,
# PANEL_SPEC_METHODS). "vLLM default" (or 0 in a number field) leaves the knob out entirely,
# so vLLM picks, exactly as a params file without the key would.
LOAD_INTS = ("input_len", "output_len", "prefix_len", "prompts_per_user", "num_warmups")
DEFAULT = "vLLM default"


def _csv_ints(text: str) -> list[int] | str:
    """'1, 2, 4' → [1, 2, 4]; anything else is returned as is, for params to reject clearly."""
    try:
        return [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        return str(text)


def _csv_rates(text: str) -> list[float | None] | str:
    out: list[float | None] = []
    for x in str(text).replace(" ", "").split(","):
        if not x:
            continue
        if x.lower() in ("inf", "null", "none"):
            out.append(None)
            continue
        try:
            out.append(float(x))
        except ValueError:
            return str(text)
    return out


def _fmt_list(values: Any) -> str:
    return ", ".join("inf" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
                     for v in values)


class TunePanel:
    """State = a params mapping. Widgets read and write it; `run()` sweeps it."""

    def __init__(self, params: P.SweepParams, outputs: Path | str, experiment: str | None = None):
        data = params.to_dict()
        grid = data.pop("engine_grid") or [{}]
        # The panel tunes one engine config: the file's base knobs + its first grid entry.
        engine = {**data["engine"], **grid[0]}
        data["model"] = engine.pop("model", data["model"])
        data["engine"], data["engine_grid"] = engine, [{}]
        data["experiment"] = experiment or data["experiment"]
        data["notebook"] = "10_tune"
        self.data: dict[str, Any] = data
        self.outputs = Path(outputs).resolve()
        self.keeper = EngineKeeper()
        self.last: SweepResult | None = None
        self._w: dict[str, Any] = {}
        self._ui: Any = None

    # -- the params the panel stands for --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The params mapping (widget values applied, if the widgets were built)."""
        if self._w:
            self._read_widgets()
        return copy.deepcopy(self.data)

    def params(self) -> P.SweepParams:
        """Validated params; a bad value raises ParamsError before any engine starts."""
        return P.parse(self.to_dict(), source="tuning panel")

    def plan(self) -> Plan:
        return make_plan(self.params())

    def set(self, **changes: Any) -> TunePanel:
        """Programmatic edits with dotted keys (what a widget does): ``set(**{"load.users":
        [1, 2], "engine.max_num_seqs": 8})``; a value of None removes an engine knob."""
        self.to_dict()  # fold widget edits in first
        for dotted, value in changes.items():
            node = self.data
            *parents, last = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            if value is None and parents == ["engine"]:
                node.pop(last, None)
            else:
                node[last] = value
        if self._w:
            self._write_widgets()
        return self

    def save_params(self, path: Path | str | None = None) -> Path:
        """Write the params as YAML (never over an existing file). Default:
        ``<outputs>/<experiment>/inputs/panel__<stamp>.yaml``. `tunebook run` of that file
        plans exactly the runs this panel would."""
        params = self.params()  # only valid params are saved
        text = ("# Saved by the tunebook tuning panel; replay with: tunebook run <this file>\n"
                + yaml.safe_dump(params.to_dict(), sort_keys=False))
        if path is None:
            path = self.outputs / params.experiment / "inputs" / f"panel__{stamp()}.yaml"
        return write_new(Path(path), text.encode())

    # -- running ---------------------------------------------------------------------------
    def run(self, progress: bool = True) -> SweepResult:
        """Sweep the current params; reuses the running engine if its config is unchanged."""
        params = self.params()
        sweep = Sweep(params, self.outputs, SweepOptions(
            progress=progress, keeper=self.keeper, on_result=self._on_result,
            on_finish=index.rebuild))
        done = sweep.done()  # reads every run file: once, not once per planned run
        self._status(f"running {len(sweep.plan.runs)} run(s): "
                     f"{sum(r.run_id not in done for r in sweep.plan.runs)} to do")
        self.last = sweep.run()
        r = self.last
        self._status(f"{r.ok} ok, {r.failed} not ok, {r.skipped} already done · "
                     + self.engine_status())
        self._refresh()
        return r

    def stop_engine(self) -> None:
        self.keeper.stop()
        self._status(self.engine_status())

    def engine_status(self) -> str:
        e = self.keeper.engine
        if e is None or not e.alive():
            return f"engine: stopped ({self.keeper.starts} start(s) so far)"
        return (f"engine: up (pid {e.proc.pid}, port {e.port}; {self.keeper.starts} start(s) so "
                "far) — change only load settings to reuse it")

    @property
    def store(self) -> Store:
        return Store(self.outputs / str(self.data["experiment"]))

    def table(self) -> pd.DataFrame:
        return self.store.table()

    def chart(self):  # -> alt.HConcatChart
        """Output tok/s and median TPOT vs users, one line per engine config."""
        import altair as alt  # late, with charts and workbook: altair takes seconds to import

        from tunebook.charts import plots as charts

        df = self.table()
        if df.empty:
            return None
        return alt.hconcat(charts.scaling(df, "output_tok_s"), charts.scaling(df, "median_tpot_ms"))

    def facts(self) -> pd.DataFrame:
        from tunebook.present.workbook import startup_facts

        return startup_facts(self.table())

    def show(self, interactive: bool = True, dry_run: bool = False) -> None:
        """In JupyterLab: the panel. Unattended (papermill): run the params once (or, with
        dry_run, nothing) and show the results as static outputs, which the rendered HTML
        needs: widget views do not survive into it."""
        from IPython.display import display

        if interactive:
            display(self.widget())
            return
        if dry_run:
            print("dry run: nothing started; the results below are the runs already stored\n"
                  + Sweep(self.params(), self.outputs, SweepOptions(progress=False)).describe())
        else:
            try:
                self.run(progress=True)
            finally:
                self.keeper.stop()
        display(self.facts())
        c = self.chart()
        if c is not None:
            display(c)

    # -- widgets ---------------------------------------------------------------------------
    def widget(self):  # -> ipywidgets.VBox
        import ipywidgets as W

        if self._ui is not None:
            return self._ui
        w = self._w
        lay = W.Layout(width="380px")
        style = {"description_width": "230px"}
        w["experiment"] = W.Text(description="experiment", layout=lay, style=style)
        w["model"] = W.Combobox(description="model", options=sorted(PRESETS), layout=lay,
                                style=style, ensure_option=False)
        for knob in PANEL_KNOBS:
            if knob.panel == "choice":
                options = [(DEFAULT, None), *[(str(o), o) for o in knob.panel_choices]]
                w[f"engine.{knob.name}"] = W.Dropdown(description=knob.name, options=options,
                                                      layout=lay, style=style)
            else:
                text = W.IntText if knob.panel == "int" else W.FloatText
                w[f"engine.{knob.name}"] = text(description=f"{knob.name} (0 = default)",
                                                layout=lay, style=style)
        w["spec.method"] = W.Dropdown(
            description="speculative method",
            options=[("none", None), *[(m, m) for m in PANEL_SPEC_METHODS]],
            layout=lay, style=style)
        w["spec.k"] = W.BoundedIntText(description="num_speculative_tokens", min=1, max=16,
                                       value=3, layout=lay, style=style)
        w["engine_env"] = W.Textarea(description="engine_env (YAML)", layout=W.Layout(
            width="380px", height="60px"), style=style)
        w["load.dataset"] = W.Dropdown(description="dataset",
                                       options=[(x, x) for x in P.DATASETS],
                                       layout=lay, style=style)
        w["load.users"] = W.Text(description="users (comma-separated)", layout=lay, style=style)
        w["load.request_rates"] = W.Text(description="request rates (req/s, inf)", layout=lay,
                                         style=style)
        for k in LOAD_INTS:
            w[f"load.{k}"] = W.IntText(description=k, layout=lay, style=style)
        w["repeats"] = W.BoundedIntText(description="repeats", min=1, max=20, layout=lay,
                                        style=style)
        self._write_widgets()

        run, stop, save = (W.Button(description="Run", button_style="primary", icon="play"),
                           W.Button(description="Stop engine", icon="stop"),
                           W.Button(description="Save as params", icon="save"))
        self._status_w = W.HTML()
        self._progress = W.Output()
        self._facts_w = W.Output()
        self._chart_w = W.Output()

        def on_run(_: Any) -> None:
            self._progress.clear_output()
            with self._progress:
                try:
                    self.run()
                except P.ParamsError as e:
                    self._status(f"<b style='color:#c0392b'>not started:</b> {e}", raw=True)
                except Exception as e:  # noqa: BLE001 - shown in the panel, never swallowed
                    self._status(f"<b style='color:#c0392b'>{type(e).__name__}:</b> {e}",
                                 raw=True)
                    raise

        def on_save(_: Any) -> None:
            try:
                path = self.save_params()
            except P.ParamsError as e:
                self._status(f"<b style='color:#c0392b'>not saved:</b> {e}", raw=True)
                return
            self._status(f"saved <code>{path}</code> — replay: <code>tunebook run {path}</code>",
                         raw=True)

        run.on_click(on_run)
        stop.on_click(lambda _: self.stop_engine())
        save.on_click(on_save)
        engine_box = W.VBox([w["experiment"], w["model"],
                             *[w[f"engine.{k.name}"] for k in PANEL_KNOBS],
                             w["spec.method"], w["spec.k"], w["engine_env"]])
        load_box = W.VBox([w["load.dataset"], w["load.users"], w["load.request_rates"],
                           *[w[f"load.{k}"] for k in LOAD_INTS], w["repeats"]])
        form = W.HBox([W.VBox([W.HTML("<b>Model and engine</b> (a change restarts the engine)"),
                               engine_box]),
                       W.VBox([W.HTML("<b>Load</b> (the engine stays up)"), load_box])])
        self._ui = W.VBox([form, W.HBox([run, stop, save]), self._status_w, self._progress,
                           self._facts_w, self._chart_w])
        self._status(self.engine_status())
        self._refresh()
        return self._ui

    def _write_widgets(self) -> None:
        d, w = self.data, self._w
        w["experiment"].value = str(d["experiment"])
        w["model"].value = str(d["model"])
        eng = d["engine"]
        for knob in PANEL_KNOBS:
            widget, value = w[f"engine.{knob.name}"], eng.get(knob.name)
            if knob.panel == "choice":
                _choose(widget, value)
            else:
                widget.value = (int if knob.panel == "int" else float)(value or 0)
        spec = eng.get("speculative_config") or {}
        _choose(w["spec.method"], spec.get("method"))
        w["spec.k"].value = int(spec.get("num_speculative_tokens", 3))
        w["engine_env"].value = yaml.safe_dump(d.get("engine_env") or {}, default_flow_style=True
                                               ).strip() if d.get("engine_env") else ""
        ld = d["load"]
        _choose(w["load.dataset"], ld["dataset"])
        w["load.users"].value = _fmt_list(ld["users"])
        w["load.request_rates"].value = _fmt_list(ld["request_rates"])
        for k in LOAD_INTS:
            w[f"load.{k}"].value = int(ld[k])
        w["repeats"].value = int(d["repeats"])

    def _read_widgets(self) -> None:
        d, w = self.data, self._w
        d["experiment"] = w["experiment"].value.strip()
        d["model"] = w["model"].value.strip()
        eng = d["engine"]
        for knob in PANEL_KNOBS:
            value = w[f"engine.{knob.name}"].value
            # a number field's 0 means "vLLM default"; a dropdown's None does
            _set_or_drop(eng, knob.name, value if knob.panel == "choice" else value or None)
        method = w["spec.method"].value
        _set_or_drop(eng, "speculative_config", {
            "method": method, "num_speculative_tokens": int(w["spec.k"].value)} if method else None)
        env_text = w["engine_env"].value.strip()
        try:
            env = yaml.safe_load(env_text) if env_text else {}
        except yaml.YAMLError:
            env = env_text  # params reports "engine_env must be a mapping"
        d["engine_env"] = env
        ld = d["load"]
        ld["dataset"] = w["load.dataset"].value
        ld["users"] = _csv_ints(w["load.users"].value)
        ld["request_rates"] = _csv_rates(w["load.request_rates"].value)
        for k in LOAD_INTS:
            ld[k] = int(w[f"load.{k}"].value)
        d["repeats"] = int(w["repeats"].value)

    # -- live updates ------------------------------------------------------------------------
    def _on_result(self, row: dict) -> None:
        self._refresh()

    def _refresh(self) -> None:
        from IPython import get_ipython

        if self._ui is None or get_ipython() is None:  # no kernel, no front end to update
            return
        from IPython.display import display

        with self._facts_w:
            self._facts_w.clear_output(wait=True)
            facts = self.facts()
            if len(facts):
                display(facts)
        with self._chart_w:
            self._chart_w.clear_output(wait=True)
            c = self.chart()
            if c is not None:
                display(c)

    def _status(self, text: str, raw: bool = False) -> None:
        if self._ui is None:
            return
        import html

        self._status_w.value = text if raw else html.escape(text)


def _choose(dropdown: Any, value: Any) -> None:
    """Select ``value``, adding it as an option when the params file holds one the panel does
    not list (e.g. kv_cache_dtype: fp8_e5m2): the panel never silently changes a value."""
    values = [v for _, v in dropdown.options]
    if value not in values:
        dropdown.options = [*dropdown.options, (str(value), value)]
    dropdown.value = value


def _set_or_drop(d: dict, key: str, value: Any) -> None:
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value


def panel(params_file: str | Path, overrides: dict[str, Any] | None = None,
          outputs: str | Path = "../outputs") -> TunePanel:
    """The notebook's entry point: a panel initialised from a params file."""
    report.enable_offline_charts()
    return TunePanel(P.load(params_file, overrides or {}), outputs)


__all__ = ["TunePanel", "panel"]
