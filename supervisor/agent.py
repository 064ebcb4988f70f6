"""The supervisor's shell: one event loop that turns the world into events and carries out the core's actions.

It waits on file descriptors (the worker's heartbeat pipe, output and pidfd, the kernel sources, the signal
wake-up pipe) and on the watchdog's next deadline; it never polls with sleeps and runs no thread of its own.
Everything it decides, it asks ``decision.decide``. What it reads and what it carries out are modules of their own,
which the agent owns and wires to the core: the worker's spawn (``worker_spawn``), the standby worker, the worker's
pipes and its tree's activity (``worker_pipes``), what a killed tree shows (``incident_evidence``), its kill
(``tree_kill``), the in-place recovery tier's actions (``attempt.loader_workers``), the kernel sources, the signals;
the state directory, the other hosts' shared records (``job_ladder``), the metrics endpoint and where the status
goes (``status_writer``).
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable

from supervisor import decision
from supervisor.attempt import loader_workers
from supervisor.attempt.incident_evidence import drop_ahead, keep_devcoredumps, read_ahead, what_the_tree_shows
from supervisor.attempt.read_throttle import ReadThrottle
from supervisor.attempt.standby_worker import Standby
from supervisor.attempt.tree_kill import TreeKill
from supervisor.attempt.worker_command import resume_point
from supervisor.attempt.worker_pipes import WorkerPipes
from supervisor.attempt.worker_spawn import WorkerSpawner
from supervisor.config import Config
from supervisor.decision import Incident
from supervisor.exit_codes import EXIT_FAILED
from supervisor.host import process_tree
from supervisor.host.signals import catch_signals, stop_requests
from supervisor.host.torch_build import ladder_for, miopen_run_for
from supervisor.kernel.reader import KernelLogSource
from supervisor.kernel.sources import KernelSources
from supervisor.state import checkpoints, state_file
from supervisor.state.history import History, gpu_readings
from supervisor.state.job_ladder import JobFiles
from supervisor.state.state_dir import StateDir
from supervisor.telemetry.metrics_endpoint import MetricsEndpoint
from supervisor.telemetry.notify_command import NotifyCommand
from supervisor.telemetry.status_writer import StatusWriter
from supervisor.telemetry.systemd_notify import Notifier
from supervisor.vocabulary import WorkerStart

log = logging.getLogger("yolo-train")

STATUS_INTERVAL = 1.0  # seconds between state-file writes while only heartbeats change
PAUSE_GAP = 3.0  # seconds a select() may return late before the supervisor counts itself as having been paused
# (counted around the wait alone: a stop that lands while a decision is handled goes unseen)


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.ladder, self.miopen = ladder_for(config), miopen_run_for(config)
        self.s = decision.Supervision(config, self.ladder, miopen=self.miopen)
        self.selector = selectors.DefaultSelector()
        self.state_dir = StateDir(config.state_dir, config.source, config.distributed.run_dir)
        self.job_files = JobFiles(self.state_dir.run_dir, config.distributed)
        self.systemd = Notifier()
        self.reads = ReadThrottle(self.selector)
        self.pipes = WorkerPipes(self.selector, self.reads, self.handle, self._read_kernel, self.state_dir.run_dir,
                                 self.s.kind.reads_launch_record)
        self.tree_kill = TreeKill(config, self.selector, self.handle, self.systemd.keepalive)
        self.spawner = WorkerSpawner(config, self.state_dir, self.s.kind)
        self.standby = Standby(self.selector, self.reads, self.spawner, keepalive=self.systemd.keepalive)
        self.kernel = KernelSources(config.kernel_log)
        self.metrics = MetricsEndpoint(config)
        self.status_writer = StatusWriter(config, self.state_dir, self.metrics, self.systemd)
        self.history = History(config.state_dir)
        self.notify = NotifyCommand(config.notify, config.name, config.state_dir)
        self.pending: deque[Any] = deque()  # events waiting for the decision under way to be carried out
        self._deciding = False
        self._ready_sent = False
        self._status_written = 0.0

    # -- the loop --
    def run(self) -> int:
        self.state_dir.lock()
        if self.state_dir.listener is not None:  # a second supervisor reads our credentials on it (SO_PEERCRED)
            self.selector.register(self.state_dir.listener, selectors.EVENT_READ,
                                   lambda _sock: self.state_dir.answer_probes())
        self.metrics.start()
        process_tree.become_subreaper()
        self.selector.register(catch_signals(), selectors.EVENT_READ, self._on_signal)
        record = self.state_dir.read_state(self._restore, None if self.config.command is None else
                                       lambda: resume_point(self.config.command))
        for source in self.kernel.open((record or {}).get("kernel_log_position") or {}):
            self.selector.register(source.fileno(), selectors.EVENT_READ, lambda _fd, s=source: self._on_kernel(s))
        self.handle(decision.Boot())
        while self.s.exit is None:
            due = self.s.watch.wake  # what the last decision left to watch: nothing here judges the stall again
            wake = min(due.at or math.inf, self.reads.next_wake(), self.pipes.next_sample(self.s.watch.tree_from))
            timeout = max(0.0, min(STATUS_INTERVAL, wake - time.monotonic()))
            self.metrics.retry_if_due()
            before = time.monotonic()
            ready = self.selector.select(timeout)
            late = time.monotonic() - before - timeout
            if late > PAUSE_GAP:  # we were stopped or frozen ourselves: read what is queued before judging anyone
                self.handle(decision.SupervisorPaused(late))
            for key, _ in ready:
                key.data(key.fileobj)
                if self.s.exit is not None:
                    break
            self.reads.wake_due()
            for source in self.kernel.polled():
                self._on_kernel(source)
            self.pipes.sample_tree(self.s.watch.tree_from, time.monotonic(), self._spare,
                                     lambda: decision.counted_threads(self.s))
            due = self.s.watch.wake
            if self.s.exit is None and due.at is not None and time.monotonic() >= due.at:
                self.pipes.drain()  # what is queued is read before anyone is judged
                due = self.s.watch.wake
                if self.s.exit is None and due.at is not None and time.monotonic() >= due.at:
                    self.handle(decision.Tick())  # only when a deadline is due: heartbeats alone never need one
            self._write_state(force=False)
            self.notify.poll()
            self.systemd.keepalive()
        if self.pipes.worker is not None:  # leaving with a worker still up: never leave it behind
            self._kill(None)
        self.standby.discard()
        self._write_state(force=True, final=True)
        self.history.close()
        self.kernel.close()
        self.systemd.stopping(self.s.exit.text)
        self.metrics.close()
        log.log(logging.INFO if self.s.exit.code == 0 else logging.ERROR, self.s.exit.text)
        self.notify.close(self.systemd.keepalive)  # the last notices get their time (bounded by [notify] timeout)
        return self.s.exit.code

    def _restore(self, record: dict[str, Any]) -> None:
        """The state file's record into a fresh Supervision, taken only whole: a file found corrupt halfway (moved
        aside by read_state) leaves the run at rung 0, not half restored."""
        restored = decision.Supervision(self.config, self.ladder, miopen=self.miopen)
        decision.restore(restored, record)
        self.s = restored

    def now(self) -> decision.Now:
        return decision.Now(mono=time.monotonic(), wall=time.time())

    def handle(self, event: Any) -> None:
        """Decide ``event``, then every event that carrying out its actions brings (the tree's evidence, its kill, a
        spawn), one at a time and in order: each decision's actions finish before the next event is decided."""
        self.pending.append(event)
        if self._deciding:
            return  # an action of the decision under way sent it: it waits its turn
        self._deciding = True
        try:
            while self.pending:
                self._decide(self.pending.popleft())
        finally:
            self._deciding = False

    def _decide(self, event: Any) -> None:
        news = self.job_files.news_before(event)
        if news:  # another host's decision, judged before this event
            self.pending.extendleft(reversed([*news, event]))
            return
        state_before, rung_before, now = self.s.state, self.s.rung, self.now()
        _, actions = decision.decide(self.s, event, now)
        told = decision.derive(self.s, state_before, rung_before, actions, now.wall)
        for action in actions:
            self._execute(action)
        for notice in told:
            self.notify.tell(notice)
        if not isinstance(event, (decision.HeartbeatReceived, decision.Tick, decision.IncidentEnriched)) or actions:
            self._write_state(force=True)

    def _execute(self, action: Any) -> None:
        carry_out = CARRY_OUT.get(type(action))
        if carry_out is None:
            raise TypeError(f"unknown action {action!r}")
        carry_out(self, action)

    def _log(self, action: Any) -> None:
        fields = {"RUNG": self.s.rung, "ATTEMPT": self.s.attempt, "EPOCH": self.s.progress.epoch,
                  "BATCH": self.s.progress.batch}
        if self.s.stop is not None and self.s.stop.incident is not None:
            fields["INCIDENT_ID"] = self.s.stop.incident.id  # journalctl INCIDENT_ID=... finds the story
        log.log(logging.getLevelName(action.level.upper()), action.text, extra=fields)

    def _read_ahead(self, action: Any) -> None:
        answer = read_ahead(self.config, self.pipes.worker, action, self._spare(), self.metrics.gpu_readers)
        self.pipes.drain()  # what the worker said while its stacks were read is decided before them
        self._tell(answer)

    def _loader_workers(self, action: Any) -> None:
        """The in-place tier's action; what the worker said meanwhile (a stacks' reading takes seconds) is decided
        before its answer: progress then drops the verdict."""
        answer = loader_workers.carry_out(action, self.config, self.pipes.worker, self._spare(),
                                          self.metrics.gpu_readers, self.systemd.keepalive)
        self.pipes.drain()
        self.handle(answer)

    def _tell(self, answer: Any) -> None:
        if answer is not None:  # None: the action found nothing to tell
            self.handle(answer)

    def _keep_verified_copy(self) -> None:
        self.handle(decision.VerifiedCopyKept(checkpoints.keep_verified_copy(self.state_dir.run_dir)))

    # -- the worker --
    def _spawn(self, action: decision.Spawn) -> None:
        self.standby.took = WorkerStart.COLD  # unless its launch takes the standby
        worker, resume = self.spawner.attempt(action, standby=self.standby.launch)
        self.pipes.attach(worker)
        self.handle(decision.Spawned(worker.pid, resume, start=self.standby.took, start_why=self.standby.refused))
        if not self._ready_sent:
            self._ready_sent = self.systemd.ready(f"worker pid {worker.pid} started, rung {action.rung}")

    def _kill(self, incident: Incident | None) -> None:
        """Kill the worker's tree; for an incident, tell the core first what the tree looks like (None after a
        clean exit)."""
        worker = self.pipes.detach()
        if incident is not None:
            self.handle(what_the_tree_shows(self.config, worker, incident, self._spare(), self.metrics.gpu_readers,
                                            tuple(self.s.current.loaders),
                                            {v.pid: r for r, v in self.s.current.ranks.items()}))
        self.tree_kill.kill(worker, incident, self._spare())

    def _spare(self) -> tuple[int, ...]:
        """Children of the supervisor a kill of the worker's tree leaves alone: the standby, the notify commands."""
        return self.standby.spare() + self.notify.pids()

    # -- the kernel --
    def _read_kernel(self) -> None:
        for source in self.kernel.sources:
            self._on_kernel(source)

    def _on_kernel(self, source: KernelLogSource) -> None:
        events = source.read()
        if events:
            self.pipes.drain()  # beats already queued came before the line: they must not pass for progress after it
        for event in events:
            self.handle(self.kernel.message(event, spare=self._spare()))

    # -- signals --
    def _on_signal(self, fd: int) -> None:
        for name in stop_requests(fd):
            self.systemd.stopping(f"stopping on {name}")
            self.handle(decision.StopRequested(name))

    # -- state --
    def status(self) -> decision.Status:
        now = self.now()
        return replace(decision.snapshot(self.s, now), supervisor=decision.Supervisor(
            supervisor_pid=os.getpid(), config=self.config.source, state_dir=str(self.config.state_dir),
            updated=now.wall,
            heartbeats=decision.Heartbeats(**vars(self.pipes.heartbeats), ignored=self.s.messages_ignored),
            metrics_bind_failures=self.metrics.bind_failures, **self.standby.shown(),
            run_dir=str(self.state_dir.run_dir) if self.config.distributed.several_hosts else None,
            checkpoint=str(self.state_dir.last_checkpoint)))

    def _write_state(self, force: bool, final: bool = False) -> None:
        if not force and time.monotonic() - self._status_written < STATUS_INTERVAL:
            return
        self._status_written = time.monotonic()
        self.kernel.remember_tree(self.pipes.worker is not None, spare=self._spare())
        status = self.status()
        shown = status.to_dict()  # the status's JSON form: the state file's and the history's
        self.status_writer.write(status, {**self.s.persistent(time.monotonic()), "status": shown,
                                          "kernel_log_position": self.kernel.position()},
                                 on_taken=lambda e: self.handle(decision.StateDirTaken(str(e))), final=final)
        if self.state_dir.taken is None and self.history.due(shown):
            self.history.record(shown, gpu_readings(self.metrics.gpu_readers))


