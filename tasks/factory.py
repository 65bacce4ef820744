"""``model.factory: "module.path:function"`` checked at config load, without importing the module.

Importing a user's model module imports torch, which the CLI must not pay before it knows the
config is good, and a misspelt name found only inside torchrun is far from its cause. So the
module's file is found the way ``import`` would find it (the repository root first, as
``core.paths.importable_root`` puts it on ``sys.path``, then the installed packages) and its
source is read with ``ast``: the name must be bound at its top level. Stdlib only.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from importlib.machinery import PathFinder
from pathlib import Path

from core.errors import ConfigError

KEY = "model.factory"


def check_factory(ref: str, root: Path) -> None:
    """Raise ConfigError (one line, naming ``model.factory``) unless ``ref`` = ``"module:function"``
    names a module in ``root`` or an installed package that binds ``function`` at its top level.
    Nothing is imported from ``root`` (an installed package's parents may be); a module without
    Python source is accepted once found."""
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{KEY}: expected 'module.path:function', got {ref!r}")
    spec = _find(module, Path(root))
    if spec is None:
        hint = " (a module name: without .py)" if module.endswith(".py") else ""
        raise ConfigError(f"{KEY}: module {module!r} not found in the repository root ({Path(root).resolve()}) "
                          f"or the installed packages{hint}")
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py"):
        return  # an extension module, a namespace package: no source to read
    try:
        tree = ast.parse(importlib.util.decode_source(Path(origin).read_bytes()), filename=origin)
    except OSError as exc:
        raise ConfigError(f"{KEY}: cannot read {origin}: {exc.strerror or exc}") from None
    except (SyntaxError, ValueError) as exc:
        where = f" line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise ConfigError(f"{KEY}: {origin}{where}: {getattr(exc, 'msg', None) or exc}") from None
    names, functions, open_ended = _top_level(tree)
    if name in names or open_ended:
        return
    close = difflib.get_close_matches(name, functions, n=1)
    if close:
        hint = f" (did you mean {close[0]}?)"
    elif functions:
        shown = sorted(functions)
        hint = f" (its functions and classes: {', '.join(shown[:8])}{', ...' if len(shown) > 8 else ''})"
    else:
        hint = " (it defines no function or class)"
    raise ConfigError(f"{KEY}: {module} has no function {name!r}{hint}")


def _find(module: str, root: Path):
    """The module's spec as ``import`` finds it with ``root`` first on ``sys.path``; None when not found."""
    here = [str(root.resolve())]
    top = _find_in(module.partition(".")[0], here)
    if top is not None and top.origin is not None:  # a regular package or module: import stops here
        return _find_in(module, here)
    try:  # a namespace package (it may span several folders), or nothing in root
        found = importlib.util.find_spec(module)
    except Exception:  # noqa: BLE001 - a parent package that fails to import: not importable either
        found = None
    return found or _find_in(module, here)


def _find_in(module: str, path: list[str]):
    """``module``'s spec under the folders ``path``, walking the dotted name part by part."""
    spec, parts = None, module.split(".")
    for i in range(len(parts)):
        if spec is not None and not (path := list(spec.submodule_search_locations or [])):
            return None  # a module, not a package: it has no submodules
        try:
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
    return spec


def _top_level(tree: ast.Module) -> tuple[set[str], list[str], bool]:
    """(every name the module binds at its top level, its functions and classes, whether it may bind
    names no statement shows: ``from x import *`` or a module ``__getattr__``). Statements nested in
    top-level ``if``/``try``/``with`` blocks count; function and class bodies do not."""
    names: set[str] = set()
    functions: list[str] = []
    open_ended = False

    def visit(body: list[ast.stmt]) -> None:
        nonlocal open_ended
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                functions.append(node.name)
                open_ended |= node.name == "__getattr__"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target)
                                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                open_ended |= any(alias.name == "*" for alias in node.names)
                names.update(alias.asname or alias.name.partition(".")[0] for alias in node.names if alias.name != "*")
            elif isinstance(node, (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return names, functions, open_ended


def load_factory(ref: str):
    """``"module.path:function"`` -> the function (imported from the repository or a package);
    ValueError naming ``model.factory`` when it cannot be imported or is not callable."""
    import importlib

    module, _, name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model.factory: cannot import {ref!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"model.factory: {ref!r} is not callable")
    return fn


def factory_module(ref: str, *args, **kwargs):
    """The network ``model.factory`` returns for ``args`` and ``kwargs``; ValueError when it is no nn.Module."""
    from torch import nn

    net = load_factory(ref)(*args, **kwargs)
    if not isinstance(net, nn.Module):
        raise ValueError(f"model.factory: {ref} returned {type(net).__name__}, not an nn.Module")
    return net
