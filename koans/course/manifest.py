"""The chapter manifest: one entry per chapter, in learning order.

Everything that lists chapters (the `koans` runner, `koans verify`, the test
harness) reads this file, so adding a chapter means adding an entry here plus
its solution, test file and doc.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # koans/course/manifest.py -> the project

#: Environment variable naming the code under test ("exercises" or "solutions").
IMPL_ENV = "KOANS_IMPL"


WORKSHOP, ELECTIVE = "workshop", "elective"


@dataclass(frozen=True)
class Chapter:
    number: int
    slug: str
    title: str
    track: str  # WORKSHOP (the 3-hour path) or ELECTIVE
    minutes: int  # a learner's time by koans.course.model: the workshop's depth for workshop chapters
    builds_on: tuple[int, ...] = ()  # chapters whose exercise code this one runs
    reading: tuple[str, ...] = ()  # given modules worth reading; every other given module may be skipped
    fits_after: int | None = None  # electives: the workshop chapter after which they fit best
    needs_gpu: bool = False
    stretch: tuple[str, ...] = ()  # TODOs given as code in the workshop (koans workshop); self-study writes them
    process_imports: tuple[str, ...] = ("torch",)  # what the Monarch processes of its tests import, slowly:
    # a test session's zygote imports it once, and forks them with it imported (koans/testkit/forkserver.py)

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

    def given_files(self, impl: str) -> list[Path]:
        """The given modules beside the chapter file (chNN_*.py other than the chapter's own)."""
        return sorted(p for p in (PROJECT_ROOT / impl).glob(f"{self.tag}_*.py") if p.name != f"{self.module}.py")

    @property
    def doc_file(self) -> Path:
        return PROJECT_ROOT / "docs" / f"{self.number:02d}_{self.slug}.md"

    @property
    def elective(self) -> bool:
        return self.track == ELECTIVE

    def hints_for(self, todo_key: str) -> tuple[str, ...]:
        """The progressive hints of one TODO (koans/course/hints.py)."""
        from koans.course.hints import HINTS

        return HINTS.get(self.tag, {}).get(todo_key, ())


QWEN2 = "transformers.models.qwen2.modeling_qwen2"  # Hugging Face's Qwen2: seconds to import

CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "hello_actor", "Hello, actor", WORKSHOP, 14),
    Chapter(2, "actor_mesh", "Actor meshes and adverbs", WORKSHOP, 10, stretch=("Worker.whoami",), process_imports=()),
    Chapter(3, "rdma_transfer", "RDMA transfer: the magic pointer", WORKSHOP, 20),
    Chapter(4, "controllers", "Controllers: actors everyone can find", ELECTIVE, 15, fits_after=3, process_imports=()),
    Chapter(5, "supervision", "Supervision: noticing that a child has died", WORKSHOP, 29, process_imports=()),
    Chapter(6, "service", "A service that routes around failed replicas", WORKSHOP, 20, builds_on=(5,),
            stretch=("Service.next_replica", "Service.mark_unhealthy"), process_imports=()),
    Chapter(7, "weight_sync", "Weight sync without process groups", WORKSHOP, 30, builds_on=(3,),
            stretch=("WeightStore.claim",), process_imports=("torch", QWEN2)),
    Chapter(8, "dtensor_reshard", "Resharding by overlap", ELECTIVE, 45, builds_on=(3,), fits_after=7),
    Chapter(9, "async_loops", "Async RL: two loops and a buffer", WORKSHOP, 25, builds_on=(3, 7),
            stretch=("ReplayBuffer.sample",)),
    Chapter(10, "qwen_grpo", "Async GRPO for a Qwen2 policy", WORKSHOP, 25, builds_on=(3, 5, 6, 7, 9),
            stretch=("response_token_logprobs",), process_imports=("torch", QWEN2)),
    Chapter(11, "staleness", "Staleness: what it costs, how to correct it", ELECTIVE, 65, builds_on=(3, 5, 6, 7, 9, 10),
            fits_after=10, process_imports=()),
    Chapter(12, "multi_turn_tools", "Multi-turn episodes with tools", ELECTIVE, 55, builds_on=(3, 5, 6, 7, 9, 10),
            fits_after=10, stretch=("Episode.trainable_mask",)),
)


def workshop() -> tuple[Chapter, ...]:
    return tuple(c for c in CHAPTERS if c.track == WORKSHOP)


def electives() -> tuple[Chapter, ...]:
    return tuple(c for c in CHAPTERS if c.track == ELECTIVE)


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


# ---------------------------------------------------------------- helpers for the runner (no Monarch import)


def fingerprint_files(chapter: Chapter, impl: str = "exercises") -> list[Path]:
    """The files a chapter's result depends on: its own file and given files, those of the
    chapters it builds on, its test file and conftest.py."""
    files = [chapter.source_file(impl), *chapter.given_files(impl)]
    for number in chapter.builds_on:
        earlier = find_chapter(number)
        files += [earlier.source_file(impl), *earlier.given_files(impl)]
    return files + [chapter.test_file, PROJECT_ROOT / "conftest.py"]
