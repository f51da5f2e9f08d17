"""The line itself, without a cluster: a real keeper's ``Server`` on the loopback with a handler of
the test's own, and a kernel's ``Line`` — the token proven both ways, versions told, plain data
only, requests answered in any order, and a line that breaks dialled again."""

from __future__ import annotations

import pickle
import re
import socket
import threading
import time
from dataclasses import fields

import pytest
from cluster_processes import wait_until

from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.line import messages as m
from gpugeek_jupyter.line.wire import MAGIC, NONCE, Line, LinkDown, Server, TokenRefused, refusal

TOKEN = "the-clusters-token"


def hello(protocol: int = m.PROTOCOL) -> m.Hello:
    return m.Hello(protocol=protocol, package="0.1.0", python="3.12.1", ray="2.60.0", kernel="laptop:1")


@pytest.fixture
def keeper():
    """A server whose handler answers ``Room`` with its ``each`` after ``kind`` seconds, says a
    line first, fails ``NodeAnswers`` as the user's mistake, and answers ``LeadState`` with a reply
    that request does not declare."""
    seen: list = []

    def handle(request, caller):
        seen.append(request)
        if isinstance(request, m.NodeAnswers):
            raise GpugeekError(f"no node {request.node_id}")
        if isinstance(request, m.Room):
            caller.say("looking…\n")
            time.sleep(float(request.kind))     # the request's own length: what the test times
            return m.RoomFor(workers=int(request.each))
        if isinstance(request, m.LeadState):
            return m.Done()
        return m.Groups(groups={})

    def welcome(said: m.Hello):
        return refusal(said, "0.1.0", "3.11.2") or m.Welcome(protocol=m.PROTOCOL, package="0.1.0", python="3.11.2",
                                                             ray="2.60.0", torch=None, pid=1, head="h")

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
    assert line.call(m.Room(kind="0", each=3.0), 10, said=said.append).workers == 3
    assert said == ["looking…\n"]
    assert line.welcome.python == "3.11.2" and line.dialled == 1


def test_requests_are_answered_in_any_order_on_one_connection(keeper):
    """A long read of a cell's journal and the stop button share the line."""
    server, _ = keeper
    line = Line(dialler(server), TOKEN, hello())
    answers = {}
    slow = threading.Thread(target=lambda: answers.update(slow=line.call(m.Room(kind="1.5", each=1.0), 10).workers))
    slow.start()
    time.sleep(0.2)      # the slow request on its way first
    began = time.monotonic()
    answers["quick"] = line.call(m.Room(kind="0", each=2.0), 10).workers
    quick = time.monotonic() - began
    slow.join()
    assert answers == {"slow": 1, "quick": 2} and quick < 1.0, (answers, quick)


def test_a_mistake_on_the_keepers_side_is_one_line_here(keeper):
    server, _ = keeper
    with pytest.raises(GpugeekError, match="no node abc"):
        Line(dialler(server), TOKEN, hello()).call(m.NodeAnswers(node_id="abc"), 10)


def test_another_protocol_is_refused_in_one_line_naming_both(keeper):
    server, _ = keeper
    with pytest.raises(GpugeekError) as refused:
        Line(dialler(server), TOKEN, hello(protocol=m.PROTOCOL + 1)).open()
    said = str(refused.value)
    assert f"link version {m.PROTOCOL} there, {m.PROTOCOL + 1} here" in said and "Python 3.11.2" in said


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
        m.decode(pickle.dumps({"id": 1, "type": "CellNews", "fields": {"number": 1, "news": {"x": Fraction(1, 3)}}}))
    with pytest.raises(m.ProtocolError, match="no message"):
        m.decode(pickle.dumps({"id": 1, "type": "RunCode", "fields": {}}))
    with pytest.raises(m.ProtocolError, match="has no field"):
        m.decode(pickle.dumps({"id": 1, "type": "Done", "fields": {"code": b""}}))
    news = m.CellNews(number=3, news={"t": b"\0", "x": [1.5, None], "ranks": {0: ("a", 2)}})
    assert m.decode(m.encode(7, news)) == (7, news)


def test_run_options_keep_their_shape_across_the_line_and_nothing_else_passes_for_them():
    """``RunOptions`` crosses as a record (a dict naming it) and is made again on the other end;
    a plain dict, or a record this protocol does not know, is refused in one line."""
    from gpugeek_jupyter.vocab import Amp
    from gpugeek_jupyter.workers.options import RunOptions

    options = RunOptions(workers=3, amp=Amp.BF16, argv=("train.py", "--epochs", "2"), grad_ckpt="Block")
    cell = m.RunCell(uid="u", group_id="g", source="1", options=options, pull=["x"], job={"id": "j"})
    _, back = m.decode(m.encode(1, cell))
    assert back == cell and type(back.options) is RunOptions and back.options.amp == "bf16", back
    raw = pickle.loads(m.encode(1, cell))
    assert raw["fields"]["options"]["record"] == "RunOptions", "a record crosses as builtins, naming itself"
    for wrong in ({"workers": 3}, {"record": "Code", "fields": {}}):
        raw["fields"]["options"] = wrong
        with pytest.raises(m.ProtocolError, match=r"RunCell\.options holds no record of this protocol"):
            m.decode(pickle.dumps(raw))


