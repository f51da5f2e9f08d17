"""cells: ``%%gpugeek run`` from the kernel's side, a notebook cell as a job on the active
cluster's warm worker group. ``jobs`` tells a job's story (its ledger row, its group, the retries
after a lost worker or a preemption); the group itself is ``group/``'s ``WorkerGroup``, driven from
this kernel through its connection (``away.KernelLink``: a stop begun elsewhere, and a Ray Client's
link that went down, ridden out); ``attach`` follows any job the cluster keeps; ``leaving`` takes a
kernel's group along when it exits; ``watch`` keeps the job monitor from ever breaking a job. A
remote cluster's groups are its keeper's (``keeper/``): the kernel holds a ``linegroup`` for each
and asks the rest over the line (``driving``); ``shipping`` sends
the kernel's modules a remote cell imports; ``fetching`` brings back what a job wrote there; ``pushing``
sends pushed variables as data any Python loads.

Runs on: a notebook's kernel alone (a remote cluster's keeper runs `group/`; a Ray worker
`workers/`).
May import: `group/`, `workers/`, `provision/`, `kernel/`, `backends/` (what one can do), `remote/`, `cluster/`,
`launch/`, `meter/`, `line/`, the ground floor.
"""
