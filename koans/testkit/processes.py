"""Monarch hygiene for a test session: a crashing actor process must not end the session (faults are
recorded), process death is detected within seconds, every process the session spawns carries its tag,
and none may outlive it (leftovers are found and killed). Also what a session's zygote preloads.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import monarch.actor
from monarch.actor import Actor, endpoint

from koans.course.manifest import CHAPTERS, chapter_for_module

SESSION_TAG_ENV = "KOANS_SESSION_TAG"


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


#: How long Monarch waits for an actor's state before it counts the actor as dead. A killed process is
#: usually reported within one supervision poll, but now and then only when this query gives up: 30 s by
#: default, long enough for every caller to pile up on the dead replica. A busy actor still answers it
#: (the runtime does, not the actor's Python thread), so two seconds are safe, even with two test
#: suites sharing two cores.
ACTOR_STATE_MAX_IDLE = "2s"


def detect_deaths_quickly() -> None:
    """Let Monarch report a dead process within seconds, even on its slow path."""
    monarch.configure(get_actor_state_max_idle=ACTOR_STATE_MAX_IDLE)


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


def tagged_processes(tag: str, skip=None) -> list[tuple[int, str]]:
    """(pid, command line) of live processes that inherited our session tag (but not those for
    which `skip(pid, command line)` is true)."""
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
        if is_live(int(entry.name)) and not (skip and skip(int(entry.name), cmdline)):
            found.append((int(entry.name), cmdline))
    return found


def leftover_processes(tag: str, grace_s: float | None = None, skip=None) -> list[tuple[int, str]]:
    """Processes of this session still alive after a grace period; they are then killed.

    A process may take a moment to exit after its mesh is stopped, so we wait
    `grace_s` (default $KOANS_LEAK_GRACE or 5 s) before calling anything a leak.
    `skip(pid, command line)` names the session's own helpers (koans.testkit.zygote's).
    """
    if grace_s is None:
        grace_s = float(os.environ.get("KOANS_LEAK_GRACE", "5"))
    if not Path("/proc").is_dir():  # not Linux: nothing we can check
        return []
    deadline = time.monotonic() + grace_s
    alive = tagged_processes(tag, skip)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = tagged_processes(tag, skip)
    for pid, _ in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return alive


class _Probe(Actor):
    @endpoint
    def ping(self) -> bool:
        return True


class ProcessFacts(Actor):
    """Where and how its process started (tests of koans/testkit/forkserver.py)."""

    @endpoint
    def facts(self, env_names: list[str]) -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0],
                "env": {name: os.environ.get(name) for name in env_names}, "torch_loaded": "torch" in sys.modules}


def process_imports(paths: list[Path]) -> list[str]:
    """What the Monarch processes of these test files or folders import (Chapter.process_imports,
    every chapter's for a folder, torch for a file of no chapter): a session's zygote preloads it."""
    chapters, modules = [], []
    for path in paths:
        chapter = chapter_for_module(path.stem) if path.is_file() else None
        if path.is_dir():
            chapters.extend(CHAPTERS)
        elif chapter is not None:
            chapters.append(chapter)
        else:
            modules.append("torch")
    for chapter in chapters:
        modules.extend(chapter.process_imports)
    return list(dict.fromkeys(modules))


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
