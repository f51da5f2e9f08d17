"""Why a run of Ray's CLI failed, in the words of whoever said it: read from that run's part of its
log, one line, with what to do where the reason is a known one.

What Ray's CLI writes when its output is not a terminal (``ray/autoscaler/_private/cli_logger.py``):
each message a record, ``2026-01-01 12:00:00,000\\tPANIC commands.py:308 -- <red text>`` —
``cli_logger.abort(msg)`` is PANIC (then click's ``Error: <msg>``, its ``{}`` left unfilled where the
message had arguments; an ``abort()`` without one says ``Error: Exiting due to cli_logger.abort()``),
``cli_logger.error`` is ERR, Python's logging ERROR. An exception nobody catches ends the run in a
Python traceback. What the launcher runs on a node adds its own words: ssh's, and ours
(``onhost``: a JSON line ``{"ok": false, "error": …}``); kubectl's are ``error: …``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

LIMIT = 300      # characters of the reason, at most

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?P<level>[A-Z]+) \S+:\d+ -- (?P<said>.*)$")
TRACEBACK = "Traceback (most recent call last):"
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*|:)?$")     # the line a traceback ends in
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
CLICK = re.compile(r"^Error: (?P<said>.+)$")
SSH = re.compile(r"^(?:ssh: .+|(?:\S+: )?Permission denied \(.+\)\.?|Host key verification failed\.|"
                 r"kex_exchange_identification: .+|ssh_exchange_identification: .+|"
                 r"Connection (?:closed|reset|timed out) by .+)$")
KUBECTL = re.compile(r"^(?:error: .+|Error from server(?: \(\w+\))?: .+|The connection to the server .+ was refused.*|"
                     r"Unable to connect to the server: .+)$")
# what says only that something failed, not why (Ray's updater's banners, click's wrappers, placeholders)
GENERIC = re.compile(r"^(?:!!!.*|New status: update-failed|Exiting due to cli_logger\.abort\(\)|Failed to setup head "
                     r"node\.|(?:click\.exceptions\.ClickException: )?(?:Setup|Start) command failed\.|SSH command "
                     r"failed\..*|(?:click\.exceptions\.ClickException: )?Command failed:.*|Full traceback:.*|"
                     r"Error message: .*|.*\{\}.*)$")
RANKS = {"node": 6, "panic": 5, "traceback": 4, "errors": 3, "tool": 2, "click": 1, "generic": 0}

# a reason known, and what to do about it ({names} filled in from the reason's match)
FIXES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"no default AMI is available for the region `(?P<region>[^`]+)`"),
     'name your machine image in config.toml, [cluster.images] aws = {{"{region}" = "ami-…"}} (an Ubuntu '
     "with NVIDIA's driver), or pick an offer in another region"),
    (re.compile(r"NoCredentialsError|Unable to locate credentials|PartialCredentialsError"),
     "run `aws configure` (or set AWS_PROFILE), then `gpugeek check aws`"),
    (re.compile(r"ProfileNotFound|The config profile \(.*\) could not be found"),
     "AWS_PROFILE names a profile ~/.aws does not have — set it to one `aws configure list-profiles` lists, "
     "then `gpugeek check aws`"),
    (re.compile(r"TokenRetrievalError|SSOTokenLoadError|UnauthorizedSSOTokenError"),
     "your AWS SSO login has expired — run `aws sso login`, then `gpugeek check aws`"),
    (re.compile(r"DefaultCredentialsError"),
     "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), then `gpugeek check gcp`"),
    (re.compile(r"CredentialUnavailableError|DefaultAzureCredential failed|ClientAuthenticationError"),
     "run `az login`, then `gpugeek check azure`"),
    (re.compile(r"Permission denied \(publickey"),
     "the machine did not take the SSH key Ray's launcher logs in with — on your own machines, give yours "
     "with --ssh-key (`gpugeek check onprem --hosts … --ssh-key …` tries it)"),
)


def reason(text: str) -> str | None:
    """The reason a failed run of Ray's CLI gave in ``text`` (its part of the log), one line of at
    most ``LIMIT`` characters; None where it said none we can read. Ours from a node first, then
    Ray's ``abort``, the exception that ended the run, Ray's last error records, ssh's or kubectl's
    error line, click's ``Error:``; a banner that says only that something failed, last of all."""
    found = _Reader([ANSI.sub("", line).rstrip() for line in text.splitlines()]).found
    if not found:
        return None
    words = max(found)[2]
    return words if len(words) <= LIMIT else words[:LIMIT - 1].rstrip() + "…"


