"""Which torch ``make lab`` installs (``tests/torch_choice.py``): the CPU build where this machine
has no NVIDIA GPU and a CPU build can be had (the wheels pip is configured with, PyTorch's CPU
index), else the public index's, said in one line with where it comes from."""

from __future__ import annotations

import http.server
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch_choice

TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"
NOWHERE = "http://127.0.0.1:9"       # the discard port: nothing answers there


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch_choice, "has_gpu", lambda: False)
    monkeypatch.setattr(torch_choice.sys, "platform", "linux")


def _wheels(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")      # only the names are read
    return folder


def test_a_cpu_build_in_the_configured_wheels_is_taken_for_this_python(tmp_path):
    wanted = torch_choice.requirement()
    newest_allowed = wanted.split("<")[1] if "<" in wanted else "99"
    major, minor = (int(n) for n in newest_allowed.split(".")[:2])
    folder = _wheels(tmp_path / "wheels",
                     f"torch-{major}.{minor - 1}.0+cpu-{TAG}-{TAG}-manylinux_2_28_x86_64.whl",
                     f"torch-{major}.{minor - 2}.0+cpu-{TAG}-{TAG}-manylinux_2_28_x86_64.whl",
                     f"torch-{major}.{minor}.0+cpu-{TAG}-{TAG}-manylinux_2_28_x86_64.whl",    # past the bound
                     f"torch-{major}.{minor - 1}.1+cpu-cp39-cp39-manylinux_2_28_x86_64.whl",  # another Python
                     f"torch-{major}.{minor - 1}.1-{TAG}-{TAG}-manylinux_2_28_x86_64.whl")    # not a CPU build
    words, said = torch_choice.choose("", NOWHERE, ["--find-links", str(folder)])
    assert words == [f"torch=={major}.{minor - 1}.0+cpu"], words
    assert said == f"the CPU build, from {folder} (no NVIDIA GPU here)"


def test_pytorchs_cpu_index_where_it_answers(tmp_path):
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        words, said = torch_choice.choose("", index, [])
    finally:
        server.shutdown()
        server.server_close()
    assert words == [torch_choice.requirement(), "--torch-backend", "cpu"], words
    assert f"the CPU build, from PyTorch's CPU index {index}" in said


def test_the_public_index_alone_gets_its_own_build_and_the_line_says_which(tmp_path):
    words, said = torch_choice.choose("", NOWHERE, [])
    assert words == [torch_choice.requirement()]
    assert said.startswith("from PyPI — on Linux PyPI's build is the CUDA one")
    assert "make lab TORCH_SPEC=" in said and "\n" not in said


def test_a_gpu_macos_and_your_spec(monkeypatch):
    assert torch_choice.choose("torch==2.5.1", NOWHERE, [])[0] == ["torch==2.5.1"]
    monkeypatch.setattr(torch_choice.sys, "platform", "darwin")
    assert "macOS build" in torch_choice.choose("", NOWHERE, [])[1]
    monkeypatch.setattr(torch_choice, "has_gpu", lambda: True)
    words, said = torch_choice.choose("", NOWHERE, ["--index-url", "https://mirror.example/simple"])
    assert words == [torch_choice.requirement()] and "for your NVIDIA GPU, from https://mirror.example/simple" in said


def test_the_words_are_shell_quoted_for_make(tmp_path):
    """What make's recipe evals: the requirement's ``<`` stays a word, not a redirection."""
    done = subprocess.run([sys.executable, str(Path(torch_choice.__file__)), "--cpu-index", NOWHERE],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert shlex.split(done.stdout) in ([torch_choice.requirement()], [torch_choice.requirement(), "--torch-backend",
                                                                       "cpu"]), done.stdout
    assert done.stderr.startswith("torch: ") and done.stderr.count("\n") == 1, done.stderr
