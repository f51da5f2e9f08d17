"""Drive a real JupyterLab from tests: start an isolated server, run notebooks in headless Chromium.

Server side (the `lab` fixture in conftest.py wraps the first two):
    start_lab(workdir, gpugeek_home=None) -> LabServer   # .base_url .token .root_dir .url() .api()
    stop_lab(server) -> list[str]                         # what was still alive (then killed)
    put_notebook(server, nb_or_path, relpath) -> relpath  # write/copy an .ipynb under root_dir
    shutdown_sessions(server)                             # end every kernel (the page fixture does)
Browser side (Playwright sync API, given a `page`):
    open_notebook_in_lab(page, base_url, token, path, timeout=60)
    run_notebook_in_lab(page, base_url, token, path, timeout=120) -> NotebookRun (.prompts ...)
      = open_notebook_in_lab + start_run_all(page) + wait_run_done(page, timeout, path)
    error_outputs(page, stderr=True) -> [{"cell", "kind": "error"|"stderr"|"widget", "text"}]
    screenshot(page, name, locator=None) -> Path          # artifacts/browser/<name>.png

Chromium is Debian's (`/usr/bin/chromium`, or $CHROMIUM); Playwright's own browser download is
never used (no internet to its CDN).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from gpugeek_jupyter.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}

POLL_S = 1

# Lab's page config and user settings for tests: no news pop-up, and every cell attached to the DOM
# (the default "contentVisibility" windowing lets the browser skip laying out off-screen cells).
PAGE_CONFIG = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
USER_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
    # the status bar and sidebar ask every second (default 5 s), so tests see changes quickly
    "gpugeek-jupyter/plugin.jupyterlab-settings": {"pollInterval": POLL_S},
}
SERVER_CONFIG = {
    "LabApp": {"news_url": None,
               "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate"},
}


# ----------------------------------------------------------------------------------------- server
@dataclass
class LabServer:
    base_url: str  # "http://127.0.0.1:PORT"
    token: str
    root_dir: Path  # notebooks the browser opens live here (paths are relative to it)
    env: dict
    proc: subprocess.Popen
    log: Path
    seen: dict[int, psutil.Process] = field(default_factory=dict)  # every process of it seen

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5):
        request = urllib.request.Request(f"{self.base_url}/api/{path.lstrip('/')}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def processes(self) -> dict[int, psutil.Process]:
        """The server and every process it started (kernels get sessions of their own); each one
        seen is remembered, so a process whose parent died is still found at the end."""
        try:
            parent = psutil.Process(self.proc.pid)
            for proc in [parent, *parent.children(recursive=True)]:
                self.seen.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            pass
        return self.seen


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def start_lab(workdir: Path, gpugeek_home: Path | None = None, timeout: float = 90) -> LabServer:
    """Start `jupyter lab` on a free port with a token, every Jupyter/IPython dir inside `workdir`.

    Labextensions (widgets, plotly) are still found: they live under sys.prefix's
    share/jupyter, which is on Jupyter's data path whatever JUPYTER_DATA_DIR says.
    """
    workdir = Path(workdir)
    root = workdir / "notebooks"
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for name in ("HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                 "IPYTHONDIR"):
        env[name] = str(workdir / name.lower())
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    env["GPUGEEK_HOME"] = str(gpugeek_home or workdir / "gpugeek-home")
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    config = Path(env["JUPYTER_CONFIG_DIR"])
    _write_json(config / "labconfig" / "page_config.json", PAGE_CONFIG)
    _write_json(config / "jupyter_server_config.json", SERVER_CONFIG)
    for name, settings in USER_SETTINGS.items():
        _write_json(config / "lab" / "user-settings" / name, settings)

    port, token = free_port(), f"gpugeek-browser-{os.getpid()}-{time.monotonic_ns()}"
    log = workdir / "jupyterlab.log"
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--ServerApp.open_browser=False", "--ServerApp.terminals_enabled=False"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, env, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if "started" in server.api("status", timeout=2):
                return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_lab(server)
            raise TimeoutError(f"jupyter lab did not answer /api/status in {timeout} s:\n"
                               f"{log.read_text()}")
        time.sleep(0.25)


def _alive(procs) -> list[str]:
    left = []
    for proc in procs:
        try:  # psutil checks the create time too, so a reused PID is not taken for ours
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def stop_lab(server: LabServer, timeout: float = 20) -> list[str]:
    """Shut down kernels, stop the server, kill whatever of it is left; return what was left.

    Kernels run in sessions of their own (jupyter_client starts them with start_new_session), so
    killing the server's process group alone would leave them: they are listed before the stop and
    shut down through the REST API first.
    """
    server.processes()
    try:
        for kernel in server.api("kernels"):
            server.api(f"kernels/{kernel['id']}", method="DELETE", timeout=timeout)
    except OSError:
        pass
    procs = list(server.processes().values())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=timeout)
    deadline = time.monotonic() + 5
    while _alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(procs)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    return left


def put_notebook(server: LabServer, notebook, relpath: str) -> str:
    """Write `notebook` (an nbformat node, or the path of an .ipynb to copy) under the server's
    root dir at `relpath`; return `relpath` for `run_notebook_in_lab`. A notebook without a
    kernelspec gets python3's, so Lab opens it without asking which kernel to start."""
    import nbformat

    if not isinstance(notebook, nbformat.NotebookNode):
        notebook = nbformat.read(notebook, as_version=4)
    notebook.metadata.setdefault("kernelspec", {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"})
    target = server.root_dir / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return relpath


def shutdown_sessions(server: LabServer) -> None:
    """End every notebook session (and its kernel) the server holds, so the next test starts clean."""
    server.processes()  # remember the kernels, so stop_lab can check they are gone
    for session in server.api("sessions"):
        server.api(f"sessions/{session['id']}", method="DELETE", timeout=30)


# ---------------------------------------------------------------------------------------- browser
# The notebook panel on show (Lumino hides the others with lm-mod-hidden).
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def training_cell(name: str, epochs: int, hold: str | None = None) -> str:
    """A short real job for the job monitor: a linear model, a DataLoader sharded by ``gg``,
    ~20 ms a step so the live panel has time to draw. With ``hold`` (a file's path), every rank
    waits at step 128 (its reports, at most one a second, have come by then) until that file
    exists (at most four minutes), so a test sees the live monitor however slowly a loaded
    browser draws it, and lets the job go on by writing the file."""
    wait = "" if hold is None else f"""
    if step == 128:
        held = time.monotonic()
        while not os.path.exists({hold!r}) and time.monotonic() - held < 240:
            time.sleep(0.1)"""
    return f"""%%gpugeek run --workers 2 --name {name}
import os, time, torch
from torch import nn
data = torch.utils.data.TensorDataset(torch.randn(2048, 16), torch.randn(2048, 1))
loader = torch.utils.data.DataLoader(data, batch_size=32)
model = nn.Linear(16, 1)
model, opt, loader = gg.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01), loader)
for step, (x, y) in enumerate(gg.steps(loader, epochs={epochs}), 1):
    loss = nn.functional.mse_loss(model(x), y)
    gg.backward(loss)
    gg.log(loss=loss.item())
    time.sleep(0.02){wait}
gg.step"""

# The kernel is ready once the panel names a kernel and its execution indicator says idle. The
# indicator reads "idle" before any kernel is attached too (the panel then says "No Kernel"), and
# clicking Run All then does nothing, so both are checked.
_KERNEL_IDLE_JS = """(panel) => {
  const p = document.querySelector(panel);
  if (!p) return false;
  const name = p.querySelector('.jp-Toolbar-kernelName');
  const state = p.querySelector('.jp-Notebook-ExecutionIndicator');
  return !!name && !!state && (name.getAttribute('aria-label') || 'No Kernel') !== 'No Kernel'
    && state.getAttribute('data-status') === 'idle';
}"""

RUN_STARTS_WITHIN_MS = 30_000     # from Run All to the first cell queued, on a busy machine
_PROMPTS_JS = """(panel) => [...document.querySelectorAll(panel + ' .jp-CodeCell .jp-InputPrompt')]
  .map(e => e.textContent.trim())"""

# Lab shows "[*]:" on every queued cell the moment Run All is clicked and a number once it ran;
# a cell that is cut short by an error above it goes back to "[ ]:". A fast cell can go from "[*]"
# to "[1]" between two polls, so a MutationObserver records that a run started at all.
_WATCH_JS = """(panel) => {
  const p = document.querySelector(panel);
  window.__ggRunStarted = false;
  if (window.__ggObserver) window.__ggObserver.disconnect();
  const busy = () => [...p.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'));
  window.__ggObserver = new MutationObserver(() => { if (busy()) window.__ggRunStarted = true; });
  window.__ggObserver.observe(p, {subtree: true, childList: true, characterData: true});
}"""

_DONE_JS = f"""(panel) => {{
  const p = document.querySelector(panel);
  if (!p || !window.__ggRunStarted) return false;
  const busy = [...p.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'));
  return !busy && ({_KERNEL_IDLE_JS})(panel);
}}"""


@dataclass
class NotebookRun:
    path: str
    prompts: list[str]  # each code cell's prompt after the run: "[3]:", "[ ]:" (not run / empty)
    seconds: float  # from clicking Run All to the last cell done

    @property
    def executed(self) -> int:
        return sum(bool(re.fullmatch(r"\[\d+\]:", p)) for p in self.prompts)


def open_notebook_in_lab(page, base_url: str, token: str, path: str, timeout: float = 60) -> None:
    """Open `path` (relative to the server's root dir) in a reset workspace; wait for its cells
    and for its kernel to be idle."""
    from urllib.parse import quote

    page.goto(f"{base_url}/lab/tree/{quote(path)}?reset&token={token}",
              timeout=timeout * 1000)
    page.wait_for_selector(f"{PANEL} .jp-Notebook", timeout=timeout * 1000)
    # the browser must show every cell of the file before Run All
    request = urllib.request.Request(f"{base_url}/api/contents/{quote(path)}?content=1",
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        cells = len(json.load(response)["content"]["cells"])
    page.wait_for_function(
        f"() => document.querySelectorAll('{PANEL} .jp-Notebook-cell').length === {cells}",
        timeout=timeout * 1000)
    page.wait_for_function(_KERNEL_IDLE_JS, arg=PANEL, timeout=timeout * 1000)


def start_run_all(page) -> None:
    """Run all cells of the notebook on show through the menu (Run → Run All Cells) and return at
    once; `wait_run_done` waits for the end. In between, a test can watch outputs appear."""
    page.evaluate(_WATCH_JS, PANEL)
    page.evaluate("() => { window.__ggRunStartedAt = performance.now(); }")
    for attempt in range(2):     # a click Lab took before its kernel's session was ready queues nothing (seen)
        page.click('.lm-MenuBar-itemLabel:text-is("Run")')
        page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')
        if not _has_code(page):
            return
        try:
            page.wait_for_function("() => window.__ggRunStarted", timeout=RUN_STARTS_WITHIN_MS)
            return
        except PlaywrightTimeout:
            if attempt:
                raise AssertionError(f"Run All Cells queued no cell within {RUN_STARTS_WITHIN_MS / 1000:.0f} s, "
                                     f"twice") from None


def wait_run_done(page, timeout: float = 120, path: str = "") -> NotebookRun:
    """Wait until the run `start_run_all` began is over: no cell queued or running ("[*]") and the
    kernel idle, still so 300 ms later (widgets go on talking to the kernel after a cell ends)."""
    if _has_code(page):  # Lab does not run empty cells: with no code, no "[*]" would ever show
        page.wait_for_function(_DONE_JS, arg=PANEL, timeout=timeout * 1000)
        page.wait_for_timeout(300)
        page.wait_for_function(_DONE_JS, arg=PANEL, timeout=timeout * 1000)
    seconds = page.evaluate("() => (performance.now() - window.__ggRunStartedAt) / 1000")
    return NotebookRun(path, page.evaluate(_PROMPTS_JS, PANEL), seconds)


def _has_code(page) -> bool:
    return page.evaluate(f"""() => [...document.querySelectorAll('{PANEL} .jp-CodeCell')]
        .some(c => (c.querySelector('.cm-content')?.textContent || '').trim() !== '')""")


def run_notebook_in_lab(page, base_url: str, token: str, path: str,
                        timeout: float = 120) -> NotebookRun:
    """Open `path` in Lab, run all cells through the menu (Run → Run All Cells), wait until no cell
    is queued or running and the kernel is idle again; return the prompts. Outputs that render
    asynchronously after that (widgets, plotly) are for the caller to wait for.

    A cell that raises stops the run (the cells below show "[ ]:"): check `error_outputs(page)`.
    """
    open_notebook_in_lab(page, base_url, token, path, timeout=timeout)
    start_run_all(page)
    return wait_run_done(page, timeout=timeout, path=path)


def error_outputs(page, stderr: bool = True) -> list[dict]:
    """Errors shown in the open notebook: tracebacks, widgets that failed to display, and (unless
    `stderr=False`) anything written to stderr. Each is {"cell": index, "kind", "text"}.

    Lab renders an error output with the stderr mime type too (`data-mime-type=
    "application/vnd.jupyter.stderr"`), so "error" vs "stderr" is told by the traceback header."""
    found = page.evaluate(f"""() => {{
      const out = [];
      document.querySelectorAll('{PANEL} .jp-Notebook-cell').forEach((cell, i) => {{
        cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
          .forEach(e => out.push({{cell: i, kind: 'stderr', text: e.innerText}}));
        cell.querySelectorAll('.jupyter-widgets-error-widget')
          .forEach(e => out.push({{cell: i, kind: 'widget', text: e.innerText}}));
        cell.querySelectorAll('.jp-OutputArea-output').forEach(e => {{
          if (e.innerText.startsWith('Error displaying widget'))
            out.push({{cell: i, kind: 'widget', text: e.innerText}});
        }});
      }});
      return out;
    }}""")
    tb = re.compile(r"Traceback \(most recent call last\)|^-{20,}\s*\n\s*\w+(Error|Exception)\b|"
                    r"^\w+(Error|Exception|Interrupt)\b", re.M)
    merged: list[dict] = []     # one print to stderr may reach Lab as two outputs (its text, then its
    for item in found:          # newline, with stdout between): one stream of the cell, as a reader sees it
        last = merged[-1] if merged else None
        if last and item["kind"] == "stderr" == last["kind"] and item["cell"] == last["cell"] and \
                not tb.search(item["text"]) and not tb.search(last["text"]):
            last["text"] += item["text"]
        else:
            merged.append(item)
    found = merged
    for item in found:
        if item["kind"] == "stderr" and tb.search(item["text"]):
            item["kind"] = "error"
    return [f for f in found if (stderr or f["kind"] != "stderr") and not _disk_really_full(f)]


_DISK_WARNING = re.compile(r"\(raylet\).*file_system_monitor\.cc:\d+: (\S+) is over (\d+)% full")


def _disk_really_full(item: dict) -> bool:
    """Ray's raylet warns in every cell when the machine's disk is over 95 % full: that is the
    machine's state, not our error. It is forgiven only when the disk, read here with `statvfs`,
    is in fact that full; any other line in the same output still counts."""
    lines = [line for line in item["text"].splitlines() if line.strip()]
    if item["kind"] != "stderr" or not lines:
        return False
    for line in lines:
        match = _DISK_WARNING.search(line)
        if match is None:
            return False
        where = Path(match.group(1))
        while not where.exists():
            where = where.parent
        usage = shutil.disk_usage(where)
        if 1 - usage.free / usage.total < int(match.group(2)) / 100 - 0.02:
            return False
    return True


def screenshot(page, name: str, locator=None) -> Path:
    """Save a PNG of the page (or of `locator`) as artifacts/browser/<name>.png; return its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + ".png")
    (locator or page).screenshot(path=str(path))
    return path
