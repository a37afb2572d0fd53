"""Chapter 12: plausible wrong answers (see mutants/README.md).

The classic bugs of multi-turn RL infrastructure: the environment's tokens left in the loss, a
transcript re-encoded from its text (so the trained tokens are not the sampled ones), a turn
separator dropped, round robin where least-loaded was asked, the lag taken from the newest
token, a tool called directly (no retry on another worker), an episode that never ends.
"""

from koans.course.manifest import PROJECT_ROOT
from koans.maintain.mutants import Mutant

APPEND = '''
    policy = logprobs is not None
    if policy and len(logprobs) != len(ids):
        raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
    self.ids += ids
    self.mask += [1.0 if policy else 0.0] * len(ids)
    self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
    self.versions += [version if policy else -1] * len(ids)
'''

LOOP = '''
    for _ in range(limits.max_turns):
        room = limits.max_tokens - len(episode.ids)
        if room <= 0:
            episode.ended = "tokens"
            return episode
        turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
        episode.append_turn(turn.ids, turn.logprobs, turn.version)
        kind, request = task.parse(task.decode(turn.ids))
        if kind != "call":
            episode.ended = "answer"
            return episode
        reply = await tools.route("call", prompt.table, request)
        episode.append_turn(task.reply_ids(reply))
    episode.ended = "turns"
    return episode
'''

PICK = '''
    count = len(self.replicas)
    in_order = [self.replicas[(self.cursor + step) % count] for step in range(count)]
    candidates = [r for r in in_order if r.healthy and r.index not in exclude]
    if not candidates:
        return None
    best = min(candidates, key=lambda replica: replica.in_flight)
    self.cursor = (best.index + 1) % count
    return best
'''

