"""Trust nothing in a submission: take only its TODO regions, and refuse escape hatches before anything runs.

The autograder (koans.autograder) calls `extract` on every submitted chapter file. It

  1. finds the submitted file's TODO regions by aligning it, line by line, with the pristine stub
     (the given code around each region anchors it; blank lines and trailing spaces do not count);
  2. writes the file to grade: the pristine stub, with each stub's `raise NotImplementedError(...)`
     (and the comments above it) replaced by what the submission holds there. Given code and
     module-level code of the submission are never used: what changed there is only reported;
  3. checks that each region's statements sit where the stub was (same function, same block; a region
     cannot close its function and start module-level code), by comparing the two files' ASTs with
     the regions taken out;
  4. refuses, by a static walk of each region's AST, what a learner never needs and an attacker
     does: dunder names and attributes, sys/gc/builtins/importlib/subprocess/ctypes/inspect...,
     globals/locals/vars/eval/exec/compile/open/__import__, getattr on a name that is not a literal
     or a parameter, setattr/delattr, frame and code internals, private attributes of modules,
     os other than getpid & co, imports outside an allowlist, writing to attributes of given
     classes or modules, `global`, pytest hooks, SystemExit/KeyboardInterrupt, format strings that
     walk attributes, and the known routes from torch and asyncio to processes, files and C code.

A refused file scores 0 for its chapter; each finding says file:line and what was found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from koans.stubgen import Todo

#: Modules a TODO may import (the top-level name). Computing and concurrency only: nothing that reaches
#: the interpreter, the file system, processes or the network.
ALLOWED_IMPORTS = frozenset({
    "math", "cmath", "random", "statistics", "numbers", "decimal", "fractions", "collections", "itertools",
    "functools", "heapq", "bisect", "dataclasses", "typing", "enum", "time", "datetime", "asyncio", "contextlib",
    "abc", "copy", "json", "re", "textwrap", "uuid", "hashlib", "struct", "array", "queue", "torch", "monarch",
})

#: Names a TODO may not use at all.
DENIED_NAMES = frozenset({
    "sys", "gc", "builtins", "importlib", "subprocess", "ctypes", "inspect", "globals", "locals", "vars", "eval",
    "exec", "compile", "open", "breakpoint", "input", "exit", "quit", "help", "setattr", "delattr", "memoryview",
    "SystemExit", "KeyboardInterrupt", "GeneratorExit", "shutil", "pathlib", "Path", "signal", "threading",
    "multiprocessing", "pickle", "marshal", "types", "traceback", "solutions", "exercises", "tests", "koans",
    "conftest", "pytest", "_pytest", "pluggy", "io", "tempfile", "resource", "posix", "pty", "mmap", "code",
})

#: Modules a given import may have brought into the chapter, and the attributes a TODO may use on them.
SAFE_MODULE_ATTRS = {"os": frozenset({"getpid", "getppid", "cpu_count", "sep", "linesep", "getenv"}),
                     "socket": frozenset({"gethostname"})}

#: Attribute names a TODO may not touch, on anything.
DENIED_ATTRS = frozenset({
    # the interpreter and its modules
    "sys", "os", "gc", "builtins", "modules", "importlib", "subprocess", "ctypes", "inspect", "meta_path",
    "path_hooks", "settrace", "setprofile", "addaudithook", "excepthook", "stdout", "stderr", "stdin",
    # frames, code and generator internals
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "gi_frame", "gi_code", "cr_frame",
    "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code", "co_consts", "func_globals", "get_stack",
    "print_stack", "format_map",
    # processes, signals, files
    "system", "popen", "Popen", "fork", "forkpty", "execv", "execve", "execl", "spawnv", "_exit", "abort", "kill",
    "killpg", "create_subprocess_exec", "create_subprocess_shell", "add_signal_handler", "remove",
    "unlink", "rmtree", "write_text", "write_bytes", "chmod", "rename", "open", "save", "from_file",
    # torch's routes to C code, other processes and code generation
    "cpp_extension", "load_inline", "load_library", "ops", "classes", "library", "hub", "multiprocessing",
    "jit", "fx", "package", "compile", "_C",
})

#: Methods a TODO may define on a helper class of its own (other dunders run at odd times or on unpickling).
ALLOWED_DUNDER_DEFS = frozenset({
    "__init__", "__repr__", "__str__", "__eq__", "__ne__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__",
    "__len__", "__iter__", "__next__", "__aiter__", "__anext__", "__contains__", "__getitem__", "__bool__",
    "__call__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__post_init__",
})

DUNDER = re.compile(r"^__\w+__$")
DUNDER_IN_TEXT = re.compile(r"__\w+__")


@dataclass
class Extracted:
    """What `extract` made of one submitted chapter file."""

    name: str  # "ch04_controllers.py"
    text: str | None  # the file to grade (pristine + submitted regions); None when refused
    refused: list[str] = field(default_factory=list)  # "file:line: what", each a reason for 0
    notes: list[str] = field(default_factory=list)  # what was ignored (given code changed, code outside a TODO)
    written: list[str] = field(default_factory=list)  # keys of the TODOs whose stub was replaced


# ---------------------------------------------------------------- aligning a submission with the stub


def _stub_regions(lines: list[str], todos: list[Todo]) -> list[tuple[Todo, int, int]]:
    """(todo, first, last) 0-based line indices of each TODO's guidance + stub line in the pristine stub."""
    found, cursor = [], 0
    for todo in todos:
        at = next(i for i in range(cursor, len(lines)) if lines[i] == todo.stub_line)
        found.append((todo, at - len(todo.guidance), at))
        cursor = at + 1
    return found


