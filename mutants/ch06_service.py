"""Chapter 06: plausible wrong answers (see mutants/README.md)."""

from koans.maintain.mutants import Mutant

ROUTE = '''
    for number in range(self.attempts):
        replica = self._pick(session, tried)
        if replica is None:
            break
        if number > 0:
            self.stats.retries += 1
        call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
        outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
        if outcome.ok:
            self._served(replica, session)
            return outcome.value
        if outcome.kind == "endpoint_error":
            raise outcome.value
        self.mark_unhealthy(replica, outcome.kind)
        attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
        tried.add(replica.index)
    self.stats.failed += 1
    raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
'''

MUTANTS = [
    Mutant("Service.next_replica", "off by one: leaves the cursor on the replica it returns", '''
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self.cursor + step) % count]
            if replica.healthy and replica.index not in exclude:
                self.cursor = replica.index % count
                return replica
        return None
    ''', clause='move it just past the replica returned'),
    Mutant("Service.next_replica", "starts from replica 0 every time", '''
        for replica in self.replicas:
            if replica.healthy and replica.index not in exclude:
                self.cursor = (replica.index + 1) % len(self.replicas)
                return replica
        return None
    ''', clause='start at self.cursor'),
    Mutant("Service.next_replica", "ignores `exclude`", '''
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self.cursor + step) % count]
            if replica.healthy:
                self.cursor = (replica.index + 1) % count
                return replica
        return None
    ''', clause='excluded'),
    Mutant("Service.mark_unhealthy", "counts a death once per report", '''
        if self.replicas[replica.index] is replica:
            replica.healthy = False
            replica.failures += 1
            self.stats.replica_failures += 1
            if self.auto_recover:
                self.start_recovery(replica)
    ''', clause='at the first report only'),
    Mutant("Service.mark_unhealthy", "marks whatever replica now holds that index", '''
        current = self.replicas[replica.index]
        if current.healthy:
            current.healthy = False
            current.failures += 1
            self.stats.replica_failures += 1
            if self.auto_recover:
                self.start_recovery(current)
    ''', clause='the report changes nothing'),
    Mutant("Service.mark_unhealthy", "recovers even when auto_recover is off", '''
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            replica.failures += 1
            self.stats.replica_failures += 1
            self.start_recovery(replica)
    ''', clause='only if self.auto_recover'),
    Mutant("Service.route", "retries an endpoint error on another replica",
           ROUTE.replace('''        if outcome.kind == "endpoint_error":
            raise outcome.value
''', ''), clause='unretried'),
    Mutant("Service.route", "counts the first try as a retry",
           ROUTE.replace("        if number > 0:\n            self.stats.retries += 1\n", "        self.stats.retries += 1\n"), clause='retries count only tries after the first'),
    Mutant("Service.route", "one try more than `attempts` allows",
           ROUTE.replace("for number in range(self.attempts):", "for number in range(self.attempts + 1):"), clause='allows 2 tries in all'),
    Mutant("Service.route", "forgets to count a request that failed",
           ROUTE.replace("    self.stats.failed += 1\n", ""), clause='stats.failed counts'),
    Mutant("Service.route", "gives up after the first failure",
           ROUTE.replace("        tried.add(replica.index)\n", "        tried.add(replica.index)\n        break\n"), clause='goes on to a replica not tried yet'),
    Mutant("Service.next_replica", "moves the cursor one step on from where it was, not past the pick", '''
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self.cursor + step) % count]
            if replica.healthy and replica.index not in exclude:
                self.cursor = (self.cursor + 1) % count
                return replica
        return None
    ''', clause='just past the replica picked'),
    Mutant("Service.mark_unhealthy", "counts the death on the service but not on the replica", '''
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            self.stats.replica_failures += 1
            if self.auto_recover:
                self.start_recovery(replica)
    ''', clause='one more on each'),
    Mutant("Service.route", "counts the retry before checking that a replica is left (a learner's)", ROUTE.replace(
        "        replica = self._pick(session, tried)\n        if replica is None:\n            break\n"
        "        if number > 0:\n            self.stats.retries += 1\n",
        "        if number > 0:\n            self.stats.retries += 1\n"
        "        replica = self._pick(session, tried)\n        if replica is None:\n            break\n"), clause='no third try to count'),
    Mutant("Service.route", "forgets to add a failed replica to `tried` (a learner's)",
           ROUTE.replace("        tried.add(replica.index)\n", ""), clause='not tried again'),
    Mutant("Service.route", "waits the module's TIMEOUT, not the service's call_timeout",
           ROUTE.replace("await classify(call, self.call_timeout,", "await classify(call, TIMEOUT,"), clause='self.call_timeout'),
    Mutant("Service.route", "retries a death without marking the replica unhealthy",
           ROUTE.replace("        self.mark_unhealthy(replica, outcome.kind)\n", ""), clause='mark_unhealthy'),
    Mutant("Service.mark_unhealthy", "sets the replica's failures to 1 instead of adding one (a learner's)", '''
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            replica.failures = 1
            self.stats.replica_failures += 1
            if self.auto_recover:
                self.start_recovery(replica)
    ''', clause='it does not set it'),
    Mutant("Service.route", "marks whatever replica now holds the index, not the one called (a learner's)",
           ROUTE.replace("        self.mark_unhealthy(replica, outcome.kind)\n",
                         "        self.mark_unhealthy(self.replicas[replica.index], outcome.kind)\n"), clause='report the replica you called'),
    Mutant("Service.route", "records the exception's text as the detail, not the outcome's summary",
           ROUTE.replace("outcome.summary)", "str(outcome.value))"), clause='summary'),
    Mutant("Service.route", "tells ServiceUnavailable how many replicas there are, not how many are healthy",
           ROUTE.replace("self.healthy_count())", "len(self.replicas))"), clause='self.healthy_count()'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('Service.route', "Attempt records the try's number, not the replica's index", '''
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                self.stats.retries += 1
            call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
            outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(number, outcome.kind, outcome.summary))
            tried.add(replica.index)
        self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
    ''', clause='index of the replica called'),
    Mutant('Service.route', 'keyword arguments not passed on to the endpoint', '''
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                self.stats.retries += 1
            call = getattr(replica.actor, endpoint_name).call_one(*args)
            outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
            tried.add(replica.index)
        self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
    ''', clause='keyword arguments'),
    # From a third independent set (each one caught by a clause test added for it):
    Mutant('Service.next_replica', 'resets the cursor to 0 when no replica is found', '''
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self.cursor + step) % count]
            if replica.healthy and replica.index not in exclude:
                self.cursor = (replica.index + 1) % count
                return replica
        self.cursor = 0
        return None
    ''', clause='moves only past a replica returned'),
    Mutant('Service.route', 'a cancelled caller marks the replica it was waiting on unhealthy', '''
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                self.stats.retries += 1

            call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
            try:
                outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
            except asyncio.CancelledError:
                self.mark_unhealthy(replica, "cancelled")
                raise
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
            tried.add(replica.index)
        self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
    ''', clause="a cancel is the caller's own"),
]


# Caught since the fourth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Service.mark_unhealthy', "a report judged by the replica's health alone: one swapped out while healthy is still counted", '''
if replica.healthy:
    replica.healthy = False
    replica.failures += 1
    self.stats.replica_failures += 1
    if self.auto_recover:
        self.start_recovery(replica)
''', clause='no longer in self.replicas'),
]


# Caught since the eighth independent set (one mutant per contract clause, written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Service.mark_unhealthy', "'Take `replica` out of rotation' broken: with auto_recover the replica is left healthy (its replacement is on the way); differs with auto_recover=True: requests keep going to the dead replica until it is replaced", '''
    if self.replicas[replica.index] is replica and replica.healthy and replica.index not in self.recovering:
        replica.failures += 1
        self.stats.replica_failures += 1
        if self.auto_recover:
            self.start_recovery(replica)
        else:
            replica.healthy = False
''', clause='leaves rotation at once'),
]

# The tenth independent set (input classes) found this one; a clause test now holds it.
MUTANTS += [
    Mutant("Service.route", "counts the healthy replicas as those this request did not try", '''
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                self.stats.retries += 1
            call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
            outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
            tried.add(replica.index)
        self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, len(self.replicas) - len(tried))
