"""Word when it matters: which decisions become notices (the core's Driver, a chosen clock), the rate rule, and the
[notify] command run with real processes: its input, its failures said once, a command that never ends killed."""

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from supervisor.config import NotifyConfig, parse
from supervisor.decision import core
from supervisor.decision.model.survivors import Survivor
from supervisor.decision.notices import BURST, WINDOW, Notice, NoticeKind, NoticeLimit, derive
from supervisor.decision.recovery import in_place
from supervisor.exit_codes import EXIT_CONFIG, EXIT_REBOOT_NEEDED
from supervisor.telemetry.notify_command import NotifyCommand
from tests.helpers.driver import PID, Driver, healthy, make


class Noticing(Driver):
    """The Driver, with the notices the agent derives from each decision."""

    def __init__(self, s):
        super().__init__(s)
        self.notices = []

    def __call__(self, event):
        before, rung = self.s.state, self.s.rung
        actions = super().__call__(event)
        self.notices += derive(self.s, before, rung, actions, 1_700_000_000 + self.t)
        return actions


def noticing(**sections) -> Noticing:
    d = healthy(**sections)
    n = Noticing(d.s)
    n.t, n.progress = d.t, d.progress
    return n


def kinds(notices):
    return [n.kind for n in notices]


def test_a_hang_gives_a_rung_change_at_the_verdict_and_hang_recovered_once_the_next_attempt_trains():
    d = noticing(ladder={"prior_between_hangs": "off"})  # one hang climbs: the rung change to tell
    d.at(1030)(core.Tick())  # 20 s without progress: hung
    d(core.TreeKilled(3, (), 0.2, 1_700_001_030.0))
    assert kinds(d.notices) == [NoticeKind.RUNG_CHANGED]
    assert (d.notices[0].previous_rung, d.notices[0].rung) == (0, 1)
    d(core.Spawned(PID + 1, None))
    d.beat("train", kind="phase", pid=PID + 1)
    assert kinds(d.notices) == [NoticeKind.RUNG_CHANGED]  # not trained yet: not recovered
    d.at(1040).beat(pid=PID + 1, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    assert kinds(d.notices) == [NoticeKind.RUNG_CHANGED, NoticeKind.HANG_RECOVERED]
    recovered = d.notices[1]
    assert recovered.incident.reason.value == "hang" and recovered.incident.restart_seconds == pytest.approx(10)
    assert "recovered from a hang in train" in recovered.text


def test_a_hang_recovered_in_place_is_a_hang_recovered_once_the_next_batch_comes():
    from tests.helpers.driver import STACKS, loading

    loaded = loading()
    d = Noticing(loaded.s)
    d.t, d.progress = loaded.t, loaded.progress
    inspect = [a for a in d.at(d.t + 10.01)(core.Tick()) if isinstance(a, in_place.InspectStall)][0]
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits for a batch", None, STACKS))
    d.at(d.t + 0.5)(in_place.LoaderWorkersKilled((5001,), (), 0.05))
    assert d.notices == []  # not trained yet: not recovered
    d.at(d.t + 1.0).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert kinds(d.notices) == [NoticeKind.HANG_RECOVERED]
    recovered = d.notices[0]
    assert recovered.incident.tier.value == "in_place" and recovered.incident.restart_seconds is None
    assert "recovered in place from a hang in train" in recovered.text and "0 batches lost" in recovered.text


def test_exits_that_need_a_person_and_a_finished_run_are_noticed_but_not_a_finished_run_booted_again():
    d = noticing()
    d.at(1030)(core.Tick())
    held = Survivor(9, "python", "disk-sleep", ("amdgpu_fence_wait_empty",))  # by the driver: reboot needed
    d(core.TreeKilled(3, (held,), 10.0, None))
    assert kinds(d.notices)[-1] == NoticeKind.NEEDS_A_PERSON and d.notices[-1].exit_code == EXIT_REBOOT_NEEDED

    d = noticing()
    d(core.WorkerExited(EXIT_CONFIG, "a checkpoint of another training"))
    d(core.TreeKilled(1, (), 0.1, None))
    assert kinds(d.notices) == [NoticeKind.NEEDS_A_PERSON] and d.notices[0].exit_code == EXIT_CONFIG

    d = noticing()
    d.beat("done", kind="phase")
    d(core.WorkerExited(0))
    d(core.TreeKilled(0, (), 0.0, None))
    assert kinds(d.notices) == [NoticeKind.FINISHED]
    again = Noticing(d.s)
    again(core.Boot())  # "training already finished; nothing to do"
    assert again.notices == []


def notice(kind=NoticeKind.HANG_RECOVERED, text="x", t=0.0):
    return Notice(kind, text, time=t, rung=1, rung_label="workers=4")


def test_a_bad_night_sends_a_few_notices_then_one_summary_per_window_and_a_final_notice_at_once():
    limit, sent = NoticeLimit(), []
    for k in range(100):  # a hang every 30 s for 50 minutes
        sent += limit.offer(notice(text=f"hang {k}"), now=30.0 * k)
        sent += limit.due(30.0 * k)
    assert [n.text for n in sent] == ["hang 0", "hang 1", "hang 2"]
    assert limit.next_due() == WINDOW  # the first one leaves the window
    assert limit.due(WINDOW - 1) == []
    [summary] = limit.due(WINDOW)
    assert summary.kind == NoticeKind.SUMMARY and summary.counts == {"hang_recovered": 97}
    assert summary.text.startswith("97 more events (97 hang recovered)") and summary.held[-1] == "hang 99"
    assert limit.due(WINDOW + 5) == []
    for k in range(BURST):  # the window is full again (hang 1, hang 2, the summary): held
        assert limit.offer(notice(text=f"late {k}"), now=WINDOW + 10 + k) == []
    final = limit.offer(notice(NoticeKind.FINISHED, "training finished"), now=WINDOW + 20)
    assert kinds(final) == [NoticeKind.SUMMARY, NoticeKind.FINISHED] and final[0].counts == {"hang_recovered": 3}


RECORDER = """import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"stdin": json.loads(sys.stdin.read()), "event": os.environ["YOLO_TRAIN_EVENT"],
                        "rung": os.environ["YOLO_TRAIN_RUNG"]}) + "\\n")
sys.exit(int(sys.argv[2]))
"""


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run_until_done(notify: NotifyCommand) -> None:
    for r in list(notify.running):
        r.process.wait(timeout=60)
    notify.poll()
    assert notify.running == []


def test_the_command_reads_the_notice_on_stdin_and_in_its_environment_and_a_failing_one_is_said_once(tmp_path,
                                                                                                     caplog):
    script, record = tmp_path / "recorder.py", tmp_path / "record.jsonl"
    script.write_text(RECORDER)
    notify = NotifyCommand(NotifyConfig((sys.executable, str(script), str(record), "1")), "night", tmp_path,
                           clock=Clock())
    with caplog.at_level(logging.WARNING, logger="yolo-train"):
        notify.tell(notice(NoticeKind.RUNG_CHANGED, "rung 0 -> 1"))
        notify.tell(notice(NoticeKind.HANG_RECOVERED, "recovered"))
        run_until_done(notify)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(line["event"] for line in lines) == ["hang_recovered", "rung_changed"]
    assert {line["stdin"]["event"] for line in lines} == {"hang_recovered", "rung_changed"}
    assert all(line["rung"] == "1" and line["stdin"]["state_dir"] == str(tmp_path) for line in lines)
    said = [r.message for r in caplog.records if "[notify] command" in r.message]
    assert len(said) == 1 and "exited with status 1" in said[0], said


def test_a_command_that_never_ends_is_killed_at_its_timeout_and_one_that_cannot_start_is_said_once(tmp_path, caplog):
    clock = Clock()
    notify = NotifyCommand(NotifyConfig(("sleep", "1000"), timeout=5.0), "night", tmp_path, clock=clock)
    notify.tell(notice())
    [running] = notify.running
    notify.poll()
    assert running.process.poll() is None and notify.pids() == (running.process.pid,)
    clock.t = 5.0
    with caplog.at_level(logging.WARNING, logger="yolo-train"):
        notify.poll()
    assert running.process.returncode is not None and notify.running == []
    assert "ran longer than [notify] timeout = 5 s and was killed" in caplog.text

    caplog.clear()
    missing = NotifyCommand(NotifyConfig((str(tmp_path / "no-such-command"),)), "night", tmp_path, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="yolo-train"):
        missing.tell(notice())
        missing.tell(notice())
    assert caplog.text.count("cannot be started") == 1


def test_failures_after_the_first_are_counted_and_said_once_an_hour_with_the_last_one(tmp_path, caplog):
    """Issue 41: after its first failure a command's later failures were never said (one that broke later went
    unheard); one failing at every notice must not fill the log either."""
    clock = Clock()
    notify = NotifyCommand(NotifyConfig(("false",)), "night", tmp_path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="yolo-train"):
        for k in range(3):
            clock.t = 60.0 * k
            notify.tell(notice(NoticeKind.FINISHED, f"done {k}"))
            run_until_done(notify)
        assert caplog.text.count("[notify] command") == 1 and "exited with status 1" in caplog.text
        clock.t = 3600.0
        notify.poll()
    said = [r.message for r in caplog.records if "[notify] command" in r.message]
    assert len(said) == 2 and "failed 2 time(s) in the last 60 min, the last: exited with status 1" in said[1], said


def test_a_notify_command_that_is_not_there_is_said_when_the_supervisor_starts(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="yolo-train"):
        NotifyCommand(NotifyConfig(("no-such-notifier",)), "night", tmp_path, clock=Clock())
    assert "'no-such-notifier' is not found on PATH" in caplog.text


def test_notify_config_takes_an_argv_and_a_timeout_and_refuses_a_shell_string():
    config = parse({"train": {"data": "demo"}, "notify": {"command": ["notify-send", "yolo-train"], "timeout": 3}},
                   "<test>", state_dir=Path("/nonexistent"))
    assert config.notify == NotifyConfig(("notify-send", "yolo-train"), 3)
    assert make().config.notify.command == ()
    with pytest.raises(ValueError, match=r"<test>: notify.command: expected a list of strings"):
        parse({"train": {"data": "demo"}, "notify": {"command": "notify-send yolo-train"}}, "<test>")
    assert os.environ.get("YOLO_TRAIN_EVENT") is None


def test_a_real_supervisor_whose_worker_refuses_its_configuration_tells_a_person(write_config, tmp_path):
    """Exit 78 under a real supervisor, a stand-in worker, and the recorder as the [notify] command."""
    from tests.helpers import ROOT
    from tests.helpers.supervised import quiet_config, worker_launcher, yolo_train

    script, record = tmp_path / "recorder.py", tmp_path / "record.jsonl"
    script.write_text(RECORDER)
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{worker_launcher(tmp_path, "import sys; sys.exit(78)")}"
        [notify]
        command = ["{sys.executable}", "{script}", "{record}", "0"]
    """, quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"),
                        env={"PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == EXIT_CONFIG, result.stderr[-2000:]
    [line] = [json.loads(line) for line in record.read_text().splitlines()]  # written before the supervisor exits
    assert line["event"] == "needs_a_person" and line["stdin"]["exit_code"] == EXIT_CONFIG
    assert "[notify] command" not in result.stderr
