"""workers: what runs inside the Ray workers of a warm group, each a ``torch.distributed`` rank
that keeps a namespace between cells. The actor (``worker``) and all it loads there: the cell
compiled (``cell``); the ``gg`` helper (``helper``), which reads the device (``device``) and keeps
``gg``'s own checkpoints (``checkpoints``) and a framework's (``saves``) where ``storage`` says;
what a cell sends home (``progress``) and rank 0's journal of it (``journal``); the cell line
between the ranks (``line``) and a keeper's lead line to rank 0 (``lead``); the values pushed and
pulled (``values``); preemption notices (``notice``); a GPU that ran out of memory
(``oom``). Both sides read ``options`` (the ``RunOptions`` a kernel sends, the ``Report`` a
worker sends back) and judge a cell's ``outcome`` the same way.

Runs on: every Ray worker of a group; the kernel side (`cells/`) reads its types and constants,
and nothing here imports it: a worker loads none of the kernel's state.
May import: `launch/`, `clouds/` (where a notice is read), the ground floor.
"""
