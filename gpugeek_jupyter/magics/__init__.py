"""``%gpugeek``: one line magic whose first word picks the step of the loop.

Thin on purpose: each subcommand parses its flags with IPython's ``magic_arguments`` and calls
the same function the Python API exposes, so the two can never disagree.

Runs on: a notebook's kernel.
May import: `api.py`, `widgets/`, `sizing/`, the ground floor.
"""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .. import api
from ..errors import GpugeekError
from ..sizing import spot
from ..vocab import CostGrouping, Objective, Optimizer, Precision, Strategy
from .flags import (
    SUBCOMMANDS,
    choice_flag,
    cluster_name,
    job_flags,
    number,
    offer_filters,
    positive_float,
    positive_int,
    pricing_flag,
    slurm_flags,
    span,
    subcommand,
)


@subcommand
@magic_arguments()
@offer_filters
@argument("--count", help="GPUs per instance: 8, or 8+ for at least 8")
@argument("--min-gpu-mem", type=positive_float("--min-gpu-mem"), help="GiB per GPU, at least")
@argument("--max-price", type=positive_float("--max-price"), help="$/h per instance, at most")
@argument("--top", type=positive_int("--top"), help="show only the K cheapest")
@argument("--chart", action="store_true", help="add the price–performance chart")
@argument("--pick", action="store_true", help="an interactive picker: filters, table, chart, Plan, Provision")
def offers(self: GpugeekMagics, line: str):
    """Compare GPU offers, cheapest first by the chosen pricing."""
    args = parse_argstring(offers, line)
    if args.pick:
        from ..widgets import OfferPicker

        return OfferPicker(gpu=args.gpu, count=args.count, min_gpu_mem=args.min_gpu_mem,
                           provider=args.provider, pricing=args.pricing,
                           max_price=args.max_price, catalog=args.catalog, residency=args.residency)
    frame = api.offers(
        gpu=args.gpu, count=args.count, min_gpu_mem=args.min_gpu_mem, provider=args.provider,
        region=args.region, max_price=args.max_price, pricing=args.pricing, top=args.top,
        catalog=args.catalog, residency=args.residency,
    )
    if frame.attrs.get("prices_as_of"):
        print(f"prices as of {frame.attrs['prices_as_of']}")
    for key in ("note", "residency_note", "stale_warning", "renting_note", "image_note"):
        if frame.attrs.get(key):
            print(frame.attrs[key])
    if args.chart:
        display(api.price_performance(frame))
    return frame


@subcommand
@magic_arguments()
@argument("--params", help="parameter count, like 7B or 350M")
@argument("--model", help="name of a torch.nn.Module in the notebook")
@argument("--example", help="name of one input batch for --model (when it can't be inferred)")
@choice_flag("--precision", Precision, "bf16", "the dtype the model trains in (mixed precision: torch.amp)")
@choice_flag("--optimizer", Optimizer, "adam", "the optimizer whose state is counted in memory")
@argument("--batch", type=positive_int("--batch"), default=1, help="micro-batch per GPU")
@argument("--seq", type=positive_int("--seq"), help="sequence length (default 2048 with --params)")
@argument("--grad-ckpt", action="store_true", help="activation (gradient) checkpointing")
@argument("--grad-ckpt-class", help="block class to checkpoint (default: nn.ModuleList children)")
@choice_flag("--strategy", Strategy, "ddp", "how the model is spread over the GPUs (fsdp shards its state)")
@argument("--gpus", type=positive_int("--gpus"), help="total GPUs (several nodes when > 8)")
@argument("--tokens", help="tokens (or samples) to train on, like 2B")
@argument("--hours", type=positive_float("--hours"), help="or: hours to train for")
@choice_flag("--objective", Objective, "cost", "rank by cost or time (with --hours: $ per token, or tokens trained)")
@argument("--mfu", type=positive_float("--mfu"), default=0.4, help="assumed model FLOPs utilisation")
@argument("--checkpoint-every", type=positive_float("--checkpoint-every"), metavar="MINUTES",
          help="spot: minutes between checkpoints (default: the interval that costs least)")
@argument("--checkpoint-seconds", type=positive_float("--checkpoint-seconds"),
          help="spot: how long one checkpoint takes (default: from the model's size)")
@argument("--restart-minutes", type=number("--restart-minutes"), default=spot.DEFAULT_RESTART_MINUTES,
          help="spot: a restart after a preemption (new node, reload)")
@offer_filters
@argument("--top", type=positive_int("--top"), default=10, help="rows to show")
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
        ckpt_class=args.grad_ckpt_class, residency=args.residency,
        checkpoint_every=args.checkpoint_every, checkpoint_seconds=args.checkpoint_seconds,
        restart_minutes=args.restart_minutes,
    )


