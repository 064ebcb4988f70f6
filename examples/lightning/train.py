"""A PyTorch Lightning script that yolo-train can supervise as it is: Lightning's own bar and checkpoints.

What the supervisor needs, and where Lightning already gives it:

- progress it can read: Lightning's tqdm bar (``Epoch 2: 40%|...| 8/20 [..., train_loss=0.512]``);
- a checkpoint it can resume from: ``ModelCheckpoint(save_last=True, every_n_train_steps=N)`` keeps
  ``--checkpoint-dir/last.ckpt`` current (Lightning writes it through a temporary file and a rename);
- a way to resume: ``--resume PATH`` is handed to ``trainer.fit(ckpt_path=...)``, which restores the weights,
  the optimizer and the loop's position;
- a knob the ladder can turn: ``--workers N`` (DataLoader processes), or ``NUM_WORKERS`` when the flag is absent.

A linear model on synthetic data, so a run takes seconds on a CPU; ``--step-delay`` slows each step for tests
that freeze or kill it mid-epoch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader worker processes (default: $NUM_WORKERS, else 2)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    p.add_argument("--save-every", type=int, default=10, help="steps between updates of last.ckpt")
    p.add_argument("--resume", type=Path, default=None, help="a checkpoint written by this script (last.ckpt)")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (tests)")
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = int(os.environ.get("NUM_WORKERS", "2"))
    return args


class Classifier(L.LightningModule):
    def __init__(self, step_delay: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.loss = nn.BCEWithLogitsLoss()
        self.step_delay = step_delay

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        if self.step_delay:
            time.sleep(self.step_delay)
        return loss

    def on_train_start(self):
        # The position fit() restored: what a test checks a resume against.
        print(f"training starts at global step {self.trainer.global_step}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def synthetic_data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, 32, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    L.seed_everything(SEED, verbose=False)
    loader = DataLoader(synthetic_data(args.steps * args.batch_size), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    checkpoint = ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True, every_n_train_steps=args.save_every,
                                 save_top_k=1, filename="step-{step:06d}",
                                 auto_insert_metric_name=False)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                        callbacks=[checkpoint], enable_model_summary=False, default_root_dir=args.checkpoint_dir)
    model = Classifier(args.step_delay)
    if args.resume is not None:
        print(f"resuming from {args.resume}", flush=True)
    trainer.fit(model, loader, ckpt_path=args.resume)
    print(f"training finished at global step {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
