"""How an attempt's worker is started: its environment for a rung, and its command line, either our Ultralytics
worker (``python -m worker`` reading the launch record written here) or a ``[worker] command`` (its argv for the
rung, resumed from its newest checkpoint).

A program that cannot be started is a ConfigError naming the key to fix; the agent registers what comes back.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from supervisor import decision
from supervisor.attempt.rendezvous import ENV_COLLECTIVE_TIMEOUT, rendezvous_of
from supervisor.attempt.worker_command import OutputProgress, command_argv, newest_checkpoint
from supervisor.attempt.worker_process import SpawnError, WorkerProcess
from supervisor.config import Config, ConfigError
from supervisor.decision import WorkerKind
from supervisor.host.child_environ import worker_environ
from supervisor.state import checkpoints
from supervisor.state.state_dir import StateDir
from worker.wire.contract import (ENV_FORKSERVER, ENV_RANK_STANDBY, LaunchRecord, Patches, RungSplit, loader_workers,
                             split_rung, trains_ranks)

log = logging.getLogger("yolo-train")


class WorkerSpawner:
    def __init__(self, config: Config, state_dir: StateDir, kind: WorkerKind):
        self.config, self.state_dir, self.kind = config, state_dir, kind

    def attempt(self, action: decision.Spawn, standby: Callable[[dict[str, str], Path], WorkerProcess | None]
                ) -> tuple[WorkerProcess, str | None]:
        """This attempt's worker, and the checkpoint it resumes from: the command, or our worker, which is the
        standby when ``standby`` (told the environment and the launch record) hands it over, else one started cold."""
        rung = split_rung(action.rung_settings)
        env = self._env(rung)
        if not self.kind.reads_launch_record:
            return self._command(rung.args, env)
        record = self._write_launch_record(action, rung)
        worker = standby(env, self.state_dir.launch_record) or self.worker([str(self.state_dir.launch_record)], env)
        return worker, record.resume

    def env(self, rung_settings: dict[str, Any]) -> dict[str, str]:
        """The environment of a worker for a rung's settings (a standby's is made ahead of its attempt's)."""
        return self._env(split_rung(rung_settings))

    def _env(self, rung: RungSplit) -> dict[str, str]:
        bounds = {ENV_COLLECTIVE_TIMEOUT: f"{self.config.distributed.collective_timeout:g}"}
        # A standby made for this rung starts its loader workers' forkserver while it waits (one of another rung is
        # not used: the environments differ).
        served = {ENV_FORKSERVER: "1"} if self.kind.reads_launch_record and rung.options.forks_from_server(
            loader_workers(self.config.train, rung.trainer_args)) else {}
        env = {**self.config.worker_env, **rung.env}
        if self.kind.reads_launch_record and trains_ranks(self.config.train, env,
                                                          self.config.distributed.several_hosts):
            served[ENV_RANK_STANDBY] = str(self.state_dir.path)  # its ranks are forked from it (worker/standby/rank_server.py)
        return {**worker_environ(os.environ), **bounds, **self.config.worker_env, **rung.env, **served,
                "PYTHONUNBUFFERED": "1", "YOLO_OFFLINE": os.environ.get("YOLO_OFFLINE", "1")}

    def _command(self, args: dict[str, str], env: dict[str, str]) -> tuple[WorkerProcess, str | None]:
        """The ``[worker] command`` started for a rung's ``args``; with the checkpoint it resumes from, if any."""
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
        if self.kind.progress_from_output:
            worker.output_progress = OutputProgress(worker.pid, cfg.progress_regex)
        if not self.kind.saves_on_request:  # it reads no command pipe: the conventional SIGTERM, and it resumes
            worker.checkpoint_signal = signal.SIGTERM  # from its own newest checkpoint
        return worker, None if checkpoint is None else str(checkpoint)

    def _write_launch_record(self, action: decision.Spawn, rung: RungSplit) -> LaunchRecord:
        """What our worker trains this attempt, written where a cold worker (or the standby) reads it."""
        resume, notes = checkpoints.choose_resume(self.state_dir.run_dir)
        for note in notes:
            log.error(note)
        run_dir = self.state_dir.run_dir
        record = LaunchRecord(
            attempt=action.attempt, rung=action.rung,
            train={**self.config.train, "project": str(run_dir.parent), "name": run_dir.name, "exist_ok": True},
            trainer_args=rung.trainer_args, rung_keys=action.rung_keys, options=rung.options,
            patches=Patches(conv_fallback=self.config.conv_fallback, batchnorm_fallback=self.config.batchnorm_fallback,
                            amp_check=self.config.amp_check, amp_passed=action.amp_passed),
            resume=str(resume) if resume else None, checkpoint_every=action.checkpoint_every,
            faults=tuple(f.to_dict() for f in self.config.faults),
            fault_flag=str(self.state_dir.fault_flag(action.attempt)), supervisor_pid=os.getpid(),
            rendezvous=rendezvous_of(self.config))
        self.state_dir.write_launch_record(record.to_json())
        return record

    def worker(self, argv: list[str], env: dict[str, str], standby: bool = False) -> WorkerProcess:
        """``python -m worker`` with ``argv``: the launch record's path, or the standby flag."""
        python = self.config.worker_python or sys.executable
        try:
            return WorkerProcess.spawn([python, "-m", "worker", *argv], env, standby=standby)
        except SpawnError as e:
            raise ConfigError(f"[worker] python = {python!r}: cannot start the worker ({e.strerror})") from None