class _Reader:
    """One pass over a run's lines: each reason said, ranked (``RANKS``), with where it was said."""

    def __init__(self, lines: list[str]):
        self.found: list[tuple[int, int, str]] = []      # (rank, where, words)
        self.record: tuple[str, int, list[str]] | None = None    # the record being read: level, where, lines
        self.burst: list[str] = []                       # Ray's error records in a row
        self.ssh_answered = any((m := RECORD.match(line)) and m["level"] == "SUCC" for line in lines)
        in_traceback = False
        for where, line in enumerate(lines):
            if line.endswith(TRACEBACK):
                self.close()
                in_traceback = True
            elif in_traceback and (not line or line[0].isspace() or line.startswith(CHAINED)):
                continue
            elif in_traceback and EXCEPTION.match(line):
                in_traceback = False
                self.add("traceback", where, line)
            else:
                in_traceback = False
                self.read(where, line)
        self.close()

    def read(self, where: int, line: str) -> None:
        if (m := RECORD.match(line)) is not None:
            self.close()
            if m["level"] not in ("ERR", "ERROR"):
                self.burst = []
            self.record = (m["level"], where, [m["said"].strip()])
        elif line.startswith("{") and (error := _node_error(line)):
            self.close()
            self.add("node", where, error)
        elif (m := CLICK.match(line)) is not None:
            self.close()
            self.add("click", where, m["said"])
        elif SSH.match(line) or KUBECTL.match(line):
            self.close()
            if not (self.ssh_answered and SSH.match(line)):    # an early try's, before SSH answered
                self.add("tool", where, line)
        elif not line:
            self.close()         # a message of several lines ends at a blank one
        elif self.record is not None and not line[0].isspace() and len(self.record[2]) < 8:
            self.record[2].append(line.strip())     # a message of several lines (not the quoted context)

    def close(self) -> None:
        """The record being read is whole: Ray's abort, or one more of its error records in a row."""
        if self.record is not None:
            level, where, said = self.record
            if level == "PANIC":
                self.add("panic", where, _joined(said))
            elif level in ("ERR", "ERROR"):
                self.burst.append(_joined([part for part in said if not GENERIC.match(part)]).rstrip(":"))
                self.add("errors", where, ": ".join(part for part in self.burst if part))
            self.record = None

    def add(self, kind: str, where: int, words: str) -> None:
        words = " ".join(words.split())
        if words:
            self.found.append((RANKS["generic"] if GENERIC.match(words) else RANKS[kind], where, words))


def _joined(lines: list[str]) -> str:
    """A message's lines as one: a line that ends in no stop gets a semicolon."""
    out = ""
    for line in filter(None, lines):
        out += ("" if not out else " " if out[-1] in ".:;!?" else "; ") + line
    return out


def _node_error(line: str) -> str | None:
    """The words of an answer of ours from a node that failed (``{"ok": false, "error": …}``)."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("ok") is False and isinstance(answer.get("error"), str):
        return answer["error"]
    return None


def fix(said: str) -> str | None:
    """What to do about a known reason; None for one we know nothing to do about."""
    for pattern, what in FIXES:
        if (m := pattern.search(said)) is not None:
            return what.format(**m.groupdict())
    return None


def failure(command: str, text: str, log: Path, returncode: int) -> str:
    """One line for a failed run of ``command``: its reason and what to do, or where its log is."""
    said = reason(text)
    if said is None:
        return f"{command} failed (exit {returncode}) — see {log}"
    what = fix(said)
    if what is None:
        return f"{command} failed: {said} — the whole log is at {log}"
    return f"{command} failed: {said} — {what} (Ray's log: {log})"
