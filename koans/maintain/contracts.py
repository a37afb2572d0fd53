"""Every TODO's contract, clause by clause, with the tests that hold each: `python -m koans.maintain.contracts`.

The tables live beside each TODO's tests, in tests/test_chNN_*.py, as a comment block:

    # --- TODO 2: pull_into ----------------------------------------------------
    # Contract, clause by clause (the test that holds each):
    #   - the caller's `timeout` is the read's own (passed to read_into, not its default)
    #       -> test_pull_into_waits_at_most_the_callers_timeout

This module collects them into one page for maintainers (docs/appendix/contracts.md; `--update`
writes it). tests/course/test_harness.py checks that every TODO has a table and that each test it names
exists; tests/course/test_docs.py that the page is up to date.
"""

from __future__ import annotations

import re
import sys

from koans.course.manifest import CHAPTERS, PROJECT_ROOT

TABLE = re.compile(r"^# --- TODO \d+: (?P<key>[\w.]+) -+\n# Contract, clause by clause[^\n]*\n(?P<rows>(?:#  [^\n]*\n)+)",
                   re.M)
PAGE = PROJECT_ROOT / "docs" / "appendix" / "contracts.md"
HEADER = """# Appendix · Every TODO's contract, clause by clause (maintainers)

Each TODO's tests begin with its contract, one clause a line, and the test that fails when that
clause alone is broken (each such test also fails on a mutant of its own in `mutants/`). This page
collects them: `python -m koans.maintain.contracts --update` writes it from `tests/test_chNN_*.py`.
"""


def chapter_text(chapter) -> str:
    return "\n".join(path.read_text() for path in sorted(chapter.test_file.parent.glob(f"test_{chapter.tag}_*.py")))


def clauses(rows: str) -> list[tuple[str, list[str]]]:
    """(clause, tests) for each clause of one table; a test name cut at "_" across lines is joined."""
    rows = re.sub(r"_\n#\s+", "_", rows)
    items: list[list[str]] = []
    for line in rows.splitlines():
        body = line.lstrip("#").strip()
        start = re.match(r"(?:-|\d+\.)\s+(.*)", body)
        if start:
            items.append([start.group(1)])
        elif items:
            items[-1].append(body)
    found = []
    for parts in items:
        sentences, arrow_before = [[]], False
        for part in parts:  # a clause may go on after an "->" line (a new sentence); test names alone do not count
            before = part.split("->", 1)[0].strip()
            more_tests = arrow_before and (not before or (re.fullmatch(r"[\w,\s]*", before) and "test_" in before))
            if before and not more_tests:
                if arrow_before and sentences[-1]:
                    sentences.append([])
                sentences[-1].append(before)
            arrow_before = "->" in part or more_tests
        clause = "; ".join(" ".join(words).rstrip(",") for words in sentences if words)
        found.append((clause, list(dict.fromkeys(re.findall(r"\btest_\w+", " ".join(parts))))))
    return found


def tables(chapter) -> dict[str, list[tuple[str, list[str]]]]:
    return {m["key"]: clauses(m["rows"]) for m in TABLE.finditer(chapter_text(chapter))}


def page() -> str:
    out = [HEADER]
    for chapter in CHAPTERS:
        out.append(f"## {chapter.tag}: {chapter.title}\n\n| TODO | clause | held by |\n|---|---|---|")
        for key, rows in tables(chapter).items():
            for clause, tests in rows:
                cell = clause.replace("|", "\\|")
                out.append(f"| `{key}` | {cell} | {', '.join(f'`{t}`' for t in tests)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m koans.maintain.contracts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="write docs/appendix/contracts.md instead of printing")
    args = parser.parse_args(argv)
    text = page()
    if args.update:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(PROJECT_ROOT)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
