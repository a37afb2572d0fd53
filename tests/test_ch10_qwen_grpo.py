"""Chapter 10: async GRPO on a Qwen2 policy. Run: pytest tests/test_ch10_qwen_grpo.py"""

import asyncio
import importlib
import math
import random
import threading

import pytest
import torch

from koans.testing import STARTUP_TIMEOUT, TIMEOUT


def close(actual, expected, tol=1e-4):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32),
                          torch.as_tensor(expected, dtype=torch.float32), atol=tol)


# --- TODO 1: group_advantages -----------------------------------------------------------------


@pytest.mark.todo("group_advantages")
def test_advantages_by_hand(chapter):
    # mean 0.5; unbiased std sqrt(4 * 0.25 / 3) = 0.57735; so +-0.5 / 0.57735 = +-0.86603
    advantages = chapter.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    assert close(advantages, [[0.86603, -0.86603, -0.86603, 0.86603]])


@pytest.mark.todo("group_advantages")
def test_each_group_is_normalised_on_its_own(chapter):
    rewards = torch.tensor([[1.0, 2.0, 3.0], [10.0, 30.0, 20.0]])  # std 1 and std 10
    assert close(chapter.group_advantages(rewards, eps=0.0), [[-1.0, 0.0, 1.0], [-1.0, 1.0, 0.0]])


@pytest.mark.todo("group_advantages")
def test_a_group_of_equal_rewards_teaches_nothing(chapter):
    advantages = chapter.group_advantages(torch.tensor([[0.7, 0.7, 0.7, 0.7], [0.0, 1.0, 0.0, 1.0]]))
    assert torch.isfinite(advantages).all(), "eps keeps a zero std from dividing by zero"
    assert close(advantages[0], [0.0, 0.0, 0.0, 0.0])
    assert close(advantages[1], [-0.86588, 0.86588, -0.86588, 0.86588]), "eps=1e-4 is added to the std"


# --- TODO 2: grpo_loss ------------------------------------------------------------------------


def one_token(ratio, advantage):
    """Single-token responses whose probability ratio new/old is `ratio`."""
    old = torch.zeros(len(ratio), 1)
    return torch.log(torch.tensor(ratio)).reshape(-1, 1), old, torch.tensor(advantage), torch.ones(len(ratio), 1)


@pytest.mark.todo("grpo_loss")
@pytest.mark.parametrize("ratio, advantage, expected_objective", [
    (1.1, 1.0, 1.1),  # inside the clip range: the plain ratio * A
    (0.9, -1.0, -0.9),
    (1.5, 1.0, 1.2),  # too far up with A > 0: clipped to 1 + 0.2
    (0.5, -1.0, -0.8),  # too far down with A < 0: clipped to 1 - 0.2
    (0.5, 1.0, 0.5),  # the min keeps the lower, unclipped, value
    (1.5, -1.0, -1.5),
])
def test_clipped_objective_by_hand(chapter, ratio, advantage, expected_objective):
    logps, old, advantages, mask = one_token([ratio], [advantage])
    loss, stats = chapter.grpo_loss(logps, old, advantages, mask, clip=0.2)
    assert close(loss, -expected_objective), f"ratio {ratio}, advantage {advantage}"
    assert stats["clip_fraction"] == (0.0 if 0.8 <= ratio <= 1.2 else 1.0)


@pytest.mark.todo("grpo_loss")
def test_no_gradient_flows_through_a_clipped_token(chapter):
    logps, old, advantages, mask = one_token([1.5, 1.1], [1.0, 1.0])
    logps.requires_grad_(True)
    loss, _ = chapter.grpo_loss(logps, old, advantages, mask, clip=0.2)
    loss.backward()
    assert logps.grad[0, 0] == 0.0, "ratio 1.5 with A > 0 is clipped: no push further"
    assert close(logps.grad[1, 0], -1.1 / 2), "d(-ratio * A / 2)/d logp = -ratio * A / 2"


