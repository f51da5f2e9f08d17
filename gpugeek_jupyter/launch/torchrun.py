"""The group launched as ``torchrun`` would launch it: every worker holds the variables that
Transformers, Accelerate, Lightning and plain torchrun scripts read to find themselves
distributed (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, …), agreeing with the
process group the worker already joined — so the code people already write trains on every worker
with no edit.

As under ``torchrun``, ranks on one node are consecutive and number from its first rank, and on a
node where each worker has one GPU of its own every worker sees all of that node's workers' GPUs,
its own at index ``LOCAL_RANK`` (``cuda:LOCAL_RANK`` is its GPU, which is what frameworks pick).

The warm group is formed once and kept between cells, while a script formed and ended its own:
so on a worker ``init_process_group`` finds the group formed (it is a no-op when the backend
fits) and ``destroy_process_group`` of the default group leaves it for the next cell.

The kernel computes the contract (standard library); the worker applies it and keeps its group
(torch, loaded there).
"""

from __future__ import annotations

import os

from ..errors import GpugeekError

RUN_ID_PREFIX = "gpugeek-"


def process_env() -> dict[str, str]:
    """What a worker process is started with, before torch loads. torch's C++ side warns on every
    rendezvous connection whose peer address has no reverse DNS entry ("[c10d] The hostname of the
    client socket cannot be retrieved"), as on most private networks; those lines would reach every
    cell. Its log level is read once, at load, so it is set here: errors still show, and so does
    every Python warning a cell raises. A kernel started with ``TORCH_CPP_LOG_LEVEL`` passes its own."""
    return {"TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def rank_order(bundle_nodes: list[str]) -> list[int]:
    """The bundle each rank takes, so that the ranks on one node are consecutive as under
    ``torchrun``: rank 0 keeps bundle 0 (it leads), its node's other bundles follow, then each
    other node's in the order of its first bundle."""
    nodes: list[str] = []
    for node in bundle_nodes:
        if node not in nodes:
            nodes.append(node)
    return [b for node in nodes for b, where in enumerate(bundle_nodes) if where == node]


def contract(where: list[tuple[str, list]], master: str, port: int, run_id: str) -> list[dict[str, str]]:
    """Each rank's ``torchrun`` variables: ``where[r]`` is rank r's node and the GPU ids Ray gave
    it. Where every worker of a node has one GPU of its own, they all see the node's GPUs,
    ordered by local rank (``CUDA_VISIBLE_DEVICES``); elsewhere Ray's setting stands."""
    nodes, gpus = [node for node, _ in where], [list(ids) for _, ids in where]
    order: list[str] = []
    for node in nodes:
        if node not in order:
            order.append(node)
    ranks_on = {node: [r for r, n in enumerate(nodes) if n == node] for node in order}
    envs = []
    for rank, node in enumerate(nodes):
        mates = ranks_on[node]
        env = {
            "RANK": rank, "WORLD_SIZE": len(nodes),
            "LOCAL_RANK": mates.index(rank), "LOCAL_WORLD_SIZE": len(mates),
            "GROUP_RANK": order.index(node), "NODE_RANK": order.index(node), "GROUP_WORLD_SIZE": len(order),
            "ROLE_RANK": rank, "ROLE_WORLD_SIZE": len(nodes), "ROLE_NAME": "default",
            "MASTER_ADDR": master, "MASTER_PORT": port,
            # what ``torch.distributed.is_torchelastic_launched()`` (and so Lightning) looks for
            "TORCHELASTIC_RUN_ID": RUN_ID_PREFIX + run_id, "TORCHELASTIC_RESTART_COUNT": 0,
            "TORCHELASTIC_MAX_RESTARTS": 0,
            # rank 0 hosts the store at MASTER_PORT, not an agent: env:// must not wait for one
            "TORCHELASTIC_USE_AGENT_STORE": "False",
        }
        own = [gpus[r] for r in mates]
        ids = [str(g[0]) for g in own if len(g) == 1]
        if len(ids) == len(mates) and len(set(ids)) == len(ids):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        envs.append({k: str(v) for k, v in env.items()})
    return envs


def apply(env: dict[str, str]) -> None:
    """This worker's contract into its environment (again before each cell: a framework's
    teardown may have removed some, as Lightning's removes ``WORLD_SIZE``): only what changed."""
    changed = {key: value for key, value in env.items() if os.environ.get(key) != value}
    if changed:
        os.environ.update(changed)


def device_index(env: dict[str, str]) -> int:
    """The CUDA index of this worker's GPU: its local rank where it sees its node's GPUs."""
    return int(env["LOCAL_RANK"]) if "CUDA_VISIBLE_DEVICES" in env else 0


def keep_group(backend: str) -> None:
    """A cell (or a script) that forms or ends the default process group finds the warm group's:
    ``init_process_group`` with a backend that fits is a no-op, one that does not says so in one
    line; ``destroy_process_group()`` of the default group leaves it up for the next cell."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    real_init, real_destroy = c10d.init_process_group, c10d.destroy_process_group
    if getattr(real_init, "_gpugeek", False):
        return

    def init_process_group(backend_asked=None, *args, **kwargs):
        if not dist.is_initialized():
            return real_init(backend_asked, *args, **kwargs)
        asked = str(backend_asked or kwargs.get("backend") or "").lower()
        if asked and asked != "undefined" and backend not in asked:
            raise GpugeekError(
                f"init_process_group({asked!r}): this worker group runs {backend} "
                f"({'its GPUs' if backend == 'nccl' else 'no GPU here'}) — "
                f"ask for {backend!r}, or leave the backend out")
        return None

    def destroy_process_group(group=None):
        if group is None or group is c10d.GroupMember.WORLD:
            return None           # the warm group's: kept for the next cell
        return real_destroy(group)

    init_process_group._gpugeek = True
    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group


def run_script(body, namespace: dict, argv: tuple[str, ...], script_dir: str | None = None) -> None:
    """A ``torchrun``-style script in the worker's namespace, as ``python train.py ARGS`` would run
    it: ``sys.argv`` its own while it runs, and its own folder first on ``sys.path`` (so the
    modules beside it import). The modules it imported from that folder are forgotten after, as
    a process that ends forgets them: the next run reads them afresh, edits included. Its
    ``sys.exit`` is the worker's to judge, as a cell's is: 0 or None an ordinary end (argparse's
    ``--help`` too), any other code a failure."""
    import sys

    saved = sys.argv
    sys.argv = list(argv)
    namespace["__file__"] = argv[0]
    if script_dir:
        sys.path.insert(0, script_dir)
    try:
        exec(body, namespace)
    finally:
        sys.argv = saved
        if script_dir:
            if script_dir in sys.path:
                sys.path.remove(script_dir)
            _forget_modules_in(script_dir)


def _forget_modules_in(folder: str) -> None:
    import sys

    inside = os.path.join(os.path.abspath(folder), "")
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and os.path.abspath(where).startswith(inside):
            del sys.modules[name]
