"""The tuning panel (notebooks/10_tune.ipynb): pick a model, engine knobs and a load in
ipywidgets, press Run, watch progress and the chart grow point by point.

Replayable by construction: the widgets only ever edit a params mapping (`to_dict()`), which is
validated by `tunebook.inputs.params.parse` and run by the same `Sweep` as `tunebook run`.
Every run records that mapping under `<outputs>/<experiment>/inputs/`, and "Save as params"
writes it as a YAML file whose plan equals the panel's (see tests/present/test_panel.py). No
state lives in the widgets that the params file does not hold, except which stored engine
configs the chart shows (the "shown on the chart" list, visible as it is).

It compares as you go: every engine config stored in the experiment (each Run's among them)
is its own curve, labelled by what sets it apart from the others (`config_labels`); dropping
one from the list hides it, never deletes its results. A knob field left at default shows
vLLM's own default, read from the installed vLLM (`tunebook.core.knobs.vllm_defaults`). The
start-up facts of each config read as a short card in words and units (`startup_card`).

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

from tunebook.core import schema
from tunebook.core.knobs import KNOBS, PANEL_KNOBS, PANEL_SPEC_METHODS, default_text
from tunebook.inputs import params as P
from tunebook.inputs.load import DATASETS
from tunebook.inputs.plan import Plan, make_plan
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions, SweepResult
from tunebook.models.presets import PRESETS
from tunebook.present import index, report
from tunebook.results import machines
from tunebook.results.store import Store, rows_to_frame, stamp, write_new
from tunebook.servers import launcher

# The engine knobs the panel offers, and their choices, are tunebook.core.knobs' (PANEL_KNOBS,
# PANEL_SPEC_METHODS). "vLLM default: …" (an empty number field, or that dropdown entry) leaves
# the knob out entirely, so vLLM picks, exactly as a params file without the key would.
LOAD_INTS = ("input_len", "output_len", "prefix_len", "prompts_per_user", "num_warmups")


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


def _number(text: str, kind: type) -> int | float | str | None:
    """A knob's number field: empty → None (vLLM's default); '8' → 8; anything else is
    returned as is, for params to reject clearly."""
    text = str(text).strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        return text


def _fmt_number(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


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
        self.outputs = machines.experiments_root(outputs)
        self.keeper = EngineKeeper()
        self.last: SweepResult | None = None
        # engine config ids dropped from the chart (the "shown on the chart" list's unselected)
        self.hidden: set[str] = set()
        self._w: dict[str, Any] = {}
        self._ui: Any = None
        self._syncing = False
        self._read: tuple[pd.DataFrame, dict[str, str], dict[str, dict[str, Any]]] | None = None

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
        self.hidden -= {e.id for e in make_plan(params).engines}  # a Run's configs are shown
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

    def press_run(self, _: Any = None) -> None:
        """What the Run button does: run, with a bad value or an error shown in the panel's
        status line (an error other than bad params is raised too)."""
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

    # -- comparing engine configs ----------------------------------------------------------
    def _results(self) -> tuple[pd.DataFrame, dict[str, str], dict[str, dict[str, Any]]]:
        """The experiment's table, each stored engine config's label (raw: vLLM's names and
        values, as a stored engine_label) and its model and knobs, in the order the configs
        first ran."""
        if self._read is not None:  # one read per refresh of the panel
            return self._read
        rows = self.store.rows()
        configs = stored_configs(rows)
        return rows_to_frame(rows), config_labels(configs), configs

    def configs(self) -> dict[str, str]:
        """Every engine config stored in the experiment (each Run's among them), in the order
        they first ran: engine config id → its label as the chart shows it."""
        from tunebook.charts.plots import display_label

        return {cid: display_label(raw) for cid, raw in self._results()[1].items()}

    def shown(self) -> list[str]:
        """The engine configs the chart shows: every stored one not dropped."""
        return [cid for cid in self.configs() if cid not in self.hidden]

    def drop(self, *configs: str) -> None:
        """Hide engine configs (ids or labels) from the chart; their results stay stored."""
        self.hidden |= set(self._ids(configs))
        self._refresh()

    def bring_back(self, *configs: str) -> None:
        """Show dropped engine configs (ids or labels) again."""
        self.hidden -= set(self._ids(configs))
        self._refresh()

    def _ids(self, keys: tuple[str, ...]) -> list[str]:
        known = self.configs()
        by_label = {label: cid for cid, label in known.items()}
        out = []
        for k in keys:
            if k not in known and k not in by_label:
                raise KeyError(f"no stored engine config {k!r}; stored: {list(by_label)}")
            out.append(k if k in known else by_label[k])
        return out

    def _shown_frame(self) -> tuple[pd.DataFrame, dict[str, str], dict[str, dict[str, Any]]]:
        df, labels, configs = self._results()
        if df.empty:
            return df, labels, configs
        df = df[df["engine_config_id"].isin([c for c in labels if c not in self.hidden])]
        return df.assign(engine_label=df["engine_config_id"].map(labels)), labels, configs

    def chart(self):  # -> alt.HConcatChart | None
        """Output tok/s and median TPOT vs users, one curve per engine config shown (every
        stored one not dropped), each labelled by what sets it apart from the others."""
        import altair as alt  # late, with charts and workbook: altair takes seconds to import

        from tunebook.charts import plots as charts

        df = self._shown_frame()[0]
        if df.empty:
            return None
        # each stored config its colour by the order they first ran: dropping one leaves the
        # others' colours as they were
        colours = {label: charts.PALETTE[i % len(charts.PALETTE)]
                   for i, label in enumerate(self.configs().values())}
        return alt.hconcat(*(charts.scaling(df, y, colours=colours)
                             for y in ("output_tok_s", "median_tpot_ms")))

    def card(self) -> list[tuple[str, str]]:
        """The start-up facts of each engine config shown, in words and units:
        [(its label, what its latest start said)]."""
        from tunebook.charts.plots import display_label

        df, labels, configs = self._shown_frame()
        out = []
        for cid, raw in labels.items():
            rows = df[df["engine_config_id"] == cid] if len(df) else df
            if len(rows):
                out.append((display_label(raw), startup_card(rows, configs[cid])))
        return out

    def card_html(self) -> str:
        import html

        return "".join(
            "<div style='margin:4px 0'><b>" + html.escape(label) + "</b>: "
            + html.escape(text) + "</div>" for label, text in self.card())

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
        from IPython.display import HTML

        card = self.card_html()
        if card:
            display(HTML(card))
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
        # the engine column is wider: an empty knob field shows vLLM's default in it
        elay, estyle = W.Layout(width="500px"), {"description_width": "180px"}
        w["experiment"] = W.Text(description="experiment", layout=elay, style=estyle)
        w["model"] = W.Combobox(description="model", options=sorted(PRESETS), layout=elay,
                                style=estyle, ensure_option=False)
        for knob in PANEL_KNOBS:
            default = default_text(knob.name)  # read from the installed vLLM (cached)
            if knob.panel == "choice":
                options = [(default, None), *[(str(o), o) for o in knob.panel_choices]]
                w[f"engine.{knob.name}"] = W.Dropdown(description=knob.name, options=options,
                                                      layout=elay, style=estyle)
            else:  # empty = vLLM's default, which the empty field shows
                w[f"engine.{knob.name}"] = W.Text(description=knob.name, placeholder=default,
                                                  layout=elay, style=estyle)
        w["spec.method"] = W.Dropdown(
            description="speculative method",
            options=[("none", None), *[(m, m) for m in PANEL_SPEC_METHODS]],
            layout=elay, style=estyle)
        w["spec.k"] = W.BoundedIntText(description="num_speculative_tokens", min=1, max=16,
                                       value=3, layout=elay, style=estyle)
        w["engine_env"] = W.Textarea(description="engine_env (YAML)", layout=W.Layout(
            width="500px", height="60px"), style=estyle)
        w["load.dataset"] = W.Dropdown(description="dataset",
                                       options=[(x, x) for x in DATASETS],
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
        self._facts_w = W.HTML()
        self._chart_w = W.Output()
        # which stored engine configs the chart shows: unselect one to drop it from the chart
        w["shown"] = W.SelectMultiple(description="shown on the chart", rows=3,
                                      layout=W.Layout(width="760px"),
                                      style={"description_width": "130px"})

        def on_shown(change: dict) -> None:
            if not self._syncing:
                listed = {cid for _, cid in w["shown"].options}
                self.hidden = listed - set(change["new"])
                self._refresh()

        w["shown"].observe(on_shown, names="value")

        def on_save(_: Any) -> None:
            try:
                path = self.save_params()
            except P.ParamsError as e:
                self._status(f"<b style='color:#c0392b'>not saved:</b> {e}", raw=True)
                return
            self._status(f"saved <code>{path}</code> — replay: <code>tunebook run {path}</code>",
                         raw=True)

        run.on_click(self.press_run)
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
        shown_help = W.HTML("<small>Every engine config of this experiment is its own curve; "
                            "ctrl/⌘-click one to drop it from the chart or bring it back (its "
                            "results stay stored).</small>")
        self._ui = W.VBox([form, W.HBox([run, stop, save]), self._status_w, self._progress,
                           self._facts_w, w["shown"], shown_help, self._chart_w])
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
                widget.value = _fmt_number(value)
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
            # an empty number field means "vLLM default"; a dropdown's None does
            _set_or_drop(eng, knob.name, value if knob.panel == "choice" else
                         _number(value, int if knob.panel == "int" else float))
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
        if self._ui is None:
            return
        self._read = None
        self._read = self._results()
        try:
            self._sync_shown()
            self._facts_w.value = self.card_html()
            from IPython import get_ipython

            if get_ipython() is None:  # no kernel, no front end to draw the chart in
                return
            from IPython.display import display

            with self._chart_w:
                self._chart_w.clear_output(wait=True)
                c = self.chart()
                if c is not None:
                    display(c)
        finally:
            self._read = None

    def _sync_shown(self) -> None:
        """The "shown on the chart" list: every stored config, the shown ones selected."""
        widget, configs = self._w["shown"], self.configs()
        self._syncing = True
        try:
            widget.options = [(label, cid) for cid, label in configs.items()]
            widget.value = tuple(c for c in configs if c not in self.hidden)
            widget.rows = max(2, min(8, len(configs)))
        finally:
            self._syncing = False

    def _status(self, text: str, raw: bool = False) -> None:
        if self._ui is None:
            return
        import html

        self._status_w.value = text if raw else html.escape(text)


def _choose(dropdown: Any, value: Any) -> None:
    """Select ``value``, adding it as an option when the params file holds one the panel does
    not list (e.g. kv_cache_dtype: fp8_e5m2): the panel never silently changes a value."""
    values = [v for _, v in dropdown.options]
    # by index: ipywidgets takes `value = None` for "nothing selected" (a blank field), not
    # for the entry whose value is None ("vLLM default: …")
    at = next((i for i, v in enumerate(values) if v == value and type(v) is type(value)), None)
    if at is None:
        dropdown.options = [*dropdown.options, (str(value), value)]
        at = len(values)
    dropdown.index = at


def _set_or_drop(d: dict, key: str, value: Any) -> None:
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value


# --- engine configs, labelled by what sets them apart -------------------------------------
def stored_configs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """engine config id → its model and knobs (vLLM's names, the values as stored), for each
    config in the rows, in the order the configs first ran."""
    first: dict[str, tuple[str, dict[str, Any]]] = {}
    for r in rows:
        cid = r.get("engine_config_id")
        started = str(r.get("started_at") or "")
        if cid and (cid not in first or started < first[cid][0]):
            knobs = {k: v for k, v in r.items()
                     if k in KNOBS and k not in schema.COLUMN_NAMES and v is not None}
            first[cid] = (started, {"model": r.get("model"), **knobs})
    return {cid: cfg for cid, (_, cfg) in sorted(first.items(), key=lambda kv: kv[1][0])}


def _text(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


def config_labels(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A label per engine config, as stored engine labels are written (``max_num_seqs=4,
    enforce_eager=True``: vLLM's names and values; charts show them through display_label):
    the knobs (and model) whose values differ between the configs. A config that sets none of
    them reads "<knobs> at vLLM's default"; a lone config shows all its knobs. Labels that
    would still collide (configs differing only in engine_env) are numbered."""
    from tunebook.charts.plots import display_label

    keys = list(dict.fromkeys(k for cfg in configs.values() for k in cfg))
    differ = [k for k in keys
              if len({_text(cfg.get(k, "\0absent")) for cfg in configs.values()}) > 1]
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for cid, cfg in configs.items():
        if not differ:  # a lone config (or ones the rows cannot tell apart): all its knobs
            parts = [f"{k}={_text(v)}" for k, v in cfg.items() if k != "model"]
            label = ", ".join(parts) or "vLLM defaults"
        else:
            parts = [f"{k}={_text(cfg[k])}" for k in differ if k in cfg]
            label = ", ".join(parts) or f"{', '.join(differ)} at vLLM's default"
        shown = display_label(label)
        seen[shown] = seen.get(shown, 0) + 1
        out[cid] = label if seen[shown] == 1 else f"{label} #{seen[shown]}"
    return out


# --- start-up facts in words ----------------------------------------------------------------
_PHASES = (("start_api_import_s", "imports"), ("start_engine_core_s", "engine core"),
           ("start_worker_init_s", "worker set-up"), ("start_weights_s", "weights"),
           ("start_compile_s", "torch.compile"), ("start_profile_kv_s", "profiling and KV cache"),
           ("start_cuda_graphs_s", "CUDA graphs"), ("start_warmup_s", "warm-up"),
           ("start_api_ready_s", "API server"))
_START_METHODS = {launcher.EXEC: "a plain start",
                  launcher.API_FORK: "a fast start (forked from a process that had imported "
                                     "vLLM)",
                  launcher.FULL_FORK: "a fast start (forked, its engine core and workers too)"}


def _known(row: pd.Series, column: str) -> Any:
    from tunebook.results.evidence import missing

    v = row.get(column)
    return None if missing(v) else v


def startup_card(rows: pd.DataFrame, knobs: dict[str, Any] | None = None) -> str:
    """One engine config's start-up facts in words and units, from its latest ok run (what
    its engine's log said), and the knobs it set; what the log did not say is left out, never
    shown as NaN. A config that never started says why."""
    from tunebook.charts.plots import display_label
    from tunebook.results.store import not_ok_rows, ok_rows

    ok = ok_rows(rows)
    if ok.empty:
        bad = not_ok_rows(rows)
        if bad.empty:
            return "no run finished yet"
        last = bad.sort_values("finished_at").iloc[-1]
        status = str(last.get("status", "failed")).replace("_", " ")
        hint = _known(last, "error_hint")
        return (f"{len(bad)} run(s) not ok ({status}): {_known(last, 'error') or 'no reason'}"
                + (f" — {hint}" if hint else ""))
    row = ok.sort_values("finished_at").iloc[-1]
    said: list[str] = []
    started = _known(row, "startup_s")
    if started is not None:
        phases = [f"{what} {float(v):.1f} s" for col, what in _PHASES
                  if (v := _known(row, col)) is not None and float(v) >= 0.05]
        cache = _known(row, "compile_cache")
        if cache:
            phases.append(f"torch.compile cache {cache}")
        how = _START_METHODS.get(str(_known(row, "start_method") or ""))
        said.append(f"Started in {float(started):.1f} s" + (f" ({', '.join(phases)})"
                                                              if phases else "")
                    + (f", {how}" if how else ""))
    kv_gib, pool = _known(row, "kv_cache_gib"), _known(row, "kv_pool_tokens")
    if kv_gib is not None or pool is not None:
        kv = " = ".join(p for p in (f"{float(kv_gib):.2f} GiB" if kv_gib is not None else "",
                                    f"{int(pool):,} tokens" if pool is not None else "") if p)
        fits = _known(row, "max_concurrency_x")
        mml = _known(row, "max_model_len")
        if fits is not None:
            n = f"{fits:,.0f}" if float(fits) >= 10 else f"{fits:.1f}"
            length = f"of {int(mml):,} tokens" if mml is not None else "of full length"
            kv += f", room for {n} requests {length} at once"
        said.append(f"KV cache {kv}")
    weights = _known(row, "weights_gib")
    if weights is not None:
        said.append(f"weights {float(weights):.2f} GiB")
    engine = [f"vLLM {v}" if (v := _known(row, "vllm_version")) else "",
              f"{v} model runner" if (v := _known(row, "model_runner")) else "",
              f"{v} attention" if (v := _known(row, "attention_backend")) else "",
              f"on {v}" if (v := _known(row, "hardware")) else ""]
    if any(engine):
        said.append(", ".join(p for p in engine if p))
    set_ = ", ".join(f"{k}={_text(v)}" for k, v in (knobs or {}).items() if k != "model")
    said.append(f"knobs set: {display_label(set_)}" if set_ else "every knob at vLLM's default")
    runs = rows["status"].astype(str).value_counts()
    said.append(", ".join(f"{n} run{'s' * (n != 1)} {s.replace('_', ' ')}"
                          for s, n in runs.items()))
    return "; ".join(said) + "."


def panel(params_file: str | Path, overrides: dict[str, Any] | None = None,
          outputs: str | Path = "../outputs") -> TunePanel:
    """The notebook's entry point: a panel initialised from a params file."""
    report.enable_offline_charts()
    return TunePanel(P.load(params_file, overrides or {}), outputs)


__all__ = ["TunePanel", "config_labels", "panel", "startup_card", "stored_configs"]
