"""The grader's run-time guards: compiled into a submission's TODO regions, checked as the code runs.

Only the autograder uses this. koans.grading.rewrite compiles each graded chapter file so that, inside
its TODO regions (and nowhere else):

    obj.name            becomes  __koans_attr__(obj, "name")         every attribute read is vetted
    obj.name = value    becomes  __koans_writable__(obj, "name").name = value
    obj[key] = value    becomes  __koans_writable__(obj, None)[key] = value
    getattr(o, n), hasattr(o, n), type(o)   go through guarded versions (a name built at run time
                                            is vetted like a literal one; type() only asks, never builds)
    import m, from m import a   are followed by  m = __koans_vet__(m), a = __koans_vet__(a)
    case P(attr=x): ...         vets every captured name before the guard and the body
    class C: ...                is decorated with __koans_class_made__ (first) and __koans_class__ (last)

and `install`, called by a line added at the top of the module, binds those names and adds a
Python audit hook to the process (every process that imports the module: the tests' and Monarch's).

What the guards refuse, whatever route reached the object:
  - modules other than the computing ones a TODO may use (ALLOWED_MODULES); of `os`, `threading`,
    `logging` and the others of RESTRICTED_MODULES, all but the attributes listed; private names of any
    module, and of any object that is not the chapter's own (of the `exercises` package, or a subclass);
  - functions and classes that reach processes, signals, files, the interpreter, code generation or
    unpickling (by the module that defines them, DENIED_ORIGINS, or by identity, _denied_objects), and
    those that read or write attributes by names given as strings (string.Formatter, update_wrapper);
  - frames, code objects, tracebacks, a generator's frame; metaclasses (they build classes at run time);
  - writing attributes of modules, classes (but those the TODO defined), functions, and replacing a
    method of an object with an attribute of the same name (monkeypatching); a dataclass made of a
    class the TODO did not define;
  - `str.format` fields that walk attributes; attribute names that are not exact str;
  - Monarch's spawn_procs with a bootstrap_command, with_python_executable (they run any program).
The audit hook refuses starting processes, signals, sockets, ctypes and writing files whenever the
innermost project frame is a line of a TODO region (given code may do those things).

A refusal raises GuardRefusal (a PermissionError) and appends one line to $KOANS_GUARD_LOG:
"chNN_<topic>.py:LINE: in TODO <key>: <what>". The grader scores a chapter with a refusal 0 and
names each line.
"""

from __future__ import annotations

import asyncio
import os
import string
import sys
import types

LOG_ENV = "KOANS_GUARD_LOG"

#: Modules a TODO may hold and pass around (their public attributes are vetted one by one).
ALLOWED_MODULES = frozenset({
    "math", "cmath", "random", "statistics", "numbers", "decimal", "fractions", "collections", "collections.abc",
    "itertools", "functools", "heapq", "bisect", "dataclasses", "typing", "enum", "time", "datetime", "asyncio",
    "contextlib", "abc", "copy", "json", "re", "textwrap", "uuid", "hashlib", "struct", "array", "queue",
    "operator", "pprint", "concurrent", "concurrent.futures", "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.utils", "torch.linalg", "torch.special",
    "torch.fft", "torch.autograd", "torch.cuda", "torch.optim", "torch.distributions", "torch.distributed.tensor",
    "monarch", "monarch.actor", "monarch.rdma",
})
#: Modules given code imported that a TODO may touch only through these attributes.
RESTRICTED_MODULES = {
    "os": frozenset({"getpid", "getppid", "cpu_count", "sep", "linesep", "uname"}),
    "socket": frozenset({"gethostname"}),
    "platform": frozenset({"node", "system", "machine", "python_version"}),
    "threading": frozenset({"Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore", "Barrier", "Thread",
                            "get_ident", "current_thread"}),
    "warnings": frozenset({"warn", "catch_warnings", "simplefilter", "filterwarnings"}),
    "logging": frozenset({"getLogger", "debug", "info", "warning", "error", "exception", "log", "DEBUG", "INFO",
                          "WARNING", "ERROR", "CRITICAL"}),
    "traceback": frozenset({"format_exc", "format_exception", "format_exception_only", "print_exc"}),
    "torch.distributed": frozenset({"tensor", "is_available", "is_initialized", "get_rank", "get_world_size"}),
    "string": frozenset({"ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits", "octdigits",
                         "punctuation", "whitespace", "printable", "capwords"}),
}

