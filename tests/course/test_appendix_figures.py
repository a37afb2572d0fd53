"""A measured figure is only as current as the defaults it was measured under.

Each table of measured figures in docs/appendix/benchmarks.md carries, on the line before it, the
defaults that shaped it:

    <!-- measured under: solutions.ch11_plumbing.DEFAULT_DEPTH=16 solutions.ch10_qwen_grpo.RunConfig.max_lag=1 -->

When the code's default changes, the figure no longer describes what a reader runs: this test names
the figure and the default, so that it is measured again (its command is beside it) or the line says why not.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from koans.course.manifest import PROJECT_ROOT

APPENDIX = PROJECT_ROOT / "docs" / "appendix" / "benchmarks.md"
STAMP = re.compile(r"<!-- measured under: (?P<pairs>[^>]*?) -->")


def current_value(dotted: str):
    """The value the code holds now for `package.module.NAME` (or `...module.Class.field`)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(f"no module in {dotted!r}")


def stale_figures(text: str, where: str = "benchmarks.md") -> list[str]:
    """One line per default that a stamp in `text` records differently from the code now."""
    problems = []
    for match in STAMP.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for pair in match["pairs"].split():
            name, _, recorded = pair.partition("=")
            try:
                now = current_value(name)
            except (ImportError, AttributeError) as err:
                problems.append(f"{where}:{line}: {name} is recorded, but the code has no such default ({err})")
                continue
            if now != ast.literal_eval(recorded):
                problems.append(f"{where}:{line}: measured with {name}={recorded}, but the code's default is now "
                                f"{now!r}: measure again (the command is beside the figure) and update the stamp")
    return problems


def test_every_stamped_figure_matches_the_defaults_of_today():
    text = APPENDIX.read_text()
    assert len(STAMP.findall(text)) >= 4, "the appendix's measured tables carry their defaults (<!-- measured under: -->)"
    problems = stale_figures(text)
    assert not problems, "figures measured under other defaults:\n" + "\n".join(problems)


@pytest.mark.parametrize("stamp, finds", [
    ("solutions.ch11_plumbing.DEFAULT_DEPTH=3", "DEFAULT_DEPTH=3"),           # a default changed since
    ("solutions.ch10_qwen_grpo.RunConfig.max_lag=7", "RunConfig.max_lag=7"),  # a dataclass field's default
    ("solutions.ch11_plumbing.NO_SUCH_DEFAULT=1", "no such default"),         # a default renamed away
])
def test_a_stamp_that_differs_from_the_code_is_reported(stamp, finds):
    problems = stale_figures(f"text\n<!-- measured under: {stamp} -->\n| a | b |\n")
    assert len(problems) == 1 and finds in problems[0], problems
