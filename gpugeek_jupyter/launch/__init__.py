"""launch: how a worker becomes one rank of a job, as ``torchrun`` would launch it — the process
group formed across hosts (``rendezvous``), the variables every framework reads (``torchrun``),
and the frameworks that read them reporting through ``gg`` (``frameworks``).

Runs on: every Ray worker (and the doctor's probes); the kernel computes the variables.
May import: the ground floor.
"""
