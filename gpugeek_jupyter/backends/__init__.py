"""How machines appear and disappear, one module a kind: ``local`` (``ray start --head`` here),
``sim`` (Ray's fake multi-node autoscaler), ``hosts`` (the user's machines over SSH), ``launcher``
(Ray's cluster launcher for aws, gcp and azure), ``kuberay``; ``interface`` is the one interface
over them that ``up``, ``scale`` and the stop protocol call.

Runs on: the laptop (``up`` and ``scale`` in a kernel; a stop in any process); a head's watchdog
uses the launcher's settings.
May import: `remote/`, `cluster/`, `meter/`, the ground floor.
"""
