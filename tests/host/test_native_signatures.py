"""A hang named by a native frame of the GPU runtime (stack_reading.NATIVE_SIGNATURES): py-spy's native dumps of a
hung main thread (tests/fixtures/stacks/rocr_native_waits.json) read as the capture reads them, each wait named in the
incident with its cause and remedy; a wait no signature names is left unnamed."""

import json
from pathlib import Path

import pytest

from supervisor.decision.stall.stack_reading import ProcessStacks, TreeCapture, as_incident_stacks
from supervisor.host.stacks import _merge_dump

FIXTURE = Path(__file__).parent.parent / "fixtures" / "stacks" / "rocr_native_waits.json"
DUMPS = json.loads(FIXTURE.read_text())["dumps"]


def incident_stacks(dump: list[dict], tmp_path: Path):
    main = ProcessStacks(pid=5100, role="worker", state="R")
    _merge_dump(main, dump)
    loader = ProcessStacks(pid=5200, role="DataLoader worker 0", state="S")
    return as_incident_stacks(TreeCapture(5100, [main, loader], 0.2, 5.0), tmp_path)


@pytest.mark.parametrize("name, frame, cause, remedy", [
    ("rocr_busy_wait", "rocr::core::BusyWaitSignal::WaitRelaxed", "lost SDMA copy completion", "HSA_ENABLE_SDMA=0"),
    ("rocr_lost_interrupt", "rocr::core::InterruptSignal::WaitRelaxed", "interrupt that was lost",
     "HSA_ENABLE_INTERRUPT=0"),
    ("hsakmt_va_map", "hsaKmtMemoryVaMap", "expandable_segments:True on ROCm 7.14", "expandable_segments:False"),
])
def test_each_runtime_wait_is_named_with_its_cause_and_remedy(tmp_path, name, frame, cause, remedy):
    stacks = incident_stacks(DUMPS[name], tmp_path)
    said = stacks.native_signature
    assert said.startswith(f"{name} in pid 5100 ({frame}")
    head, _, cure = said.partition("; remedy: ")
    assert cause in head and remedy in cure


def test_a_wait_no_signature_names_is_left_unnamed(tmp_path):
    assert incident_stacks(DUMPS["plain_futex"], tmp_path).native_signature is None
