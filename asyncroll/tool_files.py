"""What a trusted tool file defines, learned by parsing it — never by running it.

Workload validation checks each tool's implementation file before a run starts any worker: it must
compile, and its module level must bind the tool's name (a ``def``, ``class``, assignment or import),
so that a typo fails in validation, with the file and line, instead of in a worker seconds later.

When the name is bound exactly once, by a module-level assignment of a literal (``x = 5``, ``x = [1]``),
it cannot be called, and validation says so (unless the module may bind names at run time: ``globals()``,
``setattr``, ``exec``, ``sys.modules[...].x = ``, which may fill such a placeholder). When it is bound
exactly once, by a plain (undecorated) ``def``, its signature is known too
(:class:`ToolFunction`): validation then refuses an ``async def`` or generator function (calling it would
run none of its body) and compares the declared inputs with the parameters, because workers call a tool
with keyword arguments only (``tool(**arguments)``). Anything else (a decorated function, a class, an
assignment, a name bound twice) is left to the worker, which still turns a bad call into a tool error.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The longest signature quoted in a message.
_SIGNATURE_LIMIT = 160


@dataclass(frozen=True, slots=True)
class ToolFunction:
    """A tool's ``def`` as its source states it: where it is, what kind of function, and its parameters."""

    name: str
    line: int
    is_async: bool
    is_generator: bool
    keyword: frozenset[str]
    """Parameters a keyword argument can fill (every named one but the positional-only)."""
    positional_only: frozenset[str]
    required: tuple[str, ...]
    """Parameters without a default, in order (positional-only ones included)."""
    var_keyword: bool
    """Whether it takes ``**kwargs`` (then any other keyword is accepted too)."""
    signature: str

    @classmethod
    def of(cls, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ToolFunction:
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        with_default = {a.arg for a in positional[len(positional) - len(args.defaults) :]}
        with_default |= {
            a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
        }
        named = [*positional, *args.kwonlyargs]
        signature = f"{node.name}({ast.unparse(args)})"
        if len(signature) > _SIGNATURE_LIMIT:
            signature = signature[: _SIGNATURE_LIMIT - 4] + "...)"
        return cls(
            name=node.name,
            line=node.lineno,
            is_async=isinstance(node, ast.AsyncFunctionDef),
            is_generator=_yields(node),
            keyword=frozenset(a.arg for a in [*args.args, *args.kwonlyargs]),
            positional_only=frozenset(a.arg for a in args.posonlyargs),
            required=tuple(a.arg for a in named if a.arg not in with_default),
            var_keyword=args.kwarg is not None,
            signature=signature,
        )

    def refusal(self) -> str | None:
        """Why calling this function cannot run the tool (an async def, a generator), or None."""
        if not (self.is_async or self.is_generator):
            return None
        if self.is_async:
            kind = "an async generator function" if self.is_generator else "an async def"
            returned = "an async generator" if self.is_generator else "a coroutine"
            fix = "make it a plain def (which may run async code with asyncio.run)"
        else:
            kind, returned = "a generator function (its body contains yield)", "a generator"
            fix = "make it return a list instead"
        return (
            f"is {kind}: a worker calls a tool synchronously and uses what it returns, so each call would "
            f"return {returned} object and run none of its body; {fix}"
        )

    def call_problems(self, declared: Collection[str]) -> list[tuple[str | None, str]]:
        """What a keyword call with exactly the ``declared`` names (inputs, bound ones included) would get
        wrong: ``(input name, message)``, or ``(None, message)`` for a problem of the function itself."""
        out: list[tuple[str | None, str]] = []
        keywords_only = "a tool is called with keyword arguments only"
        for name in declared:
            if name in self.positional_only:
                why = f"is a positional-only parameter (before '/') of {self.signature}; {keywords_only}"
                out.append((name, f"{name!r} {why}"))
            elif name not in self.keyword and not self.var_keyword:
                out.append((name, f"{name!r} is not a parameter of {self.signature}, which has no **kwargs"))
        for name in self.required:
            if name in self.positional_only:
                why = f"requires the positional-only parameter {name!r}, but {keywords_only}"
                out.append((None, f"{self.signature} {why}: every call would fail"))
            elif name not in declared:
                why = "declare it (and bind it in bound_arguments if the model must not pass it)"
                out.append((None, f"{self.signature} requires {name!r}, which is not in inputs: {why}"))
        return out


@dataclass(frozen=True, slots=True)
class ToolFile:
    """What a trusted tool file's source says, learned without running it: the names its module level
    binds (``dynamic``: a star import or a module ``__getattr__`` may bind any), the functions whose
    signature is known, or why it cannot load."""

    names: frozenset[str] = frozenset()
    dynamic: bool = False
    error: str | None = None
    functions: Mapping[str, ToolFunction] = field(default_factory=dict)
    literals: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """Names surely bound to a literal, never callable: ``(line, what it is)``, e.g. ``(3, "an int")``."""
    main_only: frozenset[str] = frozenset()
    """Names bound only in an ``if __name__ == "__main__":`` block, which a worker never runs."""

    def binds(self, name: str) -> bool:
        return self.dynamic or name in self.names

    def function(self, name: str) -> ToolFunction | None:
        """The ``def`` that surely is ``name`` when the module is imported, or None when unknown."""
        return self.functions.get(name)

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
        except MemoryError:  # what CPython's parser raises for nesting deeper than its stack
            return cls(error="is not valid Python source: nested too deeply for the parser")
        bindings = _Bindings(tree)
        return cls(
            frozenset(bindings.counts),
            bindings.dynamic,
            functions=bindings.known_functions(),
            literals=bindings.known_literals(),
            main_only=frozenset(bindings.main_only) - frozenset(bindings.counts),
        )


class _Bindings:
    """One walk over a module's top level: how many places bind each name, its defs, its star imports."""

    def __init__(self, tree: ast.Module) -> None:
        self.counts: Counter[str] = Counter()
        self.defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.star_lines: list[int] = []
        self.assigned: dict[str, tuple[int, ast.expr]] = {
            target.id: (node.lineno, node.value)
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        self.main_only: Counter[str] = Counter()  # bound in an ``if __name__ == "__main__":`` block
        todo: list[tuple[ast.AST, Counter[str]]] = [(node, self.counts) for node in tree.body]
        while todo:
            node, counts = todo.pop()
            if isinstance(node, ast.If) and (runs := _main_guard(node.test)) is not None:
                # a worker imports the file under another name (never __main__): one branch never runs
                todo.append((node.test, counts))
                todo.extend((n, counts if runs else self.main_only) for n in node.body)
                todo.extend((n, self.main_only if runs else counts) for n in node.orelse)
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                counts[node.name] += 1
                if counts is self.main_only:
                    continue
                if not isinstance(node, ast.ClassDef):
                    self.defs.append(node)
                continue
            if isinstance(node, ast.Lambda):
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        if counts is self.counts:
                            self.star_lines.append(node.lineno)
                    else:
                        counts[alias.asname or alias.name.split(".")[0]] += 1
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                counts[node.id] += 1
            elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
                counts[node.name] += 1
            elif isinstance(node, ast.MatchMapping) and node.rest:
                counts[node.rest] += 1
            todo.extend((child, counts) for child in ast.iter_child_nodes(node))
        # A function may bind a module-level name through ``global`` when it is called (at import, or by
        # a later tool call): one more place that binds it.
        self.counts.update(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)
        self.dynamic = bool(self.star_lines) or "__getattr__" in self.counts
        self.rebinds_at_run_time = any(_binds_by_name(node) for node in ast.walk(tree))

    def known_functions(self) -> dict[str, ToolFunction]:
        """The defs whose name nothing else binds: not decorated (a decorator may return anything), the
        only binding of the name, and after every star import (which could rebind it)."""
        return {
            node.name: ToolFunction.of(node)
            for node in self.defs
            if not node.decorator_list
            and self.counts[node.name] == 1
            and all(line < node.lineno for line in self.star_lines)
        }

    def known_literals(self) -> dict[str, tuple[int, str]]:
        """The names whose only binding is a module-level assignment of a literal (after every star
        import), with its line and kind: ``x = 5`` makes ``x`` an int, which no worker can call."""
        out: dict[str, tuple[int, str]] = {}
        if self.rebinds_at_run_time:  # ``tool = None`` then ``globals()["tool"] = make()``: a placeholder
            return out
        for name, (line, value) in self.assigned.items():
            kind = _literal_kind(value)
            if kind and self.counts[name] == 1 and all(star < line for star in self.star_lines):
                out[name] = (line, kind)
        return out


#: Calls that may bind a module-level name no statement shows (``globals()["f"] = g``, ``setattr(...)``).
_NAME_BINDERS = frozenset({"globals", "vars", "locals", "setattr", "exec"})


def _main_guard(test: ast.expr) -> bool | None:
    """Whether an ``if`` on ``__name__`` runs its body in a worker, which imports the file under a name of
    its own, never ``"__main__"``: False for ``__name__ == "__main__"`` (either side first) or
    ``__name__ in ("__main__",)``, True for ``!=`` or ``not in``; ``not``, ``and`` and ``or`` of such tests
    as Python evaluates them (``__name__ == "__main__" and x`` never runs). None where it is not known:
    a test on anything else, or ``__name__ in`` names besides ``"__main__"``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _main_guard(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        known = [_main_guard(value) for value in test.values]
        decisive = isinstance(test.op, ast.Or)  # one True decides an ``or``, one False an ``and``
        if decisive in known:
            return decisive
        return None if None in known else not decisive
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op, sides = test.ops[0], (test.left, test.comparators[0])
    if isinstance(op, ast.Eq | ast.NotEq):
        named = any(_is_name(side) for side in sides)
        main = any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides)
        return isinstance(op, ast.NotEq) if named and main else None
    if isinstance(op, ast.In | ast.NotIn) and _is_name(test.left):
        names = test.comparators[0]
        only_main = (
            isinstance(names, ast.Tuple | ast.List | ast.Set)
            and names.elts
            and all(isinstance(e, ast.Constant) and e.value == "__main__" for e in names.elts)
        )
        return isinstance(op, ast.NotIn) if only_main else None
    return None


def _is_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "__name__"


def _binds_by_name(node: ast.AST) -> bool:
    """Whether ``node`` may bind a module-level name at run time: a call of one of :data:`_NAME_BINDERS`,
    or an assignment to an attribute of ``sys.modules[...]``."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _NAME_BINDERS
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Subscript)
        and isinstance(node.value.value, ast.Attribute)
        and node.value.value.attr == "modules"
    )


def _literal_kind(value: ast.expr) -> str | None:
    """What a literal expression makes ("an int", "a list"...), or None when it may be callable."""
    if isinstance(value, ast.Constant) and value.value is None:
        return "None"
    kind = type(value.value).__name__ if isinstance(value, ast.Constant) else _LITERALS.get(type(value))
    return None if kind is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


#: The literal expressions other than constants, by what they make.
_LITERALS: dict[type[ast.expr], str] = {
    ast.JoinedStr: "str",
    ast.List: "list",
    ast.ListComp: "list",
    ast.Tuple: "tuple",
    ast.Dict: "dict",
    ast.DictComp: "dict",
    ast.Set: "set",
    ast.SetComp: "set",
    ast.GeneratorExp: "generator",
}


def _yields(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``yield`` appears in the function's own body (not in a function or class nested in it)."""
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return False
