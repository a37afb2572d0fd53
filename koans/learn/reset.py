"""`koans reset N` puts a chapter's stub back (the learner's version is kept in .koans/backups);
`koans reset N --undo` brings that version back."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from koans.course import depth
from koans.course.edition_data import pristine_stub
from koans.course.manifest import Chapter
from koans.learn.state import _load_state, _rel, _root, _save_state


def _reset_stub(chapter: Chapter, state: dict) -> str:
    """The text `koans reset` puts back: the pristine stub, with the stretch TODOs given at workshop depth."""
    stub = pristine_stub(chapter)
    if state.get("depth") == "workshop" and chapter.stretch:  # the workshop's stub: stretch TODOs given
        stub, _ = depth.fill_text(chapter, stub, _root())
    return stub


def cmd_reset(chapter: Chapter, yes: bool) -> int:
    """Put the chapter's stub back; the learner's version is kept in .koans/backups."""
    target = chapter.source_file("exercises")
    state = _load_state()
    stub = _reset_stub(chapter, state)
    if target.is_file() and target.read_text() == stub:
        print(f"{_rel(target)} is already the pristine stub.")
        return 0
    if not yes:
        question = (f"Replace {_rel(target)} with the original stub? Your version is kept in "
                    f".koans/backups (koans reset {chapter.number} --undo brings it back). [y/N] ")
        if not sys.stdin.isatty():
            print(f"koans reset {chapter.number}: nothing changed. There is no terminal to ask whether to replace "
                  f"{_rel(target)}; run `koans reset {chapter.number} --yes` to replace it without asking.",
                  file=sys.stderr)
            return 2
        try:
            answer = input(question)
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing changed.")
            return 1
    backup = _backup(target)
    target.write_text(stub)
    state.get("hints_shown", {}).pop(chapter.tag, None)
    if backup:
        state.setdefault("resets", {})[chapter.tag] = {"backup": _rel(backup), "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    _save_state(state)
    print(f"Chapter {chapter.number:02d} is back to its stub. Your version: {_rel(backup) if backup else '(none)'}"
          f"\n  To bring it back: koans reset {chapter.number} --undo")
    return 0


def _backup(target: Path) -> Path | None:
    if not target.is_file():
        return None
    folder = _root() / ".koans" / "backups" / time.strftime("%Y%m%d-%H%M%S")
    backup, n = folder / target.name, 1
    while backup.exists():
        n += 1
        backup = folder.with_name(f"{folder.name}-{n}") / target.name
    backup.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(target, backup)
    return backup


def cmd_undo_reset(chapter: Chapter) -> int:
    """Bring back the version that the last `koans reset N` saved."""
    state = _load_state()
    record = state.get("resets", {}).get(chapter.tag)
    record = {"backup": record, "at": None} if isinstance(record, str) else (record or {})
    saved = record.get("backup")
    backup = _root() / saved if saved else None
    if backup is None or not backup.is_file():
        print(f"koans: nothing to undo for chapter {chapter.number:02d}: no `koans reset {chapter.number}` "
              "saved a version of it" + (f" (its backup {saved} is gone)" if saved else "") + ".", file=sys.stderr)
        return 1
    target = chapter.source_file("exercises")
    current_is_stub = target.is_file() and target.read_text() == _reset_stub(chapter, state)
    kept = None if current_is_stub else _backup(target)
    shutil.copy2(backup, target)
    state["resets"].pop(chapter.tag, None)
    _save_state(state)
    when = f" (saved by koans reset {chapter.number} at {record['at']})" if record.get("at") else ""
    print(f"Chapter {chapter.number:02d}: brought back your version from {saved}{when}.")
    if kept:
        print(f"  What was there (not the stub: you had edited it) is kept in {_rel(kept)}")
    return 0