''', clause='self.healthy_count() when it is raised'),
]

# The eleventh independent set (language and library pitfalls) found these; each now has a clause test.
MUTANTS += [
    Mutant("Service.next_replica", "walks an itertools.cycle made once over self.replicas: the cursor is ignored, "
           "and a replacement put at an index is never seen (breaks: at or after self.cursor, in self.replicas)", '''
    import itertools
    if getattr(self, "_ring", None) is None:
        self._ring = itertools.cycle(self.replicas)
    for _ in range(len(self.replicas)):
        replica = next(self._ring)
        if replica.healthy and replica.index not in exclude:
            self.cursor = (replica.index + 1) % len(self.replicas)
            return replica
    return None
''', clause='start at self.cursor'),
    Mutant("Service.route", "tests the reply's truth: a reply of None, 0 or {} counts as a failure (breaks: "
           "return the first reply, whatever it holds)", '''
    for number in range(self.attempts):
        replica = self._pick(session, tried)
        if replica is None:
            break
        if number > 0:
            self.stats.retries += 1
        call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
        outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
        reply = outcome.value if outcome.ok else None
        if reply:
            self._served(replica, session)
            return reply
        if outcome.kind == "endpoint_error":
            raise outcome.value
        self.mark_unhealthy(replica, outcome.kind)
        attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
        tried.add(replica.index)
    self.stats.failed += 1
    raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
