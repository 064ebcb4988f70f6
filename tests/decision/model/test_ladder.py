"""The default ladder: rungs that cost no speed first, the threads rung before workers = 0, ROCm detected from the
installed torch's files without importing it; custom rungs as written."""

from __future__ import annotations

import pytest

from supervisor.config import parse
from supervisor.decision.model.ladder import ROCM_ENV_RUNGS, build_ladder, default_ladder
from supervisor.host.torch_build import cuda_version_in, detect, hip_version_in, ladder_for, nvidia_gpu_present
from worker.wire.contract import ULTRALYTICS_DEFAULT_WORKERS, loader_workers, split_rung


def test_default_ladder_keeps_the_speed_longest_and_ends_without_loader_concurrency():
    assert default_ladder(8).rungs == ({}, {"workers": 4}, {"workers": 2}, {"workers": 1},
                                       {"persistent_workers": False}, {"loader": "threads"},
                                       {"loader": "process", "workers": 0}, {"val": False})
    assert default_ladder(0).rungs == ({}, {"val": False})  # no loader processes to make safer
    ladder = default_ladder(2)
    assert ladder.settings(3) == {"workers": 1, "persistent_workers": False, "loader": "threads"}
    assert ladder.label(3) == "workers=1, persistent_workers=false, loader=threads"
    # The worker sees the threads rung as its options (threads: None, the CPU count) and workers = 0 after it.
    assert (split_rung(ladder.settings(3)).options.loader, split_rung(ladder.settings(3)).options.threads) == (
        "threads", None)
    last_loader = split_rung(ladder.settings(4))
    assert last_loader.options.loader == "process" and last_loader.trainer_args == {"workers": 0}
    assert ladder.next(len(ladder) - 1) == len(ladder) - 1 and ladder.exhausted(len(ladder) - 1)


def test_under_rocm_sdma_then_forkserver_then_the_busy_waiting_interrupt_rung_come_first_and_add_up():
    """HSA_ENABLE_INTERRUPT=0 turns every wait into a busy one (rocr's BusyWaitSignal, issue 40): after the rungs that
    change no wait, the SDMA rung and the forkserver."""
    ladder = default_ladder(8, rocm=True)
    assert ladder.rungs[1] == ROCM_ENV_RUNGS[0] == {"env": {"HSA_ENABLE_SDMA": "0"}}
    assert ladder.rungs[2] == {"start_method": "forkserver"} and ladder.rungs[3] == ROCM_ENV_RUNGS[1]
    assert ladder.rungs[4:] == default_ladder(8).rungs[1:]
    assert ladder.settings(1) == {"env": {"HSA_ENABLE_SDMA": "0"}}
    assert ladder.settings(4) == {"env": {"HSA_ENABLE_SDMA": "0", "HSA_ENABLE_INTERRUPT": "0"},
                                  "start_method": "forkserver", "workers": 4}
    assert split_rung(ladder.settings(3)).env == {"HSA_ENABLE_INTERRUPT": "0", "HSA_ENABLE_SDMA": "0"}
    assert ladder.label(1) == "env=HSA_ENABLE_SDMA"  # names only, never values
    # The forkserver workers are the worker's option; the Ultralytics arguments stay as configured.
    served = split_rung(ladder.settings(2))
    assert served.options.start_method == "forkserver" and served.trainer_args == {}
    assert served.options.forks_from_server(8) and not served.options.forks_from_server(0)
    assert ladder.label(3) == "env=HSA_ENABLE_INTERRUPT+HSA_ENABLE_SDMA, start_method=forkserver"
    assert build_ladder(None, 8, rocm=True) == ladder and build_ladder(None, 8, rocm=False) == default_ladder(8)
    assert default_ladder(0, rocm=True).rungs[1:3] == ROCM_ENV_RUNGS  # no forkserver rung: the two env rungs
    # workers = 0 configured: no worker process to start otherwise, no such rung.
    assert {"start_method": "forkserver"} not in default_ladder(0, rocm=True).rungs