MUTANTS = [
    Mutant("Episode.append_turn", "leaves the environment's tokens in the loss (mask 1 on every token)",
           APPEND.replace("[1.0 if policy else 0.0] * len(ids)", "[1.0] * len(ids)"), clause='mask 0'),
    Mutant("Episode.append_turn", "one mask entry per turn instead of per token", APPEND.replace(
        "self.mask += [1.0 if policy else 0.0] * len(ids)", "self.mask.append(1.0 if policy else 0.0)"), clause='one entry per token'),
    Mutant("Episode.append_turn", "gives the tool's tokens the version of the last policy turn", APPEND.replace(
        "self.versions += [version if policy else -1] * len(ids)",
        "self.versions += [version if policy else (self.versions[-1] if self.versions else -1)] * len(ids)"), clause='-1 elsewhere'),
    Mutant("Episode.version", "takes the lag from the newest token, not the oldest",
           "return max(v for v, owner in zip(self.versions, self.mask) if owner)", clause='oldest policy token'),
    Mutant("Episode.version", "counts the environment's tokens (version -1) too", "return min(self.versions)", clause="environment's tokens have no version"),
    Mutant("Episode.version", "the version of the first token, whoever wrote it", "return self.versions[0]", clause='a tool reply before the first policy turn changes nothing'),
    Mutant("run_episode", "keeps the transcript as text and encodes it again each turn", '''
        transcript = ""
        for _ in range(limits.max_turns):
            room = limits.max_tokens - len(episode.ids)
            if room <= 0:
                episode.ended = "tokens"
                return episode
            ids = task.tokenizer(task.decode(episode.prompt_ids) + transcript, add_special_tokens=False)["input_ids"]
            turn = await policy.route("generate_turn", ids, min(limits.max_new, room))
            text = task.decode(turn.ids)
            transcript += text
            kind, request = task.parse(text)
            if kind != "call":
                episode.append_turn(turn.ids, turn.logprobs, turn.version)
                episode.ended = "answer"
                return episode
            reply = await tools.route("call", prompt.table, request)
            transcript += reply
            everything = task.tokenizer(transcript, add_special_tokens=False)["input_ids"]
            episode.ids, episode.mask, episode.logprobs, episode.versions = [], [], [], []
            episode.append_turn(everything[:len(turn.ids)], turn.logprobs, turn.version)
            episode.append_turn(everything[len(turn.ids):])
        episode.ended = "turns"
        return episode
    ''', clause='encoded again from text'),
    Mutant("run_episode", "drops the turn's stop token, the separator before the tool's reply", LOOP.replace(
        "        episode.append_turn(turn.ids, turn.logprobs, turn.version)\n        kind, request",
        "        ids = turn.ids[:-1] if turn.ids[-1:] == [task.stop_ids[0]] else turn.ids\n"
        "        episode.append_turn(ids, turn.logprobs[:len(ids)], turn.version)\n        kind, request"), clause='their stop token too'),
    Mutant("run_episode", "calls the first tool worker directly: no retry on another worker", LOOP.replace(
        'reply = await tools.route("call", prompt.table, request)',
        "reply = await tools.replicas[0].actor.call.call_one(prompt.table, request)"), clause='tools.route'),
    Mutant("run_episode", "never stops on the turn limit", LOOP.replace(
        "    for _ in range(limits.max_turns):", "    while True:"), clause='max_turns=3 means 3 policy turns'),
    Mutant("run_episode", "asks for max_new tokens whatever room is left", LOOP.replace(
        "min(limits.max_new, room)", "limits.max_new"), clause='room left under max_tokens'),
    Mutant("LeastLoadedService.next_replica", "round robin, where least loaded was asked",
           "return Service.next_replica(self, exclude)", clause='nothing in flight'),
    Mutant("LeastLoadedService.next_replica", "breaks ties by the lowest index, not round robin", '''
        candidates = [r for r in self.replicas if r.healthy and r.index not in exclude]
        if not candidates:
            return None
        return min(candidates, key=lambda replica: (replica.in_flight, replica.index))
    ''', clause='a tie goes to the first replica at or after the cursor'),
    Mutant("LeastLoadedService.next_replica", "forgets that an unhealthy replica is out",
           PICK.replace("if r.healthy and r.index not in exclude", "if r.index not in exclude"), clause='unhealthy replica is never picked'),
    Mutant("Episode.append_turn", "tells a policy turn by `if version:`: a version-0 turn becomes the "
           "environment's, never trained (a learner's)",
           APPEND.replace("policy = logprobs is not None", "policy = bool(version)"), clause='told by its log-probabilities alone'),
    Mutant("Episode.append_turn", "accepts log-probabilities that do not match the tokens", APPEND.replace(
        "    raise ValueError(f\"{len(ids)} tokens but {len(logprobs)} log-probabilities\")", "    pass"), clause='one-for-one check'),
    Mutant("Episode.append_turn", "appends the tokens before checking their log-probabilities", '''
        policy = logprobs is not None
        self.ids += ids
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='check before changing any list'),
    Mutant("Episode.version", "skips version 0 with the environment's -1 (`if v > 0`)",
           "return min(v for v in self.versions if v > 0)", clause='a token sampled by version 0 is a policy token'),
    Mutant("Episode.version", "the version of the first policy turn, taken to be the oldest",
           "return next(v for v, owner in zip(self.versions, self.mask) if owner)", clause='take the oldest'),
    Mutant("Episode.version", "tells policy tokens by a non-zero log-probability",
           "return min(v for v, logprob in zip(self.versions, self.logprobs) if logprob)", clause='one of mask 1'),
    Mutant("run_episode", "an empty reply when the tool call fails (a learner's)", LOOP.replace(
        '        reply = await tools.route("call", prompt.table, request)\n',
        '        try:\n            reply = await tools.route("call", prompt.table, request)\n'
        '        except Exception:\n            reply = ""\n'), clause='let the error out'),
    Mutant("run_episode", "its own fixed timeout around the tool call (a learner's)", LOOP.replace(
        'reply = await tools.route("call", prompt.table, request)',
        'reply = await asyncio.wait_for(tools.route("call", prompt.table, request), 0.5)').replace(
        "    for _ in range", "    import asyncio\n    for _ in range"), clause='add no timeout of your own'),
    Mutant("run_episode", "asks the tool for the prompt's letter, not the policy's request (a learner's)",
           LOOP.replace('tools.route("call", prompt.table, request)', 'tools.route("call", prompt.table, prompt.name)'), clause='what task.parse reads'),
    Mutant("run_episode", "`room < 0`: an episode at exactly max_tokens gets another turn (a learner's)",
           LOOP.replace("if room <= 0:", "if room < 0:"), clause='no room left'),
    Mutant("run_episode", "drops the turn's version: every turn recorded as version 0",
           LOOP.replace("episode.append_turn(turn.ids, turn.logprobs, turn.version)",
                        "episode.append_turn(turn.ids, turn.logprobs, 0)"), clause='pass turn.logprobs and turn.version'),
    Mutant("run_episode", "the last turn allowed ends on the turn limit before it is read", LOOP.replace(
        "    for _ in range(limits.max_turns):", "    for number in range(limits.max_turns):").replace(
        "        kind, request = task.parse(task.decode(turn.ids))\n",
        "        if number == limits.max_turns - 1:\n            break\n"
        "        kind, request = task.parse(task.decode(turn.ids))\n"), clause='the last one too'),
    Mutant("run_episode", "shows the policy only its own tokens, not the tool's replies", LOOP.replace(
        "episode.prompt_ids + episode.ids,",
        "episode.prompt_ids + [t for t, m in zip(episode.ids, episode.mask) if m],"), clause='show the policy the prompt and every token'),
    Mutant("LeastLoadedService.next_replica", "ties by distance from the cursor, without wrapping around", '''
        candidates = [r for r in self.replicas if r.healthy and r.index not in exclude]
        if not candidates:
            return None
        best = min(candidates, key=lambda replica: (replica.in_flight, replica.index - self.cursor))
        self.cursor = (best.index + 1) % len(self.replicas)
        return best
    ''', clause='wrapping past the last'),
    Mutant("LeastLoadedService.next_replica", "moves the cursor one step on, not just past the pick",
           PICK.replace("self.cursor = (best.index + 1) % count", "self.cursor = (self.cursor + 1) % count"), clause='just past the replica picked'),
    Mutant("run_episode", "grows episode.prompt_ids in place (`+=`) to build each turn's input",
           LOOP.replace('''        turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))''',
                        '''        context = episode.prompt_ids
        context += episode.ids
        turn = await policy.route("generate_turn", context, min(limits.max_new, room))'''), clause='as a new list'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('Episode.append_turn', 'policy decided by the truthiness of logprobs: an empty list for a non-empty turn is taken as an environment turn instead of refused', '''
        policy = bool(logprobs)
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.ids += ids
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='an empty list is log-probabilities too'),
    Mutant('Episode.append_turn', "only too few log-probabilities refused; extra ones are cut to the tokens' length", '''
        policy = logprobs is not None
        if policy and len(logprobs) < len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.ids += ids
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs)[:len(ids)] if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='neither fewer nor more'),
    Mutant('Episode.version', 'memoised on first read: a later turn from older weights never lowers it', '''
        if "_oldest" not in self.__dict__:
            self.__dict__["_oldest"] = min(v for v, owner in zip(self.versions, self.mask) if owner)
        return self.__dict__["_oldest"]
    ''', clause='at each read'),
    # From a third independent set (each one caught by a clause test added for it):
    Mutant('Episode.append_turn', 'an environment turn given a version keeps it instead of -1', '''
        policy = logprobs is not None
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.ids += ids
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if version is not None else -1] * len(ids)
    ''', clause='version -1'),
    Mutant('Episode.append_turn', "mask set per token from the log-probability: a policy token sampled with log-prob 0.0 counts as the environment's", '''
        policy = logprobs is not None
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.ids += ids
        self.mask += [1.0 if lp != 0.0 else 0.0 for lp in logprobs] if policy else [0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='a log-probability of 0.0 too'),
    Mutant('Episode.append_turn', "the first turn's lists taken as the episode's own, uncopied: later turns grow the caller's lists", '''
        policy = logprobs is not None
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        if not self.ids:
            self.ids = ids
        else:
            self.ids += ids
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='appends copies'),
    Mutant('Episode.append_turn', 'the length check only for a turn with a version: a policy turn without one is not refused', '''
        policy = logprobs is not None
        if policy and version is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.ids += ids
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)
    ''', clause='one-for-one check'),
    Mutant('run_episode', 'the token budget checked after each tool reply: a full budget on the last turn ends as "tokens", not "turns"', '''
        for _ in range(limits.max_turns):
            room = limits.max_tokens - len(episode.ids)
            if room <= 0:
                episode.ended = "tokens"
                return episode
            turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
            episode.append_turn(turn.ids, turn.logprobs, turn.version)

            kind, request = task.parse(task.decode(turn.ids))
            if kind != "call":
                episode.ended = "answer"
                return episode
            reply = await tools.route("call", prompt.table, request)
            episode.append_turn(task.reply_ids(reply))
            if len(episode.ids) >= limits.max_tokens:
                episode.ended = "tokens"
                return episode
        episode.ended = "turns"
        return episode
    ''', clause='said before a turn'),
    Mutant('run_episode', 'the budget spent by what each turn was allowed (max_new), not by the tokens it wrote', '''
        room = limits.max_tokens
        for _ in range(limits.max_turns):
            if room <= 0:
                episode.ended = "tokens"
                return episode
            turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
            room -= min(limits.max_new, room)
            episode.append_turn(turn.ids, turn.logprobs, turn.version)
            kind, request = task.parse(task.decode(turn.ids))
            if kind != "call":
                episode.ended = "answer"
                return episode
            reply = await tools.route("call", prompt.table, request)
            reply_ids = task.reply_ids(reply)
            room -= len(reply_ids)
            episode.append_turn(reply_ids)
        episode.ended = "turns"
        return episode
    ''', clause='minus the tokens the episode holds'),
    Mutant('LeastLoadedService.next_replica', 'ties broken by fewest requests served, not by round robin', '''
        count = len(self.replicas)
        in_order = [self.replicas[(self.cursor + step) % count] for step in range(count)]
        candidates = [r for r in in_order if r.healthy and r.index not in exclude]
        if not candidates:
            return None
        best = min(candidates, key=lambda replica: (replica.in_flight, replica.served))
        self.cursor = (best.index + 1) % count
        return best
    ''', clause='past served counts play no part'),
]


# Caught since the fourth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('run_episode', "the budget checked after each policy turn: an answer that fills it ends as 'tokens', a call that fills it is never answered", '''
for _ in range(limits.max_turns):
    room = limits.max_tokens - len(episode.ids)
    if room <= 0:
        episode.ended = "tokens"
        return episode
    turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
    episode.append_turn(turn.ids, turn.logprobs, turn.version)
    if len(episode.ids) >= limits.max_tokens:
        episode.ended = "tokens"
        return episode
    kind, request = task.parse(task.decode(turn.ids))
    if kind != "call":
        episode.ended = "answer"
        return episode
    reply = await tools.route("call", prompt.table, request)
    episode.append_turn(task.reply_ids(reply))