#: Where a function or class comes from decides whether a TODO may have it (module name, or its prefix + ".").
DENIED_ORIGINS = (
    "os", "posix", "nt", "sys", "subprocess", "_posixsubprocess", "signal", "_signal", "socket", "_socket", "ssl",
    "select", "selectors", "ctypes", "_ctypes", "gc", "inspect", "importlib", "_imp", "_frozen_importlib", "marshal",
    "pickle", "_pickle", "copyreg", "shelve", "dbm", "shutil", "pathlib", "io", "_io", "code", "codeop", "runpy",
    "pty", "tty", "termios", "fcntl", "resource", "mmap", "multiprocessing", "_multiprocessing",
    "concurrent.futures.process", "tempfile", "glob", "zipimport",
    "pkgutil", "site", "sysconfig", "unittest", "pdb", "bdb", "trace", "faulthandler",
    "tracemalloc", "logging.handlers", "logging.config", "urllib", "http", "ftplib", "smtplib", "webbrowser", "xmlrpc", "zipfile", "tarfile",
    "sqlite3", "weakref", "_weakref", "atexit", "asyncio.subprocess", "asyncio.streams",
    "linecache", "tokenize", "ast", "dis", "types",
    "torch.serialization", "torch.hub", "torch.utils", "torch.jit", "torch._dynamo", "torch.fx", "torch.package",
    "torch.library", "torch._ops", "torch.compiler", "torch.export", "torch.multiprocessing", "torch.distributed.rpc",
    "torch._C._distributed_rpc", "monarch._rust_bindings.monarch_hyperactor.host_mesh", "monarch.job",
    "monarch.tools", "conftest", "pytest", "_pytest", "pluggy",
)
#: Builtins a TODO reaches only by name, and the lexical check keeps from it; vetted here if met as values.
DENIED_BUILTINS = frozenset({"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
                             "globals", "locals", "vars", "breakpoint", "input", "exit", "quit", "help"})
#: Attribute names refused on any object: each reads or writes files, loads code, or starts processes.
DENIED_ATTRIBUTES = frozenset({"tofile", "dump", "from_file", "load_library", "load_inline",
                               "create_subprocess_exec", "create_subprocess_shell", "system", "popen"})
#: What a TODO may not ask of an event loop: processes, signals, sockets, file descriptors.
DENIED_LOOP_METHODS = frozenset({
    "subprocess_exec", "subprocess_shell", "add_signal_handler", "remove_signal_handler", "add_reader",
    "add_writer", "remove_reader", "remove_writer", "create_connection", "create_server", "create_unix_connection",
    "create_unix_server", "create_datagram_endpoint", "connect_accepted_socket", "connect_read_pipe",
    "connect_write_pipe", "sock_connect", "sock_accept", "sock_recv", "sock_recv_into", "sock_sendall",
    "sock_sendto", "sock_recvfrom", "sock_sendfile", "sendfile", "start_tls", "getaddrinfo", "getnameinfo",
    "set_exception_handler", "set_default_executor", "set_task_factory", "shutdown_default_executor"})
#: Monarch names a TODO may not use: each starts programs, workers or transports, or ends the client.
DENIED_MONARCH_NAMES = frozenset({"default_bootstrap_cmd", "run_worker_loop_forever", "run_worker_loop_until_shutdown",
                                  "start_worker_loop_forever", "attach_to_workers", "attach", "enable_transport",
                                  "debug_controller", "shutdown_context", "unhandled_fault_hook",
                                  "with_python_executable", "sync_workspace", "shutdown"})
