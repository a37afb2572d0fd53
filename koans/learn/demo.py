"""Run a chapter's demo; if it reaches a TODO you have not written, say which."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from koans.testkit.explain import error_text, locate, todos_named_in_text
from koans.testkit.processes import detect_deaths_quickly


def run_demo(main: Callable[[], None]) -> None:
    """Call `main()`. A stub it runs into ends the demo with a pointer, not a traceback."""
    detect_deaths_quickly()  # the demos kill processes on purpose (ch05, ch06 --chaos, ch10 --kill-at)
    try:
        main()
    except Exception as err:
        todos = todos_named_in_text(error_text(err))
        if not todos:
            raise
        impl = Path(main.__code__.co_filename).parent.name  # "exercises" or "solutions"
        print(f"\nThe demo stopped at a TODO that is not written yet:\n  {todos[0].message}\n"
              f"  at {locate(todos[0], impl)}\n"
              f"Write it (koans check {int(todos[0].chapter[2:])} tells you when it is right), then run the demo again.",
              file=sys.stderr)
        sys.exit(1)


def demo_options(module: str, description: str, flags: tuple[tuple[str, str], ...] = ()) -> argparse.Namespace:
    """The command line of a chapter's demo: `python -m <module> --help` lists its flags.

    `flags` are on/off switches, (name, help); any other argument is an error.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    for name, text in flags:
        parser.add_argument(name, action="store_true", help=text)
    return parser.parse_args()
