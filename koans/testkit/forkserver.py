"""Test plumbing: Monarch processes forked from a warm Python, not started cold. Nothing to learn here.

Every Monarch process the tests start imports torch (and some, transformers): one to three
seconds of CPU each on a small machine, and a chapter starts several. So the test session keeps
one "warm" process (here: the zygote) that has imported them once, and every new Monarch process
is forked from it, with the imports already done:

    Monarch's host agent                        the zygote (torch imported, no Monarch runtime)
      |  starts (as usual) a tiny launcher            |
      |    launcher --- environment, cwd, fds ------> |  fork()
      |    launcher <--------- child's pid ---------- |    `-> child: takes the launcher's fds and
      |    (forwards signals; exits as the child         environment, then runs Monarch's usual
      |     does, with the same status)                  process bootstrap
      v

To Monarch the launcher is the process: it exits when the child does, with the same status, and a
signal sent to it reaches the child. If the launcher is killed, the child kills itself. If the
zygote cannot be reached, the launcher starts Monarch's usual bootstrap itself (a cold start).

`koans verify` starts hundreds of test sessions: it keeps one zygote for all of them
(`Zygote.start_shared`), which forks each session itself too (`forkserver.py pytest ARGS`, a
launcher like Monarch's), so no session imports torch again.

This file runs as a script (`python -S forkserver.py serve|launch|pytest ...`): the zygote, the
launcher and nothing else, with no import of koans. The test session's side (starting a zygote,
pointing Monarch's bootstrap at the launcher) is koans/testkit/zygote.py.

The zygote never starts Monarch's runtime (its threads would not survive a fork), and it is not
used on a machine with an NVIDIA GPU, where processes start the usual way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

ADDRESS_ENV = "KOANS_FORKSERVER"  # the zygote's socket, for the launcher; "0" in the environment: no zygote
LAUNCHER_PID_ENV = "KOANS_FORKSERVER_LAUNCHER"  # in a forked process: the pid Monarch knows it by
PLACE_ENV = "KOANS_FORKSERVER_PLACE"  # the zygote's host and namespaces: a launcher elsewhere starts cold
SHARED_ENV = "KOANS_SHARED_ZYGOTE"  # a zygote's socket that sessions share instead of starting their own
FOLDER_PREFIX = "koans-zygote-"  # a zygote's socket lives in a fresh folder named so, with its owner's pid
BOOTSTRAP_MODULE = "monarch._src.actor.bootstrap_main"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_HIGH_FD = 900  # where the child parks descriptors while it puts the launcher's in place


# ---------------------------------------------------------------- framing (both sides)


def _send(sock: socket.socket, kind: bytes, payload: bytes = b"", fds: list[int] = ()) -> None:
    message = kind + struct.pack("!I", len(payload)) + payload
    if fds:
        socket.send_fds(sock, [message[:1024]], list(fds))
        sock.sendall(message[1024:])
    else:
        sock.sendall(message)


def _recv_exact(sock: socket.socket, size: int, fds: list[int] | None = None) -> bytes:
    data = b""
    while len(data) < size:
        if fds is not None and not data:
            chunk, received, _, _ = socket.recv_fds(sock, size, 256)
            fds.extend(received)
        else:
            chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other side closed the connection")
        data += chunk
    return data


def _recv(sock: socket.socket, fds: list[int] | None = None) -> tuple[bytes, bytes]:
    head = _recv_exact(sock, 5, fds)
    (size,) = struct.unpack("!I", head[1:])
    return head[:1], _recv_exact(sock, size)


# ---------------------------------------------------------------- the launcher (Monarch starts this)


def _cold_start(pytest_args: list[str] | None = None) -> None:
    """Monarch's usual bootstrap (or the pytest session), in this very process (no zygote to fork from)."""
    if pytest_args is None:
        os.execv(sys.executable, [sys.executable, "-m", BOOTSTRAP_MODULE])
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *pytest_args])


def _launch(pytest_args: list[str] | None = None) -> None:
    """Have the zygote fork this process's stand-in, and be it to the outside. The stand-in is a Monarch
    process, or, with `pytest_args`, a pytest session (a shared zygote's: $KOANS_SHARED_ZYGOTE)."""
    address = os.environ.get(ADDRESS_ENV if pytest_args is None else SHARED_ENV, "")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        _cold_start(pytest_args)
    own = sock.fileno()
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) != own)
    fds = [fd for fd in fds if _is_open(fd)]
    env = dict(os.environ) if pytest_args is not None else dict(os.environ, **{LAUNCHER_PID_ENV: str(os.getpid())})
    request = {"env": env, "cwd": os.getcwd(), "fds": fds, "pytest": pytest_args}
    child = 0
    pending: list[int] = []

    def forward(signum, _frame):
        if child:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass
        else:
            pending.append(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    try:
        _send(sock, b"F", json.dumps(request).encode(), fds)
        kind, payload = _recv(sock)
    except (OSError, EOFError):
        _cold_start(pytest_args)  # the zygote went away before it forked: nothing was started
    if kind != b"P":
        _cold_start(pytest_args)  # the zygote could not fork (it said why on its stderr)
    child = int(payload)
    for signum in pending:
        forward(signum, None)
    try:
        kind, payload = _recv(sock)
        status = int(payload) if kind == b"S" else None
    except (OSError, EOFError):
        status = None  # the zygote went away: the child's status is lost
    if status is None:
        os._exit(1)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)  # end as the child did: killed by the same signal
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- the zygote


