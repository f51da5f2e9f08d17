"""What the kernel asks of a cluster: ``up``, ``down``/``scale``/``limits``/``preempt``
(``actions``), ``status`` and the node types an offer makes (``nodetypes``).

Runs on: a notebook's kernel (the API and the magics).
May import: `kernel/`, `guard/`, `backends/`, `remote/`, `cluster/`, `catalog/`, `meter/`, the ground floor.
"""