''', clause='a reply is a reply'),
    # From a mechanical set (one operator at one site of the solution; each caught by a test extended for it):
    Mutant("Service.mark_unhealthy", "sets the service's failure count to 1 instead of adding one", '''
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            replica.failures += 1
            self.stats.replica_failures = 1
            if self.auto_recover:
                self.start_recovery(replica)
    ''', clause='not set to 1'),
    Mutant("Service.route", "sets stats.retries to 1 at each retry instead of adding one",
           ROUTE.replace("self.stats.retries += 1", "self.stats.retries = 1"), clause='not set to 1'),
    Mutant("Service.route", "waits for each call with a blocking .get() inside the async route (a learner's)",
           ROUTE.replace('''        outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
''', '''        try:
            reply = call.get(timeout=self.call_timeout)
        except TimeoutError:
            reply = None
        outcome = await classify(_answered(reply), self.call_timeout, where=f"replica {replica.index}")
''').replace("    for number in range(self.attempts):", '''    async def _answered(value):
        return value

    for number in range(self.attempts):''', 1), clause="blocking .get()"),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_ROUTE = ROUTE
MUTANTS += [
    Mutant("Service.mark_unhealthy", "a mark_unhealthy that never starts the recovery", '''
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            replica.failures += 1
            self.stats.replica_failures += 1
    ''', clause="start_recovery | starts no recovery | recovery"),
    Mutant("Service.route", "a route that never appends the Attempt",
           STUDY_ROUTE.replace("        attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))\n", ""),
           clause="attempt"),
    Mutant("Service.route", "a blocking .get() in route",
           STUDY_ROUTE.replace('        outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")\n',
                         '        outcome = await classify(_now(call.get(timeout=self.call_timeout)), self.call_timeout, where="r")\n')
                .replace("    for number in range(self.attempts):", "    async def _now(v):\n        return v\n\n    for number in range(self.attempts):", 1),
           clause="blocking .get()"),
]
