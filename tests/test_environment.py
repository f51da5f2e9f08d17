"""The kernel's packages on remote workers (``kernel/environment.py``): which modules a cell
needs, how the kernel has each, the job's ``runtime_env`` they make, and ``up --env`` files.
The lab test (``tests/lab/test_ssh_cluster.py``) runs them on three hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter import versions
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.kernel import environment


def installed(folder: Path, name: str, version: str, compiled: bool = False) -> Path:
    """A package as pip leaves it: its folder and a ``.dist-info`` that lists its files."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    files = [f"{name}/__init__.py"]
    if compiled:
        (folder / name / "_speedups.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
        files.append(f"{name}/_speedups.cpython-311-x86_64-linux-gnu.so")
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]))
    return folder


def test_a_cells_imports_are_its_absolute_top_level_modules():
    source = "import a.b, c as d\nfrom e.f import g\nfrom . import h\nfrom .i import j\ndef k():\n    import l\n"
    assert environment.imports(source) == {"a", "c", "e", "l"}
    assert environment.imports("x = 1") == frozenset()
    assert environment.imports("import (") == frozenset(), "a syntax error is the worker's to report"


def test_pushed_values_bring_their_modules():
    from collections import OrderedDict

    assert environment.pushed_modules({"a": OrderedDict(), "b": Path("."), "n": 3}) == {"collections", "pathlib",
                                                                                        "builtins"}


def test_the_standard_library_and_what_is_not_there_are_not_looked_up():
    assert versions.locate("json") is None and versions.locate("sys") is None
    assert versions.locate("no_such_module_here") is None


def test_an_installed_package_is_its_distribution_and_version(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(installed(tmp_path, "pkg_pure", "1.3")))
    monkeypatch.syspath_prepend(str(installed(tmp_path, "pkg_fast", "2.0", compiled=True)))
    pure, fast = versions.locate("pkg_pure"), versions.locate("pkg_fast")
    assert (pure.dist, pure.version, pure.compiled) == ("pkg_pure", "1.3", False)
    assert Path(pure.dist_info).name == "pkg_pure-1.3.dist-info" and Path(pure.path) == tmp_path / "pkg_pure"
    assert (fast.dist, fast.version, fast.compiled) == ("pkg_fast", "2.0", True)

    env = environment.runtime_env(["einops==0.8.0"], [pure, fast])
    package = str(Path(gg.__file__).resolve().parent)
    assert env["py_modules"] == [package, pure.path, pure.dist_info], "the package and its metadata travel"
    assert env["pip"] == ["einops==0.8.0", "pkg_fast==2.0"], "a compiled package is installed at our version"
    assert environment.runtime_env([], [], package=False) == {}
    # hosts whose runtime came from a mirror (`--pip-index-url`) install a job's packages from it too
    mirrored = environment.runtime_env(["einops==0.8.0"], package=False, index_url="http://10.0.0.1:8080/simple")
    assert mirrored["pip"]["packages"] == ["einops==0.8.0"]
    assert mirrored["pip"]["pip_install_options"][:2] == ["--index-url", "http://10.0.0.1:8080/simple"]
    from ray._private.runtime_env.validation import parse_and_validate_pip

    assert parse_and_validate_pip(mirrored["pip"])["pip_install_options"][1] == "http://10.0.0.1:8080/simple"


def test_a_local_module_is_versioned_by_its_files(tmp_path, monkeypatch):
    (tmp_path / "mymodel.py").write_text("WIDTH = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = versions.locate("mymodel")
    assert first.dist is None and first.version.startswith("local:") and first.path == str(tmp_path / "mymodel.py")
    (tmp_path / "mymodel.py").write_text("WIDTH = 16\n")
    assert versions.locate("mymodel").version != first.version, "an edit here is not seen"
    assert environment.runtime_env([], [first], package=False)["py_modules"] == [first.path]


def test_a_local_module_with_compiled_parts_cannot_travel(tmp_path, monkeypatch):
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "__init__.py").write_text("")
    (tmp_path / "native" / "core.so").write_bytes(b"\x7fELF")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = versions.locate("native")
    assert module.compiled and module.dist is None
    with pytest.raises(GpugeekError, match="has compiled parts and is not installed from a package"):
        environment.runtime_env([], [module])


