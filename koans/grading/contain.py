"""The grader's fourth layer: each chapter's code runs in a box of its own, and the box ends with the chapter.

Run as root (as Gradescope runs the autograder), a chapter's tests run

  - as a user of that chapter alone (koans-ch01 ... koans-ch12, made by `ensure_users`, which
    setup.sh calls): it cannot write the grader's files or results, nor signal the grader, nor touch
    another chapter's processes or files;
  - in new network, process, mount and IPC namespaces (util-linux's `unshare`): no network but a loopback
    of its own; every disk read-only but the one file the guards log to; shared memory of its own; and
    every process of the
    chapter dies when the chapter's first process ends, or when the time limit kills it: nothing
    outlives its chapter to rewrite a later one, and nothing can fill the grader's disk;
  - in a cgroup with a memory limit and a process limit (v2, or v1's memory and pids hierarchies),
    where the machine lets the grader make one; else with a per-user process limit (RLIMIT_NPROC);
  - with a /tmp and a /dev/shm of its own (tmpfs, 2 GiB each, gone with the box), no core files, and files
    of at most 2 GiB.

A machine that refuses a layer (a container without CAP_SYS_ADMIN cannot make namespaces; one without
a writable cgroup tree cannot limit memory) gets the others, and the results say which layers held.
Not root, nothing is isolated but the time limit and the process group: `koans grade` on your own
exercises needs no box, and says so.

Inside the namespaces, a small init (this module's `enter`, root there) brings the loopback up, drops
to the chapter's user, starts the command and reaps orphans; when the command ends, it ends, and the
kernel ends the rest.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

USER_PREFIX = "koans-"  # + the chapter's tag: koans-ch04
MEMORY_BYTES = int(float(os.environ.get("KOANS_CHAPTER_MEMORY_GB", "8")) * 2**30)
MAX_PROCESSES = int(os.environ.get("KOANS_CHAPTER_MAX_PROCESSES", "8192"))  # threads count too
MAX_FILE_BYTES = 2 * 2**30
TMP_BYTES = 2 * 2**30  # each of the box's own /tmp and /dev/shm
#: What a chapter's user must be able to do before its tests run: import pytest, and find torch and monarch
#: (found, not imported: finding them needs the same permissions, and costs no second of torch's import).
PROBE_IMPORTS = "import importlib.util, pytest; assert all(importlib.util.find_spec(m) for m in ('torch', 'monarch'))"


def chapter_user(tag: str) -> str:
    return USER_PREFIX + tag


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def ensure_users(tags: list[str]) -> list[str]:
    """Make each chapter's user (root only; what setup.sh runs). Returns the names made or found."""
    made = []
    for tag in tags:
        name = chapter_user(tag)
        if _uid_gid(name) is None:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
        made.append(name)
    return made


def _uid_gid(name: str) -> tuple[int, int] | None:
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


_PROBED: dict[str, str | None] = {}


def account_problem(tag: str) -> str | None:
    """None when the chapter's user exists and can run this Python; else why not (cached)."""
    if tag in _PROBED:
        return _PROBED[tag]
    found = _uid_gid(chapter_user(tag))
    if found is None:
        problem = f"no user {chapter_user(tag)} (setup.sh makes it: python -m koans.grading.contain users)"
    else:
        try:
            probe = subprocess.run([sys.executable, "-c", PROBE_IMPORTS], cwd="/", user=found[0], group=found[1],
                                   extra_groups=[], capture_output=True, text=True, timeout=180)
            problem = None if probe.returncode == 0 else (
                f"{chapter_user(tag)} cannot run {sys.executable} with its packages: "
                f"{(probe.stderr.strip().splitlines() or ['?'])[-1]} (every folder from / to the interpreter "
                "and its packages must be readable and searchable by others)")
        except (OSError, subprocess.SubprocessError) as err:
            problem = f"{chapter_user(tag)} cannot run {sys.executable}: {err}"
    _PROBED[tag] = problem
    return problem


def namespaces_problem() -> str | None:
    """None when `unshare` can make the namespaces here; else why not (cached)."""
    if "unshare" not in _PROBED:
        unshare = shutil.which("unshare")
        if unshare is None:
            _PROBED["unshare"] = "no unshare command (util-linux)"
        else:
            done = subprocess.run([unshare, "--net", "--pid", "--mount", "--ipc", "--fork", "--kill-child", "--mount-proc",
                                   "sh", "-c", "mount -o remount,bind,ro / && mount -t tmpfs tmpfs /tmp"],
                                  capture_output=True, text=True, timeout=30)
            _PROBED["unshare"] = None if done.returncode == 0 else f"unshare refused: {done.stderr.strip()[:200]}"
    return _PROBED["unshare"]


