"""The judge: grade a submission, chapter by chapter, from outside the code it grades.

    python -m koans.grading.judge --submission DIR --results FILE [--reference DIR]

For each chapter the judge (root on Gradescope; never the user that runs submitted code):

  1. takes the TODO regions of the submitted file and checks them (koans.grading.extract, allowlist);
  2. builds a fresh, read-only copy of the pristine tree holding the graded files of the chapter and of
     those it builds on, each compiled with its run-time guards (koans.grading.rewrite, runtime);
  3. draws the probes' inputs (koans.grading.probes), and runs the chapter's tests in its box
     (koans.grading.contain): the report comes back through a pipe only the tests' process holds;
  4. computes the reference's answers to the probes in its own process, compares, and scores the
     chapter against the plan decided before the run (koans.grading.plan, score).

Results are written after every chapter, so that whatever happens later, the chapters graded so far
keep their scores (koans.grading.supervisor writes results.json even if the judge itself dies).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from koans.course.edition_data import todos_of
from koans.course.manifest import CHAPTERS, PROJECT_ROOT, Chapter, find_chapter, selected_chapters
from koans.grading import probes
from koans.grading.contain import Box, chapter_user, is_root
from koans.grading.extract import Extracted, extract
from koans.grading.rewrite import compile_graded, write_pyc
from koans.grading.score import POINTS_PER_CHAPTER, chapter_entries, whole_chapter

#: What a chapter's run needs from the pristine tree (copied afresh for every chapter).
RUN_PARTS = ("conftest.py", "pyproject.toml", "koans", "tests", "exercises")
REPORT_LIMIT = 64 * 2**20  # bytes of report read back, at most
SUPERVISION_POLL = ("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "100ms")


def submitted_files(submission: Path) -> tuple[dict[str, Path], list[str]]:
    """The submitted chapter files (by name, the least nested copy of each), and the names missing."""
    wanted = [chapter.source_file("exercises").name for chapter in CHAPTERS]
    found: dict[str, Path] = {}
    for path in sorted(submission.rglob("*.py"), key=lambda p: (len(p.parts), str(p))):
        if path.name in wanted and path.name not in found and "__MACOSX" not in path.parts and path.is_file() \
                and not path.is_symlink():
            found[path.name] = path
    return found, [name for name in wanted if name not in found]


class Reference:
    """The reference solutions, imported into the judge's own process (never into a box)."""

    def __init__(self, folder: Path | None):
        self.folder = folder if folder is not None and (folder / "solutions").is_dir() else None

    def module(self, chapter: Chapter):
        if self.folder is None:
            return None
        if str(self.folder) not in sys.path:
            sys.path.insert(0, str(self.folder))
        module = importlib.import_module(f"solutions.{chapter.module}")
        if not Path(module.__file__).resolve().is_relative_to(self.folder.resolve()):
            raise ImportError(f"solutions.{chapter.module} came from {module.__file__}, not from {self.folder}")
        return module


# ---------------------------------------------------------------- one chapter's run


def _fresh_tree(work: Path, files: dict[str, Extracted]) -> Path:
    """A copy of the pristine tree with the graded files (and their guarded .pyc) in exercises/."""
    from koans.course.edition_data import DATA_NAME, pristine_stub
    from koans.grading.edition import edition_data

    tree = work / "tree"
    tree.mkdir()
    for part in RUN_PARTS:
        source = PROJECT_ROOT / part
        if source.is_dir():
            shutil.copytree(source, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info",
                                                                              "plan.json"))
        elif source.is_file():
            shutil.copy2(source, tree / part)
    for chapter in CHAPTERS:  # every chapter file as it was given, whatever the folder copied held
        (tree / "exercises" / f"{chapter.module}.py").write_text(pristine_stub(chapter))
    if not (tree / "koans" / DATA_NAME).is_file():  # graded in the course's repository: the tree has no solutions/
        (tree / "koans" / DATA_NAME).write_text(json.dumps(edition_data()))
    for name, graded in files.items():
        target = tree / "exercises" / name
        target.write_text(graded.text)
        write_pyc(target, compile_graded(graded.text, str(target), graded.regions))
    for path in [tree, *tree.rglob("*")]:  # readable by everyone, writable by no one but root
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return tree


