"""What a trusted tool file defines, learned by parsing it — never by running it.

Workload validation checks each tool's implementation file before a run starts any worker: it must
compile, and its module level must bind the tool's name (a ``def``, ``class``, assignment or import),
so that a typo fails in validation, with the file and line, instead of in a worker seconds later.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ToolFile:
    """What a trusted tool file's source says, learned without running it: the names its module level
    binds (``dynamic``: a star import or a module ``__getattr__`` may bind any), or why it cannot load."""

    names: frozenset[str] = frozenset()
    dynamic: bool = False
    error: str | None = None

    def binds(self, name: str) -> bool:
        return self.dynamic or name in self.names

    @classmethod
    def parse(cls, path: Path) -> ToolFile:
        try:
            source = path.read_bytes()
        except OSError as exc:
            return cls(error=f"cannot be read: {exc.strerror or exc}")
        try:
            tree = ast.parse(source, filename=str(path))
            # Compiling (never executing) also finds what the parser lets through ('return' outside a
            # function, a misplaced 'nonlocal'...), which the worker's import would hit.
            compile(tree, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f" at line {exc.lineno}" if exc.lineno else ""
            return cls(error=f"has a syntax error{where}: {exc.msg}")
        except (ValueError, RecursionError) as exc:  # a null byte in the source; nesting too deep
            return cls(error=f"is not valid Python source: {exc}")
        names, dynamic = module_bindings(tree)
        return cls(frozenset(names), dynamic)


def module_bindings(tree: ast.Module) -> tuple[set[str], bool]:
    """Names bound at module level (in any branch of an if/try/with/loop), without entering functions,
    classes or lambdas; and whether the module may bind names this cannot see."""
    names: set[str] = set()
    dynamic = False
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo.extend(ast.iter_child_nodes(node))
    # A function may bind a module-level name through ``global`` when it is called at import.
    names.update(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)
    return names, dynamic or "__getattr__" in names
