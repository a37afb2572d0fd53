"""`koans autograder`: the zip that Gradescope's autograder expects.

    koans autograder --out autograder.zip [--wheels DIR]

The zip holds the student edition of this project (koans.grading.edition: pristine exercises, tests, the
runner; no solutions/, no mutants/), the plan of each chapter's tests (koans/grading/plan.json), the
reference solutions for the judge alone (judge/reference/solutions/, made readable by root only by
setup.sh: submitted code never runs as root), and Gradescope's two scripts at its top level:

  setup.sh         run once to build the image: installs the CPU build of torch (torch==2.13.0)
                   and this project, makes one user per chapter (koans-ch01 ... koans-ch12) and
                   locks judge/ to root. Offline when the zip has a wheels/ folder (--wheels DIR puts
                   DIR's wheels there): then pip installs with --no-index --find-links wheels/.
  run_autograder   run per submission: the supervisor (koans.grading.supervisor) runs the judge on
                   the submitted chapter files (chNN_<topic>.py, found anywhere in the submission)
                   and leaves results/results.json whatever happens.

docs/appendix/instructors.md says what each layer of the grading stops. Gradescope unpacks the zip
into /autograder/source, puts the submission in /autograder/submission and reads
/autograder/results/results.json. Set $AUTOGRADER_ROOT to use another folder than /autograder (for
tests). Set $KOANS_CHAPTERS (e.g. 1,2,3) in run_autograder to grade part of the course.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT

ROOT_ENV = "AUTOGRADER_ROOT"
TORCH = "torch==2.13.0"

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, from the unpacked zip ($AUTOGRADER_ROOT/source), to build the grading image.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PYTHON="${PYTHON:-python3}"
cd "$SOURCE"
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
# Each chapter's tests run as a user of that chapter alone; the reference answers are root's alone.
if [ "$(id -u)" = 0 ]; then
  "$PYTHON" -m koans.grading.contain users
  chmod -R go-rwx "$SOURCE/judge"
fi
"$PYTHON" -c "import torch, monarch, koans; print('autograder ready: torch', torch.__version__)"
""" % {"torch": TORCH}

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission. It grades the submitted exercise files.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source" || exit 1
exec "${PYTHON:-python3}" -m koans.grading.supervisor --root "$ROOT"
"""


# ---------------------------------------------------------------- building the zip


def _add_file(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    archive.writestr(info, data)


def build(out: Path, wheels: Path | None = None) -> int:
    """Write the autograder zip: the student edition, the plan, the judge's reference, and the scripts."""
    from koans.course.edition_data import EditionError
    from koans.grading.edition import build as build_edition
    from koans.grading.plan import PLAN_FILE, collect

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
        plan = collect()
        with zipfile.ZipFile(out, "w") as archive:
            _add_file(archive, "setup.sh", SETUP_SH.encode(), executable=True)
            _add_file(archive, "run_autograder", RUN_AUTOGRADER.encode(), executable=True)
            for name in files:
                _add_file(archive, name, (edition / name).read_bytes())
            _add_file(archive, str(PLAN_FILE), json.dumps(plan, indent=1).encode())
            for path in sorted((PROJECT_ROOT / "solutions").glob("*.py")):
                _add_file(archive, f"judge/reference/solutions/{path.name}", path.read_bytes())
            for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
                _add_file(archive, f"wheels/{wheel.name}", wheel.read_bytes())
    count = len(zipfile.ZipFile(out).namelist())
    print(f"wrote {out} ({count} files{', with wheels for an offline setup' if wheels else ''}). Upload it as the "
          "assignment's autograder on Gradescope, and give it to no one else: judge/ holds the reference solutions "
          "(setup.sh makes them readable by root alone; submitted code never runs as root).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.grading.package", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="autograder.zip")
    parser.add_argument("--wheels", default=None)
    args = parser.parse_args(argv)
    return build(Path(args.out), Path(args.wheels) if args.wheels else None)


if __name__ == "__main__":
    sys.exit(main())