def test_messages_are_built_by_keyword_and_typed_field_by_field():
    """No message is built positionally, and no field is typed ``Any``, a bare ``dict`` or ``list``,
    or ``dict[str, Any]``: each says what it holds (``Plain``: builtins only)."""
    with pytest.raises(TypeError):
        m.Room("0", 1.0)
    loose = [f"{cls.__name__}.{f.name}: {f.type}" for cls in m.MESSAGES.values() for f in fields(cls)
             if "Any" in f.type or re.fullmatch(r"(dict|list|tuple)( \| None)?", f.type)]
    assert not loose, loose


def test_every_request_has_one_declared_reply_and_the_keeper_answers_with_it():
    """Each request declares the type of its reply; the keeper's handler for it (``Desk``) says it
    returns that type."""
    import inspect

    from gpugeek_jupyter.keeper.desk import Desk

    requests = [cls for cls in m.MESSAGES.values() if cls in m.REPLIES]
    assert len(requests) == 21, [cls.__name__ for cls in requests]
    for cls in requests:
        handler = getattr(Desk, re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower())
        said = inspect.signature(handler).return_annotation
        declared = m.REPLIES[cls]
        names = {t.__name__ for t in getattr(declared, "__args__", (declared,))}
        assert {n.strip().removeprefix("m.") for n in said.split("|")} == names, (cls.__name__, said, names)


def test_a_reply_of_a_type_the_request_does_not_declare_is_one_line_never_taken_for_an_answer(keeper):
    server, seen = keeper
    line = Line(dialler(server), TOKEN, hello())
    with pytest.raises(GpugeekError, match=r"^the cluster's keeper answered wrongly — "):
        line.call(m.LeadState(group_id="g"), 10)
    assert any("LeadState answered Done, which it does not declare" in str(s) for s in seen), seen


def test_a_line_that_broke_is_dialled_again_and_a_silent_one_is_given_up_on_in_time(keeper):
    server, _ = keeper
    line = Line(dialler(server), TOKEN, hello())
    line.call(m.Room(kind="0", each=1.0), 10)
    line._sock.shutdown(socket.SHUT_RDWR)       # the other end goes away under it
    wait_until(lambda: not line.up, 5, "the line to see itself broken")
    assert line.call(m.Room(kind="0", each=2.0), 10).workers == 2 and line.dialled == 2
    began = time.monotonic()
    with pytest.raises(LinkDown, match="no answer from the keeper within 1 s"):
        line.call(m.Room(kind="3", each=1.0), 1)           # an answer that comes too late: the line is dropped
    assert time.monotonic() - began < 2.5 and not line.up
    with pytest.raises(LinkDown, match="does not answer"):
        Line(lambda: socket.create_connection(("127.0.0.1", 1), timeout=1), TOKEN, hello()).call(m.ListGroups(), 5)


def _closing_listener(read: int):
    """A listener that closes each connection after reading ``read`` bytes: 0, as an SSH tunnel whose
    far end has nothing listening (it accepts here, then closes before a word)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                if read:
                    conn.sendall(MAGIC + b"\1" * NONCE)
                    conn.recv(read, socket.MSG_WAITALL)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_line_closed_before_a_word_is_no_keeper_there_not_a_refused_token():
    listener = _closing_listener(read=0)
    try:
        with pytest.raises(LinkDown) as down:
            Line(lambda: socket.create_connection(listener.getsockname(), timeout=5), TOKEN, hello()).open()
    finally:
        listener.close()
    assert not isinstance(down.value, TokenRefused) and "token" not in str(down.value), down.value
    assert "nothing answered behind the line" in str(down.value)


def test_a_line_closed_on_the_kernels_proof_is_a_refused_token(keeper):
    """The keeper reads the kernel's proof and closes without an answer: said as the token, at once."""
    server, _ = keeper
    with pytest.raises(TokenRefused, match="this kernel's token is not the cluster's"):
        Line(dialler(server), "another-token", hello()).open()
    listener = _closing_listener(read=64)     # one that opens like a keeper and closes on the proof
    try:
        with pytest.raises(TokenRefused):
            Line(lambda: socket.create_connection(listener.getsockname(), timeout=5), TOKEN, hello()).open()
    finally:
        listener.close()
