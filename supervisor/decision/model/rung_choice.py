"""Which rung after a hang, and which rung a probe tries: the ladder's choices from what each rung has shown.

A rung that has trained is known by its speed S (median it/s) and its mean time between hangs M. M is not its
training seconds over its hangs alone, which one hang a few seconds in would make a few seconds: its evidence (T
training seconds, H hangs) is weighed with a prior counted as one hang seen, one hang per P' seconds of training:

    M = (T + P') / (H + 1)          P' = (P + the other rungs' training seconds) / (1 + their hangs)

P is ``[ladder] prior_between_hangs`` (off: M = T / H, the evidence alone); the other rungs' hangs count because
hangs that come whatever the rung (a driver's bad night) say as much about this rung as about those. So one early
hang leaves M near P / 2; a rung that hangs again and again is soon judged by its own rate (H quick hangs:
M = P' / (H + 1)); a rung tried after others hung quickly starts from their rate, not from P.

A hang at it costs L seconds of training time: the stall until detection, the kill and the work thrown away
(measured, ``DEFAULT_STALL_COST`` until this run has measured one), plus the rung's own start to its first batch
(measured per rung: spawned loader workers start far slower than forked ones). A rung's expected goodput is the
speed it keeps:

    G = S x M / (M + L)        (G = S for a rung that has not hung, 0 for one that hung before it trained)

A hang recovered short of a restart (in place, say) costs its own measured seconds, not L: with I the seconds such
recoveries cost the rung over its T training seconds, G = S x M / (M + L + M x I / T) (G = S x T / (T + I) for a rung
without other hangs).

A rung that hung before its speed was measured (in its startup) climbs one rung when nothing below it was measured
or there is no prior; otherwise that hang is one sample like any other, the rung judged at the speed of the nearest
rung measured below it.

After a hang the next rung is, of two candidates, the better:

- the known rung of the highest G (on a tie the lower, faster one): a rung that hung as often as the one below it
  has a lower G (same M, lower S) and is left;
- the lowest rung above every rung tried, when even its best case beats that G by ``EXPLORE_GAIN``: its best case is
  curing every hang at the speed of the highest rung measured (a safer rung is seldom faster than the rungs below
  it; the threads rung, faster than ``workers = 1``, is reached only while the rungs below it keep hanging).

So a hang that recurs quickly (a deadlock the settings cause) climbs while climbing can pay, and the rung that cures it
keeps the run (no hang, no choice); hangs that come as often whatever the rung (a driver's bad night) leave the run on
the fastest rung, checkpointing often, instead of paying a slower rung for nothing. Old evidence fades: a rung left is
probed again after ``probe_after`` of quiet at the safer rung, however often it hung before; only probes that failed
``give_up_after`` times end that. A probe goes straight to the fastest rung below worth retrying (``probe_target``),
not one rung at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

DEFAULT_STALL_COST = 15.0  # seconds from a hang to the next spawn, work lost included, until one is measured
DEFAULT_START = 15.0  # seconds from a spawn to its first batch, for a rung whose start this run has not measured
# An untried rung must promise this much more goodput than the best known: trying one costs a hang's worth of
# training at a slower rung, and its promise is a best case.
EXPLORE_GAIN = 1.25
# A rung below is not worth probing only if measured clearly slower than the current one: speeds measured minutes
# apart on a busy machine differ by a few percent, and the ladder's rungs are ordered fastest first.
PROBE_SLOWER = 0.9


@dataclass(frozen=True)
class RungFacts:
    """What one rung has shown in this run."""
    speed: float | None  # median it/s, None until measured
    seconds: float  # training seconds spent at it
    hangs: int
    start: float | None = None  # median seconds from a spawn at it to the first batch, None until measured
    failed_probes: int = 0  # probes of this rung that hung
    tier_seconds: float = 0.0  # what its hangs recovered short of a restart cost (their tier_cost): seconds
    tier_recovered: int = 0  # its hangs recovered short of a restart (their cost is ``tier_seconds``)
    tier_escalated: int = 0  # recoveries here short of a restart that escalated (each also counted in ``hangs``)

    @property
    def tried(self) -> bool:
        return self.seconds > 0 or self.hangs > 0 or self.speed is not None


@dataclass(frozen=True)
class Choice:
    rung: int
    why: str
    counts: bool = True  # the hang counts against the rung it came at (hang_evidence.py: False where no rung changes it)


def hang_cost(facts: RungFacts, stall_cost: float, rungs: list[RungFacts]) -> float:
    """Seconds a hang at this rung costs: the stall, kill and work lost, then this rung's start (where unmeasured,
    the mean start of the rungs measured)."""
    starts = [r.start for r in rungs if r.start is not None]
    start = facts.start if facts.start is not None else sum(starts) / len(starts) if starts else DEFAULT_START
    return stall_cost + start


def between_hangs(facts: RungFacts, prior: float | None) -> float | None:
    """The rung's mean training seconds between hangs, its evidence weighed with ``prior``, the seconds between hangs
    expected of it before any (None: the evidence alone); None for a rung that never hung and has no prior."""
    if prior:
        return (facts.seconds + prior) / (facts.hangs + 1)
    return facts.seconds / facts.hangs if facts.hangs else None


def prior_of(k: int, rungs: list[RungFacts], prior: float | None) -> float | None:
    """What rung k is expected to hold between hangs before its own evidence: one hang per ``prior`` seconds, with
    the other rungs' hangs and training added to it (None: no prior)."""
    if not prior:
        return None
    others = [r for j, r in enumerate(rungs) if j != k]
    return (prior + sum(r.seconds for r in others)) / (1 + sum(r.hangs for r in others))


