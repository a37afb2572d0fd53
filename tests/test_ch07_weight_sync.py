"""Chapter 07: weight sync without process groups. Run: pytest tests/test_ch07_weight_sync.py"""

import os
import time

import pytest
import torch

from koans.testing import STARTUP_TIMEOUT, TIMEOUT

TRANSPORTS = ["shm", "rdma"]


@pytest.fixture
def procs(shared_procs):
    """Shared across tests; replaced by a fresh mesh if an earlier test broke it."""
    return shared_procs(procs=3)


@pytest.fixture
def weight_sync(chapter, procs, test_tag):
    """Factory: a store and a trainer on procs=0, generators on procs=1 and 2.

    Every trainer made here is closed at teardown, which removes its
    shared-memory slot files; the test checks that they are gone.
    """
    made, tag = [], test_tag

    def make(recipe="mlp", trainer_dtype=torch.float32, generators=(("shm", torch.float32),), rdma_chunk_bytes=256):
        index = len(made)
        on_trainer = procs.slice(procs=0)
        store = on_trainer.spawn(f"store_{tag}_{index}", chapter.WeightStore)
        trainer = on_trainer.spawn(f"trainer_{tag}_{index}", chapter.PolicyTrainer, store, recipe, trainer_dtype,
                                   "auto", rdma_chunk_bytes)
        gens = [
            procs.slice(procs=1 + n % 2).spawn(f"gen{n}_{tag}_{index}", chapter.PolicyGenerator, store, recipe, dtype, transport)
            for n, (transport, dtype) in enumerate(generators)
        ]
        made.append(trainer)
        return store, trainer, gens

    yield make
    for trainer in made:
        try:
            paths = trainer.publisher_stats.call_one().get(timeout=STARTUP_TIMEOUT)["shm_paths"]
            trainer.close.call_one().get(timeout=TIMEOUT)
        except Exception:
            continue  # this trainer never started (the test has already failed and said why)
        assert not any(os.path.exists(p) for p in paths if p), "close() must remove the shared-memory slot files"


def step_and_commit(chapter, store, trainer):
    """One trainer step; wait until its version (if published) is committed."""
    version = trainer.step.call_one().get(timeout=STARTUP_TIMEOUT)
    if version is not None:
        chapter.wait_for_version(store, version, timeout=TIMEOUT)
    return version


# --- TODO 1: stage ---------------------------------------------------------------------------


