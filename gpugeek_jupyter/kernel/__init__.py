"""The kernel's own state and its link to the cluster: the one per-kernel object (``session``),
the Ray connection (``connection``) and the kernel's packages on remote workers (``environment``).

Runs on: a notebook's kernel only (never the watchdog, the server or a worker).
May import: `backends/`, `remote/`, `cluster/`, `meter/`, `sizing/`, the ground floor.
"""