# ---------------------------------------------------------------- cgroups


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    except OSError:
        pass
    return found


@dataclass
class Cgroup:
    """The folders of one chapter's cgroup: one (v2) or one per controller (v1)."""

    folders: list[Path] = field(default_factory=list)
    version: int = 0

    @classmethod
    def make(cls, name: str) -> "Cgroup | None":
        own = _own_cgroups()
        base = Path("/sys/fs/cgroup")
        if (base / "cgroup.controllers").is_file() and "" in own:  # v2 alone
            return cls._make_v2(base / own[""].lstrip("/"), name)
        if "memory" in own and "pids" in own and (base / "memory").is_dir() and (base / "pids").is_dir():  # v1
            folders = []
            try:
                for controller, limit_file, limit in (("memory", "memory.limit_in_bytes", MEMORY_BYTES),
                                                      ("pids", "pids.max", MAX_PROCESSES)):
                    folder = base / controller / own[controller].lstrip("/") / name
                    folder.mkdir()
                    folders.append(folder)
                    (folder / limit_file).write_text(str(limit))
                if (folders[0] / "memory.memsw.limit_in_bytes").exists():
                    (folders[0] / "memory.memsw.limit_in_bytes").write_text(str(MEMORY_BYTES))
                return cls(folders, 1)
            except OSError:
                cls(folders, 1).remove()
        return None

    @classmethod
    def _make_v2(cls, parent: Path, name: str) -> "Cgroup | None":
        folder = parent / name
        try:
            folder.mkdir()
            (folder / "memory.max").write_text(str(MEMORY_BYTES))
            (folder / "memory.swap.max").write_text("0") if (folder / "memory.swap.max").exists() else None
            (folder / "pids.max").write_text(str(MAX_PROCESSES))
            return cls([folder], 2)
        except OSError:
            cls([folder], 2).remove()
            return None

    def peak_bytes(self) -> int | None:
        """The most memory the chapter's processes held at once (None where the kernel does not say)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.folders[0] / name).read_text())
        except (OSError, ValueError, IndexError):
            return None

    def pids(self) -> list[int]:
        found = set()
        for folder in self.folders:
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found)

    def remove(self) -> None:
        """Kill whatever is left in it, then remove it."""
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass


# ---------------------------------------------------------------- the box


@dataclass
class Box:
    """How one chapter's code runs: which layers this machine gave it."""

    tag: str
    account: tuple[int, int] | None = None
    namespaces: bool = False
    cgroup: Cgroup | None = None
    missing: list[str] = field(default_factory=list)  # the layers that did not hold, and why
    peak_bytes: int | None = None  # the chapter's peak memory, read when the box closes

    @classmethod
    def open(cls, tag: str) -> "Box":
        box = cls(tag)
        if not is_root():
            box.missing.append("not run as root: the tests ran as this user, unboxed (as `koans grade` does)")
            return box
        problem = account_problem(tag)
        if problem is None:
            box.account = _uid_gid(chapter_user(tag))
        else:
            box.missing.append(f"the tests ran as root: {problem}")
        problem = namespaces_problem()
        box.namespaces = problem is None
        if problem is not None:
            box.missing.append(f"no namespaces (network not cut, disks writable; processes ended by user instead): "
                               f"{problem}")
        box.cgroup = Cgroup.make(f"koans-{tag}-{os.getpid()}-{time.monotonic_ns()}")
        if box.cgroup is None:
            box.missing.append(f"no cgroup: no memory limit; at most {MAX_PROCESSES} processes per chapter user")
        return box

    def describe(self) -> str:
        held = []
        if self.account:
            held.append(f"user {chapter_user(self.tag)}")
        if self.namespaces:
            held.append("no network, read-only disks, own process namespace")
        if self.cgroup:
            peak = f" (peak {self.peak_bytes / 2**30:.1f})" if self.peak_bytes else ""
            held.append(f"cgroup v{self.cgroup.version}: {MEMORY_BYTES / 2**30:g} GiB{peak}, {MAX_PROCESSES} processes")
        text = "boxed: " + (", ".join(held) if held else "nothing")
        return text + ("" if not self.missing else "; " + "; ".join(self.missing))

    def command(self, argv: list[str], writable: tuple[str, ...] = ()) -> list[str]:
        """`argv`, as it runs in this box; `writable`: files its code may write (in namespaces, nothing else)."""
        if not is_root():
            return argv
        enter = [sys.executable, "-m", "koans.grading.contain", "enter", *[f"--writable={w}" for w in writable]]
        if self.account:
            enter += ["--uid", str(self.account[0]), "--gid", str(self.account[1])]
        if self.namespaces:
            enter += ["--loopback"]
        for folder in self.cgroup.folders if self.cgroup else []:
            enter += ["--cgroup", str(folder)]
        enter += ["--", *argv]
        if self.namespaces:
            return [shutil.which("unshare"), "--net", "--pid", "--mount", "--ipc", "--fork", "--kill-child",
                    "--mount-proc", "--", *enter]
        return enter

    def close(self, process: subprocess.Popen | None = None) -> None:
        """End everything the chapter started, whatever state it is in."""
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                process.kill()
            process.wait()
        if self.cgroup is not None:
            self.peak_bytes = self.peak_bytes or self.cgroup.peak_bytes()
            self.cgroup.remove()
        if self.account is not None:
            kill_user_processes(self.account[0])


