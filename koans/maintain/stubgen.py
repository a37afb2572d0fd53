"""Write `exercises/` from `solutions/`, so the two can never drift apart.

A solution marks each piece the learner writes as a *region*:

    def greet(self, who):
        # >>> TODO(ch01): count this greeting and return the greeting text
        # Format: "Hello, <who>! I am <name> (greeting #<n>)."
        self.greetings_given += 1
        return f"Hello, {who}! ..."
        # <<< TODO

In the exercise the region becomes a stub. Comment lines at the top of the
region are guidance and stay; the code becomes one `raise`:

    def greet(self, who):
        # Format: "Hello, <who>! I am <name> (greeting #<n>)."
        raise NotImplementedError("TODO(ch01): count this greeting and return the greeting text")

Every line outside the regions is copied unchanged. The parsing and the stub text live in
koans/course/todos.py (the runner and the grader read TODOs too); this module writes the files.

    python -m koans.maintain.stubgen           regenerate exercises/ (old files are backed up)
    python -m koans.maintain.stubgen --check   exit 1 if exercises/ is out of sync
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT
from koans.course.todos import StubError, expected_exercises, out_of_sync


def write_exercises(solutions_dir: Path, exercises_dir: Path, backup_root: Path) -> list[str]:
    """Regenerate exercises; a file that would change is first backed up."""
    expected = expected_exercises(solutions_dir)
    exercises_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    changed = []
    for name, text in expected.items():
        target = exercises_dir / name
        if target.is_file() and target.read_text() == text:
            continue
        if target.is_file():
            backup = backup_root / stamp / name
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target, backup)
        target.write_text(text)
        changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.maintain.stubgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether exercises/ is in sync")
    args = parser.parse_args(argv)
    solutions, exercises = PROJECT_ROOT / "solutions", PROJECT_ROOT / "exercises"
    try:
        if args.check:
            stale = out_of_sync(solutions, exercises)
            if stale:
                print("exercises/ is out of sync with solutions/: " + ", ".join(stale))
                print("Regenerate with: python -m koans.maintain.stubgen")
                return 1
            print(f"exercises/ is in sync with solutions/ ({len(expected_exercises(solutions))} files)")
            return 0
        backups = PROJECT_ROOT / ".koans" / "backups"
        changed = write_exercises(solutions, exercises, backups)
    except StubError as err:
        print(f"stubgen: {err}", file=sys.stderr)
        return 2
    if changed:
        print(f"rewrote {len(changed)} exercise file(s): {', '.join(changed)}")
        print(f"(the previous versions are saved under {backups})")
    else:
        print("exercises/ already in sync; nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
