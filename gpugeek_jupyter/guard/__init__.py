"""What guards a cluster's money and stops it, without a kernel: the stop protocol
(``lifecycle``), the watchdog (``watchdog``), the same watch on a remote head (``headwatch``),
and the board the Jupyter server and the terminal read and stop clusters through (``board``).

Runs on: the watchdog, the Jupyter server, the ``gpugeek`` terminal command (and a kernel's stop);
a remote head, ``headwatch`` from the part of the package ``remote/headguard.py`` ships there.
May import: `backends/`, `remote/`, `cluster/`, `meter/`, `clouds/`, the ground floor — never `kernel/`.
"""
