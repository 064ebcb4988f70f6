"""The supervisor's shell: one event loop that turns the world into events and carries out the core's actions.

It waits on file descriptors (the worker's heartbeat pipe, output and pidfd, the kernel sources, the signal
wake-up pipe) and on the watchdog's next deadline; it never polls with sleeps and runs no thread of its own.
Everything it decides, it asks ``core.decide``; the worker process, the state directory and the kernel sources
are modules of their own, and the agent only wires them to the core.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from supervisor.config import Config, ConfigError
from supervisor.decision import core
from supervisor.decision.incident import Incident, Stacks
from supervisor.decision.ladder import build_ladder
from supervisor.decision.signatures import scan
from supervisor.decision.vocabulary import STARTUP_PHASE, KernelKind, Reason
from supervisor.exit_codes import EXIT_FAILED
from supervisor.outputs import checkpoints, hosts, state_file, status_view
from supervisor.outputs.incidents import one_line, stacks_path
from supervisor.outputs.job_ladder import JobLadderFile
from supervisor.outputs.state_dir import StateDir, StateDirTaken
from supervisor.outputs.systemd_notify import Notifier, worker_environ
from supervisor.sources import process_tree, stacks
from supervisor.sources.gpu_metrics import sample_all
from supervisor.sources.kernel_log import KernelLogSource
from supervisor.sources.rendezvous import ENV_COLLECTIVE_TIMEOUT, rendezvous_of
from supervisor.sources.worker_command import OutputProgress, command_argv, newest_checkpoint
from supervisor.sources.worker_process import HeartbeatCounts, SpawnError, WorkerProcess, forward
from worker.contract import STANDBY_FLAG, LaunchRecord, Patches, RungSplit, split_rung
from worker.heartbeat import read_available

log = logging.getLogger("yolo-train")

STATUS_INTERVAL = 1.0  # seconds between state-file writes while only heartbeats change
# Fault drills and tests write GPU-lost lines to /dev/kmsg from user space; only with this set to 1 may such a
# line end a run, even one on the CPU (documented in the README). The kernel's own records need no switch.
KERNEL_DRILL = "YOLO_TRAIN_KERNEL_DRILL"
STALE_MARGIN = 5.0  # seconds: the kernel's printk clock and CLOCK_MONOTONIC drift apart a little
METRICS_RETRY = 30.0  # seconds between tries to listen on a busy metrics port
READ_INTERVAL = 0.2  # seconds a worker pipe rests after a read: far below any timeout, 5 wake-ups a second at most
PAUSE_GAP = 3.0  # seconds a select() may return late before the supervisor counts itself as having been paused


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.ladder = build_ladder(config.ladder, int(config.train.get("workers", 8)), command=config.command is not None,
                                   device=config.train.get("device"))
        self.s = core.Supervision(config, self.ladder)
        self.selector = selectors.DefaultSelector()
        self.state_dir = StateDir(config.state_dir, config.source, config.distributed.run_dir)
        self.job_ladder = JobLadderFile(self.state_dir.run_dir, config.distributed.node_rank) \
            if config.distributed.several_hosts else None
        self.worker: WorkerProcess | None = None
        self.standby: WorkerProcess | None = None  # imported and waiting to be the next attempt ([worker] standby)
        self.heartbeats = HeartbeatCounts()
        self.kernel_sources: list[KernelLogSource] = []
        # Pids of the worker's tree as last seen (refreshed with the state file): the kernel names an OOM victim
        # once it is dead, so "is this pid ours" must also look a little into the past.
        self.tree_pids: set[int] = set()
        self.exporter = None
        self.metrics_bind_failures = 0
        self._resting: dict[int, tuple[float, Any]] = {}  # worker pipes read a moment ago: fd -> (when again, callback)
        self._metrics_retry_at: float | None = None
        self.systemd = Notifier()
        self._watchdog_interval = self.systemd.watchdog_interval()
        self._watchdog_pinged = 0.0
        self._ready_sent = False
        self._status_written = 0.0
        self._hosts_view_failed = False
        self._started_mono = time.monotonic()  # kernel lines older than this are from before this supervisor

    # -- the loop --
    def run(self) -> int:
        self.state_dir.lock()
        self._start_exporter()
        process_tree.become_subreaper()
        self._catch_signals()
        record = self.state_dir.read_state()
        if record:
            self.s.restore(record)
        self._open_kernel_sources(record or {})
        self.handle(core.Boot())
        while self.s.exit is None:
            due = self.s.deadline()
            wake = min([due.at or math.inf, *(at for at, _ in self._resting.values())])
            timeout = max(0.0, min(STATUS_INTERVAL, wake - time.monotonic()))
            if self._metrics_retry_at is not None and time.monotonic() >= self._metrics_retry_at:
                self._start_exporter()
            before = time.monotonic()
            ready = self.selector.select(timeout)
            late = time.monotonic() - before - timeout
            if late > PAUSE_GAP:  # we were stopped or frozen ourselves: read what is queued before judging anyone
                self.handle(core.SupervisorPaused(late))
            for key, _ in ready:
                key.data(key.fileobj)
                if self.s.exit is not None:
                    break
            self._wake_rested()
            for source in self.kernel_sources:
                if source.needs_polling:  # a journal on a network file system
                    self._on_kernel(source)
            due = self.s.deadline()
            if self.s.exit is None and due.at is not None and time.monotonic() >= due.at:
                self._drain_worker()  # what is queued is read before anyone is judged
                due = self.s.deadline()
                if self.s.exit is None and due.at is not None and time.monotonic() >= due.at:
                    self.handle(core.Tick())  # only when a deadline is due: heartbeats alone never need one
            self._write_state(force=False)
            self._ping_systemd()
        if self.worker is not None:  # leaving with a worker still up: never leave it behind
            self._kill(None)
        self._discard_standby()
        self._write_state(force=True)
        for source in self.kernel_sources:
            source.close()
        self.systemd.stopping(self.s.exit.text)
        if self.exporter is not None:
            self.exporter.close()
        log.log(logging.INFO if self.s.exit.code == 0 else logging.ERROR, self.s.exit.text)
        return self.s.exit.code

    def _start_exporter(self) -> None:
        """Metrics are optional: a busy port is said once, retried every METRICS_RETRY seconds, and counted."""
        if not self.config.metrics_listen:
            return
        from supervisor.outputs.metrics import start_exporter

        try:
            self.exporter = start_exporter(self.config)  # serves between restarts too: it lives with us
        except ConfigError as e:
            if self.metrics_bind_failures == 0:
                log.warning(f"{e}; training goes on without metrics, retrying every {METRICS_RETRY:.0f} s")
            self.metrics_bind_failures += 1
            self._metrics_retry_at = time.monotonic() + METRICS_RETRY
            return
        self._metrics_retry_at = None
        host, _ = self.config.metrics_address  # the port bound, not the one asked for: port 0 picks a free one
        log.info(f"metrics: http://{host}:{self.exporter.port}/metrics"
                 + (f" (after {self.metrics_bind_failures} failed tries)" if self.metrics_bind_failures else ""))

    def now(self) -> core.Now:
        return core.Now(mono=time.monotonic(), wall=time.time())

    def handle(self, event: Any) -> None:
        if self.job_ladder is not None and not isinstance(event, (core.HeartbeatReceived, core.JobLadderRead)):
            decision = self.job_ladder.read_if_changed()  # another host's, before this event is judged
            if decision is not None:
                self.handle(decision)
        _, actions = core.decide(self.s, event, self.now())
        for action in actions:
            self._execute(action)
        if not isinstance(event, (core.HeartbeatReceived, core.Tick, core.IncidentEnriched)) or actions:
            self._write_state(force=True)

    def _execute(self, action: Any) -> None:
        if isinstance(action, core.Log):
            fields = {"RUNG": self.s.rung, "ATTEMPT": self.s.attempt, "EPOCH": self.s.progress.epoch,
                      "BATCH": self.s.progress.batch}
            if self.s.stop is not None and self.s.stop.incident is not None:
                fields["INCIDENT_ID"] = self.s.stop.incident.id  # journalctl INCIDENT_ID=... finds the story
            log.log(logging.getLevelName(action.level.upper()), action.text, extra=fields)
        elif isinstance(action, core.Spawn):
            self._spawn(action)
        elif isinstance(action, core.PrepareStandby):
            self._prepare_standby(action)
        elif isinstance(action, core.KillTree):
            self._kill(action.incident)
        elif isinstance(action, core.RecordIncident):
            self.state_dir.append_incident(action.incident.to_dict())
        elif isinstance(action, core.RequestCheckpoint):
            if self.worker is not None:
                # Our worker saves and exits on SIGUSR1; a command knows nothing of it (its default action would
                # kill it), so it gets the conventional SIGTERM and resumes from its own newest checkpoint.
                sig = signal.SIGTERM if self.config.command is not None else signal.SIGUSR1
                try:
                    os.kill(self.worker.pid, sig)
                except ProcessLookupError:
                    pass  # already gone: its exit is on its way through the pidfd
        elif isinstance(action, core.KeepVerifiedCopy):
            note = checkpoints.keep_verified_copy(self.state_dir.run_dir)
            if note:
                log.error(note)
        elif isinstance(action, core.PublishLadder):
            try:
                self.job_ladder.publish(action)
            except OSError as e:
                log.error(f"cannot write the job-wide ladder decision to {self.job_ladder.path} ({e.strerror}): the "
                          f"other hosts stay on their rung")
        elif isinstance(action, core.Exit):
            pass  # the loop ends on s.exit
        else:
            raise TypeError(f"unknown action {action!r}")

    # -- the worker --
    def _worker_env(self, rung: RungSplit) -> dict[str, str]:
        bounds = {ENV_COLLECTIVE_TIMEOUT: f"{self.config.distributed.collective_timeout:g}"}
        return {**worker_environ(os.environ), **bounds, **self.config.worker_env, **rung.env, "PYTHONUNBUFFERED": "1",
                "YOLO_OFFLINE": os.environ.get("YOLO_OFFLINE", "1")}

    def _spawn(self, action: core.Spawn) -> None:
        rung = split_rung(action.rung_settings)
        env = self._worker_env(rung)
        if self.config.command is not None:
            worker, resume = self._spawn_command(rung.args, env)
        else:
            worker, resume = self._spawn_ultralytics(action, rung, env)
        self.worker = worker
        self.selector.register(worker.heartbeat_fd, selectors.EVENT_READ, self._on_heartbeat)
        self.selector.register(worker.output_fd, selectors.EVENT_READ, self._on_output)
        self.selector.register(worker.pidfd, selectors.EVENT_READ, self._on_exit)
        self.handle(core.Spawned(worker.pid, resume, exit_0_finishes=self.config.command is not None))
        if not self._ready_sent:
            self._ready_sent = self.systemd.ready(f"worker pid {worker.pid} started, rung {action.rung}")

    def _spawn_command(self, args: dict[str, str], env: dict[str, str]) -> tuple[WorkerProcess, str | None]:
        cfg = self.config.command
        checkpoint = newest_checkpoint(cfg)
        if cfg.checkpoint is not None and checkpoint is None:
            log.info(f"[worker] checkpoint {cfg.checkpoint!r} matches nothing in {cfg.cwd or Path.cwd()}: the command "
                     f"starts from scratch")
        argv = command_argv(cfg, args, checkpoint)
        try:
            worker = WorkerProcess.spawn(argv, env, cfg.cwd)
        except SpawnError as e:
            raise ConfigError(f"{self.config.source}: [worker] command = {list(cfg.argv)!r}: cannot start "
                              f"{argv[0]!r} ({e.strerror}); give an executable on PATH or a path to one") from None
        worker.output_progress = OutputProgress(worker.pid, cfg.progress_regex)
        return worker, None if checkpoint is None else str(checkpoint)

    def _spawn_ultralytics(self, action: core.Spawn, rung: RungSplit, env: dict[str, str]
                           ) -> tuple[WorkerProcess, str | None]:
        resume, notes = checkpoints.choose_resume(self.state_dir.run_dir)
        for note in notes:
            log.error(note)
        run_dir = self.state_dir.run_dir
        record = LaunchRecord(
            attempt=action.attempt, rung=action.rung,
            train={**self.config.train, "project": str(run_dir.parent), "name": run_dir.name, "exist_ok": True},
            trainer_args=rung.trainer_args, options=rung.options,
            patches=Patches(conv_fallback=self.config.conv_fallback, amp_check=self.config.amp_check),
            resume=str(resume) if resume else None, checkpoint_every=action.checkpoint_every,
            faults=tuple(f.to_dict() for f in self.config.faults),
            fault_flag=str(self.state_dir.fault_flag(action.attempt)), supervisor_pid=os.getpid(),
            rendezvous=rendezvous_of(self.config))
        self.state_dir.launch_record.write_text(record.to_json())
        worker = self._launch_standby(env)
        if worker is None:
            worker = self._spawn_worker([str(self.state_dir.launch_record)], env)
        return worker, record.resume

    def _spawn_worker(self, argv: list[str], env: dict[str, str], standby: bool = False) -> WorkerProcess:
        python = self.config.worker_python or sys.executable
        try:
            return WorkerProcess.spawn([python, "-m", "worker", *argv], env, standby=standby)
        except SpawnError as e:
            raise ConfigError(f"[worker] python = {python!r}: cannot start the worker ({e.strerror})") from None

    # -- the standby worker --
    def _prepare_standby(self, action: core.PrepareStandby) -> None:
        env = self._worker_env(split_rung(action.rung_settings))
        if self.standby is not None and self.standby.env == env:
            return  # the one waiting serves the next attempt already
        self._discard_standby()
        try:
            self.standby = self._spawn_worker([STANDBY_FLAG], env, standby=True)
        except ConfigError as e:  # the worker itself started; a standby that cannot is only a slower restart
            log.warning(f"no standby worker: {e}")
            return
        self.selector.register(self.standby.pidfd, selectors.EVENT_READ, self._on_standby_exit)
        log.info(f"standby worker pid {self.standby.pid}: importing now, to start the next attempt without that")

    def _launch_standby(self, env: dict[str, str]) -> WorkerProcess | None:
        """The standby as this attempt's worker, told where its launch record is; None to start one cold: no
        standby, one that died or is stopped (SIGSTOP), or one made for another environment (the rung's variables
        are read at import)."""
        standby, self.standby = self.standby, None
        if standby is None:
            return None
        self._forget(standby.pidfd)
        why = ("made for another environment" if standby.env != env else "gone" if standby.popen.poll() is not None
               else "stopped: frozen by a signal or a debugger" if process_tree.stopped(standby.pid)
               else None if standby.launch(self.state_dir.launch_record) else "gone")
        if why is not None:
            log.info(f"standby worker pid {standby.pid} not used ({why}): starting cold")
            self._discard(standby)
            return None
        log.info(f"standby worker pid {standby.pid} takes the attempt: its imports are done")
        return standby

    def _discard_standby(self) -> None:
        standby, self.standby = self.standby, None
        if standby is not None:
            self._forget(standby.pidfd)
            self._discard(standby)

    def _discard(self, standby: WorkerProcess) -> None:
        """An idle standby holds no children and no device: killing it alone (not the supervisor's other
        children, as a worker's kill does with its orphans) is enough."""
        process_tree.kill_tree(standby.pid, 0.5, 5.0, keepalive=self._ping_systemd)
        standby.popen.poll()
        standby.close()

    def _on_standby_exit(self, _fd: int) -> None:
        standby, self.standby = self.standby, None
        self._forget(standby.pidfd)
        code = standby.popen.wait()
        tail = " | ".join(line for line in standby.read_output()[0][-3:])
        log.warning(f"standby worker pid {standby.pid} exited ({code}) before it was needed; the next attempt "
                    f"starts cold" + (f": {tail}" if tail else ""))
        standby.close()

    def _spare(self) -> tuple[int, ...]:
        """Pids a kill of the worker's tree and its orphans must leave alone."""
        return (self.standby.pid,) if self.standby is not None else ()

    def _rest(self, fd: int, callback) -> None:
        """Read a worker pipe at most every READ_INTERVAL: a bar redrawn 50 times a second, or fast batches, then
        cost one wake-up per interval instead of one each (the 1 MiB pipe holds far more than that meanwhile)."""
        if fd in self.selector.get_map():
            self.selector.unregister(fd)
            self._resting[fd] = (time.monotonic() + READ_INTERVAL, callback)

    def _wake_rested(self) -> None:
        now = time.monotonic()
        for fd, (at, callback) in list(self._resting.items()):
            if at <= now:
                del self._resting[fd]
                self.selector.register(fd, selectors.EVENT_READ, callback)

    def _drain_worker(self) -> None:
        worker = self.worker
        if worker is not None:
            self._on_heartbeat(worker.heartbeat_fd, rest=False)
        if self.worker is not None and self.worker is worker:
            self._on_output(worker.output_fd, rest=False)

    def _on_heartbeat(self, fd: int, rest: bool = True) -> None:
        worker = self.worker
        if worker is None or worker.closed:
            return
        messages, ended = worker.read_heartbeats(self.heartbeats)
        for message in messages:
            # A rank is known by its rank; any other sender may be the script a wrapper (./run.sh) started.
            in_tree = message.rank is None and message.pid != worker.pid and worker.in_tree(message.pid)
            if worker.output_progress is not None and (message.pid == worker.pid or in_tree):
                worker.output_progress = None  # the script speaks for itself: the precise path wins over its output
                log.info("the command sends heartbeats: progress is read from them, no longer from its output")
            self.handle(core.HeartbeatReceived(message, from_worker_tree=in_tree))
            if self.worker is not worker:
                return
        if ended:  # every writer is gone; the pidfd reports the exit
            self._forget(worker.heartbeat_fd)
        elif rest:
            self._rest(fd, self._on_heartbeat)

    def _on_output(self, fd: int, rest: bool = True) -> None:
        worker = self.worker
        if worker is None or worker.closed:
            return
        lines, progress, ended = worker.read_output()
        if ended:
            self._forget(worker.output_fd)
        elif rest:
            self._rest(fd, self._on_output)
        forward(lines)
        for line in lines:
            found = scan(line)
            if found is not None:
                self.handle(core.SignatureSeen(found.name, found.remedy, found.advice, line))
        for message in progress:
            self.handle(core.HeartbeatReceived(message))
            if self.worker is not worker:
                return

    def _forget(self, fd: int) -> None:
        self._resting.pop(fd, None)
        if fd in self.selector.get_map():
            self.selector.unregister(fd)

    def _on_exit(self, _fd: int) -> None:
        worker = self.worker
        returncode = worker.wait()
        self._on_heartbeat(worker.heartbeat_fd, rest=False)  # its last words arrive before its death is judged,
        self._on_output(worker.output_fd, rest=False)
        for source in self.kernel_sources:  # and so does the OOM killer's note on why it died
            self._on_kernel(source)
        self._forget(worker.pidfd)
        self.handle(core.WorkerExited(returncode, worker.output_tail[-1] if worker.output_tail else None))

    def _kill(self, incident: Incident | None) -> None:
        """Kill the worker's tree; for an incident, tell the core first what the tree looks like (None after a
        clean exit)."""
        worker, self.worker = self.worker, None
        if incident is not None:
            seen = self._what_the_tree_shows(worker, incident)
            self.handle(seen)
            if seen.stacks is not None:  # where it hung, in the journal before the kill's own lines
                log.info(one_line(self.s.stop.incident.to_dict()), extra={"INCIDENT_ID": incident.id})
        w = self.config.watchdog
        if worker is not None:
            for fd in worker.fds:
                self._forget(fd)
            report = worker.kill(w.kill_grace, w.kill_timeout, keepalive=self._ping_systemd, spare=self._spare())
        else:
            report = process_tree.kill_tree(None, w.kill_grace, w.kill_timeout, keepalive=self._ping_systemd,
                                            spare=self._spare())
        if incident is not None:
            log.info(f"killed {len(report.killed)} process(es) in {report.seconds:.2f} s",
                     extra={"INCIDENT_ID": incident.id, "RUNG": incident.rung, "EPOCH": incident.epoch,
                            "BATCH": incident.batch})
        self.handle(core.TreeKilled(len(report.killed), tuple(report.survivors), report.seconds, time.time()))

    def _what_the_tree_shows(self, worker: WorkerProcess | None, incident: Incident) -> core.IncidentEnriched:
        """The processes, the output tail and, for a hung tree, the stacks: only this moment, before the kill,
        can see them."""
        processes = (worker.tree_snapshot(self._spare()) if worker
                     else process_tree.snapshot(process_tree.tree(spare=self._spare())))
        if worker is None:
            return core.IncidentEnriched(incident.id, tuple(processes))
        never = worker.output_progress.never_seen() if worker.output_progress is not None else None
        if never and incident.phase == STARTUP_PHASE:
            log.error(f"{never}; its last lines: {' | '.join(list(worker.output_tail)[-3:])}")
        found = None
        if self.config.incidents.stacks and incident.reason in (Reason.HANG, Reason.KERNEL):
            found = self._capture_stacks(worker, incident, [p["pid"] for p in processes])
        host = socket.gethostname() if self.config.distributed.several_hosts else None
        return core.IncidentEnriched(incident.id, tuple(processes), tuple(worker.output_tail), never, found, host)

    def _capture_stacks(self, worker: WorkerProcess, incident: Incident, pids: list[int]) -> Stacks:
        """Where each process of the tree waits, before it is killed: bounded by [incidents] stacks_budget, never
        raises."""
        readers = self.exporter.gpu_readers if self.exporter is not None else []
        capture = stacks.capture_tree(
            worker.pid, pids, stacks_path(self.config.state_dir, incident.id).parent,
            budget=self.config.incidents.stacks_budget,
            gpu_sample=(lambda: [asdict(s) for s in sample_all(readers)]) if readers else None)
        return stacks.as_incident_stacks(capture, self.config.state_dir)

    # -- the kernel --
    def _open_kernel_sources(self, record: dict[str, Any]) -> None:
        from supervisor.sources.gpu_events import open_gpu_events
        from supervisor.sources.kernel_log import open_kernel_log
        from supervisor.sources.kernel_messages import Catalogue

        cfg = self.config.kernel_log
        position = record.get("kernel_log_position") or {}
        kernel_log, report = open_kernel_log(cfg.source, after_seq=position.get("seq"),
                                             catalogue=Catalogue(cfg.patterns), boot_id=position.get("boot_id"),
                                             after_cursor=position.get("cursor"))
        log.log(logging.WARNING if kernel_log is None and cfg.source != "off" else logging.INFO, report)
        gpu_events, report = open_gpu_events(cfg.gpu_events)
        log.info(report)
        for source in (kernel_log, gpu_events):
            if source is not None:
                self.kernel_sources.append(source)
                self.selector.register(source.fileno(), selectors.EVENT_READ,
                                       lambda _fd, source=source: self._on_kernel(source))

    def _on_kernel(self, source: KernelLogSource) -> None:
        events = source.read()
        if events:
            self._drain_worker()  # beats already queued came before the line: they must not pass for progress after it
        for event in events:
            in_tree = None
            if event.pid is not None:  # we are the tree's subreaper: every descendant is ours
                in_tree = event.pid in self.tree_pids or event.pid in {
                    p.pid for p in process_tree.tree(spare=self._spare())}
            stale = event.monotonic_us is not None and event.monotonic_us / 1e6 < self._started_mono - STALE_MARGIN
            self.handle(core.KernelMessage(kind=KernelKind(event.kind), message=event.message, source=event.source,
                                           pattern=event.pattern, pid=event.pid, in_worker_tree=in_tree,
                                           trusted=event.from_kernel and not stale,
                                           drill=os.environ.get(KERNEL_DRILL) == "1"))

    def kernel_log_position(self) -> dict[str, Any]:
        for source in self.kernel_sources:
            position = source.position()
            if position:
                return position
        return {}

    # -- signals and systemd --
    def _catch_signals(self) -> None:
        signal_r, signal_w = os.pipe()
        os.set_blocking(signal_w, False)
        os.set_blocking(signal_r, False)
        signal.set_wakeup_fd(signal_w)
        # The wake-up fd carries the signal number into the loop. SIGHUP is caught and ignored: a closed
        # terminal must not end a night of training.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        self.selector.register(signal_r, selectors.EVENT_READ, self._on_signal)

    def _on_signal(self, fd: int) -> None:
        for signum in read_available(fd) or b"":
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.systemd.stopping(f"stopping on {signal.Signals(signum).name}")
                self.handle(core.StopRequested(signal.Signals(signum).name))

    def status_line(self, status: dict[str, Any]) -> str:
        it_s = status.get("it_s")
        return (f"{status['state']}, epoch {status['epoch']}/{status['epochs']} batch {status['batch']}/"
                f"{status['batches']}, {f'{it_s:.2f}' if it_s else '-'} it/s, rung {status['rung']} "
                f"({status['rung_label']}), restarts {status['restarts']}")

    def _ping_systemd(self) -> None:
        if self._watchdog_interval and time.monotonic() - self._watchdog_pinged >= self._watchdog_interval:
            self._watchdog_pinged = time.monotonic()  # from the loop itself: a hung loop stops the pings
            self.systemd.watchdog()

    # -- state --
    def status(self) -> dict[str, Any]:
        now = self.now()
        return {**status_view.snapshot(self.s, now), "supervisor_pid": os.getpid(), "config": self.config.source,
                "state_dir": str(self.config.state_dir), "updated": now.wall,
                "heartbeats": dict(vars(self.heartbeats)), "metrics_bind_failures": self.metrics_bind_failures,
                "standby_pid": self.standby.pid if self.standby is not None else None,
                "checkpoint": str(checkpoints.weights_dir(self.state_dir.run_dir) / "last.pt")}

    def _write_state(self, force: bool) -> None:
        if not force and time.monotonic() - self._status_written < STATUS_INTERVAL:
            return
        self._status_written = time.monotonic()
        self.tree_pids = {p.pid for p in process_tree.tree(spare=self._spare())} if self.worker is not None else set()
        status = self.status()
        if self.exporter is not None:
            self.exporter.publish(status)
        self.systemd.status(self.status_line(status))
        try:
            self.state_dir.write_state({**self.s.persistent(time.monotonic()), "status": status,
                                        "kernel_log_position": self.kernel_log_position()})
        except StateDirTaken as e:  # raised once: nothing is written there after it
            self.handle(core.StateDirTaken(str(e)))
        if self.config.distributed.several_hosts:
            try:
                hosts.publish(self.state_dir.run_dir, self.config.distributed.node_rank, status)
            except OSError as e:
                if not self._hosts_view_failed:  # said once: it is retried every second
                    log.warning(f"cannot write this host's view to {self.state_dir.run_dir} ({e.strerror}): "
                                f"`status` on the other hosts does not show this one")
                self._hosts_view_failed = True


def run(config: Config) -> int:
    try:
        return Agent(config).run()
    except state_file.StateFileError as e:
        log.error(str(e))
        return EXIT_FAILED