@pytest.mark.parametrize("text, rocm", [
    ("hip: Optional[str] = '6.2.41133-dd7f95766'\ncuda: Optional[str] = None\n", True),  # a ROCm wheel
    ("hip = '5.7.31921'\n", True),  # older builds: no annotation
    ("cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", False),
    ("__all__ = ['hip', 'rocm']\nhip: Optional[str] = None\n", False),  # the name listed is no version
])
def test_a_rocm_build_is_told_from_torch_version_py_as_text(text, rocm):
    assert hip_version_in(text) is rocm


def test_the_installed_torch_here_is_no_rocm_build_so_no_env_rungs():
    import torch

    gpu = torch.version.cuda is not None and torch.cuda.is_available()
    assert detect().rocm is (torch.version.hip is not None) and detect().cuda is gpu
    config = parse({"train": {"workers": 2}}, "t.toml")
    assert ladder_for(config) == default_ladder(2, rocm=torch.version.hip is not None, cuda=gpu)


def test_a_command_unconfigured_gets_rung_0_alone_and_its_own_rungs_when_configured():
    command = {"worker": {"command": ["python", "train.py"]}}
    assert ladder_for(parse(command, "t.toml")).rungs == ({},)
    configured = {**command, "ladder": {"rungs": [{"args": {"--workers": "0"}}]}}
    assert ladder_for(parse(configured, "t.toml")).rungs == ({}, {"args": {"--workers": "0"}})


def test_the_loader_workers_asked_for_are_the_rungs_else_the_train_tables_else_ultralytics_default():
    assert loader_workers({}) == ULTRALYTICS_DEFAULT_WORKERS == 8
    assert loader_workers({"workers": 2}) == 2 and loader_workers({"workers": 2}, {"workers": 0}) == 0
    assert ladder_for(parse({"train": {"data": "coco8.yaml", "device": "cpu"}}, "t.toml")).rungs[1] == {"workers": 4}


def test_on_a_cuda_gpu_forkserver_workers_come_first_and_never_for_a_cpu_training(tmp_path):
    ladder = default_ladder(8, cuda=True)
    # Measured on the H100: isolated workers train as fast as forked ones, workers 4 at 0.53x; forked from a
    # preloaded server they start as fast too (spawn: 28 s to the first batch).
    assert ladder.rungs[:3] == ({}, {"start_method": "forkserver"}, {"workers": 4})
    assert ladder.label(2) == "start_method=forkserver, workers=4"
    assert {"start_method": "forkserver"} not in default_ladder(0, cuda=True).rungs
    # [train] device = "cpu": no GPU runtime in the training process for a forked worker to inherit.
    assert not detect("cpu").cuda and not detect(" CPU ").cuda
    assert ladder_for(parse({"train": {"workers": 8, "device": "cpu"}}, "t.toml")).rungs[1] == {"workers": 4}


@pytest.mark.parametrize("text, cuda", [
    ("cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", True),
    ("hip: Optional[str] = '6.2.41133-dd7f95766'\ncuda: Optional[str] = None\n", False),  # a ROCm wheel
    ("cuda = None\n", False),  # a CPU wheel
])
def test_a_cuda_build_is_told_from_torch_version_py_as_text(text, cuda):
    assert cuda_version_in(text) is cuda


def test_a_gpu_is_present_only_where_the_nvidia_driver_lists_one(tmp_path):
    assert not nvidia_gpu_present(tmp_path / "missing")
    assert not nvidia_gpu_present(tmp_path)
    (tmp_path / "0000:01:00.0").mkdir()
    assert nvidia_gpu_present(tmp_path)


def test_custom_rungs_are_as_written_after_rung_0():
    ladder = build_ladder(({"loader": "threads", "threads": 2},), 8, rocm=True)
    assert ladder.rungs == ({}, {"loader": "threads", "threads": 2})
    options = split_rung(ladder.settings(1)).options
    assert (options.loader, options.threads) == ("threads", 2)
