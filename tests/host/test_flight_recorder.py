"""torch's NCCL Flight Recorder dumps found for an incident (supervisor/host/flight_recorder.py): files written the
way ProcessGroupNCCL names them, PREFIX<global rank>, from the worker's environment or torch's default."""

import os

from supervisor.host import flight_recorder


def test_the_dumps_of_this_attempt_are_copied_into_the_incident_and_listed_in_rank_order(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{traces}/nccl_trace_rank_"}
    for rank in (1, 0):
        (traces / f"nccl_trace_rank_{rank}").write_bytes(b"\x80pickled entries")
    (traces / "nccl_trace_rank_2").write_bytes(b"an earlier run's")
    os.utime(traces / "nccl_trace_rank_2", (900.0, 900.0))
    (traces / "nccl_trace_rank_0.tmp").write_bytes(b"not a rank's dump")
    dest = tmp_path / "incident"
    found = flight_recorder.collect(env, 1000.0, dest)
    assert found == (str(dest / "flight_recorder_rank_0"), str(dest / "flight_recorder_rank_1"))
    assert (dest / "flight_recorder_rank_1").read_bytes() == b"\x80pickled entries"
    monkeypatch.setattr(flight_recorder, "COPY_LIMIT", 4)  # too large to copy: listed where torch wrote it
    assert flight_recorder.collect(env, 1000.0, tmp_path / "other") == (str(traces / "nccl_trace_rank_0"),
                                                                          str(traces / "nccl_trace_rank_1"))


def test_the_prefix_is_the_newer_variable_then_the_older_then_torchs_default(tmp_path):
    assert flight_recorder.prefix({}) == "/tmp/nccl_trace_rank_"
    assert flight_recorder.prefix({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_"}) == "/a/t_"
    assert flight_recorder.prefix({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_", "TORCH_FR_DUMP_TEMP_FILE": "/b/f_"}) \
        == "/b/f_"
    assert flight_recorder.collect({"TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/none/x_"}, 0.0, tmp_path) == ()
