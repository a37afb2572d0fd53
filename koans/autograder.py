"""`koans autograder`: the zip that Gradescope's autograder expects, and what runs inside it.

    koans autograder --out autograder.zip [--wheels DIR]

The zip holds the student edition of this project (koans.edition: pristine exercises, tests, the
runner; no solutions/, no mutants/, no reference answer) plus Gradescope's two scripts at its top level:

  setup.sh         run once to build the image: installs the CPU build of torch
                   (torch==2.13.0) and this project, and makes the unprivileged user
                   koans-grader. Offline when the zip has a wheels/ folder (--wheels DIR
                   puts DIR's wheels there): then pip installs with --no-index --find-links wheels/.
  run_autograder   run per submission: grades the submitted exercise files
                   (chNN_<topic>.py, found anywhere in the submission) and writes
                   results/results.json.

Grading trusts nothing in a submission (docs/appendix/instructors.md says what that guarantees):

  - only the TODO regions of each submitted chapter file are used, put into the pristine stub
    (koans.guard); given code, module-level code and every other submitted file are ignored, and
    the results say what was ignored;
  - each region is checked statically before anything runs; a file with an escape hatch (dunder
    access, sys/os/gc/open/eval..., imports outside an allowlist, monkeypatching, pytest hooks...)
    is refused: its chapter scores 0, with each finding as file:line;
  - each chapter runs in its own pytest process on a fresh copy of the pristine tree, holding only
    that chapter's file and those of the chapters it builds on; as root (Gradescope), the copy is
    read-only to the tests, which run as the unprivileged user koans-grader;
  - a chapter whose session ends before every test has run scores 0 (koans.grade).

Gradescope unpacks the zip into /autograder/source, puts the submission in
/autograder/submission and reads /autograder/results/results.json. Set
$AUTOGRADER_ROOT to use another folder than /autograder (for tests). Set
$KOANS_CHAPTERS (e.g. 1,2,3) in run_autograder to grade part of the course.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import zipfile
from pathlib import Path

from koans.manifest import CHAPTERS, PROJECT_ROOT, Chapter, find_chapter, selected_chapters, todos_of

ROOT_ENV = "AUTOGRADER_ROOT"
TORCH = "torch==2.13.0"
GRADER_USER = "koans-grader"
#: What a chapter's run needs from the pristine tree (copied afresh for every chapter).
RUN_PARTS = ("conftest.py", "pyproject.toml", "koans", "tests", "exercises")

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, from the unpacked zip ($AUTOGRADER_ROOT/source), to build the grading image.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  apt-get update && apt-get install -y python3 python3-pip python3-venv
fi
export PIP_BREAK_SYSTEM_PACKAGES=1  # a throwaway container: a system-wide install is fine
if compgen -G "$SOURCE/wheels/*.whl" >/dev/null; then
  # Offline: everything comes from the wheels shipped in the zip.
  "$PYTHON" -m pip install --no-index --find-links "$SOURCE/wheels" %(torch)s
  "$PYTHON" -m pip install --no-index --find-links "$SOURCE/wheels" -e "$SOURCE"
else
  # The CPU build of torch first, so that the project's torch requirement does not pull a CUDA build.
  "$PYTHON" -m pip install --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" \\
    --extra-index-url https://pypi.org/simple %(torch)s
  "$PYTHON" -m pip install -e "$SOURCE"
fi
# The submissions' tests run as this user, on a read-only copy of the project.
if [ "$(id -u)" = 0 ] && ! id -u %(user)s >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin %(user)s || true
fi
"$PYTHON" -c "import torch, monarch, koans; print('autograder ready: torch', torch.__version__)"
""" % {"torch": TORCH, "user": GRADER_USER}

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission. It grades the submitted exercise files.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source" || exit 1
exec "${PYTHON:-python3}" -m koans.autograder run --root "$ROOT"
"""


# ---------------------------------------------------------------- building the zip


def _add_file(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    archive.writestr(info, data)


def build(out: Path, wheels: Path | None = None) -> int:
    """Write the autograder zip: the student edition (pristine stubs, no reference answers) and the scripts."""
    from koans.edition import EditionError, build as build_edition

    if wheels is not None and not sorted(wheels.glob("*.whl")):
        print(f"koans autograder: no wheels (*.whl) in {wheels}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="koans-autograder-") as tmp:
        edition = Path(tmp) / "edition"
        try:
            files = build_edition(edition, workshop=False, quiet=True)
        except EditionError as err:
            print(f"koans autograder: {err}", file=sys.stderr)
            return 2
        with zipfile.ZipFile(out, "w") as archive:
            _add_file(archive, "setup.sh", SETUP_SH.encode(), executable=True)
            _add_file(archive, "run_autograder", RUN_AUTOGRADER.encode(), executable=True)
            for name in files:
                _add_file(archive, name, (edition / name).read_bytes())
            for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
                _add_file(archive, f"wheels/{wheel.name}", wheel.read_bytes())
    count = len(zipfile.ZipFile(out).namelist())
    print(f"wrote {out} ({count} files{', with wheels for an offline setup' if wheels else ''}; no solutions/, "
          "no mutants/). Upload it as the assignment's autograder on Gradescope.")
    return 0


# ---------------------------------------------------------------- grading one submission


def submitted_files(submission: Path) -> tuple[dict[str, Path], list[str]]:
    """The submitted chapter files (by name, the least nested copy of each), and the names missing."""
    wanted = [chapter.source_file("exercises").name for chapter in CHAPTERS]
    found: dict[str, Path] = {}
    for path in sorted(submission.rglob("*.py"), key=lambda p: (len(p.parts), str(p))):
        if path.name in wanted and path.name not in found and "__MACOSX" not in path.parts and path.is_file():
            found[path.name] = path
    return found, [name for name in wanted if name not in found]


def _grader_account() -> tuple[int, int] | None:
    """(uid, gid) of the unprivileged user the tests run as, when this runs as root (as on Gradescope)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    try:  # setup.sh makes it on the grading image; a machine without it grades as root on a writable copy
        entry = pwd.getpwnam(GRADER_USER)
    except KeyError:
        return None
    try:  # that user must be able to run this Python and its packages (a venv under /root would not be)
        probe = subprocess.run([sys.executable, "-c", "import pytest, torch, monarch"], cwd="/", user=entry.pw_uid,
                               group=entry.pw_gid, extra_groups=[], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return (entry.pw_uid, entry.pw_gid) if probe.returncode == 0 else None


def _fresh_tree(chapter: Chapter, files: dict[str, str], read_only: bool) -> Path:
    """A new copy of the pristine tree for one chapter's run, with `files` (name -> text) in exercises/."""
    work = Path(tempfile.mkdtemp(prefix=f"koans-grade-{chapter.tag}-"))
    for part in RUN_PARTS:
        source = PROJECT_ROOT / part
        if source.is_dir():
            shutil.copytree(source, work / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif source.is_file():
            shutil.copy2(source, work / part)
    for name, text in files.items():
        (work / "exercises" / name).write_text(text)
    for path in [work, *work.rglob("*")]:  # readable by everyone; writable by no one but root
        is_dir = path.is_dir()
        path.chmod(0o555 if is_dir else 0o444) if read_only else path.chmod(0o755 if is_dir else 0o644)
    return work


def _remove_tree(work: Path) -> None:
    for path in [work, *work.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(work, ignore_errors=True)


def _run_fields(run) -> dict:
    return {"returncode": run.returncode, "tests": run.tests, "output": run.output[-20000:], "timed_out": run.timed_out,
            "collected": run.collected, "running": run.running, "hangs": run.hangs}


def _run_in(chapter: Chapter, work: Path, time_limit: float, account: tuple[int, int] | None):
    """Run the chapter's tests in `work`: here, or as the unprivileged account in a child process."""
    from koans.runner import ChapterRun, run_chapter

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if account is None:
        return run_chapter(chapter, "exercises", root=work, time_limit_s=time_limit, env=env)
    home = Path(tempfile.mkdtemp(prefix="koans-grader-home-"))
    os.chown(home, *account)
    child_env = {k: v for k, v in os.environ.items() if k not in ("KOANS_IMPL",)}
    child_env.update(env, HOME=str(home), USER=GRADER_USER, LOGNAME=GRADER_USER)
    try:
        done = subprocess.run([sys.executable, "-m", "koans.autograder", "chapter", chapter.tag, "--time-limit",
                               str(time_limit)], cwd=work, env=child_env, user=account[0], group=account[1],
                              extra_groups=[], capture_output=True, text=True, timeout=time_limit + 120)
        fields = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as err:
        fields = {"returncode": -1, "tests": [], "output": f"the grading process failed: {err}", "timed_out": False}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return ChapterRun(chapter, "exercises", **fields)


def _refused_entry(chapter: Chapter, reasons: list[str]) -> dict:
    from koans.grade import POINTS_PER_CHAPTER

    return {"name": f"{chapter.tag} {chapter.slug}: all tests", "score": 0.0, "max_score": POINTS_PER_CHAPTER,
            "status": "failed",
            "output": ("Refused: the submitted file does something no TODO needs, so none of it ran and the chapter "
                       "scores 0. Found:\n  " + "\n  ".join(reasons))[-4000:]}


def grade_submission(submission: Path, results: Path, chapters: tuple[Chapter, ...] | None = None,
                     time_limit: float | None = None) -> dict:
    """Grade the chapter files in `submission` (see the module's doc); write and return the results."""
    from koans.edition import pristine_stub
    from koans.grade import _chapter_entries
    from koans.guard import extract
    from koans.runner import CHAPTER_TIME_LIMIT_S

    time_limit = time_limit or CHAPTER_TIME_LIMIT_S
    chapters = chapters or selected_chapters()
    found, missing = submitted_files(submission)
    notes = [f"Graded {len(found)} submitted file(s): {', '.join(sorted(found)) or 'none'}."]
    if missing:
        notes.append(f"Not submitted (graded as the original stub): {', '.join(missing)}.")
    others = sorted(str(p.relative_to(submission)) for p in submission.rglob("*")
                    if p.is_file() and p.name not in found and "__MACOSX" not in p.parts)
    if others:
        notes.append(f"Ignored (only chapter files are graded, and only their TODO regions): {', '.join(others[:20])}"
                     + (f" and {len(others) - 20} more" if len(others) > 20 else "") + ".")
    extracted = {}
    for chapter in CHAPTERS:
        name = chapter.source_file("exercises").name
        if name in found:
            text = found[name].read_bytes().decode("utf-8", errors="replace")
            extracted[chapter.tag] = extract(name, pristine_stub(chapter), text, list(todos_of(chapter)))
            notes += extracted[chapter.tag].notes
    account = _grader_account()
    if os.geteuid() == 0 and account is None:
        notes.append(f"(no unprivileged user {GRADER_USER} here (setup.sh makes it), or it cannot run {sys.executable}: "
                     "the tests ran as root, on a writable copy)")
    print("\n".join(notes), flush=True)

    entries, lines = [], []
    for chapter in chapters:
        if chapter.gpu_missing():
            entries.append({"name": f"{chapter.tag} {chapter.slug}: all tests", "score": 0.0, "max_score": 0.0,
                            "status": "passed", "output": "skipped: this chapter needs a CUDA GPU and none is visible"})
            lines.append(f"{chapter.tag}: skipped (needs a GPU)")
            continue
        own = extracted.get(chapter.tag)
        if own is not None and own.refused:
            mine = [_refused_entry(chapter, own.refused)]
            lines.append(f"{chapter.tag}: 0.0 / 10.0 (refused: {own.refused[0]})")
        else:
            files, used_stub = {}, []
            for tag in [chapter.tag] + [find_chapter(n).tag for n in chapter.builds_on]:
                other = extracted.get(tag)
                if other is not None and other.text is not None:
                    files[f"{find_chapter(tag).module}.py"] = other.text
                elif other is not None:
                    used_stub.append(tag)
            work = _fresh_tree(chapter, files, read_only=account is not None)
            if account is not None:
                os.chmod(work, 0o755)
            try:
                run = _run_in(chapter, work, time_limit, account)
            finally:
                _remove_tree(work)
            mine = _chapter_entries(chapter, run, time_limit)
            if used_stub and mine:
                mine[0]["output"] = (f"(the submitted {', '.join(used_stub)} file was refused, so this chapter ran on "
                                     "its stub)\n" + mine[0]["output"])
            got = sum(e["score"] for e in mine)
            lines.append(f"{chapter.tag}: {got:.1f} / {sum(e['max_score'] for e in mine):.1f}"
                         + (" (timed out)" if run.timed_out else ""))
        entries += mine
        print(lines[-1], flush=True)
    score = round(sum(e["score"] for e in entries), 2)
    total = round(sum(e["max_score"] for e in entries), 2)
    data = {"score": score, "tests": entries,
            "output": "\n".join(notes) + f"\nTotal {score} / {total}\n" + "\n".join(lines)}
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=2))
    print(f"Total {score} / {total}; wrote {results}", flush=True)
    return data


def run(root: Path) -> int:
    """Grade the submission in root/submission; write root/results/results.json, whatever happens."""
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    try:
        grade_submission(root / "submission", results)
    except Exception:  # whatever happens, Gradescope gets a results.json that says what
        data = {"score": 0.0, "tests": [], "output": "The autograder failed:\n" + traceback.format_exc()[-3000:]}
        results.write_text(json.dumps(data, indent=2))
    return 0


def _chapter_child(tag: str, time_limit: float) -> int:
    """As the unprivileged user, in a fresh tree (the cwd): run one chapter, print its run as one JSON line."""
    from koans.runner import run_chapter

    run = run_chapter(find_chapter(tag), "exercises", root=Path.cwd(), time_limit_s=time_limit,
                      env={"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    print("\n" + json.dumps(_run_fields(run)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.autograder", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_parser = sub.add_parser("build", help="write the autograder zip")
    build_parser.add_argument("--out", default="autograder.zip")
    build_parser.add_argument("--wheels", default=None)
    run_parser = sub.add_parser("run", help="grade a submission (what run_autograder does)")
    run_parser.add_argument("--root", default=os.environ.get(ROOT_ENV, "/autograder"))
    child = sub.add_parser("chapter", help=argparse.SUPPRESS)
    child.add_argument("tag")
    child.add_argument("--time-limit", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(Path(args.out), Path(args.wheels) if args.wheels else None)
    if args.command == "chapter":
        return _chapter_child(args.tag, args.time_limit)
    return run(Path(args.root))


if __name__ == "__main__":
    sys.exit(main())
