"""Several hosts: Ultralytics' DDP launch through torch.distributed.run's c10d rendezvous, one worker per host.

Ultralytics launches ``torch.distributed.run --nproc_per_node N --master_port P``: one host, its own GPUs. With a
``Rendezvous`` in the launch record (``[distributed]`` in the config) each host's worker launches its local ranks
under the same elastic launcher, meeting the other hosts' launchers at the c10d rendezvous (``--nnodes``,
``--rdzv-backend c10d``, ``--rdzv-endpoint``, ``--rdzv-id``); the world size and every rank's global rank come from
the launcher's environment (``WORLD_SIZE``, ``RANK``), not from the device count.

Restarts are the supervisors', never the launcher's: ``--max-restarts 0``, and a rank that the launcher starts a
second time (it does so when another host's new launcher joins while its ranks look healthy: a "membership
change") exits at once instead of training from the launch's old checkpoint. So a host whose ranks hung is killed
and restarted by its supervisor; the other hosts' ranks fail in their next collective (a dead peer's connection
closes, a frozen one's collective times out after ``collective_timeout``), or on the second start, their launchers
exit, and their supervisors restart them too: every host resumes from the newest checkpoint on the shared run
directory. A host's new launcher may join the round of the old store (host 0's old launcher, still up), which closes
as that launcher fails: a launch whose rendezvous ended before any of its ranks started joins again in place
(``rejoin``), within join_timeout, instead of ending the attempt.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from worker.wire.contract import Rendezvous

ENV_FINGERPRINT = "YOLO_TRAIN_RDZV_FINGERPRINT"  # what every host must agree on, for the ranks to compare
ENV_STARTED_DIR = "YOLO_TRAIN_RANKS_STARTED"  # where this launch's ranks mark that they started
DISAGREE = "yolo-train: the hosts' configurations differ"  # a failure signature (supervisor/decision/model/signatures.py)
JOIN_GRACE = 5.0  # seconds past join_timeout the launcher has to give up by itself before it is ended
# torch.distributed.run's ``@record`` writes the launcher's own exception (a RendezvousClosedError) to this file
ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
# A launch whose rendezvous ended before any rank of this host started joins again after each pause, within
# join_timeout: as many tries as pauses.
REJOIN_PAUSES = (0.2, 1.0, 2.0, 4.0)


def install(rendezvous: Rendezvous, record_path: str) -> Path:
    """In the launching worker, before the trainer is built: Ultralytics' DDP command goes through the rendezvous,
    and the ranks learn what to check. Returns the directory where the ranks mark their start."""
    from ultralytics.engine import trainer as engine

    started = Path(record_path).resolve().parent / "ranks-started" / str(os.getpid())
    started.mkdir(parents=True, exist_ok=True)
    os.environ[ENV_STARTED_DIR] = str(started)
    os.environ[ENV_FINGERPRINT] = f"{rendezvous.node_rank}:{rendezvous.fingerprint}"

    def through_the_rendezvous(trainer: Any) -> tuple[list[str], str]:
        # Ultralytics' own script, not its command: that also empties the run directory of a launch from scratch,
        # which every host shares here (one host would delete what another has begun).
        from ultralytics.utils.dist import generate_ddp_file

        file = generate_ddp_file(trainer)
        print(f"yolo-train worker: host {rendezvous.node_rank} of {rendezvous.nnodes}: {trainer.world_size} local "
              f"rank(s) meet the other hosts at {rendezvous.endpoint} (rdzv_id {rendezvous.rdzv_id!r}), waiting up "
              f"to {rendezvous.join_timeout:g} s for all of them", flush=True)
        return launcher_argv(sys.executable, trainer.world_size, rendezvous, file), file

    engine.generate_ddp_command = through_the_rendezvous
    return started


def launcher_argv(python: str, local_ranks: int, r: Rendezvous, script: str) -> list[str]:
    """torch.distributed.run with the c10d rendezvous; the host with node_rank 0 hosts the store."""
    wait = max(1, round(r.join_timeout))
    conf = f"is_host={'true' if r.node_rank == 0 else 'false'},join_timeout={wait},read_timeout={wait}"
    return [python, "-m", "torch.distributed.run", "--nnodes", str(r.nnodes), "--nproc-per-node", str(local_ranks),
            "--node-rank", str(r.node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", r.endpoint,
            "--rdzv-id", r.rdzv_id, "--rdzv-conf", conf, "--max-restarts", "0", script]


def adopt_world(trainer: Any) -> None:
    """After BaseTrainer.__init__, on several hosts (``install`` ran in the launching worker): its launcher takes the
    DDP path even with one local device; a rank's world is the launcher's ``WORLD_SIZE``, every host's ranks."""
    from ultralytics.utils import LOCAL_RANK

    if not os.environ.get(ENV_FINGERPRINT):
        return
    if LOCAL_RANK != -1:
        trainer.world_size = int(os.environ["WORLD_SIZE"])
    else:
        trainer.world_size = max(trainer.world_size, 1)
        trainer.ddp = True


