"""Kernel messages: what a classified kernel log line or GPU device event does to the run.

A stall or GPU-fault line puts the worker under suspicion; if it makes no progress within the confirm window it is
killed as hung at once (long before the stall timeout), if it does, the line is counted and nothing is killed. A line
naming a pid outside the worker's tree only counts. A lost GPU ends the supervisor with "reboot needed", but only on
the kernel's own word about a GPU this training uses. The OOM killer taking a worker process is remembered
(``Attempt.oom``): the crash that follows is an ``oom`` one (core._exited). A GPU reset is remembered by its source,
and on a reset or coredump line the GPU's devcoredump is copied first, whatever the line's judgement (the kernel
deletes it 5 minutes later): both go into the attempt's incident (``gpu_resets``, ``devcoredumps``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.decision.learning import hang_evidence
from supervisor.decision.model.actions import KeepDevcoredumps, Log
from supervisor.decision.model.events import DevcoredumpsKept, KernelMessage, Now
from supervisor.decision.model.state import OomKill, Supervision, Suspicion, trains_on_cpu
from supervisor.decision.recovery import stopping
from supervisor.decision.recovery.stopping import Stop
from supervisor.decision.recovery.tier import Verdict
from supervisor.decision.stall.watchdog import Stall
from supervisor.vocabulary import After, KernelKind, Reason, State


def message(s: Supervision, event: KernelMessage, now: Now) -> list[Any]:
    return _reset(s, event) + _judged(s, event, now)


def _reset(s: Supervision, event: KernelMessage) -> list[Any]:
    """A reset's source, remembered; the devcoredump asked for before anything the line's judgement does."""
    a = s.current
    if event.reset_source is not None:
        a.gpu_resets.append(event.reset_source)
        if (incident := _open_incident(s)) is not None:
            s.amend(incident, gpu_resets=tuple(a.gpu_resets))
    if not event.devcoredump:
        return []
    incident = _open_incident(s)
    return [KeepDevcoredumps(s.attempt, incident.id if incident else None, tuple(d.source for d in a.devcoredumps))]


def kept(s: Supervision, event: DevcoredumpsKept) -> list[Any]:
    """The shell copied them: the attempt's, and its incident's if one is under way."""
    if event.attempt != s.attempt or not event.dumps:
        return []
    a = s.current
    a.devcoredumps += event.dumps
    if (incident := _open_incident(s)) is not None:
        s.amend(incident, devcoredumps=incident.devcoredumps + event.dumps)
    said = ", ".join(f"{d.source} ({d.bytes} bytes{', truncated' if d.truncated else ''})" for d in event.dumps)
    return [Log("warning", f"the GPU's devcoredump kept: {said}, in {event.dumps[0].path.rsplit('/', 1)[0]}")]


def _open_incident(s: Supervision) -> Any:
    """The current attempt's incident still being completed, if its worker is being stopped or was."""
    incident = s.incidents[-1] if s.incidents else None
    return incident if incident is not None and incident.attempt == s.attempt and not incident.recorded \
        and not s.paces.watching(incident.id) else None  # (one the attempt trains on after: only its pace is owed)


def _judged(s: Supervision, event: KernelMessage, now: Now) -> list[Any]:
    a = s.current
    s.kernel_events[event.kind] += 1
    running = s.state in (State.STARTING, State.HEALTHY)
    if event.kind == KernelKind.GPU_LOST and not event.drill and (not event.trusted or trains_on_cpu(s)):
        # A line user space wrote, one from before this run, or a GPU this training does not use: it may be
        # worth a look, but "reboot needed" ends the run and needs the kernel's own word about our GPU.
        why = "not the kernel's own record of this run" if not event.trusted else "this training uses no GPU"
        if not running or trains_on_cpu(s):
            return [Log("warning", f"GPU-lost line ignored ({why}): {event.message[:200]}")]
        event = KernelMessage(KernelKind.GPU_FAULT, event.message, event.source, event.pattern, event.pid,
                              event.in_worker_tree, trusted=False)
    if event.kind == KernelKind.GPU_LOST:
        s.reboot_needed = True
        text = f"GPU lost ({event.pattern}): {event.message[:300]}"
        if running:
            return stopping.begin(s, now, Stop(Reason.KERNEL, a.progress.phase, detail=text, failure="kernel:gpu_lost",
                                               then=After.REBOOT, kernel_events=(event,)))
        return [Log("error", text)]
    if not running:
        return []
    if event.pid is not None and event.pid in a.loaders and not event.in_worker_tree:
        # A loader worker the worker reported is its own, whatever the shell's walk saw: a victim killed and reaped
        # before its line was read is in no walk (an OOM-killed loader worker's crash would be taken for a plain one)
        event = replace(event, in_worker_tree=True)
    if event.in_worker_tree is False:
        return [Log("info", f"kernel {event.kind.value} line about pid {event.pid}, not the worker's: counted "
                            f"({event.message[:160]})")]
    if event.kind == KernelKind.GPU_FAULT:
        hang_evidence.fault_seen(s, event.pattern)
    if event.kind == KernelKind.OOM:
        if event.in_worker_tree:
            a.oom = OomKill(event, now.mono)
            return [Log("error", f"the OOM killer took worker process {event.pid}")]
        return []
    if a.suspicion is None:
        a.suspicion = Suspicion(event, now.mono)
        return [Log("warning", f"kernel {event.kind.value} line ({event.pattern}); the worker must show progress "
                               f"within {s.config.kernel_log.confirm_window:.0f} s: {event.message[:160]}")]
    return []


def progress_seen(s: Supervision) -> list[Any]:
    """The worker progressed: a line under confirmation was not about a hang of ours."""
    suspicion, s.current.suspicion = s.current.suspicion, None
    if suspicion is None:
        return []
    event = suspicion.event
    return [Log("info", f"kernel {event.kind.value} line while training progresses: counted, nothing killed "
                        f"({event.message[:160]})")]


def unconfirmed(s: Supervision, now: Now, phase: str, stall: Stall | None) -> list[Any]:
    """The confirm window passed without progress: the worker is hung, as the kernel line said (``stall``: the tick's
    judgement of the stall under way)."""
    event = s.current.suspicion.event
    detail = (f"kernel {event.kind.value} ({event.pattern}) and no progress within "
              f"{s.config.kernel_log.confirm_window:.0f} s: {event.message[:300]}")
    return stopping.begin(s, now, Stop(Reason.KERNEL, phase, detail=detail, climb=True,
                                       failure=f"kernel:{event.kind.value}", kernel_events=(event,)),
                          Verdict(phase, detail, stall=stall))

