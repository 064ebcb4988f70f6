"""The benches' hang kinds (bench/hangs.py): asked for by name, each refused in one line where it cannot come."""

import pytest

from bench.hangs import parse_kinds


def test_a_device_hang_is_refused_without_a_gpu_where_no_hang_would_come():
    with pytest.raises(SystemExit, match="device_hang needs the training on a GPU"):
        parse_kinds("loader_blocked,device_hang", gpu=False)
    assert parse_kinds("loader_blocked, device_hang", gpu=True) == ["loader_blocked", "device_hang"]
    assert parse_kinds("tree", gpu=False) == ["tree"]


def test_an_unknown_kind_is_refused_with_the_kinds_there_are():
    with pytest.raises(SystemExit, match="unknown loader_frozen; the kinds are loader_blocked"):
        parse_kinds("loader_frozen", gpu=True)
