"""Chapter 05: plausible wrong answers (see mutants/README.md)."""

from koans.maintain.mutants import Mutant

MUTANTS = [
    Mutant("classify", "catches every exception as an endpoint error", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except Exception as err:
            return Outcome("endpoint_error", err, where)
    ''', clause='only the three failure classes'),
    Mutant("classify", "waits without a timeout", '''
        try:
            return Outcome("ok", await future, where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='timeout as given'),
    Mutant("classify", "takes a death for an endpoint error", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except (ActorError, SupervisionError) as err:
            return Outcome("endpoint_error", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='a process that exits is'),
    Mutant("classify", "forgets `where`", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout))
        except ActorError as err:
            return Outcome("endpoint_error", err)
        except SupervisionError as err:
            return Outcome("died", err)
        except TimeoutError as err:
            return Outcome("timeout", err)
    ''', clause='carries the where'),
    Mutant("Supervisor.__supervise__", "knows its child by the name pattern child_g..., not by what it spawned", '''
        name = str(failure.mesh_name)
        if name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
        return True
    ''', clause='what it was spawned as'),
    Mutant("Supervisor.__supervise__", "takes every failure for a death of its child, Monarch's own meshes too", '''
        self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name), "report": failure.report()})
        self.spawn_child()
        return True
    ''', clause='meshes monarch runs for itself | is not the child'),
    Mutant("Supervisor.__supervise__", "records the generation after respawning", '''
        if spawned_as(failure) == self.child_name:
            self.spawn_child()
            self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                                  "report": failure.report()})
        return True
    ''', clause="before you respawn | the dead child's"),
    Mutant("classify", "waits with the blocking .get(), the habit of chapters 01-04, in async code (a learner's)", '''
        try:
            return Outcome("ok", future.get(timeout=timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='blocking .get()'),
    Mutant("classify", "waits the module's TIMEOUT, whatever timeout it was given", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, TIMEOUT), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='timeout as given'),
    Mutant("Supervisor.__supervise__", "records the death but never respawns", '''
        if spawned_as(failure) == self.child_name:
            self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                                  "report": failure.report()})
        return True
    ''', clause='has not replaced the dead child | starting the next generation'),
    Mutant("Supervisor.__supervise__", "passes every failure but its child's up the tree", '''
        if spawned_as(failure) == self.child_name:
            self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                                  "report": failure.report()})
            self.spawn_child()
            return True
        return False
    ''', clause='answers true for every failure | false fails the supervisor itself'),
    Mutant("Supervisor.__supervise__",
           "knows Monarch's own meshes by the name logger... and passes up the rest (the rule Monarch 0.8 broke)", '''
        name = str(failure.mesh_name)
        if spawned_as(failure) == self.child_name:
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
            return True
        return name.startswith("logger")
    ''', clause='whatever its name'),
    Mutant("Supervisor.__supervise__",
           "knows every child it ever spawned, so a death reported twice is replaced twice", '''
        spawned = {f"child_g{generation}" for generation in range(1, self.generation + 1)}
        if spawned_as(failure) in spawned:
            self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                                  "report": failure.report()})
            self.spawn_child()
        return True
    ''', clause='self.child_name'),
    Mutant("classify", "hands back str(error) as an endpoint error's value (a learner's)", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", str(err), where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='the exception itself'),
    Mutant("classify", "gives a death the value None (a learner's)", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError:
            return Outcome("died", None, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='the exception itself'),
    Mutant("classify", "catches asyncio.CancelledError as a timeout, so a cancel is swallowed (a learner's)", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except (TimeoutError, asyncio.CancelledError) as err:
            return Outcome("timeout", err, where)
    ''', clause='a cancellation is not a timeout'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('classify', 'catches any RuntimeError as a death: unrelated RuntimeErrors no longer propagate', '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except RuntimeError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    ''', clause='not a base class'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('classify', 'truncates the timeout to whole seconds (int(timeout), as read_chunks does): a fractional timeout like 0.5 s times out at once', '''
try:
    return Outcome("ok", await asyncio.wait_for(future, int(timeout)), where)
except ActorError as err:
    return Outcome("endpoint_error", err, where)
except SupervisionError as err:
    return Outcome("died", err, where)
except TimeoutError as err:
    return Outcome("timeout", err, where)
''', clause='fractions too'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('classify', "`timeout or TIMEOUT`: a zero timeout waits 30 s instead of giving up at once; breaks 'at most `timeout` seconds' at 0", '''
try:
    return Outcome("ok", await asyncio.wait_for(future, timeout or TIMEOUT), where)
except ActorError as err:
    return Outcome("endpoint_error", err, where)
except SupervisionError as err:
    return Outcome("died", err, where)
except TimeoutError as err:
    return Outcome("timeout", err, where)
''', clause='a timeout of 0 waits not at all'),
    Mutant('Supervisor.__supervise__', "gives up respawning after three deaths (a restart budget): breaks 'The current child's failure: ... start the next generation' on the 4th death", '''
if spawned_as(failure) == self.child_name:
    self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                          "report": failure.report()})
    if len(self.failures) < 4:
        self.spawn_child()
return True
''', clause='however many came before it'),
]


# Caught since the eighth independent set (one mutant per contract clause, written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Supervisor.__supervise__', "'Know the child by ... self.child_name; see spawned_as' broken: substring test; differs on a mesh whose name merely contains the child's name (e.g. child_g12-... while the child is child_g1)", '''
    if self.child_name in str(failure.mesh_name):
        self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                              "report": failure.report()})
        self.spawn_child()
    return True
''', clause='is not the child'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("classify", "a timeout's value is None", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError:
            return Outcome("timeout", None, where)
    ''', clause="its value a timeouterror"),
    Mutant("Supervisor.__supervise__", "a death recorded after the respawn (the slow real-death test came first)", '''
        if spawned_as(failure) == self.child_name:
            self.spawn_child()
            self.failures.append({"generation": self.generation, "mesh": str(failure.mesh_name),
                                  "report": failure.report()})
        return True
    ''', clause="the dead child's"),
]
