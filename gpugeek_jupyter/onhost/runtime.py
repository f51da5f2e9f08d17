"""The Python that runs Ray on a host: found, or made, on the host itself. Sent over SSH and run by
whatever ``python3`` the host has (``python3 - check ORDER``), like ``script.py``.

    check ORDER     where the host stands: ready (the Python to use), or what making the runtime
                    needs (the host's own Python, an installer), or one line saying why it cannot
                    be made; installs nothing, in well under a second
    install ORDER   makes the runtime, then answers as ``check`` does

ORDER (JSON) names what the kernel runs: ``ray`` and ``torch`` versions (its Python ``minor``
version too, said but not asked for: the kernel reaches the cluster over its keeper's line, which
carries source text and data, so the hosts' Python need not be the kernel's), and the user's
choices: ``python`` (an existing environment, used as it is), ``install`` (false: never install),
``index_url`` (a mirror of PyPI), ``root`` (where runtimes live, ``~/.gpugeek/runtime``),
``uv`` (where the laptop put its uv, when the host had none) and ``uv_packed`` (the laptop's uv,
gzipped, shipped beside this script with Ray's file mounts to nodes the laptop cannot ask first: a
cloud's, started by Ray's launcher; unpacked where the node is the same OS and architecture).

The runtime is a venv of its own, ``ROOT/ray-<version>``, made from the host's own Python (3.10 or
newer: the keeper and the workers run this package's code), so a Ray of the user's on the host is
never touched, nor can it break ours. Into it go ``ray[default]`` at the kernel's version and
numpy; torch is the host's own when the host's Python has it at the kernel's major.minor (its
site-packages are added after the venv's own), else the build that fits the host: the CUDA build
with an NVIDIA driver, the CPU build without. ``uv`` makes it when there is one, else ``venv`` and
pip. A ``runtime.json`` written last says the runtime is whole, and for which Python; a second
``check`` reads it and installs nothing.

Standard library only, and Python 3.8+: it runs on whatever Python a host has.
"""

import fcntl
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OLDEST = (3, 10)            # the package's own: what the keeper and the workers run on
INSTALL_TIMEOUT_S = 1200
UV_UNPACKED = "~/.gpugeek/bin/uv"     # where a packed uv is unpacked (where the ssh path puts it too)
PROBE = ("import json, site, sys\n"
         "try:\n    from importlib import metadata\nexcept ImportError:\n    metadata = None\n"
         "def version(name):\n"
         "    try:\n        return metadata.version(name)\n"
         "    except Exception:\n        return None\n"
         "print(json.dumps({'minor': '%d.%d' % sys.version_info[:2], 'executable': sys.executable,\n"
         "    'ray': version('ray'), 'torch': version('torch'), 'site': site.getsitepackages()}))\n")


def main(argv):
    command, order = argv[0], json.loads(argv[1])
    os.umask(0o077)         # the runtime is the host user's alone, as the rest of ~/.gpugeek
    try:
        answer = install(order) if command == "install" else check(order)
        answer["interfaces"] = _interfaces()     # what `up` asks next: which address the others reach
    except Failure as exc:
        answer = {"ok": False, "error": str(exc)}
    print(json.dumps(answer))
    return 0 if answer.get("ok") else 1


class Failure(Exception):
    """One line for the user: what is wrong on this host, and what to do."""


def check(order):
    if order.get("python"):
        return _given(order)
    folder = _folder(order)
    made = _made(folder)
    if _serves(made, order):
        return {"ok": True, "ready": True, "python": made["python"], "made": made}
    adds = sorted(set(order.get("extra") or []) - set(made["for"].get("extra", []))) \
        if _serves(made, dict(order, extra=[])) else None
    if adds and not order.get("install", True):
        raise Failure(f"the runtime in {_tilde(folder)} lacks {', '.join(adds)}, and --no-install says not to "
                      f"install it — leave out --no-install, or install it there")
    base = _base(order)
    if not order.get("install", True):
        raise Failure(f"no Ray {order['ray']} runtime here, and --no-install says not to "
                      f"install it — leave out --no-install to make it in {_tilde(folder)}, or give --python "
                      f"PATH of an environment that has it")
    return {"ok": True, "ready": False, "adds": adds, "base": base["executable"], "uv": _uv(order),
            "arch": platform.machine(), "system": platform.system(), "torch": _torch_plan(order, base)[0],
            "folder": _tilde(folder)}


