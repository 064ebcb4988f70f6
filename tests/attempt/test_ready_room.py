"""Whether the next attempt waits ready or only imported (issue 48): the training's device must have the room the
ready standby asks for; anything that rules one out is said in a line status shows."""

import json

from supervisor.attempt.ready_room import cuda_index, room
from supervisor.attempt.standby_worker import serves
from supervisor.vocabulary import WorkerStart
from worker.wire.contract import ENV_READY, WorkerOptions

GIB = 1 << 30
TRAIN = {"model": "yolov8n.yaml", "data": "demo", "device": 0, "imgsz": 640, "batch": 16, "epochs": 3}


def test_a_card_that_the_training_fills_keeps_the_imported_standby_and_says_why():
    full = room("auto", 1024, TRAIN, False, gpu_free=lambda index: GIB // 2)
    assert full.kind is WorkerStart.IMPORTED and full.env(TRAIN, WorkerOptions()) == {}
    assert full.why == "no room: GPU 0 has 512 MiB free, a ready standby needs 1024 MiB ([worker] standby_memory_mib)"
    roomy = room("auto", 1024, TRAIN, False, gpu_free=lambda index: 60 * GIB)
    assert roomy.kind is WorkerStart.READY and "GPU 0 has 61440 MiB free" in roomy.why
    told = json.loads(roomy.env(TRAIN, WorkerOptions(start_method="forkserver"))[ENV_READY])  # the rung's loader too
    assert told == {"train": TRAIN, "memory_mib": 1024,
                    "options": {"loader": "process", "start_method": "forkserver", "persistent_workers": True}}


def test_the_cpu_has_room_unless_configured_otherwise_and_what_rules_a_ready_standby_out():
    cpu = {**TRAIN, "device": "cpu"}
    assert room("auto", 1024, cpu, False, cpu_free=lambda: 8 * GIB).kind is WorkerStart.READY
    assert room("auto", 1024, cpu, False, cpu_free=lambda: GIB // 4).why.startswith("no room: the host has 256 MiB")
    assert room("off", 1024, cpu, False).why == '[worker] standby_ready = "off"'
    assert room("auto", 1024, cpu, True).why.startswith("DDP")
    assert room("auto", 1024, {**TRAIN, "device": "0,1"}, False).why.startswith("several devices")
    unknown = room("auto", 1024, TRAIN, False, gpu_free=lambda index: None)
    assert unknown.kind is WorkerStart.IMPORTED and "unknown" in unknown.why


def test_the_device_a_train_table_names():
    assert [cuda_index(d) for d in ("cpu", "mps", None, "", 0, "1", "cuda:2", "0,1", [0, 1])] == \
        [None, None, 0, 0, 0, 1, 2, "several", "several"]


def test_a_ready_standby_serves_the_launch_of_its_rung():
    rung = {"PATH": "/usr/bin"}
    assert serves({**rung, ENV_READY: "{}"}, rung)  # what it built is checked at the launch (worker/standby/ready.py)
