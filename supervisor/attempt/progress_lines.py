"""Progress read from a training script's own output, for scripts that send no heartbeat.

A script run as ``[worker] command`` may know nothing of yolo-train. It still tells a watcher how far it got: its
progress bar. This module turns the bytes of its stdout/stderr into readings (epoch, batch, loss) and the
readings into a progress counter that grows only when the script's position grew, so the same watchdog, phases
and ``auto`` timeout judge it as they judge a heartbeat. Pure: bytes in, readings out; no I/O, no clock.

What is recognised, tried in this order on each line (``\\n`` and ``\\r`` both end one, since tqdm redraws a bar
with ``\\r``; ANSI escapes are removed first):

1. ``[progress] regex``, the user's, with named groups among ``epoch``, ``epochs``, ``batch``, ``batches``,
   ``loss``; when it matches, nothing else is tried on that line.
2. A tqdm bar, ``desc: 42%|####      | 420/1000 [00:10<00:14, 41.2it/s, loss=0.3]`` (also without a total,
   ``desc: |   | 5/? [...]`` and ``desc: 5it [...]``), or Ultralytics' own bar, ``desc: 42% ━━━━━─────── 17/41
   4.3it/s 0.3s<1.4s``. The position is ``n`` of ``n/total``. The description is then read by the first of:

   - Ultralytics' training row, ``      3/50      1.2G      1.234      2.345      1.111   12  640``: epoch/epochs,
     GPU memory, the losses (their sum is the reading's loss), instances, image size;
   - Lightning's descriptions: ``Epoch 3`` (0-based, as Lightning counts: read as epoch 4), ``Training`` (the bar
     Lightning draws when it resumed mid-epoch), ``Validation DataLoader 0``, ``Sanity Checking DataLoader 0``;
   - any other: ``Epoch 3/50``, ``epoch 3`` or ``[3/50]`` in it gives the epoch (1-based, as printed).

   The loss is the first ``...loss...=NUMBER`` of the bar's postfix or description.

What output can and cannot show: a reading is only what the script printed. A bar drawn less often than the
timeout (tqdm's ``mininterval``, Lightning's ``refresh_rate``) looks like a hang; a script that keeps reprinting
the same bar while stuck (a refresh thread) is not progressing, because only a grown position counts; a script
that prints nothing until an epoch ends has no progress inside one. The heartbeat client sees every batch, each
phase and each checkpoint; use it where the script can be changed.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from supervisor.attempt.terminal_escapes import without_escapes
from supervisor.patterns import validate_regex
from worker.wire.contract import Phase

MAX_LINE_BYTES = 8192  # a longer run of bytes without \n or \r is not a progress line: dropped, counted
MAX_BARS = 64  # distinct bars remembered by the counter; the least recently seen is forgotten first

_LINE_END = re.compile(rb"[\r\n]")
# tqdm's default bar_format: '{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]',
# l_bar = '{desc}: {percentage:3.0f}%|'; Lightning's bar without a total drops the percentage.
_TQDM_BAR = re.compile(r"^(?P<desc>.*?)(?::\s*|\s*)(?:\d{1,3}%)?\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+|\?)"
                       r"\s*(?:\[(?P<info>[^\]]*))?")
# tqdm without a total: '{desc}: {n}{unit} [{elapsed}, {rate_fmt}{postfix}]'.
_TQDM_COUNT = re.compile(r"^(?P<desc>.*?):\s*(?P<n>\d+)[A-Za-z]+ \[\d+:\d\d(?P<info>[^\]]*)")
# Ultralytics' TQDM (ultralytics/utils/tqdm.py, _display): f"{desc}: {percent}% {bar} {n}/{total} {rate} {elapsed}".
_ULTRALYTICS_BAR = re.compile(r"^(?P<desc>.*?): (?:\d{1,3})% [━─╸]+ (?P<n>\d+)/(?P<total>\d+|\?)(?P<info>.*)")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
# Ultralytics' training row (BaseTrainer: ("%11s" * 2 + "%11.4g" * (2 + loss_len)) % (f"{epoch+1}/{epochs}",
# f"{mem}G", *losses, instances, imgsz)).
_ULTRALYTICS_ROW = re.compile(rf"^\s*(?P<epoch>\d+)/(?P<epochs>\d+)\s+[\d.]+[KMGT]?\s+(?P<rest>(?:(?:{_NUMBER})\s+)+"
                              rf"(?:{_NUMBER}))\s*$")
_ULTRALYTICS_VAL = re.compile(r"^\s*Class\s+Images\s+Instances")
_LIGHTNING = re.compile(r"^(?:Epoch (?P<epoch>\d+)|(?P<train>Training)|(?P<val>Validation|Sanity Checking)"
                        r"(?: DataLoader \d+)?)$")
_EPOCH_IN_DESC = re.compile(r"(?:\bepoch\s*[:=]?\s*(?P<e1>\d+)(?:\s*/\s*(?P<t1>\d+))?|\[(?P<e2>\d+)/(?P<t2>\d+)\])",
                            re.IGNORECASE)
_VAL_DESC = re.compile(r"val|eval|test|sanity", re.IGNORECASE)
_SETUP_DESC = re.compile(r"scanning|caching|download", re.IGNORECASE)
_LOSS = re.compile(rf"(?:^|[\s,(])\w*loss\w*\s*[=:]\s*(?P<loss>{_NUMBER})", re.IGNORECASE)
_NUMBER_RUN = re.compile(rf"{_NUMBER}", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_RATE = re.compile(r"\d\s*(?:[A-Za-z]+/s|s/[A-Za-z]+)\b")  # tqdm's 41.2it/s or 1.50s/it, Ultralytics' 14.4it/s


@dataclass(frozen=True)
class ProgressReading:
    """One progress line as printed. Positions are 1-based as people print them; None when the line has no such
    field. ``bar`` tells concurrent bars apart (a training bar and a validation bar restart their own counts);
    ``phase`` is what the line says the script is doing: setup, train or val."""

    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None  # completed batches in the epoch (tqdm's n)
    batches: int | None = None
    loss: float | None = None
    phase: Phase = Phase.TRAIN
    bar: str = ""
    rate_shown: bool = False  # the bar prints a measured rate (``4.1it/s``, not tqdm's ``?it/s``): it has advanced


class ProgressParser:
    """Bytes of a script's output in, readings out. Keeps the unfinished last line for the next ``feed``."""

    def __init__(self, regex: str | None = None):
        if regex is not None and (problem := validate_regex(regex)):
            raise ValueError(f"[progress] regex {regex!r} {problem}")
        self.regex = re.compile(regex) if regex is not None else None
        self.lines = 0  # complete lines looked at
        self.readings = 0  # lines that were progress lines
        self.dropped_lines = 0  # runs over MAX_LINE_BYTES without a line end, not looked at
        self._partial = b""
        self._dropping = False  # inside an over-long line: skip up to its end

    def feed(self, data: bytes) -> list[ProgressReading]:
        parts = _LINE_END.split(self._partial + data) if self._partial else _LINE_END.split(data)
        self._partial = parts.pop()
        readings = []
        for raw in parts:
            if self._dropping:
                self._dropping = False  # the end of the over-long line: counted when it overflowed
                continue
            if raw:
                self.lines += 1
                if (reading := self.parse_line(raw)) is not None:
                    readings.append(reading)
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial = b""
            if not self._dropping:
                self.dropped_lines += 1
                self._dropping = True
        self.readings += len(readings)
        return readings

    def parse_line(self, raw: bytes) -> ProgressReading | None:
        line = without_escapes(raw).decode("utf-8", "replace")
        if self.regex is not None and (m := self.regex.search(line)):
            return _from_regex(m)
        if "|" in line and (m := _TQDM_BAR.search(line)):
            return _from_bar("tqdm", m)
        if "% " in line and (m := _ULTRALYTICS_BAR.search(line)):
            return _from_bar("ultralytics", m)
        if " [" in line and (m := _TQDM_COUNT.search(line)):
            return _from_bar("tqdm", m)
        return None


