"""TCP ports, one set of helpers for every process: a free port to listen on, whether a port is
free, whether something answers at one (and why not). Standard library only, with no import of
this package: the doctor ships it to the nodes by value, beside ``launch/rendezvous.py``.
(``onhost/script.py`` keeps standard-library copies of its own: it runs before anything of ours
is on a host.)
"""

from __future__ import annotations

import socket

ANSWER_TIMEOUT_S = 1.0      # one try at opening a connection


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now ("" for every interface)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different ports nothing listens on at ``host`` now. Each socket is held until all
    are bound: ``free_port`` asked twice may get the port it just let go, twice."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def is_free(port: int, host: str = "127.0.0.1", reuse: bool = False) -> bool:
    """Whether ``port`` can be listened on at ``host``; ``reuse``: by a listener that reuses the
    address, as ssh's forwards do (the connections of one just killed linger in TIME-WAIT)."""
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def why_closed(host: str, port: int, timeout: float = ANSWER_TIMEOUT_S) -> str | None:
    """None if a TCP connection to host:port opens within ``timeout``, else why not, in words."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)


def answers(host: str, port: int, timeout: float = ANSWER_TIMEOUT_S) -> bool:
    """Whether a TCP connection to host:port opens within ``timeout``."""
    return why_closed(host, port, timeout) is None

