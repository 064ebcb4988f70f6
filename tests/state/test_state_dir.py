"""The state directory: one supervisor per directory even when it is deleted, torn state files said in one line."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from supervisor.state.lock_holder import user_name
from supervisor.state.state_dir import StateDir
from tests.helpers import ROOT
from tests.helpers.supervised import (E2E_CONFIG, assert_finished, demo_train, quiet_config, sources_for_nobody,
                                     start_supervisor, status_of, worker_launcher, yolo_train)

SLEEPING_WORKER = "import time\ntime.sleep(120)\n"


def config_for(directory: Path, launcher: Path) -> Path:
    path = directory / "config.toml"
    path.write_text(f'[train]\ndata = "demo"\n[worker]\npython = "{launcher}"\n' + quiet_config())
    return path


def wait_for(predicate, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_deleting_the_state_directory_does_not_let_a_second_supervisor_in(tmp_path):
    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    first = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                              str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (state / "supervisor.json").exists())
        while state.exists():  # the lock file goes with it; a file the supervisor writes meanwhile: delete again
            shutil.rmtree(state, ignore_errors=True)
        second = yolo_train("run", "--config", str(config), "--state-dir", str(state), timeout=60)
        assert second.returncode == 78
        assert f"state_dir {state} is in use by another supervisor" in second.stderr
        # The first one notices at its next state write and puts its lock file back, saying so.
        assert wait_for(lambda: (state / "supervisor.lock").exists() and
                        (state / "supervisor.lock").read_text() == str(first.pid))
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert "supervisor.lock was removed while this supervisor ran" in err


def test_a_corrupt_state_file_is_moved_aside_with_one_line_and_the_run_goes_on(tmp_path):
    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    state.mkdir()
    (state / "supervisor.json").write_text("")  # torn by a power cut
    status = yolo_train("status", "--config", str(config), "--state-dir", str(state))
    assert status.returncode == 1 and "Traceback" not in status.stderr
    assert status.stdout.startswith(f"unreadable: {state / 'supervisor.json'}: corrupt state file: empty; "
                                    f"`yolo-train run` moves it aside")
    as_json = yolo_train("status", "--json", "--config", str(config), "--state-dir", str(state))
    assert json.loads(as_json.stdout)["state"] == "unreadable"
    run = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                            str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the same run goes on: a worker is started and the state file written anew
        assert wait_for(lambda: (s := status_of(state)) and s["worker_pid"])
    finally:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    (aside,) = state.glob("supervisor.json.corrupt-*")
    assert err.strip().splitlines()[0] == (
        f"yolo-train: {state / 'supervisor.json'}: corrupt state file: empty; moved aside to {aside}; training "
        f"resumes from scratch (no usable checkpoint of this run) at rung 0 (the restart count and the rungs' "
        f"history are lost)")
    assert json.loads((state / "supervisor.json").read_text())["rung"] == 0


def test_a_state_file_found_corrupt_halfway_restores_nothing_of_it(tmp_path):
    """Its attempt and rung are read before the value that is not a float: none of them is kept."""
    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    state.mkdir()
    (state / "supervisor.json").write_text(json.dumps({"version": 1, "rung": 3, "attempt": 7, "lost_seconds": "x"}))
    run = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                            str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (s := status_of(state)) and s["worker_pid"])
        status = status_of(state)
    finally:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert "corrupt state file: 'lost_seconds' is not float" in err.splitlines()[0]
    assert (status["attempt"], status["rung"]) == (1, 0)


def test_a_read_only_state_directory_is_one_line_and_78():
    # Root may write anywhere: run the CLI as nobody, in a directory nobody can read but not write.
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        work.chmod(0o755)
        state = work / "state"
        state.mkdir(mode=0o755)
        config = work / "config.toml"
        config.write_text('[train]\ndata = "demo"\n[metrics]\nlisten = "off"\n')
        config.chmod(0o644)
        sources = sources_for_nobody()
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                                 "supervisor", "run", "--config", str(config), "--state-dir", str(state)],
                                cwd=sources, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "HOME": "/", "PYTHONPATH": str(sources)})
    assert result.returncode == 78 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"yolo-train: {config}: state_dir {state}: cannot write supervisor.lock (Permission denied); make the "
        f"directory writable by user nobody or choose another state_dir"]


def test_an_incident_never_joins_a_torn_last_line(tmp_path):
    state = StateDir(tmp_path, "test.toml")
    state.append_incident({"id": 1, "reason": "stall"})
    with open(state.incidents, "a") as f:
        f.write('{"id": 2, "reas')  # a supervisor killed mid-append
    state.append_incident({"id": 3, "reason": "crash"})
    lines = state.incidents.read_text().splitlines()
    assert json.loads(lines[0])["id"] == 1 and lines[1] == '{"id": 2, "reas' and json.loads(lines[2])["id"] == 3
    state.append_incident({"id": 4, "reason": "crash"})
    assert len(state.incidents.read_text().splitlines()) == 4


def test_state_writes_leave_one_complete_file(tmp_path):
    state = StateDir(tmp_path, "test.toml")
    state.lock()
    for i in range(3):
        state.write_state({"restarts": i})
    assert state.read_state(lambda record: None)["restarts"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supervisor.json", "supervisor.lock", "supervisor.reserve"]


def test_on_a_full_disk_the_final_state_write_still_lands(small_disk):
    """Issue 30: after a full-disk exit the state file showed the run as it was long before (rung 0, no restarts,
    a standby as current). A real full disk: a small tmpfs, filled."""
    state = StateDir(small_disk.path, "test.toml")
    state.lock()
    state.write_state({"rung": 0, "standby_pid": 42})
    small_disk.fill()
    state.write_state({"rung": 2, "standby_pid": 42, "padding": "x" * 100_000})  # said once, the run goes on
    assert state.read_state(lambda record: None)["rung"] == 0
    state.write_state({"rung": 3, "standby_pid": None, "padding": "x" * 100_000}, final=True)
    assert state.read_state(lambda record: None)["rung"] == 3 and not (small_disk.path / "supervisor.reserve").exists()


def test_the_launch_record_is_named_for_what_it_holds_and_an_old_one_goes(tmp_path):
    """Earlier versions wrote it as worker-settings.json: a state directory may still hold one, of an older attempt."""
    (tmp_path / "worker-settings.json").write_text('{"attempt": 1}')
    state = StateDir(tmp_path, "test.toml")
    state.write_launch_record('{"attempt": 2}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch-record.json"]
    assert json.loads(state.launch_record.read_text()) == {"attempt": 2}


def other_network_namespace() -> list[str]:
    """A command prefix that runs in a network namespace of its own, where the lock's abstract socket is not seen."""
    for prefix in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            pass
    pytest.skip("no network namespace can be made here (unshare --net)")


