"""The judge's own questions: each TODO that is a function of data, asked on inputs drawn at grading time.

A chapter's tests report their outcomes from the process that runs the submitted code, so a verdict
they give is only as good as that process. Where a TODO is a function of data (its answer depends on
its inputs and on state the caller sets), the judge does not rely on it: it draws fresh inputs when it
grades (`draw`), the tests' process answers them with the submitted code after the tests (`answer`,
through conftest's --koans-probe), only plain data comes back (numbers, strings, lists, tensors as
nested lists: never a pickle, never the submitted object itself), and the judge compares that data in
its own process with what the reference answers on the same inputs (`compare`). To pass, a submission
must compute the right answers for inputs nobody had seen: a forged report, or answers hard-coded
for the tests' own inputs, does not.

Each probe checks what its TODO's contract promises and nothing more: where the contract leaves a
choice open (the order of a plan's pieces, how a cursor is stored), the comparison leaves it open too.

Not probed: TODOs whose answer is a behaviour of actors and processes (spawning, messages, deaths,
waits). The judge cannot observe those from outside; for them the run-time guards and the box
(koans.grading.runtime, koans.grading.contain) carry the verdict's integrity.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

CASES = 24  # inputs per probe


@dataclass(frozen=True)
class Probe:
    todo: str
    draw: Callable[[random.Random], Any]  # one case, as plain data
    run: Callable[[Any, Any], Any]  # (chapter module, case) -> plain data


# ---------------------------------------------------------------- plain data out of the tests' process


@dataclass(frozen=True)
class Raised:
    """What a call raised instead of answering (its nearest builtin kind)."""

    kind: str


def plain(value) -> Any:
    """`value` as JSON-able data that keeps what the tests compare (tuple vs list, tensors' values)."""
    import torch

    if isinstance(value, Raised):
        return {"raised": value.kind}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        values = data.double().tolist() if data.is_floating_point() else data.tolist()
        return {"tensor": {"shape": list(data.shape), "float": data.is_floating_point(), "values": _finite(values)}}
    if isinstance(value, tuple):
        return {"tuple": [plain(v) for v in value]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[plain(k), plain(v)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, 1 if value.step is None else value.step]}
    return {"type": type(value).__name__}


def _finite(values):
    if isinstance(values, list):
        return [_finite(v) for v in values]
    if isinstance(values, float) and not math.isfinite(values):
        return {"float": repr(values)}
    return values


def _call(function, *args, **kwargs):
    """The answer, or the kind of exception raised (a contract may ask for a ValueError)."""
    try:
        return function(*args, **kwargs)
    except Exception as err:  # the TODO's error is part of its answer
        return Raised(next((kind.__name__ for kind in (NotImplementedError, ValueError, TypeError, KeyError, IndexError,
                                                       RuntimeError, ZeroDivisionError) if isinstance(err, kind)),
                           "Exception"))


def _tensor(rows) -> Any:
    import torch

    return torch.tensor(rows, dtype=torch.float32)


def _endpoint(cls, name):
    """The code of an actor's endpoint, to call on an object made in this process (as the tests do)."""
    method = cls.__dict__[name]._method
    return getattr(method, "__wrapped__", method)


# ---------------------------------------------------------------- chapter 06 and 12: picking a replica


def _draw_routing(rng):
    count = rng.randint(1, 6)
    replicas = [{"healthy": rng.random() < 0.8, "in_flight": rng.randint(0, 2)} for _ in range(count)]
    calls = []
    for _ in range(rng.randint(3, 8)):
        calls.append({"exclude": sorted(rng.sample(range(count), rng.randint(0, min(2, count)))),
                      "flip": rng.randrange(count) if rng.random() < 0.3 else None,
                      "load": [rng.randint(0, 2) for _ in range(count)] if rng.random() < 0.3 else None})
    return {"replicas": replicas, "cursor": rng.randrange(count), "calls": calls}


def _run_routing(service_class, module, case, least_loaded: bool):
    import importlib

    replica_class = importlib.import_module(f"{module.__package__}.ch06_plumbing").Replica
    service = service_class.__new__(service_class)
    service.replicas = [replica_class(i, None, None) for i in range(len(case["replicas"]))]
    for replica, state in zip(service.replicas, case["replicas"]):
        replica.healthy = state["healthy"]
        replica.in_flight = state["in_flight"] if least_loaded else 0
    service.cursor = case["cursor"]
    picks = []
    for call in case["calls"]:
        if call["flip"] is not None:
            service.replicas[call["flip"]].healthy = not service.replicas[call["flip"]].healthy
        if least_loaded and call["load"] is not None:
            for replica, load in zip(service.replicas, call["load"]):
                replica.in_flight = load
        picked = _call(service.next_replica, set(call["exclude"]))
        picks.append(picked.index if hasattr(picked, "index") else plain(picked))
    return picks


# ---------------------------------------------------------------- chapter 07: the double-buffer rule


def _draw_claim(rng):
    slots = rng.randint(2, 4)
    latest = rng.randrange(slots) if rng.random() < 0.8 else None
    leases = {str(i): [rng.randrange(slots), rng.choice([1.0, 5.0, 200.0, 500.0])] for i in range(rng.randint(0, 3))}
    return {"slots": slots, "latest": latest, "writing": sorted(rng.sample(range(slots), rng.randint(0, 1))),
            "leases": leases}


def _run_claim(module, case):
    store = module.WeightStore.__new__(module.WeightStore)
    module.WeightStore.__init__(store, 60.0)  # leases older than 60 s are lost; the drawn ages are far from it
    store.offers = [{} for _ in range(case["slots"])]
    now = time.monotonic()
    if case["latest"] is not None:
        store.latest = (3, case["latest"], time.time())
    store.writing = set(case["writing"])
    store.leases = {int(k): (slot, now - age) for k, (slot, age) in case["leases"].items()}
    claim = _endpoint(module.WeightStore, "claim")
    # one claim more than there are slots: which free slot comes first is left open, so the slots answered
    # are compared as a set (every free one, each once), then the skips
    answers = [_call(claim, store) for _ in range(case["slots"] + 1)]
    slots = [a for a in answers if isinstance(a, int) and not isinstance(a, bool)]
    return {"slots": sorted(slots), "in_order": len(set(slots)) == len(slots),
            "others": plain([a for a in answers if a not in slots]), "leases": sorted(store.leases),
            "writing": sorted(store.writing),
            "counts": {k: store.counts[k] for k in ("expired_leases", "skipped_claims")}}


# ---------------------------------------------------------------- chapter 08: boxes, overlaps, plans


def _draw_layout(rng, ndim):
    mesh = [rng.randint(1, 4) for _ in range(rng.randint(1, 2))]
    return mesh, [["S", rng.randrange(ndim)] if rng.random() < 0.75 else ["R"] for _ in mesh]


def _placements(module, spec):
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(p[1]) if p[0] == "S" else Replicate() for p in spec]


