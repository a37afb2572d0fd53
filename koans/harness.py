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
from koans.results import LIKELY_HANG_CAUSE
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
        started = ", changed by you" if impl == "exercises" else ""
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


def exception_chain(exc: BaseException | None, honour_suppress: bool = False):
    """`exc`, then its cause or context, and so on (each once). With `honour_suppress`, a context
    hidden by `raise ... from None` ends the chain, as in a printed traceback."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if honour_suppress and exc.__suppress_context__ else exc.__context__)


def error_text(exc: BaseException) -> str:
    """The exception, its remote original (Monarch's ActorError.exception) and its causes."""
    parts = []
    for exc in exception_chain(exc):
        parts.append(f"{type(exc).__name__}: {exc}")
        remote = getattr(exc, "exception", None)
        if isinstance(remote, BaseException):
            parts.append(f"{type(remote).__name__}: {remote}")
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


# ---------------------------------------------------------------- what went wrong, in short

_TRACEBACK_HEADER = re.compile(r"^\s*Traceback\b.*:\s*$")
_TRACEBACK_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
LEARNER_DIRS = ("exercises", "solutions", "tests")


def project_path(filename: str) -> Path | None:
    """`filename` relative to the project when it is under exercises/, solutions/ or tests/, else None.

    Everything else (pytest, asyncio, Monarch, koans/, conftest.py) is plumbing a learner need not read.
    """
    try:
        relative = Path(filename).resolve().relative_to(PROJECT_ROOT.resolve())
    except (ValueError, OSError):
        return None
    return relative if relative.parts and relative.parts[0] in LEARNER_DIRS and len(relative.parts) > 1 else None


def _source_line(path: Path, lineno: int) -> str:
    import linecache

    return linecache.getline(str(PROJECT_ROOT / path), lineno).strip()


def _todo_of_function(path: Path, function: str) -> str | None:
    """The TODO key whose function this is, for a chapter file (`Greeter.greet` for `greet`)."""
    match = re.match(r"(ch\d\d)_", path.name)
    if not match or path.parts[0] == "tests":
        return None
    try:
        chapter = find_chapter(match.group(1))
    except KeyError:
        return None
    if path.name != f"{chapter.module}.py":
        return None
    for todo in chapter_todos(chapter):
        if todo.key.split("#")[0].split(".")[-1] == function:
            return todo.key
    return None


def _frame(path: Path, lineno: int, function: str, remote: bool) -> dict:
    return {"file": str(path), "line": lineno, "function": function, "source": _source_line(path, lineno),
            "remote": remote, "todo": _todo_of_function(path, function)}


def _strip_tracebacks(text: str, frames: list[dict], remote: bool) -> str:
    """`text` without the Python tracebacks inside it (Monarch puts the remote one in the message);
    their frames in exercises/ or tests/ go to `frames`."""
    kept, in_traceback = [], False
    for line in text.splitlines():
        if _TRACEBACK_HEADER.match(line):
            in_traceback = True
            continue
        if in_traceback and (line.startswith((" ", "\t")) or not line.strip()):
            found = _TRACEBACK_FILE.match(line)
            path = project_path(found["file"]) if found else None
            if path is not None:
                frames.append(_frame(path, int(found["line"]), found["function"], remote))
            continue
        in_traceback = False
        kept.append(line)
    return "\n".join(kept).strip()


def failure_summary(excinfo) -> dict:
    """What went wrong, without plumbing: the whole error message (of the exception, of its remote
    original and of its causes) and the frames of exercises/ and tests/ on the way to it.

    {"error": "ActorError: ...\\nAttributeError: ...",
     "frames": [{"file": "exercises/ch01_x.py", "line": 48, "function": "greet",
                 "source": "self.count += 1", "remote": True, "todo": "Greeter.greet"}, ...]}
    """
    frames: list[dict] = []
    lines: list[str] = []
    for exc in exception_chain(excinfo.value, honour_suppress=True):
        # The failure's own frames as pytest caught it; a cause's, from its own traceback.
        for frame, lineno in traceback.walk_tb(excinfo.tb if exc is excinfo.value else exc.__traceback__):
            path = project_path(frame.f_code.co_filename)
            if path is not None:
                frames.append(_frame(path, lineno, frame.f_code.co_name, False))
        remote = "ActorError" in type(exc).__name__ or "Supervision" in type(exc).__name__
        message = str(exc)
        if type(exc).__name__ == "Failed":  # pytest.fail(...): the message is the story
            text = message
        else:
            text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        for line in _strip_tracebacks(text, frames, remote).splitlines():
            if line.strip() and line not in lines:
                lines.append(line)
        original = getattr(exc, "exception", None)
        if isinstance(original, BaseException) and original is not exc:
            line = f"{type(original).__name__}: {original}"
            if not any(line.strip() == kept.strip() for kept in lines):
                lines += _strip_tracebacks(line, frames, True).splitlines()
    unique, seen_frames = [], set()
    for frame in frames:
        key = (frame["file"], frame["line"], frame["remote"])
        if key not in seen_frames:
            seen_frames.add(key)
            unique.append(frame)
    return {"error": "\n".join(lines), "frames": unique}


# ---------------------------------------------------------------- hang notices


def _innermost_project_frame(frame, modules: bool = False) -> tuple[Path, int, str] | None:
    """Walking out from `frame`, the first frame in exercises/, solutions/ or tests/; a module's
    top level (an import still running) counts only with `modules`."""
    while frame is not None:
        path = project_path(frame.f_code.co_filename)
        if path is not None and (modules or frame.f_code.co_name != "<module>"):
            return path, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def _awaiting_frames(main_frame) -> list[tuple[Path, int, str]]:
    """For an event loop running in the main thread: where each of its tasks is suspended,
    as the innermost frame of exercises/ or tests/ in the task's chain of awaits."""
    loop, frame = None, main_frame
    while frame is not None and loop is None:
        if frame.f_code.co_name in ("run_forever", "_run_once", "run_until_complete"):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, asyncio.AbstractEventLoop):
                loop = candidate
        frame = frame.f_back
    if loop is None:
        return []
    found = []
    try:
        tasks = list(asyncio.all_tasks(loop))
    except RuntimeError:
        return []
    for task in tasks:
        innermost, coro = None, task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                path = project_path(frame.f_code.co_filename)
                if path is not None:
                    innermost = (path, frame.f_lineno, frame.f_code.co_name)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if innermost:
            found.append(innermost)
    return found


