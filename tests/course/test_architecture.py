"""The layout of koans/: one package per concern, and imports that go one way only.

Each package has a rank; a module may import its own package and packages of lower rank, nothing else:

    course 0  <-  testkit 1  <-  learn 2, grading 2, bench 2  <-  maintain 3  <-  cli 4

Nothing imports koans/cli.py (koans/__main__.py, the `python -m koans` entry, counts as part of it).
Every import counts, those inside functions too, and the modules' import graph has no cycle.
docs/appendix/maintainers.md explains the rule; this file holds it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from koans.course.manifest import PROJECT_ROOT

KOANS = PROJECT_ROOT / "koans"

#: A package's rank: it may import packages of lower rank, and its own.
RANKS = {"course": 0, "testkit": 1, "learn": 2, "grading": 2, "bench": 2, "maintain": 3, "cli": 4}
#: The runner's modules stay short enough to read in one sitting.
MOST_LINES = 400
SHORT_PACKAGES = ("learn", "testkit")


def module_name(koans_dir: Path, path: Path) -> str:
    """'koans.learn.runner' for koans/learn/runner.py; 'koans.course' for koans/course/__init__.py."""
    parts = ("koans",) + path.relative_to(koans_dir).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str | None:
    """The package a koans module belongs to (its rank's key): 'learn' for koans.learn.runner, 'cli' for
    koans.cli and koans.__main__; None for the top package `koans` itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def imports_of(module: str, path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module imported) for every import of koans in the file, at any depth (functions included).
    `from koans.x import y` names koans.x.y when that is a module, else koans.x."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "koans"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "koans":
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((node.lineno, candidate if candidate in modules else base))
    return found


def import_problems(koans_dir: Path) -> list[str]:
    """What breaks the one-way rule in the package at `koans_dir`: an import of a package of equal or higher
    rank than the importer's own (or of an unknown one), and each cycle of the modules' import graph."""
    files = {module_name(koans_dir, path): path for path in sorted(koans_dir.rglob("*.py"))}
    problems, graph = [], {}
    for module, path in files.items():
        own = package_of(module)
        graph[module] = set()
        for line, imported in imports_of(module, path, set(files)):
            where = f"{path.relative_to(koans_dir.parent)}:{line}"
            target = package_of(imported)
            if imported not in files and target not in RANKS:
                problems.append(f"{where}: imports {imported}, which is no module of koans")
                continue
            graph[module].add(imported)
            if target is None or target == own:
                continue
            if target not in RANKS or own is None or RANKS[target] >= RANKS[own]:
                problems.append(f"{where}: {module} ({own}, rank {RANKS.get(own)}) imports {imported} "
                                f"({target}, rank {RANKS.get(target)}): a package imports only lower ranks")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that comes back to its start) per strongly connected part with more than one
    module, or a module that imports itself (Tarjan's algorithm)."""
    index, low, stack, on_stack, parts, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                part.append(other)
                if other == node:
                    break
            if len(part) > 1 or node in graph.get(node, ()):
                parts.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for part in parts:  # a path through the part that comes back to its first module
        members, path = set(part), [part[0]]
        while True:
            step = min(m for m in graph[path[-1]] if m in members)
            if step in path:
                found.append(path[path.index(step):] + [step])
                break
            path.append(step)
    return found


def long_modules(koans_dir: Path) -> list[str]:
    """The modules of learn/ and testkit/ over MOST_LINES lines."""
    return [f"{path.relative_to(koans_dir.parent)}: {count} lines"
            for package in SHORT_PACKAGES for path in sorted((koans_dir / package).rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MOST_LINES]


def test_koans_imports_go_one_way_and_in_no_circle():
    problems = import_problems(KOANS)
    assert not problems, "koans/ breaks its layout (docs/appendix/maintainers.md):\n  " + "\n  ".join(problems)


def test_every_package_is_known_and_its_init_imports_nothing():
    packages = {path.parent.name for path in KOANS.glob("*/__init__.py")}
    assert packages == set(RANKS) - {"cli"}, f"a package without a rank, or a rank without a package: {packages}"
    for package in packages:
        tree = ast.parse((KOANS / package / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"koans/{package}/__init__.py says who uses the package and what it may import"
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], (
            f"koans/{package}/__init__.py imports nothing, so that importing one module of it stays cheap")


def test_the_runners_modules_are_short():
    assert not long_modules(KOANS), f"split these by job (at most {MOST_LINES} lines each): {long_modules(KOANS)}"


@pytest.fixture
def scratch(tmp_path):
    """A copy of koans/ to break."""
    shutil.copytree(KOANS, tmp_path / "koans", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "koans"


def test_the_check_finds_an_import_upwards(scratch):
    assert import_problems(scratch) == [], "the copy holds as the original does"
    results = scratch / "testkit" / "results.py"
    results.write_text(results.read_text() + "\n\ndef _upwards():\n    import koans.learn.runner  # noqa: F401\n")
    found = import_problems(scratch)
    assert any(p.startswith("koans/testkit/results.py:") and "imports koans.learn.runner" in p for p in found), found


def test_the_check_finds_an_import_of_the_cli(scratch):
    show = scratch / "learn" / "show.py"
    show.write_text(show.read_text() + "\n\ndef _command():\n    from koans.cli import main  # noqa: F401\n")
    found = import_problems(scratch)
    assert any(p.startswith("koans/learn/show.py:") and "imports koans.cli" in p for p in found), found


def test_the_check_finds_a_cycle_inside_a_package(scratch):
    state = scratch / "learn" / "state.py"
    state.write_text(state.read_text() + "\n\ndef _back():\n    from koans.learn import check  # noqa: F401\n")
    found = import_problems(scratch)
    assert [p for p in found if p.startswith("import cycle:")] == found and len(found) == 1, found
    assert "koans.learn.check" in found[0] and "koans.learn.state" in found[0], found


def test_the_check_finds_a_long_module(scratch):
    hangs = scratch / "testkit" / "hangs.py"
    hangs.write_text(hangs.read_text() + "\n" * MOST_LINES)
    assert long_modules(scratch) == [f"koans/testkit/hangs.py: {len(hangs.read_text().splitlines())} lines"]