def expected_goodput(facts: RungFacts, cost: float, prior: float | None = None) -> float:
    """The it/s a rung keeps once its hangs, ``cost`` seconds each, are paid for."""
    if facts.speed is None:
        return 0.0  # it never trained long enough to be measured
    if facts.hangs == 0 and not facts.tier_seconds:
        return facts.speed
    if facts.hangs == 0:  # only hangs recovered in place, at their own cost
        return facts.speed * facts.seconds / (facts.seconds + facts.tier_seconds)
    between = between_hangs(facts, prior)
    spared = between * facts.tier_seconds / facts.seconds if facts.seconds > 0 else 0.0  # theirs per M
    return facts.speed * between / (between + cost + spared)


def basis(facts: RungFacts, prior: float | None) -> str:
    """The estimate and what it rests on, for the log: "one hang per 153 s (1 in 6 s trained + a prior of 1 in
    300 s)"."""
    between = between_hangs(facts, prior)
    shown = "no hang" if between is None else f"one hang per {between:.0f} s"
    evidence = f"{facts.hangs} in {facts.seconds:.0f} s trained"
    return f"{shown} ({evidence} + a prior of 1 in {prior:.0f} s)" if prior else f"{shown} ({evidence})"


def after_hang(current: int, rungs: list[RungFacts], stall_cost: float | None,
               prior: float | None = None, passed: frozenset[int] = frozenset(),
               eligible: Callable[[int], bool] | None = None) -> Choice:
    """The rung to restart at after a hang at ``current``; ``rungs[k]`` is rung k's record, the hang included;
    ``stall_cost``: the measured mean seconds from a hang to the next spawn (None: not measured yet); ``prior``:
    ``[ladder] prior_between_hangs`` (None: each rung judged on its own evidence alone); ``passed``: rungs whose
    hang, tied to a point of the training, ``current`` got past (hang_history.passed): progress, no rung to go back
    to, whatever their speed; ``eligible``: whether an untried rung above changes what this hang depends on
    (hang_evidence.py; None: every rung does)."""
    stall = DEFAULT_STALL_COST if stall_cost is None else stall_cost
    top = len(rungs) - 1
    ok = eligible or (lambda k: True)
    below = [k for k in range(current) if rungs[k].speed is not None]
    assumed = ""
    if rungs[current].speed is None:  # it hung before it trained
        if not prior or not below:  # no evidence for any rung but a safer one
            safer = next((k for k in range(current + 1, top + 1) if ok(k)), None)
            if safer is not None:
                return Choice(safer, f"rung {current} hung before its speed was measured: "
                                     + ("one rung safer" if safer == current + 1 else f"rung {safer}, the next that "
                                                                                       f"changes it"))
            return Choice(current, "ladder exhausted: staying at the top rung" if current == top else
                          f"no rung above {current} changes it: staying")
        # One hang before a first batch is one sample like any other: judged at the speed of the nearest rung
        # measured below (a safer rung is seldom faster), not a reflex up the ladder.
        rungs = list(rungs)
        rungs[current] = replace(rungs[current], speed=rungs[below[-1]].speed)
        assumed = f" (rung {current} unmeasured: at rung {below[-1]}'s speed)"
    tried = [k for k, facts in enumerate(rungs) if facts.tried and (k not in passed or k == current)]
    priors = {k: prior_of(k, rungs, prior) for k in tried}
    goodput = {k: expected_goodput(rungs[k], hang_cost(rungs[k], stall, rungs), priors[k]) for k in tried}
    best = max(tried, key=lambda k: (goodput[k], -k))
    highest_tried = max(k for k, facts in enumerate(rungs) if facts.tried)
    untried = next((k for k in range(highest_tried + 1, top + 1) if ok(k)), top + 1)
    measured = [rungs[k].speed for k in tried if rungs[k].speed is not None]
    if untried <= top and measured and measured[-1] > EXPLORE_GAIN * goodput[best]:
        return Choice(untried, f"rung {best} keeps {goodput[best]:.2f} it/s of {rungs[best].speed:.2f} once its "
                               f"hangs are paid for ({basis(rungs[best], priors[best])}); rung {untried} is untried "
                               f"and could keep up to {measured[-1]:.2f}{assumed}")
    why = "the best known" if best != current else "still the best known"
    if passed:
        why += f" (rung {', '.join(map(str, sorted(passed)))} left: it hung at a point rung {current} got past)"
    return Choice(best, f"rung {best} is {why}: it keeps {goodput[best]:.2f} it/s once its hangs are paid for "
                        f"({basis(rungs[best], priors[best])}); "
                        + ", ".join(f"rung {k} {goodput[k]:.2f}" for k in tried) + assumed)


def probe_target(current: int, rungs: list[RungFacts], give_up_after: int) -> int | None:
    """The fastest rung below ``current`` worth retrying: the lowest whose probes have not hung ``give_up_after``
    times and, where both are measured, that is not clearly slower than ``current`` (``PROBE_SLOWER``); None when
    there is none. Its hangs before it was left do not count: the quiet since is the newer evidence."""
    speed = rungs[current].speed
    for k in range(current):
        if rungs[k].failed_probes >= give_up_after:
            continue
        if speed is not None and rungs[k].speed is not None and rungs[k].speed < PROBE_SLOWER * speed:
            continue
        return k
    return None