from . import advice  # noqa: E402,F401 - registers advise and catalog after plan


@subcommand
@magic_arguments()
@argument("name", nargs="?", help="cluster name (default: the backend's name); a live one is re-attached")
@argument("--backend", help="local (default; a cloud's --offer: that cloud), sim, ssh, onprem (your hosts through "
                             "Ray's `ray up`), aws, gcp, azure, kuberay or slurm (an allocation of a Slurm cluster)")
@argument("--hosts", help="ssh, onprem: your machines, [USER@]HOST[:PORT],… (the head goes on the first)")
@argument("--ssh-key", help="ssh, slurm: the private key to log in with (default: your ssh config and agent)")
@argument("--gpus-per-host", type=number("--gpus-per-host", int),
          help="ssh: GPUs each host has; slurm: GRES GPUs asked for on each node")
@argument("--cpus-per-host", type=number("--cpus-per-host", int),
          help="ssh: CPUs Ray may use on each host; slurm: CPUs asked for on each node")
@argument("--usd-per-hour", type=number("--usd-per-hour"),
          help="ssh, slurm: what each host (node) costs you ($/h, 0 allowed)")
@argument("--python", help="ssh, slurm: a Python on every host whose environment has Ray at this kernel's version, "
                           "used as it is (default: a runtime made on each host; slurm: in the shared home)")
@argument("--no-install", action="store_true", help="ssh, slurm: never install on the hosts; say what is missing")
@argument("--pip-index-url", help="ssh, slurm: the package index the hosts install from (a mirror of PyPI)")
@slurm_flags
@argument("--env", help="a requirements.txt or pyproject.toml: pip packages every job gets on every node")
@argument("--working-dir", help="a folder sent to every node: each cell starts in its copy (data beside the notebook)")
@argument("--storage", help="where jobs checkpoint unless a cell says: s3://…, gs://…, az://… or a shared path")
@argument("--internal-ips", action="store_true",
          help="clouds: reach the nodes at their private addresses (from inside their network: VPN, bastion, VPC)")
@argument("--address", help="attach to a running Ray cluster at host:port instead")
@argument("--offer", help="offer id from `%%gpugeek offers`")
@argument("--plan", help="name of a plan in the notebook: use its best offer and node count")
@argument("--gpu", help="GPU family: the cheapest matching offer")
@argument("--count", type=number("--count", int), help="GPUs per node with --gpu")
@argument("--workers", type=number("--workers", int),
          help="worker nodes kept up (your own --hosts: a worker group of N, started while up returns)")
@argument("--min-workers", type=number("--min-workers", int), help="same as --workers")
@argument("--max-workers", type=number("--max-workers", int), help="ceiling the autoscaler may grow to")
@pricing_flag()
@argument("--spot-fallback", action="store_true", help="replace a preempted spot node with on-demand")
@argument("--budget", type=number("--budget"), help="USD: warn at 80%%, stop everything at 100%%")
@argument("--idle", type=number("--idle"), help="minutes without a job before the cluster stops")
@argument("--dashboard", action="store_true", help="also start Ray's dashboard (local and sim heads)")
@argument("--dry-run", action="store_true", help="show the config, start nothing")
@argument("--yes", action="store_true", help="really launch on a cloud / Kubernetes (costs money)")
@argument("--catalog", help="a CSV of your own offers")
@argument("--residency", help="the offer must lie in EU, UK, US, … or one country (DE)")
def up(self: GpugeekMagics, line: str):
    """Start a Ray cluster (or re-attach to a live one by name); it becomes the active cluster."""
    args = parse_argstring(up, line)
    plan = self._variable(args.plan, "--plan") if args.plan else None
    # every flag goes on by its name (tests/test_up_flags.py holds them to `up`'s and UpRequest's)
    flags = {k: v for k, v in vars(args).items() if k not in ("name", "plan", "no_install")}
    return api.up(args.name, plan=plan, install=not args.no_install, **flags)


@subcommand
@magic_arguments()
@cluster_name
def status(self: GpugeekMagics, line: str):
    """Nodes, GPUs, dollars spent, burn rate, budget and autostop of a cluster."""
    return api.status(parse_argstring(status, line).name)


@subcommand
@magic_arguments()
@argument("workers", type=number("workers", int), help="worker nodes to keep")
@cluster_name
def scale(self: GpugeekMagics, line: str):
    """Resize a cluster to N worker nodes."""
    args = parse_argstring(scale, line)
    return api.scale(args.workers, args.name)


