"""``%gpugeek doctor``: is this cluster fit to train on? Versions against the kernel's (a remote
cluster's: against its head's, and both are shown), the network interface each node talks on,
GPUs, ports, clocks, and all_reduce between every pair of nodes.

``probe`` runs on the nodes, ``nodes`` drives it from a Ray driver (the kernel, or a remote
cluster's keeper, asked over the line), ``checkup`` is the kernel's ``doctor``, ``findings``
judges. (The package is not called ``doctor``: that name is the API function's, ``gg.doctor``.)

Runs on: a kernel (``checkup``, ``findings``, ``nodes``), a keeper (``nodes``); ``probe`` on every
node, shipped by value.
May import: `launch/` (rendezvous), `kernel/`, `cells/` (its driver), `line/`, `cluster/`, the ground floor;
``nodes``, which a keeper loads, only `launch/` and the ground floor.
"""