def _draw_box(rng):
    ndim = rng.randint(1, 3)
    shape = [rng.randint(1, 11) for _ in range(ndim)]
    mesh, placements = _draw_layout(rng, ndim)
    return {"shape": shape, "mesh": mesh, "placements": placements, "coord": [rng.randrange(m) for m in mesh]}


def _run_box(module, case):
    return plain(_call(module.shard_box, tuple(case["shape"]), tuple(case["mesh"]),
                       _placements(module, case["placements"]), tuple(case["coord"])))


def _draw_intersect(rng):
    ndim = rng.randint(1, 3)
    box = lambda: [[rng.randint(0, 8), rng.randint(0, 6)] for _ in range(ndim)]  # noqa: E731
    return {"a": box(), "b": box()}


def _run_intersect(module, case):
    return plain(_call(module.intersect, tuple(map(tuple, case["a"])), tuple(map(tuple, case["b"]))))


def _draw_plan(rng):
    ndim = rng.randint(1, 3)
    src, dst = _draw_layout(rng, ndim), _draw_layout(rng, ndim)
    return {"shape": [rng.randint(1, 11) for _ in range(ndim)], "src": list(src), "dst": list(dst)}


def _run_plan(module, case):
    plan = _call(module.plan_transfer, tuple(case["shape"]), tuple(case["src"][0]),
                 _placements(module, case["src"][1]), tuple(case["dst"][0]), _placements(module, case["dst"][1]))
    if not isinstance(plan, dict):
        return plain(plan)  # (or what it raised)
    # the pieces of a destination, in any order: the contract does not fix it
    return {"dict": [[plain(rank), sorted((plain([p.src, list(p.src_slices), list(p.dst_slices)])
                                           for p in pieces), key=repr)] for rank, pieces in sorted(plan.items())]}