_OPAQUE = (types.FrameType, types.CodeType, types.TracebackType, types.CellType)
_GENERATOR_INTERNALS = ("gi_", "cr_", "ag_")
FRAME_ATTRIBUTES = ("gi_", "cr_", "ag_", "f_", "tb_", "co_")  # a frame's, code's or generator's public names
#: Public names of namedtuples that start with an underscore (so as not to clash with fields).
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
_FAST = frozenset({int, float, bool, str, bytes, type(None), list, tuple, dict, set, frozenset, complex, range, slice})
#: Dunder methods a class defined in a TODO may have (the lexical check says the same; this is for classes
#: built by library code on the TODO's behalf, such as a dataclass).
ALLOWED_CLASS_DUNDERS = frozenset({
    "__init__", "__post_init__", "__repr__", "__str__", "__iter__", "__next__", "__aiter__", "__anext__",
    "__enter__", "__exit__", "__aenter__", "__aexit__", "__call__"})


class GuardRefusal(PermissionError):
    """A TODO did something no TODO needs; the grader scores the chapter 0 and names the line."""


# ---------------------------------------------------------------- where a refusal happened

_REGIONS: dict[str, list[tuple[int, int, str]]] = {}  # graded file -> (first line, last line, TODO key)
_PROJECT_ROOTS: list[str] = []
_REGION_CLASSES: "set[int]" = set()  # ids of classes a TODO defined (they may be written to)
_IN_HOOK = [False]
_HOOKED = [False]


def _region_of(frame) -> tuple[str, int, str] | None:
    """(file, line, TODO key) when `frame` executes a line of a TODO region."""
    spans = _REGIONS.get(frame.f_code.co_filename)
    if spans:
        line = frame.f_lineno
        for first, last, key in spans:
            if first <= line <= last:
                return frame.f_code.co_filename, line, key
    return None


def _caller_region():
    frame = sys._getframe()
    while frame is not None:
        found = _region_of(frame)
        if found is not None:
            return found
        frame = frame.f_back
    return None


def _refuse(what: str, where=None):
    where = where or _caller_region()
    spot = f"{os.path.basename(where[0])}:{where[1]}: in TODO {where[2]}: " if where else ""
    line = f"{spot}{what}"
    path = os.environ.get(LOG_ENV)
    if path:
        try:
            with open(path, "a") as log:
                log.write(line.replace("\n", " ") + "\n")
        except OSError:
            pass
    raise GuardRefusal(f"koans guard: {line}")


# ---------------------------------------------------------------- vetting what a TODO gets hold of