episode.ended = "turns"
return episode
''', clause='said only before a turn'),
    Mutant('LeastLoadedService.next_replica', 'the wrap-around stops one short: the replica just before the cursor is never a candidate', '''
count = len(self.replicas)
in_order = self.replicas[self.cursor:] + self.replicas[:self.cursor - 1]
candidates = [r for r in in_order if r.healthy and r.index not in exclude]
if not candidates:
    return None
best = min(candidates, key=lambda replica: replica.in_flight)
self.cursor = (best.index + 1) % count
return best
''', clause='the one just before the cursor too'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('run_episode', "only a turn starting with '!' ends the episode; any other non-call turn lets the policy go on; breaks 'a turn that is not a tool call is the answer'", '''
for _ in range(limits.max_turns):
    room = limits.max_tokens - len(episode.ids)
    if room <= 0:
        episode.ended = "tokens"
        return episode

    turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
    episode.append_turn(turn.ids, turn.logprobs, turn.version)
    kind, request = task.parse(task.decode(turn.ids))
    if kind != "call":
        if request.startswith("!"):
            episode.ended = "answer"
            return episode
        continue
    reply = await tools.route("call", prompt.table, request)
    episode.append_turn(task.reply_ids(reply))
episode.ended = "turns"
return episode
''', clause='whatever its form'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Episode.append_turn', 'stores the mask as ints 1/0 (breaks the promised type: mask is a list of floats, 1.0 and 0.0)', '''
    policy = logprobs is not None
    if policy and len(logprobs) != len(ids):
        raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
    self.ids += ids
    self.mask += [int(policy)] * len(ids)
    self.logprobs += list(logprobs) if policy else [0.0] * len(ids)
    self.versions += [version if policy else -1] * len(ids)
