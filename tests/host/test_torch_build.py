"""What the shell reads of the installed torch for the core (host/torch_build.py): its version and, under a ROCm build,
the MIOPEN_ variables the worker inherits (decision/model/miopen_modes.py's MiopenRun), and the training GPUs' real
architectures from the kfd topology (tests/fixtures/doctor trees)."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision import MiopenRun
from supervisor.host import torch_build

FIXTURES = Path(__file__).parents[1] / "fixtures" / "doctor"
# torch/version.py of a ROCm wheel, as it is written (`hip: Optional[str] = '...'`)
ROCM_VERSION_PY = "__version__ = '2.14.1+rocm7.14.0'\ndebug = False\ncuda: Optional[str] = None\n" \
                  "hip: Optional[str] = '7.14.26071-1f2c3b4d5'\n"


def config(**train):
    return parse({"train": {"workers": 8, "epochs": 3, **train}}, "<test>", state_dir=Path("/nonexistent"))


def test_the_torch_version_is_read_from_its_distribution_version():
    assert torch_build.torch_version("2.14.1+rocm7.14.0") == (2, 14)
    assert torch_build.torch_version("2.7.0.dev20250208+rocm6.3") == (2, 7)
    assert torch_build.torch_version("") is None


def test_no_miopen_run_without_a_rocm_build():
    assert torch_build.miopen_run_for(config()) is None  # this venv's torch is not a ROCm build


def test_a_rocm_build_gives_its_version_and_only_the_miopen_variables(monkeypatch):
    monkeypatch.setattr(torch_build, "_installed_torch", lambda: ("2.14.1+rocm7.14.0", ROCM_VERSION_PY))
    run = torch_build.miopen_run_for(config(), {"MIOPEN_FIND_MODE": "FAST", "MIOPEN_USER_DB_PATH": "/db",
                                                "HSA_ENABLE_SDMA": "0", "PATH": "/usr/bin"})
    assert run == MiopenRun((2, 14), {"MIOPEN_FIND_MODE": "FAST", "MIOPEN_USER_DB_PATH": "/db"})
    assert torch_build.detect(None, FIXTURES / "rx9070xt").gfx == ("gfx1201",)
    assert torch_build.detect("cpu", FIXTURES / "rx9070xt").gfx == ()


def test_the_visible_devices_renumber_the_gpus(tmp_path):
    root = tmp_path / "two"  # an RX 6900 XT as GPU node 1, an RX 9070 XT as node 2
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    for n, card in ((0, "rx6900xt"), (1, "rx6900xt"), (2, "rx9070xt")):
        (nodes / str(n)).mkdir(parents=True)
        source = FIXTURES / card / "sys/class/kfd/kfd/topology/nodes" / ("0" if n == 0 else "1") / "properties"
        (nodes / str(n) / "properties").write_text(source.read_text())
    assert torch_build.training_gfx(root, "0") == ("gfx1030",)
    assert torch_build.training_gfx(root, "0", torch_build.visible_devices({"HIP_VISIBLE_DEVICES": "1"})) == ("gfx1201",)
    assert torch_build.training_gfx(root, "0,1", torch_build.visible_devices({"ROCR_VISIBLE_DEVICES": "1,0"})) == \
        ("gfx1201", "gfx1030")
    assert torch_build.visible_devices({"ROCR_VISIBLE_DEVICES": "1,0", "HIP_VISIBLE_DEVICES": "1"}) == [0]
    assert torch_build.visible_devices({"HIP_VISIBLE_DEVICES": "GPU-0123abcd"}) is None
