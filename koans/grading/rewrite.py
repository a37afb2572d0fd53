"""Compile a graded chapter file with the run-time guards in its TODO regions (the grader's third layer).

`compile_graded(text, path, regions)` parses the graded file, rewrites only the statements on the
regions' lines (koans.grading.runtime's docstring lists what becomes what), adds two lines at the top
that install the guards, and returns the bytes of a .pyc for it. `write_pyc` puts them where Python
looks first: `__pycache__/<name>.cpython-3XX.pyc`, as an *unchecked* hash-based pyc (PEP 552), which
Python loads without comparing it with the source. Every process that imports the module (the
tests' process and every Monarch process) therefore runs the guarded code, while tracebacks still
show the file's own lines: the rewrite keeps every line number.
"""

from __future__ import annotations

import ast
import importlib.util
import marshal
from pathlib import Path

from koans.grading.allowlist import bound_names

GUARDED_CALLS = {"getattr": "__koans_getattr__", "hasattr": "__koans_hasattr__", "type": "__koans_type__"}


def _name(identifier: str, node: ast.AST) -> ast.Name:
    return ast.copy_location(ast.Name(identifier, ast.Load()), node)


def _call(function: str, node: ast.AST, *args: ast.expr) -> ast.Call:
    return ast.copy_location(ast.Call(_name(function, node), list(args), []), node)


class _Guard(ast.NodeTransformer):
    """Rewrites one region's statements; `local` are the names its function binds (they shadow builtins)."""

    def __init__(self, local: set[str]):
        self.local = local

    def visit_Attribute(self, node: ast.Attribute):
        node.value = self.visit(node.value)
        if isinstance(node.ctx, ast.Load):
            return _call("__koans_attr__", node, node.value, ast.copy_location(ast.Constant(node.attr), node))
        node.value = _call("__koans_writable__", node, node.value, ast.copy_location(ast.Constant(node.attr), node))
        return node

    def visit_Subscript(self, node: ast.Subscript):
        node = self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            node.value = _call("__koans_writable__", node, node.value, ast.copy_location(ast.Constant(None), node))
        return node

    def visit_Call(self, node: ast.Call):
        node = self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in GUARDED_CALLS and node.func.id not in self.local:
            node.func = _name(GUARDED_CALLS[node.func.id], node.func)
        return node

    def _vet_bound(self, node, names: list[str]):
        """After an import: each name bound to what vet hands back (the value, or its guarded stand-in)."""
        checks = [ast.copy_location(ast.Assign([ast.copy_location(ast.Name(name, ast.Store()), node)],
                                               _call("__koans_vet__", node, _name(name, node))), node) for name in names]
        return [node, *checks]

    def visit_Import(self, node: ast.Import):
        return self._vet_bound(node, [alias.asname or alias.name.split(".")[0] for alias in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom):
        return self._vet_bound(node, [alias.asname or alias.name for alias in node.names])

    def visit_ClassDef(self, node: ast.ClassDef):
        node = self.generic_visit(node)
        node.decorator_list.insert(0, _name("__koans_class__", node))  # outermost: sees the finished class
        node.decorator_list.append(_name("__koans_class_made__", node))  # innermost: the class is the TODO's own
        return node

    def visit_match_case(self, node: ast.match_case):
        # a pattern is not an expression (no call may stand there), but a class pattern reads attributes of the
        # subject: every name it captures is vetted before the guard and the body see it
        captured = sorted({n.name for n in ast.walk(node.pattern) if isinstance(n, (ast.MatchAs, ast.MatchStar))
                           and n.name} | {n.rest for n in ast.walk(node.pattern)
                                          if isinstance(n, ast.MatchMapping) and n.rest})
        if node.guard is not None:
            node.guard = self.visit(node.guard)
        if captured:
            vetted = ast.copy_location(ast.Tuple([_call("__koans_captured__", node.pattern, _name(n, node.pattern))
                                                  for n in captured], ast.Load()), node.pattern)
            node.guard = ast.copy_location(ast.BoolOp(ast.Or(), [ast.Compare(
                vetted, [ast.Eq()], [ast.copy_location(ast.Constant(None), node.pattern)]),
                node.guard or ast.copy_location(ast.Constant(True), node.pattern)]), node.pattern)
        node.body = [self.visit(statement) for statement in node.body]
        node.body = [s for item in node.body for s in (item if isinstance(item, list) else [item])]
        return node


def _in_regions(node: ast.stmt, regions) -> bool:
    return any(first <= node.lineno <= last for first, last, _ in regions)


def _rewrite_block(body: list, regions, local: set[str]) -> list:
    """The statements of one block, each in a region rewritten; others searched for regions inside."""
    out = []
    for statement in body:
        if isinstance(statement, ast.stmt) and _in_regions(statement, regions):
            done = _Guard(local).visit(statement)
            out.extend(done if isinstance(done, list) else [done])
            continue
        function_local = bound_names(statement) if isinstance(statement, (ast.FunctionDef,
                                                                          ast.AsyncFunctionDef)) else local
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(statement, field_name, None)
            if isinstance(block, list) and block:
                setattr(statement, field_name, _rewrite_block(block, regions, function_local))
        out.append(statement)
    return out


def _prologue(tree: ast.Module, regions) -> int:
    """Where the guards are installed: after the docstring and `from __future__` imports."""
    at = 0
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        at = 1
    while at < len(body) and isinstance(body[at], ast.ImportFrom) and body[at].module == "__future__":
        at += 1
    return at


def compile_graded(text: str, path: str, regions: list[tuple[int, int, str]]):
    """The code object of a graded chapter file, its TODO regions guarded (see the module's doc)."""
    tree = ast.parse(text, filename=path)
    tree.body = _rewrite_block(tree.body, regions, set())
    at = _prologue(tree, regions)
    anchor = tree.body[at] if at < len(tree.body) else tree.body[-1]
    install = ast.parse("import koans.grading.runtime as __koans_runtime__\n"
                        f"__koans_runtime__.install(globals(), {[list(r) for r in regions]!r})\n").body
    for statement in install:
        for node in ast.walk(statement):
            ast.copy_location(node, anchor)
            node.end_lineno = anchor.lineno
    tree.body[at:at] = install
    ast.fix_missing_locations(tree)
    return compile(tree, path, "exec", dont_inherit=True)


def write_pyc(source_path: Path, code) -> Path:
    """Put `code` where Python loads it for `source_path` without comparing it with the source."""
    source = source_path.read_bytes()
    target = Path(importlib.util.cache_from_source(str(source_path)))
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source (PEP 552)
    target.write_bytes(importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code))
    return target
