"""The ready standby under the real supervisor on the CPU demo (issue 48): the next attempt waits with its model built,
its datasets built and its training loader's workers started, takes the restart without building or starting any of
them, and trains the same batches as a restart that builds everything; where the device has no room it only imports,
and status says why."""

import os
from pathlib import Path

import pytest

from tests.helpers.supervised import read_incidents, read_state, start_supervisor, status_of, wait_for
from worker.startup.demo_data import ensure_demo_dataset
from worker.supervision.exact_resume import EpochOrderSampler
from worker.training.trainer import RECORD_FED_ENV

pytestmark = pytest.mark.e2e

BATCH, BATCHES = 4, 8  # the demo: 32 training images, 8 batches an epoch


def uninterrupted() -> dict[tuple[int, int], list[str]]:
    """(epoch, batch) -> the images an uninterrupted run feeds there: what any exact restart must train."""
    names = sorted(p.name for p in (ensure_demo_dataset().parent / "images" / "train").iterdir())
    sampler = EpochOrderSampler(len(names), seed=0)
    return {(e, b): [names[i] for i in sampler.order(e)[b * BATCH:(b + 1) * BATCH]]
            for e in range(2) for b in range(BATCHES)}


def trained(fed: Path) -> dict[tuple[int, int], list[str]]:
    """Each position's images as last fed (a replayed batch after the restart overwrites the first feeding). A feeding
    ends at BATCH images too: a restart from the checkpoint just before the hung batch feeds that batch again at once,
    with no other position between."""
    batches: dict[tuple[int, int], list[str]] = {}
    last = None
    for line in fed.read_text().splitlines():
        epoch, batch, name = line.split()
        key = (int(epoch), int(batch))
        if key != last or len(batches[key]) == BATCH:
            batches[key], last = [], key
        batches[key].append(name)
    return batches


def run_with_a_hang(demo_config, tmp_path: Path, worker: str) -> tuple[dict, dict, str, Path]:
    """Attempt 1 hangs at its 12th batch (epoch 2); the status while its standby waits, the restart's incident, the
    supervisor's log and the fed-images record. The ladder's prior on (E2E_CONFIG turns it off): one hang after
    11 batches keeps rung 0, as most restarts of a night do (a spin, a lock, a frozen tree: no rung changes them),
    so the standby, made for rung 1 at the first batch (no speed measured yet), serves rung 0 with rung 0's loader."""
    config = demo_config(f"[worker]\n{worker}\n[checkpoint]\nevery = 1\n")
    config.write_text(config.read_text().replace("epochs = 3", "epochs = 2")
                      .replace('prior_between_hangs = "off"\n', ""))
    state_dir, fed = tmp_path / "state", tmp_path / "fed.txt"
    proc = start_supervisor(config, state_dir, "--fault", "main_hang,at_batch=12,attempt=1",
                            env={RECORD_FED_ENV: str(fed)})
    try:
        waiting = wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == 1 and s["standby_kind"] and s,
                           180, "attempt 1's standby")
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["rung"] == 0, stderr[-3000:]
    [incident] = [i for i in read_incidents(state_dir) if i["reason"] == "hang"]
    return waiting, incident, stderr, fed


def test_a_ready_standby_takes_the_restart_without_building_a_model_or_datasets_nor_starting_loader_workers(
        demo_config, tmp_path):
    waiting, incident, stderr, fed = run_with_a_hang(demo_config, tmp_path, "")  # "auto": the default
    assert waiting["standby_kind"] == "ready" and "MiB free" in waiting["standby_why"], waiting
    assert "the datasets and the training loader (" in stderr
    assert incident["restart_start"] == "ready"
    parts = incident["restart_parts"]
    assert "model" not in parts and "model_load" in parts, parts  # the checkpoint loaded into the held model
    assert "dataset" not in parts, parts  # both datasets held: none built after the verdict
    # no loader workers started, and those held fed at the verdict from the checkpoint resumed (issue 59.1)
    assert "first_batch" not in parts and "first_batch_primed" in parts, parts
    # epochs 1-2 of 2 are close_mosaic's: started anew without it at the verdict, kept through the trainer's reset
    assert "its training loader's workers, started anew without mosaic (one of the last close_mosaic epochs) load " \
        "epoch 2 from " in stderr
    assert "loaded another position" not in stderr
    assert "takes the attempt: its imports, device context, model, datasets and loader are done" in stderr
    assert "model (held ready, checkpoint loaded)" in stderr
    assert "held ready is dropped" not in stderr
    assert trained(fed) == uninterrupted()  # what a cold restart trains: the uninterrupted run's batches


def test_without_room_on_the_device_the_standby_only_imports_and_status_says_why(demo_config, tmp_path):
    """On the CPU the device is the host's memory: a ready standby asking for more than it has finds no room."""
    waiting, incident, stderr, fed = run_with_a_hang(demo_config, tmp_path,
                                                     'standby_ready = "auto"\nstandby_memory_mib = 1000000000')
    assert waiting["standby_kind"] == "imported", waiting
    assert waiting["standby_why"].startswith("no room: the host has") and "standby_memory_mib" in waiting["standby_why"]
    assert "(imported standby: no room: the host has" in stderr
    assert incident["restart_start"] == "imported" and "model" in incident["restart_parts"]
    assert "model (held ready" not in stderr
    assert trained(fed) == uninterrupted()