@pytest.mark.todo("grpo_loss")
def test_masked_mean_counts_each_response_once_and_skips_padding(chapter):
    # response 0: two tokens with ratio 1.1, then padding; response 1: one token with ratio 0.9.
    # Padding holds wild values that must not count. Per response: 1.1 and 0.9; mean 1.0.
    # (A mean over all real tokens would give (1.1 + 1.1 + 0.9) / 3 = 1.0333.)
    ratios = torch.tensor([[1.1, 1.1, 50.0], [0.9, 50.0, 0.01]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = chapter.grpo_loss(torch.log(ratios), torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    assert close(loss, -1.0), "average per response over its own tokens, then over responses"
    assert stats["clip_fraction"] == 0.0, "padding's wild ratios are not counted as clipped"


@pytest.mark.todo("grpo_loss")
def test_kl_penalty_to_the_reference(chapter):
    logps, old, advantages, mask = one_token([1.0, 1.0], [1.0, -1.0])  # objective mean: 0
    ref = logps + math.log(2.0)  # ref - logp = log 2: k3 = 2 - log 2 - 1 = 0.30685
    loss, stats = chapter.grpo_loss(logps, old, advantages, mask, ref_logps=ref, kl_coef=0.5)
    assert close(stats["kl"], 0.30685) and close(loss, 0.5 * 0.30685)
    loss_off, stats_off = chapter.grpo_loss(logps, old, advantages, mask, ref_logps=ref, kl_coef=0.0)
    assert close(loss_off, 0.0) and stats_off["kl"] == 0.0, "kl_coef 0 (the default) turns the KL off"


# --- Loading through from_pretrained, and one step on it ----------------------------------------


@pytest.fixture(scope="module")
def runner(chapter):
    """The chapter's given run code (ch10_run.py), next to the chapter file under test."""
    return importlib.import_module(chapter.__name__.rsplit(".", 1)[0] + ".ch10_run")


@pytest.fixture(scope="module")
def saved_tiny_model(chapter, tmp_path_factory):
    """The tiny Qwen2 and its tokenizer, saved like a hub model, in a temp dir."""
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model, tokenizer = chapter.load_policy(None, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.todo("group_advantages", "grpo_loss")
def test_from_pretrained_loads_the_same_policy_and_a_grpo_step_trains_it(chapter, saved_tiny_model):
    built, _ = chapter.load_policy(None, seed=0)
    model, tokenizer = chapter.load_policy(saved_tiny_model)
    assert chapter.state_fingerprint(model.state_dict()) == chapter.state_fingerprint(built.state_dict())
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Count to 3:"}], tokenize=False,
                                         add_generation_prompt=True) == "Count to 3:\n", "the chat template came along"
    torch.manual_seed(0)
    task = chapter.CountingTask()
    prompt = task.sample(random.Random(0))
    group = chapter.sample_group(model, tokenizer, prompt, group_size=8, max_new_tokens=6)
    rewards = torch.tensor([[task.reward(prompt, text) for text in group["texts"]]])
    prompts, attention = chapter.pad_left([group["prompt_ids"]] * 8, tokenizer.pad_token_id)
    logps = chapter.response_logprobs(model, prompts, attention, group["responses"], group["mask"])
    assert close(logps.detach(), group["logps"]), "trainer and generator compute the same log-probs"
    advantages = chapter.group_advantages(rewards).reshape(-1)
    loss, stats = chapter.grpo_loss(logps, group["logps"], advantages, group["mask"])
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads) or rewards.std() == 0, "the loss reaches the weights"


# --- TODOs 3 and 4: the loops, on real actors ---------------------------------------------------


def small_config(chapter, model_path, **changes):
    options = dict(model=model_path, steps=6, groups_per_step=2, group_size=4, max_new_tokens=6, generators=2,
                   max_lag=1, seed=0)
    options.update(changes)
    return chapter.RunConfig(**options)


@pytest.fixture(scope="module")
def job(chapter, runner, saved_tiny_model):
    """One trainer process and two generator replicas, loaded through from_pretrained."""
    job = runner.Job.start(small_config(chapter, saved_tiny_model), name="t10")
    try:
        job.warm_up()
        yield job
    finally:
        job.stop()


@pytest.mark.todo("continuous_rollouts")
def test_rollout_loop_generates_scores_and_fills_the_buffer(chapter, job, test_tag):
    buffer = job.trainer_procs.spawn(f"buffer_{test_tag}", chapter.ReplayBuffer, 1)

    async def run_until_three():
        stop = asyncio.Event()
        loop = asyncio.create_task(chapter.continuous_rollouts(job.service, buffer, job.task, stop, worker=3))
        for _ in range(int(STARTUP_TIMEOUT / 0.05)):
            if loop.done() or await buffer.waiting.call_one() >= 3:
                break
            await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(loop, TIMEOUT)

    made = asyncio.run(run_until_three())
    assert made >= 3, "the loop ran until stop was set"
    batch = buffer.sample.call_one(made, 0).get(timeout=TIMEOUT)
    assert batch is not None and [r.id for r in batch] == [f"w3-{n}" for n in range(1, made + 1)]
    for rollout in batch:
        assert rollout.rewards is not None, "each rollout is scored before it goes into the buffer"
        expected = [job.task.reward(rollout.prompt, text) for text in rollout.texts]
        assert close(rollout.rewards, expected)


@pytest.fixture(scope="module")
def short_run(runner, job):
    """Both loops for 6 steps; then one final sync."""
    run = asyncio.run(runner.run_async(job, timeout=4 * STARTUP_TIMEOUT))
    run["final"] = job.final_sync()
    return run


@pytest.mark.todo("continuous_training", "continuous_rollouts")
def test_a_short_run_finishes_every_step(short_run):
    assert [r["version"] for r in short_run["results"]] == [1, 2, 3, 4, 5, 6]
    assert all(len(r["ids"]) == 2 for r in short_run["results"]), "each step trains on groups_per_step groups"


@pytest.mark.todo("continuous_training", "continuous_rollouts")
def test_every_trained_group_is_within_the_lag_bound_and_newer_weights_reach_generators(short_run):
    lags = [lag for r in short_run["results"] for lag in r["lags"]]
    assert lags and max(lags) <= 1, f"max_lag=1, but lags {lags}"
    trained_versions = [r["version"] - 1 - lag for r in short_run["results"] for lag in r["lags"]]
    assert max(trained_versions) >= 1, "later steps train on groups generated with weights the trainer published"
    ids = [i for r in short_run["results"] for i in r["ids"]]
    assert len(ids) == len(set(ids)), "no group is trained on twice"


@pytest.mark.todo("continuous_training", "continuous_rollouts")
def test_generators_hold_the_trainers_weights_after_the_final_sync(short_run):
    final = short_run["final"]
    assert sorted(final["generator_versions"].values()) == [6, 6]
    assert list(final["generators"].values()) == [final["trainer"]] * 2, "bit-equal weights everywhere"


@pytest.mark.todo("group_advantages", "grpo_loss")
def test_a_last_version_skipped_for_busy_slots_still_goes_out_at_flush(chapter, job, short_run):
    """Both staging slots held by readers: the trainer skips publishing, then flush() publishes it."""
    rng = random.Random(1)

    def step():
        rollout = job.service.route("generate", job.task.sample(rng), "flush-test")
        return job.trainer.train.call_one([chapter.score(job.task, rollout)]).get(timeout=TIMEOUT)["version"]

    def latest():
        return job.store.stats.call_one().get(timeout=TIMEOUT)["latest_version"]

    leases, release_first = [], None
    try:
        for _ in range(2):  # a reader on each of the two slots
            step()
            job.trainer.flush.call_one().get(timeout=TIMEOUT)
            leases.append(job.store.acquire.call_one(0).get(timeout=TIMEOUT))
        skipped = step()
        assert latest() == skipped - 1, "no slot was free, so this version was not published yet"
        release_first = threading.Timer(0.5, lambda: job.store.release.call_one(leases[0].lease).get(timeout=TIMEOUT))
        release_first.start()  # the first reader finishes while flush() waits
        assert job.trainer.flush.call_one().get(timeout=2 * TIMEOUT) == skipped
        assert latest() == skipped, "flush publishes the last version once a slot is free"
    finally:
        if release_first is not None:
            release_first.cancel()
            release_first.join()
        for lease in leases:  # release() ignores a lease already released
            job.store.release.call_one(lease.lease).get(timeout=TIMEOUT)


@pytest.mark.todo("continuous_training", "continuous_rollouts")
@pytest.mark.time_limit(300)
def test_training_survives_a_generator_killed_mid_run(chapter, runner, saved_tiny_model):
    job = runner.Job.start(small_config(chapter, saved_tiny_model, steps=10), name="t10kill")
    try:
        job.warm_up()
        on_step = runner.killing_at(job, 2)  # SIGKILL replica 0 right after step 2
        run = asyncio.run(runner.run_async(job, on_step=on_step, timeout=4 * STARTUP_TIMEOUT))
        assert [r["version"] for r in run["results"]] == list(range(1, 11)), "training went on to the end"
        job.service.wait_recovered(timeout=STARTUP_TIMEOUT)
        final = job.final_sync()
        stats = job.service.snapshot()
        assert stats["replica_failures"] >= 1 and stats["generations"][0] >= 2, f"replica 0 was not replaced: {stats}"
        assert list(final["generators"].values()) == [final["trainer"]] * 2, "the new replica caught up too"
    finally:
        job.stop()


@pytest.mark.gpu
@pytest.mark.todo("continuous_training", "continuous_rollouts")
@pytest.mark.time_limit(600)
def test_a_qwen2_5_0_5b_shaped_policy_trains_on_one_gpu(chapter, runner):
    """Trainer and both generators share the GPU; weights travel by CUDA IPC or shared memory."""
    config = small_config(chapter, "random:qwen2.5-0.5b", dtype="bfloat16", steps=3, max_new_tokens=8)
    job = runner.Job.start(config, name="t10gpu")
    try:
        job.warm_up()
        run = asyncio.run(runner.run_async(job, timeout=8 * STARTUP_TIMEOUT))
        assert [r["version"] for r in run["results"]] == [1, 2, 3]
        final = job.final_sync()
        assert list(final["generators"].values()) == [final["trainer"]] * 2
    finally:
        job.stop()
