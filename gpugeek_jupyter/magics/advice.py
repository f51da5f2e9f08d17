"""``%gpugeek advise``, ``%gpugeek catalog`` and ``%gpugeek check``: advice from what a job
measured, fresh prices, and whether each way to get machines is ready before ``up``.

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


@subcommand
@magic_arguments()
@argument("ways", nargs="*", metavar="WAY", help="the backends to look at: aws, slurm, … (default: every one "
                                                  "with something to look at)")
@argument("--region", help="aws: the region to look in (default: AWS_DEFAULT_REGION or your profile's)")
@argument("--login", help="slurm: the login node to look at, [USER@]HOST[:PORT]")
@argument("--hosts", help="ssh: your machines to look at, comma-separated [USER@]HOST[:PORT]")
@argument("--ssh-key", help="the private key for --login and --hosts")
def check(self, line: str):
    """Whether each way to get machines is ready — credentials, permissions, login node, hosts —
    found without launching anything or spending a cent."""
    args = parse_argstring(check, line)
    print(api.check(args.ways, region=args.region, login=args.login, ssh_key=args.ssh_key, hosts=args.hosts))