def test_a_supervisor_whose_directory_another_one_took_stops_its_worker_with_one_line(tmp_path):
    """The lock file removed, a second supervisor in another network namespace locks a new one and trains: the first
    stops its worker (two would write one last.pt) and says why in one line, exit 78."""
    import psutil

    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    command = [sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir", str(state)]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        assert wait_for(lambda: json.loads((state / "supervisor.json").read_text())["status"]["worker_pid"]
                        if (state / "supervisor.json").exists() else False)
        worker = json.loads((state / "supervisor.json").read_text())["status"]["worker_pid"]
        first.send_signal(signal.SIGSTOP)  # held while the second takes the directory, so it cannot re-lock first
        (state / "supervisor.lock").unlink()
        second = subprocess.Popen(other_network_namespace() + command, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: (state / "supervisor.lock").exists() and
                        (state / "supervisor.lock").read_text() == str(second.pid))
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=60)
        assert second.poll() is None  # the second trains on
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        if second is not None:
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=60)
    assert first.returncode == 78, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert (f"state_dir {state} is now in use by another supervisor: pid {second.pid}, user {user_name(os.getuid())} "
            f"(uid {os.getuid()}) holds {state / 'supervisor.lock'}: its supervisor.lock was removed") in last
    assert "this one stopped its worker; stop the other, or give each supervisor its own state_dir" in last
    assert "free disk space" not in err
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE


