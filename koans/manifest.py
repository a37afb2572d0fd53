"""The chapter manifest: one entry per chapter, in learning order.

Everything that lists chapters (the `koans` runner, `koans verify`, the test
harness) reads this file, so adding a chapter means adding an entry here plus
its solution, test file and doc.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: Environment variable naming the code under test ("exercises" or "solutions").
IMPL_ENV = "KOANS_IMPL"


@dataclass(frozen=True)
class Chapter:
    number: int
    slug: str
    title: str
    hints: tuple[str, ...]
    needs_gpu: bool = False

    def gpu_missing(self) -> bool:
        """True when this chapter needs a CUDA GPU and this machine shows none."""
        if not self.needs_gpu:
            return False
        import torch

        return not torch.cuda.is_available()

    @property
    def tag(self) -> str:
        return f"ch{self.number:02d}"

    @property
    def module(self) -> str:
        return f"{self.tag}_{self.slug}"

    @property
    def test_file(self) -> Path:
        return PROJECT_ROOT / "tests" / f"test_{self.module}.py"

    def source_file(self, impl: str) -> Path:
        return PROJECT_ROOT / impl / f"{self.module}.py"

    @property
    def doc_file(self) -> Path:
        return PROJECT_ROOT / "docs" / f"{self.number:02d}_{self.slug}.md"


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(
        1,
        "hello_actor",
        "Hello, actor",
        hints=(
            "An endpoint is an ordinary method with @endpoint on it. It reads and "
            "changes `self` like any method; Monarch only decides where it runs.",
            "`this_proc()` and `this_host().spawn_procs(...)` both give you a ProcMesh, "
            "and every ProcMesh has the same `.spawn(name, ActorClass, *args)`.",
            "The device an actor should use is the one its own process can see: "
            "ask `torch.cuda.is_available()` inside the endpoint, not in the caller.",
        ),
    ),
    Chapter(
        2,
        "actor_mesh",
        "Actor meshes and adverbs",
        hints=(
            "`current_rank()` answers 'where does THIS MESSAGE see me?'. For the "
            "actor's fixed place in its mesh, use what __init__ recorded.",
            "A mesh of N actors is N separate objects: each `add` changes only the "
            "tally of the actor that received it.",
            "For per-rank work, take every size-th item starting at your rank: "
            "`numbers[rank::size]`, with rank and size from the message's view.",
            "`mesh.endpoint.call(...)` returns a Future of a ValueMesh; "
            "`.get(timeout=...)` it, then combine `.values()`.",
        ),
    ),
    Chapter(
        3,
        "rdma_transfer",
        "RDMA transfer: the magic pointer",
        hints=(
            "RDMABuffer can only point at one flat, contiguous, non-empty block of memory. "
            "Check tensor.dim(), tensor.is_contiguous() and tensor.numel() before wrapping, "
            "and say in the error what to pass instead (tensor.view(-1), tensor.contiguous()).",
            "RDMA copies raw bytes: the destination must have the handle's dtype and element "
            "count, 1-D and contiguous. Then `await handle.buffer.read_into(destination, timeout=timeout)`.",
            "An endpoint's return value is pickled into the reply. Returning the tensor itself "
            "sends every byte; that is the contrast the chapter wants you to see.",
        ),
    ),
    Chapter(
        4,
        "controllers",
        "Controllers: actors everyone can find",
        hints=(
            "record(): append the (source, metric, value) tuple to self.records and return len(self.records).",
            "find_sink(): `get_or_spawn_controller(name, MetricsSink, created_by)` returns a Future; "
            "`.get(timeout=timeout)` gives the one sink of that name, made by whoever asked first.",
            "Worker.work(): call find_sink(...) inside the endpoint, then "
            "`sink.record.call_one(source, \"items_done\", len(items)).get(timeout=TIMEOUT)`.",
        ),
    ),
    Chapter(
        5,
        "supervision",
        "Supervision: noticing that a child has died",
        hints=(
            "classify(): one try around future.get(timeout=timeout), with an except per kind. "
            "ActorError means the endpoint raised; SupervisionError means the process is gone; "
            "TimeoutError means no answer in time.",
            "__supervise__(): look at str(failure.mesh_name). 'logger...' meshes are Monarch's own: "
            "return True. 'child_g...' is your child: record it, self.spawn_child(), return True.",
            "Return False for any other mesh: it is not yours to handle, so it goes up the tree.",
        ),
    ),
    Chapter(
        6,
        "service",
        "A service that routes around failed replicas",
        hints=(
            "next_replica(): try indices cursor, cursor+1, ... (mod the number of replicas); return the "
            "first that is healthy and not in `exclude`, and move the cursor just past it.",
            "mark_unhealthy(): only act if `self.replicas[replica.index] is replica` and it is still healthy; "
            "then healthy=False, count the failure twice (replica and stats), and start the recovery.",
            "route(): a loop of at most self.attempts tries. classify() the call: ok returns, "
            "endpoint_error re-raises, died/timeout marks the replica and tries another.",
        ),
    ),
    Chapter(
        7,
        "weight_sync",
        "Weight sync without process groups",
        hints=(
            "stage: loop over layout.entries (not the state dict: tied weights have one "
            "entry) and copy_ each tensor into entry_view(slot, entry), non_blocking=True.",
            "publish: ask the store for a slot with claim(). None means every slot is "
            "busy: count a skip and return None at once. Otherwise _start_staging() and "
            "remember the version. Waiting for readers here is the bug this chapter is about.",
            "pull_and_load: acquire(self.version) returns None when nothing is newer. "
            "Release the lease in a `finally:` so a failed load cannot block the trainer's slot.",
        ),
    ),
    Chapter(
        8,
        "dtensor_reshard",
        "Resharding by overlap",
        hints=(
            "shard_box(): keep a list of (offset, length), one per tensor dim, starting with (0, size). "
            "For each mesh dim m with Shard(d): size = ceil(length / mesh_shape[m]) (that is -(-length // n)), "
            "start = min(coord[m] * size, length), new length = min(size, length - start), offset += start.",
            "intersect(): per dim, start = max of the starts, end = min of the ends; if end <= start "
            "anywhere, there is no overlap (None).",
            "plan_transfer(): group source ranks by identical box (replicas). For each destination box "
            "and each group whose box intersects it, one Piece from group[dst_rank % len(group)], with "
            "local_slices(overlap, src_box) and local_slices(overlap, dst_box).",
            "pull(): for each piece, `buffer = await pull_into(handle, torch.empty(handle.numel, "
            "dtype=handle.dtype))`, then `self.local[piece.dst_slices].copy_(buffer.view(region.shape))`.",
        ),
    ),
    Chapter(
        9,
        "async_loops",
        "Async RL: two loops and a buffer",
        hints=(
            "put(): if self._too_stale(group), record its id in self.ledger.refused_stale and return False. "
            "Otherwise append it, then `async with self.arrived: self.arrived.notify_all()`.",
            "sample(): first raise self.learner_version. Then, holding the condition, "
            "`await asyncio.wait_for(self.arrived.wait_for(enough), timeout)`, where enough() drops "
            "stale groups and checks the count. It is a @concurrent_endpoint, so put() runs meanwhile.",
            "continuous_rollouts(): `while not stop.is_set():` generate, queue.put, scorer.score_next, "
            "each awaited; count the turns.",
            "continuous_training(): wrap the loop in try/finally and call stop.set() in the finally, "
            "or the rollout loops never end. A None sample means a timeout: just try again.",
        ),
    ),
    Chapter(
        10,
        "qwen_grpo",
        "Async GRPO for a Qwen2 policy",
        hints=(
            "group_advantages(): rewards.mean(dim=1, keepdim=True) and rewards.std(dim=1, keepdim=True) "
            "keep one column per group, so (rewards - mean) / (std + eps) broadcasts row by row.",
            "grpo_loss(): ratio = (logps - old_logps).exp(); A = advantages[:, None]; the objective is "
            "torch.min(ratio * A, ratio.clamp(1 - clip, 1 + clip) * A); the loss is -masked_mean(objective, mask).",
            "continuous_rollouts(): the service's route() blocks, so `await asyncio.to_thread(service.route, "
            "\"generate\", prompt, rollout_id)`; then `await buffer.put.call_one(score(task, rollout))`.",
            "continuous_training(): the same loop as chapter 09's, with trainer.train; stop.set() in a finally.",
        ),
    ),
)


def selected_chapters() -> tuple[Chapter, ...]:
    """The chapters the runner works on: all, or those listed in $KOANS_CHAPTERS (e.g. "1,2,3").

    An instructor can grade part of the course; the runner's own tests use it to stay fast.
    """
    import os

    wanted = os.environ.get("KOANS_CHAPTERS", "").strip()
    if not wanted:
        return CHAPTERS
    return tuple(find_chapter(name) for name in wanted.split(","))


def find_chapter(name: str | int) -> Chapter:
    """Look a chapter up by number (1, "1", "01", "ch01") or slug ("hello_actor")."""
    text = str(name).strip().lower().removeprefix("ch")
    for chapter in CHAPTERS:
        if text in (str(chapter.number), f"{chapter.number:02d}", chapter.slug, chapter.module.removeprefix("ch")):
            return chapter
    known = ", ".join(f"{c.number} ({c.slug})" for c in CHAPTERS)
    raise KeyError(f"no chapter {name!r}; the chapters are: {known}")


def chapter_for_module(module_name: str) -> Chapter | None:
    """The chapter whose test or source module this is (e.g. 'test_ch01_hello_actor')."""
    for chapter in CHAPTERS:
        if chapter.module in module_name:
            return chapter
    return None
