"""Chapter 05: plausible wrong answers (see mutants/README.md)."""

from koans.mutants import Mutant

MUTANTS = [
    Mutant("classify", "catches every exception as an endpoint error", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except Exception as err:
            return Outcome("endpoint_error", err, where)
    '''),
    Mutant("classify", "waits without a timeout", '''
        try:
            return Outcome("ok", await future, where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    '''),
    Mutant("classify", "takes a death for an endpoint error", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout), where)
        except (ActorError, SupervisionError) as err:
            return Outcome("endpoint_error", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    '''),
    Mutant("classify", "forgets `where`", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, timeout))
        except ActorError as err:
            return Outcome("endpoint_error", err)
        except SupervisionError as err:
            return Outcome("died", err)
        except TimeoutError as err:
            return Outcome("timeout", err)
    '''),
    Mutant("Supervisor.__supervise__", "handles every failure, its own or not", '''
        name = str(failure.mesh_name)
        if name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
        return True
    '''),
    Mutant("Supervisor.__supervise__", "takes the log forwarder's death for another child death", '''
        name = str(failure.mesh_name)
        if name.startswith("logger") or name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
            return True
        return False
    '''),
    Mutant("Supervisor.__supervise__", "records the generation after respawning", '''
        name = str(failure.mesh_name)
        if name.startswith("logger"):
            return True
        if name.startswith("child_g"):
            self.spawn_child()
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            return True
        return False
    '''),
    Mutant("classify", "waits with the blocking .get(), the habit of chapters 01-04, in async code (a learner's)", '''
        try:
            return Outcome("ok", future.get(timeout=timeout), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    '''),
    Mutant("classify", "waits the module's TIMEOUT, whatever timeout it was given", '''
        try:
            return Outcome("ok", await asyncio.wait_for(future, TIMEOUT), where)
        except ActorError as err:
            return Outcome("endpoint_error", err, where)
        except SupervisionError as err:
            return Outcome("died", err, where)
        except TimeoutError as err:
            return Outcome("timeout", err, where)
    '''),
    Mutant("Supervisor.__supervise__", "records the death but never respawns", '''
        name = str(failure.mesh_name)
        if name.startswith("logger"):
            return True
        if name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            return True
        return False
    '''),
    Mutant("Supervisor.__supervise__", "passes the log forwarder's death up the tree", '''
        name = str(failure.mesh_name)
        if name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
            return True
        return False
    '''),
]
