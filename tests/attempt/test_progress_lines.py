"""Progress read from real training output: Ultralytics, Lightning and tqdm bars captured from real runs.

The fixtures under tests/fixtures/progress/ are the bytes those runs wrote to a pipe (stdout and stderr
together), made by tests/fixtures/progress/capture.py; test_examples.py also parses the examples' live output.
"""

import math
import re
from pathlib import Path

import pytest

from supervisor.attempt.progress_lines import (MAX_LINE_BYTES, ProgressCounter, ProgressParser, ProgressReading,
                                               validate_regex)
from worker.wire.contract import Phase

FIXTURES = Path(__file__).parents[1] / "fixtures" / "progress"


def read(name: str, regex: str | None = None) -> tuple[ProgressParser, list[ProgressReading]]:
    parser = ProgressParser(regex)
    return parser, parser.feed((FIXTURES / name).read_bytes())


def progress_marks(readings: list[ProgressReading]) -> list[bool]:
    counter = ProgressCounter()
    return [counter.observe(r) for r in readings]


def train_positions(readings):
    return [(r.epoch, r.batch) for r in readings if r.phase is Phase.TRAIN]


def test_ultralytics_training_rows_give_epoch_batch_and_the_summed_losses():
    _, readings = read("ultralytics_train.bin")
    train = [r for r in readings if r.phase is Phase.TRAIN]
    assert {(r.epochs, r.batches) for r in train} == {(2, 8)}  # 2 epochs of the demo's 8 batches
    positions = train_positions(readings)
    assert positions == sorted(positions) and positions[-1] == (2, 8) and {e for e, _ in positions} == {1, 2}
    assert all(r.loss is not None and math.isfinite(r.loss) and r.loss > 0 for r in train)
    # The validation bar and the dataset scans are told apart from training.
    assert any(r.phase is Phase.VAL for r in readings)
    assert [r.batches for r in readings if r.phase is Phase.SETUP] == [32, 8]  # train and val images scanned


def test_ultralytics_every_grown_position_is_progress_and_the_first_empty_bar_is_not():
    _, readings = read("ultralytics_train.bin")
    marks = progress_marks(readings)
    first_train = next(i for i, r in enumerate(readings) if r.phase is Phase.TRAIN)
    assert readings[first_train].batch == 0 and not marks[first_train]
    for i, r in enumerate(readings):
        if r.phase is Phase.TRAIN and i > first_train:
            assert marks[i], f"training row {r} not counted"
    # Epoch 2's validation pass prints the same 1/1 bar as epoch 1's: it is progress, being in a later epoch.
    val = [i for i, r in enumerate(readings) if r.phase is Phase.VAL]
    assert marks[val[0]] and marks[val[1]]


def test_tqdm_postfix_redraws_are_not_progress_and_a_new_epoch_at_zero_is():
    _, readings = read("tqdm_plain_loop.bin")
    assert {(r.epochs, r.batches) for r in readings} == {(2, 10)}
    marks = progress_marks(readings)
    last: dict = {}
    for r, mark in zip(readings, marks):
        grew = (r.epoch, r.batch) > last.get("pos", (0, 0))
        assert mark == (grew and (r.batch > 0 or r.epoch > last.get("pos", (1, 0))[0])), r
        last["pos"] = max(last.get("pos", (0, 0)), (r.epoch, r.batch))
    # tqdm redraws the bar with a new loss before its counter moves: such lines exist, and none counted.
    stale = [m for prev, r, m in zip(readings, readings[1:], marks[1:]) if (r.epoch, r.batch) ==
             (prev.epoch, prev.batch) and r.loss != prev.loss]
    assert stale and not any(stale)
    assert (readings[-1].epoch, readings[-1].batch) == (2, 10)


def test_lightning_epochs_are_read_one_based_with_its_train_loss():
    _, readings = read("lightning_fresh.bin")
    epochs = [r.epoch for r in readings if r.epoch is not None]
    assert epochs[0] == 1 and epochs[-1] == 2  # Lightning prints "Epoch 0" and "Epoch 1"
    assert {r.batches for r in readings if r.epoch is not None} == {10}
    losses = [r.loss for r in readings if r.loss is not None]
    assert losses and all(0 < x < 2 for x in losses)
    counter = ProgressCounter()
    for r in readings:
        counter.observe(r)
    assert (counter.last.epoch, counter.last.batch) == (2, 10)


def test_lightning_resumed_mid_epoch_shows_its_bar_without_epoch_and_still_counts():
    _, readings = read("lightning_resumed.bin")
    training = [r for r in readings if r.bar.endswith("Training")]
    # Resumed after 4 of 10 batches (its first last.ckpt): the bar counts on from there.
    assert [r.batch for r in training if r.batch][:1] == [5] and max(r.batch for r in training) == 10
    marks = progress_marks(readings)
    # Each batch done is counted once: redraws with a new loss and the bar's reset to 0 are not.
    assert sum(marks) == len({(r.bar, r.epoch, r.batch) for r in readings if r.batch})


def test_a_spinning_script_reprinting_its_bar_is_not_progress():
    parser, readings = read("ultralytics_train.bin")
    counter = ProgressCounter()
    for r in readings:
        counter.observe(r)
    before = counter.progress
    data = (FIXTURES / "ultralytics_train.bin").read_bytes()
    last_bar = b"\r" + re.split(rb"[\r\n]", data[:data.rindex(b" 2/2 ") + 300])[-1]  # its last training row, as sent
    for _ in range(100):
        for r in parser.feed(last_bar):
            counter.observe(r)
    assert counter.progress == before