# ---------------------------------------------------------------- chapter 09: the replay buffer's bookkeeping


def _draw_puts(rng):
    puts, version = [], rng.randint(0, 4)
    for made in range(rng.randint(2, 8)):
        version += rng.choice([0, 0, 1, 2])
        puts.append([f"g{made}", max(0, version - rng.randint(0, 3)), version])
    return {"max_lag": rng.randint(0, 2), "puts": puts}


def _draw_samples(rng):
    version = rng.randint(0, 3)
    groups = [[f"g{i}", max(0, version - rng.randint(0, 2))] for i in range(rng.randint(0, 8))]
    calls = []
    for _ in range(rng.randint(1, 4)):
        version += rng.choice([0, 0, 1, 2])
        calls.append([rng.randint(1, 3), version])
    return {"max_lag": rng.randint(0, 2), "groups": groups, "calls": calls, "start": max(0, calls[0][1] - 1)}


def _buffer(module, case):
    buffer = module.ReplayBuffer.__new__(module.ReplayBuffer)
    module.ReplayBuffer.__init__(buffer, case["max_lag"])
    return buffer


def _group(module, name, version):
    import torch

    return module.Group(name, version, torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.ones(2))


def _run_puts(module, case):
    buffer, put = _buffer(module, case), _endpoint(module.ReplayBuffer, "put")

    async def puts():
        answers = []
        for name, version, learner_version in case["puts"]:
            buffer.learner_version = learner_version  # where sample would have left it
            answers.append(await put(buffer, _group(module, name, version)))
        return answers

    try:
        answers = asyncio.run(asyncio.wait_for(puts(), 10))
    except Exception as err:
        return {"raised": type(err).__name__}
    return {"answers": plain(answers), "kept": [g.id for g in buffer.groups], "refused": list(buffer.ledger.refused_stale)}


def _run_samples(module, case):
    buffer, sample = _buffer(module, case), _endpoint(module.ReplayBuffer, "sample")
    buffer.groups = [_group(module, name, version) for name, version in case["groups"]]
    buffer.learner_version = case["start"]

    async def samples():
        answers = []
        for count, learner_version in case["calls"]:
            batch = await sample(buffer, count, learner_version, 0)  # a timeout of 0: what is there, at once
            answers.append(None if batch is None else [g.id for g in batch])
        return answers

    try:
        answers = asyncio.run(asyncio.wait_for(samples(), 10))
    except Exception as err:
        return {"raised": type(err).__name__}
    ledger = buffer.ledger
    return {"answers": plain(answers), "left": [g.id for g in buffer.groups], "trained": list(ledger.trained),
            "dropped": list(ledger.dropped_stale), "learner_version": buffer.learner_version}


# ---------------------------------------------------------------- chapters 10 and 11: the arithmetic of the loss


def _logps(rng, rows, cols, spread=1.0):
    return [[-abs(rng.gauss(1.0, spread)) for _ in range(cols)] for _ in range(rows)]


def _mask(rng, rows, cols, empty_row=False):
    mask = []
    for r in range(rows):
        length = 0 if (empty_row and r == rows - 1) else rng.randint(1, cols)
        mask.append([1.0] * length + [0.0] * (cols - length))
    return mask


def _draw_advantages(rng):
    rows, cols = rng.randint(1, 4), rng.randint(1, 6)
    rewards = [[round(rng.uniform(-1, 1), 3) for _ in range(cols)] for _ in range(rows)]
    if rows > 1 and rng.random() < 0.5:
        rewards[0] = [0.5] * cols  # a group that teaches nothing
    return {"rewards": rewards, "eps": rng.choice([1e-4, 1e-2])}


def _run_advantages(module, case):
    rewards = _tensor(case["rewards"])
    out = _call(module.group_advantages, rewards, case["eps"])
    return {"out": plain(out), "rewards_after": plain(rewards)}


