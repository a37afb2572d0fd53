"""koans/testkit/forkserver.py and zygote.py: the tests' Monarch processes fork from a warm Python, and to Monarch they
behave as processes it started itself. Run: pytest tests/course/test_forkserver.py"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from monarch.actor import default_bootstrap_cmd, this_host

from koans.course.manifest import PROJECT_ROOT, QWEN2
from koans.testkit import forkserver, processes
from koans.testkit.zygote import LAUNCHER_MARK, Zygote, _end_zygote, _LAUNCHER_PROGRAM, _spawn_zygote
from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT

ENV = [forkserver.LAUNCHER_PID_ENV, "HYPERACTOR_PROCESS_NAME", processes.SESSION_TAG_ENV, "KOANS_EXTRA"]


@pytest.fixture
def zygote(request):
    zygote = request.config.koans_zygote
    if zygote is None:
        pytest.skip("this session starts its processes cold (KOANS_FORKSERVER=0, or a machine with a GPU)")
    return zygote


def facts_of(procs, test_tag):
    return procs.spawn(f"facts_{test_tag}", processes.ProcessFacts).facts.call(ENV).get(timeout=STARTUP_TIMEOUT)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def wait_until_gone(pids, what):
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while any(processes.is_live(pid) for pid in pids):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_process_is_forked_from_the_zygote_with_its_imports_and_its_launchers_environment(zygote, fresh_procs,
                                                                                           test_tag):
    facts = [f for _, f in facts_of(fresh_procs(procs=2), test_tag).items()]
    for f in facts:
        assert f["ppid"] == zygote.process.pid, "forked by the zygote"
        assert f["torch_loaded"], "the zygote's imports come with it (nothing else here imports torch)"
        assert f["cwd"] == f["path0"] == os.getcwd(), "cwd and sys.path[0] as `python -m` would set them"
        launcher = int(f["env"][forkserver.LAUNCHER_PID_ENV])
        assert parent_of(launcher) == os.getpid(), "the launcher is what Monarch (in this process) started"
        assert f["env"][processes.SESSION_TAG_ENV] == os.environ[processes.SESSION_TAG_ENV]
    names = {f["env"]["HYPERACTOR_PROCESS_NAME"] for f in facts}
    assert len(names) == 2 and None not in names, "each child has its own launcher's environment, Monarch's variables too"


def test_a_launcher_stopped_or_killed_takes_its_process_along(zygote, fresh_procs, test_tag):
    procs = fresh_procs(procs=2)
    facts = [f for _, f in facts_of(procs, test_tag).items()]
    children = [f["pid"] for f in facts]
    launchers = [int(f["env"][forkserver.LAUNCHER_PID_ENV]) for f in facts]
    os.kill(launchers[0], signal.SIGTERM)  # forwarded to the process, which ends, then its launcher
    os.kill(launchers[1], signal.SIGKILL)  # cannot be forwarded: the process sees its launcher gone, and ends
    wait_until_gone(children, "a process outlived its launcher")
    wait_until_gone(launchers, "a launcher outlived its process")
    fresh_procs.forget(procs)


def test_a_bootstrap_command_asked_for_starts_its_process_cold_as_monarch_would(zygote, test_tag):
    command = default_bootstrap_cmd().with_env({"KOANS_EXTRA": "yes"})
    assert LAUNCHER_MARK not in repr(command), "Monarch's own command, unchanged"
    procs = this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=command)
    try:
        (facts,) = [f for _, f in facts_of(procs, test_tag).items()]
    finally:
        processes.stop_procs(procs)
    assert facts["ppid"] == os.getpid() and facts["env"]["KOANS_EXTRA"] == "yes"
    assert facts["env"][forkserver.LAUNCHER_PID_ENV] is None


def test_the_zygote_imports_what_the_chapters_asked_for_need():
    tests = PROJECT_ROOT / "tests"
    assert processes.process_imports([tests / "test_ch04_controllers.py"]) == []
    assert processes.process_imports([tests / "test_ch09_async_loops.py"]) == ["torch"]
    assert processes.process_imports([tests / "test_ch10_qwen_grpo_faults.py"]) == ["torch", QWEN2]
    assert processes.process_imports([tests / "course" / "test_harness.py"]) == ["torch"], "a file of no chapter: torch"
    assert processes.process_imports([tests]) == ["torch", QWEN2], "a folder: every chapter's"


def test_a_launcher_with_no_zygote_to_reach_starts_monarch_cold(tmp_path):
    """Another host, or a zygote gone: the launcher program runs Monarch's usual bootstrap."""
    program = _LAUNCHER_PROGRAM.replace(forkserver.BOOTSTRAP_MODULE, "this_module_proves_a_cold_start")
    env = {**os.environ, forkserver.ADDRESS_ENV: str(tmp_path / "no-socket")}
    done = subprocess.run([sys.executable, "-S", "-c", program, forkserver.__file__], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT * 6)
    assert "No module named this_module_proves_a_cold_start" in done.stderr, done.stderr[-2000:]