def mark_rank_started() -> None:
    """In a rank, first thing: a second start under the same launch is the launcher's restart after another host
    joined anew. It would resume from this launch's checkpoint, not the newest: exit, and let the supervisor restart
    this host from the newest one."""
    directory = os.environ.get(ENV_STARTED_DIR)
    if not directory:
        return
    marker = Path(directory) / os.environ.get("LOCAL_RANK", "0")
    if marker.exists():
        print(f"yolo-train worker: rank {os.environ.get('RANK')} started again by torch.distributed.run for a new "
              f"rendezvous round (another host restarted): this host restarts under its supervisor, from the newest "
              f"checkpoint", file=sys.stderr, flush=True)
        raise SystemExit(1)
    marker.touch()


def check_hosts_agree(hb: Any = None) -> None:
    """In a rank, once the process group is up: every host trains the same [train] table, ladder and run directory,
    or the run stops with one line (a failure signature: exit 78) instead of averaging different models. The line
    is also the rank's last error on the heartbeat (``hb``): the supervisor judges a crash by its own last words,
    and the launcher's are only that a rank failed."""
    value = os.environ.get(ENV_FINGERPRINT)
    if not value:
        return
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    prints = {v.split(":", 1)[1] for v in everyone}
    if len(prints) > 1:
        hosts = sorted({tuple(v.split(":", 1)) for v in everyone})
        line = (f"{DISAGREE} ([train], [ladder], [distributed] nnodes, rdzv_id or run_dir; node_rank:fingerprint "
                f"{', '.join(':'.join(h) for h in hosts)}); give every host the same config")
        print(line, flush=True)
        if hb is not None:
            hb.error(line)
        raise SystemExit(78)


def started_dir() -> Path:
    return Path(os.environ[ENV_STARTED_DIR])


def forget_started() -> None:
    """At the launch's end: its ranks' start marks mean nothing to the next launch."""
    import shutil

    shutil.rmtree(started_dir(), ignore_errors=True)
    launcher_error_file(started_dir()).unlink(missing_ok=True)


def launcher_error_file(started_dir: Path) -> Path:
    return started_dir.with_name(f"{started_dir.name}-launcher-error.json")


def arm_launcher_error(started_dir: Path) -> None:
    """Before a launch (each try): torch.distributed.run writes its own exception, if it fails with one, where
    ``launcher_error`` reads it (its ranks get their own error files from it)."""
    path = launcher_error_file(started_dir)
    path.unlink(missing_ok=True)
    os.environ[ENV_ERROR_FILE] = str(path)