def _draw_loss(rng, decoupled=False):
    rows, cols = rng.randint(1, 4), rng.randint(2, 6)
    case = {"logps": _logps(rng, rows, cols), "old": _logps(rng, rows, cols, 0.5),
            "advantages": [rng.uniform(-2, 2) for _ in range(rows)], "mask": _mask(rng, rows, cols, rng.random() < 0.3),
            "clip": rng.choice([0.1, 0.2, 0.3] + ([None] if decoupled else []))}
    if decoupled:
        case["behaviour"] = _logps(rng, rows, cols, 0.5)
        case["cap"] = rng.choice([2.0, 1.5, None])
    else:
        case["ref"] = _logps(rng, rows, cols, 0.5) if rng.random() < 0.6 else None
        case["kl_coef"] = rng.choice([0.0, 0.1, 0.5])
    return case


def _run_grpo_loss(module, case):
    import torch

    logps = _tensor(case["logps"]).requires_grad_(True)
    inputs = [_tensor(case["old"]), torch.tensor(case["advantages"]), _tensor(case["mask"])]
    ref = _tensor(case["ref"]) if case["ref"] is not None else None
    answer = _call(module.grpo_loss, logps, *inputs, clip=case["clip"], ref_logps=ref, kl_coef=case["kl_coef"])
    return _loss_answer(answer, logps, inputs, ("clip_fraction", "kl"))


def _run_decoupled(module, case):
    import torch

    logps = _tensor(case["logps"]).requires_grad_(True)
    proximal, behaviour = _tensor(case["old"]), _tensor(case["behaviour"])
    advantages, mask = torch.tensor(case["advantages"]), _tensor(case["mask"])
    answer = _call(module.decoupled_ppo_loss, logps, proximal, behaviour, advantages, mask, clip=case["clip"],
                   cap=case["cap"])
    return _loss_answer(answer, logps, [proximal, behaviour, advantages, mask], ("clip_fraction", "mean_weight", "ess"))


def _loss_answer(answer, logps, inputs, stat_names):
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return plain(answer)
    loss, stats = answer
    grad = None
    try:
        loss.backward()
        grad = logps.grad
    except Exception as err:
        grad = {"raised": type(err).__name__}
    stats = stats if isinstance(stats, dict) else {}
    value = float(loss.detach()) if getattr(loss, "numel", lambda: 0)() == 1 else plain(loss)
    return {"loss": plain(value), "grad": plain(grad), "inputs_after": plain(inputs),
            "stats": {name: plain(stats.get(name)) for name in stat_names},
            "stat_types": sorted({type(stats.get(name)).__name__ for name in stat_names})}


def _draw_logprobs(rng):
    rows, prompt, length, vocab = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4), rng.randint(3, 7)
    return {"logits": [[[rng.gauss(0, 3) for _ in range(vocab)] for _ in range(prompt + length)] for _ in range(rows)],
            "responses": [[rng.randrange(vocab) for _ in range(length)] for _ in range(rows)],
            "mask": _mask(rng, rows, length)}


def _run_logprobs(module, case):
    import torch

    logits = torch.tensor(case["logits"], dtype=torch.float32, requires_grad=True)
    responses, mask = torch.tensor(case["responses"]), _tensor(case["mask"])
    out = _call(module.response_token_logprobs, logits, responses, mask)
    grad = None
    if isinstance(out, torch.Tensor):
        try:
            weights = torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape)
            (out * weights).sum().backward()
            grad = logits.grad
        except Exception as err:
            grad = {"raised": type(err).__name__}
    return {"out": plain(out), "grad": plain(grad)}


def _draw_weights(rng, banded=False):
    rows, cols = rng.randint(1, 4), rng.randint(1, 6)
    case = {"proximal": _logps(rng, rows, cols, 0.5), "behaviour": _logps(rng, rows, cols, 0.5),
            "mask": _mask(rng, rows, cols)}
    case["proximal"][0][0], case["behaviour"][0][0] = -200.0, -200.5  # a token both find very unlikely
    if banded:
        case["low"], case["high"] = rng.choice([(0.5, 2.0), (0.8, 1.25), (0.9, 1.1)])
    else:
        case["cap"] = rng.choice([2.0, 1.0, 0.5, None])
    return case


def _run_weights(module, case, banded=False):
    proximal = _tensor(case["proximal"]).requires_grad_(True)
    behaviour, mask = _tensor(case["behaviour"]), _tensor(case["mask"])
    if banded:
        out = _call(module.masked_importance_weights, proximal, behaviour, mask, case["low"], case["high"])
    else:
        out = _call(module.truncated_importance_weights, proximal, behaviour, mask, case["cap"])
    return {"out": plain(out), "carries_grad": bool(getattr(out, "requires_grad", False)),
            "inputs_after": plain([proximal, behaviour, mask])}