@pytest.mark.e2e
def test_a_wrongly_typed_state_file_is_moved_aside_and_training_resumes_from_last_pt_at_rung_0(write_config,
                                                                                                tmp_path):
    """Issue 30: `"rung": "x"` ended `run` in a traceback and exit 1, which systemd restarts, forever; issue 50: then
    in exit 78, which systemd never restarts, with the checkpoints intact. The real demo: stopped after its first
    checkpoint, its state file damaged, the next run trains on from last.pt at rung 0 and finishes."""
    config = write_config(E2E_CONFIG.format(train=demo_train(epochs=3), quiet=quiet_config(), startup=90,
                                            restart="backoff_initial = 0.5"))
    state = tmp_path / "state"
    last = state / "train" / "weights" / "last.pt"
    first = start_supervisor(config, state)
    assert wait_for(lambda: (s := status_of(state)) and s["state"] == "healthy" and s["epoch"] >= 2 and last.exists(),
                    timeout=180)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err[-2000:]
    record = json.loads((state / "supervisor.json").read_text())
    (state / "supervisor.json").write_text(json.dumps({**record, "rung": "x"}))
    run = yolo_train("run", "--config", str(config), "--state-dir", str(state))
    status = assert_finished(state, run)
    (aside,) = state.glob("supervisor.json.corrupt-*")
    [line] = [line for line in run.stderr.splitlines() if "supervisor.json" in line]
    assert line.startswith(f"yolo-train: {state / 'supervisor.json'}: corrupt state file: 'rung' is not int")
    assert line.endswith(f"; moved aside to {aside}; training resumes from {last} at rung 0 (the restart count and "
                         f"the rungs' history are lost)")
    assert status["rung"] == 0 and status["resumed_from"] == str(last)


# Issue 57.2: a second uid squats the lock, as any local user could. Its script sits where user nobody can read it
# (the checkout may be in a home directory nobody cannot enter); it says "held" once it holds what it was asked to.
SQUATTER = """
import fcntl, os, socket, sys, time
what, target = sys.argv[1], sys.argv[2]
if what == "file":
    fd = os.open(target, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
else:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(bytes.fromhex(target))
    if what == "listening":
        sock.listen(1)
print("held", flush=True)
time.sleep(300)
"""
NOBODY = 65534


@pytest.fixture
def squat():
    """Start the squatter as uid 65534 on ``what`` ("file", "listening" or "bound") at ``target``; its process."""
    started = []
    with tempfile.TemporaryDirectory() as scripts:
        Path(scripts).chmod(0o755)
        script = Path(scripts) / "squatter.py"
        script.write_text(SQUATTER)
        script.chmod(0o644)

        def start(what: str, target: str) -> subprocess.Popen:
            proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                     sys.executable, "-I", str(script), what, target], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd="/")
            started.append(proc)
            assert proc.stdout.readline() == "held\n", proc.communicate(timeout=10)
            return proc

        yield start
        for proc in started:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=60)[1]


@pytest.mark.parametrize("listening", [True, False])
def test_a_squatter_of_another_uid_on_the_locks_socket_is_no_supervisor(tmp_path, squat, listening):
    """Binding the lock's abstract name first made `run` refuse, "in use by another supervisor (pid ?)", exit 78,
    which the unit never restarts. The supervisor starts, names the squatter in one line, and its flock still keeps
    a second supervisor out, named by pid and uid."""
    from supervisor.state.state_dir import lock_address

    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    squatter = squat("listening" if listening else "bound", lock_address(state).hex())
    first = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                              str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: first.poll() is not None or ((s := status_of(state)) and s["worker_pid"]))
        assert first.poll() is None
        second = yolo_train("run", "--config", str(config), "--state-dir", str(state), timeout=60)
    finally:
        err = stop(first)
    me = f"user {user_name(os.getuid())} (uid {os.getuid()})"
    assert second.returncode == 78 and second.stderr.strip().splitlines()[-1] == (
        f"yolo-train: {config}: state_dir {state} is in use by another supervisor: pid {first.pid}, {me} holds "
        f"{state / 'supervisor.lock'}; stop it or choose another state_dir")
    holder = f"pid {squatter.pid}, user nobody (uid {NOBODY})" if listening else "pid ?, uid ?"
    name = "@" + lock_address(state)[1:].decode()
    [line] = [line for line in err.splitlines() if "the lock's socket" in line]
    assert line == (f"yolo-train: state_dir {state}: the lock's socket {name} is held by {holder}, not a supervisor "
                    f"of user {user_name(os.getuid())}: ignored; supervisor.lock alone keeps the directory this "
                    f"supervisor's")


