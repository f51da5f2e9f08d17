"""cells: ``%%gpugeek run`` from the kernel's side, a notebook cell as a job on the active
cluster's warm worker group. ``jobs`` tells a job's story (its ledger row, its group, the retries
after a lost worker or a preemption); ``group`` builds the group in a placement group
(``placement``), sends it cells (``sending``: to rank 0 alone, or to every rank) and shows what
comes back (``results``); ``away`` rides out a link that went down; ``attach`` follows any job
the cluster keeps; ``orphans`` tends the groups whose kernel is gone; ``watch`` keeps the job
monitor from ever breaking a job. A remote cluster's groups are its keeper's (``keeper/``): the
kernel holds a ``linegroup`` for each and asks the rest over the line (``driving``); ``shipping`` sends
the kernel's modules a remote cell imports; ``fetching`` brings back what a job wrote there; ``pushing``
sends pushed variables as data any Python loads.

Runs on: a notebook's kernel, and a remote cluster's keeper (the groups it holds); a Ray worker
loads none of it (what runs there is `workers/`).
May import: `workers/`, `provision/`, `kernel/`, `backends/` (what one can do), `remote/`, `cluster/`,
`launch/`, `meter/`, `line/`, the ground floor.
"""
