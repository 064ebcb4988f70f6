"""A GPU reset in the core: its source kept in the attempt's incident, and on a reset or coredump line the GPU's
devcoredump asked for before anything the line's judgement does (the kernel deletes it 5 minutes after it appears).
Lines from the recorded log tests/fixtures/kernel/amdgpu_reset_sources.dmesg, made events as the shell makes them."""

from pathlib import Path

from supervisor.decision import core
from supervisor.decision.model.actions import KeepDevcoredumps, RecordIncident, Spawn
from supervisor.decision.model.incident import Devcoredump
from supervisor.kernel.catalogue import Catalogue
from supervisor.vocabulary import KernelKind
from tests.helpers.driver import healthy, kinds

LOG = (Path(__file__).parent.parent / "fixtures" / "kernel" / "amdgpu_reset_sources.dmesg").read_text().splitlines()


def line(text: str) -> core.KernelMessage:
    event = next(e for raw in LOG if text in raw and (e := Catalogue().event(raw, "kmsg")))
    return core.KernelMessage(KernelKind(event.kind), event.message, "kmsg", event.pattern, event.pid, None,
                              reset_source=event.reset_source, devcoredump=event.devcoredump)


DUMP = Devcoredump("incidents/devcoredumps-1/devcoredump-devcd1", "devcd1", "0000:c5:00.0", 183_412)


def test_a_reset_line_asks_for_the_devcoredump_first_and_its_incident_names_the_source_and_the_copy():
    d = healthy(kernel_log={"confirm_window": 5})
    actions = d(line("Source:  3"))
    assert kinds(actions) == ["KeepDevcoredumps", "Log"]  # the copy, then the suspicion
    assert actions[0] == KeepDevcoredumps(attempt=1, incident=None, kept=())
    assert kinds(d(core.DevcoredumpsKept(1, (DUMP,)))) == ["Log"]
    assert d(line("AMDGPU device coredump file has been created"))[0].kept == ("devcd1",)  # not copied twice
    actions = d.at(d.t + 5.1)(core.Tick())  # no progress: the reset's hang
    assert kinds(actions)[-1] == "KillTree"
    incident = actions[-1].incident
    assert incident.gpu_resets == ("MES",) and incident.devcoredumps == (DUMP,)
    record = incident.to_dict()
    assert record["gpu_resets"] == ["MES"] and record["devcoredumps"][0]["path"] == DUMP.path
    assert record["kernel_events"][0]["reset_source"] == "MES"


def test_a_dump_kept_after_the_incident_opened_goes_into_it_before_it_is_written():
    d = healthy()
    d(line("Source:  1"))
    d(core.WorkerExited(-6))  # the reset took the worker's context: it crashed
    incident = d.s.incidents[-1]
    assert incident.reason == "crash" and incident.gpu_resets == ("job timeout",)
    actions = d(line("GPU reset succeeded, trying to resume"))  # the MES path dumps after the reset
    assert actions[0] == KeepDevcoredumps(attempt=1, incident=incident.id, kept=())
    late = Devcoredump(f"incidents/{incident.id}/devcoredump-devcd2", "devcd2", "0000:c5:00.0", 9_000)
    d(core.DevcoredumpsKept(1, (late,)))
    d(core.TreeKilled(killed=1))
    assert [i.devcoredumps for i in d.s.incidents if i.id == incident.id and not i.recorded] == [(late,)]
    spawn = [a for a in d.at(d.t + 60)(core.Tick()) if isinstance(a, Spawn)]
    d(core.Spawned(4343, None))
    assert spawn and d.s.current.devcoredumps == [] == d.s.current.gpu_resets  # the next attempt starts with none
    d.beat("train", kind="phase", pid=4343, progress=1)
    d.beat(pid=4343, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    written = [a.incident for a in d(core.StopRequested()) + d(core.TreeKilled(killed=1))
               if isinstance(a, RecordIncident)]  # written as the run ends, its batches after counted or not
    assert [(i.id, i.gpu_resets, i.devcoredumps) for i in written if i.id == incident.id] == \
        [(incident.id, ("job timeout",), (late,))]


def test_another_attempts_dumps_and_a_line_without_a_reset_change_nothing():
    d = healthy()
    assert d(core.DevcoredumpsKept(7, (DUMP,)))[:1] == [] and d.s.current.devcoredumps == []
    assert "KeepDevcoredumps" not in kinds(d(line("ring gfx_0.0.0 timeout")))
    assert d.s.current.gpu_resets == []
