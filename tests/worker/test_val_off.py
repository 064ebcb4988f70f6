"""``val = false`` validates nothing, the final epoch included (Ultralytics validates it whatever ``val`` says), and a
resume forces every rung key to the attempt's own value, never the checkpoint's."""

from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from tests.helpers.driver import Driver, make
from tests.helpers.supervised import assert_finished, demo_train, quiet_config, read_incidents, yolo_train
from worker.wire.contract import LaunchRecord
from worker.supervision.link import forced_on_resume


def test_val_false_validates_not_even_the_final_epoch_and_the_run_finishes_with_its_weights(write_config, tmp_path):
    """Every validation hangs (fault val_hang in every attempt): with val = false none may start."""
    config = write_config(demo_train(epochs=2), "val = false\n", quiet_config(),
                          '[watchdog]\nstartup_timeout = 90\n[restart]\nmax_restarts = 1\n')
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), "--fault", "val_hang")
    status = assert_finished(state_dir, result, epochs=2)
    assert read_incidents(state_dir) == [] and status["attempt"] == 1
    assert "val = false: nothing was validated" in result.stdout + result.stderr
    assert "yolo val model=" in result.stdout + result.stderr


def test_a_resume_forces_every_rung_key_to_the_attempts_value_not_the_checkpoints():
    """After a last.pt written at the val = false rung, rung 0 trained with val=False (Ultralytics restores the
    checkpoint's arguments; only the rung's own keys were forced)."""
    d = Driver(make())
    spawn = [a for a in d(core.Boot()) if isinstance(a, Spawn)][0]
    assert spawn.rung == 0 and {"val", "workers"} <= set(spawn.rung_keys)
    record = LaunchRecord(attempt=2, rung=0, train={"data": "demo", "workers": 2, "epochs": 3},
                          trainer_args={}, rung_keys=spawn.rung_keys)
    forced = forced_on_resume(record)
    assert forced["val"] is True and forced["workers"] == 2  # Ultralytics' default; the [train] table's
    at_top = LaunchRecord(attempt=3, rung=5, train={"workers": 2}, trainer_args={"val": False, "workers": 0},
                          rung_keys=spawn.rung_keys)
    assert forced_on_resume(at_top)["val"] is False and forced_on_resume(at_top)["workers"] == 0
    assert LaunchRecord.from_json(record.to_json()).rung_keys == spawn.rung_keys
