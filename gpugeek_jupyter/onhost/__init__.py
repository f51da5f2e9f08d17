"""What runs on a cluster's hosts: ``runtime.py`` (finds or makes the Python that runs Ray there),
``script.py`` (starts, lists and stops Ray there) — each sent over SSH to a host's ``python -`` or
copied by the cluster launcher — and the head's watchdog (``headwatch``, from the part of this
package ``remote/headguard.py`` ships to the head).

Runs on: a remote host; ``runtime.py`` and ``script.py`` with the standard library alone (tests/test_layers.py checks).
May import: `guard/`, `backends/`, `remote/`, `cluster/`, `meter/`, the ground floor.
"""
