"""The line itself, without a cluster: a real keeper's ``Server`` on the loopback with a handler of
the test's own, and a kernel's ``Line`` — the token proven both ways, versions told, plain data
only, requests answered in any order, and a line that breaks dialled again."""

from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest
from cluster_processes import wait_until

from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.line import messages as m
from gpugeek_jupyter.line.wire import MAGIC, NONCE, Line, LinkDown, Server, refusal

TOKEN = "the-clusters-token"


def hello(protocol: int = m.PROTOCOL) -> m.Hello:
    return m.Hello(protocol, "0.1.0", "3.12.1", "2.60.0", "laptop:1")


@pytest.fixture
def keeper():
    """A server whose handler answers ``Room`` with its ``each`` after ``kind`` seconds, says a
    line first, and fails ``NodeAnswers`` as the user's mistake."""
    seen: list = []

    def handle(request, caller):
        seen.append(request)
        if isinstance(request, m.NodeAnswers):
            raise GpugeekError(f"no node {request.node_id}")
        if isinstance(request, m.Room):
            caller.say("looking…\n")
            time.sleep(float(request.kind))     # the request's own length: what the test times
            return m.Done(request.each)
        return m.Done(None)

    def welcome(said: m.Hello):
        return refusal(said, "0.1.0", "3.11.2") or m.Welcome(m.PROTOCOL, "0.1.0", "3.11.2", "2.60.0", None, 1, "h")

    server = Server(("127.0.0.1", 0), TOKEN, welcome, handle, log=lambda text: seen.append(text))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, seen
    server.close()


def dialler(server):
    return lambda: socket.create_connection(tuple(server.address), timeout=5)


def test_a_request_crosses_with_what_the_keeper_says_on_the_way(keeper):
    server, _ = keeper
    line = Line(dialler(server), TOKEN, hello())
    said = []
    assert line.call(m.Room("0", 3.0), 10, said=said.append).value == 3.0
    assert said == ["looking…\n"]
    assert line.welcome.python == "3.11.2" and line.dialled == 1


def test_requests_are_answered_in_any_order_on_one_connection(keeper):
    """A long read of a cell's journal and the stop button share the line."""
    server, _ = keeper
    line = Line(dialler(server), TOKEN, hello())
    answers = {}
    slow = threading.Thread(target=lambda: answers.update(slow=line.call(m.Room("1.5", 1.0), 10).value))
    slow.start()
    time.sleep(0.2)      # the slow request on its way first
    began = time.monotonic()
    answers["quick"] = line.call(m.Room("0", 2.0), 10).value
    quick = time.monotonic() - began
    slow.join()
    assert answers == {"slow": 1.0, "quick": 2.0} and quick < 1.0, (answers, quick)


def test_a_mistake_on_the_keepers_side_is_one_line_here(keeper):
    server, _ = keeper
    with pytest.raises(GpugeekError, match="no node abc"):
        Line(dialler(server), TOKEN, hello()).call(m.NodeAnswers("abc"), 10)


def test_another_protocol_is_refused_in_one_line_naming_both(keeper):
    server, _ = keeper
    with pytest.raises(GpugeekError) as refused:
        Line(dialler(server), TOKEN, hello(protocol=m.PROTOCOL + 1)).open()
    said = str(refused.value)
    assert f"protocol {m.PROTOCOL}" in said and f"protocol {m.PROTOCOL + 1}" in said and "Python 3.11.2" in said


def test_a_kernel_without_the_token_gets_no_answer_and_the_keeper_reads_nothing_of_it(keeper):
    server, seen = keeper
    with pytest.raises(LinkDown, match="token"):
        Line(dialler(server), "another-token", hello()).open()
    assert not any(isinstance(s, m.Hello | m.Done | m.Room) for s in seen)
    # a stranger who proves nothing and sends a message anyway: the keeper closes on it unread
    with socket.create_connection(tuple(server.address), timeout=5) as sock:
        opening = sock.recv(len(MAGIC) + NONCE, socket.MSG_WAITALL)
        assert opening.startswith(MAGIC)
        sock.sendall(b"\0" * 64 + pickle.dumps({"id": 1, "type": "Room", "fields": {"kind": "0", "each": 1}}))
        sock.settimeout(5)
        try:
            answer = sock.recv(100)
        except ConnectionResetError:    # closed with the stranger's bytes unread: a reset, no answer
            answer = b""
        assert answer == b"", "the keeper answered a stranger"
    assert not any(isinstance(s, m.Room) for s in seen)


def test_a_keeper_that_is_not_the_clusters_is_told_apart(keeper):
    """A listener that opens like a keeper but cannot prove the token is not taken for it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(MAGIC + b"\1" * NONCE)
            conn.recv(64)
            conn.sendall(b"\2" * 32)
            time.sleep(1)      # holds the connection open while the kernel judges the proof

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(GpugeekError, match="does not hold the cluster's token"):
        Line(lambda: socket.create_connection(listener.getsockname(), timeout=5), TOKEN, hello()).open()
    listener.close()


def test_a_message_may_hold_plain_data_only():
    from fractions import Fraction

    with pytest.raises(m.ProtocolError, match=r"plain data only, not fractions\.Fraction"):
        m.decode(pickle.dumps({"id": 1, "type": "Done", "fields": {"value": Fraction(1, 3)}}))
    with pytest.raises(m.ProtocolError, match="no message"):
        m.decode(pickle.dumps({"id": 1, "type": "RunCode", "fields": {}}))
    with pytest.raises(m.ProtocolError, match="has no field"):
        m.decode(pickle.dumps({"id": 1, "type": "Done", "fields": {"code": b""}}))
    number, done = m.decode(m.encode(7, m.Done({"t": b"\0", "x": [1.5, None]})))
    assert (number, done) == (7, m.Done({"t": b"\0", "x": [1.5, None]}))


def test_a_line_that_broke_is_dialled_again_and_a_silent_one_is_given_up_on_in_time(keeper):
    server, _ = keeper
    line = Line(dialler(server), TOKEN, hello())
    line.call(m.Room("0", 1.0), 10)
    line._sock.shutdown(socket.SHUT_RDWR)       # the other end goes away under it
    wait_until(lambda: not line.up, 5, "the line to see itself broken")
    assert line.call(m.Room("0", 2.0), 10).value == 2.0 and line.dialled == 2
    began = time.monotonic()
    with pytest.raises(LinkDown, match="no answer from the keeper within 1 s"):
        line.call(m.Room("3", 1.0), 1)           # an answer that comes too late: the line is dropped
    assert time.monotonic() - began < 2.5 and not line.up
    with pytest.raises(LinkDown, match="does not answer"):
        Line(lambda: socket.create_connection(("127.0.0.1", 1), timeout=1), TOKEN, hello()).call(m.ListGroups(), 5)
