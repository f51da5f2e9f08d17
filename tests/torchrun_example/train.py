"""A torchrun script shaped like PyTorch's own distributed examples (the DDP tutorial series, the
FSDP2 example): its model and its checkpointing in modules beside it, a checkpoint folder written
in the folder it runs in, and a later run that resumes from it.

    torchrun --standalone --nproc-per-node 2 train.py --steps 4
    torchrun --standalone --nproc-per-node 2 train.py --steps 8     # resumes at step 4
"""

import argparse
import os

import torch
import torch.distributed as dist
from checkpoint import Checkpointer
from model import Tiny
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Tiny())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpointer = Checkpointer(args.checkpoint_dir, rank)
    step = checkpointer.load(model.module, optimizer)
    if rank == 0:
        print(f"resumed from step {step}" if step else "no checkpoint: starting at step 0", flush=True)
    generator = torch.Generator().manual_seed(1000 * rank + step)
    while step < args.steps:
        x = torch.randn(16, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        checkpointer.save(model.module, optimizer, step)
    if rank == 0:
        print(f"trained to step {step} in {os.getcwd()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
