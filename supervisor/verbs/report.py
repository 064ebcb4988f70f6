"""``yolo-train report``: the night on one page a person can look at in the morning.

Reads what the state directory holds (history.db, incidents.jsonl, the state file, Ultralytics' results.csv), never
writes there, and makes one HTML file that opens offline (report_html.py; its pictures: report_plot.py). A run still
training is reported as far as it got; a state directory without a history (an older version, or a damaged file) is
reported from what it has, and the page says what is missing.
"""

from __future__ import annotations

import csv
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config import Config
from supervisor.state import history, state_file
from supervisor.state.incidents import load_incidents
from supervisor.state.paths import StatePaths
from supervisor.verbs import report_plot
from supervisor.verbs.report_html import is_number, render
from supervisor.verbs.status import gather
from supervisor.vocabulary import FINAL_STATES, Tier

DEMO_SOURCE = "<demo>"  # config.source of the embedded demo (config.load without a file)


@dataclass
class Night:
    name: str
    state_dir: Path
    status: dict[str, Any]
    samples: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    epochs: list[dict[str, float]]
    deadline: float | None
    run_seconds: float | None
    missing: list[str] = field(default_factory=list)

    @property
    def span(self) -> tuple[float, float]:
        times = [s["t"] for s in self.samples] + [i["time"] for i in self.incidents if is_number(i.get("time"))]
        if self.status.get("run_started"):
            times.append(self.status["run_started"])
        if self.status.get("updated"):
            times.append(self.status["updated"])
        if not times:
            now = time.time()
            return now - 60, now
        if not self.samples:  # incidents alone: a window around them
            return min(times) - 60, max(times) + 60
        return min(times), max(max(times), min(times) + 1)

    @property
    def rung_bands(self) -> list[tuple[float, float, int]]:
        """(start, end, rung) over wall time, from the samples, else from the incidents' rungs."""
        points = [(s["t"], s["rung"]) for s in self.samples if s.get("rung") is not None]
        if not points:
            points = [(i["time"], i["rung"]) for i in self.incidents if is_number(i.get("time")) and "rung" in i]
        bands: list[list[Any]] = []
        for t, rung in points:
            if bands and bands[-1][2] == rung:
                bands[-1][1] = t
            else:
                if bands:
                    bands[-1][1] = t
                bands.append([t, t, rung])
        return [(a, max(b, a + 1e-3), int(r)) for a, b, r in bands]

    @property
    def lost_spans(self) -> list[tuple[float, float, str]]:
        """Per incident: the training it threw away ("lost") and the time from its last progress until training went
        on ("down": stall, kill, start)."""
        spans = []
        for i in self.incidents:
            last = i.get("last_progress_wall")
            if not is_number(last):
                continue
            if is_number(i.get("lost_seconds")) and i["lost_seconds"] > 0:
                spans.append((last - i["lost_seconds"], last, "lost"))
            if is_number(i.get("time")):
                spans.append((last, i["time"] + (i.get("restart_seconds") or 0.0), "down"))
        return spans

    @property
    def checkpoints(self) -> list[tuple[float, float | None]]:
        """(when, progress) of each new checkpoint the samples saw."""
        seen, marks = None, []
        for s in self.samples:
            at = (s.get("checkpoint_epoch"), s.get("checkpoint_batch"))
            if at != seen and at != (None, None):
                marks.append((s["t"], s.get("progress")))
            seen = at
        return marks

    @property
    def eta_end(self) -> float | None:
        if self.status.get("state") in {s.value for s in FINAL_STATES} | {"not running"}:
            return None
        last = next((s for s in reversed(self.samples) if s.get("eta_seconds") is not None), None)
        return None if last is None else last["t"] + last["eta_seconds"]

    def replayed(self) -> tuple[int, int]:
        """(batches, restarts): the batches the hangs' restarts trained again (each incident's ``lost_batches``: its
        training after the checkpoint it resumed from), over the restarts that said how many."""
        # an incident without a tier was written before the tiers: a restart
        counts = [i["lost_batches"] for i in self.incidents if i.get("reason") == "hang"
                  and i.get("tier", Tier.RESTART.value) == Tier.RESTART.value and is_number(i.get("lost_batches"))]
        return sum(counts), len(counts)

    def slow_after(self) -> tuple[float, int, int]:
        """(seconds, batches, recoveries): what the batches after each recovery took beyond the pace before its
        stall (each incident's ``after.extra_seconds``, issue 59.2; a recovery whose batches ran faster counts 0)."""
        afters = [i["after"] for i in self.incidents
                  if isinstance(i.get("after"), dict) and is_number(i["after"].get("extra_seconds"))]
        return sum(max(0.0, a["extra_seconds"]) for a in afters), sum(a.get("batches") or 0 for a in afters), \
            len(afters)

    def where_the_time_went(self) -> list[tuple[str, float | None, str]]:
        """(what, seconds, how known) of the run's time: training kept, lost work, stalls, kills, starts, checkpoint
        pauses and the rest."""
        s, incidents = self.status, self.incidents
        total = self.run_seconds
        if total is None and self.samples:
            total = self.samples[-1]["t"] - self.samples[0]["t"]
        trained = s.get("trained_seconds") or 0.0
        lost = s.get("lost_seconds") or 0.0
        stall = sum(i.get("seconds_since_progress") or 0.0 for i in incidents if i.get("reason") != "stop")
        kill = sum((i.get("kill") or {}).get("seconds") or 0.0 for i in incidents)
        start = sum(max(0.0, (i.get("restart_seconds") or 0.0) - ((i.get("kill") or {}).get("seconds") or 0.0))
                    for i in incidents)
        hold = (s.get("checkpoint_interval") or {}).get("hold_seconds")
        pauses = hold * len(self.checkpoints) if hold else None
        batches, restarts = self.replayed()
        replayed = f"; {batches} batches replayed over {restarts} restarts ({batches / restarts:.1f} a restart)" \
            if restarts else ""
        slow, slow_batches, recoveries = self.slow_after()
        rows = [("training kept", max(0.0, trained - lost - slow), "goodput's numerator (status), less the slow "
                                                                   "batches after recoveries"),
                ("lost work (trained again)", lost, f"status lost_seconds{replayed}"),
                ("slow batches after recoveries", slow if recoveries else None,
                 f"incidents: after.extra_seconds, {slow_batches} batches after {recoveries} recoveries against the "
                 f"pace before each stall" if recoveries else "not recorded"),
                ("stalls before detection", stall, "incidents: seconds_since_progress"),
                ("kills", kill, "incidents: kill.seconds"),
                ("restarts to the first batch", start, "incidents: restart_seconds less the kill"),
                ("checkpoint pauses", pauses, "hold x checkpoints seen" if pauses is not None else "not recorded")]
        if total:
            known = sum(v for _, v, _ in rows if v)
            rows.append(("the rest (first start, validation, epoch-end saves)", max(0.0, total - known),
                         "run time less the above"))
        return rows


