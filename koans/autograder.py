"""`koans autograder`: the zip that Gradescope's autograder expects, and what runs inside it.

    koans autograder --out autograder.zip [--wheels DIR]

The zip holds this project (with pristine exercises, generated from solutions/)
plus Gradescope's two scripts at its top level:

  setup.sh         run once to build the image: installs the CPU build of torch
                   (torch==2.13.0) and this project. Offline when the zip has a
                   wheels/ folder (--wheels DIR puts DIR's wheels there): then
                   pip installs with --no-index --find-links wheels/.
  run_autograder   run per submission: copies the submitted exercise files
                   (chNN_<topic>.py, found anywhere in the submission) over the
                   project's exercises/, runs `koans grade`, and writes
                   results/results.json.

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
import sys
import traceback
import zipfile
from pathlib import Path

from koans.manifest import CHAPTERS, PROJECT_ROOT

ROOT_ENV = "AUTOGRADER_ROOT"
TORCH = "torch==2.13.0"
PROJECT_PARTS = ("conftest.py", "pyproject.toml", "README.md", "koans", "solutions", "tests", "docs")

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
"$PYTHON" -c "import torch, monarch, koans; print('autograder ready: torch', torch.__version__)"
""" % {"torch": TORCH}

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


def _project_files() -> list[Path]:
    files = []
    for part in PROJECT_PARTS:
        path = PROJECT_ROOT / part
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*")
                            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc"))
    return files


def build(out: Path, wheels: Path | None = None) -> int:
    """Write the autograder zip. The exercises in it are the pristine stubs, whatever exercises/ holds here."""
    from koans.stubgen import expected_exercises

    if wheels is not None and not sorted(wheels.glob("*.whl")):
        print(f"koans autograder: no wheels (*.whl) in {wheels}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as archive:
        _add_file(archive, "setup.sh", SETUP_SH.encode(), executable=True)
        _add_file(archive, "run_autograder", RUN_AUTOGRADER.encode(), executable=True)
        for path in _project_files():
            _add_file(archive, str(path.relative_to(PROJECT_ROOT)), path.read_bytes())
        for name, text in expected_exercises(PROJECT_ROOT / "solutions").items():
            _add_file(archive, f"exercises/{name}", text.encode())
        for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
            _add_file(archive, f"wheels/{wheel.name}", wheel.read_bytes())
    count = len(zipfile.ZipFile(out).namelist())
    print(f"wrote {out} ({count} files{', with wheels for an offline setup' if wheels else ''}). "
          "Upload it as the assignment's autograder on Gradescope.")
    return 0


# ---------------------------------------------------------------- grading one submission


def submitted_files(submission: Path) -> tuple[dict[str, Path], list[str]]:
    """The submitted chapter files (by name, the least nested copy of each), and the names missing."""
    wanted = [chapter.source_file("exercises").name for chapter in CHAPTERS]
    found: dict[str, Path] = {}
    for path in sorted(submission.rglob("*.py"), key=lambda p: (len(p.parts), str(p))):
        if path.name in wanted and path.name not in found and "__MACOSX" not in path.parts:
            found[path.name] = path
    return found, [name for name in wanted if name not in found]


def run(root: Path) -> int:
    """Copy the submission into the project, grade it, write results/results.json."""
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    found, missing = submitted_files(root / "submission")
    exercises = PROJECT_ROOT / "exercises"
    for name, path in found.items():
        shutil.copyfile(path, exercises / name)
    notes = [f"Graded {len(found)} submitted file(s): {', '.join(sorted(found)) or 'none'}."]
    if missing:
        notes.append(f"Not submitted (graded as the original stub): {', '.join(missing)}.")
    print("\n".join(notes), flush=True)
    try:
        from koans.grade import grade

        grade(results)
        data = json.loads(results.read_text())
    except Exception:  # whatever happens, Gradescope gets a results.json that says what
        data = {"score": 0.0, "tests": [], "output": "The autograder failed:\n" + traceback.format_exc()[-3000:]}
    data["output"] = "\n".join(notes) + "\n" + data.get("output", "")
    results.write_text(json.dumps(data, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.autograder", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_parser = sub.add_parser("build", help="write the autograder zip")
    build_parser.add_argument("--out", default="autograder.zip")
    build_parser.add_argument("--wheels", default=None)
    run_parser = sub.add_parser("run", help="grade a submission (what run_autograder does)")
    run_parser.add_argument("--root", default=os.environ.get(ROOT_ENV, "/autograder"))
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(Path(args.out), Path(args.wheels) if args.wheels else None)
    return run(Path(args.root))


if __name__ == "__main__":
    sys.exit(main())
