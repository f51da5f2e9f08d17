"""Training code as people write it for ``torchrun``, with no line for gpugeek: the Hugging Face
``Trainer``, an Accelerate loop, a Lightning module and a plain DDP ``train.py``. Each is run as a
``%%gpugeek run`` cell and under ``torchrun --nproc-per-node 2`` on this machine, and leaves
what the tests compare in ``OUT``: per rank, a JSON of what the framework said (its world size and
rank, the sample indices it was fed, its losses) and the parameters it ended with; and whatever
the framework itself wrote, under ``OUT/rank-R/`` (the rank as ``torchrun`` sets it), so the files
each rank wrote can be counted — as on hosts that share no disk.

Small random-weight models from configs; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

TORCHRUN_TIMEOUT_S = 240

# what every program ends with: the record the tests read (the framework's own words in `said`)
_RECORD = """
import json, os, torch
RANK = int(os.environ.get("RANK", "0"))
def record(said, seen, losses, model):
    os.makedirs(OUT, exist_ok=True)
    torch.save([p.detach().cpu().clone() for p in model.parameters()], f"{OUT}/params-{RANK}.pt")
    with open(f"{OUT}/record-{RANK}.json", "w") as f:
        json.dump({"said": said, "seen": sorted(seen), "losses": losses, "env_rank": RANK}, f)
"""

# a dataset that notes which samples this process was fed
_DATA = """
from torch.utils.data import Dataset
class Numbered(Dataset):
    def __init__(self, n, make):
        g = torch.Generator().manual_seed(1)
        self.items = [make(g) for _ in range(n)]
        self.seen = []
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        self.seen.append(int(i))
        return self.items[i]
"""

TRAINER = _RECORD + _DATA + """
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32,
                                   bos_token_id=0, eos_token_id=0))
def tokens(g):
    x = torch.randint(0, 128, (16,), generator=g)
    return {"input_ids": x, "labels": x}
data = Numbered(64, tokens)
args = TrainingArguments(output_dir=f"{OUT}/rank-{RANK}/trainer", per_device_train_batch_size=4, max_steps=STEPS,
                         logging_steps=1, save_steps=3, use_cpu=True, report_to=[], seed=0, disable_tqdm=True,
                         ddp_find_unused_parameters=False, learning_rate=1e-3)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
record({"world_size": args.world_size, "rank": args.process_index, "mode": str(args.parallel_mode),
        "step": trainer.state.global_step},
       data.seen, [h["loss"] for h in trainer.state.log_history if "loss" in h], model)
"""

ACCELERATE = _RECORD + _DATA + """
from accelerate import Accelerator
from torch.utils.data import DataLoader
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
def pair(g):
    x = torch.randn(8, generator=g)
    return x, x.sum(0, keepdim=True)
data = Numbered(96, pair)
loader = DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for step, (x, y) in enumerate(loader):
    if step == STEPS:
        break
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.gather(loss.detach()).mean().item())
accelerator.save_state(f"{OUT}/rank-{RANK}/state")
accelerator.print("trained", len(losses), "steps")
record({"world_size": accelerator.num_processes, "rank": accelerator.process_index,
        "mode": str(accelerator.distributed_type)}, data.seen, losses, accelerator.unwrap_model(model))
"""

LIGHTNING = _RECORD + _DATA + """
import lightning as L
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader
class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.losses = []
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        self.losses.append(float(self.all_gather(loss.detach()).mean()))
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
def pair(g):
    x = torch.randn(8, generator=g)
    return x, x.sum(0, keepdim=True)
L.seed_everything(0, verbose=False)
module = Regression()
data = Numbered(96, pair)
trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", strategy="ddp", logger=CSVLogger(f"{OUT}/rank-{RANK}/logs"),
                    default_root_dir=f"{OUT}/rank-{RANK}", enable_progress_bar=False, enable_model_summary=False,
                    log_every_n_steps=1, **SHAPE)
