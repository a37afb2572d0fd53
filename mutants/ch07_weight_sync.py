"""Chapter 07: plausible wrong answers (see mutants/README.md)."""

from koans.maintain.mutants import Mutant

CLAIM = '''
    now = time.monotonic()
    for lease, (_, since) in list(self.leases.items()):
        if now - since > self.lease_timeout_s:
            del self.leases[lease]
            self.counts["expired_leases"] += 1
    busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
    if self.latest is not None:
        busy.add(self.latest[1])
    for slot in range(len(self.offers)):
        if slot not in busy:
            self.writing.add(slot)
            return slot
    self.counts["skipped_claims"] += 1
    return None
'''

PULL = '''
    for _ in range(self.attempts):
        snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
        if snapshot is None:
            return None
        try:
            await self.load(snapshot, halfway)
        finally:
            held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
        if held:
            self.version = snapshot.version
            return snapshot.version
        self.lost_leases += 1
    raise RuntimeError("the lease kept expiring")
'''

MUTANTS = [
    Mutant("WeightStore.claim", "may hand out the latest version's slot",
           CLAIM.replace("    if self.latest is not None:\n        busy.add(self.latest[1])\n", ""), clause="latest version's slot"),
    Mutant("WeightStore.claim", "ignores the leases", CLAIM.replace(" | {slot for slot, _ in self.leases.values()}", ""), clause='under a lease'),
    Mutant("WeightStore.claim", "never drops an expired lease",
           CLAIM.replace("        if now - since > self.lease_timeout_s:\n", "        if False:\n"), clause='drops them'),
    Mutant("WeightStore.claim", "does not mark the slot as being written",
           CLAIM.replace("            self.writing.add(slot)\n", ""), clause='being written'),
    Mutant("WeightPublisher.publish", "waits for a free slot instead of skipping", '''
        slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        while slot is None:
            await asyncio.sleep(0.01)
            slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        self.staging.start(state_dict, slot, version)
        self.version = version
        return version
    ''', clause='skip at once'),
    Mutant("WeightPublisher.publish", "forgets to remember the version it published", '''
        slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        if slot is None:
            self.skipped += 1
            return None
        self.staging.start(state_dict, slot, version)
        return version
    ''', clause='record each version published'),
    Mutant("WeightPublisher.publish", "answers the version even when it skipped", '''
        slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        if slot is None:
            self.skipped += 1
            return version
        self.staging.start(state_dict, slot, version)
        self.version = version
        return version
    ''', clause='must skip'),
    Mutant("SnapshotReader.pull_and_load", "gives the lease back only when the load succeeded", '''
        snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
        if snapshot is None:
            return None
        await self.load(snapshot, halfway)
        await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
        self.version = snapshot.version
        return snapshot.version
    ''', clause='load again'),
    Mutant("SnapshotReader.pull_and_load", "ignores a lost lease and keeps what it loaded", '''
        snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
        if snapshot is None:
            return None
        try:
            await self.load(snapshot, halfway)
        finally:
            await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
        self.version = snapshot.version
        return snapshot.version
    ''', clause='load again'),
    Mutant("SnapshotReader.pull_and_load", "asks for anything newer than version 0, every time",
           PULL.replace("acquire.call_one(self.version)", "acquire.call_one(0)"), clause='newer than self.version'),
    Mutant("SnapshotReader.pull_and_load", "gives the lease back before loading", '''
        snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
        if snapshot is None:
            return None
        await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
        await self.load(snapshot, halfway)
        self.version = snapshot.version
        return snapshot.version
    ''', clause='only after the load'),
    Mutant("WeightStore.claim", "works out the busy slots before dropping expired leases (a learner's)", '''
        now = time.monotonic()
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for lease, (_, since) in list(self.leases.items()):
            if now - since > self.lease_timeout_s:
                del self.leases[lease]
                self.counts["expired_leases"] += 1
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
    ''', clause='drop them first'),
    Mutant("WeightStore.claim", "does not count a skipped claim", CLAIM.replace('    self.counts["skipped_claims"] += 1\n', ""), clause='skipped claim'),
    Mutant("WeightStore.claim", "drops an expired lease without counting it",
           CLAIM.replace('            self.counts["expired_leases"] += 1\n', ""), clause='counts once'),
    Mutant("WeightPublisher.publish", "asks the store with no timeout (a learner's)", '''
        slot = await self.store.claim.call_one()
        if slot is None:
            self.skipped += 1
            return None
        self.staging.start(state_dict, slot, version)
        self.version = version
        return version
    ''', clause='wait at most self.timeout'),
    Mutant("WeightPublisher.publish", "waits for the copy to be done before answering", '''
        slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        if slot is None:
            self.skipped += 1
            return None
        self.staging.start(state_dict, slot, version)
        await self.staging.finish()
        self.version = version
        return version
    ''', clause='do not wait for the copy'),
    Mutant("SnapshotReader.pull_and_load", "asks the store with no timeout",
           PULL.replace("await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)",
                        "await self.store.acquire.call_one(self.version)"), clause='wait at most self.timeout'),
    Mutant("SnapshotReader.pull_and_load", "gives the lease back without waiting for the answer", PULL.replace(
        "            held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)\n",
        "            held = self.store.release.call_one(snapshot.lease)\n"), clause="await release's answer"),
    Mutant("SnapshotReader.pull_and_load", "keeps loading for as long as leases expire",
           PULL.replace("    for _ in range(self.attempts):", "    while True:"), clause='stop after self.attempts'),
    Mutant("WeightPublisher.publish", "waits for the claim with a blocking .get() inside async code (a learner's)", '''
        slot = self.store.claim.call_one().get(timeout=self.timeout)
        if slot is None:
            self.skipped += 1
            return None
        self.staging.start(state_dict, slot, version)
        self.version = version
        return version
    ''', clause='blocking .get()'),
    Mutant("SnapshotReader.pull_and_load", "gives the lease back with no timeout (a learner's)", PULL.replace(
        "            held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)\n",
        "            held = await self.store.release.call_one(snapshot.lease)\n"), clause='waits at most self.timeout'),
    Mutant("SnapshotReader.pull_and_load", "passes `halfway` to the first load only (a learner's)", '''
        for attempt in range(self.attempts):
            snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
            if snapshot is None:
                return None
            try:
                await self.load(snapshot, halfway if attempt == 0 else None)
            finally:
                held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
            if held:
                self.version = snapshot.version
                return snapshot.version
            self.lost_leases += 1
        raise RuntimeError("the lease kept expiring")
    ''', clause='pass halfway to every load'),
    Mutant("SnapshotReader.pull_and_load", "waits for acquire with a blocking .get() inside async code", PULL.replace(
        "await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)",
        "self.store.acquire.call_one(self.version).get(timeout=self.timeout)"), clause='blocking .get()'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('WeightStore.claim', 'counts one expiry per claim however many leases expired at once', '''
        now = time.monotonic()
        expired = [lease for lease, (_, since) in self.leases.items() if now - since > self.lease_timeout_s]
        for lease in expired:
            del self.leases[lease]
        if expired:
            self.counts["expired_leases"] += 1
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
    ''', clause='each one dropped counts once'),
    Mutant('WeightPublisher.publish', 'a skip starts its own background retry (retry_until_free) instead of just answering None', '''
        slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
        if slot is None:
            self.skipped += 1
            if not self._keep_retrying:
                self.retry_until_free(state_dict, version)
            return None
        self.staging.start(state_dict, slot, version)
        self.version = version
        return version
    ''', clause='starts nothing'),
    Mutant('SnapshotReader.pull_and_load', 'after a lost lease asks only for something newer than the torn version: answers None', '''
        newer_than = self.version
        for _ in range(self.attempts):
            snapshot = await asyncio.wait_for(self.store.acquire.call_one(newer_than), self.timeout)
            if snapshot is None:
                return None
            try:
                await self.load(snapshot, halfway)
            finally:
                held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
            if held:
                self.version = snapshot.version
                return snapshot.version
            self.lost_leases += 1
            newer_than = snapshot.version
        raise RuntimeError(f"the lease expired during each of {self.attempts} loads: our weights may be torn. "
                           "Raise the store's lease_timeout_s above the time a load takes.")
    ''', clause='anything newer than self.version'),
    Mutant('SnapshotReader.pull_and_load', 'bounds the reloads by the lifetime lost_leases counter, not per call', '''
        while True:
            snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
            if snapshot is None:
                return None
            try:
                await self.load(snapshot, halfway)
            finally:
                held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
            if held:
                self.version = snapshot.version
                return snapshot.version
            self.lost_leases += 1
            if self.lost_leases >= self.attempts:
                raise RuntimeError(f"the lease expired during {self.lost_leases} loads")
    ''', clause='lifetime count, not the bound'),
]


# Caught since the fourth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('SnapshotReader.pull_and_load', "3 loads hard-coded: the reader's own attempts ignored", '''
for _ in range(3):
    snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
    if snapshot is None:
        return None
    try:
        await self.load(snapshot, halfway)
    finally:
        held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
    if held:
        self.version = snapshot.version
        return snapshot.version
    self.lost_leases += 1
raise RuntimeError("the lease expired during each of 3 loads")
''', clause='stop after self.attempts'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('WeightStore.claim', "drops expired leases only when no slot is free otherwise: with a free slot an expired lease stays in self.leases, uncounted, and its reader's release still answers True (breaks 'a lease older than lease_timeout_s is lost: drop it from self.leases and count it')", '''
        def free_slots():
            busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
            if self.latest is not None:
                busy.add(self.latest[1])
            return [slot for slot in range(len(self.offers)) if slot not in busy]

        free = free_slots()
        if not free:
            now = time.monotonic()
            for lease, (_, since) in list(self.leases.items()):
                if now - since > self.lease_timeout_s:
                    del self.leases[lease]
                    self.counts["expired_leases"] += 1
            free = free_slots()
        if free:
            self.writing.add(free[0])
            return free[0]
        self.counts["skipped_claims"] += 1
        return None
''', clause='every claim drops the leases'),
    Mutant('WeightStore.claim', "assigns the number of leases that expired in this claim to counts['expired_leases'] instead of adding it: expiries noticed by two different claims count 1, not 2 (breaks 'count it in counts['expired_leases']', a running count)", '''
        now = time.monotonic()
        expired = [lease for lease, (_, since) in self.leases.items() if now - since > self.lease_timeout_s]
        for lease in expired:
            del self.leases[lease]
        if expired:
            self.counts["expired_leases"] = len(expired)
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
''', clause='the count runs on'),
    Mutant('SnapshotReader.pull_and_load', "gives the lease back in `except Exception` instead of `finally`: a pull cancelled in the middle of its load (CancelledError) keeps its lease, blocking the slot (breaks 'give the lease back whatever happens')", '''
        for _ in range(self.attempts):
            snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
            if snapshot is None:
                return None
            try:
                await self.load(snapshot, halfway)
            except Exception:
                await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
                raise
            held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
            if held:
                self.version = snapshot.version
                return snapshot.version
            self.lost_leases += 1
        raise RuntimeError(f"the lease expired during each of {self.attempts} loads: our weights may be torn. "
                           "Raise the store's lease_timeout_s above the time a load takes.")
''', clause='whatever happens'),
]


# The ninth independent set (blind learners) wrote these; the contract now states the clause each breaks.
MUTANTS += [
    Mutant("WeightPublisher.publish", "takes a claim that times out for a skip (breaks: no answer in time is an error, not a skip)", '''
try:
    slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
except TimeoutError:
    slot = None
if slot is None:
    self.skipped += 1
    return None
self.staging.start(state_dict, slot, version)
self.version = version
return version
''', clause='no answer in time is an error'),
]

# The tenth independent set (input classes) found this one; a clause test now holds it.
MUTANTS += [
    Mutant("WeightStore.claim", "drops every lease on a slot that has one expired lease, live ones too", '''
        now = time.monotonic()
        stale_slots = set()
        for lease, (slot, since) in list(self.leases.items()):
            if now - since > self.lease_timeout_s:
                stale_slots.add(slot)
                self.counts["expired_leases"] += 1
        self.leases = {lease: held for lease, held in self.leases.items() if held[0] not in stale_slots}
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
''', clause='dropped on its own'),
]
MUTANTS += [
    Mutant("WeightStore.claim", "drops a lease exactly lease_timeout_s old ('older than' taken as >=)", '''
        now = time.monotonic()
        for lease, (_, since) in list(self.leases.items()):
            if now - since >= self.lease_timeout_s:
                del self.leases[lease]
                self.counts["expired_leases"] += 1
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
''', clause='not older than it'),
]

# The eleventh independent set (language and library pitfalls) found this one; it now has a clause test.
MUTANTS += [
    Mutant("WeightPublisher.publish", "hands staging.start to an executor: the copy may start after publish "
           "answers, even after wait_staged() (breaks: publish calls start itself, before it answers)", '''
    slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
    if slot is None:
        self.skipped += 1
        return None
    # the copy is big: keep it off the event loop
    asyncio.get_running_loop().run_in_executor(None, self.staging.start, state_dict, slot, version)
    self.version = version
    return version
''', clause='before answering'),
    # From a mechanical set (one operator at one site of the solution; each caught by a test extended for it):
    Mutant("WeightStore.claim", "sets counts['skipped_claims'] to 1 instead of adding one",
           CLAIM.replace('self.counts["skipped_claims"] += 1', 'self.counts["skipped_claims"] = 1'), clause='adds one skipped claim'),
    Mutant("WeightPublisher.publish", "sets self.skipped to 1 instead of adding one", '''
    slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)
    if slot is None:
        self.skipped = 1
        return None
    self.staging.start(state_dict, slot, version)
    self.version = version
    return version
    ''', clause='adds one to self.skipped'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_CLAIM = '''
        now = time.monotonic()
        for lease, (_, since) in list(self.leases.items()):
            if now - since > self.lease_timeout_s:
                del self.leases[lease]
                self.counts["expired_leases"] += 1
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None
'''
MUTANTS += [
    Mutant("WeightStore.claim", "time.time() against leases stamped with time.monotonic()",
           STUDY_CLAIM.replace("now = time.monotonic()", "now = time.time()"), clause="clock | monotonic"),
    Mutant("WeightStore.claim", "a hard-coded slot count", STUDY_CLAIM.replace("range(len(self.offers))", "range(2)"),
           clause="len(self.offers)"),
    Mutant("SnapshotReader.pull_and_load", "gives up silently (None) after its attempts instead of raising", '''
        for _ in range(self.attempts):
            snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout)
            if snapshot is None:
                return None
            try:
                await self.load(snapshot, halfway)
            finally:
                held = await asyncio.wait_for(self.store.release.call_one(snapshot.lease), self.timeout)
            if held:
                self.version = snapshot.version
                return snapshot.version
            self.lost_leases += 1
        return None
    ''', clause="runtimeerror | raise"),
]
