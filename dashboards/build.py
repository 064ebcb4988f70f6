"""Builds dashboards/yolo-train.json, the Grafana dashboard of yolo-train, with grafana-foundation-sdk.

    .venv/bin/pip install grafana-foundation-sdk   # only needed to rebuild; the JSON is committed
    .venv/bin/python dashboards/build.py            # writes dashboards/yolo-train.json

Import the JSON in Grafana (Dashboards > New > Import): it asks for the Prometheus data source
(``DS_PROMETHEUS``). The ``instance`` variable picks one or more training boxes; every query filters on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import gauge, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the checkout
from supervisor.vocabulary import PHASE_LABELS, State  # noqa: E402

OUTPUT = Path(__file__).with_name("yolo-train.json")
UID = "yolo-train"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${DS_PROMETHEUS}")
I = 'instance=~"$instance"'  # the filter every selector carries

# The vocabulary's own values, so a new state or phase reaches the panels (a test checks every one has a colour).
STATES = tuple(state.value for state in State)
STATE_COLORS = {"starting": "blue", "healthy": "green", "stopping": "yellow", "backoff": "orange",
                "succeeded": "purple", "failed": "red", "stopped": "text", "unsaved": "dark-red"}
PHASES = PHASE_LABELS
PHASE_COLORS = {"setup": "blue", "train": "green", "val": "purple", "save": "yellow", "ending": "orange", "done": "text",
                "none": "transparent"}


def query(expr: str, legend: str = "{{instance}}") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def series(title: str, unit: str, *targets: prometheus.Dataquery, bars: bool = False,
           description: str = "") -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .height(8).span(8).fill_opacity(10 if not bars else 80)
             .legend(cb.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True)))
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    for target in targets:
        panel = panel.with_target(target)
    return panel


def threshold_line(panel: timeseries.Panel, value: float, color: str = "red") -> timeseries.Panel:
    """Draws ``value`` as a dashed line: where the matching alert in alerts.yml fires."""
    return (panel.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([
        dm.Threshold(value=None, color="green"), dm.Threshold(value=value, color=color)]))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)))


def single(title: str, unit: str, *targets: prometheus.Dataquery, text_mode=common.BigValueTextMode.AUTO,
           mappings: list | None = None, span: int = 4, description: str = "") -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .height(4).span(span).text_mode(text_mode).graph_mode(common.BigValueGraphMode.NONE)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if mappings:
        panel = panel.mappings(mappings)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def value_names(names: tuple[str, ...], colors: dict[str, str], first: int = 1) -> dm.ValueMap:
    return dm.ValueMap(options={
        str(first + i): dm.ValueMappingResult(text=name, color=colors[name], index=i)
        for i, name in enumerate(names)})


def one_of(metric: str, label: str, names: tuple[str, ...]) -> str:
    """One series per box whose value is the 1-based position of the label value that is 1 now, so a state
    timeline shows one row per box, coloured by state. The exporter sets exactly one to 1, the rest to 0."""
    terms = "\n  or ".join(f'{metric}{{{I},{label}="{name}"}} * {i}' for i, name in enumerate(names, 1))
    return f"sum by (instance) (\n  {terms}\n)"


def timeline(title: str, expr: str, mapping: dm.ValueMap | None, description: str = "") -> statetimeline.Panel:
    panel = (statetimeline.Panel().title(title).description(description).datasource(DATASOURCE)
             .height(6).span(12).show_value(common.VisibilityMode.AUTO).merge_values(True)
             .with_target(query(expr)))
    if mapping is not None:
        panel = panel.mappings([mapping])
    return panel


def build() -> db.Dashboard:
    instance = (db.QueryVariable("instance").label("Training box").datasource(DATASOURCE)
                .query("label_values(yolo_train_info, instance)").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True).include_all(True).sort(dm.VariableSort.ALPHABETICAL_ASC))
    restarts = (db.AnnotationQuery().name("Restarts").datasource(DATASOURCE).enable(True).icon_color("red")
                .expr(f"(sum by (instance, reason) (changes(yolo_train_restarts_total{{{I}}}[1m])) > 0) "
                      f"* on (instance) group_left (summary) max by (instance, summary) "
                      f"(yolo_train_last_incident_info{{{I}}})"))

    return (
        db.Dashboard("yolo-train").uid(UID).tags(["yolo-train", "training"]).refresh("30s")
        .time("now-12h", "now").timezone("browser").with_variable(instance).annotation(restarts)

        .with_row(db.Row("Training"))
        .with_panel(series(
            "Iterations per second", "short",
            query(f"yolo_train_batches_per_second{{{I}}}", "{{instance}} batches/s"),
            query(f"yolo_train_samples_per_second{{{I}}}", "{{instance}} samples/s"),
            description="Over the supervisor's recent window; samples/s is batches/s times the batch size."))
        .with_panel(gauge.Panel().title("Run progress").datasource(DATASOURCE).unit("percentunit").min(0).max(1)
                    .height(8).span(4).with_target(query(f"yolo_train_progress_ratio{{{I}}}")))
        .with_panel(gauge.Panel().title("Epoch progress").datasource(DATASOURCE).unit("percentunit").min(0).max(1)
                    .height(8).span(4).with_target(query(
                        f"yolo_train_batch{{{I}}} / yolo_train_batches_per_epoch{{{I}}}")))
        .with_panel(single("Epoch", "none",
                           query(f"yolo_train_epoch{{{I}}}", "{{instance}} epoch"),
                           query(f"yolo_train_epochs{{{I}}}", "{{instance}} of"), span=8)
                    .height(8))
        .with_panel(threshold_line(series(
            "ETA and slack to the deadline", "s",
            query(f"yolo_train_eta_seconds{{{I}}}", "{{instance}} ETA"),
            query(f"yolo_train_deadline_slack_seconds{{{I}}}", "{{instance}} slack"),
            description="Slack = deadline - (now + ETA); below zero the run will miss its deadline at the current speed."),
            0).span(12))
        .with_panel(single("Finish (predicted) and deadline", "dateTimeAsIso",
                           query(f"(time() + yolo_train_eta_seconds{{{I}}}) * 1000", "{{instance}} finish"),
                           query(f"yolo_train_deadline_timestamp_seconds{{{I}}} * 1000", "{{instance}} deadline"),
                           text_mode=common.BigValueTextMode.VALUE_AND_NAME, span=12).height(8))
        .with_panel(series("Losses", "none", query(f"yolo_train_loss{{{I}}}", "{{instance}} {{name}}")).span(12))
        .with_panel(series("Learning rate", "none", query(f"yolo_train_learning_rate{{{I}}}")).span(12))

        .with_row(db.Row("Supervisor"))
        .with_panel(timeline("State", one_of("yolo_train_state", "state", STATES), value_names(STATES, STATE_COLORS)))
        .with_panel(timeline("Phase", one_of("yolo_train_phase", "phase", PHASES), value_names(PHASES, PHASE_COLORS)))
        .with_panel(timeline("Rung", f"yolo_train_rung{{{I}}}", None,
                             description="0 is the configured settings; each rung after a hang is safer."))
        .with_panel(single("Current rung", "none", query(f"yolo_train_rung_info{{{I}}} == 1", "{{instance}}: {{label}}"),
                           text_mode=common.BigValueTextMode.NAME, span=6))
        .with_panel(single("Rungs left", "none",
                           query(f"yolo_train_rungs{{{I}}} - 1 - yolo_train_rung{{{I}}}"), span=6))
        .with_panel(series("Speed by rung", "none", query(
            f"yolo_train_rung_batches_per_second{{{I}}}", "{{instance}} rung {{rung}}"),
            description="Median it/s measured at each rung: what a safer rung costs, and what probing gives back.")
                    .span(24))
        .with_panel(series("Recoveries by tier", "short", query(
            f"sum by (instance, tier) (increase(yolo_train_recoveries_total{{{I}}}[$__rate_interval]))",
            "{{instance}} {{tier}}"), bars=True,
            description="in_place: only the hung DataLoader worker processes replaced, training went on; restart: "
                        "the tree killed, a new worker resumed from the newest checkpoint.").span(24))
        .with_panel(series("Restarts by reason", "short", query(
            f"sum by (instance, reason) (increase(yolo_train_restarts_total{{{I}}}[$__rate_interval]))",
            "{{instance}} {{reason}}"), bars=True))
        .with_panel(series("Hangs by phase", "short", query(
            f"sum by (instance, phase) (increase(yolo_train_hangs_total{{{I}}}[$__rate_interval]))",
            "{{instance}} {{phase}}"), bars=True))
        .with_panel(series("Kernel events", "short", query(
            f"sum by (instance, kind) (increase(yolo_train_kernel_events_total{{{I}}}[$__rate_interval]))",
            "{{instance}} {{kind}}"), bars=True,
            description="Classified kernel log lines: stall (hung task), gpu_fault (page fault, ring timeout), "
                        "gpu_lost (device gone), oom (OOM killer)."))
        .with_panel(single("Restarts", "none", query(f"sum by (instance) (yolo_train_restarts_total{{{I}}})")))
        .with_panel(single("Restart budget left", "none", query(f"yolo_train_restart_budget_remaining{{{I}}}")))
        .with_panel(single("Reboot needed", "none", query(f"yolo_train_reboot_needed{{{I}}}"), mappings=[
            dm.ValueMap(options={"0": dm.ValueMappingResult(text="no", color="green", index=0),
                                 "1": dm.ValueMappingResult(text="REBOOT", color="red", index=1)})]))
        .with_panel(single("Last restart", "dateTimeFromNow",
                           query(f"yolo_train_last_restart_timestamp_seconds{{{I}}} * 1000")))
        .with_panel(single("Versions", "none", query(
            f"yolo_train_info{{{I}}}",
            "{{instance}}: yolo-train {{version}}, Python {{python}}, Ultralytics {{ultralytics}}, torch {{torch}}"),
            text_mode=common.BigValueTextMode.NAME, span=8))
        .with_panel(threshold_line(series(
            "Time since progress and worker uptime", "s",
            query(f"yolo_train_seconds_since_progress{{{I}}}", "{{instance}} since progress"),
            query(f"yolo_train_worker_uptime_seconds{{{I}}}", "{{instance}} worker uptime"),
            query(f"yolo_train_rank_seconds_since_progress{{{I}}}", "{{instance}} rank {{rank}} ({{device}})")),
            900).span(12))
        .with_panel(series(
            "Heartbeats dropped and malformed", "short",
            query(f"increase(yolo_train_heartbeats_dropped_total{{{I}}}[$__rate_interval])", "{{instance}} dropped"),
            query(f"increase(yolo_train_heartbeats_malformed_total{{{I}}}[$__rate_interval])", "{{instance}} malformed"),
            bars=True).span(12))

        .with_row(db.Row("Goodput"))
        .with_panel(series("Goodput", "percentunit", query(f"yolo_train_goodput_ratio{{{I}}}"),
                           description="Training time kept (not thrown away by a restart) over wall time since the "
                                       "run began.").min(0).max(1))
        .with_panel(series("Lost training time", "s", query(
            f"increase(yolo_train_lost_seconds_total{{{I}}}[$__rate_interval])", "{{instance}} lost"), bars=True,
            description="Training after the checkpoint a restarted worker resumed from: what a hang cost."))
        .with_panel(series(
            "Checkpoint age and save time", "s",
            query(f"yolo_train_checkpoint_age_seconds{{{I}}}", "{{instance}} age"),
            query(f"yolo_train_checkpoint_interval_seconds{{{I}}}", "{{instance}} interval"),
            query(f"yolo_train_checkpoint_duration_seconds{{{I}}}", "{{instance}} save")))

        .with_row(db.Row("Worker processes"))
        .with_panel(series("Worker CPU", "short", query(
            f"rate(yolo_train_worker_cpu_seconds_total{{{I}}}[$__rate_interval])", "{{instance}} cores"),
            description="CPU seconds per second of the worker and its children: 1 = one core busy."))
        .with_panel(series("Worker memory (RSS)", "bytes", query(f"yolo_train_worker_resident_memory_bytes{{{I}}}")))
        .with_panel(series(
            "Worker processes and threads", "short",
            query(f"yolo_train_worker_processes{{{I}}}", "{{instance}} processes"),
            query(f"yolo_train_worker_dataloader_processes{{{I}}}", "{{instance}} DataLoader processes"),
            query(f"yolo_train_worker_threads{{{I}}}", "{{instance}} threads")))

        .with_row(db.Row("GPU"))
        .with_panel(series("GPU utilisation", "percentunit", query(
            f"yolo_train_gpu_utilization_ratio{{{I}}}", "{{instance}} GPU {{gpu}} {{name}}")).min(0).max(1))
        .with_panel(series(
            "VRAM", "bytes",
            query(f"yolo_train_gpu_memory_used_bytes{{{I}}}", "{{instance}} GPU {{gpu}} used"),
            query(f"yolo_train_gpu_memory_total_bytes{{{I}}}", "{{instance}} GPU {{gpu}} total")))
        .with_panel(threshold_line(series("GPU temperature", "celsius", query(
            f"yolo_train_gpu_temperature_celsius{{{I}}}", "{{instance}} GPU {{gpu}} {{name}}")), 90))
        .with_panel(series("GPU power", "watt", query(
            f"yolo_train_gpu_power_watts{{{I}}}", "{{instance}} GPU {{gpu}} {{name}}")).span(12))
        .with_panel(series("GPU clocks", "hertz", query(
            f"yolo_train_gpu_clock_hertz{{{I}}}", "{{instance}} GPU {{gpu}} {{clock}}")).span(12))
    )


def importable(model: dict) -> dict:
    """What the SDK's schema leaves out and an importable dashboard needs: the data source as an import
    input (``__inputs``), the plugins it requires, panel ids and query refIds, and the Prometheus
    annotation's text fields."""
    model = {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": kind, "version": ""}
              for kind in sorted({p["type"] for p in model["panels"] if p["type"] != "row"})),
        ],
        **model,
    }
    for number, panel in enumerate(model["panels"], 1):
        panel["id"] = number
        for letter, target in zip("ABCDEFGH", panel.get("targets", [])):
            target["refId"] = letter
    for annotation in model["annotations"]["list"]:
        if annotation.get("name") == "Restarts":
            annotation.update(titleFormat="Restart: {{reason}}", textFormat="{{instance}}: {{summary}}",
                              tagKeys="reason,instance", step="1m", useValueForTime=False)
    model["annotations"]["list"].insert(0, {
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"})
    return model


def main() -> None:
    model = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    OUTPUT.write_text(json.dumps(importable(model), indent=2, sort_keys=False) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