def gather_night(config: Config) -> Night:
    state_dir = config.state_dir
    missing = []
    status = gather(config)
    if status.get("problem"):
        missing.append(status["problem"])
    elif status.get("state") == "not started":
        missing.append("no state file (supervisor.json): the supervisor has not run here")
    try:
        record = state_file.read(state_dir) or {}
    except state_file.StateFileError:
        record = {}
    samples, problem = history.read(state_dir)
    if problem:
        missing.append(problem)
    incidents = load_incidents(state_dir)  # and the pending one
    results = StatePaths(state_dir, config.distributed.run_dir).results
    epochs = read_results(results)
    if not epochs:
        missing.append(f"no per-epoch metrics yet ({results} is missing or empty)")
    # Without --config the config is the demo's, whatever trained here: the directory names the run, not "demo".
    name = state_dir.resolve().name or config.name if config.source == DEMO_SOURCE else config.name
    return Night(name, state_dir, status, samples, incidents, epochs, config.deadline_at,
                 record.get("run_seconds"), missing)


def read_results(path: Path) -> list[dict[str, float]]:
    """Ultralytics' results.csv, one dict per epoch (its headers are padded with spaces in older versions)."""
    try:
        # Bytes that are not UTF-8 become U+FFFD; a row the reader refuses (a field over csv's 128 KiB) is skipped.
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader, rows = csv.DictReader(f), []
            while True:
                try:
                    rows.append(next(reader))
                except StopIteration:
                    break
                except csv.Error:
                    continue
    except OSError:
        return []
    out = []
    for row in rows:
        values = {}
        for k, v in row.items():
            try:
                values[(k or "").strip()] = float(v)
            except (TypeError, ValueError):
                continue
        out.append(values)
    return out


def report_main(config: Config, out: Path, png: bool) -> int:
    if not config.state_dir.is_dir():
        print(f"yolo-train: {config.state_dir}: no such state directory; pass the run's --config or --state-dir",
              file=sys.stderr)
        return 1
    unreadable = StatePaths(config.state_dir).unreadable()
    if unreadable:
        print(f"yolo-train: {unreadable}", file=sys.stderr)
        return 1
    if out.name in ("", ".", "..") or out.is_dir():
        print(f"yolo-train: -o {str(out)!r} is a directory, not a file; name the page to write (-o night.html)",
              file=sys.stderr)
        return 1
    night = gather_night(config)
    picture = out.with_suffix(".png")
    try:
        out.write_text(render(night), encoding="utf-8")
        if png:
            picture.write_bytes(report_plot.timeline(night, "png"))
    except OSError as e:
        print(f"yolo-train: cannot write {e.filename or out} ({e.strerror}); pick another -o", file=sys.stderr)
        return 1
    print(f"{out}" + (f" (missing: {'; '.join(night.missing)})" if night.missing else ""))
    if png:
        print(picture)
    return 0