def _norm(line: str) -> str:
    return line.rstrip()


def _place_exact(segments: list[list[str]], sub: list[str]) -> list[int] | None:
    """Start index in `sub` of each given segment, in order, the first at 0 and the last at the end."""
    budget = [20000]

    def place(i: int, start: int) -> list[int] | None:
        seg = segments[i]
        last = i == len(segments) - 1
        candidates = [len(sub) - len(seg)] if last else (
            [0] if i == 0 else range(start, len(sub) - len(seg) + 1))
        for p in candidates:
            budget[0] -= 1
            if budget[0] < 0 or p < start:
                return None
            if sub[p:p + len(seg)] == seg:
                if last:
                    return [p]
                rest = place(i + 1, p + len(seg))
                if rest is not None:
                    return [p] + rest
        return None

    return place(0, 0)


def _align_dp(tokens: list, sub: list[str]) -> tuple[dict[int, tuple[int, int]], list[int], list[int]]:
    """Least-edit alignment of pristine tokens (a line, or ("wild", i): any run of lines) with `sub`.

    Returns {region i: (start, stop) in sub}, the sub indices inserted outside any region, the token
    indices of given lines missing from the submission."""
    n, m = len(tokens), len(sub)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    move = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0
    for a in range(n + 1):
        row, prev = cost[a], cost[a - 1] if a else None
        token = tokens[a - 1] if a else None
        best, best_at = inf, 0
        for b in range(m + 1):
            if a:
                if isinstance(token, tuple):  # a region: absorbs sub[b0:b] for free
                    if prev[b] < best:
                        best, best_at = prev[b], b
                    if best < row[b]:
                        row[b], move[a][b] = best, ("wild", best_at)
                else:
                    if prev[b] + 1 < row[b]:
                        row[b], move[a][b] = prev[b] + 1, ("delete",)
                    if b and sub[b - 1] == token and prev[b - 1] < row[b]:
                        row[b], move[a][b] = prev[b - 1], ("match",)
            if b and row[b - 1] + 1 < row[b]:
                row[b], move[a][b] = row[b - 1] + 1, ("insert",)
    regions, inserted, deleted = {}, [], []
    a, b = n, m
    while a or b:
        step = move[a][b]
        if step[0] == "wild":
            regions[tokens[a - 1][1]] = (step[1], b)
            a, b = a - 1, step[1]
        elif step[0] == "delete":
            deleted.append(a - 1)
            a -= 1
        elif step[0] == "match":
            a, b = a - 1, b - 1
        else:
            inserted.append(b - 1)
            b -= 1
    return regions, sorted(inserted), sorted(deleted)


# ---------------------------------------------------------------- the shape check: regions stay where the stubs were


