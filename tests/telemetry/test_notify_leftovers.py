"""A ``[notify] command`` that leaves a daemon behind (``setsid ... &``): the daemon is re-parented to the supervisor,
a subreaper, once its command ends. It is the notify command's, never the worker's tree: not in the tree's activity,
not killed with it. Run in a subprocess that is a subreaper, as the supervisor is (the test's own process stays
none)."""

import json
import subprocess
import sys
import textwrap

from tests.helpers import ROOT

SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from pathlib import Path
    from supervisor.config import NotifyConfig
    from supervisor.decision.notices import Notice, NoticeKind
    from supervisor.host import process_tree
    from supervisor.telemetry.notify_command import NotifyCommand

    assert process_tree.become_subreaper()
    worker = subprocess.Popen(["sleep", "60"])  # stands in for the worker (its own child below it)
    daemon_file = Path(sys.argv[1])
    command = ("sh", "-c", f"setsid sh -c 'echo $$ > {daemon_file}; exec sleep 60' </dev/null >/dev/null 2>&1 &")
    notify = NotifyCommand(NotifyConfig(command), "night", Path("/tmp"))
    notify.tell(Notice(NoticeKind.HANG_RECOVERED, "recovered", 1_700_000_000.0, 0, "as configured"))
    for r in list(notify.running):
        r.process.wait(timeout=30)
    notify.poll()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (daemon_file.exists() and daemon_file.read_text().strip()):
        time.sleep(0.05)
    daemon = int(daemon_file.read_text())
    while time.monotonic() < deadline and not process_tree.descends_from(daemon, os.getpid()):
        time.sleep(0.05)  # re-parented to us once its shell has gone
    adopted = process_tree.descends_from(daemon, os.getpid())
    in_tree = daemon in {p.pid for p in process_tree.tree(spare=notify.pids())}
    report = process_tree.kill_tree(worker.pid, 0.5, 2.0, adopt_orphans=True, spare=notify.pids())
    alive = process_tree.descends_from(daemon, os.getpid())
    if alive:
        os.kill(daemon, 9)
    print(json.dumps({"adopted": adopted, "in_tree": in_tree, "killed": report.killed, "worker": worker.pid,
                      "daemon": daemon, "alive_after_kill": alive}))
""")


def test_a_daemon_left_by_the_notify_command_is_neither_the_workers_activity_nor_killed_with_its_tree(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "daemon.pid")], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["adopted"], seen  # the precondition: the daemon is the supervisor's child now
    assert not seen["in_tree"] and seen["daemon"] not in seen["killed"] and seen["alive_after_kill"], seen
    assert seen["worker"] in seen["killed"], seen
