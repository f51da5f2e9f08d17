"""A host's runtime, decided on the host (``onhost/runtime.py``, run here as a host would run it:
``python3 - check ORDER`` with the script on stdin), and ``up``'s flags for it. Making a runtime
for real, on hosts that share nothing with this machine, is the lab's (tests/lab/test_bring_up.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster.remote import Remote
from gpugeek_jupyter.onhost import runtime as onhost_runtime
from gpugeek_jupyter.remote import runtime

MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"


def on_this_machine(command: str, order: dict, python: str = "/usr/bin/python3") -> tuple[int, dict]:
    done = subprocess.run([python, "-", command, json.dumps(order)], input=runtime.SCRIPT.read_text(),
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def order(tmp_path):
    return {**runtime.order_for(Remote()), "root": str(tmp_path / "runtime")}


def test_a_python_given_is_used_as_it_is_when_it_has_the_kernels_ray(order):
    code, answer = on_this_machine("check", {**order, "python": sys.executable})
    assert code == 0 and answer["ready"] and answer["python"] == sys.executable, answer


def test_a_python_given_of_another_minor_than_the_kernels_is_taken(order):
    """The kernel reaches the cluster over its keeper's line: the hosts' Python is theirs to choose."""
    other = "3.99" if MINOR != "3.99" else "3.98"
    code, answer = on_this_machine("check", {**order, "python": sys.executable, "minor": other})
    assert code == 0 and answer["ready"] and answer["python"] == sys.executable, answer


def test_a_python_too_old_for_the_keeper_is_one_line(order, tmp_path):
    python39 = next(iter(sorted(Path("/root/.pyenv/versions").glob("3.9.*/bin/python"))), None)
    if python39 is None:
        pytest.skip("no Python 3.9 on this machine (pyenv) to give as --python")
    old = tmp_path / "old"
    subprocess.run([str(python39), "-m", "venv", "--without-pip", str(old)], check=True, timeout=60)
    code, answer = on_this_machine("check", {**order, "python": str(old / "bin" / "python")})
    assert code == 1 and answer["error"].startswith(f"--python {old}/bin/python is Python 3.9; the cluster's keeper "
                                                    f"needs 3.10 or newer"), answer


def test_a_python_given_without_ray_is_one_line(order, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    code, answer = on_this_machine("check", {**order, "python": str(bare / "bin" / "python")})
    assert code == 1 and not answer["ok"]
    assert answer["error"] == (f"--python {bare}/bin/python has no Ray; the kernel has Ray {order['ray']} (this "
                               f"machine's watchdog reads the cluster's node table with it) — pip install "
                               f"'ray[default]=={order['ray']}' there, or leave out --python to have a runtime made")
    code, answer = on_this_machine("check", {**order, "python": "/no/such/python"})
    assert answer["error"] == "--python /no/such/python: no such program on the host"


def test_without_a_runtime_check_says_what_making_one_needs_and_installs_nothing(order, tmp_path):
    code, answer = on_this_machine("check", order)
    assert code == 0 and answer["ready"] is False, answer
    assert answer["folder"].endswith(f"runtime/ray-{order['ray']}")
    assert answer["base"] and answer["arch"] and answer["system"] == "Linux"
    assert not (tmp_path / "runtime").exists(), "a check made something"
    code, answer = on_this_machine("check", {**order, "install": False})
    assert code == 1 and answer["error"].startswith(f"no Ray {order['ray']} runtime here, and "
                                                    f"--no-install says not to install it")


def test_a_runtime_marked_whole_is_ready_and_one_cut_short_is_not(order, tmp_path):
    folder = tmp_path / "runtime" / f"ray-{order['ray']}"
    (folder / "bin").mkdir(parents=True)
    code, answer = on_this_machine("check", order)
    assert answer["ready"] is False, "a runtime without its runtime.json was taken for whole"
    made = {"for": {"ray": order["ray"], "torch": ".".join(order["torch"].split("+")[0].split(".")[:2]),
                     "extra": ["pip"]},
            "python": str(folder / "bin" / "python")}
    (folder / "runtime.json").write_text(json.dumps(made))
    code, answer = on_this_machine("check", order)
    assert code == 0 and answer["ready"] and answer["python"] == made["python"], answer
    code, answer = on_this_machine("check", {**order, "ray": "2.59.0"})
    assert answer["ready"] is False, "a runtime made for another Ray was taken"


def test_the_order_is_the_kernels_versions():
    order = runtime.order_for(Remote(pip_index_url="http://mirror/simple", install=False))
    assert (order["ray"], order["torch"], order["minor"]) == (metadata.version("ray"), metadata.version("torch"),
                                                              MINOR)
    assert order["index_url"] == "http://mirror/simple" and order["install"] is False


@pytest.mark.parametrize("flags, said", [
    ({"python": "/opt/py/bin/python"},
     "--python: only for --backend ssh or onprem (your own machines) — drop it, or use that backend"),
    ({"install": False},
     "--no-install: only for --backend ssh or onprem (your own machines) — drop it, or use that backend"),
    ({"backend": "ssh", "hosts": "10.0.0.5", "usd_per_hour": 0, "pip_index_url": "mirror"},
     "--pip-index-url 'mirror' is not a URL — give a package index's, like https://pypi.example.com/simple"),
])
def test_runtime_flags_are_checked_before_anything_starts(gpugeek_home, flags, said):
    with pytest.raises(gg.GpugeekError) as failed:
        gg.up("flags", **flags)
    assert str(failed.value) == said
    assert gg.clusters().empty


def test_a_broken_index_url_in_config_is_one_line(gpugeek_home):
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text('[hosts]\npip_index_url = "mirror"\n')
    with pytest.raises(gg.GpugeekError, match=r"hosts\.pip_index_url must be the URL of a package index"):
        gg.up("cfg", backend="ssh", hosts="10.0.0.5", usd_per_hour=0)


def test_a_runtime_that_lacks_only_an_extra_package_is_added_to_not_made_again(order, tmp_path):
    folder = tmp_path / "runtime" / f"ray-{order['ray']}"
    folder.mkdir(parents=True)
    mm = ".".join(order["torch"].split("+")[0].split(".")[:2])
    (folder / "runtime.json").write_text(json.dumps({"for": {"ray": order["ray"], "torch": mm, "extra": ["pip"]},
                                                     "python": str(folder / "bin" / "python")}))
    code, answer = on_this_machine("check", {**order, "extra": ["s3fs==2026.9.0"]})
    assert answer["ready"] is False and answer["adds"] == ["s3fs==2026.9.0"], answer
    code, answer = on_this_machine("check", {**order, "extra": ["s3fs==2026.9.0"], "install": False})
    assert code == 1 and answer["error"].startswith("the runtime in ") and "lacks s3fs==2026.9.0, and --no-install" \
        in answer["error"], answer
    code, answer = on_this_machine("check", order)
    assert answer["ready"] is True, "a runtime with more than a cluster needs was not taken"


def test_a_node_not_asked_first_takes_the_laptops_uv_where_it_is_the_same_kind_of_machine(
        order, tmp_path, monkeypatch):
    """Ray's launcher starts a cloud's nodes: the laptop's uv travels gzipped with their files
    (``uv_packed``). ``check`` (run as a host runs it) names it on a node of the kind it was built
    for, and unpacks nothing; a node of another kind (an ARM one) makes its runtime with pip.
    ``install`` unpacks it into the place the ssh path uses, and a broken copy leaves nothing."""
    if runtime.uv_for_nodes() is None:
        pytest.skip("no uv in this environment to ship")
    packed = tmp_path / "uv.gz"
    packed.write_bytes(runtime.packed_uv())
    unpacked = tmp_path / ".gpugeek" / "bin" / "uv"

    def check(kind: dict) -> dict:
        done = subprocess.run(["/usr/bin/python3", "-", "check", json.dumps(
            {**order, "uv_packed": {"path": str(packed), **kind}})], input=runtime.SCRIPT.read_text(),
            capture_output=True, text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        return json.loads(done.stdout.strip().splitlines()[-1])

    same = runtime.uv_for_nodes()
    other = {**same, "arch": "aarch64" if same["arch"] != "aarch64" else "x86_64"}
    assert check(other)["uv"] is None
    assert check(same)["uv"] == str(unpacked)
    assert not (tmp_path / ".gpugeek").exists(), "a check unpacked something"

    monkeypatch.setenv("HOME", str(tmp_path))
    assert onhost_runtime._unpacked(str(packed)) == str(unpacked)
    said = subprocess.run([str(unpacked), "--version"], capture_output=True, text=True, timeout=30)
    assert said.returncode == 0 and said.stdout.startswith("uv "), said
    unpacked.unlink()
    packed.write_bytes(b"not gzip")
    assert onhost_runtime._unpacked(str(packed)) is None
    assert list(unpacked.parent.iterdir()) == []