def launcher_error(started_dir: Path) -> str | None:
    """The launcher's own exception, as torch.distributed.run's ``@record`` wrote it ("RendezvousClosedError: ...")."""
    import json

    try:
        message = json.loads(launcher_error_file(started_dir).read_text())["message"]["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return " ".join(str(message).split()).rstrip(":")[:240] or None  # "RendezvousClosedError: " has no message


def rejoin(rendezvous: Rendezvous, started_dir: Path, began: float, tries: int,
           returncode: int) -> tuple[float, str] | None:
    """The launcher failed after ``tries`` tries again: (the pause, one line saying why) before joining the rendezvous
    again, or None when its failure is the launch's. Again only while no rank of this host started (nothing trained,
    nothing to lose), within join_timeout, ``len(REJOIN_PAUSES)`` times at most, and not over a port another program
    holds. The case: another host's new launcher joined the round of this host's old store (host 0's old launcher),
    whose launcher then failed (its rank lost the other host's) and closed the round on its way out
    (``rdzv_handler.shutdown()``: RendezvousClosedError) or took the store with it (RendezvousConnectionError); a
    new store comes with that host's next launch. torchrun itself joins again after a closed round only with
    ``--max-restarts``, which would restart the ranks from the launch's old checkpoint (``mark_rank_started``)."""
    if tries >= len(REJOIN_PAUSES) or ranks_started(started_dir):
        return None
    if rendezvous.node_rank == 0 and port_taken(rendezvous.endpoint):
        return None
    pause = REJOIN_PAUSES[tries]
    left = rendezvous.join_timeout - (time.monotonic() - began) - pause
    if left <= 0:
        return None
    why = launcher_error(started_dir) or f"torch.distributed.run exited with status {returncode}"
    return pause, (f"yolo-train worker: host {rendezvous.node_rank} of {rendezvous.nnodes}: the rendezvous at "
                   f"{rendezvous.endpoint} ended before any rank of this host started ({why}): another host's "
                   f"launcher closed the round or its store went; joining again in {pause:g} s (try {tries + 2} of "
                   f"{len(REJOIN_PAUSES) + 1}, {left:.0f} s of join_timeout left)")


def ranks_started(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def bound_the_launch(rendezvous: Rendezvous, started_dir: Path) -> threading.Timer:
    """The launcher's own timeouts do not bound every wait: against an endpoint that accepts TCP but is no store
    (another program on the port) it waits on. With no rank started ``JOIN_GRACE`` after ``join_timeout``, a
    launcher that started none is killed, and ``launch_failure`` says why. Cancel the timer once the launch
    returns."""
    parent = os.getpid()

    def expired() -> None:
        if ranks_started(started_dir):
            return
        for launcher in _children(parent):
            if _children(launcher):
                continue  # the rendezvous completed: its ranks are starting
            try:
                os.kill(launcher, signal.SIGKILL)
            except ProcessLookupError:
                pass

    timer = threading.Timer(rendezvous.join_timeout + JOIN_GRACE, expired)
    timer.daemon = True
    timer.start()
    return timer


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def port_taken(endpoint: str) -> bool:
    """The store's port is held by another program here (EADDRINUSE): the store host's launcher cannot serve it."""
    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed store's TIME_WAIT is no conflict
        try:
            probe.bind(("", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def launch_failure(rendezvous: Rendezvous, started_dir: Path, began: float) -> tuple[int, str]:
    """The launcher failed: (exit status, one line). No rank ever started: on the store host, another program holds
    the port (EADDRINUSE); within the join timeout, the rendezvous never completed (a host that never joined, an
    endpoint nobody answers, one that answers but is no store). Configuration errors (78), not crashes."""
    waited = time.monotonic() - began
    started = ranks_started(started_dir)
    if not started and rendezvous.node_rank == 0 and port_taken(rendezvous.endpoint):
        return 78, (f"yolo-train worker: host 0 of {rendezvous.nnodes}: cannot host the rendezvous store at "
                    f"{rendezvous.endpoint}: its port is in use by another program (EADDRINUSE); choose a free port "
                    f"in [distributed] rdzv_endpoint on every host")
    if not started and waited >= rendezvous.join_timeout:
        return 78, (f"yolo-train worker: host {rendezvous.node_rank} of {rendezvous.nnodes}: the rendezvous at "
                    f"{rendezvous.endpoint} (rdzv_id {rendezvous.rdzv_id!r}) did not complete in {waited:.0f} s "
                    f"([distributed] join_timeout {rendezvous.join_timeout:g} s): a host never joined, or the "
                    f"endpoint does not answer or is no rendezvous store; start yolo-train on every host with the "
                    f"same rdzv_id and check rdzv_endpoint")
    return 1, ("yolo-train worker: a rank failed or another host restarted (torch.distributed.run exited); the "
               "supervisor restarts this host from the newest checkpoint")
