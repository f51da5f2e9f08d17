"""A Hugging Face ``Trainer`` step through a ``%%gpugeek run`` cell, against the same Trainer under
``torchrun --nproc-per-node 2`` on this machine.

    .venv/bin/python benchmarks/bench_frameworks.py [--rounds 5] [--steps 40]

The program is the one a user would paste: a GPT-2 from a config (4 layers, width 256, 128
tokens, batch 8 per rank), ``use_cpu=True``, no saving. Both sides run it on two ranks with one
thread each (a 1-CPU Ray worker's ``OMP_NUM_THREADS``; ``torchrun`` sets the same), gloo, and
time the same thing: the seconds from step 10 to the last step, read by a ``TrainerCallback`` in
the program itself — the Trainer's own loop, with our reporter in it on the cell's side. The two
sides alternate round by round, the order flipped each round, so the machine's noise hits both
alike. The ratio is torchrun's step time over the cell's (≥ 0.97: at most 3 % slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = """
import json, os, time, torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
class Tokens(Dataset):
    def __init__(self, n):
        self.x = torch.randint(0, 512, (n, 128), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 10:
            self.t0 = time.perf_counter()
        if state.global_step == state.max_steps and int(os.environ["RANK"]) == 0:
            with open(OUT, "w") as f:
                json.dump({"step_s": (time.perf_counter() - self.t0) / (state.max_steps - 10),
                           "world": args.world_size}, f)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=512, n_positions=128,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=OUT + ".d", per_device_train_batch_size=8, max_steps=STEPS, use_cpu=True,
                         report_to=[], save_strategy="no", logging_steps=5, disable_tqdm=True,
                         ddp_find_unused_parameters=False)
Trainer(model=model, args=args, train_dataset=Tokens(4096), callbacks=[Clock()]).train()
"""


def torchrun_side(folder: Path, steps: int, n: int) -> float:
    out = folder / f"torchrun-{n}.json"
    script = folder / "train.py"
    script.write_text(f"import sys\nOUT = sys.argv[1]\nSTEPS = {steps}\n" + PROGRAM)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script), str(out)], env=env, check=True, capture_output=True, timeout=900)
    said = json.loads(out.read_text())
    assert said["world"] == 2
    return said["step_s"]


def cell_side(gg, folder: Path, steps: int, n: int) -> float:
    out = folder / f"cell-{n}.json"
    gg.run(f"OUT = {str(out)!r}\nSTEPS = {steps}\n" + PROGRAM, workers=2, monitor=False)
    said = json.loads(out.read_text())
    assert said["world"] == 2
    return said["step_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["GPUGEEK_HOME"] = str(folder / "home")
        import gpugeek_jupyter as gg

        gg.up("bench-frameworks")
        try:
            cell_side(gg, folder, 12, -1)       # warm: the group built, transformers imported
            cells, runs = [], []
            for n in range(args.rounds):
                sides = [("cell", lambda n=n: cells.append(cell_side(gg, folder, args.steps, n))),
                         ("torchrun", lambda n=n: runs.append(torchrun_side(folder, args.steps, n)))]
                for _, side in (sides if n % 2 == 0 else sides[::-1]):
                    side()
                print(f"round {n + 1}: cell {cells[-1] * 1e3:.1f} ms/step, torchrun {runs[-1] * 1e3:.1f} ms/step",
                      flush=True)
        finally:
            gg.down("bench-frameworks")
    cell, run = statistics.median(cells), statistics.median(runs)
    ratios = [r / c for c, r in zip(cells, runs, strict=True)]
    print(f"Trainer step, 2 ranks, steps 10..{args.steps}: cell {cell * 1e3:.1f} ms (min {min(cells) * 1e3:.1f}), "
          f"torchrun {run * 1e3:.1f} ms (min {min(runs) * 1e3:.1f}); "
          f"torchrun/cell {run / cell:.3f} (per round {min(ratios):.3f}–{max(ratios):.3f})")


if __name__ == "__main__":
    main()
