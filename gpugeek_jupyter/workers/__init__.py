"""run: notebook cells as distributed PyTorch jobs on a warm Ray worker group.

Runs on: a kernel (``group``, ``jobs``, ``sending``) and every Ray worker (``worker``, ``helper``,
``progress``, ``line``, ``notice``, ``oom``, ``cell``, ``device``).
May import: `provision/`, `kernel/`, `backends/` (what one can do), `remote/`, `cluster/`, `launch/`, `meter/`,
the ground floor.
"""