class _Drain(threading.Thread):
    """Reads one pipe to its end (or to `limit` bytes) while the chapter runs."""

    def __init__(self, fd: int, limit: int, on_line=None):
        super().__init__(daemon=True)
        self.fd, self.limit, self.on_line, self.data = fd, limit, on_line, bytearray()

    def run(self) -> None:
        pending = b""
        with os.fdopen(self.fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                if len(self.data) < self.limit:
                    self.data += chunk[: self.limit - len(self.data)]
                if self.on_line is not None:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self.on_line(line)


def _box_env(box: Box, home: Path, guard_log: Path) -> dict[str, str]:
    """A clean environment: nothing of the grader's own (no tokens, no paths of its)."""
    path = os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]))
    user = chapter_user(box.tag) if box.account else os.environ.get("USER", "")
    home = Path("/tmp/home") if box.namespaces and box.account else home  # the box's own /tmp (contain.enter)
    env = {"PATH": path, "HOME": str(home), "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "KOANS_GUARD_LOG": str(guard_log),
           SUPERVISION_POLL[0]: SUPERVISION_POLL[1]}
    for name in ("KOANS_TEST_TIME_LIMIT", "KOANS_HANG_NOTICE_S", "TMPDIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _read_report(raw: bytes) -> dict:
    """The run's report as plain, well-formed data, or {} (a report made to break the judge is no report)."""
    try:
        data = json.loads(raw)
    except Exception:  # malformed, or nested to break the parser
        return {}
    if not isinstance(data, dict):
        return {}
    tests = data.get("tests")
    if not isinstance(tests, list) or not all(isinstance(t, dict) and isinstance(t.get("nodeid"), str)
                                              and isinstance(t.get("outcome"), str) for t in tests):
        return {}
    if not isinstance(data.get("collected"), (int, type(None))):
        return {}
    return data


def _head(path: Path, size: int) -> str:
    with open(path, "rb") as data:
        return data.read(size).decode(errors="replace")


def _tail(path: Path, size: int) -> str:
    with open(path, "rb") as data:
        data.seek(max(0, path.stat().st_size - size))
        return data.read().decode(errors="replace")


def _work_folder(tag: str) -> Path:
    """Where a chapter's tree, output and guard log live: outside /tmp, which each box replaces with its own."""
    base = Path(os.environ.get("KOANS_JUDGE_WORK", "/var/tmp" if is_root() else tempfile.gettempdir()))
    return Path(tempfile.mkdtemp(prefix=f"koans-judge-{tag}-", dir=base))


def run_chapter_boxed(chapter: Chapter, files: dict[str, Extracted], time_limit: float,
                      request: dict | None) -> dict:
    """Run the chapter's tests on `files` in a box; what came back (report, refusals, output, timing)."""
    work = _work_folder(chapter.tag)
    box = Box.open(chapter.tag)
    process = None
    try:
        work.chmod(0o711)
        tree = _fresh_tree(work, files)
        if request is not None:
            (tree / "probe-request.json").write_text(json.dumps(request))
            (tree / "probe-request.json").chmod(0o644)
        home, guard_log = work / "home", work / "guard.log"
        home.mkdir()
        guard_log.touch()
        if box.account:
            for path in (home, guard_log):
                os.chown(path, *box.account)
        home.chmod(0o700)
        guard_log.chmod(0o600)
        report_r, report_w = os.pipe()
        progress_r, progress_w = os.pipe()
        running: dict = {}

        def on_progress(line: bytes) -> None:
            try:
                event = json.loads(line)
            except ValueError:
                return
            if isinstance(event, dict) and event.get("event") == "start":
                running["name"] = str(event.get("name"))[:200]
            elif isinstance(event, dict) and event.get("event") == "done":
                running.pop("name", None)

        argv = [sys.executable, "-m", "pytest", f"tests/{chapter.test_file.name}", "--impl=exercises", "-q",
                "-p", "no:cacheprovider", f"--koans-json=/dev/fd/{report_w}", f"--koans-progress=/dev/fd/{progress_w}"]
        if request is not None:
            argv.append("--koans-probe=probe-request.json")
        output = work / "output.txt"
        started = time.monotonic()
        with open(output, "wb") as out:
            process = subprocess.Popen(box.command(argv, writable=(str(guard_log),)), cwd=tree,
                                       env=_box_env(box, home, guard_log), stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       pass_fds=(report_w, progress_w), start_new_session=True)
        os.close(report_w)
        os.close(progress_w)
        report, progress = _Drain(report_r, REPORT_LIMIT), _Drain(progress_r, 2**20, on_progress)
        report.start()
        progress.start()
        timed_out = False
        while process.poll() is None:
            if time.monotonic() - started > time_limit:
                timed_out = True
                break
            time.sleep(0.1)
        box.close(process)  # whatever is left of the chapter ends here
        report.join(10)
        progress.join(10)
        elapsed = time.monotonic() - started
        data = _read_report(bytes(report.data)) if report.data and not timed_out else {}
        refusals = [line.strip() for line in _head(guard_log, 65536).splitlines()[:50] if line.strip()]
        # pytest ends with 0 (all passed) or 1 (some failed); anything else (killed, crashed, interrupted) means the
        # session did not end as pytest ends it, and a report that came out of it proves nothing
        ended_well = not timed_out and process.returncode in (0, 1)
        return {"report": data if ended_well else {}, "timed_out": timed_out, "running": running.get("name"),
                "refusals": refusals, "killed": not timed_out and process.returncode in (137, -9),
                "ended": process.returncode, "output": _tail(output, 20000), "seconds": elapsed,
                "box": box.describe()}
    finally:
        if process is not None:
            box.close(process)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the judge's comparisons


def probe_failures(chapter: Chapter, request: dict | None, answers, reference) -> dict[str, str]:
    """{todo: what differed} for the probes whose answers do not match the reference's."""
    if request is None:
        return {}
    if not isinstance(answers, dict) or "error" in answers:
        why = answers.get("error") if isinstance(answers, dict) else "no answers came back"
        return {todo: f"the probe could not run: {why}"[:500] for todo in request}
    expected = json.loads(json.dumps(probes.answer(chapter.tag, reference, request)))  # as plain as the answers
    failures = {}
    for todo, cases in request.items():
        got, want = answers.get(todo), expected.get(todo)
        if not isinstance(got, list) or len(got) != len(want):
            failures[todo] = "no answer came back for it"
            continue
        for number, (g, w, case) in enumerate(zip(got, want, cases), 1):
            try:
                found = probes.difference(g, w)
            except Exception as err:  # an answer shaped to break the comparison is a wrong answer
                found = f"an answer that cannot be compared ({type(err).__name__})"
            if found:
                shown = json.dumps(case)
                failures[todo] = (f"case {number} of {len(cases)}, inputs {shown[:300]}{'...' if len(shown) > 300 else ''}"
                                  f": {found}")
                break
    return failures


def _gpu_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# ---------------------------------------------------------------- a whole submission


def grade_submission(submission: Path, results: Path, chapters: tuple[Chapter, ...] | None = None,
                     time_limit: float | None = None, reference: Path | None = None,
                     plan: dict | None = None) -> dict:
    """Grade the chapter files in `submission`; write `results` (after every chapter) and return it."""
    from koans.course.edition_data import pristine_stub
    from koans.grading import plan as plans
    from koans.testkit.time_limit import CHAPTER_TIME_LIMIT_S

    time_limit = time_limit or CHAPTER_TIME_LIMIT_S
    chapters = chapters or selected_chapters()
    plan = plan or plans.load() or plans.collect(chapters=tuple(CHAPTERS))
    judge = Reference(reference)
    gpu = _gpu_visible()
    found, missing = submitted_files(submission)
    notes = [f"Graded {len(found)} submitted file(s): {', '.join(sorted(found)) or 'none'}."]
    if missing:
        notes.append(f"Not submitted (graded as the original stub): {', '.join(missing)}.")
    others = sorted(str(p.relative_to(submission)) for p in submission.rglob("*")
                    if p.is_file() and p.name not in found and "__MACOSX" not in p.parts)
    if others:
        notes.append(f"Ignored (only chapter files are graded, and only their TODO regions): {', '.join(others[:20])}"
                     + (f" and {len(others) - 20} more" if len(others) > 20 else "") + ".")
    extracted: dict[str, Extracted] = {}
    for chapter in CHAPTERS:
        name = chapter.source_file("exercises").name
        if name in found:
            text = found[name].read_bytes()[: 2**20].decode("utf-8", errors="replace")
            extracted[chapter.tag] = extract(name, pristine_stub(chapter), text, list(todos_of(chapter)))
            notes += extracted[chapter.tag].notes
    if judge.folder is None:
        notes.append("(no reference solutions here: the probes of TODOs that are functions of data did not run; "
                     "the scores rest on the tests alone)")
    print("\n".join(notes), flush=True)

    entries: list[dict] = []
    lines: list[str] = []

    def write() -> dict:
        score = round(sum(e["score"] for e in entries), 2)
        total = round(sum(e["max_score"] for e in entries), 2)
        data = {"score": score, "tests": entries,
                "output": "\n".join(notes) + f"\nTotal {score} / {total}\n" + "\n".join(lines)}
        results.parent.mkdir(parents=True, exist_ok=True)
        partial = results.with_suffix(".tmp")
        partial.write_text(json.dumps(data, indent=2))
        partial.replace(results)
        return data

    for chapter in chapters:
        prefix = f"{chapter.tag} {chapter.slug}"
        own = extracted.get(chapter.tag)
        if own is not None and own.refused:
            entries.append(whole_chapter(prefix, "Refused: the submitted file does something no TODO needs, so none "
                                                 "of it ran and the chapter scores 0. Found:\n  " + "\n  ".join(own.refused)))
            lines.append(f"{chapter.tag}: 0.0 / 10.0 (refused: {own.refused[0]})")
        elif all(t["gpu"] for t in plan[chapter.tag] if t["todos"]) and not gpu:
            entries.append(whole_chapter(prefix, "skipped: this chapter needs a CUDA GPU and none is visible", 0.0, True))
            lines.append(f"{chapter.tag}: skipped (needs a GPU)")
        else:
            files, used_stub = {}, []
            for tag in [chapter.tag] + [find_chapter(n).tag for n in chapter.builds_on]:
                other = extracted.get(tag)
                if other is not None and other.text is not None and other.written:
                    files[f"{find_chapter(tag).module}.py"] = other
                elif other is not None and other.refused:
                    used_stub.append(tag)
            reference = judge.module(chapter) if probes.PROBES.get(chapter.tag) else None
            request = probes.draw(chapter.tag, secrets.randbits(63)) if reference is not None else None
            run = run_chapter_boxed(chapter, files, time_limit, request)
            try:
                failures = probe_failures(chapter, request, run["report"].get("probes"), reference)
                mine = chapter_entries(prefix, chapter.number, plan[chapter.tag], run["report"],
                                       timed_out=run["timed_out"], time_limit=time_limit, refusals=run["refusals"],
                                       probe_failures=failures, gpu=gpu, running=run["running"], output=run["output"],
                                       killed=run["killed"], ended=run["ended"])
            except Exception as err:  # what the run sent back broke the judge: this chapter scores 0, the rest go on
                failures = {}
                mine = [whole_chapter(prefix, f"The grader could not read what the chapter's run sent back "
                                              f"({type(err).__name__}), so the chapter scores 0.")]
            if used_stub and mine:
                mine[0]["output"] = (f"(the submitted {', '.join(used_stub)} file was refused, so this chapter ran on "
                                     "its stub)\n" + mine[0]["output"])
            entries.extend(mine)
            got, of = sum(e["score"] for e in mine), sum(e["max_score"] for e in mine)
            why = " (refused at run time)" if run["refusals"] else " (timed out)" if run["timed_out"] else ""
            lines.append(f"{chapter.tag}: {got:.1f} / {of:.1f}{why} in {run['seconds']:.0f} s; {run['box']}")
            for refusal in run["refusals"][:5]:
                lines.append(f"  refused: {refusal}")
            for todo, failure in failures.items():
                lines.append(f"  judge: TODO {todo}: {failure[:300]}")
        print(lines[-1], flush=True)
        write()
    data = write()
    print(f"Total {data['score']} / {round(sum(e['max_score'] for e in entries), 2)}; wrote {results}", flush=True)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.grading.judge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--submission", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--reference", default=None, help="a folder holding solutions/ (root-only on Gradescope)")
    parser.add_argument("--time-limit", type=float, default=None)
    args = parser.parse_args(argv)
    grade_submission(Path(args.submission), Path(args.results), time_limit=args.time_limit,
                     reference=Path(args.reference) if args.reference else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
