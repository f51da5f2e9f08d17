"""What runs on a cluster's hosts: ``script.py`` (sent over SSH to a host's ``python -`` or copied
by the cluster launcher; it starts, lists and stops Ray there) and the head's watchdog
(``headwatch``, from the part of this package ``remote/headguard.py`` ships to the head).

Runs on: a remote host; ``script.py`` with the standard library alone (tests/test_layers.py checks).
May import: `guard/`, `backends/`, `remote/`, `cluster/`, `meter/`, the ground floor.
"""
