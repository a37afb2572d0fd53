"""`koans watch`: re-check whenever an exercise file changes; on a pass, go on to the next chapter."""

from __future__ import annotations

import time
from pathlib import Path

from koans.learn.check import walk
from koans.learn.state import _root


def _snapshot() -> dict[str, tuple[int, int]]:
    found = {}
    for path in sorted((_root() / "exercises").glob("*.py")):
        try:
            stat = path.stat()
        except OSError:
            continue
        found[str(path)] = (stat.st_mtime_ns, stat.st_size)
    return found


def cmd_watch(interval: float, max_checks: int | None) -> int:
    """Poll modification times (works on every filesystem, no inotify) and re-check on change.

    The files are looked at BEFORE each check, so a save made while a check runs is seen next time.
    """
    seen = _snapshot()
    walk()
    print(f"\nWatching exercises/ (every {interval:g} s). Save a file to re-check; Ctrl-C to stop.", flush=True)
    checks = 1
    try:
        while max_checks is None or checks < max_checks:
            time.sleep(interval)
            now = _snapshot()
            if now == seen:
                continue
            changed = sorted(Path(p).name for p in set(now) | set(seen) if now.get(p) != seen.get(p))
            seen = now
            print(f"\nChanged: {', '.join(changed)}. Checking again...", flush=True)
            walk(quiet_when_unchanged=True)
            checks += 1
            print("\nWatching exercises/ for your next save (Ctrl-C to stop).", flush=True)
    except KeyboardInterrupt:
        print("\nStopped watching.")
    return 0