class ProgressCounter:
    """Readings in, a counter of progress out: the counter grows only when a bar's position grew.

    A bar's position is (epoch, batch), compared in that order, per bar: a redraw of the same position (tqdm's
    postfix refresh, a spinning script reprinting its bar) is not progress; a new epoch starting again at batch 0
    is (the epoch grew). A bar counts only once it advances: its first draw, at 0 or at a resumed run's ``initial``
    (``10/40 [00:00<?, ?it/s]``), trained nothing in this process; a first draw that already shows a rate (a
    one-batch validation bar drawn at its end) did. A bar that prints no epoch (a validation bar, Lightning's
    ``Training`` bar) is placed in the latest epoch any bar printed, so the same ``1/1`` validation bar in the next
    epoch is progress. A bar whose position fell (Lightning resetting its bar before the next epoch) starts again
    from there, and counts from its next growth. A loss-only reading (a user regex with only ``loss``) has no position: it counts when
    its loss differs from the previous loss-only reading's, the one sign of a new step it carries; the same
    value printed again is not progress.
    """

    def __init__(self) -> None:
        self.progress = 0  # never decreases: the number of readings that were progress
        self.last: ProgressReading | None = None  # the latest reading that was progress
        self.epoch: int | None = None  # the latest epoch a reading printed
        self._positions: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._last_loss: float | None = None

    def observe(self, reading: ProgressReading) -> bool:
        """True when ``reading`` is progress (and then the counter grew by one)."""
        if reading.epoch is None and reading.batch is None:
            if reading.loss is None or reading.loss == self._last_loss:
                return False
            self._last_loss = reading.loss
            return self._advance(reading)
        if reading.epoch is not None:
            self.epoch = reading.epoch
        position = (self.epoch or 0, reading.batch or 0)
        previous = self._positions.pop(reading.bar, None)
        self._positions[reading.bar] = position
        if len(self._positions) > MAX_BARS:
            self._positions.popitem(last=False)
        if previous is None:  # where the bar starts (tqdm's initial= on a resume) unless it measured a rate since
            return position[1] > 0 and reading.rate_shown and self._advance(reading)
        return position > previous and self._advance(reading)

    def _advance(self, reading: ProgressReading) -> bool:
        self.progress += 1
        self.last = reading
        return True


