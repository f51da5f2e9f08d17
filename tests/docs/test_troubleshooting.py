"""The troubleshooting page (``troubleshooting/``) lists every message of ours, each with what to do.

A message is what a ``GpugeekError`` (or one of its kinds), a magic's ``UsageError`` or a keeper's
answer is built with, written at the call or followed to where its text is built
(``docs/_ext/errors.py``). A call whose message cannot be followed, or that is listed without a
what-to-do (` — ` and a few words after it), fails here unless ``errors.EXCEPTIONS`` names it with
the reason; an exception that matches no call any more fails too.

Run by ``make docs`` after the build, against ``site/`` and the package's sources.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import errors  # noqa: E402

PAGE = ROOT / "site" / "troubleshooting" / "index.html"

# a module of the package as someone might write it: one message of each kind the check must see
SYNTHETIC = {
    "gpugeek_jupyter/errors.py": "class GpugeekError(Exception):\n    pass\n",
    "gpugeek_jupyter/catalog/made.py": '''
from ..errors import GpugeekError


class Refused(GpugeekError):
    pass


NO_TABLE = "the table is missing — add a [table] section"


def _unknown(name):
    return f"no offer named {name!r} — `%gpugeek offers` lists them"


def bare(x):
    raise GpugeekError(f"{x} must be a number")                        # no what-to-do


def told(x):
    raise Refused(f"{x} is not allowed — give another one")           # a kind of ours, with one


def constant():
    raise GpugeekError(NO_TABLE)                                      # a module constant


def helper(name):
    raise GpugeekError(_unknown(name))                                # a helper's f-string


def built(n):
    message = f"{n} workers do not fit"                               # built, then raised: no to-do
    raise GpugeekError(message)


def elsewhere(answer):
    raise GpugeekError(answer["error"])                               # another program's words


def again(x):
    try:
        bare(x)
    except GpugeekError as exc:
        raise GpugeekError(str(exc)) from None                        # said again: listed at bare()
''',
}


def test_the_check_follows_messages_not_written_at_the_call():
    package = errors.Package(SYNTHETIC)
    said = {site.line: (site.how, site.texts) for site in package.sites()}
    assert said[17] == ("literal", ["‹x› must be a number"])
    assert said[21] == ("literal", ["‹x› is not allowed — give another one"])
    assert said[25] == ("followed", ["the table is missing — add a [table] section"])
    assert said[29] == ("followed", ["no offer named ‹name› — `%gpugeek offers` lists them"])
    assert said[34] == ("followed", ["‹n› workers do not fit"])
    assert said[38] == ("not followed", [])
    assert said[45][0] == "re-said"


def test_the_check_sees_a_message_without_what_to_do_and_one_it_cannot_follow():
    package = errors.Package(SYNTHETIC)
    found = errors.problems(package)
    assert any(":17: no what-to-do" in p and "‹x› must be a number" in p for p in found), found
    assert any(":34: no what-to-do" in p and "workers do not fit" in p for p in found), found
    assert any(":38: its message (answer['error']) cannot be followed" in p for p in found), found
    assert len(found) == 3, found          # the constant, the helper, the kind and the re-said one pass


def test_the_check_sees_a_message_missing_from_the_page():
    package = errors.Package(SYNTHETIC)
    page = "‹x› is not allowed — give another one. the table is missing — add a [table] section"
    found = errors.problems(package, listed=page)
    assert not any(":21:" in p for p in found), found
    assert any(":29: not on the page: no offer named" in p for p in found), found
    assert not any(":25: not on the page" in p for p in found), found


def test_an_exception_is_kept_only_while_its_call_is_there(monkeypatch):
    package = errors.Package(SYNTHETIC)
    monkeypatch.setitem(errors.EXCEPTIONS, ("gpugeek_jupyter/catalog/made.py", "answer['error']"),
                        "a host's own words")
    assert not any(":38:" in p for p in errors.problems(package))
    monkeypatch.setitem(errors.EXCEPTIONS, ("gpugeek_jupyter/catalog/made.py", "answer['gone']"), "stale")
    assert any("matches no call any more: answer['gone']" in p for p in errors.problems(package))


def test_what_to_do_is_a_few_words_after_the_dash():
    assert errors.says_what_to_do("no offer — `%gpugeek offers` lists them")
    assert not errors.says_what_to_do("no offer — ‹hint›")
    assert not errors.says_what_to_do("no offer (give --offer ID)")
    assert not errors.says_what_to_do("the line — ")


@pytest.fixture(scope="module")
def page() -> str:
    if not PAGE.exists():
        pytest.fail(f"no {PAGE.relative_to(ROOT)}: run `make docs` (this test checks the built page)")
    return html.unescape(re.sub(r"<[^>]+>", "", PAGE.read_text()))


def test_every_message_of_ours_is_on_the_page_with_what_to_do(page):
    found = errors.problems(errors.Package.read(), listed=page)
    assert not found, "\n".join(found)


def test_every_exception_says_why():
    for (module, source), reason in errors.EXCEPTIONS.items():
        assert (ROOT / module).exists(), module
        assert len(reason.split()) >= 4, (module, source, reason)


def test_the_list_shows_no_insides_of_the_link_to_a_cluster():
    """What a user reads: no type names of the messages between the kernel and a cluster's head."""
    listed = [text for found in errors.by_step().values() for text, _ in found]
    inside = re.compile(r"\bhello\b|\bline protocol\b|\banswered\s+with\b|\bframe\b", re.I)
    shown = [t for t in listed if inside.search(errors.HOLE.sub("‹…›", t))]
    assert not shown, shown
    assert inside.search(errors.HOLE.sub("‹…›", "the keeper answered hello with ‹type(answer).__name__›"))


def test_the_page_says_where_the_logs_are(page):
    for words in ("Where the logs are", "~/.gpugeek/logs/ray.log", "/tmp/gg-", "~/.gpugeek/launch/",
                  "job-JOBID.log", "keeper.log", "%gpugeek doctor", "What to send in a bug report"):
        assert words in page, words
