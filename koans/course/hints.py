"""Progressive hints, per TODO: `koans hint N` shows one more each time it is asked.

For each TODO the first hint names the idea, the middle ones narrow it down,
and the last is close to code. A TODO comment in the exercise states only the
contract (what to produce, and the invariant it keeps); the recipe lives here,
so a learner sees it only by asking.

Keys are the TODO keys that `koans.course.todos` derives from the solution files:
"Class.method" or "function". The course's own tests check that every TODO has
at least two hints and that no hint names a TODO that does not exist.
"""

from __future__ import annotations

HINTS: dict[str, dict[str, tuple[str, ...]]] = {
    "ch01": {
        "Greeter.greet": (
            "An endpoint is an ordinary method: it reads and changes `self` as any method does. "
            "Monarch only decides where it runs.",
            "__init__ set up self.greetings_given. Count first, so that the first greeting says #1.",
            "self.greetings_given += 1, then return an f-string with who, self.name and the count.",
        ),
        "Greeter.whereabouts": (
            "The code of an endpoint runs in the actor's process, so whatever it asks is answered there.",
            "os.getpid() and socket.gethostname() for the first two.",
            'For the device: "cuda" if torch.cuda.is_available() else "cpu", asked inside the endpoint.',
        ),
        "start_one_process": (
            "A host can start processes for you; what comes back is a ProcMesh.",
            'this_host().spawn_procs(per_host={"procs": 1}) makes one new process.',
        ),
        "spawn_greeter": (
            "this_proc() and a mesh of new processes are both ProcMeshes, with the same spawn method.",
            "procs.spawn(actor_name, ActorClass, *init_args): the actor's name comes first (here the greeter's own"
            " name, so that logs tell greeters apart), then its class, then its __init__ arguments. Pass those by"
            " position: a keyword name= would be taken as spawn's own first parameter.",
        ),
    },
    "ch02": {
        "Worker.whoami": (
            "Two views of one actor: where it was spawned (recorded in __init__) and where this message sees it.",
            "current_rank() and current_size() describe the current message; both convert with dict(...).",
            '{"spawn_coords": self.spawn_coords, "message_coords": dict(current_rank()), '
            '"message_size": current_size(), "pid": os.getpid()}',
        ),
        "Worker.add": (
            "Each actor of the mesh is its own object, with its own self.tally.",
            "self.tally += amount; return self.tally",
        ),
        "Worker.sum_my_share": (
            "Split the work by the message's view, so a slice splits it among its own actors.",
            "rank = current_rank().rank; size = the product of the values of current_size().",
            "sum(x * x for x in numbers[rank::size])",
        ),
        "sum_of_squares": (
            "call() reaches every actor of the mesh (or slice) it is made on, and answers a ValueMesh.",
            "workers.sum_my_share.call(numbers) is a Future; .get(timeout=timeout) waits for the ValueMesh.",
            "return sum(value_mesh.values())",
        ),
    },
    "ch03": {
        "expose": (
            "A handle is a pointer: it must point at the tensor's own memory, and RDMA can only point at one "
            "flat, contiguous, non-empty block.",
            "One `if` per rule, in the stated order: isinstance(tensor, torch.Tensor), tensor.dim() == 1, "
            "tensor.is_contiguous(), tensor.numel() > 0. Raise with the given message functions.",
            "raise ValueError(not_flat(tensor)), and so on; at the end "
            "return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel()).",
        ),
        "pull_into": (
            "RDMA copies raw bytes and never converts: the destination must match the handle exactly.",
            "Checks in order: destination.dtype != handle.dtype; destination.dim() != 1 or not "
            "destination.is_contiguous(); destination.numel() != handle.numel.",
            "await handle.buffer.read_into(destination, timeout=timeout), then return destination.",
        ),
        "TensorOwner.send_copy": (
            "Whatever an endpoint returns is pickled into the reply message.",
            "return self.tensor",
        ),
    },
    "ch04": {
        "MetricsSink.record": (
            "The sink is an ordinary actor: its state is a list.",
            "self.records.append((source, metric, float(value))); return len(self.records)",
        ),
        "find_sink": (
            "Monarch keeps one actor per controller name for the whole job; the first caller builds it.",
            "get_or_spawn_controller(name, MetricsSink, created_by) answers a Future of the actor.",
            "return get_or_spawn_controller(name, MetricsSink, created_by).get(timeout=timeout)",
        ),
        "Worker.work": (
            "Nobody hands the worker the sink: it finds it by name, inside the endpoint.",
            'sink = find_sink(f"worker{self.rank}", self.sink_name)',
            'sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get(timeout=TIMEOUT); '
            "then return the sum of squares.",
        ),
    },
    "ch05": {
        "classify": (
            "One wait, bounded by a timeout, and one `except` per kind of failure; catch nothing else "
            "(asyncio.CancelledError is a cancel, not a timeout).",
            "await asyncio.wait_for(future, timeout) gives the reply or raises: ActorError (the endpoint "
            "raised), SupervisionError (the process died), TimeoutError (no answer in time). Keep the "
            "exception object itself as the value, not its text.",
            'try: return Outcome("ok", await asyncio.wait_for(future, timeout), where) '
            'except ActorError as err: return Outcome("endpoint_error", err, where) ... and so on.',
        ),
        "Supervisor.__supervise__": (
            "Monarch calls this for every mesh that fails on the child's process, Monarch's own among "
            "them; only one is the child, and every one is handled (True).",
            "spawned_as(failure) is the name the failed mesh was spawned with; it is the current child "
            "exactly when it equals self.child_name (after a respawn, a late report of the old child no "
            "longer does).",
            'if spawned_as(failure) == self.child_name: self.failures.append({"generation": '
            'self.generation, "mesh": str(failure.mesh_name), "report": failure.report()}); '
            "self.spawn_child(). Then, in every case: return True.",
        ),
    },
    "ch06": {
        "Service.next_replica": (
            "Round robin: start where the last pick left off, and walk around the list once.",
            "for step in range(len(self.replicas)): look at self.replicas[(self.cursor + step) % count].",
            "The first one that is healthy and not excluded: set self.cursor = (replica.index + 1) % count "
            "and return it. After the loop: return None.",
        ),
        "Service.mark_unhealthy": (
            "Deaths are reported by every request that meets them; act on the first report only.",
            "if self.replicas[replica.index] is replica and replica.healthy: ... (else do nothing)",
            "replica.healthy = False; replica.failures += 1; self.stats.replica_failures += 1; "
            "if self.auto_recover: self.start_recovery(replica)",
        ),
        "Service.route": (
            "A loop of at most self.attempts tries; each try asks classify() what became of the call.",
            "replica = self._pick(session, tried); outcome = await classify(getattr(replica.actor, "
            "endpoint_name).call_one(*args, **kwargs), self.call_timeout, where=...)",
            'A None replica: break. "ok": self._served(replica, session) and return outcome.value. '
            '"endpoint_error": raise outcome.value. Otherwise: self.mark_unhealthy(replica, outcome.kind), '
            "attempts.append(Attempt(replica.index, outcome.kind, outcome.summary)), tried.add(replica.index); "
            "stats.retries += 1 before every try after the first. After the loop: stats.failed += 1 and "
            "raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count()).",
        ),
    },
    "ch07": {
        "WeightStore.claim": (
            "A slot is free only if nobody needs it: not the latest, not being written, no live lease.",
            "First drop the expired leases: for lease, (slot, since) in list(self.leases.items()), if "
            "time.monotonic() - since > self.lease_timeout_s: del self.leases[lease] and count it.",
            "busy = self.writing | {slot of each lease} | {self.latest[1] if self.latest}; the first slot in "
            "range(len(self.offers)) not in busy: add it to self.writing and return it; else count a skip, "
            "return None.",
        ),
        "WeightPublisher.publish": (
            "The trainer's only wait is one message to the store; if no slot is free it moves on.",
            "slot = await asyncio.wait_for(self.store.claim.call_one(), self.timeout)",
            "None: self.skipped += 1; return None. Else: self.staging.start(state_dict, slot, version); "
            "self.version = version; return version.",
        ),
        "SnapshotReader.pull_and_load": (
            "A lease protects the slot while you read it; give it back in a `finally`, and believe the "
            "load only if the store says the lease was still held.",
            "snapshot = await asyncio.wait_for(self.store.acquire.call_one(self.version), self.timeout); "
            "None means nothing newer.",
            "try: await self.load(snapshot, halfway) finally: held = await asyncio.wait_for("
            "self.store.release.call_one(snapshot.lease), self.timeout). Loop for self.attempts loads while "
            "held is False (count self.lost_leases); then raise RuntimeError.",
        ),
    },
    "ch08": {
        "shard_box": (
            "Start from the whole tensor and narrow it one mesh dimension at a time, the way DTensor splits: "
            "torch.chunk's size, ceil(length / parts), but every rank gets a share, perhaps an empty one.",
            "box = [(0, size) for size in shape]; for each mesh dim m with a Shard(d) placement, split box[d].",
            "size = -(-length // mesh_shape[m]); start = min(coord[m] * size, length); "
            "share = max(0, min(size, length - start)); box[d] = (offset + start, share) if share, "
            "else (shape[d], 0): an empty share sits at the end of the whole dimension.",
        ),
        "intersect": (
            "Per dimension, an overlap starts at the later start and ends at the earlier end.",
            "start = max(a_off, b_off); end = min(a_off + a_len, b_off + b_len)",
            "If end <= start in any dimension: return None; else collect (start, end - start).",
        ),
        "plan_transfer": (
            "Replicas hold the same box: group source ranks by box, then intersect each destination box "
            "with each group's box.",
            "holders = {}; holders.setdefault(box, []).append(rank) for each source rank.",
            "For an overlap: src = group[dst_rank % len(group)]; "
            "Piece(src, local_slices(overlap, src_box), local_slices(overlap, dst_box)).",
        ),
        "ShardHolder.pull": (
            "Start every read before waiting for any (asyncio.gather): reads in flight together move faster. "
            "Each piece arrives flat; give it its region's shape, then copy it there.",
            "buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype)) "
            "for handle in handles))",
            "for piece, buffer in zip(pieces, buffers): region = self.local[piece.dst_slices]; "
            "region.copy_(buffer.view(region.shape)); answer sum(handle.nbytes for handle in handles).",
        ),
    },
    "ch09": {
        "ReplayBuffer.put": (
            "Two jobs: refuse (and count) a group already too stale to ever be trained on; keep any other, "
            "and wake whoever waits for groups (a sample waiting on self.arrived).",
            "if self._too_stale(group): record group.id in self.ledger.refused_stale, return False.",
            "Else self.groups.append(group); async with self.arrived: self.arrived.notify_all(); return True.",
        ),
        "ReplayBuffer.sample": (
            "Wait on the condition for a predicate that drops stale groups and counts what is left.",
            "self.learner_version = max(self.learner_version, learner_version); a helper enough() moves stale "
            "groups to ledger.dropped_stale and returns len(self.groups) >= count.",
            "async with asyncio.timeout(timeout), self.arrived: await self.arrived.wait_for(enough) "
            "(TimeoutError: return None; asyncio.wait_for(..., 0) would give up before looking); then "
            "batch = self.groups[:count], keep the rest.",
        ),
        "continuous_training": (
            "Ask the buffer against the learner's version: 0 before the first step, then the version the last "
            "train answered. A None sample is not a step: ask again.",
            "version = 0; while len(results) < steps: batch = await asyncio.wait_for("
            "buffer.sample.call_one(batch_groups, version), TIMEOUT); if batch is None: continue",
            "result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT); "
            'version = result["version"]; results.append(result); on_step(result) if given.',
            "Put the whole loop in try/finally, and set `stop` in the finally: the rollout loops wait for it, "
            "however training ends.",
        ),
    },
    "ch10": {
        "group_advantages": (
            "Each row is one group: compare each reward with its own row's mean and spread.",
            "rewards.mean(dim=1, keepdim=True) and rewards.std(dim=1, keepdim=True) keep one column per "
            "row, so they broadcast against [B, G].",
            "return (rewards - mean) / (std + eps). A group of one has no sample std (torch gives NaN): its std is 0.",
        ),
        "grpo_loss": (
            "Per token, the pessimistic (min) of the unclipped and clipped objective; the loss is its "
            "negative, averaged with masked_mean.",
            "ratio = torch.exp(logps - old_logps); A = advantages[:, None] broadcasts over tokens.",
            "objective = torch.min(ratio * A, ratio.clamp(1 - clip, 1 + clip) * A); "
            "loss = -masked_mean(objective, mask); clip_fraction = masked_mean(((ratio < 1 - clip) | "
            "(ratio > 1 + clip)).float(), mask). With ref_logps and kl_coef > 0: d = ref_logps - logps, "
            "kl = masked_mean(torch.exp(d) - d - 1, mask), loss = loss + kl_coef * kl.",
        ),
        "response_token_logprobs": (
            "Shift by one: the logits at position i are about the token at i + 1.",
            "P = logits.shape[1] - responses.shape[1]; the predictions for the response are "
            "logits[:, P - 1 : -1].",
            "torch.log_softmax(predictions.float(), dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1), "
            "times mask.",
        ),
    },
    "ch11": {
        "truncated_importance_weights": (
            "A ratio of probabilities is the exponential of a difference of log-probabilities.",
            "weights = torch.exp(proximal_logps - behaviour_logps), detached from the graph: the weights are a "
            "constant of the loss, so no gradient may flow through them even when proximal_logps carries one; "
            "cap it with .clamp(max=cap) unless cap is None.",
            "return torch.where(mask.bool(), weights, 0.0): padding weighs exactly 0, even where its ratio is inf or "
            "nan (-inf log-probabilities), which `weights * mask` would turn into nan.",
        ),
        "decoupled_ppo_loss": (
            "Chapter 10's clipped objective, with two changes: the ratio is to the proximal policy, and "
            "each token is weighted by w.",
            "w = weights.detach() if the caller gave them, else truncated_importance_weights(proximal_logps, "
            "behaviour_logps, mask, cap); "
            "ratio = torch.exp(torch.where(mask.bool(), logps - proximal_logps.detach(), torch.zeros_like(logps))): "
            "the proximal policy is a constant, like PPO's old one; r only where the mask is 1, since a -inf on "
            "padding gives nan, and nan * 0 (the masked mean) is nan, gradient too; A = advantages[:, None].",
            "objective = w * torch.min(ratio * A, ratio.clamp(1 - clip, 1 + clip) * A) (or w * ratio * A when "
            "clip is None); loss = -masked_mean(objective, mask); stats from effective_sample_size(w, mask) and "
            "masked_mean.",
        ),
        "AdmissionWindow.admit": (
            "Group number k is trained in step k // batch_groups: its lag then is that step minus the "
            "generator's version, signed (below 0 when the generator's version is past that step).",
            "number = self.admitted; too late if number // self.batch_groups - generator_version > self.max_lag.",
            "Too late: self.refused += 1; return None. Else: self.admitted += 1; return number.",
        ),
        "withhold_stale": (
            "Withholding keeps a stale member in its group for the baseline, and out of the gradient: two separate "
            "answers, the advantages (all members) and the mask (the fresh members' rows).",
            "The advantages are chapter 10's formula on the whole row of rewards: (r - r.mean()) / (r.std() + eps), "
            "with 0 spread for a group of one. The lags are learner_version - torch.as_tensor(versions).",
            "withheld = (lags > max_lag)[:, None]; the mask to train with is torch.where(withheld, "
            "torch.zeros_like(mask), mask): new tensors, the caller's untouched.",
        ),
        "masked_importance_weights": (
            "The same ratio as truncated_importance_weights, proximal over behaviour; what changes is what happens "
            "outside the band: the token is dropped (weight 0), not pulled back to the band's end.",
            "ratio = torch.exp(proximal_logps - behaviour_logps).detach(); inside = (ratio >= low) & (ratio <= high) "
            "& mask.bool(): both ends count as inside.",
            "return torch.where(inside, ratio, torch.zeros_like(ratio)): a -inf on padding gives a nan ratio, and "
            "torch.where keeps it out where `ratio * inside` would not.",
        ),
    },
    "ch12": {
        "Episode.append_turn": (
            "Four lists, one entry per token: a policy turn brings its log-probabilities and version, a tool reply "
            "brings neither. The mask says who wrote a token: only the policy's are trained.",
            "policy = logprobs is not None; extend self.ids with ids, and each other list with one value per token.",
            "self.mask += [1.0 if policy else 0.0] * len(ids); self.logprobs += logprobs if policy else "
            "[0.0] * len(ids); self.versions += [version if policy else -1] * len(ids).",
        ),
        "Episode.version": (
            "An episode is only as fresh as its oldest policy token: that is the lag chapter 09's bound must see.",
            "Look at the versions of the tokens whose mask is 1 (the environment's are -1), and take the smallest.",
        ),
        "Episode.trainable_mask": (
            "Staleness per token: each policy token carries the version that sampled it, so each can be bounded on "
            "its own. The episode stays; only its tokens that are too old leave the gradient.",
            "Walk the mask and the versions together: a token keeps its mask entry when learner_version - its "
            "version <= max_token_staleness, else 0. The environment's entries are 0 already: keep them.",
            "return [owner if learner_version - version <= max_token_staleness else 0.0 for owner, version in "
            "zip(self.mask, self.versions)]: a new list, the episode's own untouched.",
        ),
        "run_episode": (
            "A loop over turns. Each turn: the policy's next tokens after everything so far (as token ids), appended "
            "as they came; if they are a tool call, the tool's reply, appended whole, as reply_ids gives it.",
            "for _ in range(limits.max_turns): room = limits.max_tokens - len(episode.ids); stop ('tokens') if there "
            "is none; turn = await policy.route('generate_turn', episode.prompt_ids + episode.ids, "
            "min(limits.max_new, room)); episode.append_turn(turn.ids, turn.logprobs, turn.version).",
            "kind, request = task.parse(task.decode(turn.ids)); not a 'call': episode.ended = 'answer', return it. "
            "Else reply = await tools.route('call', prompt.table, request); episode.append_turn(task.reply_ids(reply)). "
            "After the loop: episode.ended = 'turns'.",
        ),
        "LeastLoadedService.next_replica": (
            "Walk the replicas in round-robin order from the cursor; of the healthy ones not excluded, keep the one "
            "with the fewest in flight, the first among equals.",
            "in_order = [self.replicas[(self.cursor + step) % count] for step in range(count)]; min(candidates, "
            "key=lambda r: r.in_flight) returns the first of equals.",
            "No candidate: None. Else set self.cursor = (best.index + 1) % count and return best.",
        ),
    },
}
