from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import MLP, TinyGPT

from gpugeek_jupyter import GpugeekError, plan
from gpugeek_jupyter.catalog import load_catalog
from gpugeek_jupyter.sizing import memory, spot

GIB = 1024**3


def test_7b_fsdp_on_8_gpus():
    p = plan(params="7B", precision="bf16", optimizer="adam", gpus=8, strategy="fsdp")
    per_gpu = p.memory.per_gpu(8)
    static = per_gpu["weights"] + per_gpu["gradients"] + per_gpu["optimizer"]
    assert static == pytest.approx(7e9 * 16 / 8 / GIB)  # 13.0 GiB = 14.0 GB
    assert per_gpu["activations"] > 0
    assert p.best is not None
    assert p.best["gpu_count"] * p.best["nodes"] == 8
    assert p.best["mem_per_gpu_gib"] <= p.best["gpu_mem_gib"]
    assert p.best["mem_per_gpu_gib"] == pytest.approx(per_gpu["total"])
    text = repr(p)
    assert "estimate" in text and "MFU" in text
    for column in ("cost_on_demand", "cost_spot", "cost_reserved", "est_hours"):
        assert column in p.table


def _actual_training_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    idx = torch.randint(0, 512, (2, 16))
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    optimizer.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if isinstance(t, torch.Tensor))
    return weights, grads, state


@pytest.mark.parametrize("name, make", [
    ("adam", lambda ps: torch.optim.Adam(ps)),
    ("adamw", lambda ps: torch.optim.AdamW(ps)),
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
])
def test_model_bytes_are_exact(name, make):
    torch.manual_seed(0)
    model = TinyGPT()
    est = memory.from_model(model, precision="fp32", optimizer=name, batch=2, seq=16)
    weights, grads, state = _actual_training_bytes(model, make(model.parameters()))
    assert est.weights_gib * GIB == weights
    assert est.gradients_gib * GIB == grads
    assert est.optimizer_gib * GIB == state


