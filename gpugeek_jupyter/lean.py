"""Imports that cost seconds of CPU and that nothing of ours needs, left out of the kernel.

Ray imports jsonschema, and jsonschema imports ``rfc3987_syntax`` when it is installed (Jupyter's
own packages install it): that module builds some 40 parsers as it loads, about 2.5 s of CPU, so a
kernel's first ``%gpugeek`` waited that long more for its ``import ray``. jsonschema treats the
module as optional (without it, only its check of the rarely used ``iri`` string formats is
missing), so when jsonschema asks for it, and only then, it is refused. Anyone else who imports
``rfc3987_syntax`` gets it. The processes we start for Ray get the same from ``PYTHONPATH``
(``cluster/lean_imports``): they import Ray before they import us.

The name of jsonschema's module that asks (``jsonschema._format``) is jsonschema's inside; this
module is its one door, and ``tests/test_run.py`` says so when it moves.
"""

from __future__ import annotations

import sys

SLOW_OPTIONAL = {"rfc3987_syntax": "jsonschema._format"}      # module → the one importer refused it
FRAMES_LOOKED_AT = 12


class _LeaveOutSlowOptional:
    """A meta-path finder that refuses a slow module to the one importer that treats it as optional."""

    def find_spec(self, name, path=None, target=None):
        importer = SLOW_OPTIONAL.get(name)
        if importer is None:
            return None
        frame = sys._getframe(1)
        for _ in range(FRAMES_LOOKED_AT):
            if frame is None:
                break
            if frame.f_globals.get("__name__") == importer:
                raise ModuleNotFoundError(f"{name} is left out of {importer} by gpugeek_jupyter.lean", name=name)
            frame = frame.f_back
        return None


def leave_out_slow_optional_imports() -> None:
    """Once per process, before anything of ours imports Ray."""
    if not any(isinstance(finder, _LeaveOutSlowOptional) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeaveOutSlowOptional())