def run(config: Config) -> int:
    try:
        return Agent(config).run()
    except state_file.StateFileError as e:
        log.error(str(e))
        return EXIT_FAILED


# Each action of the core and how the agent carries it out: the one place an action is routed. A recovery tier's own
# actions go to its shell module (the in-place tier's: attempt/loader_workers.py).
CARRY_OUT: dict[type, Callable[[Agent, Any], None]] = {
    decision.Log: lambda a, x: a._log(x),
    decision.Spawn: lambda a, x: a._spawn(x),
    decision.PrepareStandby: lambda a, x: a.standby.prepare(a.spawner.env(x.rung_settings), x.held),
    decision.PrimeStandby: lambda a, x: a.standby.prime(checkpoints.weights_in(a.state_dir.run_dir) / "last.pt"),
    decision.KillTree: lambda a, x: a._kill(x.incident),
    **{kind: lambda a, x: a._loader_workers(x) for kind in loader_workers.ACTIONS},
    decision.ReadStacksAhead: lambda a, x: a._read_ahead(x),
    decision.DropStacksAhead: lambda a, x: drop_ahead(a.config, a.pipes.worker, x),
    decision.AwaitSurvivors: lambda a, x: a.tree_kill.await_survivors(x.pids),
    decision.RecordIncident: lambda a, x: a.state_dir.append_incident(x.incident.to_dict()),
    decision.IncidentResumed: lambda a, x: None,  # the notice is derived from it; the record comes later
    decision.KeepDevcoredumps: lambda a, x: a._tell(keep_devcoredumps(a.config, x)),
    decision.RequestCheckpoint: lambda a, x: a.pipes.worker and a.pipes.worker.request_checkpoint(),
    decision.KeepVerifiedCopy: lambda a, x: a._keep_verified_copy(),
    decision.PublishLadder: lambda a, x: a.job_files.publish_ladder(x),
    decision.PublishCheckpoint: lambda a, x: a.job_files.publish_checkpoint(x),
    decision.Exit: lambda a, x: None,  # the loop ends on s.exit
}