def kill_user_processes(uid: int) -> int:
    """SIGKILL every process of `uid` until none is left; the number killed."""
    killed = 0
    for _ in range(50):
        left = [pid for pid in _pids() if _uid_of(pid) == uid]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.05)
    return killed


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def processes_of(uid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of `uid` (for the checks after a run)."""
    found = []
    for pid in _pids():
        if _uid_of(pid) == uid:
            try:
                found.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]))
            except OSError:
                pass
    return found


# ---------------------------------------------------------------- inside the box (root there, for a moment)


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket() as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, 0x8913, request))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))  # SIOCSIFFLAGS: IFF_UP


#: File systems that hold no data of a disk's: left as they are when the box makes the disks read-only.
VIRTUAL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "tmpfs", "cgroup", "cgroup2", "mqueue",
                                  "securityfs", "debugfs", "tracefs", "pstore", "bpf", "fusectl", "configfs",
                                  "hugetlbfs", "binfmt_misc", "autofs", "nsfs", "efivarfs"})


def _seal_file_systems(writable: list[str], uid: int | None, gid: int | None) -> None:
    """In the box's mount namespace: every disk read-only but the files in `writable` (the guard log), and a
    fresh, size-limited /tmp and /dev/shm (tmpfs, charged to the chapter's cgroup). Nothing the chapter
    writes outlives it, and it cannot fill the machine's disk."""
    for path in writable:
        subprocess.run(["mount", "--bind", path, path], check=True)
    mounted = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        point = point.replace("\\040", " ")
        if kind not in VIRTUAL_FILE_SYSTEMS and point not in writable and point not in mounted:
            mounted.append(point)
    for point in mounted:
        subprocess.run(["mount", "-o", "remount,bind,ro", point], check=True)
    for folder in ("/tmp", "/dev/shm"):
        if Path(folder).is_dir():
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMP_BYTES},mode=1777", "tmpfs", folder], check=True)
    if uid is not None:
        home = Path("/tmp/home")
        home.mkdir()
        os.chown(home, uid, gid)


def enter(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.grading.contain enter")
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--loopback", action="store_true")
    parser.add_argument("--cgroup", action="append", default=[])
    parser.add_argument("--writable", action="append", default=[], help="a file that stays writable (in namespaces)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    for folder in args.cgroup:  # this process and all it starts
        Path(folder, "cgroup.procs").write_text(str(os.getpid()))
    if args.loopback:  # in new namespaces: a loopback, disks read-only, a /tmp and /dev/shm of the chapter's own
        _loopback_up()
        _seal_file_systems(args.writable, args.uid, args.gid)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    child = os.fork()
    if child == 0:
        try:  # under memory pressure, the kernel ends the chapter's processes before the grader's
            Path("/proc/self/oom_score_adj").write_text("1000")
        except OSError:
            pass
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        if args.uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
            os.setgroups([])
            os.setgid(args.gid)
            os.setuid(args.uid)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # passed on to the command
        signal.signal(signum, lambda s, _f: os.kill(child, s))
    while True:  # reap every orphan until the command itself ends
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["enter"]:
        return enter(argv[1:])
    if argv[:1] == ["users"]:
        from koans.course.manifest import CHAPTERS

        names = ensure_users([chapter.tag for chapter in CHAPTERS])
        print("chapter users:", ", ".join(names))
        return 0
    print("usage: python -m koans.grading.contain users | enter [--uid U --gid G --loopback --cgroup DIR] -- COMMAND",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