def _skeleton(node: ast.AST, ranges: list[tuple[int, int]], out: list, scopes: list, found: list) -> str:
    """ast.dump without positions, each region's statements replaced by one placeholder. `found` gets
    (range index, statements, enclosing function node) for each region met."""
    if isinstance(node, list):
        parts, i = [], 0
        while i < len(node):
            item = node[i]
            hit = next((k for k, (lo, hi) in enumerate(ranges)
                        if isinstance(item, ast.stmt) and lo <= item.lineno <= hi), None)
            if hit is None:
                parts.append(_skeleton(item, ranges, out, scopes, found))
                i += 1
                continue
            run = []
            while i < len(node) and isinstance(node[i], ast.stmt) and ranges[hit][0] <= node[i].lineno <= ranges[hit][1]:
                run.append(node[i])
                i += 1
            found.append((hit, run, scopes[-1] if scopes else None))
            parts.append(f"<REGION {hit}>")
        return "[" + ", ".join(parts) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    is_scope = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    if is_scope:
        scopes.append(node)
    fields = ", ".join(f"{name}={_skeleton(value, ranges, out, scopes, found)}" for name, value in ast.iter_fields(node))
    if is_scope:
        scopes.pop()
    return f"{type(node).__name__}({fields})"


# ---------------------------------------------------------------- the static check of one region


