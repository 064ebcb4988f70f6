"""Several GPUs: supervised DDP against plain Ultralytics DDP, and the hangs of a rank, recovered, with their cost.

Cases (``--cases``, comma-separated; each a supervised run of its own, printed as it ends, then one ``BENCH`` line):

- ``throughput`` (GPU): plain Ultralytics DDP against the same training under ``yolo-train run``; each run's steady
  epoch time from its own results.csv ((last - first) / (epochs - 1)). Ratio = plain / supervised (goal >= 0.99).
- ``standby``: a rank's hang (``--standby-fault``: ``device_hang`` on GPUs, ``main_hang`` on the CPU) recovered by
  the restart, with ``[worker] standby = false`` (every process of the next attempt starts cold) and then ``true``
  (the launching worker and the ranks' server imported ahead: worker/standby/rank_server.py), side by side: the verdict ->
  the next first batch (the incident's ``restart_seconds``; goal <= 6 s on 2 H100s), and the ratio.
- ``device``: a rank's GPU kernel that never ends (fault ``device_hang`` in rank 1; GPU only).
- ``loader``: a loader worker of rank 1 stopped from outside (SIGSTOP): replaced in place in that rank alone.
- ``tree``: every process of the worker's tree SIGSTOPped from outside once epoch 2 trains (the whole tree frozen).
- ``rank``: rank 1 alone SIGSTOPped from outside (the earlier ``freeze``).
- ``hosts``: two supervisors on this machine, one device each (``CUDA_VISIBLE_DEVICES`` per host on GPUs; the CPU
  on the CPU), NCCL (gloo) across them, torch's c10d rendezvous as ``[distributed]`` makes it; three runs
  (``--hosts-cases``): host 1's rank in a device hang (GPU only), host 1's tree frozen mid-epoch, host 1's
  supervisor SIGKILLed (and started again, as systemd would): each from the hang to both hosts' next first batch
  (goal <= 2 x one host's), and per host a line of where it went, in seconds from the hang: the verdict (which,
  and when: the host that hung, or the other learning it), the kill, the next attempt's spawn, its ranks started
  (the rendezvous done), its first batch. On the CPU an epoch of 256 images, so that the freeze lands inside one.

For every recovered hang: the stall (last progress -> verdict), the recovery (verdict -> next first batch for a
restart; the in-place cost), the batches lost, the rank named (``stopped_first_rank``, the witness's word), and the
run's goodput (status ``goodput``: the share of the wall time whose training was kept).

- ``night`` (issue 49): a night of mixed kinds in rank 1 (``--kinds``, bench/hangs.py, made from outside: a GPU kernel
  that never ends (GPU only), a loader worker blocked, rank 1's tree frozen, the training process blocked on a lock,
  a loader worker spinning, the training process spinning), each ``--hang-every`` s after the last recovery, run by
  bench/burst.py's night, beside its undisturbed twin in the same call: the seconds lost a hang (wall clock, and by
  the incidents: stall + restart + work lost, or in place: stall + action + wait), and for each incident the rank
  it named against the rank hung (goal: rank 1 every time; <= 8 s lost a hang on 2 H200s).
- ``rungs`` (issue 49): the restart at each rung of the CUDA default ladder (``--rungs``, its indices): a run whose
  ladder is that rung's settings alone, with ``in_place = false``; a loader worker of rank 1 blocked once it trains,
  so that the restart climbs onto the rung; the verdict -> next first batch and its parts (``restart_parts``: kill,
  to the spawn, each startup step), each rank's (``rank_parts``: from the spawn to the rank's first word, then each
  of its steps: checkpoint, process_group, model, ..., first_batch, first_step), and the rung the next attempt ran.
  The run stops at that batch.

    python -m bench.ddp --gpu --cases standby,device,loader,tree,hosts     # 2 GPUs
    python -m bench.ddp --cases standby,loader,tree,hosts                  # the CPU drill: 2 gloo ranks
    python -m bench.ddp --gpu --cases hosts --hosts-cases tree --host-limit 150   # one hosts run
    python -m bench.ddp --gpu --cases rungs,night                  # issue 49's night and restart per rung
    python -m bench.ddp --cases rungs,night                        # its CPU drill (no GPU kernel hang)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.harness import ROOT, free_port, quiet_config


def train_args(a: argparse.Namespace, data: str, epochs: int) -> dict:
    return {"data": data, "model": "yolov8n.yaml", "epochs": epochs, "imgsz": a.imgsz, "batch": a.batch,
            "workers": a.workers, "device": a.devices, "plots": False}


def steady_epoch_seconds(results_csv: Path) -> float:
    rows = list(csv.DictReader(results_csv.open()))
    times = [float(r["time"]) for r in rows]
    return (times[-1] - times[0]) / (len(times) - 1)


def run_plain(a: argparse.Namespace, data: str, out: Path) -> float:
    args = {**train_args(a, data, a.epochs), "project": str(out), "name": "plain", "exist_ok": True}
    code = f"from ultralytics import YOLO; YOLO('yolov8n.yaml').train(**{args!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=out, env={**os.environ, "YOLO_OFFLINE": "1"})
    return steady_epoch_seconds(out / "plain" / "results.csv")


def config(a: argparse.Namespace, data: str, epochs: int, path: Path, extra: str = "", standby: bool = True,
           in_place: bool = True) -> Path:
    train = train_args(a, data, epochs)
    if not a.gpu:
        train["device"] = "cpu"
    lines = ['name = "bench-ddp"', "[train]"]
    for k, v in train.items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    lines += ["[worker]", f"standby = {str(standby).lower()}"]
    if not a.gpu:
        lines.append('env = { YOLO_TRAIN_CPU_RANKS = "2" }')
    lines += ["[recovery]", f"in_place = {str(in_place).lower()}"]
    path.write_text("\n".join(lines) + "\n" + quiet_config() + extra)
    return path


def run_supervised(a: argparse.Namespace, data: str, out: Path) -> float:
    state = out / "supervised"
    subprocess.run([sys.executable, "-m", "supervisor", "run", "--config",
                    str(config(a, data, a.epochs, out / "supervised.toml")), "--state-dir", str(state)],
                   check=True, cwd=ROOT)
    return steady_epoch_seconds(state / "train" / "results.csv")


def read_status(state: Path) -> dict | None:
    try:
        return json.loads((state / "supervisor.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def read_incidents(state: Path) -> list[dict]:
    path = state / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def tree_of(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def training(state: Path, epoch: int = 2) -> dict | None:
    """The status once attempt 1 trains epoch ``epoch`` with every rank known; None before."""
    status = read_status(state)
    if status and status.get("attempt") == 1 and (status.get("epoch") or 0) >= epoch \
            and status.get("state") == "healthy" and len(status.get("ranks") or []) >= 2:
        return status
    return None


def supervise(cfg: Path, state: Path, faults: tuple[str, ...] = (), inject=None, log: Path | None = None,
              env: dict | None = None) -> dict:
    """One supervised run to its end; ``inject(status)`` is called once ``training`` says so, with the status."""
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--state-dir",
                             str(state), *(f"--fault={f}" for f in faults)], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=open(log or state.with_suffix(".log"), "w"), stderr=subprocess.STDOUT)
    began, injected = time.monotonic(), None
    while proc.poll() is None:
        time.sleep(0.2)
        if inject is not None and injected is None:
            status = training(state)
            if status is not None:
                injected = inject(status)
    return {"exit": proc.returncode, "wall_s": round(time.monotonic() - began, 1), "injected": injected,
            "incidents": read_incidents(state), "status": read_status(state) or {}}


def summary(run: dict) -> dict:
    """Each recovered hang's cost, the ranks named, and the run's goodput."""
    hangs = []
    for i in run["incidents"]:
        cost = i.get("tier_cost") or {}
        hangs.append({"tier": i.get("tier"), "stall_s": i.get("seconds_since_progress"),
                      "restart_s": i.get("restart_seconds"), "in_place_s": cost.get("seconds") or (
                          round(cost["stall"] + cost["action"] + (cost.get("to_next_batch") or 0), 2) if cost else None),
                      "batches_lost": cost.get("batches_lost"), "hung_rank": i.get("hung_rank"),
                      "stopped_first_rank": i.get("stopped_first_rank"),
                      "ranks": i.get("ranks"), "witness": i.get("witness"), "escalation": i.get("escalation")})
    status = run["status"]
    return {"exit": run["exit"], "wall_s": run["wall_s"], "attempts": status.get("attempt"),
            "goodput": status.get("goodput"), "hangs": hangs}


def stop_tree(status: dict) -> str:
    pids = tree_of(status["worker_pid"])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    return f"SIGSTOP to the {len(pids)} processes of the worker's tree at epoch {status['epoch']}"


def stop_rank_1(status: dict) -> str:
    pid = {r["rank"]: r["pid"] for r in status["ranks"]}[1]
    os.kill(pid, signal.SIGSTOP)
    return f"SIGSTOP to rank 1 (pid {pid}) at epoch {status['epoch']}"


def stop_a_loader_worker_of_rank_1(status: dict) -> str | None:
    """A real loader hang from outside (no fault flag, which would hang the rebuilt loader's workers too): SIGSTOP
    to one DataLoader worker process of rank 1."""
    import psutil

    pid = {r["rank"]: r["pid"] for r in status.get("ranks") or []}.get(1)
    workers = psutil.Process(pid).children() if pid else []
    if not workers:
        return None  # asked again at the next status
    os.kill(workers[0].pid, signal.SIGSTOP)
    return f"SIGSTOP to loader worker {workers[0].pid} of rank 1 (pid {pid}) at epoch {status['epoch']}"


def case(a: argparse.Namespace, data: str, out: Path, name: str, **kwargs) -> dict:
    faults = kwargs.pop("faults", ())
    inject = kwargs.pop("inject", None)
    cfg = config(a, data, a.epochs, out / f"{name}.toml", **kwargs)
    result = summary(supervise(cfg, out / name, faults, inject))
    print(f"bench: {name}: {json.dumps(result)}", flush=True)
    return result


def hang_fault(a: argparse.Namespace) -> str:
    return a.standby_fault or ("device_hang" if a.gpu else "main_hang")


def at_batch(a: argparse.Namespace) -> int:
    return a.hang_at


def run_standby(a: argparse.Namespace, data: str, out: Path) -> dict:
    fault = f"{hang_fault(a)},at_batch={at_batch(a)},attempt=1,rank=1"
    cold = case(a, data, out, "standby-off", faults=(fault,), standby=False, in_place=False)
    warm = case(a, data, out, "standby-on", faults=(fault,), standby=True, in_place=False)

    def restart(r: dict) -> float | None:
        return next((h["restart_s"] for h in r["hangs"] if h["restart_s"] is not None), None)

    c, w = restart(cold), restart(warm)
    return {"fault": fault, "cold": cold, "standby": warm, "cold_restart_s": c, "standby_restart_s": w,
            "ratio": round(c / w, 2) if c and w else None, "goal": "standby verdict -> next batch <= 6 s (2 H100)"}


# --- several hosts: two supervisors on this machine -------------------------------------------------------------

HOSTS_CPU_IMAGES = 256  # the CPU drill's hosts case: 32 batches an epoch, so that host 1 is frozen inside one

HOST = """name = "host-{node_rank}"
[train]
{train}
[distributed]
nnodes = 2
node_rank = {node_rank}
rdzv_endpoint = "127.0.0.1:{port}"
rdzv_id = "{rdzv_id}"
run_dir = "{run_dir}"
collective_timeout = {collective_timeout}
join_timeout = 180
[worker]
{worker_env}
""" + quiet_config()


def host_config(a: argparse.Namespace, data: str, out: Path, node_rank: int, port: int, rdzv_id: str) -> Path:
    train = {**train_args(a, data, a.epochs), "device": "0" if a.gpu else "cpu"}
    if not a.gpu:
        train["workers"] = 0
    lines = "\n".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}"
                      for k, v in train.items())
    # one GPU a host: the same [train] device "0" (the hosts must agree on [train]), each its own card
    worker_env = f'env = {{ CUDA_VISIBLE_DEVICES = "{node_rank}" }}' if a.gpu else ""
    path = out / f"{rdzv_id}-host-{node_rank}.toml"
    path.write_text(HOST.format(node_rank=node_rank, train=lines, port=port, rdzv_id=rdzv_id,
                                run_dir=out / f"{rdzv_id}-shared", collective_timeout=a.collective_timeout,
                                worker_env=worker_env))
    return path


def mid_epoch(status: dict) -> bool:
    """Training epoch 2 or later, with batches left in the epoch (a freeze at its end would meet the epoch end's
    bound, not the batch rhythm's)."""
    batches = status.get("batches") or 0
    return (status.get("epoch") or 0) >= 2 and status.get("state") == "healthy" and status.get("phase") == "train" \
        and 2 <= (status.get("batch") or 0) <= batches - 4


def ranks_started(state: Path, worker_pid: int | None) -> bool:
    """The ranks of the launch by ``worker_pid`` have started (worker/distributed/multinode.py marks each rank's start under the
    state directory): the rendezvous completed."""
    marks = state / "ranks-started" / str(worker_pid)
    return worker_pid is not None and marks.is_dir() and any(marks.iterdir())


def breakdown(incidents: list[dict], seen: dict, hang_wall: float | None) -> dict:
    """One host's restart, in seconds from the hang: its verdict (what it decided, and when), its kill, the next
    attempt's spawn, its ranks started (the rendezvous done), its first batch; and how many attempts it took."""
    def at(wall: float | None) -> float | None:
        return None if wall is None or hang_wall is None else round(wall - hang_wall, 2)

    first = incidents[0] if incidents else {}
    kill = first.get("kill") or {}
    return {"verdict_at": at(first.get("time")), "verdict": f"{first.get('reason')}: {first.get('detail')}"
            if first else None, "kill_s": kill.get("seconds"), "killed_at": at(kill.get("confirmed_wall")),
            "spawned_at": at(seen.get("spawned")), "rendezvous_at": at(seen.get("ranks_started")),
            "rendezvous_s": round(seen["ranks_started"] - seen["spawned"], 2)
            if seen.get("ranks_started") and seen.get("spawned") else None,
            "first_batch_at": at(seen.get("first_batch")), "restart_s": first.get("restart_seconds"),
            "incidents": len(incidents), "attempts": seen.get("attempt")}


def run_hosts_case(a: argparse.Namespace, data: str, out: Path, what: str) -> dict:
    """Two hosts; once both train epoch 2 (mid-epoch), ``what`` happens to host 1: the cost is from then to both
    hosts' next first batch (each host's status shows attempt 2 healthy), broken down per host (``breakdown``)."""
    rdzv_id = f"bench-{what}-{os.getpid()}"
    port = free_port()
    states = [out / f"{rdzv_id}-state-{n}" for n in (0, 1)]
    cfgs = [host_config(a, data, out, n, port, rdzv_id) for n in (0, 1)]
    faults = {1: (f"{hang_fault(a)},at_batch={at_batch(a) + 8},attempt=1",)} if what == "device" else {}

    def start(n: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(cfgs[n]), "--state-dir",
                                 str(states[n]), *(f"--fault={f}" for f in faults.get(n, ()))], cwd=ROOT,
                                stdout=open(out / f"{rdzv_id}-host-{n}.log", "a"), stderr=subprocess.STDOUT)

    hosts = [start(0), start(1)]
    began, injected, hang_at, hang_wall, resumed = time.monotonic(), None, None, None, {}
    seen: list[dict] = [{}, {}]  # per host, wall times of the restart's steps (``breakdown``)
    deadline = began + a.host_limit
    while any(h.poll() is None for h in hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
        statuses = [read_status(s) or {} for s in states]
        if hang_at is None:
            if what == "device":
                if any((s.get("attempt") or 1) > 1 or s.get("state") == "stopping" for s in statuses):
                    hang_at, hang_wall = time.monotonic(), time.time()  # unseen: from the first verdict at the latest
                    injected = "device hang fault in host 1's rank (counted from the first verdict)"
                continue
            if not all(mid_epoch(s) for s in statuses):
                continue
            hang_at, hang_wall = time.monotonic(), time.time()
            if what == "tree":
                injected = stop_tree(statuses[1])
            elif what == "supervisor":
                os.kill(hosts[1].pid, signal.SIGKILL)
                hosts[1].wait()
                injected = "SIGKILL to host 1's supervisor, started again at once"
                hosts[1] = start(1)
            continue
        for n, s in enumerate(statuses):
            attempt = s.get("attempt") or 1
            if attempt < 2:
                continue
            mine = seen[n]
            if mine.get("attempt") != attempt:  # a newer attempt: its steps are timed afresh
                mine.clear()
                mine["attempt"] = attempt
            if "ranks_started" not in mine and (s.get("worker_spawned") or 0) >= hang_wall:  # its Spawned came
                mine["spawned"] = s["worker_spawned"]
            if "ranks_started" not in mine and ranks_started(states[n], s.get("worker_pid")):
                mine["ranks_started"] = time.time()
            if "first_batch" not in mine and s.get("state") == "healthy":
                mine["first_batch"] = time.time()
                mine.setdefault("ranks_started", mine["first_batch"])  # seen together within one poll
            if n not in resumed and s.get("state") == "healthy":
                resumed[n] = round(time.monotonic() - hang_at, 2)
    for h in hosts:
        if h.poll() is None:
            h.kill()
        h.wait()
    incidents = [read_incidents(s) for s in states]
    return {"what": what, "injected": injected, "exits": [h.returncode for h in hosts],
            "hang_to_both_training_s": max(resumed.values()) if len(resumed) == 2 else None, "per_host_s": resumed,
            "breakdown": {n: breakdown(incidents[n], seen[n], hang_wall) for n in (0, 1)},
            "incidents": [[{"reason": i.get("reason"), "detail": i.get("detail"), "hung_rank": i.get("hung_rank"),
                            "restart_s": i.get("restart_seconds")} for i in host] for host in incidents],
            "goodput": [(read_status(s) or {}).get("goodput") for s in states]}


def print_breakdown(r: dict) -> None:
    """The restart of a hosts case, one line a host (seconds from the hang)."""
    for n, b in r["breakdown"].items():
        print(f"bench: hosts {r['what']}: host {n}: verdict at {b['verdict_at']} ({b['verdict']}), kill "
              f"{b['kill_s']} s (killed at {b['killed_at']}), spawned at {b['spawned_at']}, ranks started "
              f"(rendezvous) at {b['rendezvous_at']} ({b['rendezvous_s']} s after the spawn), first batch at "
              f"{b['first_batch_at']}; {b['incidents']} incident(s), attempt {b['attempts']}", flush=True)


# --- issue 49: a night of mixed kinds in rank 1, and the restart at each rung ------------------------------------

NIGHT_KINDS = "device_hang,loader_blocked,tree,main_blocked,loader_spinning,main_spinning"


_HANGS = []


def installed_hangs(out: Path):
    """One ``Hangs`` for the whole call: its hangs are numbered, each marked once (bench/hangs.py)."""
    from bench.hangs import Hangs

    if not _HANGS:
        _HANGS.append(Hangs.install(out))
    return _HANGS[0]


def rank_pid(rank: int):
    """``status -> pid`` of ``rank``'s training process (None until the status lists it)."""
    return lambda status: {r["rank"]: r["pid"] for r in status.get("ranks") or []}.get(rank)


def incident_rows(incidents: list[dict]) -> list[dict]:
    """Each hang's incident: its tier, the rank it named, its cost (bench/burst.py's ``hang_costs``) and restart."""
    rows = []
    for i in incidents:
        if i.get("reason") != "hang":
            continue
        cost = i.get("tier_cost") or {}
        rows.append({"tier": i.get("tier"), "hung_rank": i.get("hung_rank"),
                     "stopped_first_rank": i.get("stopped_first_rank"), "stall_s": i.get("seconds_since_progress"),
                     "restart_s": i.get("restart_seconds"), "lost_s": i.get("lost_seconds"),
                     "in_place_s": round(sum(cost.get(k) or 0 for k in ("action", "to_next_batch")), 2)
                     if cost else None,
                     "restart_parts": i.get("restart_parts"), "rank_parts": i.get("rank_parts"),
                     "rung": i.get("rung"), "witness": i.get("witness")})
    return rows


def run_night(a: argparse.Namespace, data: str, out: Path) -> dict:
    from bench.burst import Burst, hang_costs, night
    from bench.hangs import Hangs, parse_kinds

    kinds = parse_kinds(a.kinds or (NIGHT_KINDS if a.gpu else NIGHT_KINDS.replace("device_hang,", "")), a.gpu)
    low, high = (float(x) for x in a.hang_every.split("-"))
    hangs = installed_hangs(out)  # the hook on every process's PYTHONPATH: the twin's too, where nothing signals it
    cfg = config(a, data, a.night_epochs, out / "night.toml")
    args = argparse.Namespace(limit=a.night_limit or 3600.0, keep=None)
    calm = night(out, "undisturbed", cfg, args, None)
    if calm.seconds is None or calm.exit_code != 0:
        return {"error": f"the undisturbed twin did not finish ({calm.exit_code})"}
    args.limit = a.night_limit or 6 * calm.seconds
    hung = night(out, "night", cfg, args, Burst(low, high, a.seed, kinds=kinds, hangs=hangs, target=rank_pid(1)))
    rows = incident_rows(read_incidents(out / "state-night"))
    costs = [c for c in hang_costs(out / "state-night" / "incidents.jsonl") if c is not None]
    named = [r["hung_rank"] for r in rows]
    result = {"kinds": kinds, "hang_every": a.hang_every, "made": hung.phases, "undisturbed_s": round(calm.seconds, 1),
              "night_s": round(hung.seconds, 1) if hung.seconds else None, "exit": hung.exit_code, "hangs": hung.hangs,
              "incidents": rows, "rank_named": named, "named_right": sum(1 for n in named if n == 1),
              "lost_a_hang_wall_s": round((hung.seconds - calm.seconds) / hung.hangs, 1)
              if hung.seconds and hung.hangs else None,
              "lost_a_hang_incidents_s": round(sum(costs) / len(costs), 1) if costs else None,
              "goodput": round(calm.seconds / hung.seconds, 3) if hung.seconds else None,
              "goal": "rank 1 named every time; <= 8 s lost a hang (2 H200s)"}
    print(f"bench: night: {hung.hangs} hangs ({', '.join(hung.phases)}); undisturbed {result['undisturbed_s']} s, "
          f"night {result['night_s']} s (exit {hung.exit_code}): {result['lost_a_hang_wall_s']} s lost a hang by the "
          f"wall clock, {result['lost_a_hang_incidents_s']} s by its {len(costs)} incidents; rank named "
          f"{named} (right {result['named_right']} of {len(named)})", flush=True)
    for r in rows:
        print(f"bench: night: {r['tier']}: rank {r['hung_rank']} named, stall {r['stall_s']} s, restart "
              f"{r['restart_s']} s, in place {r['in_place_s']} s, lost {r['lost_s']} s; parts {r['restart_parts']}",
              flush=True)
    return result


def run_rung(a: argparse.Namespace, data: str, out: Path, index: int, settings: dict) -> dict:
    """One restart onto the rung ``settings`` (see the module's ``rungs``)."""
    from bench.lost_work import SupervisedRun

    hangs = installed_hangs(out)
    # no prior between hangs: one hang at rung 0 makes any untried rung the better one, so the restart climbs
    rung = to_inline(settings or {"workers": a.workers})
    ladder = f'[ladder]\nprior_between_hangs = "off"\nrungs = [{rung}]\n'
    name = f"rung-{index}-{len(list(out.glob(f'rung-{index}-*.toml')))}"  # a rung given twice: a run each
    cfg = config(a, data, a.epochs, out / f"{name}.toml", extra=ladder, in_place=False)
    run = SupervisedRun(cfg, out / f"state-{name}", out / f"{name}.log")
    target, made, row, began = rank_pid(1), None, None, time.time()
    try:
        while run.proc.poll() is None and time.time() - began < a.rung_limit:
            time.sleep(0.2)
            status = run.state().get("status", {})
            if made is None:
                pid = target(status)
                if status.get("attempt") == 1 and status.get("state") == "healthy" and status.get("phase") == "train" \
                        and (status.get("batch") or 0) >= 2 and pid and hangs.make("loader_blocked", pid):
                    made = time.time()
                continue
            rows = incident_rows(read_incidents(run.state_dir))
            if rows and rows[0]["restart_s"] is not None:
                row = {**rows[0], "next_rung": status.get("rung")}
                break
    finally:
        run.stop()
    if row is None:
        return {"rung": index, "settings": settings, "error": f"no restart within {a.rung_limit} s; see {run.log.name}"}
    return {**row, "rung": index, "settings": settings}


def to_inline(table: dict) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


def run_rungs(a: argparse.Namespace, data: str, out: Path) -> list[dict]:
    from supervisor.decision.model.ladder import default_ladder

    ladder = default_ladder(a.workers, cuda=True)
    results = []
    for index in (int(x) for x in a.rungs.split(",") if x):
        r = run_rung(a, data, out, index, ladder.settings(index))
        results.append(r)
        print(f"bench: rungs: rung {index} ({ladder.label(index)}): restart {r.get('restart_s')} s (the next attempt "
              f"at rung {r.get('next_rung')}, rank {r.get('hung_rank')} named); parts {r.get('restart_parts')}"
              + (f"; {r['error']}" if "error" in r else ""), flush=True)
        for rank in r.get("rank_parts") or []:
            print(f"bench: rungs: rung {index}: rank {rank['rank']}: " + ", ".join(
                f"{part} {seconds:.2f}" for part, seconds in rank["parts"].items()), flush=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", action="store_true", help="GPUs (--devices); without it the CPU drill: 2 gloo ranks")
    p.add_argument("--devices", default="0,1")
    p.add_argument("--images", type=int)
    p.add_argument("--imgsz", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--hang-at", type=int, default=None, help="rank 1's training batch of the faults")
    p.add_argument("--standby-fault", default=None, help="the hang of the standby case (a fault kind)")
    p.add_argument("--collective-timeout", type=float, default=120)
    p.add_argument("--host-limit", type=float, default=900, help="seconds a hosts case may run")
    p.add_argument("--cases", default="throughput,rank", help="throughput, standby, device, loader, tree, rank, hosts, "
                   "night, rungs")
    p.add_argument("--kinds", help="the night's hang kinds in turn (bench/hangs.py)")
    p.add_argument("--hang-every", default="8-14", help="the night: LO-HI seconds after the last recovery")
    p.add_argument("--night-epochs", type=int, help="the night's epochs (and its twin's)")
    p.add_argument("--night-limit", type=float, help="seconds the night may take (default 6x its twin)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rungs", help="the rungs case: indices of the CUDA default ladder's rungs")
    p.add_argument("--rung-limit", type=float, default=180, help="seconds a rungs run may take")
    p.add_argument("--hosts-cases", default="device,tree,supervisor", help="the hosts case's runs: device (GPU), "
                   "tree, supervisor")
    a = p.parse_args()
    defaults = dict(images=2048, imgsz=640, batch=32, workers=8, epochs=4, hang_at=40) if a.gpu else \
        dict(images=64, imgsz=64, batch=8, workers=1, epochs=3, hang_at=6)
    if a.night_epochs is None:
        a.night_epochs = 8 if a.gpu else 12
    if a.rungs is None:
        a.rungs = "0,1,2,6,7" if a.gpu else "0,1"
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    from worker.startup.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=a.images, val_images=64 if a.gpu else 16, size=a.imgsz))
    out = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    print(f"bench: logs and state under {out}", flush=True)
    cases = [c for c in a.cases.split(",") if c]
    results: dict = {"device": "gpu " + a.devices if a.gpu else "cpu (2 gloo ranks)"}
    for name in cases:
        if name == "throughput":
            if not a.gpu:
                print("bench: throughput needs --gpu (plain Ultralytics has no CPU DDP); skipped", flush=True)
                continue
            plain = run_plain(a, data, out)
            supervised = run_supervised(a, data, out)
            results["throughput"] = {"plain_epoch_s": round(plain, 3), "supervised_epoch_s": round(supervised, 3),
                                     "ratio": round(plain / supervised, 4), "goal": ">= 0.99"}
        elif name == "standby":
            results["standby"] = run_standby(a, data, out)
        elif name == "device":
            if not a.gpu:
                print("bench: device needs --gpu; skipped", flush=True)
                continue
            fault = f"device_hang,at_batch={a.hang_at},attempt=1,rank=1"
            results["device"] = case(a, data, out, "device", faults=(fault,))
        elif name == "loader":
            results["loader"] = case(a, data, out, "loader", inject=stop_a_loader_worker_of_rank_1)
        elif name == "tree":
            results["tree"] = case(a, data, out, "tree", inject=stop_tree)
        elif name == "rank":
            results["rank"] = case(a, data, out, "rank", inject=stop_rank_1)
        elif name == "night":
            results["night"] = run_night(a, data, out)
        elif name == "rungs":
            results["rungs"] = run_rungs(a, data, out)
        elif name == "hosts":
            whats = [w for w in a.hosts_cases.split(",") if w]
            if not a.gpu and "device" in whats:
                whats.remove("device")  # a main_hang's verdict on the CPU is no device wait's: the GPU's case
            hosts_data = data if a.gpu or a.images >= HOSTS_CPU_IMAGES else str(ensure_demo_dataset(
                train_images=HOSTS_CPU_IMAGES, val_images=16, size=a.imgsz))  # an epoch long enough to freeze inside
            results["hosts"] = []
            for what in whats:
                r = run_hosts_case(a, hosts_data, out, what)
                results["hosts"].append(r)
                print(f"bench: hosts {r['what']}: {json.dumps(r)}", flush=True)
                print_breakdown(r)
        else:
            p.error(f"--cases: unknown case {name!r}")
    print("BENCH " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
