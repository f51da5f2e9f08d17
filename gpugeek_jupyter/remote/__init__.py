"""How this machine reaches remote hosts: SSH (``ssh``), each host made ready to run Ray
(``runtime``), the cluster's SSH tunnel to its head (``tunnel``), and this machine's side of the
head's own watchdog (``headguard``).

Runs on: the laptop (a kernel, its watchdog, the Jupyter server).
May import: `cluster/`, `meter/`, the ground floor.
"""
