"""What the runner remembers in .koans/state.json: each chapter's last result (with a fingerprint of
the files it depends on), the hints shown, the resets made, the depth chosen.

    {"results":     {"ch01": {"fingerprint", "status", "passed", "total", "first_failure", ...}},
     "hints_shown": {"ch01": {"Greeter.greet": 2}},
     "resets":      {"ch01": {"backup": ".koans/backups/20250101-120000/ch01_hello_actor.py", "at": ...}}}
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT, Chapter, fingerprint_files
from koans.learn.runner import ChapterRun


def _root() -> Path:
    return PROJECT_ROOT


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(_root()))
    except ValueError:
        return str(path)


def _state_file() -> Path:
    return _root() / ".koans" / "state.json"


def _load_state() -> dict:
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(state: dict) -> None:
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    temporary = _state_file().with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(_state_file())


def _fingerprint(chapter: Chapter) -> str:
    """Changes whenever a file the chapter's result depends on changes (koans.course.manifest.fingerprint_files)."""
    digest = hashlib.sha256()
    for path in fingerprint_files(chapter):
        digest.update(_rel(path).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()


def _recorded(chapter: Chapter, state: dict | None = None) -> tuple[dict | None, bool]:
    """The chapter's last recorded result, and whether its files are unchanged since."""
    entry = (state if state is not None else _load_state()).get("results", {}).get(chapter.tag)
    if not isinstance(entry, dict):
        return None, False
    return entry, entry.get("fingerprint") == _fingerprint(chapter)


def _status_of(run: ChapterRun) -> str:
    if run.syntax_error:
        return "syntax error"
    if run.timed_out:
        return "timed out"
    return "done" if run.passed else "pending"


def _record(chapter: Chapter, run: ChapterRun, fingerprint: str) -> None:
    failure = run.first_failure
    entry = {
        "fingerprint": fingerprint, "status": _status_of(run), "passed": run.count("passed"),
        "skipped": run.count("skipped"), "total": run.total, "stopped_early": run.stopped_early,
        "first_failure": ({"name": failure["name"], "todos": failure.get("todos", []), "hint": failure.get("hint")}
                          if failure else None),
        "syntax_error": run.syntax_error, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if run.timed_out and run.running:
        entry["first_failure"] = {"name": run.running.get("name"), "todos": run.running.get("todos", [])}
    state = _load_state()
    state.setdefault("results", {})[chapter.tag] = entry
    _save_state(state)
