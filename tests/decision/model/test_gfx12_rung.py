"""The rung AMD names for gfx12 (issue 55.2): ``TORCH_BLAS_PREFER_HIPBLASLT=0`` in the default ROCm ladder on a gfx1200
or gfx1201 card only (the card read from the kfd topology, tests/fixtures/doctor/rx9070xt), weighed by a GPU reset or
page fault in training alone (a kernel line, or ROCr's abort on one), never by a hang without that evidence; its
cost said in the log where it is taken. In the pure core on a chosen clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from supervisor.decision.learning import hang_evidence
from supervisor.decision.model.ladder import HIPBLASLT, build_ladder
from supervisor.host.torch_build import training_gfx
from supervisor.vocabulary import KernelKind
from tests.helpers.driver import PID, Driver

FIXTURES = Path(__file__).parents[2] / "fixtures" / "doctor"
SDMA, HIPBLASLT_RUNG, FORKSERVER = 1, 2, 3
# amdgpu's gmc_v12_0 process_interrupt() line, and ROCr's VMFaultHandler line, as users posted them
PAGE_FAULT = ("amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32774, for process "
              "python pid 4242 thread python pid 4242)")
ROCR_FAULT = ("Memory access fault by GPU node-1 (Agent handle: 0x5d8b398786a0) on address 0x774546a00000. Reason: "
              "Page not present or supervisor privilege.")
DEVICE = {"kind": "device", "where": "trainer.py:42 in step", "stalled": 1.0, "function": "synchronize"}


def test_the_rung_is_in_the_rocm_ladder_of_a_gfx12_card_only():
    ladder = build_ladder(None, 8, rocm=True, gfx=("gfx1201",))
    assert ladder.rungs[SDMA] == {"env": {"HSA_ENABLE_SDMA": "0"}}  # the SDMA rung keeps its first place
    assert ladder.rungs[HIPBLASLT_RUNG] == {"env": {HIPBLASLT: "0"}}
    assert ladder.settings(FORKSERVER)["env"] == {"HSA_ENABLE_SDMA": "0", HIPBLASLT: "0"}
    for other in (build_ladder(None, 8, rocm=True, gfx=("gfx1100",)), build_ladder(None, 8, rocm=True),
                  build_ladder(None, 8, cuda=True, gfx=("gfx1201",))):
        assert all(HIPBLASLT not in rung.get("env", {}) for rung in other.rungs)
    assert HIPBLASLT in build_ladder(None, 8, rocm=True, gfx=("gfx1100", "gfx1200")).settings(HIPBLASLT_RUNG)["env"]


def test_the_card_is_read_from_the_kfd_topology():
    assert training_gfx(FIXTURES / "rx9070xt", None) == ("gfx1201",)
    assert training_gfx(FIXTURES / "rx9070xt", "0") == ("gfx1201",)
    assert training_gfx(FIXTURES / "rx6900xt", "0") == ("gfx1030",)
    assert training_gfx(FIXTURES / "rx9070xt", "3") == ()


def on_gfx12(rung: int = SDMA) -> Driver:
    config = parse({"train": {"workers": 8, "epochs": 3}, "ladder": {"prior_between_hangs": "off"},
                    "kernel_log": {"confirm_window": 5}}, "<test>", state_dir=Path("/nonexistent"))
    s = core.Supervision(config, build_ladder(None, 8, rocm=True, gfx=("gfx1201",)))
    s.rung = rung
    d = Driver(s)
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    for batch in range(1, 13):  # 6 s of training at 2 it/s: a hang soon after the start
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=batch, batches=100, samples=4)
    return d


def moved_to(actions) -> int:
    spawns = [a for a in actions if isinstance(a, Spawn)]
    assert spawns, actions
    return spawns[0].rung


def hang(d: Driver, word: dict | None) -> list:
    if word is not None:
        d.beat("train", kind="wait", pid=PID, progress=d.progress, wait=word)
    actions = d.at(d.t + 10.01)(core.Tick())
    assert d.s.stop is not None and d.s.stop.reason == core.Reason.HANG
    return actions + d(core.TreeKilled(killed=1))


@pytest.mark.parametrize("word", [DEVICE, None], ids=["device wait", "no word"])
def test_a_hang_without_a_reset_or_page_fault_does_not_weigh_it(word):
    d = on_gfx12()
    actions = hang(d, word)
    assert moved_to(actions) == FORKSERVER  # past the hipBLASLt rung, which changes nothing this hang depends on
    said = [a.text for a in actions if isinstance(a, core.Log) and "rung" in a.text and "safer" in a.text]
    assert said and "reset or page fault" not in said[0]
    assert "its cost: TORCH_BLAS_PREFER_HIPBLASLT=0" in said[0]  # the ladder is cumulative: the rung taken has it too


def test_a_page_fault_line_in_training_weighs_it_and_the_log_says_its_cost():
    d = on_gfx12()
    d(core.KernelMessage(KernelKind.GPU_FAULT, PAGE_FAULT, "kmsg", "amdgpu_page_fault", pid=PID, in_worker_tree=True))
    assert d.s.current.gpu_fault == "amdgpu_page_fault"
    actions = d.at(d.t + 5.01)(core.Tick())  # the confirm window passed without progress
    assert d.s.stop is not None and d.s.stop.reason == core.Reason.KERNEL
    actions += d(core.TreeKilled(killed=1))
    assert moved_to(actions) == HIPBLASLT_RUNG
    said = [a.text for a in actions if isinstance(a, core.Log) and a.text.startswith("one rung safer")]
    assert said and "a GPU reset or page fault in training (amdgpu_page_fault): TORCH_BLAS_PREFER_HIPBLASLT=0" in said[0]
    assert "its cost: TORCH_BLAS_PREFER_HIPBLASLT=0: its matrix products go through hipBLAS instead of hipBLASLt" \
        in said[0]
    assert said[0].endswith("the rung's own speed is measured as it trains (rung 1 trained at 2.00 it/s)")


def test_rocr_aborting_on_a_page_fault_in_training_weighs_it():
    d = on_gfx12()
    d.s.current.last_error = None
    actions = d(core.WorkerExited(-6, last_words=ROCR_FAULT))
    actions += d(core.TreeKilled(killed=1))
    assert d.s.incidents[-1].reason == core.Reason.HANG
    assert moved_to(actions) == HIPBLASLT_RUNG


def test_a_reset_before_the_first_batch_is_not_training_and_does_not_weigh_it():
    config = parse({"train": {"workers": 8, "epochs": 3}}, "<test>", state_dir=Path("/nonexistent"))
    s = core.Supervision(config, build_ladder(None, 8, rocm=True, gfx=("gfx1201",)))
    d = Driver(s)
    d.boot_and_spawn()
    d(core.KernelMessage(KernelKind.GPU_FAULT, "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!", "kmsg",
                         "amdgpu_reset_begin"))
    assert d.s.current.gpu_fault is None and hang_evidence.of(d.s).gated == frozenset()
