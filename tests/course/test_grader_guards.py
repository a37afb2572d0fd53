"""The grader's text and run-time layers, attacked directly: no Monarch, no chapter run (seconds, not minutes).

A made-up chapter (FAKE) holds a few TODOs. Each case puts a body into one of them and goes through what the
autograder does with a submitted region: `extract` (the alignment and the allowlist), then `compile_graded`
(the run-time guards), then a call. Hostile bodies must be refused, at the line they are on, with a reason;
honest bodies, however unusual, must run and answer as the contract asks. The run-time cases run in one child
process, so that the guards' audit hook never enters this session.

tests/course/test_hostile_submissions.py sends cheats of every class through the real `run_autograder`.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from koans.course.todos import find_todos, make_exercise
from koans.grading.extract import extract

FAKE = '''\
"""A made-up chapter for the grader's tests."""

from __future__ import annotations

import os
import re

import torch


class Given:
    """Given code the tests rely on."""

    def ping(self):
        return "pong"


class Sink:
    def __init__(self):
        self.records = []
        self._lock = None

    def record(self, source, metric, value):
        """Keep (source, metric, value); answer how many are kept."""
        # >>> TODO(ch99): append (source, metric, value) to self.records and return the count
        self.records.append((source, metric, value))
        return len(self.records)
        # <<< TODO


def row_sums(rows: torch.Tensor) -> torch.Tensor:
    """Each row's sum, as a new tensor."""
    # >>> TODO(ch99): the sum of each row
    return rows.sum(dim=1)
    # <<< TODO


def pid() -> int:
    return os.getpid()