def _module_policy(module: types.ModuleType):
    """'all', a frozenset of allowed names, or None (refused): by name, and only the real module of that name."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or sys.modules.get(name) is not module:
        return None
    if name in ALLOWED_MODULES:
        return "all"
    return RESTRICTED_MODULES.get(name)


def _origin(value) -> str:
    """The module that defines a function, method or class ('' when it has none)."""
    target = getattr(value, "__func__", value) if isinstance(value, types.MethodType) else value
    owner = getattr(target, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):  # a method of a class written in C: where its class comes from
        defining = getattr(target, "__objclass__", None) or (type(owner) if owner is not None else None)
        module = getattr(defining, "__module__", None)
    return module if isinstance(module, str) else ""


_ORIGIN_VERDICTS: dict[str, bool] = {}


def _denied_origin(origin: str) -> bool:
    verdict = _ORIGIN_VERDICTS.get(origin)
    if verdict is None:
        verdict = _ORIGIN_VERDICTS[origin] = any(origin == denied or origin.startswith(denied + ".")
                                                 for denied in DENIED_ORIGINS)
    return verdict


_DENIED_IDS: dict[int, str] = {}


def _denied_objects() -> dict[int, str]:
    """id -> name of the objects refused by identity (filled on first use: torch is imported by then)."""
    if _DENIED_IDS:
        return _DENIED_IDS
    import builtins
    import dataclasses
    import enum
    import functools
    import operator
    import string
    import typing

    named = {f"builtins.{name}": getattr(builtins, name) for name in DENIED_BUILTINS}
    import abc

    named.update({"typing.get_type_hints": typing.get_type_hints, "typing.ForwardRef": typing.ForwardRef,
                  "abc.ABCMeta.register": abc.ABCMeta.register,
                  "dataclasses.make_dataclass": dataclasses.make_dataclass,
                  "functools.singledispatch": functools.singledispatch,
                  "functools.singledispatchmethod": functools.singledispatchmethod, "builtins.type": type,
                  # they read or write attributes by names given as strings, on whatever they are handed
                  "string.Formatter": string.Formatter, "functools.total_ordering": functools.total_ordering,
                  "enum.global_enum": getattr(enum, "global_enum", None)})
    named = {key: value for key, value in named.items() if value is not None}
    torch = sys.modules.get("torch")
    if torch is not None:
        for name in ("load", "save", "from_file", "compile", "set_default_device"):
            if hasattr(torch, name):
                named[f"torch.{name}"] = getattr(torch, name)
    for name, value in named.items():
        _DENIED_IDS[id(value)] = name
    return _DENIED_IDS


def _dataclass_of_own_classes(decorate):
    """dataclasses.dataclass, for the TODO's own classes only (on a given class it would rewrite its __eq__), and
    only where every field, inherited ones too, is named by an identifier (the names go into generated code)."""
    import dataclasses

    def dataclass(cls=None, /, **options):
        def apply(target):
            if id(target) not in _REGION_CLASSES:
                _refuse(f"dataclass applied to {getattr(target, '__name__', 'a class')}, which your TODO did not "
                        "define (it would rewrite the class's methods)")
            names = [f.name for base in target.__mro__[1:] if dataclasses.is_dataclass(base)
                     for f in dataclasses.fields(base)] + list(vars(target).get("__annotations__", {}))
            if not all(type(n) is str and str.isidentifier(n) and not str.startswith(n, "__") for n in names):
                _refuse(f"a dataclass whose field names are not plain identifiers: {names!r}"[:300])
            return decorate(target, **options)
        return apply if cls is None else apply(cls)
    return dataclass


_WRAPPED: dict[int, object] = {}  # id(library callable) -> the guarded stand-in a TODO gets instead


def _attrgetter(*names):
    """operator.attrgetter, reading each (dotted) name through the guard."""
    def get(obj):
        values = []
        for dotted in names:
            value = obj
            for part in _plain_name(dotted).split("."):
                value = guarded_getattr(value, part)
            values.append(value)
        return values[0] if len(values) == 1 else tuple(values)
    return get


def _methodcaller(name, /, *args, **kwargs):
    """operator.methodcaller, fetching the method through the guard."""
    return lambda obj: guarded_getattr(obj, name)(*args, **kwargs)


def _region_function(function) -> bool:
    code = getattr(function, "__code__", None)
    return type(function) is types.FunctionType and code is not None and code.co_filename in _REGIONS


def _update_wrapper(wrapper, wrapped, *args, **kwargs):
    """functools.update_wrapper, onto a function the TODO wrote (it writes attributes by name)."""
    import functools

    if not _region_function(wrapper):
        _refuse("functools.update_wrapper onto something your TODO did not write (it writes attributes by name)")
    return functools.update_wrapper(wrapper, wrapped, *args, **kwargs)


def _wraps(wrapped, *args, **kwargs):
    return lambda wrapper: _update_wrapper(wrapper, wrapped, *args, **kwargs)


def _wrapped() -> dict[int, object]:
    if not _WRAPPED:
        import dataclasses
        import functools
        import operator

        _WRAPPED.update({id(dataclasses.dataclass): _dataclass_of_own_classes(dataclasses.dataclass),
                         id(operator.attrgetter): _attrgetter, id(operator.methodcaller): _methodcaller,
                         id(functools.update_wrapper): _update_wrapper, id(functools.wraps): _wraps})
    return _WRAPPED


def vet(value, name: str = ""):
    """`value`, if a TODO may hold it (or its guarded stand-in); else refuse. (Also after `from m import name`.)"""
    kind = type(value)
    if kind in _FAST:
        return value
    stand_in = _wrapped().get(id(value))
    if stand_in is not None:
        return stand_in
    if isinstance(value, types.ModuleType):
        if _module_policy(value) is None:
            _refuse(f"the module {getattr(value, '__name__', '?')} (a TODO may use only computing modules: "
                    "math, random, itertools, asyncio, torch, monarch and the like)")
        return value  # (of os and its like, only the listed attributes can be read: see attr)
    if kind in _OPAQUE:
        _refuse(f"{name or 'a value'} is a {kind.__name__} (the interpreter's internals)")
    denied = _denied_objects().get(id(getattr(value, "__func__", value) if kind is types.MethodType else value))
    if denied is not None:
        _refuse(f"{denied} (it reads or writes files, builds code or classes at run time, or evaluates strings)")
    if isinstance(value, type) and issubclass(value, type):
        _refuse(f"the metaclass {value.__name__} (it builds classes at run time)")
    if callable(value) or isinstance(value, type):
        origin = _origin(value)
        if origin and _denied_origin(origin):
            _refuse(f"{origin}.{getattr(value, '__name__', name)} (from {origin}: processes, files, the interpreter "
                    "or the grader, which no TODO needs)")
        function_name = getattr(value, "__name__", "")
        if origin.startswith("monarch") and function_name in DENIED_MONARCH_NAMES:
            _refuse(f"monarch's {function_name} (it starts programs or workers, or ends the client)")
        if origin.startswith("asyncio") and function_name in DENIED_LOOP_METHODS:
            _refuse(f"the event loop's {function_name} (processes, signals and sockets are not a TODO's)")
    return value


def captured(value):
    """What a `match` pattern captured (it may have read it as an attribute of the subject): vetted as an
    attribute's value; a library callable that has a guarded stand-in cannot be captured at all."""
    if id(value) in _wrapped():
        _refuse(f"a pattern that captures {getattr(value, '__name__', 'a library function')} (import it instead)")
    if type(value) is dict and any(value is vars(module) for module in list(sys.modules.values())
                                   if isinstance(module, types.ModuleType)):
        _refuse("a pattern that captures a module's namespace (its globals)")
    return vet(value, "a captured value")


