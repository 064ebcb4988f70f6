"""The model step builds the model on few CPU threads (worker/startup/startup_steps.py MODEL_STEP_THREADS says why), and
training gets its threads back."""

import torch

from worker.startup.startup_steps import MODEL_STEP_THREADS, few_cpu_threads
from worker.training.trainer import SupervisedTrainerMixin


class _Base:
    def setup_model(self):
        return torch.get_num_threads()


class _Trainer(SupervisedTrainerMixin, _Base):
    def __init__(self):  # the mixin's own set-up is not what this test is about: a cold build's model step
        self._held_model = False


def test_the_model_step_runs_on_few_threads_and_gives_them_back():
    before = torch.get_num_threads()
    torch.set_num_threads(MODEL_STEP_THREADS + 2)
    try:
        inside = _Trainer().setup_model()
        assert inside == MODEL_STEP_THREADS
        assert torch.get_num_threads() == MODEL_STEP_THREADS + 2
    finally:
        torch.set_num_threads(before)


def test_fewer_threads_than_the_limit_are_kept_and_restored_after_an_error():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try:
            with few_cpu_threads():
                assert torch.get_num_threads() == 1
                raise RuntimeError("the model step failed")
        except RuntimeError:
            pass
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
