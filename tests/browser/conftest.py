"""Browser tests: a real JupyterLab (isolated dirs, one per session) driven by headless Chromium.

Run as a pytest command of their own (`make test` does): Playwright's sync API and the asyncio
based tests of the main suite do not share a process well.

Fixtures:
    lab      the JupyterLab server (session): .base_url, .token, .root_dir, .url(path), .api(path)
    browser  Debian's Chromium through Playwright (session)
    page     a fresh browser context and page, 1400x1000 (per test); the test's kernels are shut
             down after it, and a failed test leaves artifacts/browser/FAILED-<test>.png
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from lab import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, screenshot, shutdown_sessions, start_lab, stop_lab


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    # GPUGEEK_HOME under pytest's base temp dir: the session check in tests/conftest.py then also
    # sees (and asserts stopped) any Ray cluster a notebook run in this Lab starts.
    workdir = tmp_path_factory.mktemp("lab")
    server = start_lab(workdir, gpugeek_home=workdir / "gpugeek-home")
    yield server
    left = stop_lab(server)
    assert not left, f"JupyterLab processes left after the stop (now killed): {left}"


@pytest.fixture(scope="session")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it as root, or run "
                    "`sudo apt-get install -y --no-install-recommends chromium` (or set $CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, lab, request):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        try:
            screenshot(page, f"FAILED-{request.node.name}")
        except Exception:  # noqa: BLE001 - a failed screenshot must not hide the failure
            pass
    context.close()
    shutdown_sessions(lab)
