"""Chapter 09: plausible wrong answers (see mutants/README.md)."""

from koans.course.manifest import PROJECT_ROOT
from koans.maintain.mutants import Mutant

SAMPLE = '''
    self.learner_version = max(self.learner_version, learner_version)

    def enough() -> bool:
        stale = [g for g in self.groups if self._too_stale(g)]
        self.ledger.dropped_stale += [g.id for g in stale]
        self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
        return len(self.groups) >= count

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
    except asyncio.TimeoutError:
        return None
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
'''

TRAIN = '''
    results, version = [], 0
    try:
        while len(results) < steps:
            batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
            if batch is None:
                continue
            result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
            version = result["version"]
            results.append(result)
            if on_step is not None:
                on_step(result)
    finally:
        stop.set()
    return results
'''

MUTANTS = [
    Mutant("ReplayBuffer.put", "refuses a group whose lag equals max_lag (`>=` where the bound needs `>`)", '''
        if self.learner_version - group.version >= self.max_lag:
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='only a lag greater than max_lag'),
    Mutant("ReplayBuffer.put", "stores the group but wakes nobody", '''
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        return True
    ''', clause='must notify self.arrived'),
    Mutant("ReplayBuffer.put", "refuses a stale group without counting it", '''
        if self._too_stale(group):
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='goes into ledger.refused_stale'),
    Mutant("ReplayBuffer.sample", "hands out the newest groups instead of the oldest",
           SAMPLE.replace("batch, self.groups[:] = self.groups[:count], self.groups[count:]",
                          "batch, self.groups[:] = self.groups[-count:], self.groups[:-count]"), clause='oldest first'),
    Mutant("ReplayBuffer.sample", "hands out the same groups again (never removes them)",
           SAMPLE.replace("batch, self.groups[:] = self.groups[:count], self.groups[count:]",
                          "batch = self.groups[:count]"), clause='handed out once'),
    Mutant("ReplayBuffer.sample", "skips stale groups without dropping or counting them", '''
        self.learner_version = max(self.learner_version, learner_version)

        def fresh() -> list:
            return [g for g in self.groups if not self._too_stale(g)]

        try:
            async with self.arrived:
                await asyncio.wait_for(self.arrived.wait_for(lambda: len(fresh()) >= count), timeout)
        except asyncio.TimeoutError:
            return None
        batch = fresh()[:count]
        self.groups[:] = [g for g in self.groups if g not in batch]
        self.ledger.trained += [g.id for g in batch]
        return batch
    ''', clause='recorded in ledger.dropped_stale'),
    Mutant("ReplayBuffer.sample", "forgets to raise the learner's version",
           SAMPLE.replace("self.learner_version = max(self.learner_version, learner_version)", "pass"), clause='becomes self.learner_version'),
    Mutant("continuous_training", "sets stop after the loop, not in a finally", '''
        results, version = [], 0
        while len(results) < steps:
            batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
            if batch is None:
                continue
            result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
            version = result["version"]
            results.append(result)
            if on_step is not None:
                on_step(result)
        stop.set()
        return results
    ''', clause='in a finally'),
    Mutant("continuous_training", "counts a step that got no batch", TRAIN.replace(
        "            if batch is None:\n                continue\n", "            if batch is None:\n                results.append({\"version\": version})\n                continue\n"), clause='a none sample is not a step'),
    Mutant("continuous_training", "always samples against version 0", TRAIN.replace("call_one(batch_groups, version)",
                                                                                    "call_one(batch_groups, 0)"), clause='the version the last train answered'),
    Mutant("continuous_training", "waits with a blocking .get(): the loops take turns", TRAIN.replace(
        "result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)",
        "result = learner.train.call_one(batch).get(timeout=TIMEOUT)"), clause='blocking .get()'),
    Mutant("ReplayBuffer.put", "counts a refused group as dropped, not refused", '''
        if self._too_stale(group):
            self.ledger.dropped_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='ledger.refused_stale'),
    Mutant("ReplayBuffer.sample", "drops stale groups once before waiting, never again after a wake (a learner's)", '''
        self.learner_version = max(self.learner_version, learner_version)
        stale = [g for g in self.groups if self._too_stale(g)]
        self.ledger.dropped_stale += [g.id for g in stale]
        self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
        try:
            async with self.arrived:
                await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.groups) >= count), timeout)
        except asyncio.TimeoutError:
            return None
        batch, self.groups[:] = self.groups[:count], self.groups[count:]
        self.ledger.trained += [g.id for g in batch]
        return batch
    ''', clause='on every wake'),
    Mutant("ReplayBuffer.sample", "takes the caller's version as it is, so it can go down (a learner's)",
           SAMPLE.replace("self.learner_version = max(self.learner_version, learner_version)",
                          "self.learner_version = learner_version"), clause='keep the larger'),
    Mutant("ReplayBuffer.sample", "waits half a minute, whatever timeout it was given",
           SAMPLE.replace("asyncio.wait_for(self.arrived.wait_for(enough), timeout)",
                          "asyncio.wait_for(self.arrived.wait_for(enough), TIMEOUT / 2)"), clause='timeout its caller passes'),
    Mutant("continuous_training", "counts its own versions instead of using the ones train answers", TRAIN.replace(
        '            version = result["version"]\n', "            version += 1\n"), clause='the version the last train answered'),
    Mutant("ReplayBuffer.put", "wakes one waiter, not all: notify() (a learner's)", '''
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify()
        return True
    ''', clause='wake every waiter'),
    Mutant("ReplayBuffer.sample", "restarts the full timeout at every wake-up (a learner's)", '''
        self.learner_version = max(self.learner_version, learner_version)

        def enough() -> bool:
            stale = [g for g in self.groups if self._too_stale(g)]
            self.ledger.dropped_stale += [g.id for g in stale]
            self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
            return len(self.groups) >= count

        async with self.arrived:
            while not enough():
                try:
                    await asyncio.wait_for(self.arrived.wait(), timeout)
                except TimeoutError:
                    return None
        batch, self.groups[:] = self.groups[:count], self.groups[count:]
        self.ledger.trained += [g.id for g in batch]
        return batch
    ''', clause='counts from the call'),
    Mutant("continuous_training", "awaits learner.train with no timeout (a learner's)", TRAIN.replace(
        "result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)",
        "result = await learner.train.call_one(batch)"), clause='at most TIMEOUT'),
    Mutant("continuous_training", "awaits buffer.sample with no timeout", TRAIN.replace(
        "batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)",
        "batch = await buffer.sample.call_one(batch_groups, version)"), clause='at most TIMEOUT'),
    Mutant("continuous_training", "sets stop in `except Exception`, so a cancellation misses it (a learner's)", '''
        results, version = [], 0
        try:
            while len(results) < steps:
                batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
                if batch is None:
                    continue
                result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
                version = result["version"]
                results.append(result)
                if on_step is not None:
                    on_step(result)
        except Exception:
            stop.set()
            raise
        stop.set()
        return results
    ''', clause='cancellation is not an exception'),
    Mutant("ReplayBuffer.put", "keeps the newest group first (insert at the front)", '''
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.insert(0, group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='goes to the end'),
    # From a third independent set (each one caught by a clause test added for it):
    Mutant('ReplayBuffer.put', "version 0 taken for 'no version': a group from the initial policy is never refused", '''
        if group.version and self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='version 0 is a version like any other'),
    Mutant('ReplayBuffer.put', 'keeps the buffer sorted by policy version, not in arrival order', '''
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        self.groups.sort(key=lambda g: g.version)
        async with self.arrived:
            self.arrived.notify_all()
        return True
    ''', clause='not by version'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('ReplayBuffer.put', "hard-codes a lag bound of 1 instead of self.max_lag; breaks the buffer's max_lag for any other value (0 included)", '''
    if self.learner_version - group.version > 1:
        self.ledger.refused_stale.append(group.id)
        return False
    self.groups.append(group)
    async with self.arrived:
        self.arrived.notify_all()
    return True
''', clause='self.max_lag'),
    Mutant('ReplayBuffer.sample', "judges staleness against the argument only and never stores it, so put keeps accepting groups it should refuse; breaks 'self.learner_version becomes learner_version'", '''
    def fresh(g) -> bool:
        return max(self.learner_version, learner_version) - g.version <= self.max_lag

    def enough() -> bool:
        self.ledger.dropped_stale += [g.id for g in self.groups if not fresh(g)]
        self.groups[:] = [g for g in self.groups if fresh(g)]
        return len(self.groups) >= count

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
    except TimeoutError:
        return None
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
''', clause='becomes self.learner_version'),
    Mutant('ReplayBuffer.sample', "removes stale groups only once the batch is complete; after a timeout they stay in the buffer (and end as unused_at_stop); breaks 'Groups too stale for it are dropped into self.ledger.dropped_stale'", '''
    self.learner_version = max(self.learner_version, learner_version)

    def fresh() -> list:
        return [g for g in self.groups if not self._too_stale(g)]

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(fresh()) >= count), timeout)
    except TimeoutError:
        return None
    self.ledger.dropped_stale += [g.id for g in self.groups if self._too_stale(g)]
    self.groups[:] = fresh()
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
''', clause='whether or not the sample then gets its batch'),
    Mutant('continuous_training', "checks the step count after training (a do-while), so steps=0 still trains once; breaks '`steps` training steps'", '''
    results, version = [], 0
    try:
        while True:
            batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
            if batch is None:
                continue
            result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
            version = result["version"]
            results.append(result)
            if on_step is not None:
                on_step(result)
            if len(results) >= steps:
                break
    finally:
        stop.set()
    return results