def _from_regex(m: re.Match) -> ProgressReading:
    groups = m.groupdict()
    return ProgressReading(epoch=_int(groups.get("epoch")), epochs=_int(groups.get("epochs")),
                           batch=_int(groups.get("batch")), batches=_int(groups.get("batches")),
                           loss=_float(groups.get("loss")), bar="regex")


def _from_bar(kind: str, m: re.Match) -> ProgressReading:
    desc = m.group("desc").strip()
    batch = int(m.group("n"))
    total = m.groupdict().get("total")
    batches = int(total) if total and total != "?" else None
    info = m.group("info") or ""
    label = f"{kind}:{_SPACES.sub(' ', _NUMBER_RUN.sub('#', desc))}"
    rated = _RATE.search(info) is not None
    if row := _ULTRALYTICS_ROW.match(desc):
        losses = [float(x) for x in row.group("rest").split()[:-2]]  # the last two: instances, image size
        return ProgressReading(int(row.group("epoch")), int(row.group("epochs")), batch, batches,
                               round(sum(losses), 6) if losses else None, Phase.TRAIN, label, rated)
    loss = _loss(info) if (loss := _loss(desc)) is None else loss
    if _ULTRALYTICS_VAL.match(desc):
        return ProgressReading(None, None, batch, batches, loss, Phase.VAL, label, rated)
    if lightning := _LIGHTNING.match(desc):
        if lightning.group("epoch") is not None:
            return ProgressReading(int(lightning.group("epoch")) + 1, None, batch, batches, loss, Phase.TRAIN, label,
                                   rated)
        phase = Phase.TRAIN if lightning.group("train") else Phase.VAL
        return ProgressReading(None, None, batch, batches, loss, phase, label, rated)
    epoch = epochs = None
    if e := _EPOCH_IN_DESC.search(desc):
        epoch, epochs = _int(e.group("e1") or e.group("e2")), _int(e.group("t1") or e.group("t2"))
    phase = Phase.SETUP if _SETUP_DESC.search(desc) else Phase.VAL if _VAL_DESC.search(desc) else Phase.TRAIN
    return ProgressReading(epoch, epochs, batch, batches, loss, phase, label, rated)


def _loss(text: str) -> float | None:
    m = _LOSS.search(text)
    return float(m.group("loss")) if m else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
