"""Wrong versions of given code that a test holds (maintainers): `python -m mutants.given_code`.

The chapters' mutants (chNN_*.py) are wrong answers inside TODO regions, run by `koans verify --mutants`.
These are wrong versions of code the course gives: each replaces one exact text of a solutions/ file and
must make the named tests fail. tests/course/test_harness.py checks that each text is still there, exactly once.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class GivenMutant:
    file: str  # under solutions/
    old: str  # the exact text it replaces (once)
    new: str
    tests: str  # the test file that must fail
    select: str  # pytest -k: the tests that hold it
    why: str


MUTANTS = (
    GivenMutant("ch09_async_loops.py",
                "        groups = await asyncio.wait_for(generator.generate.call_one(), TIMEOUT)\n",
                "        groups = await asyncio.wait_for(generator.generate.call_one(), TIMEOUT)\n"
                "        if stop.is_set():\n            break\n",
                "test_ch09_async_loops.py", "in_flight_when_stop", "a rollout generated after stop is dropped"),
    GivenMutant("ch10_qwen_grpo.py", "    rng = random.Random(seed * 1000 + worker)\n", "    rng = random.Random(seed)\n",
                "test_ch10_qwen_grpo.py", "varied", "every rollout loop draws the same prompts"),
    GivenMutant("ch10_qwen_grpo.py", '        rollout = await service.route("generate", task.sample(rng)',
                '        rollout = await service.route("generate", task.sample(random.Random(seed * 1000 + worker))',
                "test_ch10_qwen_grpo.py", "varied", "one loop's prompt is the same every time"),
    GivenMutant("ch10_plumbing.py", "    norm = clip_gradients(model, max_grad_norm)\n    optimizer.step()\n",
                "    optimizer.step()\n    norm = clip_gradients(model, max_grad_norm)\n",
                "test_ch10_variants.py", "optimizer_steps", "the optimizer steps on the unclipped gradient"),
    GivenMutant("ch10_plumbing.py", "if max_grad_norm is not None and not max_grad_norm > 0:",
                "if max_grad_norm is not None and max_grad_norm < 0:",
                "test_ch10_variants.py", "clip_gradients", "a maximum norm of 0 is accepted"),
    GivenMutant("ch10_qwen_grpo.py",
                "    loss, stats = grpo_loss(logps, old_logps, advantages * token_mean_scale(mask), mask, config.clip)",
                "    loss, stats = grpo_loss(logps, old_logps, advantages * token_mean_scale(mask), mask)",
                "test_ch10_variants.py", "token_mean", "the token mean ignores the run's clip"),
    GivenMutant("ch12_plumbing.py", "attention=rows([[1.0] * len(e.ids) for e in episodes], 0.0, torch.float))",
                "attention=rows([e.mask for e in episodes], 0.0, torch.float))",
                "test_ch12_multi_turn_tools.py", "attends", "the trainer does not attend to a tool's reply"),
    GivenMutant("ch10_plumbing.py", "> self.max_lag:\n            self.held_back",
                ">= self.max_lag:\n            self.held_back", "test_ch10_qwen_grpo.py", "pacing",
                "pacing admits one group too few"),
    GivenMutant("ch10_plumbing.py", "            self.next_number -= 1\n", "            pass\n",
                "test_ch10_qwen_grpo.py", "place", "a lost group keeps its place"),
    GivenMutant("ch10_plumbing.py", "now - since >= patience", "now - since > patience",
                "test_ch10_qwen_grpo.py", "ten_times", "a number out exactly the patience is not taken back"),
    GivenMutant("ch10_plumbing.py", "max(5.0, 10 * self.longest_s)", "5.0",
                "test_ch10_qwen_grpo.py", "ten_times", "the patience ignores how long groups take"),
    GivenMutant("ch10_plumbing.py",
                "self.next_number, self.in_flight = learner_version * self.batch_groups, {}", "self.in_flight = {}",
                "test_ch10_qwen_grpo.py", "new_run", "a new run numbers its groups from 0"),
    GivenMutant("ch10_plumbing.py",
                "        since = self.in_flight.pop(number, None)\n        if since is not None:\n            self.longest_s",
                "        since = self.in_flight.get(number)\n        if since is not None:\n            self.longest_s",
                "test_ch10_qwen_grpo.py", "place", "a group in the buffer can still be lost"),
    GivenMutant("ch10_plumbing.py", "            self.held_back += 1\n", "", "test_ch10_qwen_grpo.py", "pacing",
                "refusals are not counted"),
)


def main() -> int:
    failed = 0
    for mutant in MUTANTS:
        path = ROOT / "solutions" / mutant.file
        original = path.read_text()
        if original.count(mutant.old) != 1:
            print(f"STALE     {mutant.file}: {mutant.why} (its text is no longer there exactly once)")
            failed += 1
            continue
        path.write_text(original.replace(mutant.old, mutant.new))
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--impl",
                                   "solutions", f"tests/{mutant.tests}", "-k", mutant.select], cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
        finally:
            path.write_text(original)
        caught = done.returncode == 1
        failed += not caught
        print(f"{'caught   ' if caught else 'SURVIVED '} {mutant.file}: {mutant.why}")
    print(f"{len(MUTANTS) - failed} of {len(MUTANTS)} wrong versions of given code caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
