"""``%gpugeek doctor``: is this cluster fit to train on? Versions against the kernel's, the network
interface each node talks on, GPUs, ports, clocks, and all_reduce between every pair of nodes.

``probe`` runs on the nodes, ``checkup`` drives it from the kernel, ``findings`` judges. (The
package is not called ``doctor``: that name is the API function's, ``gg.doctor``.)

Runs on: a kernel (``checkup``, ``findings``); ``probe`` on every node, shipped by value.
May import: `launch/` (rendezvous), `kernel/`, `cluster/`, the ground floor.
"""