def _safe_format(template: str):
    """str.format for `template`, refusing fields that walk attributes ("{0.attr}"; "{0[key]}" is fine). Works on
    an exact str copy of it: a subclass's own methods take no part."""
    template = "".join((template,))
    for _, field, spec, _ in string.Formatter().parse(template):
        for text in (field or "", spec or ""):
            for part in text.replace("[", ".").replace("]", ".").replace("{", ".").replace("}", ".").split(".")[1:]:
                if part.startswith("_") or part.startswith(FRAME_ATTRIBUTES):
                    _refuse(f"the format field {{{field}}} (it reads a private, dunder or frame attribute)")
    return template.format


def _spawn_procs_without_bootstrap(method):
    def spawn_procs(*args, **kwargs):
        if kwargs.get("bootstrap_command") is not None or len(args) >= 5:
            _refuse("spawn_procs with a bootstrap_command (it runs any program; procs start as they are)")
        return method(*args, **kwargs)
    return spawn_procs


_PROJECT_PACKAGES: set[str] = set()  # the graded modules' packages ("exercises"): their objects' private names


def _is_project_object(obj) -> bool:
    """An instance or class of the chapter's own code (given or the TODO's), or of a subclass of it (a test's
    stand-in): its private names are the course's."""
    owner = obj if isinstance(obj, type) else type(obj)
    for klass in getattr(owner, "__mro__", ()):
        module = klass.__dict__.get("__module__")
        if isinstance(module, str) and module.split(".")[0] in _PROJECT_PACKAGES:
            return True
    return False


