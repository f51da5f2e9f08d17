"""The keeper: a process of ours on a remote cluster's head that owns the cluster's worker groups and
their cells for the kernels that reach it over the line (``line/``). It is an ordinary Ray driver
there, on the head's own Python and Ray; the kernel sends it source text and data, never code, so
the kernel's Python and Ray versions are free of the hosts'. The head's watchdog starts it and
starts it again should it die (``guard/headwatch.py``); the groups it holds are named and detached,
so a keeper that starts again finds them.

``serve`` starts it (Ray, then the line's server); ``desk``
answers each request with the same group code a local kernel runs (``group/``), reaching
each group's rank 0 over a lead line of its own (``rank0``); ``shipped`` keeps what kernels sent
for the workers (their modules, pip requirements, the working folder).

Runs on: a remote cluster's head, started by its watchdog, with the package the laptop sent there.
May import: `group/` (the warm groups and their driver, as a local kernel runs them), `health/` (``nodes``,
the doctor's look), `line/`, `workers/`, `launch/`, `cluster/`, the ground floor — never `kernel/` or `cells/`.
"""
