"""jupyter_server's own test fixtures (``jp_fetch``, an in-process server), for this folder only.

They come from pytest-jupyter and bring an asyncio loop into every test they touch, so they are
not loaded for the rest of the suite; the browser tests run as a separate pytest command.
"""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"gpugeek_jupyter": True}}}
