"""Hang notices: a watchdog that says, while a test still runs, where it waits with nothing moving and
no timeout, in or for a TODO (HangWatch; conftest.py starts it, $KOANS_HANG_NOTICE_S).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from koans.course.manifest import IMPL_ENV
from koans.course.todos import Todo
from koans.testkit.explain import locate
from koans.testkit.results import LIKELY_HANG_CAUSE
from koans.testkit.waits import Culprit, find_culprit, project_path, source_line, todo_of_frame


#: CPU time (in clock ticks, 10 ms each) that the main thread may use in a window that counts as no progress.
_IDLE_TICKS = 5


def _thread_cpu_ticks(native_id: int | None) -> int:
    """utime + stime of one thread of this process, in clock ticks (0 where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _event_loop_of(frame) -> asyncio.AbstractEventLoop | None:
    while frame is not None:
        if frame.f_code.co_name in ("run_forever", "_run_once", "run_until_complete"):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, asyncio.AbstractEventLoop):
                return candidate
        frame = frame.f_back
    return None


def _stack(frame) -> list:
    """The frames from `frame` outwards."""
    found = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return found


def _source_line_of(frame) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def _project(frames: list) -> list[tuple[Path, int, str]]:
    """(path, line, function) of the frames of exercises/, solutions/ or tests/ among `frames`, in order."""
    found = []
    for frame in frames:
        path = project_path(frame.f_code.co_filename)
        if path is not None and frame.f_code.co_name != "<module>":
            found.append((path, frame.f_lineno, frame.f_code.co_name))
    return found


def _bounded(frames_inward: list) -> bool:
    """Whether a wait ends by itself: a frame inward of the innermost project frame (asyncio.wait_for,
    Monarch's Future.get, threading's Event.wait) holds a finite `timeout`. frames_inward: outermost first."""
    inner = [i for i, frame in enumerate(frames_inward) if project_path(frame.f_code.co_filename) is not None]
    for frame in frames_inward[inner[-1] + 1 if inner else 0:]:
        try:
            timeout = frame.f_locals.get("timeout")
        except Exception:  # a frame that cannot show its locals: no evidence of a bound
            continue
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf"):
            return True
    return False


@dataclass(frozen=True)
class Wait:
    """One pending wait of the main thread (its own, or an asyncio task's)."""

    signature: object  # changes whenever the wait moves on
    frames: list[tuple[Path, int, str]]  # its project frames, innermost first
    bounded: bool  # it has a timeout, so it ends by itself (and its TimeoutError names the TODO)


@dataclass(frozen=True)
class Look:
    """One look at this process: the main thread's pending waits, and the innermost frame of a chapter
    file that other threads (actors spawned in this process) are running, by (thread, frame object)."""

    waits: dict[object, Wait]
    running: dict[tuple[int, int], tuple[Path, int, str]]


