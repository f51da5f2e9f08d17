"""How machines appear and disappear, one module a kind, each defining its ``Backend`` class:
``local`` (``ray start --head`` here), ``sim`` (Ray's fake multi-node autoscaler), ``hosts`` (the
user's machines over SSH: ``ssh``), ``clouds`` (aws, gcp and azure through Ray's cluster
launcher, whose YAML ``launcher`` writes), ``onprem`` (the user's machines through that
launcher), ``kuberay``, ``attach``. ``base`` is what a backend is (its capabilities);
``interface`` is the registry that ``up``, ``scale`` and the stop protocol ask.

Runs on: the laptop (``up`` and ``scale`` in a kernel; a stop in any process); a head's watchdog
uses the launcher's settings.
May import: `remote/`, `cluster/`, `meter/`, `clouds/`, the ground floor.
"""
