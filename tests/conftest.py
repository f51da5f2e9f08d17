from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def gpugeek_home(tmp_path, monkeypatch):
    """Every test gets its own state directory, so none reads or writes ~/.gpugeek."""
    home = tmp_path / "gpugeek-home"
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def ipython():
    """A real IPython shell with the extension loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "gpugeek_jupyter")
    return shell
