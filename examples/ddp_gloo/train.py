"""Two-rank DistributedDataParallel over gloo on the CPU: the multi-rank path of yolo-train, testable anywhere.

Run under ``torchrun --standalone --nproc_per_node 2 train.py`` (or ``python -m torch.distributed.run ...``). The
supervisor starts torchrun; torchrun starts the ranks; a hung rank stalls every rank at the next all-reduce, so the
one progress bar (rank 0's) stops, and the supervisor kills the whole tree: torchrun and both ranks.

- progress: a tqdm bar per epoch on rank 0 only (``Epoch 2/3: 40%|...| 8/20 [..., loss=0.512]``);
- checkpoints: rank 0 writes ``--checkpoint-dir/step-NNNNNN.ckpt`` every ``--save-every`` steps through a
  temporary file and a rename; the others wait at a barrier, so no rank runs ahead of a checkpoint;
- resume: ``--resume PATH`` is loaded by every rank, which continues at the saved epoch and step with the batches
  the uninterrupted run would have seen next (DistributedSampler seeded per epoch);
- a knob the ladder can turn: ``--workers N`` or ``NUM_WORKERS``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from tqdm import tqdm

SEED = 0
KEEP_CHECKPOINTS = 3


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="batches per epoch and rank")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader worker processes per rank (default: $NUM_WORKERS, else 0)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    p.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--resume", type=Path, default=None, help="a checkpoint written by this script")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (tests)")
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = int(os.environ.get("NUM_WORKERS", "0"))
    return args


def synthetic_data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, 32, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def save_checkpoint(directory: Path, state: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{state['global_step']:06d}.ckpt"
    tmp = directory / f".{path.name}.tmp"  # outside the *.ckpt glob until complete
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(directory.glob("step-*.ckpt"))[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # two ranks on a small CPU: one thread each, or they fight over cores
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    epoch, step = 1, 0
    if args.resume is not None:
        state = torch.load(args.resume, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
        if step >= args.steps:
            epoch, step = epoch + 1, 0
        if rank == 0:
            print(f"resumed from {args.resume} at epoch {epoch} step {step} (global step {state['global_step']})",
                  flush=True)
    data = synthetic_data(args.steps * args.batch_size * world)
    loss_fn = nn.BCEWithLogitsLoss()
    if rank == 0:
        print(f"training {args.epochs} epochs x {args.steps} steps on {world} ranks, workers={args.workers}",
              flush=True)
    for epoch in range(epoch, args.epochs + 1):
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
        sampler.set_epoch(epoch)
        indices = list(sampler)[step * args.batch_size:]  # a resumed epoch skips the batches already trained
        loader = DataLoader(torch.utils.data.Subset(data, indices), batch_size=args.batch_size,
                            num_workers=args.workers)
        bar = tqdm(loader, desc=f"Epoch {epoch}/{args.epochs}", total=args.steps, initial=step,
                   disable=rank != 0)
        for x, y in bar:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # the all-reduce: a stalled rank holds every rank here
            optimizer.step()
            step += 1
            global_step = (epoch - 1) * args.steps + step
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if args.step_delay:
                time.sleep(args.step_delay)
            if global_step % args.save_every == 0 or global_step == args.epochs * args.steps:
                if rank == 0:
                    save_checkpoint(args.checkpoint_dir, {
                        "epoch": epoch, "step": step, "global_step": global_step,
                        "model": model.module.state_dict(), "optimizer": optimizer.state_dict()})
                dist.barrier()
        bar.close()
        step = 0
    if rank == 0:
        print("training finished", flush=True)
    # Every rank past its last collective, and DDP's reducer gone while the group and the interpreter still live.
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Out without the interpreter's teardown: gloo's threads may still hold work there, and its C++ side then aborts
    # ("terminate called without an active exception", exit -6), on CI once in ten-odd runs of two ranks on two busy
    # cores, even after the barrier and destroy_process_group above (pytorch/pytorch#179291 on the cause). Everything
    # this script writes is written and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