def test_a_resumed_bars_first_draw_at_its_initial_position_is_not_a_batch_trained():
    # tqdm(total=40, initial=10), as a script resumed at step 10 draws it at once, before any step ran here.
    tqdm = pytest.importorskip("tqdm")
    import io

    out = io.StringIO()
    with tqdm.tqdm(total=40, initial=10, desc="Epoch 1/3", file=out, mininterval=0, ascii=True) as bar:
        first = out.getvalue()
        bar.update(1)
        second = out.getvalue()[len(first):]
    parser, counter = ProgressParser(), ProgressCounter()
    [drawn] = parser.feed(first.encode() + b"\n")
    assert (drawn.epoch, drawn.batch, drawn.batches) == (1, 10, 40) and not counter.observe(drawn)
    assert [counter.observe(r) for r in parser.feed(second.encode() + b"\n")] == [True]  # once it advances
    # A bar first seen at its end with a measured rate did advance (a one-batch validation bar drawn when done).
    [val] = parser.feed(b"val: 100%|##########| 1/1 [00:00<00:00, 14.4it/s]\n")
    assert counter.observe(val)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_bytes_split_anywhere_give_the_same_readings(chunk):
    data = (FIXTURES / "ultralytics_train.bin").read_bytes() + (FIXTURES / "tqdm_plain_loop.bin").read_bytes()
    whole = ProgressParser().feed(data)
    parser = ProgressParser()
    pieces = [r for i in range(0, len(data), chunk) for r in parser.feed(data[i:i + chunk])]
    assert pieces == whole


def test_an_over_long_line_is_dropped_counted_and_the_next_line_read():
    parser = ProgressParser()
    assert parser.feed(b"x" * (MAX_LINE_BYTES + 1)) == []
    assert parser.feed(b"y" * MAX_LINE_BYTES * 3) == []  # the same line, still going: counted once
    readings = parser.feed(b"tail\rEpoch 3/5:  40%|####      | 4/10 [00:01<00:01, 4.0it/s, loss=0.25]\n")
    assert parser.dropped_lines == 1
    assert readings == [ProgressReading(3, 5, 4, 10, 0.25, Phase.TRAIN, "tqdm:Epoch #/#", rate_shown=True)]


def test_output_that_never_matches_is_lines_without_readings():
    parser = ProgressParser()
    assert parser.feed(b"loading data\nstill loading\r42\n") == []
    assert (parser.lines, parser.readings) == (3, 0)


def test_a_user_regex_wins_over_the_built_in_bars():
    regex = r"it (?P<batch>\d+) of (?P<batches>\d+) in epoch (?P<epoch>\d+), loss (?P<loss>[\d.]+)"
    parser = ProgressParser(regex)
    readings = parser.feed(b"it 3 of 9 in epoch 2, loss 0.5 | 3/9 [00:01<00:02]\nEpoch 1/2: 50%|#  | 1/2 [00:01]\n")
    assert readings[0] == ProgressReading(2, None, 3, 9, 0.5, Phase.TRAIN, "regex")
    assert readings[1].bar == "tqdm:Epoch #/#"  # no match of the regex: the built-ins still read the line


def test_a_loss_only_reading_counts_when_the_loss_changed():
    parser = ProgressParser(r"loss: (?P<loss>[\d.]+)")
    counter = ProgressCounter()
    marks = [counter.observe(r) for r in parser.feed(b"loss: 0.9\nloss: 0.9\nloss: 0.8\nloss: 0.8\nloss: 0.9\n")]
    assert marks == [True, False, True, False, True]


@pytest.mark.parametrize("regex, problem", [
    (r"epoch (?P<epoch>\d+", "does not compile"),
    (r"step (\d+)/(\d+)", "has none of the named groups epoch, epochs, batch, batches, loss"),
    (r"step (?P<step>\d+)", "has none of the named groups"),
])
def test_a_bad_regex_is_refused_with_the_problem(regex, problem):
    assert problem in validate_regex(regex)
    with pytest.raises(ValueError, match=problem):
        ProgressParser(regex)


def test_a_good_regex_is_accepted():
    assert validate_regex(r"\[(?P<epoch>\d+)/(?P<epochs>\d+)\]") is None


ONE_BAR = r"""
import sys
for n in range(1, 100_001):  # one tqdm bar for the whole run: ~9 MB of \r redraws, never a \n
    sys.stdout.write(f"\rtrain: {n // 1000:3d}%|####      | {n}/100000 [00:10<00:14, 41.2it/s, loss=0.3]")
sys.stdout.write("\ndone\n")
"""


def test_a_bar_redrawn_with_carriage_returns_for_a_whole_run_keeps_the_supervisors_buffer_bounded():
    """One tqdm bar for a whole run grew the supervisor from 37 to 146 MB in 90 s: its line never ended."""
    import select
    import sys

    from supervisor.attempt.worker_command import OutputProgress
    from supervisor.attempt.worker_process import WorkerProcess

    worker = WorkerProcess.spawn([sys.executable, "-c", ONE_BAR], {})
    worker.output_progress = OutputProgress(worker.pid, None)
    largest, beats, ended = 0, [], False
    try:
        while not ended:
            select.select([worker.output_fd], [], [], 30)
            _, progress, ended = worker.read_output()
            beats += progress
            largest = max(largest, len(worker.partial_line))
    finally:
        worker.popen.kill()
        worker.wait()
        worker.close()
    assert 0 < largest <= MAX_LINE_BYTES
    assert list(worker.output_tail)[-2:] == [
        "train: 100%|####      | 100000/100000 [00:10<00:14, 41.2it/s, loss=0.3]", "done"]
    assert beats and beats[-1].batch == 100_000  # the bar is still read