def install(order):
    answer = check(order)
    if answer.get("ready"):
        return answer
    folder = _folder(order)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # two `up`s on one host: the second waits, then finds it made
        answer = check(order)
        if answer.get("ready"):
            return answer
        began = time.monotonic()
        made = _made(folder)
        if _serves(made, dict(order, extra=[])):      # only packages to add (``up --storage``)
            return _add(folder, made, order, began)
        base = _base(order)
        torch_said, torch_spec = _torch_plan(order, base)
        shutil.rmtree(folder, ignore_errors=True)        # a runtime.json missing: a make cut short
        uv = _uv(order, unpack=True)
        python = os.path.join(folder, "bin", "python")
        if uv:
            _run([uv, "venv", "-q", "--python", base["executable"], folder], order, "uv venv")
            pip = [uv, "pip", "install", "-q", "--python", python]
        else:
            _run([base["executable"], "-m", "venv", folder], order, "python -m venv")
            pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if torch_spec is None:     # the host's own torch: its site-packages after the venv's own
            with open(os.path.join(_site_of(python), "_gpugeek_host_site.pth"), "w") as f:
                f.write("\n".join(base["site"]) + "\n")
        else:
            _run(pip + _index(order, pip, torch=True) + [torch_spec], order, "installing " + torch_spec)
        packages = ["ray[default]==" + order["ray"], "numpy", *(order.get("extra") or [])]
        _run(pip + _index(order, pip) + packages, order, "installing Ray " + order["ray"])
        got = _probe(python)
        if got["ray"] != order["ray"] or not got["torch"] or _mm(got["torch"]) != _mm(order["torch"]):
            raise Failure(f"the runtime made in {_tilde(folder)} has Ray {got['ray']} and torch {got['torch']}, "
                          f"not Ray {order['ray']} and torch {order['torch']}")
        made = {"for": _wanted(order), "python": python, "torch": got["torch"], "torch_from": torch_said,
                "how": "uv" if uv else "pip", "seconds": round(time.monotonic() - began, 1)}
        with open(os.path.join(folder, "runtime.json"), "w") as f:
            json.dump(made, f)
    return {"ok": True, "ready": True, "python": python, "made": made, "installed": True}


def _serves(made, order):
    """Whether a runtime made earlier runs what ORDER asks: its Ray and torch, and at least its
    extra packages (a runtime with s3fs serves a cluster that needs none)."""
    if made is None:
        return False
    wanted, had = _wanted(order), made.get("for", {})
    return (had.get("ray"), had.get("torch")) == (wanted["ray"], wanted["torch"]) and \
        set(wanted["extra"]) <= set(had.get("extra", []))


def _add(folder, made, order, began):
    """The extra packages ORDER names, added to a runtime that has the rest."""
    uv, python = _uv(order, unpack=True), made["python"]
    pip = [uv, "pip", "install", "-q", "--python", python] if uv else \
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(pip + _index(order, pip) + list(order["extra"]), order, "installing " + ", ".join(order["extra"]))
    made = dict(made, seconds=round(time.monotonic() - began, 1))
    made["for"] = dict(made["for"], extra=sorted({*made["for"].get("extra", []), *order["extra"]}))
    with open(os.path.join(folder, "runtime.json"), "w") as f:
        json.dump(made, f)
    return {"ok": True, "ready": True, "python": python, "made": made, "installed": True}


def _given(order):
    """``--python PATH``: an environment used as it is, if it can run the kernel's cluster."""
    path = os.path.expanduser(order["python"])
    if not os.access(path, os.X_OK):
        raise Failure(f"--python {order['python']}: no such program on the host")
    got = _probe(path)
    if _too_old(got["minor"]):
        raise Failure(f"--python {order['python']} is Python {got['minor']}; the cluster's keeper needs "
                      f"{'.'.join(map(str, OLDEST))} or newer — give another, or leave out --python to have a "
                      f"runtime made")
    if got["ray"] != order["ray"]:
        has = f"Ray {got['ray']}" if got["ray"] else "no Ray"
        raise Failure(f"--python {order['python']} has {has}; the kernel has Ray {order['ray']} (this machine's "
                      f"watchdog reads the cluster's node table with it) — pip install 'ray[default]=={order['ray']}' "
                      f"there, or leave out --python to have a runtime made")
    return {"ok": True, "ready": True, "python": path, "made": {"given": True, "torch": got["torch"]}}


def _base(order):
    """The host's own Python to make the runtime from: its ``python3`` (or another of 3.10 or
    newer), preferring one whose torch fits the kernel's."""
    seen, found, old = set(), [], []
    names = ["python3", "python", "/usr/bin/python3", "/usr/local/bin/python3", "/opt/conda/bin/python",
             *(f"python3.{minor}" for minor in range(14, OLDEST[1] - 1, -1))]
    for name in names:
        path = shutil.which(name)
        if not path or os.path.abspath(path) in seen:   # a venv's python links to its base: not the same
            continue
        seen.add(os.path.abspath(path))
        try:
            got = _probe(path)
        except Failure:
            continue
        got["executable"] = path
        (old if _too_old(got["minor"]) else found).append(got)
    if not found:
        have = ", ".join(f"{o['executable']} is {o['minor']}" for o in old) or "no Python at all"
        raise Failure(f"no Python {'.'.join(map(str, OLDEST))} or newer on the host ({have}) — install one there "
                      f"(any of 3.10 to 3.13), or give --python PATH")
    fits = [f for f in found if f["torch"] and _mm(f["torch"]) == _mm(order["torch"])]
    return (fits or found)[0]


