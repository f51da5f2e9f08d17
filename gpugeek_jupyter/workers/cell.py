"""A notebook cell as code a worker can run: compiled under a name tracebacks can point into.

The cell is registered in ``linecache`` under ``<cell N>`` on the worker, so a remote traceback
shows the user's own lines; frames of this package are dropped from what the user sees. If the
cell ends in an expression its value is returned, as a notebook would display it.
"""

from __future__ import annotations

import ast
import linecache
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    source: str
    filename: str

    def compile(self):
        """(body, last expression or None), both code objects."""
        tree = ast.parse(self.source, self.filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, self.filename, "exec")
        return body, (compile(last, self.filename, "eval") if last is not None else None)

    def register(self) -> None:
        lines = self.source.splitlines(keepends=True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)


def calls_gg(source: str) -> bool:
    """Whether the cell names ``gg`` at all (a cell that does not parse: as if it did — its
    error comes from the workers)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    return any(isinstance(node, ast.Name) and node.id == "gg" for node in ast.walk(tree))


def user_traceback(exc: BaseException, filename_prefix: tuple[str, ...] = ("<cell", "<script")) -> str:
    """The traceback from the first frame of the user's cell on, ending in the exception line."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename.startswith(filename_prefix)), None)
    kept = frames[first:] if first is not None else frames[-1:]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(kept),
             *traceback.format_exception_only(type(exc), exc)]
    return "".join(lines)


MAX_VALUE_BYTES = 20 * 2**20    # a cell's value larger than this comes back as its repr


def on_cpu(value):
    """A tensor or a model as any machine can load it: on the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.nn.Module):   # a copy: the worker keeps training its own
        import copy

        return copy.deepcopy(getattr(value, "module", value)).to("cpu")
    return value


def portable(value) -> dict:
    """The cell's value as the notebook can show it: pickled if small and picklable, else repr."""
    from .values import dumps

    try:
        data = dumps(on_cpu(value))
        if len(data) <= MAX_VALUE_BYTES:
            return {"pickle": data}
    except Exception:  # noqa: BLE001 - fall back to its text
        pass
    return {"repr": repr(value)}
