"""Probing back down the ladder: a safer rung that has held for its probation gives the faster rung below another
try, at a checkpoint ([ladder] probe_after).

The probe is a planned stop (stopping.py): the worker saves and exits, the next attempt runs at the probe's target
(rung_choice.probe_target), and the rung left is remembered. The probed rung is kept once it has held as long; a
hang there returns to the rung left, whose probation doubles; a rung whose probes hung ``give_up_after`` times is
not probed again (its hangs before it was left do not count: the quiet since is newer evidence).
"""

from __future__ import annotations

from typing import Any

from supervisor.decision.learning import choices
from supervisor.decision.model.actions import Log, RequestCheckpoint
from supervisor.decision.model.events import Now
from supervisor.decision.model.rung_record import RungRecord
from supervisor.decision.model.state import Supervision
from supervisor.decision.recovery import stopping
from supervisor.decision.recovery.stopping import Stop
from supervisor.vocabulary import After, Reason


def check(s: Supervision, now: Now) -> list[Any]:
    """At a batch boundary: keep a probed rung that held, or try the faster rung below once probation is served."""
    cfg, p = s.config.probe, s.probe
    if p.probing_from is not None and cfg.probe_after is not None and rung_trained(s) >= cfg.probe_after:
        kept, p.probing_from = p.probing_from, None
        return [Log("info", f"rung {s.rung} ({s.ladder.label(s.rung)}) held for {rung_trained(s):.0f} s: kept "
                            f"(rung {kept} is no longer the way back)")]
    left = probe_in(s)
    if left is None or left > 0:
        return []
    # A record like any stop's: the attempt's time is closed into the totals, and a save that fails is a real incident.
    target = choices.probe_target(s)
    return stopping.begin(s, now, Stop(Reason.PROBE, s.current.progress.phase, then=After.RESTART,
                                       detail=f"rung {s.rung} trained {rung_trained(s):.0f} s without a hang: probing "
                                              f"rung {target} ({s.ladder.label(target)}) at this checkpoint",
                                       save_until=stopping.save_deadline(s, now))) + \
        [*stopping.publish(s, target, s.remedies, {"reason": Reason.PROBE.value}), RequestCheckpoint()]


def enter(s: Supervision) -> Log:
    """The probe's checkpoint is saved: the next attempt runs at the probed rung."""
    target = choices.probe_target(s)
    s.probe.probing_from = s.rung
    s.move_to(s.rung - 1 if target is None else target)
    return Log("warning", f"faster: rung {s.rung} ({s.ladder.label(s.rung)}), probing; a hang returns to rung "
                          f"{s.probe.probing_from}")


def back(s: Supervision) -> Log:
    """The probed rung failed: back to where it was safe, for longer."""
    p = s.probe
    rung, p.probing_from = p.probing_from, None
    left, probed = s.rung_record(rung), s.rung
    left.probation = 2 * ((s.config.probe.probe_after or 0.0) if left.probation is None else left.probation)
    s.rung_record(probed).failed_probes += 1
    gave_up = s.rung_record(probed).failed_probes >= s.config.probe.give_up_after
    s.move_to(rung)
    return Log("warning", f"the probed rung hung: back to rung {rung} ({s.ladder.label(rung)}), next probe "
                          f"after {left.probation:.0f} s" + (f"; rung {probed}'s probes hung "
                          f"{s.config.probe.give_up_after} times and it is not probed again" if gave_up else ""))


def rung_trained(s: Supervision) -> float:
    """Seconds of progress at the current rung since it was entered."""
    return max(0.0, s.trained() - s.probe.rung_entered_trained)


def probe_in(s: Supervision) -> float | None:
    """Seconds of healthy training left before the rung below is tried; None when it will not be."""
    cfg = s.config.probe
    if cfg.probe_after is None or s.rung == 0 or s.exit is not None or choices.probe_target(s) is None:
        return None
    probation = s.rungs.get(s.rung, RungRecord()).probation
    return max(0.0, (cfg.probe_after if probation is None else probation) - rung_trained(s))
