"""``%gpugeek advise`` and ``%gpugeek catalog``: advice from what a job measured, and fresh prices.

Registered by importing this module (``magics/__init__.py`` does); each is a thin parser over
the API function of the same name.
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import api
from ..vocab import Pricing
from .flags import choice, number, subcommand


@subcommand
@magic_arguments()
@argument("job", nargs="?", help="job name or id (default: the cluster's last job)")
@argument("--cluster", help="cluster name (default: the active one)")
@argument("--gpu", help="the GPUs the job ran on, where the cluster has no offer (your own machines)")
@argument("--usd-per-gpu-hour", type=number("--usd-per-gpu-hour"), help="what one of those GPUs costs, $/h")
@argument("--pricing", type=choice(Pricing, "--pricing"), metavar="|".join(Pricing.values()),
          help="how the cheaper offers would be bought (default: as the cluster's nodes are)")
@argument("--residency", help="only offers in EU, UK, US, … or one country (DE)")
@argument("--catalog", help="a CSV of your own offers")
def advise(self, line: str):
    """Right-size a job from its telemetry: cheaper offers that hold its memory and keep up."""
    args = parse_argstring(advise, line)
    return api.advise(args.job, args.cluster, gpu=args.gpu, usd_per_gpu_hour=args.usd_per_gpu_hour,
                      pricing=args.pricing, catalog=args.catalog, residency=args.residency)


@subcommand
@magic_arguments()
@argument("action", help="update: fetch SkyPilot's hosted price catalogs")
@argument("--source", help="a base URL or a folder of <provider>/vms.csv (default: SkyPilot's hosted catalog)")
@argument("--provider", help="providers to update, comma-separated (default: all)")
def catalog(self, line: str):
    """Refresh the offers' prices from SkyPilot's hosted catalogs (the last good one stays on failure)."""
    args = parse_argstring(catalog, line)
    if args.action != "update":
        raise UsageError(f"unknown action {args.action!r} — `%gpugeek catalog update [--source URL|DIR]`")
    return api.update_catalog(source=args.source, providers=args.provider)
