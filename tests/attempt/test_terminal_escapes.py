"""A worker's output as the supervisor keeps and logs it: the text a terminal shows, without its escapes (issue 57.8:
the "standby exited" line carried Ultralytics' raw colour codes)."""

import select
import sys

from supervisor.attempt.worker_process import WorkerProcess
from supervisor.decision.model.signatures import scan

# What Ultralytics prints (colorstr's blue bold prefix, its bar's erase-line after each \r) and a hyperlink (OSC 8).
COLOURED = r"""
import sys
sys.stdout.write("\x1b[34m\x1b[1mtrain: \x1b[0mScanning labels... 32 images\n")
sys.stdout.write("\r\x1b[K  1/3  0G  2.0: 50% 4/8\r\x1b[K  1/3  0G  1.9: 100% 8/8\n")
sys.stdout.write("see \x1b]8;;https://docs.ultralytics.com\x07the docs\x1b]8;;\x1b\\ for more\n")
sys.stdout.write("\x1b[31mOSError: [Errno 28] No space left on device\x1b[0m\n")
"""


def test_lines_read_from_a_workers_output_lose_their_terminal_escapes():
    worker = WorkerProcess.spawn([sys.executable, "-c", COLOURED], {})
    lines, ended = [], False
    try:
        while not ended:
            select.select([worker.output_fd], [], [], 30)
            more, _, ended = worker.read_output()
            lines += more
    finally:
        worker.wait()
        worker.close()
    assert lines == ["train: Scanning labels... 32 images", "  1/3  0G  1.9: 100% 8/8", "see the docs for more",
                     "OSError: [Errno 28] No space left on device"]
    assert list(worker.output_tail) == lines  # the incident's tail and the standby's last words
    assert scan(lines[-1]).name == "disk_full"  # and its signature is read from the text, as its warning quotes it
