"""Values that cannot run are refused before anything runs (issue 50): a bound above a day, a worker count past the
cores, a data file that is not there, a GPU the machine lacks. One line naming file, key and fix; exit 78."""

import os
import sys
from pathlib import Path

import pytest

from supervisor.config import KEYS, WORKERS_PER_CORE, ConfigError, load
from supervisor.config_keys import LONGEST, Reader, Seconds
from supervisor.host import machine_fit
from tests.helpers.supervised import yolo_train

TRAIN = '[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\n'
RENDEZVOUS = 'node_rank = 0\nrdzv_endpoint = "127.0.0.1:29400"\nrdzv_id = "x"\n'
BOUNDS = [k for k in KEYS if isinstance(k.kind, Seconds)]


def one_line_78(result, path, message):
    assert result.returncode == 78 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"yolo-train: {path}: ") and message in line, line
    return line


def _setting(k, value) -> str:
    extra = RENDEZVOUS if k.section == "distributed" else ""
    return f"[{k.section}]\n{extra}{k.name} = {value}\n"


@pytest.mark.parametrize("k", BOUNDS, ids=[k.where for k in BOUNDS])
def test_every_bound_above_a_day_is_refused_and_a_day_is_not(k, write_config):
    """Every key of seconds is declared with the kind that holds the day's limit: none can slip by."""
    with pytest.raises(ConfigError) as error:
        load(write_config(TRAIN + _setting(k, "1e308")))
    assert f": {k.where}: expected " in str(error.value) and "got 1e+308" in str(error.value)
    if k.kind.most == LONGEST:  # not the factor (at most 1000) nor stacks_budget (at most 10)
        assert k.kind.read(LONGEST, k.where, Reader("<test>", Path())) == LONGEST  # the key alone: relations aside


def test_the_cli_refuses_an_idle_floor_of_1e308_in_one_line_before_running(write_config):
    path = write_config(TRAIN + "[watchdog]\nidle_floor = 1e308\n")
    line = one_line_78(yolo_train("check-config", "--config", str(path)), path, "watchdog.idle_floor: expected ")
    assert line.endswith('seconds up to a day (86400) or "off", got 1e+308')
    state = path.parent / "state"
    one_line_78(yolo_train("run", "--config", str(path), "--state-dir", str(state)), path, "watchdog.idle_floor")
    assert not state.exists()


def test_a_worker_count_past_the_cores_is_refused_not_made_a_ladder_of_67_rungs(write_config):
    most = (os.cpu_count() or 1) * WORKERS_PER_CORE
    path = write_config(TRAIN + "workers = 9999999999999999999\n")
    line = one_line_78(yolo_train("check-config", "--config", str(path)), path, f"train.workers: expected at most "
                                                                                 f"{most} ")
    assert line.endswith("got 9999999999999999999")
    load(write_config(TRAIN + f"workers = {most}\n"))
    for rung in ("workers", "threads"):
        with pytest.raises(ConfigError, match=rf"ladder.rungs\[1\].{rung}: expected at most {most} "):
            load(write_config(TRAIN + f"[ladder]\nrungs = [{{ workers = 1 }}, {{ {rung} = {most + 1} }}]\n"))


def test_a_missing_data_file_is_refused_by_check_config_and_by_run(write_config, tmp_path):
    for data in (str(tmp_path / "gone" / "data.yaml"), "datasets/mine.yaml", "no-such-dataset-anywhere.yaml"):
        path = write_config(f'[train]\ndata = "{data}"\nmodel = "yolov8n.yaml"\n')
        checked = yolo_train("check-config", "--config", str(path))
        line = one_line_78(checked, path, "train.data: no such file ")
        assert "not a dataset Ultralytics resolves itself" in line
        run = yolo_train("run", "--config", str(path), "--state-dir", str(tmp_path / "state"))
        assert run.returncode == 78 and run.stderr == checked.stderr and not (tmp_path / "state").exists()
        assert yolo_train("check-config", "--portable", "--config", str(path)).returncode == 0


@pytest.mark.parametrize("data, task", [
    ("coco8.yaml", "detect"), ("coco8", "detect"), ("coco8-seg.yaml", "segment"),  # Ultralytics' cfg/datasets
    ("https://example.com/data.zip", "detect"), ("ul://someone/datasets/x", "detect"),  # downloaded by it
    ("mnist160", "classify"),  # a classification set it downloads from its assets by name
    ("demo", "detect"),  # ours
])
def test_what_ultralytics_resolves_itself_passes(data, task):
    assert machine_fit.data_problem(data, task) is None


