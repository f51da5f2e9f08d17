"""Not importable in the processes we start for Ray on this machine (``processes.lean_env``).

jsonschema imports ``rfc3987_syntax`` when it is installed (Jupyter's own packages install it),
and that module builds some 40 parsers as it loads: about 2 s of CPU in every Python process that
imports Ray (``ray.runtime_env`` loads jsonschema), which is every agent, every worker and the
watchdog. A head then took 25 s to start here instead of 9, and on a busy machine its dashboard
agent could miss the 15 s Ray's raylet gives it. jsonschema treats this module as optional: without
it, only its check of the rarely used ``iri`` string formats is missing.
"""

raise ImportError("rfc3987_syntax is left out of gpugeek's Ray processes (see gpugeek_jupyter/cluster/lean_imports)")
