"""Whether the next attempt waits ready or only imported (issue 48): the training's device must have the room the
ready standby asks for; anything that rules one out is said in a line status shows."""

import json
from pathlib import Path

from supervisor.attempt.ready_room import cuda_index, room
from supervisor.attempt.standby_worker import serves
from supervisor.vocabulary import WorkerStart
from worker.wire.contract import ENV_READY, WorkerOptions

GIB = 1 << 30
TRAIN = {"model": "yolov8n.yaml", "data": "demo", "device": 0, "imgsz": 640, "batch": 16, "epochs": 3}


REPORT = Path("/state/standby-ready.json")


def test_a_card_that_the_training_fills_keeps_the_imported_standby_and_says_why():
    full = room("auto", 1024, TRAIN, False, gpu_free=lambda index: GIB // 2)
    assert full.kind is WorkerStart.IMPORTED and full.env(TRAIN, WorkerOptions(), REPORT) == {}
    assert full.why == "no room: GPU 0 has 512 MiB free, a ready standby needs 1024 MiB ([worker] standby_memory_mib)"
    roomy = room("auto", 1024, TRAIN, False, 25, gpu_free=lambda index: 60 * GIB, cpu_free=lambda: 8 * GIB)
    assert roomy.kind is WorkerStart.READY and "GPU 0 has 61440 MiB free" in roomy.why
    told = json.loads(roomy.env(TRAIN, WorkerOptions(start_method="forkserver"), REPORT)[ENV_READY])
    # the rung's loader too, and on a GPU the host's share (a RAM cache is host memory: issue 57.4)
    assert told == {"train": TRAIN, "memory_mib": 1024, "host_mib": 2048, "report": str(REPORT),
                    "options": {"loader": "process", "start_method": "forkserver", "persistent_workers": True}}
    assert "the host's 25 % of its available memory, 2048 MiB, may hold the datasets" in roomy.why


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


def test_a_ready_standbys_datasets_are_stale_once_files_are_added_or_removed_in_their_dirs_or_lists(tmp_path):
    """Issue 57.5: read cheaply (the files' count, their directories' newest mtime), before the launch."""
    from supervisor.attempt.standby_worker import stale
    from worker.wire.contract import DataFiles, StandbyReport

    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    for name in ("1.png", "2.png", "a/3.png"):
        (images / name).write_bytes(b"")
    listed = tmp_path / "val.txt"
    listed.write_text("./images/1.png\n./images/a/3.png\n")
    report = StandbyReport(data=(DataFiles.read(str(images)), DataFiles.read(str(listed))))
    # the list: the files where its images lie (images/ holds 2 and a directory, images/a 1)
    assert [d.files for d in report.data] == [3, 4] and stale(report) is None and stale(None) is None
    (images / "a" / "3.png").unlink()  # gone from a subdirectory, and from where the list's lie
    assert stale(report) == (f"its datasets no longer match the files on disk ({images}: 3 files then, 2 now; "
                             f"{listed}: 4 files then, 3 now)")
    assert StandbyReport.from_json(report.to_json()) == report