def test_a_data_file_is_found_where_run_starts(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    monkeypatch.chdir(tmp_path)
    assert machine_fit.data_problem("mine.yaml") is None and machine_fit.data_problem("./mine.yaml") is None
    assert machine_fit.data_problem("mnist160/", "classify") is not None  # a path, not a name: not downloaded


def test_a_model_that_is_missing_or_no_model_is_refused_by_check_config_and_by_run(write_config, tmp_path):
    """Issue 57.6: such a model passed check-config; `run` then crashed twice at the worker's start and exited 78."""
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    (tmp_path / "coco.yaml").write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")  # a dataset's
    for model, says in ((str(tmp_path / "gone" / "mine.pt"), "no such file "), ("mine-v3.pt", "no such file "),
                        ("nets/yolov8n.yaml", "no such file "), (str(tmp_path / "notes.pt"), "is not a model "),
                        (str(tmp_path / "coco.yaml"), "is not a model ")):
        path = write_config(f'[train]\ndata = "demo"\nmodel = "{model}"\n')
        checked = yolo_train("check-config", "--config", str(path))
        line = one_line_78(checked, path, f"train.model: ")
        assert says in line and line.endswith(("give the path of an existing .pt checkpoint or model YAML",
                                               'such as "yolov8n.yaml"')), line
        run = yolo_train("run", "--config", str(path), "--state-dir", str(tmp_path / "state"))
        assert run.returncode == 78 and run.stderr == checked.stderr and not (tmp_path / "state").exists()
        assert yolo_train("check-config", "--portable", "--config", str(path)).returncode == 0


@pytest.mark.parametrize("model", [
    "yolov8n.yaml", "yolo11n-seg.yaml", "yolov8n6.yaml", "rtdetr-l.yaml",  # built from Ultralytics' cfg/models
    "yolov8n.pt", "yolo11n", "weights/yolo11n-cls.pt",  # names it downloads (GITHUB_ASSETS_NAMES)
    "https://example.com/mine.pt",
])
def test_a_model_ultralytics_builds_or_downloads_by_name_passes(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # none of them is a file here
    assert machine_fit.model_problem(model) is None


def test_a_model_file_is_read_as_a_torch_checkpoint_or_a_model_yaml(tmp_path, monkeypatch):
    import subprocess
    import sys

    checkpoint = tmp_path / "mine.pt"  # as torch.save writes it, in a process of its own (the test imports no torch)
    subprocess.run([sys.executable, "-c", f"import torch; torch.save({{'model': None}}, {str(checkpoint)!r})"],
                   check=True)
    (tmp_path / "net.yaml").write_text("nc: 2\nbackbone: [[-1, 1, Conv, [16, 3, 2]]]\nhead: [[-1, 1, Detect, [nc]]]\n")
    (tmp_path / "broken.yaml").write_text("backbone: [\n")
    monkeypatch.chdir(tmp_path)
    assert machine_fit.model_problem("mine.pt") is None and machine_fit.model_problem("net.yaml") is None
    assert "not YAML" in machine_fit.model_problem("broken.yaml")
    assert "is a directory" in machine_fit.model_problem(str(tmp_path))


def eight_gpus():
    return 8


@pytest.mark.parametrize("device, refused", [
    ("cpu", False), ("", False), (None, False), ("7", False), (7, False), ("cuda:7", False), ("0,1", False),
    ([0, 1], False), ("-1", False), ("cuda", False), ("xpu:3", False),
    ("8", True), ("0,8", True), ("cuda:8", True), ("-1," * 8 + "-1", True), ("gpu0", True), ("0;1", True),
])
def test_a_device_among_the_gpus_torch_sees(device, refused):
    problem = machine_fit.device_problem(device, eight_gpus, set())
    assert bool(problem) == refused, problem


def test_a_device_named_by_its_physical_id_under_cuda_visible_devices_passes():
    """Ultralytics' parse_device takes an id of CUDA_VISIBLE_DEVICES for the index it stands for ('3' -> '0')."""
    assert machine_fit.device_problem("3", lambda: 1, {"3"}) is None
    assert "torch sees GPUs 0 to 0 (under CUDA_VISIBLE_DEVICES)" in machine_fit.device_problem("2", lambda: 1, {"3"})


CUDA_BUILD = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
ROCM_BUILD = "__version__ = '2.9.0+rocm7.0'\ncuda: Optional[str] = None\nhip: Optional[str] = '7.0.51831-a3e329ad8'\n"


def driver_files(root: Path, nvidia: int = 0, amd: int = 0) -> Path:
    """The driver's files as the kernel writes them: a directory per NVIDIA GPU (its PCI address), and amdkfd's
    topology nodes, the CPU's first (no SIMDs), then one per AMD GPU."""
    for i in range(nvidia):
        (root / f"proc/driver/nvidia/gpus/0000:{i + 1:02x}:00.0").mkdir(parents=True)
    for node, simds in enumerate([0] * bool(amd) + [80] * amd):
        path = root / f"sys/class/kfd/kfd/topology/nodes/{node}"
        path.mkdir(parents=True)
        (path / "properties").write_text(f"cpu_cores_count {0 if simds else 16}\nsimd_count {simds}\n"
                                         f"gfx_target_version {110000 if simds else 0}\n")
    return root


def test_the_gpus_the_drivers_files_list_let_a_device_through_without_torchs_count(tmp_path):
    """Counting through the worker's Python imports torch: 3.5-3.9 s of every `run` on an H200 (bench/RESULTS.md,
    the quiet night). The driver's files say as much for the common case; they never refuse a device."""
    root = driver_files(tmp_path, nvidia=2, amd=1)
    assert machine_fit.gpus_present({}, root, CUDA_BUILD) == 2
    assert machine_fit.gpus_present({}, root, ROCM_BUILD) == 1
    assert machine_fit.gpus_present({"CUDA_VISIBLE_DEVICES": "1"}, root, CUDA_BUILD) is None  # torch's to say
    assert machine_fit.gpus_present({"HIP_VISIBLE_DEVICES": ""}, root, ROCM_BUILD) is None
    assert machine_fit.gpus_present({}, root, "__version__ = '2.11.0+cpu'\ncuda = None\nhip = None\n") is None
    assert machine_fit.gpus_present({}, driver_files(tmp_path / "none"), CUDA_BUILD) is None

    def torch_never_asked():
        raise AssertionError("torch's count was asked for")

    assert machine_fit.device_problem("0,1", torch_never_asked, set(), present=2) is None
    # Too few listed: torch's count decides, and only it refuses
    assert machine_fit.device_problem("2", eight_gpus, set(), present=2) is None
    assert "torch sees GPUs 0 to 1" in machine_fit.device_problem("2", lambda: 2, set(), present=2)


def test_mps_only_on_macos_and_an_uncounted_machine_refuses_nothing():
    problem = machine_fit.device_problem("mps", eight_gpus, set())
    assert (problem is None) == (sys.platform == "darwin")
    assert machine_fit.device_problem("7", lambda: None, set()) is None  # no answer: the worker's start says more


def test_a_gpu_this_machine_lacks_is_refused_by_check_config_and_by_run(write_config, tmp_path):
    """The real probe: the worker's Python imports torch and counts; this machine has no 8th GPU."""
    path = write_config('[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\ndevice = "7"\n')
    checked = yolo_train("check-config", "--config", str(path))
    line = one_line_78(checked, path, "train.device: expected a device this machine has: the worker's torch sees ")
    assert line.endswith("got '7'")
    run = yolo_train("run", "--config", str(path), "--state-dir", str(tmp_path / "state"))
    assert run.returncode == 78 and run.stderr == checked.stderr and not (tmp_path / "state").exists()
    assert yolo_train("check-config", "--portable", "--config", str(path)).returncode == 0


def test_the_gpus_are_counted_by_the_workers_python_in_the_workers_environment(write_config, tmp_path):
    """A [worker] python that answers as torch would on a host of 8 GPUs when the worker's env says so (no such
    host here): device 7 passes, 8 is refused."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\n[ "$YOLO_TRAIN_TEST_GPUS" = 8 ] && echo 8 || echo 0\n')
    python.chmod(0o755)
    for device, code in (("7", 0), ("8", 78)):
        path = write_config(f'[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\ndevice = "{device}"\n'
                            f'[worker]\npython = "{python}"\nenv = {{ YOLO_TRAIN_TEST_GPUS = "8" }}\n')
        result = yolo_train("check-config", "--config", str(path))
        assert result.returncode == code, result.stderr
    assert "the worker's torch sees GPUs 0 to 7; use device = \"cpu\" or indices below 8, got '8'" in result.stderr
