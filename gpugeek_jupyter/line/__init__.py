"""The line: how a kernel reaches a remote cluster's keeper (``keeper/``), through the cluster's
SSH tunnel. Typed messages of plain data (``messages``, declared and encoded by ``codec``), each
request with the one type of its reply, over one authenticated TCP connection
(``wire``): the cluster's token proves both ends, a protocol version opens every conversation, and
only source text and data cross it — never code objects — so the kernel's Python and Ray are free
of the hosts'.

Runs on: a notebook's kernel and a remote cluster's head alike, with any supported Python: the
standard library alone.
May import: `errors.py`.
"""
