"""Several hosts: a launch whose rendezvous cannot complete ends within join_timeout as a configuration error (exit
78, one line naming the cause), never a startup hang that climbs the ladder (issue 30). Real torch.distributed.run
launchers against real sockets on 127.0.0.1."""

import socket
import subprocess
import sys
import time

import pytest

from worker.distributed import multinode
from worker.wire.contract import Rendezvous

JOIN = 3.0


def launch(tmp_path, node_rank: int, port: int) -> tuple[int, str]:
    """One host's launch as the worker runs it (worker/training/train.py): bounded, then judged by launch_failure."""
    script = tmp_path / "rank.py"
    script.write_text("print('rank ran')\n")
    started = tmp_path / f"started-{node_rank}"
    started.mkdir()
    r = Rendezvous(nnodes=2, node_rank=node_rank, endpoint=f"127.0.0.1:{port}", rdzv_id="conflict",
                   join_timeout=JOIN, fingerprint="x")
    began = time.monotonic()
    bound = multinode.bound_the_launch(r, started)
    try:
        result = subprocess.run(multinode.launcher_argv(sys.executable, 1, r, str(script)), capture_output=True,
                                text=True, timeout=120)
    finally:
        bound.cancel()
    assert result.returncode != 0 and "rank ran" not in result.stdout
    return multinode.launch_failure(r, started, began)


@pytest.mark.e2e
def test_an_endpoint_that_accepts_tcp_but_is_no_store_and_a_port_in_use_end_as_78_in_one_line(tmp_path):
    with socket.socket() as other_program:  # another program on the port: it accepts, and never answers
        other_program.bind(("", 0))
        other_program.listen(8)
        port = other_program.getsockname()[1]
        code, line = launch(tmp_path, 1, port)  # the joining host: before, the whole startup timeout, then a climb
        assert code == 78 and f"the rendezvous at 127.0.0.1:{port}" in line and "did not complete" in line
        assert "is no rendezvous store" in line
        code, line = launch(tmp_path, 0, port)  # the store host: before, "the supervisor restarts this host"
        assert code == 78 and "its port is in use by another program (EADDRINUSE)" in line
        assert f"rdzv_endpoint" in line
