"""The docs cannot drift from the code: every snippet, worked number, command and link is checked.

  python blocks   every ```python block of docs/ and README.md runs, against solutions/. A block
                  of `>>>` lines is a doctest: its printed values must match. A block that is
                  only a shape to look at is marked, on the line before it, with
                  `<!-- fragment: why it cannot run -->`; it must still parse.
  numbers         worked numbers are `>>>` sessions (docs/08, docs/10): change the code's
                  answer, and the doc's test fails, naming the doc and line.
  commands        every `python -m MODULE --flag` and `koans SUBCOMMAND --flag` in the docs: the
                  module exists, and its --help lists every flag shown.
  links           every relative link resolves, and every #anchor names a heading there.
  minutes         docs/00's table of tracks and minutes says what the manifest says.

Claims about Monarch are shown by tests/test_monarch_claims.py.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import importlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from koans.course.manifest import CHAPTERS, PROJECT_ROOT

DOCS = sorted((PROJECT_ROOT / "docs").rglob("*.md")) + [PROJECT_ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)\s*$")
FRAGMENT = re.compile(r"<!--\s*fragment:\s*(.+?)\s*-->")


def rel(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT))


def blocks(path: Path):
    """(language, first line number of the code, code, the line before the fence) of each fenced block."""
    lines = path.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if opened:
            start = index + 1
            end = next(n for n in range(start, len(lines)) if lines[n].startswith("```"))
            before = lines[index - 1] if index else ""
            found.append((opened.group(1), start + 1, "\n".join(lines[start:end]), before))
            index = end + 1
        else:
            index += 1
    return found


PYTHON_BLOCKS = [(path, line, code, before) for path in DOCS for lang, line, code, before in blocks(path)
                 if lang == "python"]


@pytest.mark.parametrize("path, line, code, before", PYTHON_BLOCKS,
                         ids=[f"{rel(p)}:{n}" for p, n, _, _ in PYTHON_BLOCKS])
def test_every_python_block_runs(path, line, code, before):
    where = f"{rel(path)}:{line}"
    if FRAGMENT.search(before):
        ast.parse(code, filename=where)  # shown for its shape; it still has to be Python
        return
    if code.lstrip().startswith(">>>"):
        parser = doctest.DocTestParser()
        test = parser.get_doctest(code, {}, where, rel(path), line - 1)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        report = io.StringIO()
        runner.run(test, out=report.write)
        assert runner.failures == 0, f"{where}: the doc's worked example no longer matches the code:\n{report.getvalue()}"
        return
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        try:
            exec(compile(code, where, "exec"), {"__name__": f"doc_block_{line}"})
        except Exception as err:
            raise AssertionError(f"{where}: the block fails: {type(err).__name__}: {err}") from err
    expected = [c.split("#", 1)[1].strip() for c in code.splitlines() if c.startswith("print(") and "#" in c]
    printed = output.getvalue().splitlines()
    for want in expected:  # `print(x)  # shown value` must print the value shown
        assert want in printed, f"{where}: the block prints {printed}, not {want!r} as the doc says"


# --- commands ------------------------------------------------------------------------------


COMMAND = re.compile(r"^(python -m [\w.]+|koans)\b(.*)$")
KOANS_SUBCOMMANDS = ("list", "check", "hint", "watch", "reset", "workshop", "grade", "autograder", "viz", "verify",
                     "bench", "edition")


def shell_snippets(path: Path):
    """(line number, text) of each inline code span and each line of a bash/sh block."""
    inside, lang = False, ""
    for number, text in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(text)
        if fence or text.startswith("```"):
            inside, lang = (not inside), (fence.group(1) if fence else "")
            continue
        if inside:
            if lang in ("bash", "sh", "console"):
                yield number, text
            continue
        for span in re.findall(r"`([^`]+)`", text):
            yield number, span


def commands():
    """(doc, line, 'python -m MODULE' or 'koans [SUBCOMMAND]', flags) for every command a doc shows."""
    found = []
    for path in DOCS:
        for number, snippet in shell_snippets(path):
            for part in re.split(r"&&|;|\|", snippet):
                match = COMMAND.match(part.strip())
                if not match or "<" in part or "NN" in part:
                    continue  # not a command, or a template such as python -m solutions.chNN_<topic>
                head, words = match.group(1), shlex.split(match.group(2).split(" #", 1)[0], posix=True)
                if head == "koans" and words and words[0] in KOANS_SUBCOMMANDS:
                    head, words = f"koans {words[0]}", words[1:]
                flags = sorted({w.split("=", 1)[0] for w in words if w.startswith("--") and w != "--"})
                found.append((path, number, head, flags))
    return found


def help_text(head: str) -> str:
    """What `<head> --help` prints, run in this process (nothing else runs: --help exits first)."""
    out = io.StringIO()
    if head.startswith("koans"):
        from koans.cli import main as koans_main

        args = head.split()[1:] + ["--help"]
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            koans_main(args)
        return out.getvalue()
    module = head.split()[-1]
    package, _, name = module.rpartition(".")
    target = module
    if package in ("solutions", "exercises") and name.startswith("ch"):
        target = f"{package}.{name[:4]}_plumbing"  # a chapter's demo lives in its plumbing module
    loaded = importlib.import_module(target)
    saved = sys.argv
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            loaded.main()
    finally:
        sys.argv = saved
    return out.getvalue()


COMMANDS = commands()


def test_the_docs_show_commands_and_each_is_found():
    heads = {head for _, _, head, _ in COMMANDS}
    assert "python -m solutions.ch10_qwen_grpo" in heads and "koans list" in heads, sorted(heads)


@pytest.mark.parametrize("head", sorted({head for _, _, head, _ in COMMANDS}))
def test_every_command_exists_and_accepts_the_flags_shown(head):
    shown = sorted({(rel(p), n, f) for p, n, h, flags in COMMANDS if h == head for f in flags})
    if head.startswith("python -m") and head.split()[-1].split(".")[0] not in ("solutions", "exercises", "koans"):
        pytest.skip(f"{head} is not this project's")
    text = help_text(head)
    missing = [(where, line, flag) for where, line, flag in shown if flag not in text]
    assert not missing, f"`{head} --help` does not list: " + ", ".join(f"{flag} ({w}:{n})" for w, n, flag in missing)


# --- links -----------------------------------------------------------------------------------


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


LINKS = [(path, number, target) for path in DOCS for number, text in enumerate(path.read_text().splitlines(), 1)
         for target in LINK.findall(text) if not re.match(r"[a-z]+://", target) and not target.startswith("mailto:")]


@pytest.mark.parametrize("path, line, target", LINKS, ids=[f"{rel(p)}:{n}" for p, n, _ in LINKS])
def test_every_relative_link_and_anchor_resolves(path, line, target):
    file_part, _, anchor = target.partition("#")
    destination = (path.parent / file_part).resolve() if file_part else path
    assert destination.exists(), f"{rel(path)}:{line}: the link {target!r} points at nothing"
    if anchor:
        assert destination.suffix == ".md", f"{rel(path)}:{line}: an anchor into a non-Markdown file: {target!r}"
        assert anchor in anchors(destination), (
            f"{rel(path)}:{line}: no heading in {destination.name} has the anchor #{anchor}: {sorted(anchors(destination))}")


# --- the tracks -------------------------------------------------------------------------------


def test_the_overview_shows_each_chapters_track_and_minutes():
    text = (PROJECT_ROOT / "docs" / "00_overview.md").read_text()
    for chapter in CHAPTERS:
        row = next((line for line in text.splitlines() if line.startswith(f"| {chapter.number:02d} |")), None)
        assert row, f"docs/00_overview.md has no row for chapter {chapter.number:02d}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2].startswith(chapter.track), f"chapter {chapter.number:02d}: docs/00 says {cells[2]!r}"
        assert int(cells[3]) == chapter.minutes, f"chapter {chapter.number:02d}: docs/00 says {cells[3]} minutes"
    workshop = sum(c.minutes for c in CHAPTERS if c.track == "workshop")
    assert f"Workshop track: {workshop} minutes." in text


def test_the_appendix_shows_the_course_figures_as_they_are():
    from koans.course.model import figures, table

    text = (PROJECT_ROOT / "docs" / "appendix" / "course.md").read_text()
    assert table([figures(c) for c in CHAPTERS]) in text, (
        "docs/appendix/course.md: the table differs from the files; update it: python -m koans.course.model --update")


def test_the_contracts_appendix_is_the_tables_beside_the_tests():
    from koans.maintain import contracts

    assert contracts.PAGE.read_text() == contracts.page(), (
        "docs/appendix/contracts.md differs from the clause tables in tests/: python -m koans.maintain.contracts --update")