def attr(obj, name: str):
    """obj.name, for a TODO: the receiver and what it hands back are vetted."""
    kind = type(obj)
    if kind in _OPAQUE:
        _refuse(f"reading .{name} of a {kind.__name__} (the interpreter's internals)")
    if name.startswith("_") and not name.startswith("__") and name not in NAMEDTUPLE_API \
            and not _is_project_object(obj) and not isinstance(obj, types.ModuleType):
        _refuse(f"the private attribute .{name} of a {kind.__name__} (a library's internals; only the chapter's own "
                "objects' private attributes are a TODO's)")
    if isinstance(obj, types.ModuleType):
        policy = _module_policy(obj)
        if name.startswith("_") or policy is None or (policy != "all" and name not in policy):
            _refuse(f"{getattr(obj, '__name__', 'a module')}.{name} (not available to a TODO)")
        if obj.__name__.startswith("monarch") and name in DENIED_MONARCH_NAMES:
            _refuse(f"monarch's {name} (it starts programs or workers, or ends the client)")
        if policy != "all":
            return getattr(obj, name)  # os.getpid & co: listed one by one
    elif name.startswith(_GENERATOR_INTERNALS) and isinstance(obj, (types.GeneratorType, types.CoroutineType,
                                                                    types.AsyncGeneratorType)):
        _refuse(f"reading .{name} (a generator's or coroutine's frame)")
    if name in DENIED_ATTRIBUTES:
        _refuse(f".{name} (it reads or writes files, loads code or starts processes)")
    if name in DENIED_LOOP_METHODS and (isinstance(obj, asyncio.AbstractEventLoop) or (
            isinstance(obj, type) and issubclass(obj, asyncio.AbstractEventLoop))):
        _refuse(f"the event loop's {name} (processes, signals and sockets are not a TODO's)")
    if name in DENIED_MONARCH_NAMES and _origin(obj if isinstance(obj, type) else kind).startswith("monarch"):
        _refuse(f"monarch's {name} (it starts programs or workers, or ends the client)")
    if name in ("format", "format_map") and kind is super:
        _refuse(f"super().{name} (it would format without the guard; format the value itself)")
    if name in ("format", "format_map") and (isinstance(obj, str) or (isinstance(obj, type) and issubclass(obj, str))):
        method = "format" if name == "format" else "format_map"
        if isinstance(obj, str):
            return getattr(_safe_format(obj).__self__, method)
        return lambda template, *a, **k: getattr(_safe_format(template).__self__, method)(*a, **k)
    value = getattr(obj, name)
    if name == "spawn_procs" and callable(value):
        return _spawn_procs_without_bootstrap(value)
    return vet(value, name)


#: Dunder attributes a TODO may read (the lexical check's list too): what an object is, an exception's cause.
ALLOWED_DUNDER_ATTRS = frozenset({"__name__", "__qualname__", "__doc__", "__module__", "__class__", "__cause__",
                                  "__context__"})


def _plain_name(name) -> str:
    """The attribute name as an exact str (a subclass of str could answer its own startswith)."""
    if type(name) is not str:
        _refuse(f"an attribute name that is a {type(name).__name__}, not a plain str")
    return name


def guarded_getattr(obj, name, *default):
    name = _plain_name(name)
    if str.startswith(name, "__") and name not in ALLOWED_DUNDER_ATTRS:
        _refuse(f"getattr(..., {name!r}) (dunder attributes reach the interpreter's internals)")
    try:
        return attr(obj, name)
    except AttributeError:
        if default:
            return default[0]
        raise