''', clause='before each step'),
]


# The ninth independent set (blind learners) wrote these; the contract now states the clause each breaks.
MUTANTS += [
    Mutant("continuous_training", "asks sample again after a timeout, as after None (breaks: a call with no answer by TIMEOUT ends the run)", '''
results, version = [], 0
try:
    while len(results) < steps:
        try:
            batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
        except TimeoutError:
            continue
        if batch is None:
            continue
        result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
        version = result["version"]
        results.append(result)
        if on_step is not None:
            on_step(result)
finally:
    stop.set()
return results
''', clause='ends the run'),
]

# The tenth independent set (input classes) found these; clause tests now hold them.
MUTANTS += [
    Mutant("ReplayBuffer.put", "takes the lag as a distance (abs), refusing a group newer than the learner it knows", '''
        if abs(self.learner_version - group.version) > self.max_lag:
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
''', clause='signed, not a distance'),
    Mutant("ReplayBuffer.sample", "catches a cancel with the timeout and answers None", '''
        self.learner_version = max(self.learner_version, learner_version)

        def enough() -> bool:
            stale = [g for g in self.groups if self._too_stale(g)]
            self.ledger.dropped_stale += [g.id for g in stale]
            self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
            return len(self.groups) >= count

        try:
            async with self.arrived:
                await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
        except (TimeoutError, asyncio.CancelledError):
            return None
        batch, self.groups[:] = self.groups[:count], self.groups[count:]
        self.ledger.trained += [g.id for g in batch]
        return batch
