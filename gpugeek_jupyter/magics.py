"""``%gpugeek``: one line magic whose first word picks the step of the loop.

Thin on purpose: each subcommand parses its flags with IPython's ``magic_arguments`` and calls
the same function the Python API exposes, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from . import api
from .errors import GpugeekError

Subcommand = Callable[["GpugeekMagics", str], object]
SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(func: Callable) -> Callable:
    """Register ``func`` as ``%gpugeek <name>``; its ``magic_arguments`` parser gets that prog."""
    func.parser.prog = f"%gpugeek {func.__name__}"
    SUBCOMMANDS[func.__name__] = func
    return func


def _positive_float(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} {text!r} is not a number") from None
        if value <= 0:
            raise UsageError(f"{flag} {text!r} must be positive")
        return value
    return parse


def _positive_int(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{flag} {text!r} is not a whole number") from None
        if value < 1:
            raise UsageError(f"{flag} {text!r} must be at least 1")
        return value
    return parse


@subcommand
@magic_arguments()
@argument("--gpu", help="GPU families or provider spellings, comma-separated (H100,A100)")
@argument("--count", help="GPUs per instance: 8, or 8+ for at least 8")
@argument("--min-gpu-mem", type=_positive_float("--min-gpu-mem"), help="GiB per GPU, at least")
@argument("--provider", help="providers, comma-separated (aws,lambda)")
@argument("--region", help="region or zone pattern (us-*, europe)")
@argument("--max-price", type=_positive_float("--max-price"), help="$/h per instance, at most")
@argument("--pricing", default="on-demand", choices=["on-demand", "spot", "reserved"])
@argument("--top", type=_positive_int("--top"), help="show only the K cheapest")
@argument("--chart", action="store_true", help="add the price–performance chart")
@argument("--catalog", help="a CSV of your own offers (same columns as the bundled one)")
def offers(self: GpugeekMagics, line: str):
    """Compare GPU offers, cheapest first by the chosen pricing."""
    args = parse_argstring(offers, line)
    frame = api.offers(
        gpu=args.gpu, count=args.count, min_gpu_mem=args.min_gpu_mem, provider=args.provider,
        region=args.region, max_price=args.max_price, pricing=args.pricing, top=args.top,
        catalog=args.catalog,
    )
    if "note" in frame.attrs:
        print(frame.attrs["note"])
    if args.chart:
        display(api.price_performance(frame))
    return frame


@subcommand
@magic_arguments()
@argument("--params", help="parameter count, like 7B or 350M")
@argument("--model", help="name of a torch.nn.Module in the notebook")
@argument("--example", help="name of one input batch for --model (when it can't be inferred)")
@argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
@argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd"])
@argument("--batch", type=_positive_int("--batch"), default=1, help="micro-batch per GPU")
@argument("--seq", type=_positive_int("--seq"), help="sequence length (default 2048 with --params)")
@argument("--grad-ckpt", action="store_true", help="activation (gradient) checkpointing")
@argument("--grad-ckpt-class", help="block class to checkpoint (default: nn.ModuleList children)")
@argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
@argument("--gpus", type=_positive_int("--gpus"), help="total GPUs (several nodes when > 8)")
@argument("--tokens", help="tokens (or samples) to train on, like 2B")
@argument("--hours", type=_positive_float("--hours"), help="or: hours to train for")
@argument("--pricing", default="on-demand", choices=["on-demand", "spot", "reserved"])
@argument("--objective", default="cost", choices=["cost", "time"])
@argument("--mfu", type=_positive_float("--mfu"), default=0.4, help="assumed model FLOPs utilisation")
@argument("--gpu", help="only these GPU families")
@argument("--provider", help="only these providers")
@argument("--region", help="only regions or zones matching this pattern")
@argument("--top", type=_positive_int("--top"), default=10, help="rows to show")
@argument("--catalog", help="a CSV of your own offers")
def plan(self: GpugeekMagics, line: str):
    """Size a training run against your model and pick the cheapest offer that fits."""
    args = parse_argstring(plan, line)
    if args.grad_ckpt_class:
        args.grad_ckpt = True
    model = self._variable(args.model, "--model") if args.model else None
    example = self._variable(args.example, "--example") if args.example else None
    return api.plan(
        params=args.params, model=model, example=example, precision=args.precision,
        optimizer=args.optimizer, batch=args.batch, seq=args.seq, grad_ckpt=args.grad_ckpt,
        strategy=args.strategy, gpus=args.gpus, tokens=args.tokens, hours=args.hours,
        pricing=args.pricing, objective=args.objective, mfu=args.mfu, gpu=args.gpu,
        provider=args.provider, region=args.region, top=args.top, catalog=args.catalog,
        ckpt_class=args.grad_ckpt_class,
    )


@magics_class
class GpugeekMagics(Magics):
    @line_magic
    def gpugeek(self, line: str):
        """%gpugeek SUBCOMMAND [options] — `%gpugeek help` lists the subcommands."""
        name, _, rest = line.strip().partition(" ")
        if name in ("", "help", "-h", "--help"):
            print(self._help())
            return None
        handler = SUBCOMMANDS.get(name)
        if handler is None:
            raise UsageError(f"unknown subcommand {name!r} — try: {', '.join(SUBCOMMANDS)}")
        return handler(self, rest)

    def _variable(self, name: str, flag: str) -> object:
        namespace = self.shell.user_ns
        if name not in namespace:
            raise GpugeekError(f"{flag} {name}: no variable {name!r} in the notebook — define it first")
        return namespace[name]

    @staticmethod
    def _help() -> str:
        lines = ["%gpugeek SUBCOMMAND [options]; `%gpugeek SUBCOMMAND -h` for its options", ""]
        for name, func in SUBCOMMANDS.items():
            lines.append(f"  {name:<8} {(func.__doc__ or '').strip().splitlines()[0]}")
        return "\n".join(lines)