''', clause='floats'),
    Mutant('run_episode', "wraps each tool call in its own 10 s asyncio.wait_for (breaks 'the tools' Service alone bounds a call's time: add no timeout of your own')", '''
    import asyncio
    for _ in range(limits.max_turns):
        room = limits.max_tokens - len(episode.ids)
        if room <= 0:
            episode.ended = "tokens"
            return episode
        turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
        episode.append_turn(turn.ids, turn.logprobs, turn.version)
        kind, request = task.parse(task.decode(turn.ids))
        if kind != "call":
            episode.ended = "answer"
            return episode
        reply = await asyncio.wait_for(tools.route("call", prompt.table, request), timeout=10.0)
        episode.append_turn(task.reply_ids(reply))
    episode.ended = "turns"
    return episode
''', clause='add no timeout of your own'),
    Mutant('run_episode', "keeps one running context list and passes that same list to every policy call, extending it in place: the ids an earlier call received change afterwards (breaks 'the prompt and episode so far' per call)", '''
    context = episode.prompt_ids + episode.ids
    for _ in range(limits.max_turns):
        room = limits.max_tokens - len(episode.ids)
        if room <= 0:
            episode.ended = "tokens"
            return episode
        turn = await policy.route("generate_turn", context, min(limits.max_new, room))
        episode.append_turn(turn.ids, turn.logprobs, turn.version)
        context += turn.ids
        kind, request = task.parse(task.decode(turn.ids))
        if kind != "call":
            episode.ended = "answer"
            return episode
        reply = await tools.route("call", prompt.table, request)
        reply_ids = task.reply_ids(reply)
        episode.append_turn(reply_ids)
        context += reply_ids
    episode.ended = "turns"
    return episode
