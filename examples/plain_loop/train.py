"""A plain PyTorch training loop that yolo-train can supervise without a line of yolo-train in it.

What the supervisor needs from a script, and where it is here:

- progress it can read: a tqdm bar per epoch (``Epoch 2/3: 40%|...| 8/20 [...]``) on stderr;
- a checkpoint it can resume from: ``--checkpoint-dir/step-NNNNNN.ckpt`` every ``--save-every`` steps and at the
  end, written to a temporary name and renamed, so a kill mid-save never leaves a torn file under the glob;
- a way to resume: ``--resume PATH`` continues at the saved epoch and step, with the same batches the
  uninterrupted run would have seen next (each epoch's order is seeded by the epoch number);
- a knob the ladder can turn: ``--workers N`` (DataLoader processes), or ``NUM_WORKERS`` when the flag is absent.

The model is a small MLP on synthetic data, so a run takes seconds on a CPU. ``--step-delay`` adds sleep per
step, for a test that needs time to freeze or kill it mid-epoch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset
from tqdm import tqdm

SEED = 0
KEEP_CHECKPOINTS = 3  # older step checkpoints are deleted; the newest is always complete (written then renamed)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader worker processes (default: $NUM_WORKERS, else 2)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    p.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--resume", type=Path, default=None, help="a checkpoint written by this script")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (tests)")
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = int(os.environ.get("NUM_WORKERS", "2"))
    return args


def synthetic_data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, 32, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def save_checkpoint(directory: Path, state: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{state['global_step']:06d}.ckpt"
    tmp = directory / f".{path.name}.tmp"  # outside the *.ckpt glob until complete
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(directory.glob("step-*.ckpt"))[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)
    return path


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    epoch, step = 1, 0  # 1-based epoch; steps already done inside it
    if args.resume is not None:
        state = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
        if step >= args.steps:  # saved at the end of an epoch: the next one starts
            epoch, step = epoch + 1, 0
        print(f"resumed from {args.resume} at epoch {epoch} step {step} (global step {state['global_step']})",
              flush=True)
    if epoch > args.epochs:
        print("nothing left to train", flush=True)
        return 0

    data = synthetic_data(args.steps * args.batch_size)
    loss_fn = nn.BCEWithLogitsLoss()
    print(f"training {args.epochs} epochs x {args.steps} steps, workers={args.workers}", flush=True)
    for epoch in range(epoch, args.epochs + 1):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(SEED + epoch)).tolist()
        # A resumed epoch skips the batches already trained, without loading them.
        loader = DataLoader(Subset(data, order[step * args.batch_size:]), batch_size=args.batch_size,
                            num_workers=args.workers)
        bar = tqdm(loader, desc=f"Epoch {epoch}/{args.epochs}", total=args.steps, initial=step)
        for x, y in bar:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            global_step = (epoch - 1) * args.steps + step
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if args.step_delay:
                time.sleep(args.step_delay)
            if global_step % args.save_every == 0 or global_step == args.epochs * args.steps:
                save_checkpoint(args.checkpoint_dir, {
                    "epoch": epoch, "step": step, "global_step": global_step,
                    "model": model.state_dict(), "optimizer": optimizer.state_dict()})
        bar.close()
        step = 0
    print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
