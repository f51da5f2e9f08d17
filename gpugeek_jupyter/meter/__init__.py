"""meter: what a cluster has cost, from stored node and job events (the ledger's arithmetic), and
a rented cluster's instances as its provider bills them (``instances``).

Runs on: every process of ours (kernel, watchdogs, Jupyter server, terminal); ``telemetry``'s
sampler on every node.
May import: the ground floor, `clouds/` (the shape of an instance).
"""
