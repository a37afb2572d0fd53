"""The box a chapter's code runs in (koans.grading.contain), attacked with code that had got past every other layer.

These run plain Python in the box, guards or no guards: the box must hold on its own. As root only (the
autograder's case; CI runs as root and sets KOANS_REQUIRE_GRADER_BOX=1 so that these fail instead of skipping).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from koans.grading import contain
from koans.course.manifest import PROJECT_ROOT  # the box's own `enter` runs this checkout's code, as the judge's runs its tree's

pytestmark = pytest.mark.time_limit(300)


@pytest.fixture
def tmp_path():
    """A folder the chapter's user may read (pytest's own are root's alone), outside /tmp (the box has its own)."""
    folder = Path(tempfile.mkdtemp(prefix="koans-box-test-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _box_or_skip(tag="ch04"):
    problems = []
    if not contain.is_root():
        problems.append("not root")
    else:
        contain.ensure_users([tag])
        problems += [p for p in (contain.account_problem(tag), contain.namespaces_problem()) if p]
    if problems:
        if os.environ.get("KOANS_REQUIRE_GRADER_BOX"):
            pytest.fail("the grader's box cannot be made here: " + "; ".join(problems))
        pytest.skip("the grader's box needs root, its users and namespaces: " + "; ".join(problems))
    return contain.Box.open(tag)


def run_boxed(box, code: str, tmp_path, timeout=120) -> dict:
    """Run `code` (Python) in `box`; it prints one JSON line of what it found."""
    script = tmp_path / "attack.py"
    script.write_text(textwrap.dedent(code))
    for path in (tmp_path, script):
        path.chmod(0o755 if path.is_dir() else 0o644)
    process = subprocess.Popen(box.command([sys.executable, str(script)]), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": str(PROJECT_ROOT)})
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        box.close(process)
    lines = out.strip().splitlines()
    assert lines, f"the attack printed nothing: {err[-2000:]}"
    return json.loads(lines[-1])


def test_code_in_the_box_cannot_signal_write_read_or_reach_out(tmp_path):
    box = _box_or_skip()
    results = tmp_path / "results"
    results.mkdir(mode=0o755)
    secret = tmp_path / "judge"
    secret.mkdir(mode=0o700)
    (secret / "reference.py").write_text("ANSWER = 42\n")
    found = run_boxed(box, f'''
        import json, os, socket
        found = {{"uid": os.getuid()}}
        def attempt(name, action):
            try:
                action()
                found[name] = "done"
            except OSError as err:
                found[name] = type(err).__name__
        attempt("signal the judge", lambda: os.kill({os.getpid()}, 0))
        attempt("write the results", lambda: open("{results}/results.json", "w").write("{{}}"))
        attempt("read the reference", lambda: open("{secret}/reference.py").read())
        attempt("reach the network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=3))
        attempt("use its own loopback", lambda: socket.socket().bind(("127.0.0.1", 0)))
        attempt("write to a disk", lambda: open("/var/tmp/koans-box-was-here", "w").write("x"))
        attempt("write to its own /tmp", lambda: open("/tmp/scratch", "w").write("x"))
        found["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print(json.dumps(found))
    ''', tmp_path)
    assert found["uid"] == box.account[0] != 0, "the code runs as the chapter's own user, not root"
    assert found["signal the judge"] in ("PermissionError", "ProcessLookupError"), found  # (not even seen, in its namespace)
    assert found["write the results"] in ("PermissionError", "OSError"), found  # root's folder, on a read-only disk
    assert found["read the reference"] == "PermissionError", found
    assert found["reach the network"] in ("OSError", "TimeoutError", "ConnectionRefusedError"), found
    assert found["use its own loopback"] == "done", "Monarch's processes talk over the box's own loopback"
    assert found["write to a disk"] == "OSError", f"every disk is read-only in the box: {found}"
    assert found["write to its own /tmp"] == "done" and not Path("/tmp/scratch").exists(), \
        "its /tmp is its own, and gone with it"
    assert max(found["pids"]) < 100 and os.getpid() not in found["pids"], \
        f"it sees only its own process namespace: {found['pids']}"
    assert not (results / "results.json").exists()


def test_nothing_the_box_started_outlives_it(tmp_path):
    box = _box_or_skip()
    found = run_boxed(box, '''
        import json, os, subprocess, time
        # a daemon that leaves its session and parent, as a hostile chapter would start to rewrite a later one
        subprocess.Popen(["/bin/sh", "-c", "sleep 1000 & sleep 1000"], start_new_session=True)
        time.sleep(0.5)
        print(json.dumps({"started": True}))
    ''', tmp_path)
    assert found == {"started": True}
    time.sleep(0.5)
    left = contain.processes_of(box.account[0])
    assert left == [], f"processes of {contain.chapter_user(box.tag)} left after its box closed: {left}"


def test_a_chapter_that_eats_memory_is_ended_and_the_grader_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(contain, "MEMORY_BYTES", 512 * 2**20)
    box = _box_or_skip()
    if box.cgroup is None:
        pytest.skip("no cgroup can be made here: memory is not limited (the results say so)")
    script = tmp_path / "eat.py"
    script.write_text("print('eating', flush=True)\nchunks = []\nwhile True:\n    chunks.append(bytearray(64 * 2**20))\n")
    script.chmod(0o644)
    process = subprocess.Popen(box.command([sys.executable, str(script)]), cwd=tmp_path, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    try:
        out, _ = process.communicate(timeout=120)
    finally:
        box.close(process)
    assert out.startswith("eating"), "the attack ran"
    assert process.returncode in (137, -9), f"the kernel killed it at its memory limit (SIGKILL), not {process.returncode}"
    assert contain.processes_of(box.account[0]) == []
