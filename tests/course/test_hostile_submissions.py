"""Submissions written by a hostile student, and by honest but unusual ones, graded through the real path.

The autograder zip is built and unpacked as Gradescope does, setup.sh makes the grader's users, and each
submission goes through `run_autograder`. Every cheat sits inside a TODO body, the only place the grader
takes code from, with that chapter's other TODOs left unsolved: each must score 0 for its chapter, and
the results must name it (file:line and what) wherever the grader can see it. The cheats come in the
classes of attack the grader closes (docs/appendix/instructors.md, "The threat model"):

  1. past the text check, to the interpreter (names fetched at run time, string evaluators, classes
     built at run time, frames) and answers fitted to the tests' own inputs;
  2. monkeypatching through an alias (a helper's parameter, a container, the type of an argument);
  3. processes that outlive their chapter;
  4. killing or starving the grader;
  5. tests that skip themselves.

Beside them, honest answers written in unusual ways must keep full marks. After every run, no process
of a chapter's user is left. Each result line is printed, so that the CI log shows them.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from koans.course.manifest import CHAPTERS, PROJECT_ROOT, find_chapter
from test_autograder import LIMIT_S, build, chapter_processes, in_todo, run_autograder, set_up, unpack

pytestmark = pytest.mark.time_limit(900)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The unpacked autograder zip, set up by its own setup.sh (the chapters' users, judge/ locked to root)."""
    root = tmp_path_factory.mktemp("autograder")
    source = unpack(build(root / "autograder.zip"), root / "source")
    set_up(source, root)
    return source


def show(capsys, kind: str, entry_output: str, score: float) -> None:
    spot = next((line.strip() for line in entry_output.splitlines() if ".py:" in line or "judge" in line
                 or "killed" in line), entry_output.splitlines()[0] if entry_output else "")
    with capsys.disabled():
        print(f"\n  [{kind}]: {score:g} / 10; {spot[:220]}")


def chapter_score(results, tag: str) -> tuple[float, str]:
    mine = [t for t in results["tests"] if t["name"].startswith(tag)]
    assert mine, f"no result for {tag}: {results['output'][-2000:]}"
    return sum(t["score"] for t in mine), "\n".join(t["output"] for t in mine)


# ---------------------------------------------------------------- cheats: (chapter, TODO, body, what the output names)