'''
NAME = "ch99_fake.py"
TODOS = find_todos(FAKE, NAME)
PRISTINE = make_exercise(FAKE, NAME)
STUBS = {todo.key: todo.stub_line for todo in TODOS}


def submit(key: str, *body: str) -> tuple[str, int]:
    """The pristine file with TODO `key`'s stub replaced by `body`; and the line of the body's first line."""
    stub = STUBS[key]
    indent = stub[: len(stub) - len(stub.lstrip())]
    line = PRISTINE[: PRISTINE.index(stub)].count("\n") + 1
    return PRISTINE.replace(stub, indent + ("\n" + indent).join(body), 1), line


def check(key: str, *body: str):
    text, line = submit(key, *body)
    return extract(NAME, PRISTINE, text, TODOS), line


# ---------------------------------------------------------------- refused before anything runs (the allowlist)

REFUSED = {
    # what the body does: (TODO, body, what the reason names)
    "eval": ("row_sums", ['return eval("rows")'], "the name eval"),
    "open a file": ("row_sums", ['return open("/etc/passwd").read()'], "the name open"),
    "import sys": ("row_sums", ["import sys", "return sys.modules"], "import sys"),
    "import the grader": ("row_sums", ["import koans.testkit.results", "return rows"], "import koans.testkit.results"),
    "import pytest to skip": ("row_sums", ["import pytest", 'pytest.skip("later")'], "import pytest"),
    "unittest's SkipTest": ("row_sums", ["from unittest import SkipTest", "raise SkipTest()"], "from unittest import"),
    "relative import of the reference": ("row_sums", ["from .solutions import ch99", "return rows"], "from .solutions"),
    "dunder walk": ("row_sums", ["return ().__class__.__base__.__subclasses__()"], ".__base__"),
    "a class that equals everything": ("row_sums", ["class Always:", "    def __eq__(self, other):",
                                                    "        return True", "return Always()"], "__eq__"),
    "a class that is always true": ("row_sums", ["class Yes:", "    def __bool__(self):", "        return True",
                                                 "return Yes()"], "__bool__"),
    "a metaclass keyword": ("row_sums", ["class M(metaclass=type):", "    pass", "return rows"], "metaclass"),
    "a string annotation that runs code": ("row_sums", ['def f(x: "__import__(\'os\').system(\'id\')"):',
                                                        "    return x", "return rows"], "annotation"),
    "global rebinding": ("row_sums", ["global Given", "Given = None", "return rows"], "global Given"),
    "os beyond getpid": ("row_sums", ["os.kill(os.getppid(), 9)", "return rows"], "os used other than"),
    "os held as a value": ("row_sums", ["o = os", "return rows"], "os used other than"),
    "getattr passed around": ("row_sums", ["g = getattr", "return g(rows, 'sum')()"], "getattr used other than"),
    "getattr with a dunder literal": ("row_sums", ['return getattr(row_sums, "__globals__")'], "dunder name"),
    "a class pattern that reads a function's globals": ("row_sums", [
        "match row_sums:", "    case object(__globals__=g):", "        return g"], "class pattern's attribute"),
    "a class pattern that reads a frame": ("row_sums", [
        "match rows:", "    case object(f_globals=g):", "        return g"], "class pattern's attribute"),
    "SystemExit": ("row_sums", ["raise SystemExit(0)"], "the name SystemExit"),
    "setattr": ("row_sums", ['setattr(Given, "ping", None)', "return rows"], "the name setattr"),
    "vars of a module": ("row_sums", ["return vars(torch)"], "the name vars"),
    "code that leaves its function": ("row_sums", ["return rows", "", "import os as _os"], "outside its function"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_hostile_region_is_refused_with_its_line(kind):
    key, body, named = REFUSED[kind]
    if kind == "code that leaves its function":
        text, line = submit(key, "return rows")
        text = text.replace("    return rows\n", "    return rows\n\nimport os as _os\n_os.system('true')\n\n\n", 1)
        result = extract(NAME, PRISTINE, text, TODOS)
    else:
        result, line = check(key, *body)
    assert result.text is None and result.refused, f"{kind}: not refused"
    found = "\n".join(result.refused)
    assert named in found, f"{kind}: the reason must name {named!r}: {found}"
    spots = [int(r.split(":")[1]) for r in result.refused]
    assert all(line <= spot <= line + len(body) + 3 for spot in spots), f"{kind}: the line must be the body's: {found}"


HONEST = {
    # an honest but unusual body, and the answer it must give for rows [[1, 2], [3, 4]]
    "a work list consumed with list.remove": [
        "left = list(range(rows.shape[0]))", "out = torch.zeros(rows.shape[0])", "while left:",
        "    i = left[0]", "    out[i] = rows[i].sum()", "    left.remove(i)", "return out"],
    "rows written into a tensor made by zeros_like": [
        "out = torch.zeros_like(rows[:, 0])", "for i, row in enumerate(rows):", "    out[i] = row.sum()", "return out"],
    "re.compile, math and itertools": [
        "import itertools, math", 'pattern = re.compile(r"^\\d+$")', "assert pattern.match(str(rows.shape[0]))",
        "pairs = itertools.islice(itertools.count(), rows.shape[0])",
        "return torch.tensor([math.fsum(rows[i].tolist()) for i in pairs])"],
    "a helper, a local dataclass, match on values and shapes": [
        "from dataclasses import dataclass", "@dataclass", "class Total:", "    value: float",
        "def total(row) -> Total:", "    match row.tolist():", "        case [a, b]:",
        "            return Total(a + b)", "        case values:", "            return Total(sum(values))",
        "return torch.tensor([total(r).value for r in rows])"],
    "getattr with a computed public name, type() asked": [
        'name = "".join(["s", "u", "m"])', "assert type(rows) is torch.Tensor", "return getattr(rows, name)(dim=1)"],
    "an async helper and a lambda": [
        "import asyncio", "async def one(r):", "    await asyncio.sleep(0)", "    return float(r.sum())",
        "async def every():", "    return await asyncio.gather(*(one(r) for r in rows))",
        "f = lambda xs: torch.tensor(xs)", "return f(asyncio.run(every()))"],
    "a namedtuple, an Enum and a NamedTuple made on the fly": [
        "import collections, enum, typing", 'Pair = collections.namedtuple("Pair", "first second")',
        'Kind = enum.Enum("Kind", "ROW COLUMN")', 'Sums = typing.NamedTuple("Sums", [("values", list)])',
        "assert Kind.ROW.name == 'ROW' and Pair(1, 2).second == 2",
        "return torch.tensor(Sums([float(r.sum()) for r in rows]).values)"],
    "modules the process had not imported yet": [
        "import statistics, fractions, bisect", "half = fractions.Fraction(1, 2)",
        "return torch.tensor([statistics.fmean(r.tolist()) * 2 * float(half) * 2 for r in rows])"],
    "os.uname, os and socket imported in the TODO": [
        "import os, socket", "assert os.uname().nodename == socket.gethostname()", "return rows.sum(1)"],
    "a tensor's .data, .grad and .requires_grad set": [
        "t = rows.clone()", "t.requires_grad = True", "t.grad = None", "t.data = t.data * 1",
        "return t.detach().sum(1)"],
    "a property with a setter on the TODO's own class, and __slots__": [
        "class Box:", "    __slots__ = ('_v',)", "    def __init__(self):", "        self._v = 0",
        "    @property", "    def v(self):", "        return self._v", "    @v.setter", "    def v(self, value):",
        "        self._v = value", "b = Box()", "b.v = rows.sum(1)", "return b.v"],
    "torch.distributed by its full path; an exception's cause and class": [
        "import torch.distributed as dist", "import torch.distributed.tensor", "placement = torch.distributed.tensor.Shard(0)",
        "assert dist.is_available() in (True, False) and placement.dim == 0",
        "try:", "    try:", "        raise KeyError('x')", "    except KeyError as inner:",
        "        raise ValueError('y') from inner", "except ValueError as err:",
        "    assert type(err.__cause__).__name__ == 'KeyError' and err.__class__.__name__ == 'ValueError'",
        "return rows.sum(1)"],
    "operator, threading, warnings, logging and traceback": [
        "import operator, threading, warnings, logging, traceback", "lock = threading.Lock()", "with lock:",
        "    firsts = list(map(operator.itemgetter(0), rows.tolist()))",
        "logging.getLogger('koans.test').debug('rows %s', firsts)", "assert traceback.format_exc()",
        "with warnings.catch_warnings():", "    warnings.simplefilter('ignore')",
        "    warnings.warn('nothing to see')", "return rows.sum(1)"],
    "a format field that reads an item": ['assert "{0[0]}-{1[k]}".format([7], {"k": 8}) == "7-8"', "return rows.sum(1)"],
    "an event loop made and closed, a thread pool": [
        "import asyncio, concurrent.futures", "loop = asyncio.new_event_loop()",
        "with concurrent.futures.ThreadPoolExecutor(1) as pool:",
        "    sums = loop.run_until_complete(loop.run_in_executor(pool, rows.sum, 1))", "loop.close()", "return sums"],
    "an IntEnum, a typing.NamedTuple class, dataclasses of its own, a namedtuple's _replace and _asdict": [
        "import collections, dataclasses, enum, typing", "class Axis(enum.IntEnum):", "    ROWS = 1",
        "class Shape(typing.NamedTuple):", "    rows: int", "    cols: int",
        "@dataclasses.dataclass(order=True, frozen=True)", "class Cell:", "    value: float",
        "Pair = collections.namedtuple('Pair', 'a b')", "p = Pair(1, 2)._replace(b=3)",
        "assert p._asdict() == {'a': 1, 'b': 3} and Shape(2, 2).cols == 2 and Cell(1.0) < Cell(2.0)",
        "return rows.sum(int(Axis.ROWS))"],
    "a logger named after the module; getattr of __name__, hasattr of __len__": [
        "import logging", "log = logging.getLogger(__name__)", "log.debug('%s rows', len(rows))",
        "assert getattr(row_sums, '__name__') == 'row_sums' and hasattr(rows, '__len__')", "return rows.sum(1)"],
    "private attributes of its own objects, through any name": [
        "class N:", "    def __init__(self):", "        self._v = 0", "    def add(self, other):",
        "        return self._v + other._v", "n, m = N(), N()", "n._v = 1", "m._v = 2",
        "assert n.add(m) == 3", "return rows.sum(1)"],
    "a class pattern on a placement and a shape": [
        "match rows:", "    case torch.Tensor(shape=shape, dtype=dtype) if len(shape) == 2:",
        "        return rows.sum(1)", "    case _:", "        return None"],
    "a numpy array's methods (as the chapter's own fingerprint uses them)": [
        "arrays = [r.numpy() for r in rows]", "assert arrays[0].tobytes() and arrays[0].tolist() == [1.0, 2.0]",
        "return torch.tensor([float(a.sum()) for a in arrays])"],
    "attrgetter, methodcaller, a decorator made with functools.wraps, format reading a public attribute": [
        "import functools, operator", "def logged(function):", "    @functools.wraps(function)",
        "    def inner(*args):", "        return function(*args)", "    return inner",
        "@logged", "def total(row):", "    return operator.methodcaller('sum')(row)",
        "assert total.__name__ == 'total' and operator.attrgetter('shape')(rows) == rows.shape",
        "assert '{0.shape}'.format(rows) == str(rows.shape) and '{n}'.format_map({'n': 2}) == '2'",
        "return torch.stack([total(r) for r in rows])"],
    "os.getpid and a str.format with plain fields": [
        "assert os.getpid() > 0", 'assert "{} {x}".format(1, x=2) == "1 2"', "return rows.sum(1)"],
    "a local class with __init__, __iter__ and a private attribute of its own": [
        "class Rows:", "    def __init__(self, t):", "        self._t = t", "    def __iter__(self):",
        "        return iter(self._t)", "return torch.stack([r.sum() for r in Rows(rows)])"],
}


LIBRARY = '''
"""Stands for a library a TODO reaches: code outside the project, which the audit hook judges by who called it."""
import os, signal, socket, subprocess


