"""The grader's second layer: what the text of a TODO region may say, as an allowlist.

Before anything runs, each submitted region is read as Python syntax and checked against lists of
what is allowed, never against a list of what is not:

  - statements and expressions: every kind a learner writes (helpers, local classes, lambdas,
    comprehensions, `match`, async code, try/except, with) except `global`;
  - names: the function's own (its parameters and whatever the TODO or the given code binds in it),
    the chapter's module-level names, and the builtins in ALLOWED_BUILTINS. `getattr`, `hasattr` and
    `type` only as calls (they are replaced by guarded versions). A module that given code imported
    but a TODO may not use as a whole (os, socket) only as `os.getpid()` and the like;
  - attributes: any name but a dunder (each read is vetted at run time, koans.grading.runtime, which
    allows a private `_name` only of the chapter's own objects); of dunder names, only `__name__`,
    `__class__` and their like (ALLOWED_DUNDER_ATTRS), and `super().__init__`; in a class pattern
    (`case Point(x=...)`), only public names that are not a frame's or a generator's;
  - imports: the computing modules in ALLOWED_IMPORTS, by absolute name;
  - classes: no metaclass keyword; dunder methods from ALLOWED_CLASS_DUNDERS only (a class that
    answers == or len() its own way could fool a test's comparison);
  - annotations given as strings: plain type expressions only.

Each finding is (line, what, in words a learner can act on).
"""

from __future__ import annotations

import ast
import builtins

from koans.grading.runtime import (ALLOWED_CLASS_DUNDERS, ALLOWED_DUNDER_ATTRS, ALLOWED_MODULES, FRAME_ATTRIBUTES,
                                   NAMEDTUPLE_API, RESTRICTED_MODULES)

#: Modules a TODO may import (absolute names; a submodule of one is allowed when runtime allows it too). Of
#: os, socket, threading, logging and their like, only the attributes runtime lists can be read.
ALLOWED_IMPORTS = frozenset(name.split(".")[0] for name in (*ALLOWED_MODULES, *RESTRICTED_MODULES))

_SAFE_BUILTIN_FUNCTIONS = {
    "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
    "classmethod", "complex", "dict", "dir", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
    "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "memoryview", "min", "next",
    "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "staticmethod", "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis", "None", "True",
    "False",
}
#: Every builtin exception class but the two that end a process's run.
_EXCEPTIONS = {name for name, value in vars(builtins).items()
               if isinstance(value, type) and issubclass(value, BaseException)} - {"SystemExit", "KeyboardInterrupt"}
