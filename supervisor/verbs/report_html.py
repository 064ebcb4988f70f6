"""The page of ``yolo-train report``: one HTML file that opens offline (inline SVG and style, no script, no link,
a Content-Security-Policy that forbids any fetch), rendered from a ``report.Night``."""

from __future__ import annotations

import html
import re
import time
from typing import Any

from supervisor.verbs import report_plot

INCIDENTS_IN_FULL = 200  # the newest incidents the page shows one a row; the earlier ones are counted by kind


def render(night: Any) -> str:
    s = night.status
    t0, t1 = night.span
    timeline = _svg(report_plot.timeline(night))
    epochs = report_plot.epochs(night.epochs)
    goodput = s.get("goodput")
    deadline = "" if night.deadline is None else f"<dt>deadline</dt><dd>{_clock(night.deadline, True)}" + (
        f", ETA {_clock(night.eta_end, True)} ({_slack(night.deadline - night.eta_end)})" if night.eta_end else "") \
        + "</dd>"
    parts = [f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>yolo-train report: {_e(night.name)}</title><style>{CSS}</style></head><body>
<h1>{_e(night.name)}: the night of {_clock(t0, True)} to {_clock(t1, True)}</h1>
<dl class="facts"><dt>state</dt><dd id="state">{_e(s.get('state'))}</dd>
<dt>progress</dt><dd>epoch {_e(s.get('epoch'))}/{_e(s.get('epochs'))}, {_pct(s.get('progress'))}</dd>
<dt>goodput</dt><dd id="goodput">{_pct(goodput)}</dd>
<dt>rung</dt><dd>{_e(s.get('rung'))} ({_e(s.get('rung_label'))})</dd>
<dt>restarts</dt><dd>{_e(s.get('restarts'))}</dd>{deadline}
<dt>state directory</dt><dd><code>{_e(night.state_dir)}</code></dd></dl>"""]
    if night.missing:
        parts.append('<div class="missing" id="missing"><b>Missing from this report:</b><ul>'
                     + "".join(f"<li>{_e(m)}</li>" for m in night.missing) + "</ul></div>")
    parts.append(f'<h2>Timeline</h2><figure id="timeline">{timeline}<figcaption>Speed and progress over wall time. '
                 f'Background: the rung in force; red lines: incidents (numbered as in the table); red shading: from '
                 f'the last progress until training went on; orange hatching: training thrown away (after the '
                 f'checkpoint resumed from); triangles: checkpoints; dashed: the ETA.</figcaption></figure>')
    parts.append(_rungs_html(night))
    parts.append("<h2>Where the time went</h2><table id=\"time\"><tr><th>what</th><th>time</th><th>share</th>"
                 "<th>from</th></tr>")
    rows = night.where_the_time_went()
    total = sum(v for _, v, _ in rows if v)
    for what, seconds, source in rows:
        share = f"{100 * seconds / total:.1f}%" if seconds is not None and total else "-"
        parts.append(f"<tr><td>{_e(what)}</td><td>{_duration(seconds)}</td><td>{share}</td><td>{_e(source)}</td></tr>")
    parts.append("</table>")
    parts.append(_incidents_html(night))
    parts.append("<h2>Per-epoch metrics (results.csv)</h2>")
    if night.epochs:
        if epochs:
            parts.append(f'<figure id="epochs">{_svg(epochs)}</figure>')
        keys = list(night.epochs[-1])
        head = "".join(f"<th>{_e(k)}</th>" for k in keys)
        body = "".join("<tr>" + "".join(f"<td>{_num(r.get(k))}</td>" for k in keys) + "</tr>" for r in night.epochs)
        parts.append(f'<div class="wide"><table id="results"><tr>{head}</tr>{body}</table></div>')
    else:
        parts.append("<p>No epoch has finished yet.</p>")
    parts.append(f"<footer>yolo-train report, made {_clock(time.time(), True)}</footer></body></html>")
    return "\n".join(parts)


def _rungs_html(night: Any) -> str:
    bands = night.rung_bands
    changes = [(a, r) for (a, _, r) in bands]
    if len(changes) < 2:
        return ""
    items = "".join(f'<li class="rung-change">{_clock(a)}: rung {r}</li>' for a, r in changes[1:])
    return f'<h2>Rung changes</h2><ul id="rungs">{items}</ul>'


def _incidents_html(night: Any) -> str:
    if not night.incidents:
        return "<h2>Incidents</h2><p>None.</p>"
    out = ["<h2>Incidents</h2>"]
    first = max(0, len(night.incidents) - INCIDENTS_IN_FULL)
    if first:
        out.append(_earlier_incidents_html(night.incidents[:first]))
    out.append('<table id="incidents"><tr><th>#</th><th>when</th><th>cause</th><th>phase</th>'
               '<th>position</th><th>rung</th><th>where each process sat</th><th>cost</th><th>remedy</th></tr>')
    for n, i in enumerate(night.incidents[first:], first + 1):
        tier = f" (tier {_e(i['tier'])})" if i.get("tier") is not None else ""
        frames = i.get("summary") or ([i["culprit"]] if i.get("culprit") else [])
        where = "<ul>" + "".join(f"<li><code>{_e(line)}</code></li>" for line in frames) + "</ul>" if frames else \
            "<i>not recorded</i>"
        cost = []
        if is_number(i.get("seconds_since_progress")):
            cost.append(f"stall {_duration(i['seconds_since_progress'])}")
        if is_number((i.get("kill") or {}).get("seconds")):
            cost.append(f"kill {_duration(i['kill']['seconds'])}")
        if "lost_seconds" in i:
            cost.append("lost work unknown" if i["lost_seconds"] is None else
                        f"lost {_duration(i['lost_seconds'])} ({i.get('lost_batches')} batches replayed)")
        if is_number(i.get("restart_seconds")):
            cost.append(f"training again after {_duration(i['restart_seconds'])}")
        after = i.get("after") if isinstance(i.get("after"), dict) else {}
        if is_number(after.get("ratio")) and is_number(after.get("extra_seconds")):
            cost.append(f"the {after.get('batches')} batches after {after['ratio']:.2f}x the {after.get('before_batches')}"
                        f" before ({after['extra_seconds']:+.1f} s)")
        out.append(f'<tr class="incident" id="incident-{n}"><td>{n}</td><td>{_clock(i.get("time"), True)}</td>'
                   f'<td class="cause">{_e(i.get("reason"))}{tier}<div class="detail">{_e(i.get("detail"))}</div></td>'
                   f'<td>{_e(i.get("phase"))}</td><td>epoch {_e(i.get("epoch"))} batch {_e(i.get("batch"))}</td>'
                   f'<td>{_e(i.get("rung"))} ({_e(i.get("rung_label"))})</td><td>{where}</td>'
                   f'<td>{_e("; ".join(cost))}</td><td>{_e(_remedy(night, n - 1))}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _earlier_incidents_html(incidents: list[dict[str, Any]]) -> str:
    """The incidents before the newest INCIDENTS_IN_FULL, one row per kind (cause, phase, where it hung): how many,
    when the first and the last, and what they cost together."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for i in incidents:
        key = (str(i.get("reason")), str(i.get("phase")), str(i.get("where") or i.get("culprit") or "not recorded"))
        groups.setdefault(key, []).append(i)
    rows = []
    for (reason, phase, where), group in sorted(groups.items(), key=lambda g: -len(g[1])):
        times = [i["time"] for i in group if is_number(i.get("time"))]
        stall = sum(i["seconds_since_progress"] for i in group if is_number(i.get("seconds_since_progress")))
        lost = sum(i["lost_seconds"] for i in group if is_number(i.get("lost_seconds")))
        span = f"{_clock(min(times), True)} to {_clock(max(times), True)}" if times else "?"
        rows.append(f'<tr class="incident-group"><td>{len(group)}</td><td>{_e(reason)}</td><td>{_e(phase)}</td>'
                    f'<td><code>{_e(where)}</code></td><td>{span}</td><td>stall {_duration(stall)}, lost '
                    f'{_duration(lost)}</td></tr>')
    return (f'<p id="incidents-earlier">The {len(incidents)} incidents before the newest {INCIDENTS_IN_FULL}, by '
            f'kind (<code>yolo-train incidents</code> has each):</p><table id="incident-groups"><tr><th>count</th>'
            f'<th>cause</th><th>phase</th><th>where it hung</th><th>first to last</th><th>cost</th></tr>'
            + "".join(rows) + "</table><p>The newest, each in full:</p>")


def _remedy(night: Any, k: int) -> str:
    """What followed incident k: the rung the next attempt ran at, or the run's end."""
    i = night.incidents[k]
    if i.get("remedy"):
        return str(i["remedy"])
    if i.get("pending"):
        return "under way"
    after = [s for s in night.samples if s["t"] > i.get("time", 0) and s.get("state") in ("starting", "healthy")]
    later = night.incidents[k + 1] if k + 1 < len(night.incidents) else None
    rung = after[0]["rung"] if after else later.get("rung") if later and later.get("attempt") == i.get("attempt", 0) \
        + 1 else None
    if i.get("reason") == "stop":
        return "stopped on request"
    if rung is None:
        return "the run ended" if not after else "restart"
    return "restart at the same rung" if rung == i.get("rung") else f"restart at rung {rung}"


def _svg(data: bytes) -> str:
    """The SVG element alone: no XML prologue, no RDF metadata."""
    text = data.decode()
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.5g}"


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if is_number(value) else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _slack(seconds: float) -> str:
    return f"{_duration(abs(seconds))} {'before' if seconds >= 0 else 'after'} the deadline"


def _clock(wall: Any, with_date: bool = False) -> str:
    if not is_number(wall) or not wall:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(wall))


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1500px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}dt{color:#666}dd{margin:0}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:.3em .5em;vertical-align:top;
text-align:left}th{background:#f5f5f5}.detail{color:#666;font-size:12px;max-width:30em}
td ul{margin:0;padding-left:1em}code{font-size:12px}figure{margin:0}svg{max-width:100%;height:auto}
.missing{background:#fff4e0;border:1px solid #f0c070;padding:.5em 1em;margin:1em 0}
.wide{overflow-x:auto}footer{margin-top:2em;color:#888;font-size:12px}"""