def guarded_hasattr(obj, name) -> bool:
    """hasattr answers only yes or no: any name may be asked about (a dunder too), none is handed out."""
    name = _plain_name(name)
    if str.startswith(name, "__"):
        return hasattr(obj, name)
    try:
        guarded_getattr(obj, name)
    except AttributeError:
        return False
    return True


def guarded_type(*args):
    if len(args) != 1:
        _refuse("type() with three arguments (it builds a class at run time; write a class statement)")
    return vet(type(args[0]), "type(...)")


#: Modules whose objects describe classes and functions (a dataclass's Field, an enum's members, a
#: ForwardRef): their attributes feed code that libraries generate, so a TODO may not write them.
MACHINERY = frozenset({"dataclasses", "typing", "enum", "abc", "functools", "operator", "collections", "types",
                       "inspect", "copy", "copyreg", "weakref", "string", "re", "json", "contextlib", "builtins"})


def writable(obj, name):
    """`obj`, when a TODO may write its attribute `name` (None: an item); else refuse."""
    if isinstance(obj, types.ModuleType):
        _refuse(f"writing {'an item' if name is None else '.' + name} of the module {obj.__name__} (monkeypatching)")
    if isinstance(obj, type):
        if id(obj) not in _REGION_CLASSES:
            _refuse(f"writing {'an item' if name is None else '.' + name} of the class {obj.__name__}, which your "
                    "TODO did not define (monkeypatching)")
        return obj
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MappingProxyType,
                        property, staticmethod, classmethod, *_OPAQUE)):
        _refuse(f"writing {'an item' if name is None else '.' + name} of {type(obj).__name__} (monkeypatching)")
    owner_module = getattr(type(obj), "__module__", "")
    if isinstance(owner_module, str) and owner_module.split(".")[0] in MACHINERY and not isinstance(
            obj, (dict, list, set, bytearray)) and not _is_project_object(obj):
        _refuse(f"writing {'an item' if name is None else '.' + name} of a {type(obj).__name__} of "
                f"{owner_module} (it describes code that a library generates)")
    if name is not None:
        declared = None
        for klass in type(obj).__mro__:
            if name in klass.__dict__:
                declared = klass.__dict__[name]
                break
        # a method, an endpoint, any descriptor without a setter: replacing it on the object is monkeypatching (a
        # property with a setter, a tensor's .data or .grad, are meant to be set)
        if callable(declared) or (hasattr(type(declared), "__get__") and not hasattr(type(declared), "__set__")):
            _refuse(f"replacing .{name} of a {type(obj).__name__} object: its class defines it as a method or "
                    "property (monkeypatching)")
    return obj


def class_made(cls):
    """Applied first to each class a TODO defines (innermost decorator): its own, so a dataclass may be made of it."""
    _REGION_CLASSES.add(id(cls))
    return cls


def guarded_class(cls):
    """Applied last to each class a TODO defines: no metaclass made, no dunder method of its code outside the
    allowed ones (library-made ones, a dataclass's __eq__ or an IntEnum's __format__, are the library's)."""
    if issubclass(cls, type):
        _refuse(f"the class {cls.__name__} subclasses type (a metaclass builds classes at run time)")
    for name, value in vars(cls).items():
        if name.startswith("__") and name.endswith("__") and callable(value) and name not in ALLOWED_CLASS_DUNDERS \
                and not _made_by_library(cls, name):
            _refuse(f"the class {cls.__name__} defines {name}")
    _REGION_CLASSES.add(id(cls))
    return cls


def _made_by_library(cls, name: str) -> bool:
    """A dunder that dataclasses (or functools.total_ordering) generated: its code is theirs, not the TODO's."""
    function = vars(cls)[name]
    code = getattr(function, "__code__", None)
    return code is None or not any(code.co_filename == path for path in _REGIONS)


# ---------------------------------------------------------------- the audit hook

