"""`koans hint N [TODO]`: one more hint each time it is asked, for the TODO named or the one the chapter is stuck on."""

from __future__ import annotations

import sys

from koans.course.edition_data import todos_of
from koans.course.manifest import Chapter
from koans.learn.show import _fill, failing_todo, hints_of
from koans.learn.state import _load_state, _recorded, _save_state


def find_todo(chapter: Chapter, name: str) -> str:
    """The key of the chapter's TODO called `name`: its key, or the last part of it ("route" for
    "Service.route"), in any case. KeyError, listing the chapter's TODOs, if none or several match."""
    keys = [todo.key for todo in todos_of(chapter)]
    wanted = name.strip().lower()
    found = [key for key in keys if key.lower() == wanted] or [key for key in keys if key.lower().split(".")[-1] == wanted]
    if len(found) != 1:
        raise KeyError(f"chapter {chapter.number:02d} has no TODO {name!r}" if not found else
                       f"{name!r} names several TODOs of chapter {chapter.number:02d}: {', '.join(found)}")
    return found[0]


def cmd_hint(chapter: Chapter, name: str | None = None) -> int:
    """One more hint for a TODO: the one named, else the one the chapter is stuck on (its recorded first
    failure's TODO; else the first TODO still stubbed; else its first TODO). Lists the chapter's TODOs."""
    state = _load_state()
    entry, fresh = _recorded(chapter, state)
    failure = (entry or {}).get("first_failure")
    try:
        key = find_todo(chapter, name) if name else failing_todo(chapter, failure)
    except KeyError as err:
        print(f"koans: {err.args[0]}. Its TODOs: {', '.join(t.key for t in todos_of(chapter))}", file=sys.stderr)
        return 2
    hints = hints_of(chapter, key) if key else ()
    if not hints:
        print(f"Chapter {chapter.number:02d} has no hints. The concepts: docs/{chapter.doc_file.name}")
        return 0
    shown = state.setdefault("hints_shown", {})
    if not isinstance(shown.get(chapter.tag), dict):
        shown[chapter.tag] = {}
    before = shown[chapter.tag].get(key, 0)
    # The first failure may have named the hint that fits the clause it broke: show up to that one at once.
    fits = (failure or {}).get("hint") if not name and failure and key in (failure.get("todos") or []) else None
    upto = min(max(before + 1, fits if isinstance(fits, int) else 0), len(hints))
    shown[chapter.tag][key] = upto
    _save_state(state)
    if name:
        why = ""
    elif failure and key in (failure.get("todos") or []):
        why = f" (the TODO of {failure['name']}, its first failure)"
    elif entry and fresh and entry.get("status") == "done":
        why = " (the chapter passes; name a TODO to see its hints)"
    else:
        why = ""
    if before >= len(hints):
        why += " (all of them were shown before)"
    elif isinstance(fits, int) and fits > before + 1 and upto == fits:
        why += " (the one that fits the clause that failed)"
    print(f"Chapter {chapter.number:02d}: hint {upto} of {len(hints)} for {key}{why}")
    for number, hint in enumerate(hints[:upto], start=1):
        print(_fill(hint, f"  {number}. ", "     "))
    if upto < len(hints):
        print(f"  Ask again for the next one: koans hint {chapter.number} {key.split('.')[-1]}")
    else:
        print(f"  That was the last hint for {key}. The concepts: docs/{chapter.doc_file.name}")
    others = [todo.key for todo in todos_of(chapter) if todo.key != key]
    if others:
        print(f"  The chapter's other TODOs: {', '.join(others)}  (koans hint {chapter.number} TODO)")
    return 0
