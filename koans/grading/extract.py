"""The grader's first layer: take only the TODO regions of a submitted chapter file.

The autograder calls `extract` on every submitted chapter file. It

  1. finds the submitted file's TODO regions by aligning it, line by line, with the pristine stub
     (the given code around each region anchors it; blank lines and trailing spaces do not count);
  2. writes the file to grade: the pristine stub, with each stub's `raise NotImplementedError(...)`
     (and the comments above it) replaced by what the submission holds there. Given code and
     module-level code of the submission are never used: what changed there is only reported;
  3. checks that each region's statements sit where the stub was (same function, same block; a region
     cannot close its function and start module-level code), by comparing the two files' ASTs with
     the regions taken out;
  4. checks each region against the allowlist (koans.grading.allowlist).

A refused file scores 0 for its chapter; each finding says file:line and what was found. The regions'
lines in the graded file go with it, for the run-time guards (koans.grading.rewrite).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from koans.grading.allowlist import check_region, module_names
from koans.course.todos import Todo


@dataclass
class Extracted:
    """What `extract` made of one submitted chapter file."""

    name: str  # "ch04_controllers.py"
    text: str | None  # the file to grade (pristine + submitted regions); None when refused
    refused: list[str] = field(default_factory=list)  # "file:line: what", each a reason for 0
    notes: list[str] = field(default_factory=list)  # what was ignored (given code changed, code outside a TODO)
    written: list[str] = field(default_factory=list)  # keys of the TODOs whose stub was replaced
    regions: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last line in `text`, TODO key)


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
    given, modules = module_names(pristine_tree)
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
        result.regions = [(lo, hi, todo.key) for (lo, hi), (todo, _, _) in zip(ranges, regions)]
    return result
