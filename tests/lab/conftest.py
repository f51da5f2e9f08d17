"""The multi-host lab (``tests/netlab.py``) for one test session: made once, torn down at the end,
and nothing of it may be left — no namespace, no link, no process."""

from __future__ import annotations

import netlab
import pytest


@pytest.fixture(scope="session")
def lab():
    with netlab.fixture(3) as made:
        yield made
