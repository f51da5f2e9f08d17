from __future__ import annotations

import pandas as pd
import pytest
from IPython.core.error import UsageError
from models import TinyGPT

import gpugeek_jupyter as gg


def test_offers_magic_equals_api(ipython):
    via_magic = ipython.run_line_magic("gpugeek", "offers --gpu H100 --count 8 --pricing spot")
    pd.testing.assert_frame_equal(via_magic, gg.offers(gpu="H100", count=8, pricing="spot"))


def test_offers_chart_marks_the_frontier(ipython, capsys):
    frame = ipython.run_line_magic("gpugeek", "offers --count 1 --chart")
    fig = gg.price_performance(frame)
    names = [trace.name for trace in fig.data]
    assert "frontier" in names and "H100" in names
    edge = fig.data[names.index("frontier")]
    assert list(edge.y) == sorted(edge.y), "the frontier climbs in price as TFLOP/s grow"
    assert list(edge.x) == sorted(edge.x)


def test_plan_magic_reads_model_from_namespace(ipython):
    ipython.user_ns["net"] = TinyGPT()
    via_magic = ipython.run_line_magic("gpugeek", "plan --model net --batch 4 --seq 128 --top 3")
    via_api = gg.plan(model=ipython.user_ns["net"], batch=4, seq=128, top=3)
    assert via_magic.best["id"] == via_api.best["id"]
    assert via_magic.memory.trainable_params == sum(
        p.numel() for p in ipython.user_ns["net"].parameters())
    assert "<table" in via_magic._repr_html_()


def test_residency_and_spot_flags_reach_the_api(ipython, capsys):
    frame = ipython.run_line_magic("gpugeek", "offers --residency EU --gpu H100")
    pd.testing.assert_frame_equal(frame, gg.offers(residency="EU", gpu="H100"))
    printed = capsys.readouterr().out
    assert "left out 1 region(s) of unknown location (runpod/EU-SE-1" in printed
    assert f"prices as of {frame.attrs['prices_as_of']}" in printed
    via_magic = ipython.run_line_magic(
        "gpugeek", "plan --params 1.3B --pricing spot --residency EU --checkpoint-every 30 "
                   "--checkpoint-seconds 90 --restart-minutes 5")
    via_api = gg.plan(params="1.3B", pricing="spot", residency="EU", checkpoint_every=30,
                      checkpoint_seconds=90, restart_minutes=5)
    pd.testing.assert_frame_equal(via_magic.table, via_api.table)
    assert (via_magic.table["ckpt_every_min"] == 30).all()


def _error_lines(ipython, line, capsys):
    result = ipython.run_cell(f"%gpugeek {line}")
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert result.error_in_exec is not None or "UsageError" in text
    return text.splitlines()


@pytest.mark.parametrize("line, expected", [
    ("offers --gpu A1000", "unknown GPU 'A1000' — did you mean A100"),
    ("offers --bogus", "unrecognized arguments: --bogus"),
    ("offers --count eight", "--count 'eight' is not a whole number"),
    ("offers --gpu H100 --count 3", "no offers match --gpu H100 --count 3"),
    ("plan --params 7Q", "--params '7Q' is not a number"),
    ("plan --model nothing_here", "no variable 'nothing_here'"),
    ("plan --model not_a_module", "--model names a str, not a torch.nn.Module"),
    ("plan --params 7B --gpus 0", "--gpus '0' must be a whole number ≥ 1"),
    ("frobnicate", "unknown subcommand 'frobnicate'"),
    ("doctor nosuch", "no cluster named 'nosuch'"),
    ("doctor --bogus", "unrecognized arguments: --bogus"),
    ("offers --residency Atlantis", "unknown residency 'Atlantis'"),
    ("plan --params 7B --checkpoint-every soon", "--checkpoint-every 'soon' is not a number"),
    ("plan --params 7B --restart-minutes -3", "--restart-minutes -3.0 must be a number ≥ 0"),
    ("up x --backend aws --offer aws/p5.48xlarge/us-east-2/use2-az1 --residency EU --dry-run",
     "offer aws/p5.48xlarge/us-east-2/use2-az1 is in US, outside --residency EU"),
    ("catalog refresh", "unknown action 'refresh'"),
    ("advise --usd-per-gpu-hour lots", "--usd-per-gpu-hour 'lots' is not a number"),
])
def test_bad_input_is_one_line(ipython, capsys, line, expected):
    ipython.user_ns["not_a_module"] = "hello"
    lines = _error_lines(ipython, line, capsys)
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "Traceback" not in lines[0]


def test_help_lists_subcommands(ipython, capsys):
    ipython.run_line_magic("gpugeek", "")
    out = capsys.readouterr().out
    assert "offers" in out and "plan" in out
    # each subcommand with its one-line summary (not the usage block magic_arguments makes of __doc__)
    assert "  offers   Compare GPU offers, cheapest first by the chosen pricing." in out
    assert "::" not in out and "  advise   Right-size a job from its telemetry" in out


@pytest.mark.parametrize("cell, expected", [
    ("%%gpugeek run --workers 0\nx = 1", "--workers 0 must be a whole number ≥ 1"),
    ("%%gpugeek run --amp fp8\nx = 1", "--amp 'fp8' is not known — use one of bf16, fp16, off"),
    ("%%gpugeek run --accumulate two\nx = 1", "--accumulate 'two' is not a whole number"),
    ("%%gpugeek run --push nothing_here\nx = 1", "no variable 'nothing_here'"),
    ("%%gpugeek run --gpus-per-worker -1\nx = 1", "--gpus-per-worker -1.0 must be a number ≥ 0 (0: CPUs)"),
    ("%%gpugeek run --gpus-per-worker 2\nx = 1", "for more GPUs use more --workers"),
    ("%%gpugeek run --collective-timeout 1\nx = 1", "--collective-timeout 1.0 must be a number ≥ 5 (seconds)"),
    ("%gpugeek run", "run is not used this way — write it as %%gpugeek run at the top of a cell"),
    ("%%gpugeek status\nx = 1", "status is not used this way — write it as %gpugeek status"),
])
def test_bad_run_input_is_one_line(ipython, capsys, cell, expected):
    result = ipython.run_cell(cell)
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert not result.success, "the bad input ran"
    assert len(lines) == 1 and expected in lines[0], lines


@pytest.mark.parametrize("line, call", [
    ("offers --pricing cheap", lambda: gg.offers(pricing="cheap")),
    ("plan --params 7B --strategy zero3", lambda: gg.plan(params="7B", strategy="zero3")),
    ("cost --by month", lambda: gg.cost(by="month")),
])
def test_a_wrong_choice_reads_the_same_from_the_magic_and_the_api(ipython, line, call):
    """One validator per value: the magic's usage error is the API's error, word for word."""
    with pytest.raises(gg.GpugeekError) as from_api:
        call()
    with pytest.raises(UsageError) as from_magic:
        ipython.run_line_magic("gpugeek", line)
    assert str(from_magic.value) == str(from_api.value)
    assert "use one of" in str(from_api.value)