trainer.fit(module, DataLoader(data, batch_size=4))
record({"world_size": trainer.world_size, "rank": trainer.global_rank, "mode": type(trainer.strategy).__name__},
       data.seen, module.losses, module)
"""

# a plain torchrun script: argparse, its own init and destroy of the process group
SCRIPT = '''
import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    global OUT
    OUT = args.out
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = Numbered(96, pair)
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    record({"world_size": dist.get_world_size(), "rank": dist.get_rank(), "mode": dist.get_backend()},
           data.seen, losses, model.module)
    dist.destroy_process_group()

def pair(g):
    x = torch.randn(8, generator=g)
    return x, x.sum(0, keepdim=True)

if __name__ == "__main__":
    main()
'''.replace("import argparse", "import argparse" + _RECORD + _DATA, 1)

PROGRAMS = {"trainer": TRAINER, "accelerate": ACCELERATE, "lightning": LIGHTNING}


def as_cell(program: str, out: str, steps: int) -> str:
    """The program as a notebook cell: its settings in its first lines, as a user would set them."""
    return f"OUT = {out!r}\nSTEPS = {steps}\nSHAPE = {{}}\n" + textwrap.dedent(program)


def as_script(program: str, steps: int, devices: int) -> str:
    """The program as ``train.py OUT`` for ``torchrun``: the same code, ``OUT`` from its argument,
    and Lightning told the devices, as ``torchrun`` users must (``devices`` left alone in a cell)."""
    return (f"import sys\nOUT = sys.argv[1]\nSTEPS = {steps}\nSHAPE = {{'devices': {devices}}}\n"
            + textwrap.dedent(program))


# a worker that dies mid-training, once: rank 1 SIGKILLs itself at step 5 of the first run
KILLED_AT_5 = """
import signal
from transformers import TrainerCallback
class Killer(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if RANK == 1 and state.global_step == 5 and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Killer()])
"""


def killed_once(program: str, marker: str) -> str:
    """The Trainer program with a worker that dies at step 5 of its first run."""
    return program.replace("trainer = Trainer(model=model, args=args, train_dataset=data)\n",
                           f"MARKER = {marker!r}\n" + KILLED_AT_5, 1)


def under_torchrun(program: str, out: Path, *args: str, ranks: int = 2) -> None:
    """``torchrun --standalone --nproc-per-node RANKS train.py OUT ARGS`` on this machine."""
    script = out.parent / f"{out.name}-train.py"
    script.write_text(program)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(ranks), str(script), str(out), *args], env=env, capture_output=True, text=True,
                          timeout=TORCHRUN_TIMEOUT_S, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]


EXAMPLE = Path(__file__).parent / "torchrun_example"   # a script with its modules beside it (its README line)


def torchrun_in(folder: Path, script: Path, *args: str, ranks: int = 2) -> str:
    """``torchrun --standalone --nproc-per-node RANKS SCRIPT ARGS``, run from ``folder``: its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(ranks), str(script), *args], env=env, capture_output=True, text=True,
                          timeout=TORCHRUN_TIMEOUT_S, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def magic_torchrun_runs(ipython, capsys, script: str, *steps: int) -> list[str]:
    """``%gpugeek torchrun --workers 2 SCRIPT --steps N`` once per N, from the notebook's folder: what each said."""
    said = []
    for n in steps:
        ipython.run_line_magic("gpugeek", f"torchrun --workers 2 --no-monitor {script} --steps {n}")
        said.append(capsys.readouterr().out)
    return said


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def records(out: Path, ranks: int = 2) -> dict[int, dict]:
    return {r: json.loads((out / f"record-{r}.json").read_text()) for r in range(ranks)}


def params(out: Path, rank: int) -> list[torch.Tensor]:
    return torch.load(out / f"params-{rank}.pt")


def written(out: Path, rank: int) -> list[str]:
    """The files rank ``rank`` wrote under its own folder (what the framework saved and logged)."""
    root = out / f"rank-{rank}"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []
