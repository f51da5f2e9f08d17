"""What runs on a bare host, before anything of ours is installed there: ``runtime.py`` (finds or
makes the Python that runs Ray there) and ``script.py`` (starts, lists and stops Ray there, and
starts the head's watchdog) — each sent over SSH to a host's ``python -`` or copied by the cluster
launcher. What runs on a head with the package is not here: the head's watchdog is
``guard/headwatch.py``.

Runs on: a remote host, with whatever Python it has: every module here with the standard library
alone (tests/test_layers.py checks).
May import: nothing of the package — the standard library alone.
"""
