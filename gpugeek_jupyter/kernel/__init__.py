"""The kernel's own state and its link to the cluster: the one per-kernel object (``session``),
the connection (``connection``: a Ray driver's, or the line to a remote cluster's keeper) and the
kernel's packages on remote workers (``environment``).

Runs on: a notebook's kernel (never the watchdog, the server, a keeper or a worker).
May import: `backends/`, `group/` (the stop it raises under a cell), `remote/`, `cluster/`, `meter/`, `sizing/`,
`line/`, the ground floor.
"""
