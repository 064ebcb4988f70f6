"""The standby worker ([worker] standby): the next attempt's worker, started while this one trains so that its
imports are done when a restart comes; told what to train through its stdin (``WorkerProcess.launch``).

At most one waits. A kill of the worker's tree spares it (``spare``); it serves only an attempt in the environment
it was made for (a rung's variables are read at import); one that died, or is stopped, or holds datasets the files on
disk no longer match (files added, removed or renamed since it read them: their count and their directories' newest
mtime, ``DataFiles``), is discarded and the attempt starts cold, saying why. Its exit is watched on its pidfd, in the
agent's selector. A ready one says what it holds in its report (``StandbyReport``), which status shows.
"""

from __future__ import annotations

import logging
import selectors
from pathlib import Path
from typing import Any, Callable

from supervisor.attempt.read_throttle import ReadThrottle
from supervisor.attempt.ready_room import Room, room
from supervisor.attempt.worker_process import WorkerProcess
from supervisor.attempt.worker_spawn import WorkerSpawner
from supervisor.config import ConfigError
from supervisor.host import process_tree
from supervisor.vocabulary import WorkerStart
from worker.wire.contract import (ENV_FORKSERVER, ENV_RANK_STANDBY, ENV_READY, HELD_LOADER_WORKERS, STANDBY_FLAG,
                                  StandbyReport, split_rung)

log = logging.getLogger("yolo-train")


def serves(made_for: dict[str, str], wanted: dict[str, str]) -> bool:
    """A standby made in ``made_for`` can be a launch in ``wanted``: the same environment, but for whether the
    standby started a forkserver or was made ready while it waited (neither is read at import: a launch whose rung
    forks its loader workers from one starts it if none runs, and one that runs idle is no harm; a held model that is
    not the launch's is dropped there, worker/standby/ready.py)."""
    def imported(env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k not in (ENV_FORKSERVER, ENV_READY)}
    return imported(made_for) == imported(wanted)


def covers(made_for: dict[str, str], wanted: dict[str, str]) -> bool:
    """A standby made in ``made_for`` is as good as a new one made in ``wanted``: it serves, and started the
    forkserver ahead if ``wanted`` asks for one (one it started that is not wanted costs nothing to keep)."""
    return serves(made_for, wanted) and (made_for.get(ENV_FORKSERVER) == "1" or wanted.get(ENV_FORKSERVER) != "1")


def stale(report: StandbyReport | None) -> str | None:
    """Why the datasets a ready standby built (or is building) are not the files on disk now; None: they are, or it
    holds none. Read before its launch: a stale file list crashes the attempt's loader workers on a missing file."""
    changed = [c for c in (d.changed() for d in (report.data if report is not None else ())) if c]
    return f"its datasets no longer match the files on disk ({'; '.join(changed)})" if changed else None