def _saved_for_backward(model, batch, seq, precision):
    """What torch really keeps for backward in one training step, storages counted once."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    idx = torch.randint(0, 512, (batch, seq))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    with autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())
    return sum(saved.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch, seq", [(8, 128), (4, 512), (2, 1000)])
def test_activations_match_what_torch_saves(precision, batch, seq):
    torch.manual_seed(0)
    model = TinyGPT()
    est = memory.from_model(model, precision=precision, batch=batch, seq=seq)
    actual = _saved_for_backward(model, batch, seq, precision)
    assert est.activations_gib * GIB == pytest.approx(actual, rel=0.30)


def test_grad_ckpt_and_fsdp_shrink_memory():
    torch.manual_seed(0)
    model = TinyGPT(depth=6)
    plain = memory.from_model(model, batch=8, seq=256)
    ckpt = memory.from_model(model, batch=8, seq=256, grad_ckpt=True)
    assert ckpt.activations_gib < 0.6 * plain.activations_gib
    fsdp = memory.from_model(model, batch=8, seq=256, strategy="fsdp")
    assert fsdp.per_gpu(4)["weights"] == pytest.approx(plain.per_gpu(4)["weights"] / 4)
    a = memory.from_params(7e9, seq=4096, batch=4)
    b = memory.from_params(7e9, seq=4096, batch=4, grad_ckpt=True)
    assert b.activations_gib < a.activations_gib / 4


def test_model_without_sequence_and_with_example():
    est = memory.from_model(MLP(), batch=64)
    assert est.activations_gib > 0
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(),
                               torch.nn.LazyLinear(10))
    conv(torch.randn(1, 3, 16, 16))
    with pytest.raises(GpugeekError, match="pass --example"):
        memory.from_model(conv, batch=4)
    est = memory.from_model(conv, batch=4, example=torch.randn(2, 3, 16, 16))
    assert est.activations_gib > 0
    assert plan(model=conv, example=torch.randn(1, 3, 16, 16), batch=32).best is not None


@pytest.mark.parametrize("kwargs, message", [
    ({"params": "7Q"}, "--params '7Q' is not a number"),
    ({"model": [1, 2]}, "--model names a list, not a torch.nn.Module"),
    ({"params": "7B", "model": MLP()}, "exactly one of --params"),
    ({}, "exactly one of --params"),
    ({"params": "7B", "strategy": "fsdp", "gpus": 1}, "fsdp needs more than one GPU"),
    ({"params": "7B", "precision": "fp8"}, "--precision 'fp8' is not known — use one of bf16, fp16, fp32"),
    ({"params": "7B", "tokens": "1T", "hours": 3}, "--tokens or --hours"),
    ({"params": "-1"}, "is not a number"),
])
def test_bad_input_is_one_clear_line(kwargs, message):
    with pytest.raises(GpugeekError, match=message) as info:
        plan(**kwargs)
    assert "\n" not in str(info.value)


def test_nothing_fits_says_what_to_try():
    p = plan(params="70B", gpus=1)
    assert p.best is None and p.table.empty
    assert "no offer fits" in p.summary() and "--grad-ckpt" in p.summary()


def _node_rate(provider: str, gpu: str) -> float:
    table = spot.bundled_rates()
    for key in ((provider, gpu), (provider, "*")):
        if key in table:
            return table[key].per_hour
    return float("nan")


def _brute_force(est, *, gpus, pricing, precision, grad_ckpt, tokens, objective, gpu, provider,
                 tokens_per_step):
    """The reference: every catalog row in plain Python, no pandas/numpy vector code."""
    price_key = {"on-demand": "on_demand_price", "spot": "spot_price",
                 "reserved": "reserved_price"}[pricing]
    best_key, best_id = None, None
    for row in load_catalog().to_dict("records"):
        if gpu and row["gpu"] != gpu:
            continue
        if provider and row["provider"] != provider:
            continue
        price, peak, count = row[price_key], row[f"{precision}_tflops"], row["gpu_count"]
        if price != price or peak != peak:  # NaN: not offered / unknown
            continue
        if gpus is None:
            nodes = 1
        elif count == gpus or (count >= 8 and gpus % count == 0):
            nodes = gpus // count
        else:
            continue
        world = count * nodes
        shard = world if est.strategy == "fsdp" else 1
        need = (est.static_gib / shard + est.activations_gib) * 1.05 + 1.0
        if need > row["gpu_mem_gib"]:
            continue
        flops = 3 * est.forward_flops_per_step / tokens_per_step * (4 / 3 if grad_ckpt else 1)
        hours = tokens * flops / (world * peak * 1e12 * 0.4 * 3600)
        rate = _node_rate(row["provider"], spot.gpu_key(row["gpu"], row["variant"])) * nodes
        unknown = pricing == "spot" and rate != rate   # ranked after those whose risk is priced
        if pricing == "spot" and not unknown:   # expected hours: preemptions at the rate × nodes
            state = est.weights_gib + est.optimizer_gib
            checkpoint = max(state / spot.CHECKPOINT_GIB_PER_S, 1.0) / 3600
            interval = min(float(spot.best_interval(rate, checkpoint)), 1e9)
            hours = float(spot.expected_hours(hours, rate, interval, checkpoint,
                                              spot.DEFAULT_RESTART_MINUTES / 60))
        cost = hours * price * nodes
        key = (unknown, cost, hours, row["id"]) if objective == "cost" else (unknown, hours, cost, row["id"])
        if best_key is None or key < best_key:
            best_key, best_id = key, row["id"]
    return best_id


# Hypothesis's default 100 cases in make test (0.14 s each, most of them pandas over the whole
# catalog); GPUGEEK_PLAN_EXAMPLES=1000 for a deeper search
@settings(max_examples=int(os.environ.get("GPUGEEK_PLAN_EXAMPLES", "100")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    params=st.sampled_from(["125M", "350M", "1.3B", "7B", "13B", "34B", "70B"]),
    precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    optimizer=st.sampled_from(["adam", "sgd"]),
    batch=st.integers(1, 16),
    seq=st.sampled_from([512, 2048, 4096]),
    grad_ckpt=st.booleans(),
    strategy=st.sampled_from(["ddp", "fsdp"]),
    gpus=st.sampled_from([None, 1, 2, 4, 8, 16, 32]),
    pricing=st.sampled_from(["on-demand", "spot", "reserved"]),
    objective=st.sampled_from(["cost", "time"]),
    gpu=st.sampled_from([None, "H100", "A100", "L4", "A10G"]),
    provider=st.sampled_from([None, "aws", "runpod", "lambda"]),
    tokens=st.sampled_from([1e9, 2e10, 3e11]),
)
def test_pick_equals_brute_force(params, precision, optimizer, batch, seq, grad_ckpt, strategy,
                                 gpus, pricing, objective, gpu, provider, tokens):
    if strategy == "fsdp" and gpus == 1:
        return
    p = plan(params=params, precision=precision, optimizer=optimizer, batch=batch, seq=seq,
             grad_ckpt=grad_ckpt, strategy=strategy, gpus=gpus, pricing=pricing,
             objective=objective, gpu=gpu, provider=provider, tokens=tokens)
    expected = _brute_force(p.memory, gpus=gpus, pricing=pricing, precision=precision,
                            grad_ckpt=grad_ckpt, tokens=tokens, objective=objective, gpu=gpu,
                            provider=provider, tokens_per_step=batch * seq)
    assert (p.best["id"] if p.best is not None else None) == expected


def test_plan_filters_are_validated_like_offers():
    p = plan(params="7B", gpus=8, strategy="fsdp", provider="aws", region="us-*")
    assert set(p.table["provider"]) == {"aws"}
    assert p.table["id"].str.split("/").str[2].str.startswith("us-").all()
    with pytest.raises(GpugeekError, match="unknown provider 'awz'"):
        plan(params="7B", provider="awz")
    with pytest.raises(GpugeekError, match="unknown GPU 'H1000'"):
        plan(params="7B", gpu="H1000")


def test_grad_ckpt_class_names_the_blocks():
    """Blocks that are attributes, not an ``nn.ModuleList``: ``--grad-ckpt`` alone cannot find them,
    and naming their class checkpoints them — each keeps only its input for backward."""
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.a, self.b = Mlp(), Mlp()

        def forward(self, x):
            return self.b(self.a(self.emb(x)))

    with pytest.raises(GpugeekError, match="--grad-ckpt-class"):
        plan(model=Flat(), seq=16, grad_ckpt=True)
    kept = plan(model=Flat(), seq=16).memory.activations_gib
    checkpointed = plan(model=Flat(), seq=16, grad_ckpt=True, ckpt_class="Mlp").memory.activations_gib
    assert checkpointed < 0.75 * kept, f"checkpointing the Mlp blocks kept {checkpointed / kept:.0%} of the activations"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activations_of_a_wide_model_within_15_percent(precision):
    torch.manual_seed(0)
    model = TinyGPT(width=512, heads=8)
    est = memory.from_model(model, precision=precision, batch=16, seq=512)
    actual = _saved_for_backward(model, 16, 512, precision)
    assert est.activations_gib * GIB == pytest.approx(actual, rel=0.15)


def test_planning_leaves_the_model_untouched():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 2)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert plan(model=model, batch=32).best is not None
    assert not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_fixed_hours_rank_by_price_per_token():
    cheap = plan(params="1B", hours=10)
    assert cheap.table["usd_per_m_tokens"].is_monotonic_increasing
    fast = plan(params="1B", hours=10, objective="time")
    assert fast.best["est_tokens"] == fast.table["est_tokens"].max()
    assert fast.best["est_tokens"] > cheap.best["est_tokens"]


def test_empty_plan_names_the_constraint():
    assert "with 3 GPUs" in plan(params="7B", gpus=3).summary()
    assert "GiB per GPU" in plan(params="70B", gpus=1).summary()


def test_plan_takes_one_request_and_says_a_wrong_option_in_one_line():
    """``plan``'s options are one request's fields (``PlanRequest``): help() and completion list
    them, and a keyword that is no option is refused in one line, not a TypeError."""
    import inspect

    from gpugeek_jupyter.sizing.request import PlanRequest

    shown = list(inspect.signature(plan).parameters)
    assert shown[:2] == ["params", "model"] and set(shown) == {f for f in PlanRequest.__dataclass_fields__}
    with pytest.raises(GpugeekError, match="no option 'gpu_count'") as info:
        plan(params="7B", gpu_count=8)
    assert "\n" not in str(info.value)
    asked = PlanRequest.of(params="7B", precision="fp16", batch="4")
    assert (asked.precision, asked.batch) == ("fp16", 4)
