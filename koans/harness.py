"""Plumbing behind `conftest.py`: which code is under test, Monarch hygiene,
and failure messages that point the learner at a TODO.

Nothing here is an exercise. It is kept apart from conftest.py so the hooks
there stay short enough to read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

import monarch.actor
from monarch.actor import Actor, endpoint

from koans.manifest import IMPL_ENV, PROJECT_ROOT, Chapter, find_chapter
from koans.stubgen import Todo, find_todos

IMPLS = ("exercises", "solutions")
SESSION_TAG_ENV = "KOANS_SESSION_TAG"
TODO_IN_TEXT = re.compile(r"TODO\((ch\d\d)\): ")

# ---------------------------------------------------------------- code under test


def selected_impl(option: str | None) -> str:
    """`--impl` wins, then $KOANS_IMPL, then the learner's `exercises`."""
    impl = option or os.environ.get(IMPL_ENV) or "exercises"
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}: use --impl exercises or --impl solutions")
    return impl


def import_chapter(chapter: Chapter, impl: str):
    """Import `<impl>.chNN_<slug>` from this checkout.

    The project root goes first on sys.path and on PYTHONPATH, so that the
    Monarch processes we spawn (which import the module to unpickle actor
    classes) load the very same files as this process.
    """
    root = str(PROJECT_ROOT)
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[:1] != [root]:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p and p != root])
    module = importlib.import_module(f"{impl}.{chapter.module}")
    if Path(module.__file__).resolve() != chapter.source_file(impl).resolve():
        raise ImportError(
            f"{impl}.{chapter.module} was imported from {module.__file__}, not from this checkout "
            f"({chapter.source_file(impl)}). Run pytest from the project root."
        )
    return module


def import_failure_message(chapter: Chapter, impl: str, err: Exception) -> str:
    """Why `<impl>/chNN_*.py` could not be imported, pointing at the line."""
    path = chapter.source_file(impl).relative_to(PROJECT_ROOT)
    if isinstance(err, SyntaxError):
        return f"{path} does not compile: line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).name == path.name]
    where = f":{frames[-1].lineno}" if frames else ""
    return f"{path}{where} fails while importing: {type(err).__name__}: {err}"


# ---------------------------------------------------------------- Monarch hygiene

recorded_faults: list[object] = []


def record_fault(failure) -> None:
    """Stand-in for Monarch's `unhandled_fault_hook`.

    The default hook calls sys.exit(1), which in a test session surfaces as a
    KeyboardInterrupt and ends every test after it. Here a failure is recorded
    (tests can inspect `recorded_faults`) and printed, and the session goes on.
    """
    recorded_faults.append(failure)
    first_line = str(failure).strip().splitlines()[0] if str(failure).strip() else repr(failure)
    print(f"[koans] Monarch reported a failure (recorded; the session goes on): {first_line[:200]}", file=sys.stderr)


def install_fault_hook() -> None:
    """Replace Monarch's fault hook, and start Monarch's client context now.

    Starting the context here prints Monarch's one-line log notice at the top
    of the session instead of inside the captured output of some test.
    """
    monarch.actor.unhandled_fault_hook = record_fault
    monarch.actor.context()


def new_session_tag() -> str:
    """Mark every process this session spawns, through the environment they inherit."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[SESSION_TAG_ENV] = tag
    return tag


def is_live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def tagged_processes(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes that inherited our session tag."""
    needle = f"{SESSION_TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if is_live(int(entry.name)):
            found.append((int(entry.name), cmdline))
    return found


def leftover_processes(tag: str, grace_s: float | None = None) -> list[tuple[int, str]]:
    """Processes of this session still alive after a grace period; they are then killed.

    A process may take a moment to exit after its mesh is stopped, so we wait
    `grace_s` (default $KOANS_LEAK_GRACE or 5 s) before calling anything a leak.
    """
    if grace_s is None:
        grace_s = float(os.environ.get("KOANS_LEAK_GRACE", "5"))
    if not Path("/proc").is_dir():  # not Linux: nothing we can check
        return []
    deadline = time.monotonic() + grace_s
    alive = tagged_processes(tag)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = tagged_processes(tag)
    for pid, _ in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return alive


class TestTimeLimit(TimeoutError):
    """A test ran past its time limit: something in it waited without a timeout."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TestTimeLimit in this (main) thread if the block runs past `seconds`.

    A backstop for waits that have no timeout of their own, such as a
    `.get()` in a learner's code. SIGALRM interrupts Monarch's waits too.
    """
    if seconds <= 0 or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TestTimeLimit(f"the test ran past its {seconds:g} s time limit and was stopped")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Probe(Actor):
    @endpoint
    def ping(self) -> bool:
        return True


def procs_accept_new_actors(procs, timeout_s: float = 5.0) -> bool:
    """Can we still spawn on `procs`?

    Once any actor on a ProcMesh has failed (its process died, or an exception
    escaped a `broadcast` endpoint, which has no caller to report to), Monarch
    refuses new spawns on that mesh.
    """
    try:
        procs.spawn(f"koans_probe_{uuid.uuid4().hex[:6]}", _Probe).ping.call().get(timeout=timeout_s)
        return True
    except Exception:
        return False