class Standby:
    def __init__(self, selector: selectors.BaseSelector, reads: ReadThrottle, spawner: WorkerSpawner,
                 keepalive: Callable[[], None]):
        self.selector = selector
        self.reads = reads
        self.spawner = spawner
        self.keepalive = keepalive  # called while a kill waits: the agent pings systemd's watchdog from it
        self.process: WorkerProcess | None = None  # imported and waiting to be the next attempt
        self.room: Room | None = None  # the kind of the one waiting, and why
        self.took = WorkerStart.COLD  # how the last launch's worker came: cold, or the kind of standby it took
        self.refused: str | None = None  # why the last launch started cold where a standby waited

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def spare(self) -> tuple[int, ...]:
        """Pids a kill of the worker's tree and its orphans must leave alone."""
        return (self.process.pid,) if self.process is not None else ()

    @property
    def kind(self) -> WorkerStart | None:
        return self.room.kind if self.process is not None and self.room is not None else None

    @property
    def why(self) -> str | None:
        return self.room.why if self.process is not None and self.room is not None else None

    @property
    def report(self) -> StandbyReport | None:
        """What the ready standby waiting says it holds (None: none waits, or it has said nothing yet)."""
        if self.kind is not WorkerStart.READY:
            return None
        try:
            return StandbyReport.from_json(self.spawner.state_dir.standby_report.read_text())
        except OSError:
            return None

    def shown(self) -> dict[str, Any]:
        """The standby's fields of the status (``Supervisor.standby_*``)."""
        held = self.report
        return dict(standby_pid=self.pid, standby_kind=self.kind and self.kind.value, standby_why=self.why,
                    standby_holds=list(held.holds) if held is not None else None,
                    standby_holds_why=held.why or None if held is not None else None,
                    standby_host_mib=held.host_mib if held is not None else None,
                    standby_host_allowance_mib=held.host_allowance_mib if held is not None else None)

    def prepare(self, env: dict[str, str], held_settings: dict[str, Any]) -> None:
        config = self.spawner.config
        made = room(config.standby_ready, config.standby_memory_mib, config.train, bool(env.get(ENV_RANK_STANDBY)),
                    config.standby_host_percent)
        rung = split_rung(held_settings)
        ready = made.env({**config.train, **rung.trainer_args}, rung.options, self.spawner.state_dir.standby_report)
        if self.process is not None and covers(self.process.env, env) and self.room is not None \
                and (self.room.kind is WorkerStart.READY or made.kind is not WorkerStart.READY) \
                and (made.kind is not WorkerStart.READY or self.process.env.get(ENV_READY) == ready.get(ENV_READY)):
            # It serves the next attempt already, and is as ready as a new one would be (one that holds its device
            # memory is kept, though that memory may be what a new one would now find missing; one ready for
            # another rung's train arguments or loader is made anew).
            return
        self.discard()
        self.spawner.state_dir.standby_report.unlink(missing_ok=True)  # the one before's
        try:
            self.process = self.spawner.worker([STANDBY_FLAG], {**env, **ready}, standby=True)
        except ConfigError as e:  # the worker itself started; a standby that cannot is only a slower restart
            log.warning(f"no standby worker: {e}")
            return
        self.room = made
        self.selector.register(self.process.pidfd, selectors.EVENT_READ, self._on_exit)
        if made.kind is WorkerStart.READY:
            log.info(f"standby worker pid {self.process.pid}: importing now, then building the device context, "
                     f"the model, the datasets and the training loader's workers, to start the next attempt without them (ready standby: {made.why})")
        else:
            log.info(f"standby worker pid {self.process.pid}: importing now, to start the next attempt without that "
                     f"(imported standby: {made.why})")

    def prime(self, checkpoint: Path) -> None:
        """A restart is coming, from ``checkpoint`` (where it exists; else from scratch, or from a fallback the
        launch chooses): a ready standby feeds its held loader's workers from its resumed position now. The launch
        takes them only where it resumes from that same file (worker/standby/ready.py). Only a standby whose report
        says it holds them is told: one that does not, or that reads no such word (a command's), is left alone."""
        report = self.report
        if self.process is not None and report is not None and HELD_LOADER_WORKERS in report.holds:
            self.process.prime(checkpoint if checkpoint.exists() else None)

    def launch(self, env: dict[str, str], record_path: Path) -> WorkerProcess | None:
        """The standby as this attempt's worker, told where its launch record is; None to start one cold: no
        standby, one that died or is stopped (SIGSTOP), or one made for another environment (the rung's variables
        are read at import)."""
        report = self.report
        standby, self.process, self.took, self.refused = self.process, None, WorkerStart.COLD, None
        if standby is None:
            return None
        self.reads.forget(standby.pidfd)
        why = ("made for another environment" if not serves(standby.env, env)
               else "gone" if standby.popen.poll() is not None
               else "stopped: frozen by a signal or a debugger" if process_tree.stopped(standby.pid)
               else stale(report) or (None if standby.launch(record_path) else "gone"))
        if why is not None:
            log.info(f"standby worker pid {standby.pid} not used ({why}): starting cold")
            self.refused = why
            self._kill(standby)
            return None
        held = "its imports, device context, model, datasets and loader are" if self.room is not None and \
            self.room.kind is WorkerStart.READY else "its imports are"
        log.info(f"standby worker pid {standby.pid} takes the attempt: {held} done")
        self.took = self.room.kind if self.room is not None else WorkerStart.IMPORTED
        return standby

    def discard(self) -> None:
        standby, self.process = self.process, None
        if standby is not None:
            self.reads.forget(standby.pidfd)
            self._kill(standby)

    def _kill(self, standby: WorkerProcess) -> None:
        """An idle standby holds no children and no device: killing it alone (not the supervisor's other
        children, as a worker's kill does with its orphans) is enough."""
        process_tree.kill_tree(standby.pid, 0.5, 5.0, keepalive=self.keepalive)
        standby.popen.poll()
        standby.close()

    def _on_exit(self, _fd: int) -> None:
        standby, self.process = self.process, None
        self.reads.forget(standby.pidfd)
        code = standby.popen.wait()
        tail = " | ".join(line for line in standby.read_output()[0][-3:])
        log.warning(f"standby worker pid {standby.pid} exited ({code}) before it was needed; the next attempt "
                    f"starts cold" + (f": {tail}" if tail else ""))
        standby.close()