CHEATS = {
    # 1. past the text check, to the interpreter
    "1: a module fetched by a name built at run time": (1, "Greeter.greet", [
        'modules = getattr(torch, "s" + "ys").modules', 'modules["koans.testkit.results"].ResultLog.write = None',
        'return f"Hello, {who}!"'], "the module sys"),
    "1: a class built at run time, equal to everything": (2, "Worker.add", [
        'Always = type("Always", (), {"_" * 2 + "eq" + "_" * 2: lambda s, o: True})', "return Always()"],
        "three arguments"),
    "1: a format string that walks to the frames": (3, "expose", [
        'field = "{0." + "gi_frame" + ".f_back.f_globals}"', "return field.format(x for x in [tensor])"],
        "format field"),
    "1: a task's frames": (5, "classify", [
        "frame = asyncio.current_task().get_stack()[0]", 'frame.f_globals["TIMEOUT"] = 0',
        'return Outcome("ok", None, where)'], "frame"),
    "1: a string evaluated by a library": (4, "MetricsSink.record", [
        "import typing", "def rigged(x: 'int'):", "    return x", "return typing.get_type_hints(rigged)"],
        "typing.get_type_hints"),
    "1: a class that answers == its own way": (4, "find_sink", [
        "class Always:", "    def __eq__(self, other):", "        return True", "return Always()"], "__eq__"),
    "1: a string ForwardRef evaluates, through a private name fetched at run time": (1, "start_one_process", [
        "import typing", 'payload = "import sys; sys.modules[\'koans.testkit.results\'].ResultLog.write = None"',
        'ref = typing.ForwardRef("exec(p) or int")', 'getattr(ref, "_evaluate")({"p": payload}, None, frozenset())',
        'raise NotImplementedError("not solved")'], "typing.ForwardRef"),
    "1: a private name through a method's own parameter": (3, "expose", [
        "import typing", "class Helper:", "    def note(fr):", "        return fr._evaluate",
        'Helper.note(typing.ForwardRef("1"))({}, None, frozenset())', "return None"], "typing.ForwardRef"),
    "1: a str subclass as an attribute name, answering startswith its own way": (1, "Greeter.greet", [
        "class S(str):", "    def startswith(self, *args):", "        return False",
        'g = getattr(run_demo, S("__glo" + "bals__"))', 'g["__builtins__"]["exec"]("pass", {})', 'return ""'],
        "not a plain str"),
    "1: a class pattern that reads a function's globals": (4, "find_sink", [
        "def f():", "    pass", "match f:", "    case object(__globals__=g):", "        pass",
        'g["__builtins__"]["exec"]("pass", {})', "return None"], "class pattern's attribute"),
    "1: string.Formatter walking to the globals": (2, "Worker.add", [
        "import string", "def f():", "    pass", 'g = string.Formatter().get_field("0.__globals__", [f], {})[0]',
        'g["__builtins__"]["exec"]("pass", {})', "return 0"], "string.Formatter"),
    "2: functools.update_wrapper writing torch.equal": (3, "TensorOwner.send_copy", [
        "import functools", "def always(*a, **k):", "    return True",
        "functools.update_wrapper(torch, always, assigned=('equal',), updated=())", "return None"],
        "update_wrapper"),
    "1: a dataclass field renamed to code, run by the dataclass's generated __eq__": (1, "spawn_greeter", [
        "import dataclasses", "@dataclasses.dataclass", "class R:", "    a: int = 0",
        "f = dataclasses.fields(R)[0]", "f.name = 'a,exec(\"pass\")'", "@dataclasses.dataclass(init=False, repr=False)",
        "class D(R):", "    pass", "D() == D()", "return None"], "Field of dataclasses"),
    "1: a class pattern reading what __match_args__ lists, isinstance made true by ABC.register": (5, "classify", [
        "import abc", "class C(abc.ABC):", '    __match_args__ = ("__globals__",)', "f = lambda: 0",
        "C.register(type(f))", "match f:", "    case C(g):", "        pass",
        'g["__builtins__"]["exec"]("pass", {})', 'raise TimeoutError("x")'], "__match_args__"),
    "1: an Enum built with an __eq__ that answers True": (1, "Greeter.greet", [
        "import enum", "E = enum.Enum('E', [('A', 'x'), ('__eq__', lambda s, o: True)], type=str)", "return E.A"],
        "an Enum built from the names"),
    "1: a string annotation that runs code": (1, "Greeter.whereabouts", [
        "def rigged(x: \"__import__('os').system('true')\"):", "    return x", "return {}"], "annotation"),
    # 2. monkeypatching through an alias
    "2: through a helper's parameter": (4, "MetricsSink.record", [
        "import torch", "def patch(module):", "    module.equal = lambda *a, **k: True", "patch(torch)", "return 0"], "module torch"),
    "2: through a container": (2, "Worker.whoami", ["[Worker][0].add = lambda self, amount: 0", "return {}"],
                               "class Worker"),
    "2: through the type of an argument": (1, "Greeter.greet", [
        "type(self).whereabouts = lambda self: {}", 'return ""'], "class Greeter"),
    "2: a library class": (3, "TensorOwner.send_copy", ["torch.Tensor.equal = lambda *a: True", "return None"],
                           "class Tensor"),
    "2: a method shadowed on its object": (4, "MetricsSink.record", ["self.summary = lambda: {}", "return 0"],
                                           "replacing .summary"),
    # 3. processes that outlive their chapter
    "3: a subprocess through asyncio": (5, "classify", [
        'child = await asyncio.create_subprocess_exec("sleep", "1000")', 'return Outcome("ok", None, where)'],
        "create_subprocess_exec"),
    "3: a process through an event loop's method read from its class": (5, "classify", [
        "loop = asyncio.get_running_loop()",
        'await asyncio.BaseEventLoop.subprocess_exec(loop, asyncio.SubprocessProtocol, "sleep", "1000")',
        'return Outcome("ok", None, where)'], "subprocess_exec"),
    "3: a process started with a bootstrap command": (1, "start_one_process", [
        'return this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command="/bin/sh")'], "bootstrap_command"),
    # 4. killing or starving the grader
    "4: a signal to the grader": (2, "Worker.add", ["os.kill(os.getppid(), 9)", "return 0"], "os used other than"),
    "4: Monarch's client ended": (3, "pull_into", ["import monarch.actor", "monarch.actor.shutdown_context()",
                                                   "return destination"], "shutdown_context"),
    # 5. tests that skip themselves
    "5: pytest's skip": (5, "classify", ["import pytest", 'pytest.skip("later")'], "import pytest"),
    "5: unittest's SkipTest": (2, "sum_of_squares", ["from unittest import SkipTest", "raise SkipTest()"],
                               "from unittest import"),
    "5: a skip reached through torch": (1, "Greeter.greet", ['skip = torch.testing', 'return ""'],
                                        "torch.testing"),
}