@subcommand
@magic_arguments()
@argument("--budget", type=number("--budget"), help="USD: the new cap (warn at 80%%, stop at 100%%)")
@argument("--idle", type=number("--idle"), help="minutes idle before the cluster stops")
@cluster_name
def limits(self: GpugeekMagics, line: str):
    """Change a live cluster's budget cap or idle stop; on a remote cluster its head is told too."""
    args = parse_argstring(limits, line)
    return api.limits(args.name, budget=args.budget, idle=args.idle)


@subcommand
@magic_arguments()
@cluster_name
@argument("--all", action="store_true", help="every live cluster")
@argument("--forget", action="store_true",
          help="close the record of a remote cluster whose machines are gone (its nodes end when it was "
               "last heard from)")
def down(self: GpugeekMagics, line: str):
    """Stop a cluster: its jobs, its nodes, its processes — only those we started."""
    args = parse_argstring(down, line)
    if args.all and args.name:
        raise UsageError("a name and --all given together — give one of the two")
    names = api.down(args.name, all=args.all, forget=args.forget)
    print(f"stopped: {', '.join(names)}" if names else "no live cluster to stop")


@subcommand
@magic_arguments()
def clusters(self: GpugeekMagics, line: str):
    """Every cluster, live and past; orphans are live clusters no notebook is attached to."""
    parse_argstring(clusters, line)
    return api.clusters()


@subcommand
@magic_arguments()
def backends(self: GpugeekMagics, line: str):
    """What each --backend can do: for each feature, yes, or why not and what to do instead."""
    parse_argstring(backends, line)
    return api.backend_features()


@subcommand
@magic_arguments()
@cluster_name
@choice_flag("--by", CostGrouping, "node", "how the dollars are grouped in the table")
def cost(self: GpugeekMagics, line: str):
    """What a cluster has cost (from the ledger): a table and cumulative $ over time."""
    args = parse_argstring(cost, line)
    return api.cost(args.name, by=args.by)


@subcommand
@magic_arguments()
@argument("node", help="node id, or its last characters as `status` shows them")
@argument("--notice", type=float, default=0.0, metavar="SECONDS",
          help="warn the node's workers this long before it goes, as AWS (120 s) and GCP (30 s) do")
@cluster_name
def preempt(self: GpugeekMagics, line: str):
    """Rehearse a spot preemption on a sim cluster: the node vanishes (after a notice, if given)."""
    args = parse_argstring(preempt, line)
    print(api.preempt(args.node, args.name, notice=args.notice))


@subcommand
@magic_arguments()
@cluster_name
@argument("--packages", help="more packages to compare with this kernel's, comma-separated (transformers,…)")
def doctor(self: GpugeekMagics, line: str):
    """Check every node: versions against this kernel, interface, GPUs, ports, clocks, all_reduce per pair."""
    args = parse_argstring(doctor, line)
    return api.doctor(args.name, packages=args.packages)


@subcommand
@magic_arguments()
@argument("name", nargs="?", help="cluster name (default: every cluster)")
@argument("--since", type=span("--since"), metavar="SPAN", help="only the last SPAN: 90s, 30m, 2h, 7d")
@argument("--json", action="store_true", help="print the events as JSON lines")
def log(self: GpugeekMagics, line: str):
    """The audit log: every action on a cluster — who, from where, with what options, at what $."""
    args = parse_argstring(log, line)
    events = api.log(args.name, since=args.since)
    if args.json:
        print(events.to_json(orient="records", lines=True, date_format="iso"))
        return None
    return events


CELL_SUBCOMMANDS = {"run"}


