"""Chapter 10 under failure: a generator killed mid-run, and the lease it never gives back.

These check the given trainer, with the service (chapter 06), the weight sync (07) and the
buffer and loops (09) you wrote, when a generator dies: training goes on to its last step.
They run in every `pytest` run and in CI; `koans check 10` leaves them out, so that the
check of chapter 10's own TODOs stays quick. Run them: pytest tests/test_ch10_qwen_grpo_faults.py
"""

import asyncio

import pytest
from monarch.actor import this_proc

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT, small_grpo_config

LEASE_TIMEOUT = 1.0  # a dead generator's lease blocks a staging slot this long (ch07)


@pytest.fixture(scope="module", autouse=True)
def started_job(chapter, plumbing, module_aio):
    """A trainer (in this process) and two generator replicas, loading their models from the start."""
    job = plumbing.Job.start(small_grpo_config(chapter, lease_timeout_s=LEASE_TIMEOUT), name="t10faults",
                             trainer_procs=this_proc())
    job.start_loading()
    try:
        yield job
    finally:
        module_aio.run(job.stop())


@pytest.fixture(scope="module")
def job(started_job, module_aio):
    module_aio.run(started_job.warm_up())
    return started_job


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
def test_a_lease_never_given_back_stalls_training_for_one_lease_timeout_at_most(plumbing, job, module_aio):
    """A generator killed mid-pull never gives its lease back; its slot stays blocked until the lease
    expires. The trainer must keep offering its weights until then (ch07's retry_until_free). If it only
    tried again after its next step, it would soon be too far ahead of every generator to get a fresh
    group, and would never step (or claim a slot, and see the lease expire) again."""

    async def scenario():
        first = await plumbing.ask(job.trainer.flush)  # the version training starts from
        leases, tasks = [], []

        async def take_a_lease_and_keep_it() -> None:  # what a reader killed mid-pull leaves behind
            for _ in range(int(STARTUP_TIMEOUT / 0.01)):
                snapshot = await asyncio.wait_for(job.store.acquire.call_one(first), TIMEOUT)
                if snapshot is not None:
                    return leases.append(snapshot.lease)
                await asyncio.sleep(0.01)  # the trainer's new version is not committed yet

        def on_step(result: dict) -> None:
            if result["version"] == first + 1:
                tasks.append(asyncio.get_running_loop().create_task(take_a_lease_and_keep_it()))

        run = await plumbing.run_async(job, on_step=on_step, timeout=STARTUP_TIMEOUT)
        return first, run, leases, await asyncio.wait_for(job.store.stats.call_one(), TIMEOUT)

    first, run, leases, stats = module_aio.run(scenario())
    assert len(leases) == 1, "the test holds a lease on the version after its first step"
    assert [r["version"] for r in run["results"]] == list(range(first + 1, first + 7)), "training went on to the end"
    assert stats["expired_leases"] >= 1, f"the abandoned lease expired and its slot was used again: {stats}"


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
@pytest.mark.time_limit(300)
def test_training_survives_a_generator_killed_mid_run(plumbing, job, module_aio):
    """Six more steps on the same job; generator replica 0 is SIGKILLed right after the second of them."""

    async def scenario():
        first = await plumbing.ask(job.trainer.flush)
        on_step = plumbing.killing_at(job, first + 2)
        run = await plumbing.run_async(job, on_step=on_step, timeout=4 * STARTUP_TIMEOUT)
        await job.service.wait_recovered(timeout=STARTUP_TIMEOUT)
        return first, run, await job.final_sync()

    first, run, final = module_aio.run(scenario())
    assert [r["version"] for r in run["results"]] == list(range(first + 1, first + 7)), "training went on to the end"
    stats = job.service.snapshot()
    assert stats["replica_failures"] >= 1 and stats["generations"][0] >= 2, f"replica 0 was not replaced: {stats}"
    assert list(final["generators"].values()) == [final["trainer"]] * 2, "the new replica caught up too"
