"""`koans workshop`: the 3-hour workshop's depth, where each chapter's stretch TODOs are given as code
(koans/course/depth.py); `--off` puts their stubs back."""

from __future__ import annotations

import sys

from koans.course import depth
from koans.course.edition_data import has_stretch_code, stretch_code
from koans.course.manifest import selected_chapters
from koans.learn.state import _load_state, _root, _save_state


def cmd_workshop(off: bool) -> int:
    """Give the stretch TODOs as code (the workshop's depth), or put their stubs back (--off)."""
    state = _load_state()
    chapters = [c for c in selected_chapters() if c.stretch]
    if not off and chapters and not has_stretch_code():
        try:
            stretch_code(chapters[0].tag, chapters[0].stretch[0])
        except Exception as err:  # the graded edition: say so plainly
            print(f"koans workshop: {err}", file=sys.stderr)
            return 2
    if off:
        for chapter in chapters:
            stubbed, edited = depth.unfill(chapter, _root())
            for key in stubbed:
                print(f"  chapter {chapter.number:02d}: {key}: its stub is back")
            for key in edited:
                print(f"  chapter {chapter.number:02d}: {key}: you changed the given code, so it is left as it is")
        state["depth"] = "self-study"
        _save_state(state)
        print("Self-study depth: you write every TODO, the stretch ones too.")
        return 0
    print("Workshop depth: each chapter's stretch TODOs are given as code, marked GIVEN, so the workshop fits "
          "in 3 hours.\nTheir tests still run; self-study and grading write them too (koans workshop --off).")
    for chapter in chapters:
        filled = depth.fill(chapter, _root())
        for key in chapter.stretch:
            how = "given" if key in filled else ("given already" if depth.is_filled(chapter, key, _root())
                                                else "left as you wrote it")
            print(f"  chapter {chapter.number:02d}: {key}: {how}")
    state["depth"] = "workshop"
    _save_state(state)
    return 0
