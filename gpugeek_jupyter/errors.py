"""Errors a user can cause: each renders as one line in IPython, never as our traceback."""

from __future__ import annotations


class GpugeekError(Exception):
    """A problem with the user's input or environment, said in one line with what to do.

    IPython calls ``_render_traceback_`` instead of printing a traceback, so both the magics
    and the Python API show just ``gpugeek: <message>`` in a notebook.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mgpugeek:\x1b[0m {self}"]


class LaunchRefused(GpugeekError):
    """A cloud refused to launch a machine (capacity, quota, permissions, …): its own ``code`` and
    words (``said``), as its API answered Ray's launcher."""

    def __init__(self, message: str, code: str, said: str, no_capacity: bool = False):
        super().__init__(message)
        self.code, self.said, self.no_capacity = code, said, no_capacity


class NoMatchingOffers(GpugeekError):
    """No offer in the catalog meets the filters; ``suggestions`` names the nearest ones."""

    def __init__(self, message: str, suggestions: list[str] | None = None):
        super().__init__(message)
        self.suggestions = suggestions or []
