"""The local AMP check: no download, and it catches fp16 that overflows."""

import socket

import pytest
import torch

from worker.patches.amp_check import install, local_check_amp, outputs_agree


class Scaled(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.scale = scale

    def forward(self, x):
        return self.conv(x) * self.scale * self.scale


def test_a_well_behaved_model_agrees_under_autocast():
    torch.manual_seed(0)
    assert outputs_agree(Scaled(1.0), torch.device("cpu"), dtype=torch.bfloat16)


def test_fp16_overflow_fails_the_check():
    assert not outputs_agree(Scaled(1e4), torch.device("cpu"), dtype=torch.float16)  # 1e8 is inf in fp16


def test_the_local_check_replaces_ultralytics_download(monkeypatch):
    from ultralytics.engine import trainer

    def no_network(*args, **kwargs):
        raise AssertionError("the AMP check tried to open a connection")

    monkeypatch.setattr(trainer, "check_amp", trainer.check_amp)  # restored after the test
    monkeypatch.setattr(socket, "create_connection", no_network)
    install("local")
    assert trainer.check_amp is local_check_amp
    assert trainer.check_amp(Scaled(1.0)) is False  # CPU: AMP off, as Ultralytics decides, and no download
    install("off")
    assert trainer.check_amp(Scaled(1.0)) is True


def test_a_check_that_passed_in_an_earlier_attempt_is_not_run_again(monkeypatch, capsys):
    from ultralytics.engine import trainer

    monkeypatch.setattr(trainer, "check_amp", trainer.check_amp)
    monkeypatch.setattr("worker.patches.amp_check.outputs_agree", lambda *a, **k: pytest.fail("the check ran"))
    install("local", passed_before=True)
    assert trainer.check_amp(Scaled(1.0)) is True  # on the CPU the check itself would say False
    assert "passed in an earlier attempt of this run; not run again" in capsys.readouterr().out