''', clause='a cancel is no timeout'),
]

# The eleventh independent set (language and library pitfalls) found these; each now has a clause test.
MUTANTS += [
    Mutant("ReplayBuffer.sample", "assigns dropped_stale a new list of this wake's drops: the ids dropped before "
           "are lost (breaks: dropped into the ledger, every one)", '''
    self.learner_version = max(self.learner_version, learner_version)

    def enough() -> bool:
        stale = [g for g in self.groups if self._too_stale(g)]
        if stale:
            self.ledger.dropped_stale = [g.id for g in stale]
        self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
        return len(self.groups) >= count

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
    except TimeoutError:
        return None
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
''', clause='add to the list'),
    Mutant("ReplayBuffer.sample", "`timeout or TIMEOUT / 2`: a timeout of 0 becomes 30 s (breaks: the caller's "
           "timeout, 0 too)", '''
    self.learner_version = max(self.learner_version, learner_version)
    timeout = timeout or TIMEOUT / 2

    def enough() -> bool:
        stale = [g for g in self.groups if self._too_stale(g)]
        self.ledger.dropped_stale += [g.id for g in stale]
        self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
        return len(self.groups) >= count

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
    except TimeoutError:
        return None
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
''', clause="a timeout of 0 is the caller's timeout"),
    Mutant("continuous_training", "one wait_for of TIMEOUT around the whole loop: a run longer than TIMEOUT fails "
           "though every call answers in time (breaks: at most TIMEOUT each call)", '''
    results, version = [], 0

    async def run() -> None:
        nonlocal version
        while len(results) < steps:
            batch = await buffer.sample.call_one(batch_groups, version)
            if batch is None:
                continue
            result = await learner.train.call_one(batch)
            version = result["version"]
            results.append(result)
            if on_step is not None:
                on_step(result)

    try:
        await asyncio.wait_for(run(), TIMEOUT)
    finally:
        stop.set()
    return results
''', clause='each call'),
]

# The twelfth independent set (blind learners) found that a timeout of 0 never looked at groups already there:
# asyncio.wait_for(..., 0) gives up before its coroutine starts. The reference was that answer.
MUTANTS += [
    Mutant("ReplayBuffer.sample", "asyncio.wait_for around the condition's wait: with a timeout of 0 it gives up "
           "before looking, so groups already there are not handed out (breaks: handed out at once, whatever the "
           "timeout)", '''
    self.learner_version = max(self.learner_version, learner_version)

    def enough() -> bool:
        stale = [g for g in self.groups if self._too_stale(g)]
        self.ledger.dropped_stale += [g.id for g in stale]
        self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
        return len(self.groups) >= count

    try:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(enough), timeout)
    except TimeoutError:
        return None
    batch, self.groups[:] = self.groups[:count], self.groups[count:]
    self.ledger.trained += [g.id for g in batch]
    return batch
''', clause='handed out at once'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_PUT = '''
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
'''
STUDY_SAMPLE = (PROJECT_ROOT / "solutions" / "ch09_async_loops.py").read_text().split("        self.learner_version = max(self.learner_version, learner_version)\n", 1)[1].split("        # <<< TODO")[0]
STUDY_SAMPLE = "        self.learner_version = max(self.learner_version, learner_version)\n" + STUDY_SAMPLE
MUTANTS += [
    Mutant("ReplayBuffer.put", "answers True for a refused group",
           STUDY_PUT.replace("            return False", "            return True"), clause="answers false | put answers false | false"),
    Mutant("ReplayBuffer.sample", "forgets ledger.trained",
           STUDY_SAMPLE.replace("        self.ledger.trained += [g.id for g in batch]\n", ""), clause="ledger.trained"),
]