#: Audit events a TODO's own line may not raise (given code and libraries may). Not sys._getframe, which
#: namedtuple and Enum call for a TODO that uses them, nor pickle.find_class or marshal.loads, which Monarch's
#: replies and the import system raise: a frame is refused when it is read (`attr`), and no TODO reaches pickle.
WATCHED_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
    "ctypes.call_function", "ctypes.create_string_buffer", "socket.connect", "socket.bind", "socket.sendto",
    "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown", "os.truncate", "os.mkdir", "os.symlink",
    "os.link", "os.putenv", "os.unsetenv", "os.chdir", "shutil.rmtree", "shutil.copyfile", "shutil.move",
    "code.__new__", "function.__new__", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "open", "builtins.input"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple) -> None:
    if event not in WATCHED_EVENTS or _IN_HOOK[0]:
        return
    if event == "open":
        mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if not writes:
            return
    _IN_HOOK[0] = True
    try:
        where = _innermost_project_region()
    finally:
        _IN_HOOK[0] = False
    if where is not None:
        _refuse(f"{event} (a TODO starts no process, sends no signal, opens no socket or file for writing, "
                "and reads no frame)", where)


def _innermost_project_region():
    """The TODO line that caused the event, when the innermost frame of this project's code is one."""
    try:
        frame = sys._getframe(2)  # past this function and the hook: the code that raised the event
    except ValueError:  # raised from outside Python (Monarch's Rust threads): no TODO line is its cause
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in _REGIONS:
            return _region_of(frame)
        if filename == __file__:
            return None  # the guards' own work (a refusal's log line, a look at the stack)
        if filename.startswith("<frozen importlib"):
            return None  # the import system loading a module a TODO imports (the import itself is vetted)
        if any(filename.startswith(root) for root in _PROJECT_ROOTS):
            return None  # given code, the runner or the tests: they may
        frame = frame.f_back
    return None


# ---------------------------------------------------------------- installing


def _guard_enum_functional_api() -> None:
    """Enum('E', names) builds a class from names it is given: called from a TODO, no name may be a dunder or
    private (it would become a method of the class: an __eq__ that answers True, a __torch_function__)."""
    import enum

    if getattr(enum.EnumType.__call__, "_koans_guarded", False):
        return
    original = enum.EnumType.__call__

    def __call__(cls, value, names=None, *args, **kwargs):
        if names is not None and _caller_region() is not None:
            if isinstance(names, str):
                listed = names.replace(",", " ").split()
            elif isinstance(names, dict):
                listed = list(names)
            else:
                listed = [item if isinstance(item, str) else item[0] for item in names]
            if not all(type(name) is str and not str.startswith(name, "_") for name in listed):
                _refuse(f"an Enum built from the names {listed!r} (a member may not be named with an underscore: it "
                        "would become a method of the class)"[:300])
        return original(cls, value, names, *args, **kwargs)

    __call__._koans_guarded = True
    enum.EnumType.__call__ = __call__


def install(module_globals: dict, regions: list[tuple[int, int, str]]) -> None:
    """Bind the guards in a graded module and watch its regions (called by the line rewrite adds)."""
    filename = module_globals["__file__"]
    _REGIONS[filename] = [tuple(region) for region in regions]
    _PROJECT_PACKAGES.add(module_globals["__name__"].split(".")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(filename))) + os.sep
    if root not in _PROJECT_ROOTS:
        _PROJECT_ROOTS.append(root)
    module_globals.update({"__koans_attr__": attr, "__koans_writable__": writable,
                           "__koans_getattr__": guarded_getattr, "__koans_hasattr__": guarded_hasattr,
                           "__koans_type__": guarded_type, "__koans_vet__": vet, "__koans_class__": guarded_class,
                           "__koans_class_made__": class_made, "__koans_captured__": captured})
    if not _HOOKED[0]:
        sys.addaudithook(_audit)
        _guard_enum_functional_api()
        _HOOKED[0] = True