def _too_old(minor):
    return tuple(int(x) for x in minor.split(".")[:2]) < OLDEST


def _torch_plan(order, base):
    """(what to say, the pip spec to install — None when the host's own torch is used)."""
    if base["torch"] and _mm(base["torch"]) == _mm(order["torch"]):
        return f"the host's own {base['torch']}", None
    kind = "CUDA" if _has_driver() else "CPU"
    return f"{kind} build of {_mm(order['torch'])}.*", f"torch=={_mm(order['torch'])}.*"


def _index(order, installer, torch=False):
    """The index flags; pip (not uv) ignores a plain-http mirror unless told to trust its host."""
    if order.get("index_url"):
        url = order["index_url"]
        trust = ["--trusted-host", url.split("://", 1)[1].split("/", 1)[0].split(":")[0]] \
            if url.startswith("http://") and installer[1:3] == ["-m", "pip"] else []
        return ["--index-url", url, *trust]
    if torch and not _has_driver():      # PyPI's Linux torch is the CUDA build: gigabytes for nothing
        return ["--index-url", TORCH_CPU_INDEX]
    return []


def _has_driver():
    return os.path.exists("/proc/driver/nvidia/version")


def _uv(order, unpack=False):
    """The uv to make the runtime with, if any: the host's, or the laptop's where it sent one (or
    did before). A packed copy (``uv_packed``) is only named by ``check``, unpacked by ``install``."""
    for path in (order.get("uv"), shutil.which("uv"), os.path.expanduser("~/.local/bin/uv"), UV_UNPACKED):
        if path and os.access(os.path.expanduser(path), os.X_OK):
            return os.path.expanduser(path)
    packed = order.get("uv_packed")
    if not packed or packed.get("system") != platform.system() or packed.get("arch") != platform.machine():
        return None        # none sent, or built for another kind of machine (an ARM node of an x86 laptop)
    return _unpacked(packed["path"]) if unpack else os.path.expanduser(UV_UNPACKED)


def _unpacked(source):
    """The laptop's uv, from its gzipped copy at ``source``; None where the copy is missing or
    broken (the runtime is then made with pip), with nothing half-written left."""
    target = os.path.expanduser(UV_UNPACKED)
    part = f"{target}.{os.getpid()}.part"
    try:
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        with gzip.open(os.path.expanduser(source), "rb") as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(part, 0o755)
        os.replace(part, target)
    except (OSError, EOFError):
        if os.path.exists(part):
            os.remove(part)
        return None
    return target


def _run(cmd, order, what):
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_PROGRESS="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Failure(f"{what} took over {INSTALL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        where = " from " + order["index_url"] if order.get("index_url") else ""
        hint = " — check --pip-index-url" if order.get("index_url") else \
            " — can the host reach PyPI? (--pip-index-url names a mirror)"
        raise Failure(f"{what}{where} failed: {_worst(lines)}{hint}")


def _worst(lines):
    """The line of a failed install that says why (pip and uv put it last or after 'error:')."""
    for line in lines:
        if line.lower().startswith(("error:", "caused by:")):
            return line[:300]
    return (lines[-1] if lines else "no output")[:300]


def _interfaces():
    """IPv4 address → interface name, from ``ip -o -4 addr`` (as ``script.py``'s ``facts``: each
    script is sent alone, so each has its copy)."""
    try:
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                              timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {parts[3].split("/")[0]: parts[1] for parts in (line.split() for line in text.splitlines())
            if len(parts) >= 4}


def _probe(python):
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        raise Failure(f"{python} does not run") from None


def _site_of(python):
    return _probe(python)["site"][0]


def _made(folder):
    try:
        with open(os.path.join(folder, "runtime.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _wanted(order):
    return {"ray": order["ray"], "torch": _mm(order["torch"]), "extra": sorted(order.get("extra") or [])}


def _folder(order):
    root = os.path.expanduser(order.get("root") or "~/.gpugeek/runtime")
    return os.path.join(root, f"ray-{order['ray']}")


def _tilde(path):
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path.startswith(home + "/") else path


def _mm(version):
    return ".".join(version.split("+")[0].split(".")[:2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
