"""The multi-host lab (``tests/netlab.py``) for one test session: made once, torn down at the end,
and nothing of it may be left — no namespace, no link, no process. Its hosts share nothing with
the laptop: each ``up`` there makes (or finds made) each host's runtime, from the wheel index the
laptop serves on the lab's bridge."""

from __future__ import annotations

import netlab
import pytest


@pytest.fixture(scope="session")
def lab():
    """Three hosts that share nothing with the laptop; h3 is bare (the OS's python3 only); an S3
    server on the bridge, bucket ``lab``, which every host is configured for."""
    with netlab.fixture(3, bare=("h3",), storage=True) as made:
        yield made