def _rounds() -> list[list[str]]:
    """The cheats in submissions of one cheat per chapter, so that each chapter's result is its cheat's alone."""
    by_chapter: dict[int, list[str]] = {}
    for kind, (number, *_) in CHEATS.items():
        by_chapter.setdefault(number, []).append(kind)
    depth = max(len(kinds) for kinds in by_chapter.values())
    return [[kinds[i] for kinds in by_chapter.values() if len(kinds) > i] for i in range(depth)]


ROUNDS = _rounds()


@pytest.mark.parametrize("round_", range(len(ROUNDS)), ids=[f"round{i}" for i in range(len(ROUNDS))])
def test_each_cheat_scores_zero_and_is_named(source, capsys, round_):
    kinds = ROUNDS[round_]
    files, lines = {}, {}
    for kind in kinds:
        number, key, body, _ = CHEATS[kind]
        text, line = in_todo(source, number, key, *body)
        files[f"{find_chapter(number).module}.py"] = text
        lines[kind] = (line, len(body))
    chapters = ",".join(str(CHEATS[kind][0]) for kind in kinds)
    results = run_autograder(source, files, chapters)
    for kind in kinds:
        number, key, body, named = CHEATS[kind]
        tag = find_chapter(number).tag
        score, output = chapter_score(results, tag)
        show(capsys, kind, output, score)
        assert score == 0, f"{kind}: scored {score}:\n{output[:2000]}"
        assert "Refused" in output and named in output, f"{kind}: the output must name {named!r}:\n{output[:2000]}"
        first, count = lines[kind]
        name = f"{find_chapter(number).module}.py"
        spots = [int(part.split(":")[1]) for part in output.split() if part.startswith(f"{name}:")]
        assert spots and all(first <= spot <= first + count for spot in spots), \
            f"{kind}: the output must give the line ({first}..): {output[:1500]}"
    assert chapter_processes() == [], "nothing of the submission is left running"