def test_a_squatter_of_an_older_versions_lock_file_is_no_supervisor(squat):
    """An earlier version left supervisor.lock 0644 in a 0755 directory: another user could open it and flock it,
    and `run` refused, naming the pid the file held. The supervisor names the squatter from /proc/locks, locks a new
    file only this user can open, and takes the other users' bits off the directory."""
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        work.chmod(0o755)
        config = config_for(work, worker_launcher(work, SLEEPING_WORKER))
        state = work / "state"
        state.mkdir(mode=0o755)
        state.chmod(0o755)
        lock = state / "supervisor.lock"
        lock.write_text("4242")
        lock.chmod(0o644)
        squatter = squat("file", str(lock))
        run = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: run.poll() is not None or ((s := status_of(state)) and s["worker_pid"]))
            assert run.poll() is None
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (state, lock)}
            held = lock.read_text()
        finally:
            err = stop(run)
    [line] = [line for line in err.splitlines() if "supervisor.lock is held" in line]
    assert line == (f"yolo-train: state_dir {state}: supervisor.lock is held by pid {squatter.pid}, user nobody "
                    f"(uid {NOBODY}), not a supervisor of user {user_name(os.getuid())}: replaced by a new "
                    f"supervisor.lock that only this user can open")
    assert modes == {"state": 0o750, "supervisor.lock": 0o600} and held == str(run.pid)


def modes_under(path: Path) -> dict[str, set[str]]:
    """The permission bits of every directory and file under ``path`` (itself included), as octal strings."""
    found = {"dirs": {oct(stat.S_IMODE(path.stat().st_mode))}, "files": set()}
    for p in path.rglob("*"):
        found["dirs" if p.is_dir() else "files"].add(oct(stat.S_IMODE(p.lstat().st_mode)))
    return found


@pytest.mark.parametrize("made", [None, 0o750])
def test_the_state_directory_and_all_in_it_are_this_users_whatever_the_umask(tmp_path, made):
    """Issue 57.7: outside the service the directory was 0755 and its files 0644 (the incidents, stacks, command lines
    and checkpoints of the training readable by every local user). Under umask 022, a run with an incident and
    checkpoints leaves 0700 and 0600, and 0750 and 0640 in a directory made for its group (the unit's
    StateDirectoryMode=0750): the worker's files too."""
    from tests.e2e.test_loader_hangs import run_loop

    state = tmp_path / "state"
    if made is not None:
        state.mkdir()
        state.chmod(made)
    before = os.umask(0o022)
    try:
        status, incidents, _, _ = run_loop(tmp_path, {"hang": "blocked", "epoch": 1, "batch": 6}, state_dir=state)
    finally:
        os.umask(before)
    assert len(incidents) == 1 and (state / "train" / "weights" / "last.pt").exists()
    assert (state / "history.db").exists() and (state / "launch-record.json").exists()
    group = made is not None
    assert modes_under(state) == {"dirs": {"0o750" if group else "0o700"},
                                  "files": {"0o600", "0o640"} if group else {"0o600"}}
    assert oct(stat.S_IMODE((state / "supervisor.lock").stat().st_mode)) == "0o600"  # flock needs only a descriptor


def test_another_user_reading_a_state_directory_is_told_whose_it_is():
    """Now that a state directory is its user's (0700), another user's `incidents` said "no incidents" and `report`
    ended in a traceback: each says in one line whose the directory is, exit 1, as `status` does."""
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        work.chmod(0o755)
        state = work / "state"
        state.mkdir(mode=0o700)  # as `run` makes it
        state.joinpath("incidents.jsonl").write_text('{"id": "1-1-1", "reason": "hang"}\n')
        config = work / "config.toml"
        config.write_text('[train]\ndata = "demo"\n')
        config.chmod(0o644)
        sources = sources_for_nobody()
        said = {}
        for verb in ("status", "incidents", "report"):
            done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                   sys.executable, "-m", "supervisor", verb, "--config", str(config), "--state-dir",
                                   str(state)], cwd="/tmp", capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "HOME": "/", "PYTHONPATH": str(sources)})
            said[verb] = (done.returncode, (done.stdout + done.stderr).strip().splitlines())
    whose = (f"{state}: cannot read the state directory (mode 0700, user {user_name(os.getuid())}'s): run as "
             f"{'root' if os.getuid() == 0 else user_name(os.getuid()) + ' or root'} "
             f"(docs/behaviour.md#who-can-read-a-state-directory)")
    assert said == {"status": (1, [f"unreadable: {state / 'supervisor.json'}: cannot read the state file (Permission "
                                   f"denied); make it readable by this user"]),
                    "incidents": (1, [f"yolo-train: {whose}"]), "report": (1, [f"yolo-train: {whose}"])}