def _serve(address: str, preload: list[str]):
    """Listen at `address`, import `preload`, then fork one child per launcher. Returns only in a
    forked child: the function that runs Monarch's bootstrap there."""
    import selectors
    import warnings

    # Python 3.12 warns about fork() in a process with threads; the zygote's only other thread is
    # numpy's BLAS pool, which re-creates itself after a fork.
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)  # launchers may connect now; they wait while the imports run
    _preload(preload)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    parent = os.getppid()
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                job = _handle(conn, children, closing=[selector, listener, wake_read, wake_write])
                if job is not None:
                    return job  # in the child
            else:
                try:
                    os.read(wake_read, 4096)
                except BlockingIOError:
                    pass
        _reap(children)
        if os.getppid() != parent:  # the test session is gone, maybe killed before its cleanup ran:
            _remove_own_folder(address)  # so are we, and our socket's folder
            return None


def _remove_own_folder(address: str) -> None:
    import shutil

    folder = os.path.dirname(address)
    if os.path.basename(folder).startswith(FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def _preload(modules: list[str]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # a child imports it itself, as a cold process would
            print(f"koans forkserver: could not preload {name}: {err}", file=sys.stderr)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                _send(conn, b"S", str(status).encode())
            except OSError:
                pass
            conn.close()


def _handle(conn: socket.socket, children: dict[int, socket.socket], closing: list):
    """One launcher's request: fork. In the child, returns the function that becomes Monarch's
    process (the zygote's own sockets and pipes, in `closing`, closed first); in the zygote, None."""
    fds: list[int] = []
    try:
        _, payload = _recv(conn, fds)
        request = json.loads(payload)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except Exception as err:
        print(f"koans forkserver: {type(err).__name__}: {err}", file=sys.stderr)
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    if pid == 0:
        for other in [*children.values(), *closing]:
            other.close() if hasattr(other, "close") else os.close(other)
        return lambda: _become_monarch_process(conn, fds, request)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:
        _send(conn, b"P", str(pid).encode())
    except OSError:
        pass  # the launcher is gone: its child sees the closed connection and ends itself
    return None


def _become_monarch_process(conn: socket.socket, received: list[int], request: dict) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # The launcher's descriptors, at the numbers it had them (stdout, stderr, Monarch's pipes).
    parked = [_dup_high(fd) for fd in received]
    for fd in received:
        os.close(fd)
    raw = conn.detach()
    conn = socket.socket(fileno=_dup_high(raw))
    os.close(raw)
    for target, fd in zip(request["fds"], parked):
        os.dup2(fd, target)
        os.close(fd)
    zygote_pythonpath = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _adopt_pythonpath(zygote_pythonpath, request["env"].get("PYTHONPATH", ""), request["cwd"])
    if request.get("pytest") is not None:  # a test session, as `python -m pytest ARGS` in its own session
        os.setsid()  # a group of its own, with the processes it starts: they end with it
        _die_with_launcher(conn, whole_group=True)
        import pytest

        # The zygote imported pytest's plugins' modules already (anyio, through transformers): pytest says
        # it cannot rewrite their asserts. They are not the tests, whose asserts it does rewrite.
        args = ["-W", "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning",
                *request["pytest"]]
        sys.argv = ["pytest", *args]
        sys.exit(pytest.main(args))
    sys.argv = [BOOTSTRAP_MODULE]
    _die_with_launcher(conn)

    import multiprocessing

    multiprocessing.set_start_method("forkserver", force=True)  # as Monarch's bootstrap sets it
    from monarch._src.actor.bootstrap_main import invoke_main

    invoke_main()


def _run_and_leave(job) -> None:
    """Run a forked child's bootstrap, then leave without the interpreter's teardown. That teardown
    would touch, and so copy, every page the child shares with the zygote, for nothing: with it a
    3-process mesh took 0.7 s to stop here, without it 0.4 s. Exit handlers still run, and the
    streams are flushed."""
    import atexit
    import traceback

    code = 0
    try:
        job()
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)


def _adopt_pythonpath(zygote_pythonpath: str, pythonpath: str, cwd: str) -> None:
    """sys.path as `python -m` in `cwd` with this PYTHONPATH would have it."""
    for entry in [p for p in zygote_pythonpath.split(os.pathsep) if p]:
        while entry in sys.path:
            sys.path.remove(entry)
    theirs = [p for p in pythonpath.split(os.pathsep) if p]
    sys.path[0:1] = [cwd, *theirs]


def _die_with_launcher(conn: socket.socket, whole_group: bool = False) -> None:
    """The launcher only ends after this process does; if the connection closes first, it was killed.
    Then this process dies, and with `whole_group`, its process group too."""
    import threading

    def watch():
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        if whole_group:
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="koans-launcher-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    if argv[:1] == ["launch"]:
        _launch()
    elif argv[:1] == ["pytest"]:  # python -S forkserver.py pytest ARGS: a pytest session, forked if it can be
        _launch(argv[1:])
    elif argv[:1] == ["serve"]:
        sys.path[0] = os.getcwd()  # not this file's folder: as `python -m` would have it
        job = _serve(argv[1], argv[2:])
        if job is not None:
            _run_and_leave(job)


if __name__ == "__main__":
    main(sys.argv[1:])
