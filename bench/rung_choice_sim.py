"""The ladder's choice after a hang when hangs come as often on every rung (issue 29): how often it ends on a slower
rung, the rule at an earlier commit against the rule here, side by side on the same hangs.

A simulation of rung_choice.py's own functions (``after_hang``, ``probe_target``) and probe.py's probation, no
training: rungs of ``--speeds`` it/s, every rung hanging at the same rate (exponential training time between hangs,
mean ``--between`` seconds, seeded); a hang costs ``--stall`` seconds plus the rung's ``--start``. Each run lasts
``--hangs`` hangs, with probes after ``--probe-after`` seconds of training at a safer rung (doubled after a failed
probe). A rung's speed counts as measured once it trained a second. Printed per interval between hangs: the share of
runs whose last rung is a slower one, the share of training time spent on slower rungs, and the goodput (iterations
done over those rung 0 would have done in the same wall time, hangs paid at its cost).

    .venv/bin/python -m bench.rung_choice_sim                                 # the issue's: 200 seeds, 30 hangs
    .venv/bin/python -m bench.rung_choice_sim --between 60,300 --before 4746f81 --prior 600

``--before`` is a git commit whose supervisor/decision/model/rung_choice.py is loaded as "before" (the rule at main when
issue 29 was filed: 4746f81); "after" is this checkout's, with ``--prior`` as ``[ladder] prior_between_hangs``.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import types
from dataclasses import dataclass, field, fields

from bench.harness import ROOT
from supervisor.config import ProbeConfig
from supervisor.decision.model import rung_choice

MEASURED_AFTER = 1.0  # training seconds before a rung's speed is known (the core: two beats)


def rule_at(commit: str) -> types.ModuleType:
    """rung_choice.py as it was at ``commit``, loaded as a module of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:supervisor/decision/model/rung_choice.py"],
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"rung_choice_{commit}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"rung_choice@{commit}", "exec"), module.__dict__)
    return module


@dataclass
class Rung:
    seconds: float = 0.0
    hangs: int = 0
    failed_probes: int = 0


@dataclass
class Run:
    speeds: list[float]
    start: float
    rung: int = 0
    rungs: list[Rung] = field(default_factory=list)
    probation: dict[int, float] = field(default_factory=dict)
    probing_from: int | None = None
    entered: float = 0.0  # trained seconds when the current rung was entered
    trained: float = 0.0
    work: float = 0.0  # iterations done
    wall: float = 0.0

    def __post_init__(self) -> None:
        self.rungs = [Rung() for _ in self.speeds]

    def facts(self, rule: types.ModuleType) -> list:
        has_failed = "failed_probes" in {f.name for f in fields(rule.RungFacts)}
        out = []
        for k, r in enumerate(self.rungs):
            speed = self.speeds[k] if r.seconds >= MEASURED_AFTER else None
            extra = {"failed_probes": r.failed_probes} if has_failed else {}
            out.append(rule.RungFacts(speed, r.seconds, r.hangs, self.start if r.seconds or r.hangs else None, **extra))
        return out

    def train(self, seconds: float) -> None:
        self.rungs[self.rung].seconds += seconds
        self.trained += seconds
        self.work += seconds * self.speeds[self.rung]
        self.wall += seconds

    def move(self, rung: int) -> None:
        self.rung, self.entered = rung, self.trained
        self.wall += self.start


def simulate(rule: types.ModuleType, prior: float | None, speeds: list[float], between: float, hangs: int,
             seed: int, stall: float, start: float, probe_after: float, give_up: int) -> Run:
    rng = random.Random(seed)
    run = Run(speeds, start)
    kwargs = {"prior": prior} if "prior" in rule.after_hang.__code__.co_varnames else {}
    seen = 0
    next_hang = rng.expovariate(1 / between)
    while seen < hangs:
        if run.probing_from is not None and run.trained - run.entered >= probe_after:
            run.probing_from = None  # the probed rung held: kept
        left = None
        target = rule.probe_target(run.rung, run.facts(rule), give_up) if run.rung else None
        if target is not None and run.probing_from is None:
            left = run.probation.get(run.rung, probe_after) - (run.trained - run.entered)
        if left is not None and left < next_hang:
            run.train(max(0.0, left))
            next_hang -= max(0.0, left)
            run.probing_from = run.rung
            run.move(target)  # a planned stop at a checkpoint: nothing lost, a start paid
            continue
        run.train(next_hang)
        next_hang = rng.expovariate(1 / between)
        seen += 1
        run.rungs[run.rung].hangs += 1
        run.wall += stall
        if run.probing_from is not None:
            back, run.probing_from = run.probing_from, None
            run.probation[back] = 2 * run.probation.get(back, probe_after)
            run.rungs[run.rung].failed_probes += 1
            run.move(back)
            continue
        choice = rule.after_hang(run.rung, run.facts(rule), stall, **kwargs)
        run.move(choice.rung)
    return run


def summary(runs: list[Run]) -> tuple[float, float, float]:
    slower = sum(r.rung != 0 for r in runs) / len(runs)
    time_slower = sum(r.trained - r.rungs[0].seconds for r in runs) / sum(r.trained for r in runs)
    goodput = sum(r.work for r in runs) / sum(r.wall * r.speeds[0] for r in runs)
    return slower, time_slower, goodput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speeds", default="10,8,7.5,7,6,3", help="it/s of each rung, fastest first")
    parser.add_argument("--between", default="60,300", help="mean training seconds between hangs, comma-separated")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--hangs", type=int, default=30)
    parser.add_argument("--stall", type=float, default=15.0, help="seconds from a hang to the next spawn")
    parser.add_argument("--start", type=float, default=10.0, help="seconds from a spawn to the first batch")
    parser.add_argument("--probe-after", type=float, default=7200.0)
    parser.add_argument("--give-up-after", type=int, default=3)
    parser.add_argument("--prior", type=float, default=ProbeConfig.prior_between_hangs,
                        help="[ladder] prior_between_hangs, seconds (the default, unless given)")
    parser.add_argument("--before", default="4746f81", help="the commit whose rule is 'before'")
    args = parser.parse_args()
    speeds = [float(x) for x in args.speeds.split(",")]
    before = rule_at(args.before)
    print(f"speeds {speeds} it/s, stall {args.stall:.0f} s, start {args.start:.0f} s, {args.seeds} seeds x "
          f"{args.hangs} hangs, probe_after {args.probe_after:.0f} s; before: rung_choice.py at {args.before}; "
          f"after: this checkout, prior_between_hangs {args.prior:.0f} s")
    print(f"{'between hangs':>14} | {'ends slower':>11} {'after':>6} | {'time slower':>11} {'after':>6} | "
          f"{'goodput':>7} {'after':>6}")
    for between in (float(x) for x in args.between.split(",")):
        common = dict(speeds=speeds, between=between, hangs=args.hangs, stall=args.stall, start=args.start,
                      probe_after=args.probe_after, give_up=args.give_up_after)
        old = summary([simulate(before, None, seed=s, **common) for s in range(args.seeds)])
        new = summary([simulate(rung_choice, args.prior, seed=s, **common) for s in range(args.seeds)])
        print(f"{between:>12.0f} s | {old[0]:>11.0%} {new[0]:>6.0%} | {old[1]:>11.0%} {new[1]:>6.0%} | "
              f"{old[2]:>7.3f} {new[2]:>6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
