"""A framework job's live monitor in a real JupyterLab: a Hugging Face ``Trainer`` cell with no
line for gpugeek, on a local 2-worker group — the browser sees the progress bar count the
Trainer's own ``max_steps``, the loss chart draw its logged losses, and samples/s, as for a
``gg`` loop."""

from __future__ import annotations

import os
import re

import nbformat
import pytest
from lab import PANEL, error_outputs, open_notebook_in_lab, put_notebook, screenshot, start_run_all, wait_run_done

STEPS = 120

TRAINER_CELL = f"""%%gpugeek run --workers 2 --name tiny-gpt2-trainer
import time, torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

class Tokens(Dataset):
    def __init__(self):
        self.x = torch.randint(0, 128, (4096, 16), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {{"input_ids": self.x[i], "labels": self.x[i]}}

class Pace(TrainerCallback):           # a few steps a second, so the live panel has time to draw
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.1)

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir="/tmp/gpugeek-monitor-trainer", per_device_train_batch_size=8,
                         max_steps={STEPS}, logging_steps=2, use_cpu=True, report_to=[], save_strategy="no",
                         disable_tqdm=True, ddp_find_unused_parameters=False)
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Pace()]).train()
"""

CELLS = ["%load_ext gpugeek_jupyter\n%gpugeek up lab-frameworks", TRAINER_CELL, "%gpugeek down lab-frameworks"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.environ.get("GPUGEEK_LAB_FRAMEWORKS"),
                    reason="a Trainer in two workers beside make test's timed tests: `make frameworks-lab` runs it")
def test_a_trainer_jobs_live_monitor_shows_its_steps_loss_and_samples_per_s(lab, page):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    path = put_notebook(lab, nb, "frameworks/trainer.ipynb")
    open_notebook_in_lab(page, lab.base_url, lab.token, path)
    start_run_all(page)
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")

    monitor = cells.nth(1).locator(".gpugeek-job")
    monitor.locator(".widget-hprogress").wait_for(timeout=180_000)
    # the bar counts to the Trainer's max_steps; the stats carry the loss and samples/s it reported
    page.wait_for_function(f"(el) => /step \\d+\\/{STEPS}/.test(el.innerText) && /samples\\/s/.test(el.innerText)"
                           " && /loss/.test(el.innerText)", arg=monitor.element_handle(), timeout=90_000)
    monitor.locator(".js-plotly-plot svg.main-svg").first.wait_for(timeout=30_000)
    page.wait_for_function("(el) => el.querySelectorAll("
                           "'.scatterlayer .trace .point, .scatterlayer .trace path.js-line').length >= 2",
                           arg=monitor.element_handle(), timeout=60_000)
    text = monitor.inner_text()
    screenshot(page, "frameworks-1-live-trainer-monitor", monitor)
    step = int(re.search(rf"step (\d+)/{STEPS}", text).group(1))
    assert 0 < step <= STEPS, text
    rate = float(re.search(r"([\d,.]+) samples/s", text).group(1).replace(",", ""))
    assert rate > 0, text

    run = wait_run_done(page, timeout=240, path=path)
    assert run.executed == len(CELLS), run
    summary = cells.nth(1).locator(".gpugeek-job-done")
    summary.wait_for()
    assert summary.locator("progress").get_attribute("value") == str(STEPS)
    assert "tiny-gpt2-trainer: finished" in summary.inner_text()
    screenshot(page, "frameworks-2-trainer-job-done", cells.nth(1))
    assert error_outputs(page, stderr=False) == []
