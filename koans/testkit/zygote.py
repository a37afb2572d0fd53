"""The test session's side of koans/testkit/forkserver.py: start the session's zygote (or use the one
`koans verify` shares), and make Monarch's bootstrap command run forkserver.py's launcher, so that the
session's Monarch processes are forked from the zygote instead of started cold.
"""

from __future__ import annotations

import os
import sys

from koans.testkit import forkserver
from koans.testkit.forkserver import ADDRESS_ENV, BOOTSTRAP_MODULE, FOLDER_PREFIX, PLACE_ENV, SHARED_ENV


class Zygote:
    """The warm process of one test session: `Zygote.start(preload)`, then `.stop()`."""

    def __init__(self, process, address: str, directory: str):
        self.process, self.address, self.directory = process, address, directory

    @classmethod
    def start(cls, preload=("torch",)) -> "Zygote | None":
        """Start the zygote, and make it the way Monarch starts processes on hosts created from now on
        until `only_existing_hosts()`. None where it does not apply. Where $KOANS_SHARED_ZYGOTE names a
        zygote that serves many sessions (`Zygote.start_shared`), the session forks from that one."""
        if os.environ.get(ADDRESS_ENV) == "0" or sys.platform != "linux" or os.path.exists("/dev/nvidia0"):
            return None
        if not _patch_monarch_bootstrap():
            return None
        shared = os.environ.get(SHARED_ENV, "")
        if shared and os.path.exists(shared):
            zygote = cls(None, shared, None)
        else:
            zygote = cls(*_spawn_zygote(preload))
        _LAUNCH_ENV[ADDRESS_ENV] = zygote.address
        _LAUNCH_ENV[PLACE_ENV] = _place()
        return zygote

    @classmethod
    def start_shared(cls, preload) -> "Zygote | None":
        """One zygote for every test session this process starts from now on (`koans verify` starts
        hundreds): the runner forks each session from it (the `pytest` launcher), and the session forks
        its Monarch processes from it too, instead of starting a zygote of its own that imports torch
        again. Sessions find it through $KOANS_SHARED_ZYGOTE. None where zygotes do not apply."""
        if os.environ.get(ADDRESS_ENV) == "0" or sys.platform != "linux" or os.path.exists("/dev/nvidia0"):
            return None
        import time

        zygote = cls(*_spawn_zygote([*preload, "pytest"]))  # it forks the sessions themselves too
        deadline = time.monotonic() + 60  # until it listens (a launcher that finds no socket starts cold)
        while not os.path.exists(zygote.address) and zygote.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.environ[SHARED_ENV] = zygote.address
        return zygote

    @staticmethod
    def only_existing_hosts() -> None:
        """From now on Monarch's default bootstrap command is its own again. The hosts made so far
        (the test session's own) keep forking from the zygote; a command asked for explicitly, to add
        environment or for another host, starts its processes cold, exactly as Monarch would."""
        from monarch._src.actor import host_mesh

        original = getattr(host_mesh._get_bootstrap_args, "original", None)
        if original is not None:
            host_mesh._get_bootstrap_args = original

    def is_helper(self, pid: int, cmdline: str) -> bool:
        """The zygote itself, or a launcher: not a Monarch process of their own (a forked child is)."""
        return (self.process is not None and pid == self.process.pid) or LAUNCHER_MARK in cmdline

    def stop(self) -> None:
        """Processes started from now on start cold; those forked already live on. A shared zygote
        is stopped only by the process that started it."""
        _LAUNCH_ENV.clear()
        if self.process is None:
            return
        if os.environ.get(SHARED_ENV) == self.address:
            del os.environ[SHARED_ENV]
        _end_zygote(self.process, self.directory)


def _spawn_zygote(preload) -> tuple:
    """A zygote process that preloads `preload`, listening at a fresh socket: (process, address, folder).
    It ends by itself when the process that started it does."""
    import atexit
    import subprocess
    import tempfile

    _sweep_abandoned_folders()
    directory = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")  # the owner's pid, for the sweep
    address = os.path.join(directory, "socket")
    process = subprocess.Popen([sys.executable, os.path.abspath(forkserver.__file__), "serve", address, *preload],
                               stdin=subprocess.DEVNULL, close_fds=True)
    atexit.register(_end_zygote, process, directory)
    return process, address, directory


def _sweep_abandoned_folders() -> None:
    """Remove the folders of zygotes whose owner is gone. A test session killed with its process group
    (a chapter past its time limit) takes its zygote along before either can clean up."""
    import glob
    import shutil
    import tempfile

    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{FOLDER_PREFIX}*-*")):
        owner = os.path.basename(folder)[len(FOLDER_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not _is_running(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _end_zygote(process, directory: str) -> None:
    import shutil

    if process.poll() is None:
        process.kill()
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)


_LAUNCH_ENV: dict[str, str] = {}

# What Monarch runs: this file's launcher where this host has the file and a zygote, else Monarch's usual
# bootstrap (a process on another host starts cold).
LAUNCHER_MARK = "# koans forkserver launcher"
_LAUNCHER_PROGRAM = f"""{LAUNCHER_MARK}
import os, sys
def place():
    return " ".join([os.uname().nodename] + [os.readlink("/proc/self/ns/" + n) for n in ("mnt", "net", "pid", "uts")])
launcher, zygote = sys.argv[1], os.environ.get({ADDRESS_ENV!r}, "")
if os.path.exists(launcher) and zygote and os.path.exists(zygote) and os.environ.get({PLACE_ENV!r}) == place():
    sys.argv = [launcher, "launch"]
    exec(compile(open(launcher).read(), launcher, "exec"))
else:
    os.execv(sys.executable, [sys.executable, "-m", {BOOTSTRAP_MODULE!r}])
"""


def _place() -> str:
    """This host and its namespaces, as the launcher program spells them."""
    return " ".join([os.uname().nodename] + [os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "net", "pid", "uts")])


def _patch_monarch_bootstrap() -> bool:
    """Monarch's default bootstrap command runs the launcher (torchmonarch 0.7: host_mesh's
    `_get_bootstrap_args`). False, and nothing changed, where that hook is missing."""
    try:
        from monarch._src.actor import host_mesh
    except ImportError:
        return False
    original = getattr(host_mesh, "_get_bootstrap_args", None)
    if original is None:
        return False
    original = getattr(original, "original", original)
    launcher = os.path.abspath(forkserver.__file__)

    def bootstrap_args():
        if ADDRESS_ENV not in _LAUNCH_ENV:
            return original()
        return sys.executable, ["-S", "-c", _LAUNCHER_PROGRAM, launcher], dict(_LAUNCH_ENV)

    bootstrap_args.original = original
    host_mesh._get_bootstrap_args = bootstrap_args
    return True
