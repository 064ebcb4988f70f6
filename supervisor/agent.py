"""The supervisor's shell: one event loop that turns the world into events and carries out the core's actions.

It waits on file descriptors (the heartbeat pipe, the worker's output, a pidfd for its exit, the signal
wake-up pipe) and on the watchdog's next deadline; it never polls with sleeps and runs no thread of its
own. Everything it decides, it asks ``core.decide``.
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor import checkpoints, core, process_tree, signatures, state_file
from supervisor.systemd_notify import Notifier, worker_environ
from supervisor.config import Config, ConfigError
from supervisor.exit_codes import EXIT_FAILED
from supervisor.ladder import build_ladder
from worker.heartbeat import ENV_FD, Decoder, read_available

log = logging.getLogger("yolo-train")

STATUS_INTERVAL = 1.0  # seconds between state-file writes while only heartbeats change
OUTPUT_TAIL_LINES = 20  # of the worker's output, kept for the incident record


@dataclass
class WorkerHandle:
    """One running worker process and the descriptors the loop reads it through."""
    popen: subprocess.Popen
    pidfd: int
    heartbeat_fd: int
    output_fd: int
    decoder: Decoder = field(default_factory=Decoder)
    output_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))
    partial_line: bytes = b""


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.ladder = build_ladder(config.ladder, int(config.train.get("workers", 8)))
        self.s = core.Supervision(config, self.ladder)
        self.selector = selectors.DefaultSelector()
        self.worker: WorkerHandle | None = None
        self.run_dir = config.state_dir / "train"  # Ultralytics' save_dir: weights/last.pt lives here
        self.heartbeats = {"received": 0, "malformed": 0, "oversized": 0, "dropped": 0}
        self._status_written = 0.0
        self._write_failed = False
        self._lock_fd: int | None = None
        self.kernel_sources: list[Any] = []  # the kernel log and the GPU event monitor, each with fileno()/read()
        # Pids of the worker's tree as last seen (refreshed with the state file): the kernel names an OOM victim
        # once it is dead, so "is this pid ours" must also look a little into the past.
        self.tree_pids: set[int] = set()
        self.exporter = None
        self.systemd = Notifier()
        self._watchdog_interval = self.systemd.watchdog_interval()
        self._watchdog_pinged = 0.0
        self._ready_sent = False

    # -- the loop --
    def run(self) -> int:
        self._lock_state_dir()
        if self.config.metrics_listen:
            from supervisor.metrics import start_exporter

            self.exporter = start_exporter(self.config)  # serves between restarts too: it lives with us
            log.info(f"metrics: http://{self.config.metrics_listen}/metrics")
        process_tree.become_subreaper()
        signal_r, signal_w = os.pipe()
        os.set_blocking(signal_w, False)
        os.set_blocking(signal_r, False)
        signal.set_wakeup_fd(signal_w)
        # The wake-up fd carries the signal number into the loop. SIGHUP is caught and ignored: a closed
        # terminal must not end a night of training.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        self.selector.register(signal_r, selectors.EVENT_READ, self._on_signal)
        record = state_file.read(self.config.state_dir)
        if record:
            self.s.restore(record)
        self._open_kernel_sources(record or {})
        self.handle(core.Boot())
        while self.s.exit is None:
            at, _ = self.s.deadline()
            timeout = STATUS_INTERVAL if at is None else max(0.0, min(STATUS_INTERVAL, at - time.monotonic()))
            for key, _ in self.selector.select(timeout):
                key.data(key.fileobj)
                if self.s.exit is not None:
                    break
            for source in self.kernel_sources:
                if getattr(source, "needs_polling", False):  # a journal on a network file system
                    self._on_kernel(source)
            at, _ = self.s.deadline()
            if self.s.exit is None and at is not None and time.monotonic() >= at:
                self.handle(core.Tick())  # only when a deadline is due: heartbeats alone never need one
            self._write_state(force=False)
            self._ping_systemd()
        if self.worker is not None:  # leaving with a worker still up: never leave it behind
            self._kill(None)
        self._write_state(force=True)
        for source in self.kernel_sources:
            source.close()
        self.systemd.stopping(self.s.exit.text)
        if self.exporter is not None:
            self.exporter.close()
        level = logging.INFO if self.s.exit.code == 0 else logging.ERROR
        log.log(level, self.s.exit.text)
        return self.s.exit.code

    def now(self) -> core.Now:
        return core.Now(mono=time.monotonic(), wall=time.time())

    def handle(self, event: Any) -> None:
        _, actions = core.decide(self.s, event, self.now())
        for action in actions:
            self._execute(action)
        if not isinstance(event, (core.Heartbeat, core.Tick)) or actions:
            self._write_state(force=True)

    def _execute(self, action: Any) -> None:
        if isinstance(action, core.Log):
            fields = {"RUNG": self.s.rung, "ATTEMPT": self.s.attempt, "EPOCH": self.s.progress.epoch,
                      "BATCH": self.s.progress.batch}
            if self.s.incidents and self.s.state == core.State.STOPPING:
                fields["INCIDENT_ID"] = self.s.incidents[-1]["id"]  # journalctl INCIDENT_ID=... finds the story
            log.log(logging.getLevelName(action.level.upper()), action.text, extra=fields)
        elif isinstance(action, core.Spawn):
            self._spawn(action)
        elif isinstance(action, core.KillTree):
            self._kill(action.incident)
        elif isinstance(action, core.RequestCheckpoint):
            if self.worker is not None:
                try:
                    os.kill(self.worker.popen.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass  # already gone: its exit is on its way through the pidfd
        elif isinstance(action, core.Exit):
            pass  # the loop ends on s.exit
        else:
            raise TypeError(f"unknown action {action!r}")

    # -- spawning --
    def _spawn(self, action: core.Spawn) -> None:
        resume, notes = checkpoints.choose_resume(self.run_dir)
        for note in notes:
            log.error(note)
        state_dir = self.config.state_dir
        settings = {
            "attempt": action.attempt,
            "rung": action.rung,
            "train": {**self.config.train, "project": str(state_dir), "name": self.run_dir.name, "exist_ok": True},
            "overrides": {k: v for k, v in action.settings.items() if k != "env"},  # env goes to the environment
            "patches": {"conv_fallback": self.config.conv_fallback, "amp_check": self.config.amp_check},
            "resume": str(resume) if resume else None,
            "faults": [f.to_dict() for f in self.config.faults],
            "fault_flag": str(state_dir / f"attempt-{action.attempt}.fault"),
            "supervisor_pid": os.getpid(),
        }
        settings_path = state_dir / "worker-settings.json"
        settings_path.write_text(json.dumps(settings, indent=1))
        heartbeat_r, heartbeat_w = os.pipe()
        output_r, output_w = os.pipe()
        env = {**worker_environ(os.environ), **self.config.worker_env, **action.settings.get("env", {}),
               ENV_FD: str(heartbeat_w), "PYTHONUNBUFFERED": "1",
               "YOLO_OFFLINE": os.environ.get("YOLO_OFFLINE", "1")}
        python = self.config.worker_python or sys.executable
        try:
            popen = subprocess.Popen([python, "-m", "worker", str(settings_path)], pass_fds=(heartbeat_w,),
                                     stdin=subprocess.DEVNULL, stdout=output_w, stderr=output_w, env=env,
                                     start_new_session=True)
        except OSError as e:
            for fd in (heartbeat_r, heartbeat_w, output_r, output_w):
                os.close(fd)
            raise ConfigError(f"[worker] python = {python!r}: cannot start the worker ({e.strerror})") from None
        os.close(heartbeat_w)
        os.close(output_w)
        for fd in (heartbeat_r, output_r):
            os.set_blocking(fd, False)
        self.worker = WorkerHandle(popen, os.pidfd_open(popen.pid), heartbeat_r, output_r)
        self.selector.register(heartbeat_r, selectors.EVENT_READ, self._on_heartbeat)
        self.selector.register(output_r, selectors.EVENT_READ, self._on_output)
        self.selector.register(self.worker.pidfd, selectors.EVENT_READ, self._on_exit)
        self.handle(core.Spawned(popen.pid, str(resume) if resume else None))
        if not self._ready_sent:
            self._ready_sent = self.systemd.ready(f"worker pid {popen.pid} started, rung {action.rung}")

    # -- reading the worker --
    def _on_heartbeat(self, fd: int) -> None:
        worker = self.worker
        if worker is None:
            return
        data = read_available(fd)
        messages = worker.decoder.feed(data) if data else []
        self.heartbeats["malformed"] += worker.decoder.malformed
        self.heartbeats["oversized"] += worker.decoder.oversized
        worker.decoder.malformed = worker.decoder.oversized = 0
        self.heartbeats["received"] += len(messages)
        for message in messages:
            if isinstance(message.get("dropped"), int) and message.get("pid") == worker.popen.pid:
                self.heartbeats["dropped"] = max(self.heartbeats["dropped"], message["dropped"])
            self.handle(core.Heartbeat(message))
            if self.worker is not worker:
                return
        if data == b"":  # EOF: every writer is gone; the pidfd reports the exit
            self._forget(fd)

    def _on_output(self, fd: int) -> None:
        """Forward the worker's output line by line, each line as a terminal would end up showing it
        (the text after its last carriage return), so progress bars do not swallow our own log lines."""
        data = read_available(fd)
        worker = self.worker
        if data == b"":
            self._forget(fd)
        if not data or worker is None:
            return
        worker.partial_line += data
        *lines, worker.partial_line = worker.partial_line.split(b"\n")
        shown = [line.rsplit(b"\r", 1)[-1] for line in lines]
        shown = [line for line in shown if line.strip()]
        for line in shown:
            text = line.decode(errors="replace")
            worker.output_tail.append(text)
            found = signatures.scan(text)
            if found is not None:
                self.handle(core.SignatureSeen(found.name, found.remedy, found.advice, text))
        try:
            sys.stderr.buffer.write(b"".join(line + b"\n" for line in shown))
            sys.stderr.buffer.flush()
        except (OSError, ValueError):
            pass  # our own stderr gone: the worker must not notice

    def _forget(self, fd: int) -> None:
        if fd in self.selector.get_map():
            self.selector.unregister(fd)

    def _on_exit(self, _fd: int) -> None:
        worker = self.worker
        returncode = worker.popen.wait()
        self._on_heartbeat(worker.heartbeat_fd)  # its last words arrive before its death is judged,
        self._on_output(worker.output_fd)
        for source in self.kernel_sources:  # and so does the OOM killer's note on why it died
            self._on_kernel(source)
        self._forget(worker.pidfd)
        self.handle(core.WorkerExited(returncode))

    # -- the kernel --
    def _open_kernel_sources(self, record: dict[str, Any]) -> None:
        from supervisor.gpu_events import open_gpu_events
        from supervisor.kernel_log import open_kernel_log
        from supervisor.kernel_messages import Catalogue

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

    def _on_kernel(self, source: Any) -> None:
        for event in source.read():
            in_tree = None
            if event.pid is not None:  # we are the tree's subreaper: every descendant is ours
                in_tree = event.pid in self.tree_pids or event.pid in {p.pid for p in process_tree.tree()}
            self.handle(core.KernelMessage(kind=event.kind, message=event.message, source=event.source,
                                           pattern=event.pattern, pid=event.pid, in_worker_tree=in_tree))

    def kernel_log_position(self) -> dict[str, Any]:
        for source in self.kernel_sources:
            if getattr(source, "name", "") == "kmsg":
                return {"seq": source.last_seq, "boot_id": source.boot_id}
            if getattr(source, "name", "") == "journal":
                return {"cursor": source.last_cursor}
        return {}

    def _on_signal(self, fd: int) -> None:
        for signum in read_available(fd) or b"":
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.systemd.stopping(f"stopping on {signal.Signals(signum).name}")
                self.handle(core.StopRequested(signal.Signals(signum).name))

    # -- systemd --
    def status_line(self, status: dict[str, Any]) -> str:
        it_s = status.get("it_s")
        return (f"{status['state']}, epoch {status['epoch']}/{status['epochs']} batch {status['batch']}/"
                f"{status['batches']}, {f'{it_s:.2f}' if it_s else '-'} it/s, rung {status['rung']} "
                f"({status['rung_label']}), restarts {status['restarts']}")

    def _ping_systemd(self) -> None:
        if self._watchdog_interval and time.monotonic() - self._watchdog_pinged >= self._watchdog_interval:
            self._watchdog_pinged = time.monotonic()  # from the loop itself: a hung loop stops the pings
            self.systemd.watchdog()

    # -- killing --
    def _kill(self, incident: dict[str, Any] | None) -> None:
        worker, self.worker = self.worker, None
        root = worker.popen.pid if worker else None
        if incident is not None:
            members = process_tree.tree(root) + process_tree.tree() if root else process_tree.tree()
            incident["time_iso"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(incident["time"]))
            incident["processes"] = process_tree.snapshot(list({p.pid: p for p in members}.values()))
            if worker:
                incident["output_tail"] = list(worker.output_tail)
            incident["last_error"] = self.s.last_error
            incident["settings"] = self.s.settings  # what the worker reported in force: the rung's proof
        w = self.config.watchdog
        report = process_tree.kill_tree(root, w.kill_grace, w.kill_timeout, adopt_orphans=True)
        if worker:
            if worker.popen.returncode is None:
                try:
                    worker.popen.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            for fd in (worker.pidfd, worker.heartbeat_fd, worker.output_fd):
                self._forget(fd)
                os.close(fd)
        if incident is not None:
            incident["kill"] = {"processes": len(report.killed), "seconds": round(report.seconds, 3),
                                "survivors": report.survivors, "confirmed_wall": time.time()}
            log.info(f"killed {len(report.killed)} process(es) in {report.seconds:.2f} s",
                     extra={"INCIDENT_ID": incident["id"], "RUNG": incident["rung"], "EPOCH": incident["epoch"],
                            "BATCH": incident["batch"]})
            self._append_incident(incident)
        self.handle(core.TreeKilled(len(report.killed), tuple(report.survivors)))

    # -- persistence --
    def status(self) -> dict[str, Any]:
        now = self.now()
        return {**core.snapshot(self.s, now), "supervisor_pid": os.getpid(), "config": self.config.source,
                "state_dir": str(self.config.state_dir), "updated": now.wall, "heartbeats": dict(self.heartbeats),
                "checkpoint": str(checkpoints.weights_dir(self.run_dir) / "last.pt")}

    def _write_state(self, force: bool) -> None:
        if not force and time.monotonic() - self._status_written < STATUS_INTERVAL:
            return
        self._status_written = time.monotonic()
        self.tree_pids = {p.pid for p in process_tree.tree()} if self.worker is not None else set()
        status = self.status()
        if self.exporter is not None:
            self.exporter.publish(status)
        self.systemd.status(self.status_line(status))
        try:
            state_file.write(self.config.state_dir, {**self.s.persistent(), "status": status,
                                                     "kernel_log_position": self.kernel_log_position()})
            self._write_failed = False
        except OSError as e:
            if not self._write_failed:  # say it once, keep supervising: the previous file stays intact
                log.error(f"{state_file.path_in(self.config.state_dir)}: cannot write state ({e.strerror}); "
                          f"free disk space in {self.config.state_dir}")
            self._write_failed = True

    def _append_incident(self, incident: dict[str, Any]) -> None:
        try:
            with open(self.config.state_dir / "incidents.jsonl", "a") as f:
                f.write(json.dumps(incident, default=str) + "\n")
        except OSError as e:
            log.error(f"{self.config.state_dir / 'incidents.jsonl'}: cannot record incident {incident['id']} "
                      f"({e.strerror}); free disk space")

    def _lock_state_dir(self) -> None:
        try:
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.config.source}: state_dir {self.config.state_dir}: cannot create "
                              f"({e.strerror}); choose a writable directory") from None
        lock = self.config.state_dir / "supervisor.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode().strip() or "?"
            os.close(fd)
            raise ConfigError(f"{self.config.source}: state_dir {self.config.state_dir} is in use by another "
                              f"supervisor (pid {other}); stop it or choose another state_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd


def run(config: Config) -> int:
    try:
        return Agent(config).run()
    except state_file.StateFileError as e:
        log.error(str(e))
        return EXIT_FAILED