def _root_name(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _bound_names(target: ast.AST) -> list[str]:
    """The plain names an assignment target binds (not those it writes attributes or items of)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _bound_names(element)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _params(function: ast.AST | None) -> set[str]:
    if function is None:
        return set()
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return set(names)


def _module_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound at module level in the pristine file, and those of them bound by imports."""
    names, modules = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                names.add(bound)
                if isinstance(node, ast.Import):
                    modules.add(bound)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names, modules


class _RegionCheck(ast.NodeVisitor):
    """Walks one region's statements; `problems` gets (line, what) for each escape hatch."""

    def __init__(self, params: set[str], given: set[str], modules: set[str]):
        self.params, self.given, self.modules = params, given, modules
        self.problems: list[tuple[int, str]] = []
        self.tainted: set[str] = set()  # locals that may hold a given class, function or module
        self.assigned: set[str] = set()

    def bad(self, node: ast.AST, what: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), what))

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        if DUNDER.match(node.id):
            self.bad(node, f"the name {node.id} (dunder names reach the interpreter's internals)")
        elif node.id in DENIED_NAMES:
            self.bad(node, f"the name {node.id} (not needed by any TODO; it reaches the interpreter, files or the grader)")
        elif node.id in SAFE_MODULE_ATTRS and not getattr(node, "_koans_safe", False):
            allowed = ", ".join(sorted(SAFE_MODULE_ATTRS[node.id]))
            self.bad(node, f"{node.id} used other than as {node.id}.<{allowed}>")
        elif node.id in ("getattr",) and not getattr(node, "_koans_called", False):
            self.bad(node, "getattr used other than called directly")
        if isinstance(node.ctx, ast.Store):
            self.assigned.add(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if DUNDER.match(node.attr):
            self.bad(node, f"the attribute .{node.attr} (dunder attributes reach the interpreter's internals)")
        elif node.attr in DENIED_ATTRS:
            self.bad(node, f"the attribute .{node.attr} (it reaches the interpreter, processes, files or C code)")
        elif node.attr.startswith("_") and isinstance(_root_name(base), ast.Name) and (
                _root_name(base).id in self.modules or _root_name(base).id in ALLOWED_IMPORTS):
            self.bad(node, f"the private attribute .{node.attr} of a module")
        if isinstance(base, ast.Name) and base.id in SAFE_MODULE_ATTRS and node.attr in SAFE_MODULE_ATTRS[base.id]:
            base._koans_safe = True
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node)
        self.generic_visit(node)

    def _check_store(self, node: ast.AST) -> None:
        root = _root_name(node)
        if not isinstance(root, ast.Name):
            self.bad(node, f"writing to {ast.unparse(node)}, which is not an attribute of a local variable")
        elif root.id in self.given and root.id not in self.params and root.id not in self.assigned:
            self.bad(node, f"writing to {ast.unparse(node)}: {root.id} is given code (monkeypatching)")
        elif root.id in self.tainted:
            self.bad(node, f"writing to {ast.unparse(node)}: {root.id} may hold given code (monkeypatching)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._taint(node.targets, node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._taint([node.target], node.value)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._taint([node.target], node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self._taint([item.optional_vars], item.context_expr)
        self.generic_visit(node)

    visit_AsyncWith = visit_With

    def _taint(self, targets: list[ast.AST], value: ast.AST) -> None:
        """A local bound to an expression that holds a given name other than as the function it calls may be
        an alias of given code: writing to its attributes is refused."""
        called = {id(n.func) for n in ast.walk(value) if isinstance(n, ast.Call)}
        risky = any(isinstance(n, ast.Name) and id(n) not in called and (n.id in self.given or n.id in self.tainted)
                    and n.id not in self.params for n in ast.walk(value))
        if risky:
            for target in targets:
                self.tainted |= set(_bound_names(target))

    # calls
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr"):
            func._koans_called = True
            name = node.args[1] if len(node.args) > 1 else None
            literal = isinstance(name, ast.Constant) and isinstance(name.value, str) and not name.value.startswith("_")
            parameter = isinstance(name, ast.Name) and name.id in self.params and name.id not in self.assigned
            if not (literal or parameter) or node.keywords or len(node.args) > 3:
                self.bad(node, f"{func.id}() with a name that is neither a plain literal nor a parameter of the function")
        if isinstance(func, ast.Attribute) and func.attr == "format":
            receiver = func.value
            if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)
                    and not re.search(r"\{[^}]*[.\[]", receiver.value)):
                self.bad(node, ".format() on a string that is not a literal, or whose fields reach attributes")
        self.generic_visit(node)

    # statements
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_IMPORTS:
                self.bad(node, f"import {alias.name} (a TODO may import only: {', '.join(sorted(ALLOWED_IMPORTS))})")
            bound = alias.asname or alias.name.split(".")[0]
            self.modules.add(bound)
            self.assigned.add(bound)
            if alias.asname and DUNDER.match(alias.asname):
                self.bad(node, f"import as {alias.asname}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in ALLOWED_IMPORTS:
            self.bad(node, f"from {'.' * node.level}{node.module or ''} import ... (a TODO may import only: "
                           f"{', '.join(sorted(ALLOWED_IMPORTS))})")
        for alias in node.names:
            if alias.name == "*" or alias.name.startswith("_") or alias.name in DENIED_NAMES | DENIED_ATTRS:
                self.bad(node, f"from {node.module} import {alias.name}")
            self.assigned.add(alias.asname or alias.name)

    def visit_Global(self, node: ast.Global) -> None:
        self.bad(node, f"global {', '.join(node.names)} (a TODO may not rebind module-level names)")

    def _check_def(self, node) -> None:
        if node.name.startswith("pytest_"):
            self.bad(node, f"a function named {node.name} (a pytest hook)")
        elif DUNDER.match(node.name) and node.name not in ALLOWED_DUNDER_DEFS:
            self.bad(node, f"a method named {node.name}")
        self.assigned.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _check_def

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.keywords:
            self.bad(node, f"class {node.name} with keywords (a metaclass)")
        self.assigned.add(node.name)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and DUNDER_IN_TEXT.search(node.value):
            self.bad(node, f"the string {node.value[:40]!r}, which names a dunder attribute")


def check_region(statements: list[ast.stmt], function: ast.AST | None, given: set[str], modules: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each escape hatch in one region's statements."""
    checker = _RegionCheck(_params(function), set(given), set(modules))
    # names bound in the function outside the region are its locals too (given code sets them up)
    if function is not None:
        checker.assigned |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for statement in statements:
        checker.visit(statement)
    return sorted(set(checker.problems))


# ---------------------------------------------------------------- extract


def extract(name: str, pristine: str, submitted: str, todos: list[Todo]) -> Extracted:
    """The file to grade for one submitted chapter file (see the module's doc), or why it is refused."""
    result = Extracted(name, None)
    plines = pristine.splitlines()
    slines = submitted.replace("\r\n", "\n").replace("\r", "\n").splitlines()
    regions = _stub_regions(plines, todos)

    # the given segments between regions, as non-blank normalised lines
    segments, bounds, cursor = [], [], 0
    for _, first, last in regions:
        segments.append([_norm(line) for line in plines[cursor:first] if line.strip()])
        cursor = last + 1
    segments.append([_norm(line) for line in plines[cursor:] if line.strip()])
    sub_index = [i for i, line in enumerate(slines) if line.strip()]  # non-blank submission lines
    sub = [_norm(slines[i]) for i in sub_index]

    placed = _place_exact(segments, sub) if all(segments[1:-1]) else None
    spans: dict[int, tuple[int, int]] = {}
    if placed is not None:
        for i in range(len(regions)):
            spans[i] = (placed[i] + len(segments[i]), placed[i + 1])
    else:  # given code was changed: the least-edit alignment says where, and where the regions are
        tokens, token_lines = [], []
        cursor = 0
        for i, (_, first, last) in enumerate(regions):
            for k in range(cursor, first):
                if plines[k].strip():
                    tokens.append(_norm(plines[k]))
                    token_lines.append(k)
            tokens.append(("wild", i))
            token_lines.append(None)
            cursor = last + 1
        for k in range(cursor, len(plines)):
            if plines[k].strip():
                tokens.append(_norm(plines[k]))
                token_lines.append(k)
        spans, inserted, deleted = _align_dp(tokens, sub)
        for b in inserted:
            result.notes.append(f"{name}:{sub_index[b] + 1}: code outside every TODO was added or changed; it is "
                                "ignored (only TODO regions are graded)")
        for a in deleted:
            result.notes.append(f"{name}: given line {token_lines[a] + 1} of the stub was changed or removed; "
                                "the original is used")

    # the file to grade: pristine, with each region's submitted lines (blank lines inside kept)
    out: list[str] = []
    ranges: list[tuple[int, int]] = []  # 1-based line ranges of the regions in `out`
    region_sub_lines: list[int] = []  # the first submission line of each region, for messages
    cursor = 0
    for i, (todo, first, last) in enumerate(regions):
        out.extend(plines[cursor:first])
        start, stop = spans.get(i, (0, 0))
        if stop > start:
            body = slines[sub_index[start]:sub_index[stop - 1] + 1]
            offset = sub_index[start]
        else:
            body = plines[first:last + 1]  # nothing written there: the stub stays
            offset = None
        if body == plines[first:last + 1]:
            offset = None
        else:
            result.written.append(todo.key)
        ranges.append((len(out) + 1, len(out) + len(body)))
        region_sub_lines.append(offset)
        out.extend(body)
        cursor = last + 1
    out.extend(plines[cursor:])
    text = "\n".join(out) + "\n"

    def where(i: int, line: int) -> str:
        """The submission's line for line `line` of the graded file (in region i)."""
        if region_sub_lines[i] is None:
            return f"{name}:{line}"
        return f"{name}:{region_sub_lines[i] + line - ranges[i][0] + 1}"

    try:
        tree = ast.parse(text, filename=name)
    except SyntaxError as err:
        at = next((i for i, (lo, hi) in enumerate(ranges) if lo <= (err.lineno or 0) <= hi), None)
        spot = where(at, err.lineno) if at is not None else f"{name}:{err.lineno}"
        result.refused.append(f"{spot}: the file does not parse here ({err.msg}); a TODO must be complete Python "
                              "statements inside its function")
        return result
    pristine_tree = ast.parse(pristine, filename=name)
    pristine_ranges = [(first + 1, last + 1) for _, first, last in regions]
    expected = _skeleton(pristine_tree, pristine_ranges, [], [], [])
    found: list = []
    actual = _skeleton(tree, ranges, [], [], found)
    if expected != actual:
        missing = [i for i in range(len(ranges)) if not any(f[0] == i for f in found)]
        written = [i for i in range(len(ranges)) if region_sub_lines[i] is not None]
        culprit = (missing + written or [None])[0]
        spot = where(culprit, ranges[culprit][0]) if culprit is not None else name
        result.refused.append(f"{spot}: code in a TODO reaches outside its function's block (it changes the given "
                              "code's structure)")
        return result
    given, modules = _module_names(pristine_tree)
    for i, statements, function in found:
        if region_sub_lines[i] is None:
            continue  # the stub as given: nothing of the submission's
        for statement in statements:
            if (statement.end_lineno or statement.lineno) > ranges[i][1]:
                result.refused.append(f"{where(i, statement.lineno)}: a statement of TODO {regions[i][0].key} runs "
                                      "past its region")
        for line, what in check_region(statements, function, given, modules):
            result.refused.append(f"{where(i, line)}: in TODO {regions[i][0].key}: {what}")
    if not result.refused:
        result.text = text
    return result
