"""The DDP tutorial's snapshot, kept in a folder: rank 0 writes the model and optimizer
(``model.pt``, as every rank holds the same), and every rank its own shard of what is its alone
(``shard-R.pt``: the step it reached), as a sharded checkpoint has one file per rank."""

from pathlib import Path

import torch
import torch.distributed as dist


class Checkpointer:
    def __init__(self, folder: str, rank: int):
        self.folder, self.rank = Path(folder), rank

    def save(self, model, optimizer, step: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       self.folder / "model.pt")
        torch.save({"rank": self.rank, "step": step}, self.folder / f"shard-{self.rank}.pt")
        dist.barrier()

    def load(self, model, optimizer) -> int:
        snapshot = self.folder / "model.pt"
        found = torch.tensor([1 if snapshot.is_file() else 0])
        dist.broadcast(found, src=0)
        if not found.item():
            return 0
        state = torch.load(snapshot, weights_only=True) if snapshot.is_file() else None
        shared = [state]
        dist.broadcast_object_list(shared, src=0)      # a rank on another host has no model.pt of its own
        model.load_state_dict(shared[0]["model"])
        optimizer.load_state_dict(shared[0]["optimizer"])
        return shared[0]["step"]