''', clause='never one running list'),
    Mutant('LeastLoadedService.next_replica', "moves the cursor by the best's position among the candidates, which skip unhealthy and excluded replicas (breaks 'the cursor moves just past it' when a replica before it was skipped)", '''
    count = len(self.replicas)
    in_order = [self.replicas[(self.cursor + step) % count] for step in range(count)]
    candidates = [r for r in in_order if r.healthy and r.index not in exclude]
    if not candidates:
        return None
    best = min(candidates, key=lambda replica: replica.in_flight)
    self.cursor = (self.cursor + candidates.index(best) + 1) % count
    return best
''', clause='by its index, not by its place'),
    Mutant('LeastLoadedService.next_replica', "walks modulo the number of healthy replicas: with one down, a healthy replica of a higher index is never considered (breaks 'among the healthy replicas', wrap-around over all of them)", '''
    count = self.healthy_count()
    if count == 0:
        return None
    in_order = [self.replicas[(self.cursor + step) % count] for step in range(count)]
    candidates = [r for r in in_order if r.healthy and r.index not in exclude]
    if not candidates:
        return None
    best = min(candidates, key=lambda replica: replica.in_flight)
    self.cursor = (best.index + 1) % len(self.replicas)
    return best
''', clause='a healthy one past the number of healthy replicas'),
]


# Caught since a seventh independent set (written without reading the tests) found it alive.
MUTANTS += [
    Mutant('run_episode', "parses the call itself (`text[1:].strip()`) instead of task.parse: right for '?c\\n', but a filled turn '?ea' asks the tool for 'ea' (task.parse: 'e'); breaks 'the tool is asked for what the policy's turn requests (task.parse)'", '''
for _ in range(limits.max_turns):
    room = limits.max_tokens - len(episode.ids)
    if room <= 0:
        episode.ended = "tokens"
        return episode
    turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
    episode.append_turn(turn.ids, turn.logprobs, turn.version)
    text = task.decode(turn.ids)
    if not text.startswith("?"):
        episode.ended = "answer"
        return episode
    reply = await tools.route("call", prompt.table, text[1:].strip())
    episode.append_turn(task.reply_ids(reply))
episode.ended = "turns"
return episode
''', clause='task.parse reads off'),
]


# The ninth independent set (blind learners) wrote these; the contract now states the clause each breaks.
MUTANTS += [
    Mutant("run_episode", "counts the prompt's tokens toward max_tokens, a context-length habit (breaks: max_tokens counts the tokens after the prompt)", '''