ALLOWED_BUILTINS = frozenset(_SAFE_BUILTIN_FUNCTIONS | _EXCEPTIONS)
#: Builtins that are replaced by guarded versions: allowed only as direct calls.
GUARDED_BUILTINS = frozenset({"getattr", "hasattr", "type"})
#: Dunder names a TODO may use as names: assigned in a class body, or the module's name (for a logger). Not
#: __match_args__: the names it lists are attributes that a class pattern reads, unchecked.
ALLOWED_DUNDER_NAMES = frozenset({"__slots__"})
ALLOWED_DUNDER_LOADS = frozenset({"__name__"})
#: Attribute names a class pattern may not read (`case object(gi_frame=f)`): frames, code, tracebacks.
FRAME_PREFIXES = FRAME_ATTRIBUTES
_TYPE_EXPRESSION = (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Constant, ast.BinOp, ast.BitOr,
                    ast.Load)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def bound_names(node: ast.AST) -> set[str]:
    """Every name bound anywhere inside `node`: assignments, parameters, defs, imports, loop and with targets,
    except-as, match captures, comprehension variables."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
            names.add(child.id)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in child.names}
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
            names.add(child.name)
        elif isinstance(child, ast.MatchMapping) and child.rest:
            names.add(child.rest)
    return names


def module_names(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names the pristine module binds at its top level, and of those, each bound by `import X` -> X."""
    names, modules = set(), {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                names.add(bound)
                modules[bound] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names, modules


class _RegionCheck(ast.NodeVisitor):
    """Walks one region's statements; `problems` gets (line, what) for everything not on the lists."""

    def __init__(self, function: ast.AST | None, given: set[str], modules: dict[str, str]):
        self.function = function
        self.local = bound_names(function) if function is not None else set()
        self.given, self.modules = given, modules
        self.problems: list[tuple[int, str]] = []
        self.allowed_receivers: set[int] = set()  # ids of Name nodes used as `module.attr` of a restricted module
        self.called: set[int] = set()  # ids of Name nodes that are the function of a call
        self.super_calls: set[int] = set()

    def bad(self, node: ast.AST, what: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), what))

    # ---------------------------------------------------------------- names

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if _is_dunder(name):
            if not ((name in ALLOWED_DUNDER_NAMES and isinstance(node.ctx, ast.Store))
                    or (name in ALLOWED_DUNDER_LOADS and isinstance(node.ctx, ast.Load))):
                self.bad(node, f"the name {name} (dunder names reach the interpreter's internals)")
            return
        if not isinstance(node.ctx, ast.Load) or name in self.local:
            return
        if name in self.given:
            module = self.modules.get(name)
            if module in RESTRICTED_MODULES:
                if id(node) not in self.allowed_receivers:
                    allowed = ", ".join(f"{name}.{a}" for a in sorted(RESTRICTED_MODULES[module]))
                    self.bad(node, f"{name} used other than as {allowed}")
                return
            if module is None or module in ALLOWED_MODULES or module.split(".")[0] in ALLOWED_IMPORTS:
                return
            self.bad(node, f"the module {name} (given code uses it; a TODO may not)")
            return
        if name in GUARDED_BUILTINS:
            if id(node) not in self.called:
                self.bad(node, f"{name} used other than called directly, as {name}(...)")
            return
        if name not in ALLOWED_BUILTINS:
            self.bad(node, f"the name {name}: it is not defined in your code or the chapter, and it is not one of the "
                           "builtins a TODO may use (eval, exec, open, globals, vars, setattr, __import__ and the "
                           "like are not)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name, base = node.attr, node.value
        if _is_dunder(name):
            is_super_init = (name in ("__init__", "__post_init__") and isinstance(base, ast.Call)
                             and isinstance(base.func, ast.Name) and base.func.id == "super")
            if not (is_super_init or (name in ALLOWED_DUNDER_ATTRS and isinstance(node.ctx, ast.Load))):
                self.bad(node, f"the attribute .{name} (dunder attributes reach the interpreter's internals)")
        if isinstance(base, ast.Name) and base.id in self.modules and self.modules[base.id] in RESTRICTED_MODULES:
            if name in RESTRICTED_MODULES[self.modules[base.id]] and isinstance(node.ctx, ast.Load):
                self.allowed_receivers.add(id(base))
        self.generic_visit(node)

    # ---------------------------------------------------------------- calls, imports, definitions

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name):
            self.called.add(id(node.func))
            if node.func.id == "getattr":
                literal = node.args[1] if len(node.args) > 1 else None
                if isinstance(literal, ast.Constant) and isinstance(literal.value, str) and _is_dunder(literal.value) \
                        and literal.value not in ALLOWED_DUNDER_ATTRS:
                    self.bad(node, f"getattr() with the dunder name {literal.value!r}")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_IMPORTS:
                self.bad(node, f"import {alias.name} (a TODO may import only: {', '.join(sorted(ALLOWED_IMPORTS))})")
            if alias.asname and _is_dunder(alias.asname):
                self.bad(node, f"import as {alias.asname}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in ALLOWED_IMPORTS:
            self.bad(node, f"from {'.' * node.level}{node.module or ''} import ... (a TODO may import only: "
                           f"{', '.join(sorted(ALLOWED_IMPORTS))})")
        for alias in node.names:
            if alias.name == "*" or alias.name.startswith("_") or (alias.asname and _is_dunder(alias.asname)):
                self.bad(node, f"from {node.module} import {alias.name}")

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:  # a class pattern reads these attributes of the subject
            if (_is_dunder(name) and name not in ALLOWED_DUNDER_ATTRS) or name.startswith(FRAME_PREFIXES) or (
                    name.startswith("_") and not _is_dunder(name) and name not in NAMEDTUPLE_API):
                self.bad(node, f"the class pattern's attribute {name} (a pattern may read only public attributes "
                               "of what it matches)")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.bad(node, f"global {', '.join(node.names)} (a TODO may not rebind the chapter's module-level names)")

    def _check_function(self, node) -> None:
        for annotation in self._annotations(node):
            self._check_annotation(annotation)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _check_function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_annotation(node.annotation)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.keywords:
            self.bad(node, f"class {node.name} with keywords (a metaclass builds classes its own way)")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_dunder(item.name) \
                    and item.name not in ALLOWED_CLASS_DUNDERS:
                self.bad(item, f"the method {item.name} in class {node.name}: a TODO's class may define only "
                               f"{', '.join(sorted(ALLOWED_CLASS_DUNDERS))} (the tests compare what your code "
                               "answers with ==, <, len() and bool(): use a dataclass, a tuple or a dict for "
                               "values that compare)")
        self.generic_visit(node)

    @staticmethod
    def _annotations(node) -> list[ast.AST]:
        if isinstance(node, ast.Lambda):
            return []
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        return [a.annotation for a in every if a.annotation is not None] + ([node.returns] if node.returns else [])

    def _check_annotation(self, annotation: ast.AST) -> None:
        for node in ast.walk(annotation):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    parsed = ast.parse(node.value, mode="eval").body
                except SyntaxError:
                    parsed = None
                if parsed is None or not all(isinstance(n, _TYPE_EXPRESSION) for n in ast.walk(parsed)) or any(
                        isinstance(n, ast.Attribute) and n.attr.startswith("_") for n in ast.walk(parsed)) or any(
                        isinstance(n, ast.Name) and _is_dunder(n.id) for n in ast.walk(parsed)):
                    self.bad(node, f"the annotation {node.value!r}: a string annotation must be a plain type, "
                                   "such as 'torch.Tensor' or 'list[int]'")


def check_region(statements: list[ast.stmt], function: ast.AST | None, given: set[str],
                 modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line, what) for each thing in one region's statements that is not on the lists."""
    checker = _RegionCheck(function, set(given), dict(modules))
    for statement in statements:
        # calls first, so that a Name knows whether it is called when it is visited
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                checker.called.add(id(node.func))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and checker.modules.get(node.value.id) in RESTRICTED_MODULES \
                    and node.attr in RESTRICTED_MODULES[checker.modules[node.value.id]] \
                    and isinstance(node.ctx, ast.Load):
                checker.allowed_receivers.add(id(node.value))
        checker.visit(statement)
    return sorted(set(checker.problems))