def _draw_admission(rng):
    return {"max_lag": rng.randint(0, 3), "batch_groups": rng.randint(1, 4),
            "asks": [rng.randint(0, 6) for _ in range(rng.randint(3, 12))]}


def _run_admission(module, case):
    window = module.AdmissionWindow(case["max_lag"], case["batch_groups"])
    answers = [_call(window.admit, version) for version in case["asks"]]
    return {"answers": plain(answers), "admitted": window.admitted, "refused": window.refused}


# ---------------------------------------------------------------- chapter 12: an episode's bookkeeping


def _draw_turns(rng):
    turns = []
    for _ in range(rng.randint(1, 5)):
        length = rng.randint(1, 4)
        ids = [rng.randrange(50) for _ in range(length)]
        kind = rng.random()
        if kind < 0.5:
            turns.append([ids, [round(-rng.random(), 3) for _ in range(length)], rng.randint(0, 3)])
        elif kind < 0.9:
            turns.append([ids, None, None])
        else:
            turns.append([ids, [-0.5] * (length + 1), 1])  # log-probabilities that do not match: refused
    return {"prompt": [1, 2, 3], "turns": turns}


def _run_turns(module, case):
    episode = module.Episode(list(case["prompt"]))
    answers = []
    for ids, logprobs, version in case["turns"]:
        answers.append(plain(_call(episode.append_turn, list(ids), logprobs, version)))
    return {"answers": answers, "ids": plain(episode.ids), "mask": plain([float(m) for m in episode.mask]),
            "logprobs": plain([float(x) for x in episode.logprobs]), "versions": plain(episode.versions)}


def _draw_versions(rng):
    length = rng.randint(1, 8)
    mask = [1.0] + [float(rng.random() < 0.6) for _ in range(length - 1)]
    rng.shuffle(mask)
    return {"mask": mask, "versions": [rng.randint(0, 5) if m else -1 for m in mask]}


def _run_versions(module, case):
    episode = module.Episode([0])
    episode.ids = list(range(len(case["mask"])))
    episode.mask, episode.versions = list(case["mask"]), list(case["versions"])
    episode.logprobs = [0.0] * len(case["mask"])
    try:
        return plain(episode.version)  # a property
    except Exception as err:
        return {"raised": type(err).__name__}


def _draw_withhold(rng):
    size, cols = rng.randint(1, 8), rng.randint(1, 5)
    return {"rewards": [round(rng.random(), 1) for _ in range(size)], "versions": [rng.randint(0, 6) for _ in range(size)],
            "mask": _mask(rng, size, cols), "learner_version": rng.randint(2, 8), "max_lag": rng.randint(0, 3),
            "eps": rng.choice([1e-4, 0.5, 1e-6])}


def _run_withhold(module, case):
    rewards, mask = _tensor(case["rewards"]), _tensor(case["mask"])
    out = _call(module.withhold_stale, rewards, list(case["versions"]), mask, case["learner_version"],
                case["max_lag"], eps=case["eps"])
    return {"out": plain(out), "inputs_after": plain([rewards, mask])}


def _draw_token_bounds(rng):
    case = _draw_versions(rng)
    case.update(learner_version=rng.randint(0, 7), bound=rng.randint(0, 3))
    return case


def _run_token_bounds(module, case):
    episode = module.Episode([0])
    episode.ids = list(range(len(case["mask"])))
    episode.mask, episode.versions = list(case["mask"]), list(case["versions"])
    episode.logprobs = [0.0] * len(case["mask"])
    out = _call(episode.trainable_mask, case["learner_version"], case["bound"])
    return {"out": plain(out), "mask_after": plain(episode.mask)}


