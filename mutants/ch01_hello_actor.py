"""Chapter 01: plausible wrong answers (see mutants/README.md)."""

from koans.maintain.mutants import Mutant

MUTANTS = [
    Mutant("Greeter.greet", "answers before counting, so the first greeting says #0", '''
        text = f"Hello, {who}! I am {self.name} (greeting #{self.greetings_given})."
        self.greetings_given += 1
        return text
    ''', clause='count this greeting before'),
    Mutant("Greeter.greet", "counts in a local variable, so every greeting says #1", '''
        greetings_given = self.greetings_given + 1
        return f"Hello, {who}! I am {self.name} (greeting #{greetings_given})."
    ''', clause='keep the count on self'),
    Mutant("Greeter.whereabouts", "reports the parent process's pid", '''
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"pid": os.getppid(), "host": socket.gethostname(), "device": device}
    ''', clause='pid of the process the endpoint runs in'),
    Mutant("Greeter.whereabouts", "reports the operating system's name as the host", '''
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"pid": os.getpid(), "host": os.uname().sysname, "device": device}
    ''', clause='host name'),
    Mutant("start_one_process", "asks for two processes", '''
        return this_host().spawn_procs(per_host={"procs": 2})
    ''', clause='exactly one process'),
    Mutant("start_one_process", "returns the calling process instead of a new one", '''
        from monarch.actor import this_proc

        return this_proc()
    ''', clause='not a mesh of one new process'),
    Mutant("spawn_greeter", "spawns in this process, whatever mesh it was given", '''
        from monarch.actor import this_proc

        return this_proc().spawn("greeter", Greeter, name)
    ''', clause='use the ProcMesh you are given'),
    Mutant("spawn_greeter", "passes the actor's name where the greeter's name belongs", '''
        return procs.spawn(name, Greeter, "greeter")
    ''', clause='must reach Greeter.__init__'),
    Mutant("Greeter.greet", "counts in a module-level variable, shared by every greeter in the process", '''
        global _GREETINGS
        _GREETINGS = globals().get("_GREETINGS", 0) + 1
        return f"Hello, {who}! I am {self.name} (greeting #{_GREETINGS})."
    ''', clause='kept on self'),
    Mutant("Greeter.whereabouts", "reports 'localhost' as the host", '''
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"pid": os.getpid(), "host": "localhost", "device": device}
    ''', clause='host name'),
    Mutant("start_one_process", "returns the host mesh, not a mesh of processes on it", '''
        return this_host()
    ''', clause='not a mesh of one new process'),
    Mutant("spawn_greeter", "names the greeter 'greeter', whatever name it was given", '''
        return procs.spawn("greeter", Greeter, "greeter")
    ''', clause='must reach Greeter.__init__'),
    Mutant("Greeter.whereabouts", "assumes the device is the CPU (a learner's)", '''
        return {"pid": os.getpid(), "host": socket.gethostname(), "device": "cpu"}
    ''', clause='ask torch'),
    Mutant("spawn_greeter", "spawns every greeter under one fixed actor name (a learner's)", '''
        return procs.spawn("greeter", Greeter, name)
    ''', clause='spawn each under its own'),
    Mutant("start_one_process", "keeps the first mesh in a global and hands it out again", '''
        global _ONE_MESH
        if globals().get("_ONE_MESH") is None:
            _ONE_MESH = this_host().spawn_procs(per_host={"procs": 1})
        return _ONE_MESH
    ''', clause='each call starts one new process'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('start_one_process', "names the mesh dimension 'gpus' instead of 'procs'", '''
        return this_host().spawn_procs(per_host={"gpus": 1})
    ''', clause="names a mesh's processes procs"),
]

# The tenth independent set (input classes) found this one; a clause test now holds it.
MUTANTS += [
    Mutant("Greeter.greet", "tidies the visitor's name (strip) instead of greeting it as given", '''
        self.greetings_given += 1
        return f"Hello, {who.strip()}! I am {self.name} (greeting #{self.greetings_given})."
    ''', clause='exactly as given'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("Greeter.greet", "a missing period", '''
        self.greetings_given += 1
        return f"Hello, {who}! I am {self.name} (greeting #{self.greetings_given})"
    ''', clause="punctuation or spacing differs"),
    Mutant("Greeter.greet", "the names swapped", '''
        self.greetings_given += 1
        return f"Hello, {self.name}! I am {who} (greeting #{self.greetings_given})."
    ''', clause="swapped"),
    Mutant("Greeter.greet", "a counter shared by every Greeter (class level)", '''
        type(self).shared = getattr(type(self), "shared", 0) + 1
        return f"Hello, {who}! I am {self.name} (greeting #{type(self).shared})."
    ''', clause="shared by every greeter"),
]
