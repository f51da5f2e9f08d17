"""How a message of the line is declared and crosses it (``messages`` holds the messages): a
frozen dataclass built by keyword, registered by name; a request names the one type of its reply;
a record (a dataclass of plain data, registered) crosses inside a message as a dict that names it.
What crosses is a pickle of builtins alone, read back by an unpickler that refuses every class."""

from __future__ import annotations

import enum
import io
import pickle
from dataclasses import dataclass, fields, is_dataclass

MESSAGES: dict[str, type] = {}
RECORDS: dict[str, type] = {}
REPLIES: dict[type, type] = {}      # each request's reply

# What crosses the line inside a message: builtins alone, nested as deep as they go.
Plain = str | int | float | bool | bytes | None | list["Plain"] | tuple["Plain", ...] | dict[str, "Plain"] \
    | dict[int, "Plain"]


class ProtocolError(Exception):
    """What came over the line is no message of this protocol."""


def message(cls):
    """A message type: a frozen dataclass built by keyword, known by its name on both ends."""
    cls = dataclass(frozen=True, kw_only=True)(cls)
    MESSAGES[cls.__name__] = cls
    return cls


def request(reply: type):
    """A request type, and the one type of reply it gets (besides ``Failed``)."""
    def declare(cls):
        cls = message(cls)
        REPLIES[cls] = reply
        return cls
    return declare


def record(cls):
    """A dataclass of plain data that a message may carry as a field typed ``Record``: it crosses
    as a dict with its name and is made again from it (a string enum crosses as its value)."""
    RECORDS[cls.__name__] = cls
    return cls


class Record:
    """The type of a message field that holds a registered record (``record``)."""


def _flat(value):
    """A field's value as builtins: a record as a dict naming it."""
    if is_dataclass(value) and type(value).__name__ in RECORDS:
        return {"record": type(value).__name__,
                "fields": {f.name: v.value if isinstance(v := getattr(value, f.name), enum.Enum) else v
                           for f in fields(value)}}
    return value


def _made(cls, name: str, value):
    """A ``Record`` field made again from its dict; one line for what is no record of ours."""
    if not isinstance(value, dict) or set(value) != {"record", "fields"} or value["record"] not in RECORDS:
        raise ProtocolError(f"{cls.__name__}.{name} holds no record of this protocol")
    try:
        return RECORDS[value["record"]](**value["fields"])
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}.{name}: {exc}") from None


def encode(number: int, msg) -> bytes:
    """The message as it crosses the line: a pickle of builtins alone."""
    body = {f.name: _flat(getattr(msg, f.name)) for f in fields(msg)}
    return pickle.dumps({"id": number, "type": type(msg).__name__, "fields": body}, protocol=5)


class _Builtins(pickle.Unpickler):
    """Reads builtins only: any class a pickle names is refused, ours and everyone's."""

    def find_class(self, module: str, name: str):
        raise ProtocolError(f"a message may hold plain data only, not {module}.{name}")


def decode(data: bytes) -> tuple[int, object]:
    """(the request id, the message) from what came over the line."""
    try:
        raw = _Builtins(io.BytesIO(data)).load()
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything unreadable is a broken message
        raise ProtocolError(f"an unreadable message ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("fields"), dict) or not isinstance(raw.get("id"), int):
        raise ProtocolError("a message is a dict of id, type and fields")
    cls = MESSAGES.get(raw.get("type"))
    if cls is None:
        raise ProtocolError(f"no message {raw.get('type')!r} in this protocol")
    known = {f.name: f.type for f in fields(cls)}
    if set(raw["fields"]) - set(known):
        raise ProtocolError(f"{cls.__name__} has no field {sorted(set(raw['fields']) - set(known))[0]!r}")
    given = {name: _made(cls, name, value) if known[name] == "Record" else value
             for name, value in raw["fields"].items()}
    try:
        return raw["id"], cls(**given)
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None


def reply_fits(req, reply) -> bool:
    """Whether ``reply`` is of the type ``req``'s declaration names (``Failed`` aside)."""
    wanted = REPLIES.get(type(req))
    return wanted is not None and isinstance(reply, wanted)
