"""group: the warm worker group, driven from the process that is a Ray driver of the cluster — a
notebook's kernel on a local, sim or attached cluster, or a remote cluster's keeper on its head.
Both run this same code; what differs between them is how they reach the cluster (``link``: a
kernel's connection can be stopped elsewhere and, for a Ray Client, go down under a cell; the
keeper's is the head's own), so nothing here reads a kernel's session.

``workergroup`` builds the group in a placement group (``placement``), sends it cells (``sending``:
to rank 0, which leads) and shows what comes back (``results``); ``driver`` asks the cluster the
rest (its groups, their kept jobs, a node's death, the room left); ``orphans`` tends the groups
whose kernel is gone.

Runs on: a notebook's kernel and a remote cluster's keeper (a Ray worker loads none of it: what
runs there is `workers/`).
May import: `workers/`, `launch/`, `meter/`, `cluster/`, the ground floor.
"""
