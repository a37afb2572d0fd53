"""Submissions written by a hostile student, each graded through the real autograder path.

The autograder zip is built and unpacked as Gradescope does; each submission goes through
`run_autograder`. Every TODO of chapter 04 is left unsolved (`raise NotImplementedError`), and each
submission adds one trick that, without the guard, raised the score or could have. Each must score 0,
and the results must name what was found and where (file:line), so an instructor can act. Each
kind's result line is printed, so the CI log shows it.
"""

import json
import os
import subprocess
import sys

import pytest

from koans.manifest import PROJECT_ROOT
from test_autograder import LIMIT_S, build, unpack

pytestmark = pytest.mark.time_limit(600)
CH04 = "ch04_controllers.py"
RECORD_STUB = 'raise NotImplementedError("TODO(ch04): append (source, metric, value) to self.records and return the count")'


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The unpacked autograder zip (the student edition: no solutions/, no mutants/)."""
    root = tmp_path_factory.mktemp("zip")
    source = unpack(build(root / "autograder.zip"), root / "source")
    assert not (source / "solutions").exists() and not (source / "mutants").exists()
    return source


def stub(source, name=CH04):
    return (source / "exercises" / name).read_text()


def in_todo(source, *body):
    """Chapter 04's stub with MetricsSink.record's stub replaced by `body` (at its indentation); and the
    file's line of the body's first line."""
    text = stub(source)
    line = text[:text.index(RECORD_STUB)].count("\n") + 1
    indent = " " * 8
    return text.replace(RECORD_STUB, ("\n" + indent).join(body), 1), line


def grade(source, tmp_path, files, chapters="4"):
    root = tmp_path / "autograder"
    submission = root / "submission"
    for name, text in files.items():
        (submission / name).parent.mkdir(parents=True, exist_ok=True)
        (submission / name).write_text(text)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "KOANS_CHAPTERS": chapters, "PYTHON": sys.executable}
    env.pop("KOANS_IMPL", None)
    done = subprocess.run([sys.executable, "-m", "koans.autograder", "run", "--root", str(root)], cwd=source, env=env,
                          capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def report(kind, results, capsys):
    line = next((t for t in results["tests"] if t["name"].startswith("ch04")), {})
    first = line.get("output", "").split("\n")
    lines = first + results["output"].split("\n")
    found = next((text.strip() for text in lines if f"{CH04}:" in text or "Ignored" in text), lines[0])
    with capsys.disabled():
        print(f"\n  hostile [{kind}]: score {results['score']} / 10; {found[:200]}")


REFUSED = {
    # kind: (the TODO's body, what the message must name)
    "rewrite the results (koans.results)": (
        ["import koans.results as results", "results.ResultLog.write = lambda self, leftovers: None"], "import koans.results"),
    "rewrite the results (torch.sys.modules)": (
        ['torch.sys.modules["koans.results"].ResultLog.add = None'], ".sys"),
    "a pytest hook in a TODO": (
        ["def pytest_runtest_makereport(item, call):", "    pass", "return 0"], "pytest_runtest_makereport"),
    "import the reference answers": (
        ["from solutions.ch04_controllers import MetricsSink as Answer", "return Answer.record(self, source, metric, value)"],
        "from solutions.ch04_controllers import"),
    "read the grader's files": (
        ['return open("/autograder/source/koans/grade.py").read()'], "the name open"),
    "write to a test file": (
        ["import pathlib", 'pathlib.Path("tests/test_ch04_controllers.py").write_text("")'], "import pathlib"),
    "write to another chapter's file": (
        ['with open("exercises/ch05_supervision.py", "w") as f:', '    f.write("")'], "the name open"),
    "exit early (os._exit)": (["os._exit(0)"], "os used other than"),
    "exit early (sys.exit)": (["import sys", "sys.exit(0)"], "import sys"),
    "exit early (raise SystemExit)": (["raise SystemExit(0)"], "SystemExit"),
    "fork": (["if os.fork() == 0:", "    pass"], "os used other than"),
    "sys.modules": (["import importlib", 'importlib.import_module("koans.grade")'], "import importlib"),
    "gc": (["import gc", "gc.get_objects()"], "import gc"),
    "dunder walk to every class": (["return ().__class__.__base__.__subclasses__()"], ".__class__"),
    "getattr with a computed name": (['return getattr(torch, "s" + "ys")'], "getattr()"),
    "a format string that walks attributes": (['return "{0.f_back}".format(self)'], ".format()"),
    "eval": (['return eval("1")'], "the name eval"),
    "monkeypatch the chapter's given code": (["Worker.ping = lambda self: 1", "return 0"], "monkeypatching"),
    "monkeypatch through an alias": (["sink_class = Worker", "sink_class.ping = None", "return 0"], "monkeypatching"),
    "monkeypatch the test helpers": (["import koans.testing", "koans.testing.TIMEOUT = 0"], "import koans.testing"),
    "code that leaves its function": (["return 0", "", "import os as _os", "_os.system('true')"], "outside its function"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_hostile_todo_is_refused_and_named(source, tmp_path, capsys, kind):
    body, named = REFUSED[kind]
    if kind == "code that leaves its function":  # these lines start at column 0: the region dedents out of record()
        text, line = in_todo(source, "return 0")
        text = text.replace("        return 0\n", "        return 0\n\nimport os as _os\n_os.system('true')\n\nclass _Shell:\n", 1)
    else:
        text, line = in_todo(source, *body)
    results = grade(source, tmp_path, {CH04: text})
    report(kind, results, capsys)
    assert results["score"] == 0
    [entry] = [t for t in results["tests"] if t["name"].startswith("ch04")]
    assert entry["status"] == "failed" and entry["output"].startswith("Refused"), entry["output"]
    assert named in entry["output"], f"the message must name what was found ({named!r}): {entry['output']}"
    spots = [int(part.split(":")[1]) for part in entry["output"].split() if part.startswith(f"{CH04}:")]
    assert spots and all(line <= spot <= line + len(body) + 3 for spot in spots), \
        f"the message must say where (lines {line}..): {entry['output']}"


def test_what_is_outside_the_todos_never_runs(source, tmp_path, capsys):
    """The issue's attacks, as a student appended them (module-level code), with a conftest.py and a pytest plugin
    beside them, and a chapter 01 file that rewrites chapter 04's tests: none of it runs; ch04 scores 0 as a stub."""
    attack = ("\nimport json, pathlib, sys\n"
              "sys.modules['koans.results'].ResultLog.write = lambda *a: None\n"
              "for p in pathlib.Path('tests').glob('test_ch04*.py'):\n    p.write_text('def test_free():\\n    pass\\n')\n")
    plugin = "def pytest_runtest_logreport(report):\n    report.outcome = 'passed'\n"
    files = {CH04: stub(source) + attack, "ch01_hello_actor.py": stub(source, "ch01_hello_actor.py") + attack,
             "conftest.py": plugin, "pytest_plugin.py": plugin}
    results = grade(source, tmp_path, files, chapters="4")
    report("module-level code, conftest.py, a pytest plugin, another chapter's file", results, capsys)
    assert results["score"] == 0, results["output"]
    assert f"{CH04}:{stub(source).count(chr(10)) + 2}: code outside every TODO" in results["output"], results["output"]
    assert "ch01_hello_actor.py:" in results["output"] and "Ignored" in results["output"]
    assert "conftest.py" in results["output"] and "pytest_plugin.py" in results["output"]
    ch04 = [t for t in results["tests"] if t["name"].startswith("ch04")]
    assert ch04 and all(t["score"] == 0 and "TODO(ch04)" in t["output"] for t in ch04), "graded as the stub it is"


def test_an_honest_solution_keeps_full_marks(source, tmp_path, capsys):
    """The guard refuses nothing a reference answer does (imports in a TODO, helper code, getattr on a parameter)."""
    solution = (PROJECT_ROOT / "solutions" / CH04).read_text()
    results = grade(source, tmp_path, {CH04: solution})
    report("the reference answer (honest)", results, capsys)
    assert results["score"] == pytest.approx(10.0, abs=0.01), results["output"]