for _ in range(limits.max_turns):
    room = limits.max_tokens - len(episode.prompt_ids) - len(episode.ids)
    if room <= 0:
        episode.ended = "tokens"
        return episode
    turn = await policy.route("generate_turn", episode.prompt_ids + episode.ids, min(limits.max_new, room))
    episode.append_turn(turn.ids, turn.logprobs, turn.version)
    kind, request = task.parse(task.decode(turn.ids))
    if kind != "call":
        episode.ended = "answer"
        return episode
    reply = await tools.route("call", prompt.table, request)
    episode.append_turn(task.reply_ids(reply))
episode.ended = "turns"
return episode
''', clause='counts the tokens after the prompt'),
]


# The tenth independent set (input classes) found these; the contract now states the clause each breaks.
MUTANTS += [
    Mutant("run_episode", "cuts a tool reply to the room left (breaks: the tools' replies whole, as reply_ids gives them)",
           LOOP.replace("episode.append_turn(task.reply_ids(reply))",
                        "episode.append_turn(task.reply_ids(reply)[:limits.max_tokens - len(episode.ids)])"), clause='appended whole'),
    Mutant("run_episode", "catches the cancellation during a tool call and returns the episode (breaks: a cancelled "
           "episode stays cancelled)",
           LOOP.replace("\n    for _ in", "\n    import asyncio\n\n    for _ in", 1).replace('''        reply = await tools.route("call", prompt.table, request)
''', '''        try:
            reply = await tools.route("call", prompt.table, request)
        except asyncio.CancelledError:
            episode.ended = "cancelled"
            return episode
'''), clause='a cancelled episode stays cancelled'),
    # From a mechanical set (one operator at one site of the solution; caught by a test added for it):
    Mutant("run_episode", "one token of room left is taken for none: the episode ends a token early",
           LOOP.replace("if room <= 0:", "if room <= 1:"), clause='one token of room is left'),
    # Episode.trainable_mask (stretch): each breaks one clause of its contract
    Mutant("Episode.trainable_mask", "the whole episode bounded by its oldest token: all or nothing", '''
        oldest = min(v for v, owner in zip(self.versions, self.mask) if owner)
        keep = learner_version - oldest <= max_token_staleness
        return [owner if keep else 0.0 for owner in self.mask]
''', clause='bound each token on its own'),
    Mutant("Episode.trainable_mask", "a token at exactly the bound dropped (<)", '''
        return [owner if learner_version - version < max_token_staleness else 0.0
                for owner, version in zip(self.mask, self.versions)]
''', clause='exactly the bound'),
    Mutant("Episode.trainable_mask", "1 for every token recent enough, the tool's replies too", '''
        return [1.0 if learner_version - version <= max_token_staleness else 0.0
                for owner, version in zip(self.mask, self.versions)]
''', clause="start from the episode's mask"),
    Mutant("Episode.trainable_mask", "the lag as a distance (abs): a token newer than the learner dropped", '''
        return [owner if abs(learner_version - version) <= max_token_staleness else 0.0
                for owner, version in zip(self.mask, self.versions)]
''', clause='a lag below 0'),
    Mutant("Episode.trainable_mask", "zeroes the old tokens in the episode's own mask", '''
        for i, version in enumerate(self.versions):
            if learner_version - version > max_token_staleness:
                self.mask[i] = 0.0
        return self.mask
''', clause='leaves the episode as it was'),
    Mutant("Episode.trainable_mask", "the bound hard-coded to 1", '''
        return [owner if learner_version - version <= 1 else 0.0
                for owner, version in zip(self.mask, self.versions)]
''', clause="the caller's max_token_staleness"),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_EPISODE = (PROJECT_ROOT / "solutions" / "ch12_multi_turn_tools.py").read_text().split("    for _ in range(limits.max_turns):\n", 1)[1].split("    # <<< TODO")[0]
STUDY_EPISODE = "    for _ in range(limits.max_turns):\n" + STUDY_EPISODE
MUTANTS += [
    Mutant("run_episode", "a turn whose input leaves out the prompt",
           STUDY_EPISODE.replace("episode.prompt_ids + episode.ids, min(", "list(episode.ids), min("), clause="prompt"),
]
