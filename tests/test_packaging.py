"""The wheel: built with no node on PATH, it carries the prebuilt JupyterLab extension and the
server extension's switch; installed, Jupyter lists both as enabled."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DATA = "gpugeek_jupyter-0.1.0.data/data/"


@pytest.fixture(scope="module")
def no_node_env(tmp_path_factory) -> dict:
    """PATH with only this venv's scripts: no node, no npm."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent)
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, no_node_env) -> Path:
    if not (ROOT / "gpugeek_jupyter/labextension/static/style.js").exists():
        pytest.fail("the JupyterLab extension is not built: `make test` (or `make labextension`) builds it")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], env=no_node_env, check=True, timeout=300)
    (built,) = out.glob("gpugeek_jupyter-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_carries_both_extensions(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    lab = DATA + "share/jupyter/labextensions/gpugeek-jupyter/"
    assert {lab + "package.json", lab + "install.json", lab + "static/style.js",
            lab + "schemas/gpugeek-jupyter/plugin.json"} <= names
    assert any(re.fullmatch(re.escape(lab) + r"static/remoteEntry\.[0-9a-f]+\.js", n) for n in names)
    assert DATA + "etc/jupyter/jupyter_server_config.d/gpugeek_jupyter.json" in names
    assert "gpugeek_jupyter/server/handlers.py" in names
    assert "gpugeek_jupyter/catalog/data/gpu_offers.csv" in names
    assert "gpugeek_jupyter/server/prometheus-rules.yml" in names     # the shipped alert rules
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "gpugeek = gpugeek_jupyter.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not any(n.startswith("gpugeek_jupyter/labextension/") for n in names)  # only once, as data
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)


@pytest.mark.slow
def test_the_installed_wheel_is_listed_enabled_by_jupyter(wheel, tmp_path, no_node_env):
    prefix = tmp_path / "prefix"   # --ignore-installed: leave this venv's own install alone
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q",
                    "--prefix", str(prefix), str(wheel)], env=no_node_env, check=True, timeout=300)
    env = {**no_node_env, "JUPYTER_PATH": str(prefix / "share/jupyter"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    jupyter = str(Path(sys.executable).parent / "jupyter")
    lab = subprocess.run([jupyter, "labextension", "list"], env=env, capture_output=True, text=True,
                         timeout=120)
    listing = lab.stdout + lab.stderr
    section = listing.split(str(prefix / "share/jupyter/labextensions"), 1)
    assert len(section) == 2, listing
    assert re.search(r"gpugeek-jupyter v0\.1\.0 \S*enabled\S* \S*OK", section[1].split("\n\n")[0]), listing
    # the switch, read from the installed prefix alone the way jupyter_server reads a config dir
    # (its `server extension list` ignores JUPYTER_CONFIG_PATH and would show the venv's own copy)
    from jupyter_server.config_manager import BaseJSONConfigManager

    config = BaseJSONConfigManager(config_dir=str(prefix / "etc/jupyter")).get("jupyter_server_config")
    assert config == {"ServerApp": {"jpserver_extensions": {"gpugeek_jupyter": True}}}