def test_answers_fitted_to_the_tests_inputs_pass_the_tests_but_not_the_judge(source, capsys, tmp_path):
    """Chapter 08's intersect answered from a table of what its tests ask (recorded from the reference): its tests
    pass, and only the judge's own questions, drawn at grading time, show that it computes nothing. (The reference's
    plan_transfer calls it too, so the plan's points go as well.)"""
    recorder = tmp_path / "record_intersect.py"
    recorder.write_text(
        "CALLS = {}\n"
        "def pytest_collection_finish(session):\n"
        "    import solutions.ch08_dtensor_reshard as chapter\n"
        "    real = chapter.intersect\n"
        "    def recorded(a, b):\n"
        "        CALLS[repr((tuple(a), tuple(b)))] = real(a, b)\n"
        "        return CALLS[repr((tuple(a), tuple(b)))]\n"
        "    chapter.intersect = recorded\n"
        "def pytest_sessionfinish(session):\n"
        f"    open({str(tmp_path / 'calls.txt')!r}, 'w').write(repr(CALLS))\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "record_intersect",
                           "tests/test_ch08_dtensor_reshard.py", "-k", "intersect", "--impl", "solutions"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=LIMIT_S,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    table = (tmp_path / "calls.txt").read_text()  # a dict literal: the boxes the tests ask about, and the answers
    assert len(table) > 1000 and "passed" in done.stdout, done.stdout[-2000:]
    body = [f"TABLE = {table}", "return TABLE.get(repr((tuple(a), tuple(b))))"]
    solution = (PROJECT_ROOT / "solutions" / "ch08_dtensor_reshard.py").read_text()
    results = run_autograder(source, {"ch08_dtensor_reshard.py": _replace_region(solution, "intersect", body)}, "8")
    ch08 = [t for t in results["tests"] if t["name"].startswith("ch08")]
    intersect = [t for t in ch08 if "intersect" in t["name"]]
    show(capsys, "1: answers fitted to the tests' inputs", "\n".join(t["output"] for t in intersect),
         sum(t["score"] for t in intersect))
    assert intersect and all(t["score"] == 0 for t in intersect), [t["name"] for t in intersect if t["score"]]
    assert all("The test passed, but the judge's own check" in t["output"] and "TODO intersect" in t["output"]
               for t in intersect), intersect[0]["output"]
    assert chapter_processes() == []


def test_a_chapter_that_starves_the_machine_is_ended_and_the_others_are_graded(source, capsys):
    """Chapter 04 eats memory without end; its box's memory limit ends it, and chapter 01, honest, keeps its 10."""
    eat, _ = in_todo(source, 4, "MetricsSink.record", "import torch", "chunks = []", "while True:",
                     "    chunks.append(torch.ones(2 ** 26))", "return 0")
    honest = (PROJECT_ROOT / "solutions" / "ch01_hello_actor.py").read_text()
    results = run_autograder(source, {"ch04_controllers.py": eat, "ch01_hello_actor.py": honest}, "1,4",
                             KOANS_CHAPTER_MEMORY_GB="2")
    score, output = chapter_score(results, "ch04")
    show(capsys, "4: memory without end", output, score)
    assert score == 0 and "Killed" in output, output[:2000]
    assert chapter_score(results, "ch01")[0] == pytest.approx(10.0, abs=0.01), "the honest chapter is graded as ever"
    assert chapter_processes() == []


def test_a_grader_that_dies_still_leaves_results_for_the_chapters_it_finished(source, capsys):
    """The judge killed after chapter 01: the supervisor writes results.json, with chapter 01's score and why."""
    root = source.parent
    submission = root / "submission"
    subprocess.run(["rm", "-rf", str(submission)], check=True)
    submission.mkdir()
    (submission / "ch01_hello_actor.py").write_text((PROJECT_ROOT / "solutions" / "ch01_hello_actor.py").read_text())
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "KOANS_CHAPTERS": "1,2,3", "PYTHON": sys.executable}
    env.pop("KOANS_IMPL", None)
    results = root / "results" / "results.json"
    results.unlink(missing_ok=True)
    grader = subprocess.Popen([str(source / "run_autograder")], cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline:
        try:
            if any(t["name"].startswith("ch01") for t in json.loads(results.read_text())["tests"]):
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    judges = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).find("koans.grading.judge") >= 0]
    for pid in judges:
        os.kill(int(pid), 9)
    grader.communicate(timeout=LIMIT_S)
    data = json.loads(results.read_text())
    with capsys.disabled():
        print(f"\n  [4: the judge killed mid-run]: {data['output'].splitlines()[0][:200]}")
    assert judges and "did not finish" in data["output"], data["output"][:500]
    assert chapter_score(data, "ch01")[0] == pytest.approx(10.0, abs=0.01), "what was graded keeps its score"
    assert chapter_processes() == []


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# ---------------------------------------------------------------- honest but unusual: full marks

