"""What the exception-tree tests of each program share: every exception class
a package defines, found by importing each of its modules, so a new one that
forgets its program's root fails the test of that program."""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import pkgutil
from pathlib import Path

# Optional extras a module may import at its top (the engine's hf backend):
# without them the module is read, not imported (`unimportable_classes`).
OPTIONAL = frozenset({"torch", "transformers", "tokenizers", "safetensors"})
BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))


def modules_of(package: str) -> tuple[list[str], list[str]]:
    """(importable, unimportable for want of an optional extra) module names;
    `__main__` modules run their program when imported, and are left out."""
    root = importlib.import_module(package)
    importable, unimportable = [], []
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in OPTIONAL:
                raise
            unimportable.append(info.name)
        else:
            importable.append(info.name)
    return importable, unimportable


def exception_classes(package: str) -> tuple[list[type[BaseException]], dict[str, list[str]]]:
    """The exception classes defined in `package`'s importable modules, and for
    the others each exception class's base names as written, by qualified name."""
    importable, unimportable = modules_of(package)
    found: list[type[BaseException]] = []
    for name in importable:
        module = importlib.import_module(name)
        found += [value for value in vars(module).values()
                  if isinstance(value, type) and issubclass(value, BaseException)
                  and value.__module__ == name]
    written: dict[str, list[str]] = {}
    for name in unimportable:
        spec = importlib.util.find_spec(name)
        assert spec is not None
        assert spec.origin is not None
        for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                if any(base in BUILTIN_EXCEPTIONS for base in bases):
                    written[f"{name}.{node.name}"] = bases
    return found, written


def strays(package: str, root: type[BaseException]) -> list[str]:
    """The exception classes of `package` that do not derive from `root`."""
    found, written = exception_classes(package)
    missing = [f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, root)]
    missing += [name for name, bases in written.items() if root.__name__ not in bases]
    return sorted(missing)