@pytest.mark.todo("stage")
def test_stage_puts_every_tensor_at_its_place_in_the_slot(chapter):
    generator = torch.Generator().manual_seed(0)
    state = {
        "f32": torch.randn(3, 5, generator=generator),
        "bf16": torch.randn(7, generator=generator).to(torch.bfloat16),
        "f16": torch.randn(2, 2, 2, generator=generator).to(torch.float16),
        "i64": torch.arange(5),
        "u8": torch.arange(9, dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
    }
    layout = chapter.plan_layout(state)
    slot = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    chapter.stage(state, layout, slot)
    for name, tensor in state.items():
        placed = chapter.entry_view(slot, layout.entry(name))
        assert placed.dtype == tensor.dtype and torch.equal(placed, tensor), f"{name} is not where the layout says"


@pytest.mark.todo("stage")
def test_tied_weights_are_staged_once(chapter):
    model = chapter.make_policy("mlp", seed=0)
    state = model.state_dict()
    layout = chapter.plan_layout(state)
    assert len(layout.aliases) == 1, "the MLP ties its output layer to its embedding"
    unique_bytes = sum(t.numel() * t.element_size() for n, t in state.items() if n not in dict(layout.aliases))
    assert layout.total_bytes < unique_bytes + 64 * len(layout.entries), "tied bytes are laid out once"
    slot = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    chapter.stage(state, layout, slot)
    tied, owner = layout.aliases[0]
    assert torch.equal(chapter.entry_view(slot, layout.entry(tied)), state[owner])


# --- TODO 2: WeightPublisher.publish -------------------------------------------------------------


@pytest.mark.todo("WeightPublisher.publish")
def test_published_versions_reach_the_store_in_order(chapter, weight_sync):
    store, trainer, _ = weight_sync()
    versions = [step_and_commit(chapter, store, trainer) for _ in range(3)]
    assert versions == [1, 2, 3], "with no readers, every step publishes its own version"
    stats = store.stats.call_one().get(timeout=TIMEOUT)
    assert (stats["latest_version"], stats["commits"], stats["writing"]) == (3, 3, 0)


@pytest.mark.todo("WeightPublisher.publish")
def test_publish_skips_instead_of_waiting_when_every_slot_is_busy(chapter, procs):
    store = procs.slice(procs=0).spawn("store_skips", chapter.WeightStore)
    weights = {"w": torch.zeros(32)}
    publisher = chapter.WeightPublisher(weights, store, rdma_chunk_bytes=64)
    try:
        assert publisher.publish(weights, version=1) == 1
        chapter.wait_for_version(store, 1, timeout=TIMEOUT)
        reader_of_v1 = store.acquire.call_one(0).get(timeout=TIMEOUT)  # a reader holds slot of v1
        weights["w"].fill_(2.0)
        assert publisher.publish(weights, version=2) == 2, "the other slot was free"
        chapter.wait_for_version(store, 2, timeout=TIMEOUT)
        weights["w"].fill_(3.0)
        assert publisher.publish(weights, version=3) is None, (
            "v1's slot has a reader and v2's is the latest: publish must skip, not wait and not overwrite"
        )
        assert publisher.skipped == 1 and publisher.version == 2
        store.release.call_one(reader_of_v1.lease).get(timeout=TIMEOUT)
        assert publisher.publish(weights, version=4) == 4, "once the lease is released the slot is free again"
        chapter.wait_for_version(store, 4, timeout=TIMEOUT)
        assert store.stats.call_one().get(timeout=TIMEOUT)["skipped_claims"] == 1
    finally:
        publisher.close()


@pytest.mark.todo("WeightPublisher.publish")
def test_versions_only_increase(chapter, procs):
    store = procs.slice(procs=0).spawn("store_order", chapter.WeightStore)
    weights = {"w": torch.zeros(8)}
    publisher = chapter.WeightPublisher(weights, store)
    try:
        assert publisher.publish(weights, version=5) == 5
        with pytest.raises(ValueError, match="only increase"):
            publisher.publish(weights, version=5)
        with pytest.raises(ValueError, match="only increase"):
            publisher.publish(weights, version=3)
        with pytest.raises(ValueError, match="new WeightPublisher"):
            publisher.publish({"w": torch.zeros(9)}, version=6)
        assert publisher.publish(weights, version=6) == 6, "a refused publish changes nothing"
    finally:
        publisher.close()


# --- TODO 3: SnapshotReader.pull_and_load ---------------------------------------------------------


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_after_a_sync_the_generator_is_bit_equal_to_the_published_version(chapter, weight_sync, transport):
    store, trainer, (gen,) = weight_sync(generators=[(transport, torch.float32)])
    before = gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)
    assert before["version"] is None, "nothing is published yet: a pull finds nothing and loads nothing"
    for _ in range(2):
        step_and_commit(chapter, store, trainer)
        synced = gen.sync.call_one().get(timeout=TIMEOUT)
        published = trainer.fingerprints.call_one().get(timeout=TIMEOUT)
        assert synced["transport"] == transport
        assert synced["fingerprint"] == published[synced["loaded"]], f"v{synced['loaded']} arrived different via {transport}"
    assert synced["loaded"] == 2
    assert gen.sync.call_one().get(timeout=TIMEOUT)["version"] is None, "already at the latest: nothing newer to load"
    assert store.stats.call_one().get(timeout=TIMEOUT)["readers"] == 0, "every lease was released"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_trainer_keeps_stepping_while_a_slow_reader_holds_a_lease(chapter, weight_sync, procs, transport):
    store, trainer, (gen,) = weight_sync(generators=[(transport, torch.float32)])
    gate = procs.slice(procs=0).spawn(f"gate_{transport}", chapter.Gate)
    step_and_commit(chapter, store, trainer)

    events = []
    slow_sync = gen.sync.call_one(gate)  # takes a lease on v1, stops halfway through loading it
    deadline = time.monotonic() + TIMEOUT
    while gate.count.call_one().get(timeout=TIMEOUT) == 0:
        assert time.monotonic() < deadline, "the reader never reached the halfway point"
        time.sleep(0.01)
    events.append("reader holds v1, halfway")
    for _ in range(3):
        version = trainer.step.call_one().get(timeout=TIMEOUT)
        readers = store.stats.call_one().get(timeout=TIMEOUT)["readers"]
        events.append(f"trainer step -> {version} (readers {readers})")
    gate.open.call_one().get(timeout=TIMEOUT)
    result = slow_sync.get(timeout=TIMEOUT)
    events.append(f"reader done with v{result['loaded']}")

    assert events == [
        "reader holds v1, halfway",
        "trainer step -> 2 (readers 1)",  # the free slot takes v2
        "trainer step -> None (readers 1)",  # v1's slot is leased, v2's is latest: skip, don't wait
        "trainer step -> None (readers 1)",
        "reader done with v1",
    ], "the trainer must go on stepping (and skip publishing) while the reader holds its lease"
    published = trainer.fingerprints.call_one().get(timeout=TIMEOUT)
    assert result["fingerprint"] == published[1], "torn read: the slot changed under the reader"
    assert store.stats.call_one().get(timeout=TIMEOUT)["readers"] == 0


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_syncs_racing_training_are_never_torn_and_versions_only_increase(chapter, weight_sync):
    store, trainer, gens = weight_sync(generators=[("shm", torch.float32), ("rdma", torch.float32)])
    seen = {0: [], 1: []}
    for _ in range(8):
        step = trainer.step.call()  # not awaited: the syncs below race it
        for index, gen in enumerate(gens):
            result = gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)
            if result["version"] is not None:
                seen[index].append((result["loaded"], result["fingerprint"]))
        step.get(timeout=TIMEOUT)
    published = trainer.fingerprints.call_one().get(timeout=TIMEOUT)
    for index, loads in seen.items():
        versions = [version for version, _ in loads]
        assert versions == sorted(set(versions)), f"generator {index} saw versions go back or repeat: {versions}"
        for version, fingerprint in loads:
            assert fingerprint == published[version], f"generator {index} loaded a torn v{version}"
    assert sum(len(loads) for loads in seen.values()) >= 2, "the generators should have loaded something"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_the_generator_may_hold_another_dtype(chapter, weight_sync):
    store, trainer, (gen,) = weight_sync(generators=[("rdma", torch.bfloat16)])
    step_and_commit(chapter, store, trainer)
    assert gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)["loaded"] == 1
    theirs = trainer.state.call_one().get(timeout=TIMEOUT)
    ours = gen.state.call_one().get(timeout=TIMEOUT)
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.bfloat16
        assert torch.equal(ours[name], tensor.to(torch.bfloat16)), f"{name} differs from the trainer's, cast to bf16"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hugging_face_qwen2_in_bf16_with_tied_embeddings(chapter, weight_sync, transport):
    store, trainer, (gen,) = weight_sync("qwen2", torch.bfloat16, [(transport, torch.bfloat16)], rdma_chunk_bytes=4096)
    step_and_commit(chapter, store, trainer)
    synced = gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)
    assert synced["fingerprint"] == trainer.fingerprints.call_one().get(timeout=TIMEOUT)[1]
    assert gen.tied_names_share_memory.call_one().get(timeout=TIMEOUT), "embedding and lm_head must stay one tensor"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_a_mismatched_generator_gets_a_clear_error_and_releases_its_lease(chapter, weight_sync, procs):
    store, trainer, _ = weight_sync()
    step_and_commit(chapter, store, trainer)
    wrong = procs.slice(procs=1).spawn("gen_qwen_vs_mlp", chapter.PolicyGenerator, store, "qwen2")
    with pytest.raises(Exception, match="do not match the published ones") as caught:
        wrong.sync.call_one().get(timeout=STARTUP_TIMEOUT)
    assert "same model config" in str(caught.value)
    assert store.stats.call_one().get(timeout=TIMEOUT)["readers"] == 0, "the lease must be released even when loading fails"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_forcing_a_transport_that_is_not_offered_is_a_clear_error(chapter, weight_sync):
    store, trainer, (gen,) = weight_sync(generators=[("cuda_ipc", torch.float32)])
    step_and_commit(chapter, store, trainer)
    with pytest.raises(Exception, match="'cuda_ipc' is not offered"):
        gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)
    assert store.stats.call_one().get(timeout=TIMEOUT)["readers"] == 0