def look_at_main_thread(skip_idents: set[int]) -> Look | None:
    main = threading.main_thread()
    frames = sys._current_frames()
    top = frames.get(main.ident)
    if top is None:
        return None
    waits = {}
    loop = _event_loop_of(top)
    if loop is None:  # plain waiting: the main thread's own stack; using CPU, or in a poll's sleep, is moving
        stack = _stack(top)
        signature = (tuple((id(f), f.f_lasti) for f in stack), _thread_cpu_ticks(main.native_id) // _IDLE_TICKS)
        if "sleep(" in _source_line_of(top):
            signature = (signature, time.monotonic())
        waits["main"] = Wait(signature, _project(stack), _bounded(stack[::-1]))
    else:  # an event loop: where each of its tasks is suspended, and on what (the loop's own frames come and go)
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:
            return None
        for task in tasks:
            chain, coro = [], task.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None:
                    chain.append(frame)
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            signature = (id(getattr(task, "_fut_waiter", None)), tuple((id(f), f.f_lasti) for f in chain))
            waits[id(task)] = Wait(signature, _project(chain[::-1]), _bounded(chain))
        for task in tasks:  # a task gathering others waits as long as they do: bounded if each of them is
            children = getattr(getattr(task, "_fut_waiter", None), "_children", None)
            if children and id(task) in waits and all(
                    child.done() or (id(child) in waits and waits[id(child)].bounded) for child in children):
                waits[id(task)] = replace(waits[id(task)], bounded=True)
    running = {}
    for ident, frame in frames.items():
        if ident == main.ident or ident in skip_idents:
            continue
        inner = [f for f in _stack(frame)
                 if project_path(f.f_code.co_filename) is not None and f.f_code.co_name != "<module>"]
        if inner and project_path(inner[0].f_code.co_filename).parts[0] != "tests":
            running[(ident, id(inner[0]))] = _project(inner[:1])[0]
    return Look({key: wait for key, wait in waits.items() if wait.frames}, running)


@dataclass(frozen=True)
class WatchedTest:
    name: str
    marked: list[Todo]  # the TODOs it is marked with
    scope: list[Todo]  # every TODO its code can run (its chapter's and earlier ones')
    limit_s: float | None = None  # its time limit


def describe_hang(test: WatchedTest, waited_s: float, culprit: Culprit, main_wait: Culprit | None,
                  running: list[tuple[Path, int, str]]) -> str:
    checks = f" (it checks TODO {', '.join(t.key for t in test.marked)})" if test.marked else ""
    lines = [f"Still waiting after {waited_s:.0f} s in {test.name}, with nothing moving{checks}."]
    shown = main_wait or culprit
    lines.append(f"  It waits at   {shown.where()}")
    if shown.todos:
        lines.append(f"                {shown.waiting_for()}")
    for path, line, function in running[:3]:
        lines.append(f"  Still running {path}:{line}: {source_line(path, line)}   (in {function}, in this process)")
    lines.append(f"  Likely cause: {LIKELY_HANG_CAUSE}.")
    impl = os.environ.get(IMPL_ENV, "exercises")
    lines.append("  Look at " + "\n      and ".join(locate(todo, impl) for todo in culprit.todos))
    if test.limit_s:
        lines.append(f"  (The test's time limit stops it after {test.limit_s:g} s.)")
    return "\n".join(lines)


class HangWatch:
    """A watchdog thread for the waits that cannot end by themselves. It reports once (per test), through
    `notify(text, data)`, when for `after_s` seconds with nothing moving:
      - the main thread (or one of its asyncio tasks) waits, with no timeout, in a TODO's function or
        for a TODO it calls; or
      - a TODO's own code has been running in another thread of this process (an actor spawned here).
    A wait with a timeout ends by itself, and its TimeoutError names the TODO (explain_failure). A wait
    in given code (a fixture, plumbing, process shutdown) is not the learner's: the time limit decides.

    Nothing moving, for one wait: the same objects at the same places, awaiting the same future; for the
    main thread's own wait, also next to no CPU used and no poll's sleep (polling is progress).
    """

    def __init__(self, after_s: float, notify):
        self.after_s = after_s
        self.notify = notify
        self._lock = threading.Lock()
        self._test: WatchedTest | None = None
        self._noticed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="koans-hang-watch", daemon=True)

    def start(self) -> "HangWatch":
        if self.after_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def test_started(self, test: WatchedTest) -> None:
        with self._lock:
            self._test, self._noticed = test, False

    def test_finished(self) -> None:
        with self._lock:
            self._test, self._noticed = None, False

    def _culprit(self, look: Look, since: dict, now: float, test: WatchedTest) -> tuple[Culprit, float] | None:
        """The learner's wait stuck longest (past after_s), and for how long; None if there is none."""
        stuck = [(started, key) for key, (_, started) in since.items() if now - started >= self.after_s]
        for started, key in sorted(stuck, key=lambda pair: pair[0]):
            if key in look.waits:
                wait = look.waits[key]
                culprit = None if wait.bounded else find_culprit(wait.frames, test.scope)
            else:
                path, line, function = look.running[key]
                own = todo_of_frame(path, function, test.scope)
                culprit = Culprit(path, line, function, (own,), None) if own is not None else None
            if culprit is not None:
                return culprit, now - started
        return None

    def _main_wait(self, look: Look, test: WatchedTest) -> Culprit | None:
        """Where the main thread waits (its first wait), to show beside learner code running elsewhere."""
        for wait in look.waits.values():
            path, line, function = wait.frames[0]
            return find_culprit(wait.frames, test.scope) or Culprit(path, line, function, (), None)
        return None

    def _watch(self) -> None:
        since: dict[object, tuple[object, float]] = {}  # per wait or running frame: (signature, since when)
        watched = None
        while not self._stop.wait(0.25):
            with self._lock:
                test = None if self._noticed else self._test
            if test is not watched:
                since, watched = {}, test
            if test is None:
                continue
            try:
                look = look_at_main_thread({threading.get_ident()})
                if look is None:
                    continue
                now = time.monotonic()
                current = {key: wait.signature for key, wait in look.waits.items()}
                current.update({key: key for key in look.running})
                since = {key: (signature, since[key][1] if since.get(key, (None,))[0] == signature else now)
                         for key, signature in current.items()}
                found = self._culprit(look, since, now, test)
                if found is None:
                    continue
                culprit, waited = found
                with self._lock:
                    if self._test is not test or self._noticed:
                        continue
                    self._noticed = True
                running = list(look.running.values())
                main_wait = self._main_wait(look, test) if (culprit.path, culprit.line, culprit.function) in running else None
                data = {"name": test.name, "todos": [t.key for t in culprit.todos], "waited_s": round(waited, 1),
                        "waiting_at": [str(culprit.path), culprit.line, culprit.function]}
                self.notify(describe_hang(test, waited, culprit, main_wait, running), data)
            except Exception as err:  # a notice must never break the session
                print(f"[koans] hang notice failed: {type(err).__name__}: {err}", file=sys.stderr)