def pending_waits(main_ident: int, skip_idents: set[int]) -> dict:
    """Where the main thread waits, and learner code still running in other threads of this process.

    {"waiting_at": (path, line, function) or None, "running": [(path, line, function), ...],
     "importing": (path, line, "<module>") or None}
    """
    frames = sys._current_frames()
    main = frames.get(main_ident)
    waiting = _innermost_project_frame(main) if main is not None else None
    importing = _innermost_project_frame(main, modules=True) if main is not None and waiting is None else None
    awaiting = _awaiting_frames(main) if main is not None else []
    # A suspended coroutine (the learner's first) says more than the test's `asyncio.run(...)` line.
    awaiting.sort(key=lambda f: f[0].parts[0] == "tests")
    if awaiting:
        waiting = awaiting[0]
    running = []
    for ident, frame in frames.items():
        if ident == main_ident or ident in skip_idents:
            continue
        found = _innermost_project_frame(frame)
        if found is not None and found[0].parts[0] != "tests":
            running.append(found)
    return {"waiting_at": waiting, "running": running, "importing": importing}


def describe_hang(test_name: str, todos: list[Todo], waited_s: float, waits: dict, limit_s: float | None) -> str:
    def where(found) -> str:
        path, line, function = found
        return f"{path}:{line}: {_source_line(path, line)}"

    checks = f" (it checks TODO {', '.join(t.key for t in todos)})" if todos else ""
    lines = [f"Still waiting after {waited_s:.0f} s in {test_name}{checks}."]
    if waits["waiting_at"]:
        lines.append(f"  It waits at   {where(waits['waiting_at'])}")
    else:
        lines.append("  It waits outside your code and the test's (in a fixture or in Monarch).")
    for found in waits["running"][:3]:
        lines.append(f"  Still running {where(found)}   (in {found[2]}, in this process)")
    lines.append(f"  Likely cause: {LIKELY_HANG_CAUSE}.")
    if todos:
        lines.append(f"  Look at {locate(todos[0], os.environ.get(IMPL_ENV, 'exercises'))}")
    if limit_s:
        lines.append(f"  (The test's time limit stops it after {limit_s:g} s.)")
    return "\n".join(lines)


class HangWatch:
    """A watchdog thread: when the running test has gone `after_s` without finishing, report ONCE
    (per test) where the main thread waits, and learner code still running in this process,
    through `notify(text, data)`. While the main thread is still in plumbing (a fixture, an
    import) the notice waits a little longer for it to reach the test's or the learner's code."""

    def __init__(self, after_s: float, notify):
        self.after_s = after_s
        self.notify = notify
        self.main_ident = threading.main_thread().ident
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._test: tuple[str, list[Todo], float | None] | None = None
        self._noticed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="koans-hang-watch", daemon=True)

    def start(self) -> "HangWatch":
        if self.after_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def test_started(self, name: str, todos: list[Todo], limit_s: float | None) -> None:
        with self._lock:
            self._test, self._noticed, self._since = (name, todos, limit_s), False, time.monotonic()

    def test_finished(self) -> None:
        with self._lock:
            self._test, self._noticed, self._since = None, False, time.monotonic()

    def _watch(self) -> None:
        previous = None
        while not self._stop.wait(0.25):
            with self._lock:
                test, waited = self._test, time.monotonic() - self._since
                if test is None or self._noticed or waited < self.after_s:
                    previous = None
                    continue
            try:
                waits = pending_waits(self.main_ident, {threading.get_ident()})
                if not waits["waiting_at"] and not waits["running"]:
                    if waited < 3 * self.after_s:
                        continue  # still in plumbing (a fixture, an import): look again in a moment
                    waits["waiting_at"] = waits["importing"]
                # A wait that is pending stays put: report it once two looks, a moment apart, agree.
                seen = (waits["waiting_at"], tuple(waits["running"]))
                if seen != previous and waited < 3 * self.after_s:
                    previous = seen
                    self._stop.wait(0.25)
                    continue
                with self._lock:
                    if self._test is not test or self._noticed:
                        continue
                    self._noticed = True
                name, todos, limit = test
                text = describe_hang(name, todos, waited, waits, limit)
                data = {"name": name, "todos": [t.key for t in todos], "waited_s": round(waited, 1),
                        "waiting_at": [str(x) for x in waits["waiting_at"]] if waits["waiting_at"] else None}
                self.notify(text, data)
            except Exception as err:  # a notice must never break the session
                print(f"[koans] hang notice failed: {type(err).__name__}: {err}", file=sys.stderr)