def _names(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


@subcommand
@magic_arguments()
@job_flags
@argument("--push", help="notebook variables to send, comma-separated")
@argument("--pull", help="variables to bring back from rank 0, comma-separated")
def run(self: GpugeekMagics, line: str, cell: str = ""):
    """Run the cell on every worker of a warm DDP group (`%%gpugeek run`)."""
    args = parse_argstring(run, line)
    push = {n: self._variable(n, "--push") for n in _names(args.push)}
    result = api.run(cell, push=push or None, pull=_names(args.pull) or None, **_job_options(args))
    self.shell.user_ns.update(result.pulled)
    return result.shown()


@subcommand
@magic_arguments()
@job_flags
@argument("script", help="a torchrun-style training script (train.py): every worker runs it as a rank")
@argument("args", nargs=argparse.REMAINDER, help="the script's own arguments (after its name, as torchrun takes them)")
def torchrun(self: GpugeekMagics, line: str):
    """Run an existing torchrun script on the warm group as one job (`%gpugeek torchrun train.py ARGS`)."""
    args = parse_argstring(torchrun, line)
    return api.torchrun(args.script, *args.args, **_job_options(args)).shown()


def _job_options(args) -> dict:
    """``job_flags`` as the API takes them."""
    return dict(workers=args.workers, gpus_per_worker=args.gpus_per_worker, amp=args.amp,
                grad_ckpt=args.grad_ckpt, accumulate=args.accumulate, clip=args.clip,
                strategy=args.strategy, checkpoint_every=args.checkpoint_every,
                checkpoint_dir=args.checkpoint_dir, collective_timeout=args.collective_timeout,
                max_failures=args.max_failures, all_ranks=args.all_ranks, name=args.name,
                monitor=not args.no_monitor)


@subcommand
@magic_arguments()
@argument("path", help="a file or folder the job wrote on its nodes (relative to its folder there, or absolute)")
@argument("--rank", type=int, help="from this rank's node (default: rank 0's)")
@argument("--all-ranks", action="store_true", help="from every rank's node, each into a rank-N/ folder")
@argument("--to", help="where here (default: its own name in the notebook's folder)")
@argument("--overwrite", action="store_true", help="replace what is there already")
def fetch(self: GpugeekMagics, line: str):
    """Bring back what a job wrote on the cluster's nodes (`%gpugeek fetch checkpoints`)."""
    args = parse_argstring(fetch, line)
    api.fetch(args.path, rank=args.rank, all_ranks=args.all_ranks, to=args.to, overwrite=args.overwrite)


@subcommand
@magic_arguments()
@cluster_name
def jobs(self: GpugeekMagics, line: str):
    """The cluster's jobs, running or ended, whichever kernel started them."""
    args = parse_argstring(jobs, line)
    return api.jobs(args.name)


@subcommand
@magic_arguments()
@argument("job", help="a job's name or id, as `%%gpugeek jobs` lists them (a name: the newest job of that name)")
@argument("--adopt", action="store_true",
          help="then run this kernel's cells on the job's warm worker group, its variables with it "
               "(its own kernel must be gone)")
@cluster_name
def attach(self: GpugeekMagics, line: str):
    """Follow a job from this kernel: its output, then its pulled variables into the notebook."""
    args = parse_argstring(attach, line)
    result = api.attach(args.job, args.name, adopt=args.adopt)
    self.shell.user_ns.update(result.pulled)
    if result.pulled:
        print(f"pulled: {', '.join(sorted(result.pulled))}")
    return result.shown()


@subcommand
@magic_arguments()
def reset(self: GpugeekMagics, line: str):
    """Stop the worker group (and its namespace); the next run builds a new one."""
    parse_argstring(reset, line)
    print("worker group stopped" if api.reset() else "no worker group to stop")


def drain_telemetry() -> None:
    """After each cell: the node samplers' reports into the ledger (never an error in the cell)."""
    api.drain_telemetry()


def _show_news() -> None:
    """Budget warnings and autostops the watchdog recorded since the last ``%gpugeek`` call."""
    for line in api.news():
        print(line)


@magics_class
class GpugeekMagics(Magics):
    @line_cell_magic
    def gpugeek(self, line: str, cell: str | None = None):
        """%gpugeek SUBCOMMAND [options] — `%gpugeek help` lists the subcommands;
        `%%gpugeek run [options]` runs the cell on the worker group."""
        name, _, rest = line.strip().partition(" ")
        if name in ("", "help", "-h", "--help"):
            print(self._help())
            return None
        handler = SUBCOMMANDS.get(name)
        if handler is None:
            raise UsageError(f"unknown subcommand {name!r} — use one of {', '.join(SUBCOMMANDS)}")
        if (cell is not None) != (name in CELL_SUBCOMMANDS):
            how = f"%%gpugeek {name} at the top of a cell" if name in CELL_SUBCOMMANDS else f"%gpugeek {name}"
            raise UsageError(f"{name} is not used this way — write it as {how}")
        _show_news()
        return handler(self, rest, cell) if cell is not None else handler(self, rest)

    def _variable(self, name: str, flag: str) -> object:
        namespace = self.shell.user_ns
        if name not in namespace:
            raise GpugeekError(f"{flag} {name}: no variable {name!r} in the notebook — define it first")
        return namespace[name]

    @staticmethod
    def _help() -> str:
        lines = ["%gpugeek SUBCOMMAND [options]; `%gpugeek SUBCOMMAND -h` for its options", ""]
        for name, func in SUBCOMMANDS.items():
            # magic_arguments rewrites __doc__ into a usage block; the parser keeps the summary
            summary = (func.parser.description or "").strip().splitlines()
            lines.append(f"  {name:<8} {summary[0] if summary else ''}")
        return "\n".join(lines)
