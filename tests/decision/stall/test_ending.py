"""The end of a training on a chosen clock: a worker trained through (phase ``ending``: best.pt's load, the final
validation's set-up, the wait for another host's final validation) is bounded by ``save_timeout``, not by what its
batches and epoch ends taught the auto bounds; an epoch's end in the middle of the training still is."""

from supervisor.decision import core
from supervisor.decision.stall import watchdog
from tests.helpers.driver import Driver, kinds, make, verdicts


def trained_an_epoch(**sections) -> Driver:
    """Healthy at 0.5 s a batch, one epoch end seen (its longest gap 1.5 s: "save auto" = max(10, 10 x 1.5) = 15 s),
    back in training."""
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.at(d.t + 1.5).beat("train", kind="phase", epoch=2, epochs=3, batch=0, batches=10)
    d.at(d.t + 0.5).beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)
    d.train_until(d.t + 5, 0.5)
    assert d.s.epoch_end_seen == 1.5
    return d


def test_a_worker_trained_through_is_bounded_by_save_timeout_in_its_ending():
    d = trained_an_epoch(watchdog={"save_timeout": 120})
    d.at(d.t + 0.5).beat("ending", kind="phase", epoch=3, epochs=3)
    last = d.t
    assert d.s.watch.deadline.label == "save_timeout"
    assert verdicts(d.at(last + 119)(core.Tick())) == []  # past auto_floor (10 s) and "save auto" (15 s)
    actions = d.at(last + 120.01)(core.Tick())
    assert "KillTree" in kinds(actions)
    assert (actions[-1].incident.reason, actions[-1].incident.phase) == ("hang", "ending")


def test_the_final_validations_batches_keep_the_ending_alive():
    d = trained_an_epoch(watchdog={"save_timeout": 120})
    d.at(d.t + 0.5).beat("ending", kind="phase", epoch=3, epochs=3)
    for _ in range(3):  # each batch of the final validation is progress; the silences between them are no rhythm
        d.at(d.t + 100).beat("ending", epoch=3, epochs=3)
        assert verdicts(d(core.Tick())) == [] and d.s.state == core.State.HEALTHY


def test_the_same_silence_at_an_epochs_end_in_the_training_is_a_hang():
    d = trained_an_epoch(watchdog={"save_timeout": 120})
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=2, epochs=3, batch=10, batches=10)
    last = d.t
    assert d.s.watch.deadline.label == "save auto"
    actions = d.at(last + 15.01)(core.Tick())
    assert "KillTree" in kinds(actions)
    assert (actions[-1].incident.reason, actions[-1].incident.phase) == ("hang", "save")
