"""The troubleshooting page's messages, read from the code.

Every message of ours renders as one line in a notebook, ``gpugeek: <message>``: what an
``GpugeekError`` (or one of its kinds, found in the package), IPython's ``UsageError`` in the
magics, or a cluster's keeper's answer that the kernel raises (``Failed(why=…)``,
``Refused(why=…)``) is built with. This reads each such call as written — its f-string holes shown
as ``‹…›`` — and follows a message that is not written at the call to where its text is built:

* a name: its assignments in the same function (``+=`` adds on), else the module's;
* a call: the texts its function returns (same module, a class's method, or a module of the
  package imported by name), a few calls deep;
* an attribute (``self.no_credentials``, ``self.cannot[feature]``): every class of the package
  that sets it, each value of a mapping;
* a message of ours caught and said again (``except GpugeekError as exc: raise …(str(exc))``, a
  keeper's answer's ``.why``): listed where it is first built.

What cannot be followed (a process's output, another library's words) is named in ``EXCEPTIONS``
with the reason; so is a message that is listed without a what-to-do. ``tests/docs/
test_troubleshooting.py`` holds both to the code: a new message that is neither listed with what
to do nor excepted fails it, and so does an exception that no longer matches a call.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpugeek_jupyter"
ROOT_ERROR = "GpugeekError"
ALSO_RAISED = {"UsageError"}                 # IPython's: the magics' usage mistakes, one line too
REPLIES = {"Failed", "Refused"}              # a keeper's answers: their why= is raised in the kernel
TODO = " — "                                 # the convention: the message, the dash, what to do
HOLE = re.compile(r"‹[^›]*›")
DEPTH = 4                                    # calls followed, deep
MOST_VARIANTS = 24                           # texts one call may say, at most (holes expanded)

# the step of the loop a unit serves (its first path part), in the order of the loop
STEPS = (
    ("Price", ("catalog",)),
    ("Plan", ("sizing",)),
    ("Provision", ("provision", "backends", "remote", "clouds", "cluster", "launch", "raynodes.py")),
    ("Run", ("cells", "group", "workers", "kernel", "line", "keeper", "onhost")),
    ("Meter, budgets and autostop", ("meter", "guard", "health", "store.py")),
    ("View", ("widgets", "views", "display.py", "server")),
    ("The magics, the command and the settings", ("magics", "cli.py", "api.py", "config.py", "units.py",
                                                  "vocab.py", "blocks.py", "versions.py", "ports.py", "lean.py")),
)

# (module, the message argument as written) → why it is not listed, or listed without what to do.
# Keep it short: each entry is a message the page cannot hold to the convention, and why.
LAUNCHER = "worded by the launcher's own failure reader"
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("gpugeek_jupyter/backends/launcher.py", "failed"):
        f"{LAUNCHER}: Ray's launcher's last words, with the cloud's answer where it gave one",
    ("gpugeek_jupyter/backends/launcher.py", "f'{failed}: {code}'"):
        f"{LAUNCHER}: the cloud's refusal (capacity, quota, permissions) and its code",
    ("gpugeek_jupyter/backends/launcher.py", "f'no answer from the head (its output ended: {text.strip()[-200:]!r})'"):
        LAUNCHER,
    ("gpugeek_jupyter/backends/launcher.py", "f\"Ray rejects the generated {config['provider']['type']} config: "
                                             "{message}\""):
        LAUNCHER,
    ("gpugeek_jupyter/backends/launcher.py", "f\"Ray's launcher gave no head address (it said: {said!r})\""):
        LAUNCHER,
    ("gpugeek_jupyter/backends/hosts.py", "'; '.join(failures)"):
        "each host's own stop failure, joined: listed where each is built",
    ("gpugeek_jupyter/remote/runtime.py", "f\"{target}: {answer.get('error')}\""):
        "what a host's runtime script answered: its words are written in remote/runtime_script",
    ("gpugeek_jupyter/group/results.py", "results[failed]['said']"):
        "a rank's own one-line failure (a message of ours raised on the worker, listed where it is built)",
    ("gpugeek_jupyter/group/results.py", "failed"):
        "the failing rank's own traceback, shown as the cell's error (the code of the cell, not ours)",
    ("gpugeek_jupyter/cells/attach.py", "failed"):
        "the failing rank's own traceback, shown as the cell's error (the code of the cell, not ours)",
    ("gpugeek_jupyter/cells/linegroup.py", "'interrupted'"):
        "the stop button's own word: the cell stops as the user asked",
    ("gpugeek_jupyter/group/workergroup.py", "'interrupted'"):
        "the stop button's own word: the cell stops as the user asked",
}


@dataclass
class Site:
    """One call that makes a message: where, the argument as written, and what it says."""

    module: str                  # gpugeek_jupyter/…/x.py
    line: int
    source: str                  # the message argument, ``ast.unparse``d: the key of EXCEPTIONS
    texts: list[str] = field(default_factory=list)     # what it says (holes ‹…›); [] when not followed
    resaid: bool = False         # a message of ours said again: listed where it is built
    how: str = "literal"         # literal, followed, re-said, not followed


def todo(text: str) -> str:
    """What a message says to do: the words after its dash, holes left out ('' when none)."""
    _, sep, rest = text.partition(TODO)
    return " ".join(HOLE.sub("", rest).split()) if sep else ""


def says_what_to_do(text: str) -> bool:
    return len(re.findall(r"[A-Za-z%`-]{2,}", todo(text))) >= 2


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


class Package:
    """The package's modules, parsed once: its message kinds, its functions, its class attributes."""

    def __init__(self, modules: dict[str, str]):
        self.trees = {path: ast.parse(text) for path, text in modules.items()}
        self.parents: dict[int, ast.AST] = {}
        for tree in self.trees.values():
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    self.parents[id(child)] = node
        self.classes = [(module, node) for module, tree in self.trees.items() for node in ast.walk(tree)
                        if isinstance(node, ast.ClassDef)]
        self.kinds = self._kinds()
        self.instances = {t.id: stmt.value.func.id for tree in self.trees.values() for stmt in tree.body
                          if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                          and isinstance(stmt.value.func, ast.Name) for t in stmt.targets if isinstance(t, ast.Name)}

    @classmethod
    def read(cls, root: Path = PACKAGE) -> Package:
        return cls({str(p.relative_to(root.parent)): p.read_text() for p in sorted(root.rglob("*.py"))})

    def _kinds(self) -> set[str]:
        """GpugeekError and every class of the package that derives from it."""
        kinds, grown = {ROOT_ERROR}, True
        while grown:
            grown = False
            for _, node in self.classes:
                if node.name not in kinds and any(_name(base) in kinds for base in node.bases):
                    kinds.add(node.name)
                    grown = True
        return kinds

    # -- the calls that make messages ---------------------------------------------------------

    def sites(self) -> list[Site]:
        found = []
        for module, tree in self.trees.items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = _name(node.func)
                if name in self.kinds | ALSO_RAISED:
                    arg = node.args[0] if node.args else next(
                        (k.value for k in node.keywords if k.arg == "message"), None)
                elif name in REPLIES:
                    arg = next((k.value for k in node.keywords if k.arg == "why"), None)
                    if arg is None:
                        continue
                else:
                    continue
                if arg is None:          # a kind's name alone: ``raise NotFound`` says nothing of ours
                    found.append(Site(module, node.lineno, "", how="not followed"))
                    continue
                found.append(self._site(module, node, arg))
        return sorted(found, key=lambda s: (s.module, s.line))

    def _site(self, module: str, call: ast.Call, arg: ast.expr) -> Site:
        site = Site(module, call.lineno, ast.unparse(arg))
        texts = self.texts(module, arg, call, DEPTH)
        if self._resaid(arg, call):      # listed where it adds words of its own to what it says again
            site.resaid, site.how = True, "re-said"
            site.texts = [" ".join(t.split()) for t in texts or [] if len(HOLE.sub("", t).strip(" :.—;")) >= 12]
            return site
        if texts:
            site.texts = [" ".join(t.split()) for t in texts]
            site.how = "literal" if isinstance(arg, ast.Constant | ast.JoinedStr) else "followed"
        else:
            site.how = "not followed"
        return site

    def _resaid(self, arg: ast.expr, at: ast.AST) -> bool:
        """Whether ``arg`` says a message of ours again: one caught as such, or a keeper's ``.why``."""
        if any(isinstance(n, ast.Attribute) and n.attr == "why" for n in ast.walk(arg)):
            return True
        names = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
        node = self.parents.get(id(at))
        while node is not None and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            if isinstance(node, ast.ExceptHandler) and node.name in names:
                caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                if all(_name(c) in self.kinds for c in caught):
                    return True
            node = self.parents.get(id(node))
        return False

    # -- following a message to its text ------------------------------------------------------

    def texts(self, module: str, node: ast.expr, at: ast.AST, depth: int) -> list[str] | None:
        """What ``node`` (an expression in ``module``, at ``at``) says; None when it cannot be read."""
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            parts: list[list[str]] = []
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts.append([str(value.value)])
                else:
                    parts.append(self._hole(module, value.value, at, depth))
            return _product(parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = self.texts(module, node.left, at, depth) or ["‹…›"]
            right = self.texts(module, node.right, at, depth) or ["‹…›"]
            return None if left == right == ["‹…›"] else _product([left, right])
        if isinstance(node, ast.IfExp):
            both = (self.texts(module, node.body, at, depth) or []) + (self.texts(module, node.orelse, at, depth) or [])
            return both or None
        if depth <= 0:
            return None
        if isinstance(node, ast.Name):
            return self._assigned(module, node.id, at, depth - 1)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:    # mapping.get(key, default)
                values = self._attribute(ast.Subscript(value=func.value, slice=node.args[0]), depth - 1) or []
                default = self.texts(module, node.args[1], at, depth - 1) if len(node.args) > 1 else []
                return (values + (default or [])) or None
            return self._returned(module, func, at, depth - 1)
        if isinstance(node, ast.Attribute | ast.Subscript):
            return self._attribute(node, depth - 1)
        return None

    def _hole(self, module: str, value: ast.expr, at: ast.AST, depth: int) -> list[str]:
        """A hole's text: where it names words of ours (a variable, a call, a class's attribute), those
        words; else ‹its name› or ‹…›."""
        if depth > 0 and isinstance(value, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
            found = self.texts(module, value, at, depth - 1)
            if found and any(len(HOLE.sub("", text).split()) >= 3 for text in found):     # words, not a name
                return found
        source = ast.unparse(value)
        simple = isinstance(value, ast.Name | ast.Attribute | ast.Subscript) and len(source) <= 24
        return [f"‹{source if simple else '…'}›"]

    def _function(self, node: ast.AST) -> ast.AST:
        while node is not None and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            node = self.parents.get(id(node))
        return node

    def _assigned(self, module: str, name: str, at: ast.AST, depth: int) -> list[str] | None:
        scope = self._function(at)
        for where in (scope, self.trees[module]):
            values, added = [], []
            for node in ast.walk(where):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, ast.AnnAssign) and node.value is not None else []
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    values.append(node.value)
                elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                    added.append(node.value)
            if values:
                texts = [t for v in values for t in (self.texts(module, v, v, depth) or [])]
                if not texts:
                    return None
                for extra in added:       # message += …: said with what is added on
                    texts = _product([texts, self.texts(module, extra, extra, depth) or ["‹…›"]])
                return texts
            if where is scope and isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and name in {
                    a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}:
                return None          # a parameter: written by its callers
        source = self._imported(module, name, value=True)     # from .base import REHEARSAL_ONLY
        if source is not None and source != module:
            return self._assigned(source, name, self.trees[source], depth)
        return None

    def _returned(self, module: str, func: ast.expr, at: ast.AST, depth: int) -> list[str] | None:
        """The texts a called function of the package returns."""
        target = self._resolve(module, func, at)
        if target is None:
            return None
        where, definition = target
        texts = []
        for node in _own_nodes(definition):
            if isinstance(node, ast.Return) and node.value is not None:
                texts += self.texts(where, node.value, node, depth) or []
        return texts or None

    def _resolve(self, module: str, func: ast.expr, at: ast.AST):
        """(module, def) of a call: a function of the same module, a method of the enclosing
        class (self.f), or a function of a package module imported by name (mod.f)."""
        if isinstance(func, ast.Name):
            return self._def(module, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in ("self", "cls"):
                return self._def(module, func.attr, methods=True)
            imported = self._imported(module, owner)
            if imported is not None:
                return self._def(imported, func.attr)
        return None

    def _def(self, module: str, name: str, methods: bool = False):
        tree = self.trees.get(module)
        if tree is None:
            return None
        nodes = ast.walk(tree) if methods else tree.body
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return module, node
        return None

    def _imported(self, module: str, name: str, value: bool = False) -> str | None:
        """The package module that ``name`` is in ``module`` (``from . import away``, ``from ..x import y``);
        with ``value``, the module ``name`` is imported from (``from .base import NAME``)."""
        parts = module.removesuffix(".py").split("/")
        for node in ast.walk(self.trees[module]):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                base = parts[:-node.level] if node.level else []      # x/y/z.py and x/y/__init__.py: x/y
                dotted = base + (node.module.split(".") if node.module else []) + ([] if value else [alias.name])
                for candidate in ("/".join(dotted) + ".py", "/".join(dotted) + "/__init__.py"):
                    if candidate in self.trees:
                        return candidate
        return None

    def _attribute(self, node: ast.expr, depth: int) -> list[str] | None:
        """``X.attr`` / ``self.attr[key]``: the values every class of the package sets ``attr`` to."""
        keyed = isinstance(node, ast.Subscript)
        target = node.value if keyed else node
        if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name):
            return None
        owner = target.value.id          # self/cls: any class of the package; else that class only
        owner = self.instances.get(owner, owner)       # AWS = Aws(): Aws's
        texts = []
        for module, klass in self.classes:
            if owner not in ("self", "cls", klass.name):
                continue
            for stmt in klass.body:
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == target.attr for t in stmt.targets):
                    value = stmt.value
                    if keyed:
                        if isinstance(value, ast.Call) and value.args:    # MappingProxyType({...})
                            value = value.args[0]
                        if isinstance(value, ast.Dict):
                            for item in value.values:
                                texts += self.texts(module, item, stmt, depth) or []
                    else:
                        texts += self.texts(module, value, stmt, depth) or []
        return texts or None