HONEST = {
    (1, "Greeter.greet"): ["self.greetings_given = self.greetings_given + 1",
                           'template = "Hello, {}! I am {} (greeting #{})."',
                           "return template.format(who, self.name, self.greetings_given)"],
    (4, "MetricsSink.record"): ["import re", 'word = re.compile(r".*", re.DOTALL)', "entry = (source, metric, value)",
                                "if word.fullmatch(str(metric)) is not None:", "    self.records.append(entry)",
                                "return len(self.records)"],
    (6, "Service.next_replica"): [
        "import itertools", "count = len(self.replicas)",
        "order = itertools.islice(itertools.cycle(self.replicas), self.cursor % count, self.cursor % count + count)",
        "for replica in order:", "    if replica.healthy and replica.index not in exclude:",
        "        self.cursor = (replica.index + 1) % count", "        return replica", "return None"],
    (7, "WeightStore.claim"): [
        "now = time.monotonic()",
        "expired = [k for k, (_, since) in self.leases.items() if now - since > self.lease_timeout_s]",
        "for lease in expired:", "    self.leases.pop(lease)", '    self.counts["expired_leases"] += 1',
        "needed = {slot for slot, _ in self.leases.values()} | set(self.writing)",
        "if self.latest is not None:", "    needed.add(self.latest[1])",
        "free = [slot for slot in range(len(self.offers)) if slot not in needed]",
        "if not free:", '    self.counts["skipped_claims"] += 1', "    return None",
        "slot = max(free)  # any free slot will do: the highest", "self.writing.add(slot)", "return slot"],
    (8, "shard_box"): [
        "def split(offset, length, parts, index):", "    size = -(-length // parts)",
        "    start = min(index * size, length)", "    return offset + start, max(0, min(size, length - start))",
        "box = [(0, size) for size in shape]", "for m, placement in enumerate(placements):",
        "    match placement:", "        case Shard(dim=d):", "            offset, share = split(*box[d], mesh_shape[m], coord[m])",
        "            box[d] = (offset, share) if share else (shape[d], 0)", "        case _:", "            pass",
        "return tuple(box)"],
    (8, "plan_transfer"): [
        "holders = {}", "for rank, box in src_boxes.items():", "    holders.setdefault(box, []).append(rank)",
        "for dst_rank, coord in ranks(dst_mesh):", "    dst_box = shard_box(shape, dst_mesh, dst_placements, coord)",
        "    work = list(holders)", "    pieces = []", "    while work:", "        src_box = work[0]",
        "        work.remove(src_box)", "        overlap = intersect(src_box, dst_box)",
        "        if overlap is None:", "            continue", "        group = sorted(holders[src_box])",
        "        pieces.append(Piece(group[dst_rank % len(group)], local_slices(overlap, src_box),",
        "                            local_slices(overlap, dst_box)))", "    plan[dst_rank] = pieces", "return plan"],
    (10, "group_advantages"): [
        "out = torch.zeros_like(rewards)", "for i in range(rewards.shape[0]):", "    row = rewards[i]",
        "    spread = row.std() if row.numel() > 1 else torch.zeros(())",
        "    out[i] = (row - row.mean()) / (spread + eps)", "return out"],
    (11, "AdmissionWindow.admit"): [
        "trained_at, _ = divmod(number := self.admitted, self.batch_groups)",
        "if (lag := trained_at - generator_version) > self.max_lag:", "    self.refused += 1", "    return None",
        "self.admitted = number + 1", "return number"],
    (11, "truncated_importance_weights"): [
        "import math", "limit = math.inf if cap is None else cap", "with torch.no_grad():",
        "    ratio = (proximal_logps - behaviour_logps).exp().clamp(max=limit)",
        "return ratio.masked_fill(mask == 0, 0.0)"],
    (12, "Episode.append_turn"): [
        "import itertools", "match logprobs:", "    case None:",
        "        owner, logs, versions = 0.0, [0.0] * len(ids), [-1] * len(ids)",
        "    case list() | tuple() if len(logprobs) == len(ids):",
        "        owner, logs, versions = 1.0, list(logprobs), [version] * len(ids)", "    case _:",
        '        raise ValueError("one log-probability per token")', "self.ids.extend(ids)",
        "self.mask.extend(itertools.repeat(owner, len(ids)))", "self.logprobs.extend(logs)",
        "self.versions.extend(versions)"],
    (12, "Episode.version"): ["import itertools", "return min(itertools.compress(self.versions, self.mask))"],
}


def test_honest_but_unusual_answers_keep_full_marks(source, capsys):
    """Helpers, `match` on values and classes, comprehensions, walrus, list.remove, re.compile, itertools, math,
    writing rows into a tensor the TODO made, str.format, the highest free slot: each in a submission whose other
    TODOs are the reference's, through every layer, probes included."""
    files = {f"{c.module}.py": (PROJECT_ROOT / "solutions" / f"{c.module}.py").read_text() for c in CHAPTERS}
    for (number, key), body in HONEST.items():
        name = f"{find_chapter(number).module}.py"
        files[name] = _replace_region(files[name], key, body)
    results = run_autograder(source, files, "1,4,6,7,8,10,11,12")
    for number in (1, 4, 6, 7, 8, 10, 11, 12):
        tag = find_chapter(number).tag
        score, output = chapter_score(results, tag)
        show(capsys, f"honest {tag}: {', '.join(k for n, k in HONEST if n == number)}", output or "all passed", score)
        assert score == pytest.approx(10.0, abs=0.01), f"{tag}: an honest answer lost points:\n{output[:3000]}"
    assert chapter_processes() == []


def _replace_region(solution: str, key: str, body: list[str]) -> str:
    """The solution file with TODO `key`'s region holding `body` instead of the reference's code."""
    from koans.course.todos import find_todos

    lines = solution.splitlines()
    name = next(f"{c.module}.py" for c in CHAPTERS if f"TODO({c.tag})" in solution)
    todo = next(t for t in find_todos(solution, name) if t.key == key)
    first, last = todo.begin + len(todo.guidance), todo.end - 1  # the code lines (1-based begin is the marker)
    lines[first:last] = [todo.indent + line for line in body]
    return "\n".join(lines) + "\n"
