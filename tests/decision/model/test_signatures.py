"""Failure signatures: workers that print the real output of each failure, and the remedy the supervisor picks.

The fake workers are small Python programs launched in place of the Ultralytics worker ([worker] python); they
print what PyTorch, HIP and MIOpen really print (there is no AMD GPU here to make them say it) and speak the
real heartbeat protocol.
"""

import json

import pytest

from supervisor.decision.model.signatures import scan
from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state, worker_launcher, yolo_train

FAKE_WORKER = r'''
import json, math, os, sys, time
from worker.heartbeat import Heartbeat
settings = json.load(open(sys.argv[-1]))
attempt, mode = settings["attempt"], os.environ["FAKE_MODE"]
state_dir = settings["train"]["project"]
json.dump(settings, open(os.path.join(state_dir, f"seen-{attempt}.json"), "w"))
hb = Heartbeat.from_env()
hb.phase("setup")
if attempt == 1 and mode == "miopen":
    print("MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1030_40.kdb Performance may degrade. "
          "Please follow instructions to install: https://github.com/ROCm/MIOpen#installing-miopen-kernels-package",
          file=sys.stderr, flush=True)
    time.sleep(3600)
if attempt == 1 and mode == "optional_logger":  # harmless: an optional logger says why it is off
    print("wandb: ModuleNotFoundError: No module named 'wandb'", file=sys.stderr, flush=True)
batch = settings["trainer_args"].get("batch", settings["train"].get("batch", 16))
hb.settings({"batch": batch, "amp": settings["trainer_args"].get("amp", True), "workers": 0})
hb.phase("train", epoch=1, epochs=1, batch=0, batches=20)
for i in range(20):
    time.sleep(0.05)
    loss = float("nan") if (attempt == 1 and mode == "nan" and i >= 5) else 1.0 / (i + 1)
    hb.beat(epoch=1, epochs=1, batch=i + 1, batches=20, samples=batch, losses={"box_loss": loss})
    if attempt == 1 and i == 8 and mode in ("rocm_mismatch", "gpu_oom", "optional_logger"):
        print("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>", file=sys.stderr)
        print({"rocm_mismatch": "RuntimeError: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`",
               "optional_logger": "RuntimeError: a crash of its own cause",
               "gpu_oom": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
                          "total capacity of 5.98 GiB of which 0 bytes is free. Of the allocated memory 5.12 GiB "
                          "is allocated by PyTorch, and 301.66 MiB is reserved by PyTorch but unallocated."}[mode],
              file=sys.stderr, flush=True)
        sys.exit(1)
    if attempt == 1 and i == 8 and mode == "nccl_timeout":  # torch's own bound on a collective ends the rank
        print("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=3, NumelOut=3, Timeout(ms)=5000) ran "
              "for 5081 milliseconds before timing out.", file=sys.stderr, flush=True)
        os.abort()  # as ProcessGroupNCCL takes the process down: SIGABRT
    if attempt == 1 and i == 8 and mode in ("rocr_gpu_hang", "rocr_memory_error"):  # ROCr's fprintf, then abort()
        print({"rocr_gpu_hang": "HW Exception by GPU node-1 (Agent handle: 0x55cf74a379c0) reason :GPU Hang",
               "rocr_memory_error": "Memory critical error by agent node-1 (Agent handle: 0x5eac2930) on address "
                                    "0x7fbb51601000. Reason: Memory in use. "}[mode], file=sys.stderr, flush=True)
        os.abort()
hb.phase("done")
'''


@pytest.fixture
def run_fake(write_config, tmp_path):
    def run(mode: str, extra: str = ""):
        launcher = worker_launcher(tmp_path, FAKE_WORKER)
        config = write_config(f"""
            [train]
            batch = 16
            [worker]
            python = "{launcher}"
            [restart]
            backoff_initial = 0.1
        """, quiet_config(), extra)
        state_dir = tmp_path / "state"
        result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir),
                            env={"PYTHONPATH": str(ROOT), "FAKE_MODE": mode}, timeout=120)
        seen = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in state_dir.glob("seen-*.json")}
        return result, state_dir, seen
    return run


def test_a_rocm_version_mismatch_is_a_configuration_error_not_a_restart_loop(run_fake):
    result, state_dir, seen = run_fake("rocm_mismatch")
    assert result.returncode == 78
    last = result.stderr.strip().splitlines()[-1]
    assert "HIPBLAS_STATUS_ALLOC_FAILED" in last and "does not fit the installed ROCm" in last
    assert "not restarting" in last and list(seen) == [1]
    assert read_state(state_dir)["status"]["state"] == "failed"