PROBE = '''
import json, os, sys, time

def test_facts():
    facts = {"pid": os.getpid(), "ppid": os.getppid(), "torch": "torch" in sys.modules, "cwd": os.getcwd()}
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(facts, out)

def test_fails():
    assert os.environ.get("PROBE_HANG") is None, "the exit status says a test failed"

def test_hangs():
    while os.environ.get("PROBE_HANG"):
        time.sleep(0.05)
'''


@pytest.fixture
def shared_zygote():
    """A zygote shared by the test sessions this process starts, as `koans verify` has one."""
    zygote = Zygote.start_shared(["torch"])
    if zygote is None:
        pytest.skip("processes start cold here (KOANS_FORKSERVER=0, or a machine with a GPU)")
    try:
        yield zygote
    finally:
        zygote.stop()
    assert forkserver.SHARED_ENV not in os.environ, "stopped: sessions started from now on start their own"


def launch_session(tmp_path, *pytest_args, **env):
    (tmp_path / "test_probe.py").write_text(PROBE)
    command = [sys.executable, "-S", forkserver.__file__, "pytest", "test_probe.py", "-q", "-p", "no:cacheprovider",
               *pytest_args]
    return subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PROBE_OUT": str(tmp_path / "facts"), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_shared_zygote_forks_whole_test_sessions(shared_zygote, tmp_path):
    """`koans verify` runs hundreds of sessions: each is forked from the shared zygote, torch imported already,
    and its exit status is the launcher's, as if pytest had run in the launcher itself."""
    session = launch_session(tmp_path)
    output, _ = session.communicate(timeout=STARTUP_TIMEOUT * 3)
    assert session.returncode == 0, output[-2000:]
    facts = json.loads((tmp_path / "facts").read_text())
    assert facts["ppid"] == shared_zygote.process.pid, "forked by the shared zygote"
    assert facts["torch"], "with the zygote's imports (the probe imports no torch)"
    assert facts["cwd"] == str(tmp_path), "in the launcher's folder"
    failing = launch_session(tmp_path, "-k", "fails", PROBE_HANG="1")
    output, _ = failing.communicate(timeout=STARTUP_TIMEOUT * 3)
    assert failing.returncode == 1 and "1 failed" in output, output[-2000:]


def test_a_session_whose_launcher_is_killed_ends_with_its_whole_group(shared_zygote, tmp_path):
    """The runner ends a session past its time limit by killing the launcher's group: the forked session,
    and whatever it started, must end too."""
    session = launch_session(tmp_path, "-k", "facts or hangs", PROBE_HANG="1")
    deadline = time.monotonic() + STARTUP_TIMEOUT * 3
    while not (tmp_path / "facts").exists() or not (tmp_path / "facts").read_text():
        assert time.monotonic() < deadline and session.poll() is None, "the session never ran its first test"
        time.sleep(0.05)
    forked = json.loads((tmp_path / "facts").read_text())["pid"]
    os.killpg(session.pid, signal.SIGKILL)
    session.wait(timeout=TIMEOUT)
    wait_until_gone([forked], "the forked session outlived its killed launcher")


OWNER = '''
import sys, time
sys.path.insert(0, sys.argv[1])
from koans.testkit import zygote
process, address, folder = zygote._spawn_zygote([])
while not __import__("os").path.exists(address):
    time.sleep(0.01)
print(folder, flush=True)
time.sleep(600)
'''


def test_a_zygote_killed_with_its_session_leaves_no_folder_behind_for_long(tmp_path):
    """A chapter past its time limit is killed with its whole process group, its zygote too: neither can
    clean up. The next zygote to start removes the folders whose owner is gone, and keeps the others."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(PROJECT_ROOT)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        abandoned = owner.stdout.readline().strip()
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(timeout=TIMEOUT)
    assert os.path.basename(abandoned).startswith(f"{forkserver.FOLDER_PREFIX}{owner.pid}-"), abandoned
    assert os.path.isdir(abandoned), "the kill left the folder (nobody could remove it)"
    process, _, kept = _spawn_zygote([])
    try:
        assert not os.path.exists(abandoned), "the next zygote's start removes a folder whose owner is gone"
        assert os.path.isdir(kept), "and keeps one whose owner runs"
    finally:
        _end_zygote(process, kept)
    assert not os.path.exists(kept)
