"""The 2026 amdgpu lines (issue 40), judged as every stall and GPU-fault line: a per-queue ring reset the process
survives, with training going on, kills nothing; the same line while progress has stopped kills within the confirm
window. Lines classified by the catalogue from the recorded log (tests/fixtures/kernel/amdgpu_2026.dmesg)."""

from pathlib import Path

from supervisor.decision import core
from supervisor.kernel.catalogue import classify
from supervisor.vocabulary import KernelKind
from tests.helpers.driver import healthy, kinds

LOG = (Path(__file__).parent.parent / "fixtures" / "kernel" / "amdgpu_2026.dmesg").read_text().splitlines()


def line_of(pattern: str) -> core.KernelMessage:
    line = next(line for line in LOG if (c := classify(line)) and c.pattern == pattern)
    kind, _, pid = classify(line)
    return core.KernelMessage(KernelKind(kind), line, "kmsg", pattern, pid, None)


def test_a_ring_reset_the_training_survives_kills_nothing():
    d = healthy()
    for pattern in ("amdgpu_ring_reset_succeeded", "amdgpu_utcl2_client", "amdgpu_recovery_disabled"):
        assert kinds(d(line_of(pattern)))[-1] == "Log"
        d.train_until(d.t + 30, 0.5)  # training goes on past the confirm window
        assert d.s.state == core.State.HEALTHY and d.s.current.suspicion is None


def test_the_same_line_while_progress_has_stopped_kills_within_the_confirm_window():
    d = healthy(kernel_log={"confirm_window": 5})  # before the train phase's own 10 s
    d(line_of("amdgpu_ring_reset_succeeded"))
    assert d.at(d.t + 4.9)(core.Tick()) == []
    actions = d.at(d.t + 0.11)(core.Tick())
    assert kinds(actions)[-1] == "KillTree"
    assert actions[-1].incident.kernel_events[0]["pattern"] == "amdgpu_ring_reset_succeeded"