def test_gpu_out_of_memory_restarts_with_half_the_batch(run_fake):
    result, state_dir, seen = run_fake("gpu_oom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "batch" not in seen[1]["trainer_args"] and seen[2]["trainer_args"]["batch"] == 8
    status = read_state(state_dir)["status"]
    assert status["restarts_by_reason"] == {"oom": 1} and status["rung"] == 0 and status["remedies"] == {"batch": 8}
    assert read_incidents(state_dir)[0]["reason"] == "oom"


def test_a_harmless_signature_line_earlier_does_not_make_a_later_crash_a_configuration_error(run_fake):
    result, state_dir, seen = run_fake("optional_logger")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "worker output shows missing_module" in result.stderr and sorted(seen) == [1, 2]  # seen and said, then restarted
    assert read_state(state_dir)["status"]["restarts_by_reason"] == {"crash": 1}


def test_nan_losses_restart_from_last_checkpoint_with_amp_off(run_fake):
    result, state_dir, seen = run_fake("nan")
    assert result.returncode == 0, result.stderr[-2000:]
    incident = read_incidents(state_dir)[0]
    assert incident["reason"] == "nan" and "non-finite losses in 3 batches" in incident["detail"]
    assert "amp" not in seen[1]["trainer_args"] and seen[2]["trainer_args"]["amp"] is False


def test_a_hang_before_the_first_batch_after_the_miopen_warning_turns_the_conv_fallback_on(run_fake):
    result, state_dir, seen = run_fake("miopen", extra="[watchdog]\nstartup_timeout = 5\n")
    assert result.returncode == 0, result.stderr[-2000:]
    incident = read_incidents(state_dir)[0]
    assert (incident["reason"], incident["phase"]) == ("hang", "startup")
    assert "after miopen_kdb_missing: MIOpen has no kernel database" in incident["detail"]
    assert seen[2]["options"]["conv_fallback"] == "on"
    assert read_state(state_dir)["status"]["rung"] == 0  # the remedy instead of a rung: fewer workers would not help


def test_a_rank_ended_by_torchs_collective_watchdog_is_the_hang_restarted_from_the_checkpoint_not_a_crash(run_fake):
    result, state_dir, _ = run_fake("nccl_timeout")
    assert result.returncode == 0, result.stderr[-2000:]
    incident = read_incidents(state_dir)[0]
    assert (incident["reason"], incident["phase"], incident["tiers"]) == ("hang", "train", ["restart"])
    assert "after torch's collective timeout ended a rank" in incident["detail"]
    assert "Watchdog caught collective operation timeout" in incident["detail"]
    assert read_state(state_dir)["status"]["attempt"] == 2


@pytest.mark.parametrize("mode, line", [("rocr_gpu_hang", "HW Exception by GPU node-1"),
                                        ("rocr_memory_error", "Memory critical error by agent node-1")])
def test_rocrs_abort_on_a_hung_gpu_is_a_hang_restarted_as_one_not_a_crash(run_fake, mode, line):
    result, state_dir, seen = run_fake(mode)
    assert result.returncode == 0, result.stderr[-2000:]
    incident = read_incidents(state_dir)[0]
    assert (incident["reason"], incident["phase"], incident["tiers"]) == ("hang", "train", ["restart"])
    assert f"killed by SIGABRT after ROCr's {mode} ({line}" in incident["detail"]
    assert "restarted from the newest checkpoint as any hang" in incident["detail"]
    assert read_state(state_dir)["status"]["restarts_by_reason"] == {"hang": 1} and sorted(seen) == [1, 2]


@pytest.mark.parametrize("line, name", [
    ("HW Exception by GPU node-9 (Agent handle: 0x631351bb5a20) reason :GPU Hang", "rocr_gpu_hang"),
    ("HW Exception by GPU node-1 (Agent handle: 0x12e78350) reason :ECC", None),  # a memory error, not a hang
    (("Memory critical error by agent node-0 (Agent handle: 0x7fc7f1d9a5e0) on address 0x7fc846a02000. Reason: "
      "Memory in use. "), "rocr_memory_error"),
    (("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran "
      "for 600081 milliseconds before timing out."), "collective_timeout"),
    (("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed "
      "out waiting 3000ms for recv operation to complete"), "collective_timeout"),
    (("[rank1]:[E1126 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) Rank 1] ProcessGroupNCCL's watchdog "
      "got stuck for 480 seconds without making progress in monitoring enqueued collectives."), "collective_timeout"),
    (("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
      "[127.0.0.1]:43440: Connection reset by peer. This is typically caused by a remote worker hanging"), "peer_lost"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:5231",
     "peer_lost"),
    (("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1347, "
      "remote process exited or there was a network error, NCCL version 2.18.5"), "peer_lost"),
    ("RuntimeError: NCCL communicator was aborted on rank 0.", "peer_lost"),
    ("socketProgressOpt: Call to recv from 172.16.0.2<33759> failed : Connection reset by peer", None),  # NCCL's detail
    ("RuntimeError: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`", "rocm_mismatch"),
    ("hipErrorNoBinaryForGpu: Unable to find code object for all current devices!", "rocm_mismatch"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "gpu_oom"),
    ("MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1010_18.kdb Performance may degrade.",
     "miopen_kdb_missing"),
    ("      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size", None),
    ("ModuleNotFoundError: No module named 'polars'", "missing_module"),
    ("Memory usage is fine", None),
])
def test_scan_recognises_each_signature_and_nothing_else(line, name):
    found = scan(line)
    assert (found.name if found else None) == name
