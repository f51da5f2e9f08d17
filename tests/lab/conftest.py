"""The multi-host lab (``tests/netlab.py``) for one test session: made once, torn down at the end,
and nothing of it may be left — no namespace, no link, no process."""

from __future__ import annotations

import netlab
import pytest


@pytest.fixture(scope="session")
def lab():
    reason = netlab.why_not()
    if reason:
        pytest.skip(reason)
    made = netlab.up(3)
    try:
        yield made
    finally:
        made.down()
        left = made.leftovers()
        assert not left, f"the lab left {', '.join(left)}"