def _own_nodes(definition: ast.AST):
    """The nodes of a function, not of the functions defined inside it."""
    stack = list(ast.iter_child_nodes(definition))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _product(parts: list[list[str]]) -> list[str]:
    return ["".join(combo) for combo in itertools.islice(itertools.product(*parts), MOST_VARIANTS)]


def step_of(module: str) -> str:
    first = Path(module).parts[1]
    return next((title for title, units in STEPS if first in units), STEPS[-1][0])


def excepted(site: Site) -> str | None:
    return EXCEPTIONS.get((site.module, site.source))


def by_step(package: Package | None = None) -> dict[str, list[tuple[str, str]]]:
    """Step → (message, module), each message once."""
    package = package or Package.read()
    grouped: dict[str, list[tuple[str, str]]] = {title: [] for title, _ in STEPS}
    seen = set()
    for site in package.sites():
        for text in site.texts:
            if text not in seen:
                seen.add(text)
                grouped[step_of(site.module)].append((text, site.module))
    return grouped


def problems(package: Package, listed: str | None = None) -> list[str]:
    """What the page misses: a call whose message is not listed (``listed``: the page's text) or
    cannot be followed, a listed message with no what-to-do — unless excepted — and an exception
    that matches no call any more."""
    out, used = [], set()
    page = _flat(listed) if listed is not None else None
    for site in package.sites():
        where = f"{site.module}:{site.line}"
        reason = excepted(site)
        if reason is not None:
            used.add((site.module, site.source))
            continue
        if site.resaid and not site.texts:
            continue
        if not site.texts:
            out.append(f"{where}: its message ({site.source}) cannot be followed to its text — write it at "
                       f"the call, or name it in EXCEPTIONS with why")
            continue
        for text in site.texts:
            if not says_what_to_do(text):
                out.append(f"{where}: no what-to-do after ' — ': {text}")
            if page is not None and _flat(text) not in page:
                out.append(f"{where}: not on the page: {text}")
    for key in EXCEPTIONS.keys() - used:
        if package.trees.get(key[0]) is not None or listed is not None:
            out.append(f"{key[0]}: an exception that matches no call any more: {key[1]}")
    return out


def _flat(text: str) -> str:
    """Text as the page shows it: no markup, quotes and backticks alike, one space."""
    return " ".join(text.replace("`", "'").replace("\\", "").split())


def rows(package: Package | None = None) -> list[str]:
    out: list[str] = []
    for title, found in by_step(package).items():
        if not found:
            continue
        out += [title, "-" * (len(title) + 4), ""]
        for text, module in found:
            head, sep, todo_ = text.partition(TODO)
            out += [f"* ``{_literal(head)}``" + (f" — **{_plain(todo_)}**" if sep else ""),
                    f"  (``{module}``)"]
        out.append("")
    return out


def _literal(text: str) -> str:
    return text.replace("`", "'")


def _plain(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", r"\*").replace("`", "'").replace("_", r"\_").replace("|", r"\|")


def setup(app):
    from docutils.parsers.rst import directives
    from reference import _Generated

    class ErrorsDirective(_Generated):
        def lines(self) -> list[str]:
            return rows()

    directives.register_directive("gpugeek-errors", ErrorsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