# --- GPU only: pinned staging and CUDA IPC ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("staging, asked, expected", [("cpu", "auto", "shm"), ("cpu", "rdma", "rdma"), ("cuda", "auto", "cuda_ipc")])
def test_gpu_trainer_to_gpu_generator(chapter, procs, staging, asked, expected):
    """Both sides on the one GPU: pinned CPU staging (shm, rdma) or a GPU slot (CUDA IPC)."""
    on_trainer = procs.slice(procs=0)
    name = f"{staging}_{asked}"
    store = on_trainer.spawn(f"store_gpu_{name}", chapter.WeightStore)
    trainer = on_trainer.spawn(f"trainer_gpu_{name}", chapter.PolicyTrainer, store, "qwen2", torch.bfloat16,
                               staging, 64 * 2**20, "cuda")
    gen = procs.slice(procs=1).spawn(f"gen_gpu_{name}", chapter.PolicyGenerator, store, "qwen2", torch.bfloat16,
                                     asked, "cuda")
    try:
        step_and_commit(chapter, store, trainer)
        synced = gen.sync.call_one().get(timeout=STARTUP_TIMEOUT)
        assert synced["transport"] == expected, "auto picks the fastest path that works from here"
        assert synced["fingerprint"] == trainer.fingerprints.call_one().get(timeout=TIMEOUT)[1]
        if staging == "cpu":
            assert all(trainer.publisher_stats.call_one().get(timeout=TIMEOUT)["pinned"]), "CPU slots must be pinned"
    finally:
        trainer.close.call_one().get(timeout=TIMEOUT)
