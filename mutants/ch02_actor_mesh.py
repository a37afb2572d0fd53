"""Chapter 02: plausible wrong answers (see mutants/README.md).

Deleted as harmless here: a tally kept on the class (`Worker.tally += amount`).
With one Worker per process, as in every mesh of this chapter, it behaves
exactly like the per-instance tally.
"""

from koans.maintain.mutants import Mutant

MUTANTS = [
    Mutant("Worker.whoami", "reports the message's view as the spawn place", '''
        return {
            "spawn_coords": dict(current_rank()),
            "message_coords": dict(current_rank()),
            "message_size": current_size(),
            "pid": os.getpid(),
        }
    ''', clause='where the actors were spawned'),
    Mutant("Worker.whoami", "reports the spawn place as the message's view", '''
        return {
            "spawn_coords": self.spawn_coords,
            "message_coords": self.spawn_coords,
            "message_size": current_size(),
            "pid": os.getpid(),
        }
    ''', clause="message's view"),
    Mutant("Worker.add", "answers the amount, not the tally", '''
        self.tally += amount
        return amount
    ''', clause='answers that tally'),
    Mutant("Worker.add", "sets the tally instead of adding to it", '''
        self.tally = amount
        return self.tally
    ''', clause='never replaces it'),
    Mutant("Worker.sum_my_share", "splits by the actor's spawn place and the whole mesh's size", '''
        rank, size = self.spawn_coords["procs"], 4
        return sum(x * x for x in numbers[rank::size])
    ''', clause="message's rank"),
    Mutant("Worker.sum_my_share", "off by one: starts at rank + 1", '''
        rank = current_rank().rank
        size = 1
        for extent in current_size().values():
            size *= extent
        return sum(x * x for x in numbers[rank + 1::size])
    ''', clause='started at the wrong place'),
    Mutant("Worker.sum_my_share", "takes the number of mesh dimensions as the size", '''
        rank, size = current_rank().rank, len(current_size())
        return sum(x * x for x in numbers[rank::size])
    ''', clause='took the size as'),
    Mutant("sum_of_squares", "asks one worker, chosen by Monarch, to do all the work", '''
        return workers.sum_my_share.choose(numbers).get(timeout=timeout)
    ''', clause='call every worker'),
    Mutant("sum_of_squares", "keeps only the first worker's share", '''
        partial_sums = workers.sum_my_share.call(numbers).get(timeout=timeout)
        return next(iter(partial_sums.values()))
    ''', clause='add every value'),
    Mutant("Worker.whoami", "reports the message's size as one number", '''
        return {
            "spawn_coords": self.spawn_coords,
            "message_coords": dict(current_rank()),
            "message_size": math.prod(current_size().values()),
            "pid": os.getpid(),
        }
    ''', clause='naming every dimension'),
    Mutant("Worker.add", "answers the tally from before the add", '''
        before = self.tally
        self.tally += amount
        return before
    ''', clause='answer the new tally'),
    Mutant("sum_of_squares", "waits with no timeout (a learner's)", '''
        return sum(workers.sum_my_share.call(numbers).get().values())
    ''', clause="caller's timeout"),
    Mutant("sum_of_squares", "waits a fixed minute, whatever timeout it was given", '''
        return sum(workers.sum_my_share.call(numbers).get(timeout=60).values())
    ''', clause="caller's timeout"),
    Mutant("Worker.sum_my_share", "reads the size and rank from the 'procs' dimension alone (a learner's)", '''
        rank, size = current_rank()["procs"], current_size()["procs"]
        return sum(x * x for x in numbers[rank::size])
    ''', clause='one actor picked by index'),
    Mutant("Worker.sum_my_share", "adds the dimensions' sizes instead of multiplying them (a learner's)", '''
        rank, size = current_rank().rank, sum(current_size().values())
        return sum(x * x for x in numbers[rank::size])
    ''', clause='product of no sizes'),
    Mutant("Worker.whoami", "reports the message's size along 'procs' alone", '''
        return {
            "spawn_coords": self.spawn_coords,
            "message_coords": dict(current_rank()),
            "message_size": {"procs": math.prod(current_size().values())},
            "pid": os.getpid(),
        }
    ''', clause='every dimension'),
    # From a third independent set (each one caught by a clause test added for it):
    Mutant('sum_of_squares', 'retries once after a timeout: a hung worker holds the caller twice as long', '''
        try:
            partial_sums = workers.sum_my_share.call(numbers).get(timeout=timeout)
        except Exception:
            partial_sums = workers.sum_my_share.call(numbers).get(timeout=timeout)
        return sum(partial_sums.values())
    ''', clause='a second try'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Worker.whoami', "message_size drops dimensions of size 1: breaks 'message_size ... the message's mesh size' for {'procs': 1} and 2-D meshes with a size-1 dim", '''
return {
    "spawn_coords": self.spawn_coords,
    "message_coords": dict(current_rank()),
    "message_size": {k: v for k, v in current_size().items() if v > 1},
    "pid": os.getpid(),
}
''', clause='a dimension of size 1 is still a dimension'),
    Mutant('Worker.add', "clamps the tally at zero: breaks 'Add amount' for negative amounts", '''
self.tally = max(0, self.tally + amount)
return self.tally
''', clause='may be negative'),
    Mutant('sum_of_squares', "adds with math.fsum: answers a float, inexact beyond 2**53; breaks '-> int'", '''
partial_sums = workers.sum_my_share.call(numbers).get(timeout=timeout)
return math.fsum(partial_sums.values())
''', clause='an int, exact'),
]

# The eleventh independent set (language and library pitfalls) found these; each now has a clause test.
MUTANTS += [
    Mutant("Worker.whoami", "falls back with `or` when the message's coordinates are empty: one actor picked by "
           "index reports its spawn coordinates (breaks: the message's view as it is, {} there)", '''
    return {
        "spawn_coords": self.spawn_coords,
        "message_coords": dict(current_rank()) or dict(self.spawn_coords),
        "message_size": current_size() or {"procs": 1},
        "pid": os.getpid(),
    }
''', clause='even when empty'),
    Mutant("Worker.sum_my_share", "multiplies the sizes with functools.reduce and no start value: one actor picked "
           "by index (no dimension) raises (breaks: the product of no sizes is 1)", '''
    import functools
    import operator
    rank = current_rank().rank
    size = functools.reduce(operator.mul, current_size().values())
    return sum(x * x for x in numbers[rank::size])
''', clause='product of no sizes is 1'),
    Mutant("sum_of_squares", "collects the replies by point['procs']: on a mesh of other dimensions it raises, "
           "and on two dimensions replies collide (breaks: every worker's value, any dimensions)", '''
    replies = workers.sum_my_share.call(numbers).get(timeout=timeout)
    by_proc = {point["procs"]: value for point, value in replies.items()}
    return sum(by_proc.values())
''', clause='any dimensions'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("Worker.add", "a module-level tally", '''
        global TALLY
        TALLY = globals().get("TALLY", 0) + amount
        return TALLY
    ''', clause="own tally | its own | this actor"),
]
