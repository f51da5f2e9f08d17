"""The flags the ``%gpugeek`` subcommands share, and the registry that names them.

Each parser only checks the flag's form (a number, a choice) and says what is wrong in one line
(IPython's ``UsageError``); the API checks ranges and meaning, so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from ..errors import GpugeekError
from ..units import number as checked
from ..units import parse_duration
from ..vocab import Amp, Choice, Pricing, Strategy

Subcommand = Callable[..., object]      # (the magics object, the line[, the cell])
SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(func: Callable) -> Callable:
    """Register ``func`` as ``%gpugeek <name>``; its ``magic_arguments`` parser gets that prog."""
    func.parser.prog = f"%gpugeek {func.__name__}"
    SUBCOMMANDS[func.__name__] = func
    return func


def choice(kind: type[Choice], flag: str) -> Callable[[str], str]:
    """A flag whose value is one of ``kind``'s: checked by the vocabulary's one validator."""
    def parse(text: str) -> str:
        try:
            return kind.parse(text, flag).value
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    parse.__name__ = flag.lstrip("-")         # argparse names the flag's type in its messages
    return parse


def choice_flag(flag: str, kind: type[Choice], default: str, help_text: str) -> Callable:
    """A flag whose value is one of ``kind``'s, the values shown as its metavar (``ddp|fsdp``)."""
    return argument(flag, default=default, type=choice(kind, flag), metavar="|".join(kind.values()), help=help_text)


def flags(*arguments: Callable) -> Callable:
    """Several ``argument`` decorators as one, shared by the subcommands that take them (the way
    ipyparallel's magics share ``exec_args``/``output_args``)."""
    def apply(func: Callable) -> Callable:
        for add in reversed(arguments):
            func = add(func)
        return func
    return apply


def pricing_flag(help_text: str = "how the offer is bought") -> Callable:
    return argument("--pricing", default=Pricing.ON_DEMAND.value, type=choice(Pricing, "--pricing"),
                    metavar="|".join(Pricing.values()), help=help_text)


# what narrows the catalog, in offers, plan and the picker
offer_filters = flags(
    argument("--gpu", help="GPU families or provider spellings, comma-separated (H100,A100)"),
    argument("--provider", help="providers, comma-separated (aws,lambda)"),
    argument("--region", help="region or zone pattern (us-*, europe)"),
    argument("--residency", help="only offers in EU, EEA, UK, US, CA, CH, APAC or one country (DE)"),
    pricing_flag(),
    argument("--catalog", help="a CSV of your own offers (same columns as the bundled one)"),
)
# the cluster a command is about
cluster_name = argument("name", nargs="?", help="cluster name (default: the active one)")


def number(flag: str, kind: type = float, above: float | None = None,
           at_least: float | None = None) -> Callable[[str], float]:
    """A number flag's form (``kind``) and, where given, its floor, in ``units.number``'s words;
    the API checks the rest the same way."""
    def parse(text: str) -> float:
        try:
            return checked(text, flag, whole=kind is int, least=at_least, above=above)
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    return parse


def positive_float(flag: str) -> Callable[[str], float]:
    return number(flag, float, above=0)


def positive_int(flag: str) -> Callable[[str], int]:
    return number(flag, int, at_least=1)


def span(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, flag)
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    return parse


# what a Slurm cluster's `up` asks of its scheduler: sbatch's own options, by their own names
slurm_flags = flags(
    argument("--login", help="slurm: the cluster's login node, [USER@]HOST[:PORT] or a host of your ssh config"),
    argument("--partition", help="slurm: the partition to ask nodes of (default: the cluster's)"),
    argument("--nodes", type=number("--nodes", int), help="slurm: how many nodes the job holds (default 1)"),
    argument("--gpu-type", help="slurm: the GRES type of the GPUs (--gres=gpu:TYPE:N), where the cluster names types"),
    argument("--time", help="slurm: the walltime (minutes, HH:MM:SS, D-HH:MM); 2 min ahead, a cell checkpoints"),
    argument("--account", help="slurm: the account the job is charged to"),
    argument("--qos", help="slurm: the quality of service asked for"),
    argument("--constraint", help="slurm: node features the job needs (sbatch --constraint)"),
    argument("--setup", help="slurm: shell lines run before Ray on each node (`module load cuda`)"),
    argument("--job", help="slurm: re-attach to the live cluster holding this job (its id in squeue)"),
    argument("--requeue", action="store_true",
        help="slurm: at the walltime's notice, requeue the job: the cluster goes on in its next allocation, "
             "where a running cell resumes from its checkpoint"),
    argument("--sbatch", help="slurm: any other sbatch options, as on its command line (\"--exclusive --mem=0\")"),
)


# what a job asks of the worker group, in `run` and `torchrun` (--amp, --grad-ckpt and
# --accumulate are the gg helper's: a cell or script that never calls gg is told they don't apply)
job_flags = flags(
    argument("--workers", type=number("--workers", int), default=2,
             help="workers, one rank each (torchrun's --nproc-per-node × --nnodes)"),
    argument("--gpus-per-worker", type=number("--gpus-per-worker"),
             help="GPUs per worker: by default one where the cluster's machines have GPUs, none (CPUs) "
                  "where they have none; 0 asks for CPUs, 0.5 shares one"),
    argument("--amp", default="off", type=choice(Amp, "--amp"), metavar="|".join(Amp.values()),
             help="mixed precision for gg.autocast()"),
    argument("--grad-ckpt", nargs="?", const=True, default=False, metavar="CLASS",
             help="activation checkpointing of repeated blocks (or of CLASS), by gg.prepare"),
    argument("--accumulate", type=number("--accumulate", int), default=1, help="micro-batches per gg step"),
    argument("--clip", type=number("--clip"), help="clip gradients to this norm"),
    choice_flag("--strategy", Strategy, "ddp", "ddp (a full copy on each worker) or fsdp (FSDP2 fully_shard)"),
    argument("--checkpoint-every", type=number("--checkpoint-every", int), help="save every N steps"),
    argument("--checkpoint-dir", help="where checkpoints go (shared by all workers)"),
    argument("--collective-timeout", type=number("--collective-timeout"), metavar="SECONDS",
             help="a collective (all_reduce…) waiting longer fails the cell (default 300)"),
    argument("--max-failures", type=number("--max-failures", int), default=0,
             help="rebuild and re-run (resuming) after up to K dead workers"),
    argument("--all-ranks", action="store_true", help="show every rank's output, prefixed"),
    argument("--name", help="job name (ledger, checkpoints)"),
    argument("--no-monitor", action="store_true", help="no live job widget or final figure"),
)