def stop_procs(procs, timeout_s: float = 15.0) -> None:
    """Stop a ProcMesh; on failure say so and leave the rest to the end-of-session check."""
    try:
        procs.stop().get(timeout=timeout_s)
    except Exception as err:  # a mesh with dead processes may refuse a clean stop
        print(f"[koans] stopping a ProcMesh failed ({type(err).__name__}: {err}); "
              "the end-of-session check will clean up", file=sys.stderr)


# ---------------------------------------------------------------- messages


@functools.lru_cache(maxsize=None)
def chapter_todos(chapter: Chapter) -> list[Todo]:
    """The chapter's TODOs, read from the solution (the source of truth)."""
    path = chapter.source_file("solutions")
    return find_todos(path.read_text(), str(path))


def locate(todo: Todo, impl: str) -> str:
    """Where the learner finds this TODO now: 'exercises/ch01_x.py:42  (Greeter.greet)'.

    The line of the stub's `raise` while it is there, else the line of the
    function that held it (the learner has started on it).
    """
    path = find_chapter(todo.chapter).source_file(impl)
    lines = path.read_text().splitlines()
    stub = f'NotImplementedError("{todo.message}")'
    name = todo.key.split("#")[0].split(".")[-1]
    line = next((n for n, text in enumerate(lines, 1) if stub in text), None)
    started = ""
    if line is None:
        started = ", changed by you"
        line = next((n for n, text in enumerate(lines, 1) if re.match(rf"\s*(async\s+)?def {re.escape(name)}\b", text)), 1)
    return f"{path.relative_to(PROJECT_ROOT)}:{line}  ({todo.key}{started})"


def todos_named_in_text(text: str) -> list[Todo]:
    """TODOs whose stub message appears in an error's text."""
    found = []
    for tag in sorted(set(TODO_IN_TEXT.findall(text))):
        try:
            todos = chapter_todos(find_chapter(tag))
        except (KeyError, OSError):
            continue
        found += [todo for todo in todos if todo.message in text]
    return found


def error_text(exc: BaseException) -> str:
    """The exception, its remote original (Monarch's ActorError.exception) and its causes."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        remote = getattr(exc, "exception", None)
        if isinstance(remote, BaseException):
            parts.append(f"{type(remote).__name__}: {remote}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _test_line(excinfo, test_path: Path) -> str:
    """'tests/test_x.py:37: <source line>' for the test's own (innermost) frame."""
    found = ""
    for frame, lineno in traceback.walk_tb(excinfo.tb):
        if Path(frame.f_code.co_filename).resolve() == test_path.resolve():
            source = test_path.read_text().splitlines()[lineno - 1].strip()
            found = f"{test_path.relative_to(PROJECT_ROOT)}:{lineno}: {source}"
    return found


def explain_failure(excinfo, test_path: Path, marked: list[Todo], impl: str) -> tuple[str, bool]:
    """A message that points at the TODO behind a failure.

    Returns (text, replaces_traceback). A stub that was never written and a
    call that never answered get a short message instead of Monarch's long
    traceback; any other failure keeps its traceback and gets the pointer added.
    """
    exc = excinfo.value
    text = error_text(exc)
    at_test = _test_line(excinfo, test_path)
    at_test = f"\n  from {at_test}" if at_test else ""

    def checks(todos: list[Todo]) -> str:
        listed = "\n".join(f"  {todo.message}\n    at {locate(todo, impl)}" for todo in todos)
        return f"This test checks:\n{listed}" if todos else "This test names no TODO."

    if "NotImplementedError" in text and TODO_IN_TEXT.search(text):
        todos = todos_named_in_text(text) or marked
        if not todos:
            return "", False
        remote = "; raised in the actor, sent back to the caller" if "ActorError" in text or "Supervision" in text else ""
        also = "".join(f"\n  also not written: {todo.message}\n    at {locate(todo, impl)}" for todo in todos[1:])
        return (
            f"Not written yet: {todos[0].message}\n  at   {locate(todos[0], impl)}{remote}{at_test}{also}\n"
            "Write that part, then run this chapter again.",
            True,
        )
    if "supervision events" in text:
        return (
            "Monarch refused to spawn on a ProcMesh that already had a failed actor."
            f"{at_test}\nAn earlier crash, or an exception inside a broadcast endpoint (which has no caller "
            "to report to, so it fails the actor), marks the whole mesh as failed. Spawn on a fresh ProcMesh."
            + (f"\n{checks(marked)}" if marked else ""),
            True,
        )
    if isinstance(exc, TestTimeLimit):
        return (
            f"{exc}{at_test}\nA wait with no timeout never ended: look for a `.get()` without `timeout=`, "
            f"or an `await` on a call that never returns.\n{checks(marked)}",
            True,
        )
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)):
        first = f"; check {marked[0].message}" if marked else ""
        return (
            f"No reply before the timeout{first}{at_test}\n"
            "A call this test made never returned. A stub that blocks, or waits for something that "
            f"never happens, is the usual cause.\n{checks(marked)}",
            True,
        )
    if marked:
        return checks(marked), False
    return "", False