PROBES: dict[str, list[Probe]] = {
    "ch06": [Probe("Service.next_replica", _draw_routing,
                   lambda m, c: _run_routing(m.Service, m, c, least_loaded=False))],
    "ch07": [Probe("WeightStore.claim", _draw_claim, _run_claim)],
    "ch08": [Probe("shard_box", _draw_box, _run_box), Probe("intersect", _draw_intersect, _run_intersect),
             Probe("plan_transfer", _draw_plan, _run_plan)],
    "ch09": [Probe("ReplayBuffer.put", _draw_puts, _run_puts), Probe("ReplayBuffer.sample", _draw_samples, _run_samples)],
    "ch10": [Probe("group_advantages", _draw_advantages, _run_advantages),
             Probe("grpo_loss", _draw_loss, _run_grpo_loss),
             Probe("response_token_logprobs", _draw_logprobs, _run_logprobs)],
    "ch11": [Probe("truncated_importance_weights", _draw_weights, _run_weights),
             Probe("decoupled_ppo_loss", lambda rng: _draw_loss(rng, decoupled=True), _run_decoupled),
             Probe("masked_importance_weights", lambda rng: _draw_weights(rng, banded=True),
                   lambda m, c: _run_weights(m, c, banded=True)),
             Probe("AdmissionWindow.admit", _draw_admission, _run_admission),
             Probe("withhold_stale", _draw_withhold, _run_withhold)],
    "ch12": [Probe("Episode.append_turn", _draw_turns, _run_turns), Probe("Episode.version", _draw_versions, _run_versions),
             Probe("Episode.trainable_mask", _draw_token_bounds, _run_token_bounds),
             Probe("LeastLoadedService.next_replica", _draw_routing,
                   lambda m, c: _run_routing(m.LeastLoadedService, m, c, least_loaded=True))],
}


# ---------------------------------------------------------------- the judge's side and the tests' side


def draw(tag: str, seed: int, cases: int = CASES) -> dict:
    """The inputs of every probe of a chapter: {todo: [case, ...]}, from `seed` (drawn at grading time)."""
    rng = random.Random(seed)
    return {probe.todo: [probe.draw(rng) for _ in range(cases)] for probe in PROBES.get(tag, [])}


def answer(tag: str, module, request: dict) -> dict:
    """{todo: [plain answer per case]} from `module` (in the tests' process, or the judge's on the reference)."""
    out = {}
    for probe in PROBES.get(tag, []):
        answers = []
        for case in request.get(probe.todo, []):
            try:
                answers.append(probe.run(module, case))
            except Exception as err:  # an answer that breaks the probe's own code is still an answer
                answers.append({"raised": type(err).__name__})
        out[probe.todo] = answers
    return out


def difference(got, want, path: str = "") -> str | None:
    """None when `got` (from the tests' process) matches `want` (the reference's); else where they differ."""
    if isinstance(want, dict) and "tensor" in want:
        if not (isinstance(got, dict) and isinstance(got.get("tensor"), dict)):
            return f"{path or 'the answer'}: expected a tensor"
        g, w = got["tensor"], want["tensor"]
        if g.get("shape") != w["shape"]:
            return f"{path or 'the answer'}: shape {g.get('shape')} where the reference has {w['shape']}"
        return difference(g.get("values"), w["values"], path)
    if isinstance(want, dict) and "float" in want and len(want) == 1:  # inf or nan
        return None if got == want else f"{path or 'the answer'}: {got!r} where the reference has {want['float']}"
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return None if (got is want or (type(got) is type(want) and got == want)) else \
            f"{path or 'the answer'}: {_short(got)} where the reference has {_short(want)}"
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{path or 'the answer'}: {_short(got)} where the reference has {want!r}"
        return None if math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5) else \
            f"{path or 'the answer'}: {got!r} where the reference has {want!r}"
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path or 'the answer'}: {_short(got)} where the reference has {_short(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            found = difference(g, w, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{path or 'the answer'}: {_short(got)} where the reference has {_short(want)}"
        for key in want:
            found = difference(got[key], want[key], f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    return f"{path or 'the answer'}: cannot compare {_short(want)}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def answer_in_session(request_path: str, test_module: str, impl: str) -> dict:
    """In the tests' process, after the tests (conftest's --koans-probe): the chapter's answers to the request."""
    import json

    from koans.testkit.code_under_test import import_chapter
    from koans.testkit.time_limit import time_limit
    from koans.course.manifest import chapter_for_module

    chapter = chapter_for_module(test_module)
    try:
        request = json.loads(open(request_path).read())
        module = import_chapter(chapter, impl)
    except Exception as err:  # the chapter does not import: every probe of it fails
        return {"error": f"{type(err).__name__}: {err}"[:500]}
    try:
        with time_limit(120):
            return answer(chapter.tag, module, request)
    except BaseException as err:  # a TODO that never answers, or one that ends the session's run
        return {"error": f"the probes did not finish: {type(err).__name__}"}