def test_a_package_whose_version_needs_a_newer_python_than_the_hosts_is_never_sent(tmp_path, monkeypatch, capsys):
    """pandas 3 needs Python 3.11: to hosts on 3.10 it would go as a pip install that fails
    there, and the group with it. Found before: the hosts' own version serves (said in one line,
    once), and where they have none the cell is refused in one line naming both Pythons."""
    installed(tmp_path, "frames", "3.1.1", compiled=True)
    metadata = next(tmp_path.glob("frames-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text() + "Requires-Python: >=3.11\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def hosts(theirs):
        return lambda names: [{n: {"frames": theirs, versions.PYTHON: "3.10.13"}.get(n) for n in names}] * 2

    shipment = environment.shipment().for_cluster(-3)
    try:
        assert environment.needed(-3, {"frames"}, hosts("2.3.3")) == []
        said = capsys.readouterr().out
        assert said == ("note: this kernel's frames 3.1.1 needs Python >=3.11 and the hosts run Python 3.10.13, so "
                        "it cannot go there: the cells use the hosts' own frames 2.3.3\n"), said
        assert environment.needed(-3, {"frames"}, hosts("2.3.3")) == [] and capsys.readouterr().out == "", "said twice"
        shipment.for_cluster(None)
        with pytest.raises(environment.CannotGo) as refused:
            environment.needed(-3, {"frames"}, hosts(None))
        assert str(refused.value).startswith("this kernel's frames 3.1.1 needs Python >=3.11, and the hosts run "
                                             "Python 3.10.13 without frames — install a frames for Python 3.10.13")
        assert "\n" not in str(refused.value)
        newer = lambda names: [{n: {versions.PYTHON: "3.12.1"}.get(n) for n in names}]  # noqa: E731
        assert [m.name for m in environment.needed(-3, {"frames"}, newer)] == ["frames"], "hosts it installs on"
    finally:
        shipment.for_cluster(None)


def test_a_scripts_modules_beside_it_are_found_through_the_modules_it_imports(tmp_path):
    (tmp_path / "train.py").write_text("import checkpoint\nfrom model import Tiny\nimport torch, json\n")
    (tmp_path / "checkpoint.py").write_text("import storage\n")
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "__init__.py").write_text("from .disk import x\n")
    (tmp_path / "storage" / "disk.py").write_text("import formats\nx = 1\n")
    (tmp_path / "formats.py").write_text("")
    (tmp_path / "model.py").write_text("")
    (tmp_path / "unused.py").write_text("")
    found = environment.beside(str(tmp_path), (tmp_path / "train.py").read_text())
    assert found == {"checkpoint", "model", "storage", "formats"}


def test_modules_are_asked_of_the_workers_once_and_again_after_an_edit(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    asked = []

    def nowhere(names):
        asked.append(names)
        return [{n: None for n in names}, {n: None for n in names}]

    shipment = environment.shipment().for_cluster(-1)
    try:
        first = environment.needed(-1, {"helper", "json", "torch"}, nowhere)
        assert [m.name for m in first] == ["helper"] and asked == [["helper", versions.PYTHON]]
        assert environment.needed(-1, {"helper"}, nowhere) == [] and len(asked) == 1, "asked again for nothing new"
        (tmp_path / "helper.py").write_text("A = 2\n")
        assert [m.name for m in environment.needed(-1, {"helper"}, nowhere)] == ["helper"], "an edit not sent"
        (tmp_path / "helper.py").write_text("A = 3\n")
        same = lambda names: [{n: versions.version_of(n) for n in names}]  # noqa: E731
        assert environment.needed(-1, {"helper"}, same) == [], "a worker with the same files was sent them again"
    finally:
        shipment.for_cluster(None)


def test_env_files_give_pip_requirements_or_one_line(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# training\neinops==0.8.0  # shapes\n\n--extra-index-url https://example.invalid/simple\nrich\n")
    assert environment.read_env_file(str(requirements)) == [
        "einops==0.8.0", "--extra-index-url https://example.invalid/simple", "rich"]
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["einops>=0.8", "rich"]\n')
    assert environment.read_env_file(str(pyproject)) == ["einops>=0.8", "rich"]

    for body, file, said in [(None, "missing.txt", "no such file"),
                             ("[project]\nname = 'x'\n", "bare.toml", "no \\[project\\] dependencies"),
                             ("[project\n", "broken.toml", "not valid TOML"),
                             ("-e ./mypkg\n", "editable.txt", "names a path on this machine")]:
        path = tmp_path / file
        if body is not None:
            path.write_text(body)
        with pytest.raises(GpugeekError, match=said) as error:
            environment.read_env_file(str(path))
        assert "\n" not in str(error.value)


def test_up_env_with_a_missing_file_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    from gpugeek_jupyter.cluster import registry

    monkeypatch.setenv("GPUGEEK_HOME", str(tmp_path))
    with pytest.raises(GpugeekError, match=r"--env nope\.txt: no such file"):
        gg.up("envless", backend="sim", env="nope.txt")
    assert registry.latest("envless") is None, "a cluster was recorded for a bad --env"


def test_a_working_dir_goes_to_the_job_without_what_never_should_or_is_one_line(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.csv").write_bytes(b"1" * 3000)
    (project / ".venv" / "lib").mkdir(parents=True)
    (project / ".venv" / "lib" / "big.so").write_bytes(b"\0" * 50_000)       # never sent, never counted
    folder = environment.working_dir(str(project))
    assert folder == str(project.resolve())
    env = environment.runtime_env(folder=folder, package=False)
    assert env["working_dir"] == folder and ".venv" in env["excludes"] and ".git" in env["excludes"]

    monkeypatch.setattr(environment, "WORKING_DIR_MAX_MIB", 2000 / 2**20)     # 2,000 bytes
    with pytest.raises(GpugeekError) as failed:
        environment.working_dir(str(project))
    assert str(failed.value).startswith(f"--working-dir {project} holds 0 MiB to send, over the ")
    with pytest.raises(GpugeekError, match="no such folder here"):
        environment.working_dir(str(tmp_path / "nowhere"))


def test_a_version_check_that_fails_refuses_the_cell_in_one_line(tmp_path, monkeypatch):
    """Run on, the cell could run the workers' own versions of the user's modules (someone
    else's code): a check that cannot be made refuses the cell, saying so."""
    from gpugeek_jupyter.cells import shipping
    from gpugeek_jupyter.kernel.session import Connection, current

    (tmp_path / "helper.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Group:
        def versions(self, names):
            raise ConnectionError("rank 1 did not answer")

    class Record:
        id = -2

    monkeypatch.setattr(current(), "connection", Connection("ray://127.0.0.1:1", tmp_path / "db", -2, kind="client"))
    try:
        with pytest.raises(GpugeekError) as refused:
            shipping.bring_modules(Record(), Group(), "import helper\nprint(helper.A)", None, None)
        said = str(refused.value)
        assert "\n" not in said and "helper" in said and "rank 1 did not answer" in said
        assert "the cell was not run" in said
    finally:
        environment.shipment().for_cluster(None)


def test_rays_exceptions_reach_the_user_in_words_never_by_their_names():
    """What a group that could not start says: Ray's exceptions by what they mean, with the last
    line Ray gave (pip's own there); a worker's own error as it is."""
    import ray.exceptions as rays

    from gpugeek_jupyter.group.results import RAY_IN_WORDS, in_words

    timed_out = in_words(rays.GetTimeoutError("Get timed out: some object(s) not ready."))
    assert timed_out.startswith("its workers did not answer in time") and "Get timed out" not in timed_out
    pip = in_words(rays.RuntimeEnvSetupError("Failed to set up runtime environment.\n"
                                             "ERROR: No matching distribution found for pandas==3.1.1"))
    assert pip == ("the workers' Python environment could not be made on the hosts: ERROR: No matching "
                   "distribution found for pandas==3.1.1")
    for said in (timed_out, pip, in_words(rays.RayActorError()), in_words(rays.ActorDiedError())):
        assert not any(name in said for name in RAY_IN_WORDS), said
    assert in_words(ConnectionError("rank 1 cannot reach rank 0")) == "ConnectionError: rank 1 cannot reach rank 0"