def write_file(path):
    with open(path, "w") as out:
        out.write("rigged")


def start_process(_):
    subprocess.Popen(["sleep", "1"])


def send_signal(_):
    os.kill(os.getppid(), 0)


def connect(_):
    socket.socket().connect(("127.0.0.1", 9))
'''


def _run_cases(tmp_path, cases: dict[str, tuple[str, list[str]]], library: dict[str, str] | None = None) -> dict:
    """Each case (TODO, body) compiled with its guards and called, in one child process: what it answered or raised.
    With `library`, Sink.record's `value` is that function of LIBRARY (kind -> name)."""
    folder = tmp_path / "tree" / "exercises"
    folder.mkdir(parents=True)
    specs = {}
    for kind, (key, body) in cases.items():
        result, _ = check(key, *body)
        assert result.text is not None, f"{kind}: refused before running: {result.refused}"
        path = folder / f"ch99_{len(specs)}.py"
        path.write_text(result.text)
        specs[kind] = {"path": str(path), "regions": result.regions, "todo": key}
        specs[kind]["library"] = (library or {}).get(kind)
    (tmp_path / "cases.json").write_text(json.dumps(specs))
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "fake_library.py").write_text(LIBRARY)
    driver = textwrap.dedent('''
        import json, sys, types
        import torch
        sys.path.insert(0, sys.argv[2])
        import fake_library
        from koans.grading.rewrite import compile_graded
        specs = json.load(open(sys.argv[1]))
        out = {}
        for kind, spec in specs.items():
            text = open(spec["path"]).read()
            module = types.ModuleType(f"fake_{abs(hash(kind))}")
            module.__file__ = spec["path"]
            sys.modules[module.__name__] = module  # as an import would (dataclasses looks there)
            try:
                exec(compile_graded(text, spec["path"], [tuple(r) for r in spec["regions"]]), module.__dict__)
                if spec["todo"] == "row_sums":
                    answer = module.row_sums(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
                    out[kind] = {"answer": [float(x) for x in answer]}
                elif spec["library"]:
                    out[kind] = {"answer": module.Sink().record(sys.argv[3], "x", getattr(fake_library, spec["library"]))}
                else:
                    sink = module.Sink()
                    out[kind] = {"answer": [sink.record("a", "loss", 1.0), sink.record("b", "loss", 2.0)]}
            except BaseException as err:
                out[kind] = {"raised": type(err).__name__, "message": str(err)[:500]}
        print(json.dumps(out))
    ''')
    done = subprocess.run([sys.executable, "-c", driver, str(tmp_path / "cases.json"), str(tmp_path / "library"),
                           str(tmp_path / "written.txt")], capture_output=True, text=True,
                          timeout=300, env={"KOANS_GUARD_LOG": str(tmp_path / "guard.log"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_honest_but_unusual_regions_pass_every_layer_and_answer_right(tmp_path):
    got = _run_cases(tmp_path, {kind: ("row_sums", body) for kind, body in HONEST.items()})
    for kind in HONEST:
        assert got[kind] == {"answer": [3.0, 7.0]}, f"{kind}: an honest answer was refused or wrong: {got[kind]}"
    assert not (tmp_path / "guard.log").exists() or not (tmp_path / "guard.log").read_text(), "nothing was refused"


RUNTIME = {
    # past the text check, stopped when it runs: (TODO, body, what the refusal names)
    "a module fetched by name at run time": ("row_sums", ['m = getattr(torch, "s" + "ys")', "return rows"],
                                             "the module sys"),
    "a module reached through another": ("row_sums", ["return torch.sys.modules"], "the module sys"),
    "a dunder built at run time": ("row_sums", ['return getattr(row_sums, "_" * 2 + "globals" + "_" * 2)'], "dunder"),
    "a private attribute of a module": ("row_sums", ["return torch._C"], "torch._C"),
    "a name that is a str subclass answering startswith": ("row_sums", [
        "class S(str):", "    def startswith(self, *args):", "        return False",
        'return getattr(row_sums, S("__glo" + "bals__"))'], "not a plain str"),
    "string.Formatter's walk by name": ("row_sums", [
        "import string", 'return string.Formatter().get_field("0.__globals__", [row_sums], {})'], "string.Formatter"),
    "functools.update_wrapper writing a module's attribute": ("row_sums", [
        "import functools", "def h(*a):", "    return True",
        "functools.update_wrapper(torch, h, assigned=('equal',), updated=())", "return rows"], "update_wrapper"),
    "a dataclass made of a given class": ("row_sums", [
        "import dataclasses", "dataclasses.dataclass(Given)", "return rows"], "dataclass applied to Given"),
    "a dataclass made of a given class, imported by name": ("row_sums", [
        "from dataclasses import dataclass", "dataclass(eq=True)(Given)", "return rows"], "dataclass applied to Given"),
    "super().format walking attributes": ("row_sums", [
        "class S(str):", "    def walk(self, x):", '        return super().format(x)',
        'return S("{0.__class__}").walk(rows)'], "super().format"),
    "a dataclass Field renamed to code": ("row_sums", [
        "import dataclasses", "@dataclasses.dataclass", "class R:", "    a: int = 0",
        "f = dataclasses.fields(R)[0]", "f.name = 'a,exec(\"1\")'", "return rows"], "Field of dataclasses"),
    "isinstance made true by ABC.register": ("row_sums", [
        "import abc", "class C(abc.ABC):", "    pass", "C.register(type(rows))", "return rows"],
        "abc.ABCMeta.register"),
    "an Enum built with dunder members": ("row_sums", [
        "import enum", "E = enum.Enum('E', [('A', 'x'), ('__eq__', lambda s, o: True)], type=str)", "return E.A"],
        "an Enum built from the names"),
    "a module's names captured by a pattern": ("row_sums", [
        "import functools", "match functools:", "    case object(update_wrapper=u):", "        return u"],
        "update_wrapper"),
    "unpickling": ("row_sums", ['return torch.load("x")'], "torch.load"),
    "a string evaluated by a library": ("row_sums", ["import typing", "def f(x: int): pass",
                                                     "return typing.get_type_hints(f)"], "typing.get_type_hints"),
    "a class built at run time by type()": ("row_sums", ['T = type("T", (), {"_" + "_eq_" + "_": lambda s, o: True})',
                                                         "return T()"], "three arguments"),
    "a class built at run time by make_dataclass": ("row_sums", ["import dataclasses",
                                                                 'return dataclasses.make_dataclass("T", [])'],
                                                    "make_dataclass"),
    "a metaclass fetched from a library": ("row_sums", ["import abc", 'return abc.ABCMeta("T", (), {})'],
                                           "metaclass"),
    "a format string that walks attributes": ("row_sums", ['f = "{0." + "f_back}"', "return f.format(rows)"],
                                              "format field"),
    "a generator's frame": ("row_sums", ["g = (x for x in [1])", "return g.gi_frame.f_back"], "gi_frame"),
    "a task's stack": ("row_sums", ["import asyncio", "async def f():",
                                    "    return asyncio.current_task().get_stack()[0].f_globals",
                                    "return asyncio.run(f())"], "frame"),
    "a subprocess through asyncio": ("row_sums", ["import asyncio", "return asyncio.create_subprocess_exec"],
                                     "create_subprocess_exec"),
    "monkeypatching through a helper's parameter": ("row_sums", ["def patch(m):", "    m.allclose = None",
                                                                 "patch(torch)", "return rows"], "module torch"),
    "monkeypatching through a container": ("row_sums", ["[torch][0].equal = None", "return rows"], "module torch"),
    "monkeypatching through the type of an argument": ("Sink.record", ["type(self).record = None", "return 0"],
                                                       "class Sink"),
    "monkeypatching a given class through an alias": ("row_sums", ["k = [Given][0]", "k.ping = None", "return rows"],
                                                      "class Given"),
    "shadowing a method with an attribute": ("Sink.record", ["self.record = lambda *a: 99", "return 1"],
                                             "replacing .record"),
    "a library class patched": ("row_sums", ["torch.Tensor.equal = lambda *a: True", "return rows"], "class Tensor"),
    "a process started with a bootstrap command": ("row_sums", ["from monarch.actor import this_host",
                                                                'this_host().spawn_procs(bootstrap_command="sh")',
                                                                "return rows"], "bootstrap_command"),
    "monarch's client ended": ("row_sums", ["import monarch.actor", "monarch.actor.shutdown_context()", "return rows"],
                               "shutdown_context"),
    "a file written through numpy": ("row_sums", ['rows.numpy().tofile("/tmp/x")', "return rows"], ".tofile"),
    "a library's private attribute fetched by name": ("row_sums", ['return getattr(torch.nn.Module(), "_modules")'],
                                                      "private attribute ._modules"),
    "a string that ForwardRef evaluates": ("row_sums", ["import typing", 'ref = typing.ForwardRef("exec(p) or int")',
                                                        "return rows"], "typing.ForwardRef"),
    "a private attribute through a method's own parameter": ("row_sums", [
        "class Helper:", "    def note(fr):", "        return fr._modules", "return Helper.note(torch.nn.Module())"],
        "private attribute ._modules"),
    "an event loop's method read from its class": ("row_sums", [
        "import asyncio", "spawn = asyncio.BaseEventLoop.subprocess_exec", "return rows"], "subprocess_exec"),
    "a format string on a subclass of str": ("row_sums", [
        "class S(str):", "    pass", 'return S.format("{0.__class__}", rows)'], "format field"),
    "Monarch told to run another program": ("row_sums", [
        "from monarch.actor import this_host", 'this_host().with_python_executable("/bin/sh")', "return rows"],
        "with_python_executable"),
    "a frame walked from a traceback's frames": ("row_sums", [
        "import traceback", "return traceback.walk_stack(None)"], "traceback.walk_stack"),
}


def test_what_passes_the_text_check_is_stopped_when_it_runs_and_named(tmp_path):
    got = _run_cases(tmp_path, {kind: (key, body) for kind, (key, body, _) in RUNTIME.items()})
    log = (tmp_path / "guard.log").read_text()
    for kind, (_, _, named) in RUNTIME.items():
        assert got[kind].get("raised") == "GuardRefusal", f"{kind}: not stopped: {got[kind]}"
        assert named in got[kind]["message"], f"{kind}: the refusal must name {named!r}: {got[kind]['message']}"
        assert f"{NAME}:" not in got[kind]["message"] or "in TODO" in got[kind]["message"]
    assert log.count("\n") >= len(RUNTIME), "each refusal is logged for the judge, one line each"
    assert all(": in TODO " in line for line in log.splitlines()), f"each names its TODO and line:\n{log}"


HOOKED = {
    # a library function a TODO calls that does what no TODO may: (function of LIBRARY, audit event named)
    "a library writes a file for the TODO": ("write_file", "open"),
    "a library starts a process for the TODO": ("start_process", "subprocess.Popen"),
    "a library sends a signal for the TODO": ("send_signal", "os.kill"),
    "a library opens a connection for the TODO": ("connect", "socket.connect"),
}


def test_what_a_todo_has_a_library_do_is_refused_by_the_audit_hook(tmp_path):
    """The audit hook judges an event by the innermost line of the project's code that caused it: a TODO's line is
    refused (given code, the tests and the runner may start processes, send signals and write files)."""
    cases = {kind: ("Sink.record", ["return value(source)"]) for kind in HOOKED}
    got = _run_cases(tmp_path, cases, {kind: function for kind, (function, _) in HOOKED.items()})
    for kind, (_, event) in HOOKED.items():
        assert got[kind].get("raised") == "GuardRefusal", f"{kind}: not stopped: {got[kind]}"
        assert event in got[kind]["message"] and "in TODO Sink.record" in got[kind]["message"], got[kind]["message"]
    assert not (tmp_path / "written.txt").exists(), "nothing was written"
