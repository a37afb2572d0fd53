"""Chapter 03: RDMA transfer. Run: pytest tests/test_ch03_rdma_transfer.py"""

import asyncio

import pytest
import torch

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT, checking, starts_apart

SMALL = 4096  # elements: big enough to be more than one packet, small enough to be quick


@pytest.fixture
def procs(shared_procs):
    """Shared across tests; replaced by a fresh mesh if an earlier test broke it."""
    return shared_procs(procs=2)


@pytest.fixture
def owner_and_reader(chapter, procs, test_tag):
    """An owner on procs=0 and a reader on procs=1, sized SMALL, float32."""
    owner = procs.slice(procs=0).spawn(f"owner_{test_tag}", chapter.TensorOwner, SMALL)
    reader = procs.slice(procs=1).spawn(f"reader_{test_tag}", chapter.Reader, SMALL)
    return owner, reader


def _which_rule_answered(raised, expected, rules, messages):
    """Say which rule's message was raised, and, when the input breaks several, why the expected one comes first."""
    broken = [name for name, is_broken in rules if is_broken]
    order = ", then ".join(name for name, _ in rules)
    got = next((f"the {name}() message" for name, text in messages.items() if text == raised),
               "a message that is none of the chapter's")
    if len(broken) > 1:
        return (f"this input breaks {len(broken)} rules ({', '.join(broken)}); the TODO checks them in the order "
                f"{order}, so the first one broken, {expected}(), must answer. It raised {got}: check the rules "
                f"in the TODO's order, and that the {expected}() rule refuses this input")
    return f"this input breaks one rule, {expected}(): expected its message, but it raised {got}"


# --- TODO 1: expose --------------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - a handle carries the buffer, dtype and element count, and is tiny next to the payload
#       -> test_the_handle_is_tiny_next_to_the_payload
#   - refuses, in order: not a tensor (TypeError), not 1-D, not contiguous, empty (ValueError), each with its message
#       -> test_expose_refuses_what_rdma_cannot_point_at_by_the_right_rule
#   - refuses nothing else: contiguous is torch's is_contiguous(), so a one-element view with any stride, or a
#     view that starts inside its storage, is exposed; a Tensor subclass (nn.Parameter) is a tensor
#       -> test_expose_takes_every_flat_contiguous_tensor
#   - points at the tensor's own memory, so a reader sees later in-place updates
#       -> test_a_reread_sees_in_place_updates, test_a_flat_view_of_a_matrix_shares_its_memory_with_the_reader


@pytest.mark.todo("expose")
def test_the_handle_is_tiny_next_to_the_payload(chapter, procs):
    numel = 16 * 1024 * 1024  # 64 MiB of float32
    owner = procs.slice(procs=0).spawn("big_owner", chapter.TensorOwner, numel)
    handle = owner.handle.call_one().get(timeout=STARTUP_TIMEOUT)
    assert isinstance(handle, chapter.TensorHandle), (
        f"the owner's handle is a {type(handle).__name__}, not a TensorHandle: expose answers a TensorHandle that "
        "carries the buffer, the dtype and the element count")
    assert (handle.numel, handle.dtype, handle.nbytes) == (numel, torch.float32, 64 * 2**20), (
        f"the handle to {numel} float32 elements (64 MiB) says numel {handle.numel!r}, dtype {handle.dtype!r}: a "
        "handle carries the exposed tensor's own dtype and element count")
    size = chapter.message_bytes(handle)
    assert size < 1024, f"a handle to 64 MiB should pickle to well under 1 KiB, got {size} bytes"


@pytest.mark.todo("expose")
@pytest.mark.parametrize(
    "bad, error, message",
    [
        (torch.zeros(4, 8), ValueError, "not_flat"),
        (torch.tensor(3.0), ValueError, "not_flat"),  # 0-D: not 1-D either
        (torch.zeros(4, 8).t(), ValueError, "not_flat"),  # 2-D and strided: the 1-D rule comes first
        (torch.zeros(0, 3), ValueError, "not_flat"),  # 2-D and empty: likewise
        (torch.zeros(16)[::2], ValueError, "not_contiguous"),
        (torch.zeros(0), ValueError, "empty_tensor"),
        # 1-D and empty, but sparse: torch never calls a sparse tensor contiguous, so that rule answers first
        (torch.zeros(0).to_sparse(), ValueError, "not_contiguous"),
        ([1.0, 2.0], TypeError, "not_a_tensor"),
    ],
    ids=["2-D", "0-D", "2-D-strided", "2-D-empty", "strided", "empty", "sparse-empty", "list"],
)
def test_expose_refuses_what_rdma_cannot_point_at_by_the_right_rule(chapter, bad, error, message):
    shown = "a list" if isinstance(bad, list) else f"a tensor of shape {tuple(bad.shape)}, stride {bad.stride()}"
    try:
        with pytest.raises(error) as caught:
            chapter.expose(bad)
    except pytest.fail.Exception:
        pytest.fail(f"expose({shown}) raised nothing: this rule raises {error.__name__} with the {message}() message")
    except Exception as other:
        pytest.fail(f"expose({shown}) raised {type(other).__name__}: {other}; this rule raises {error.__name__} "
                    f"with the {message}() message")
    rules = [("not_a_tensor", not isinstance(bad, torch.Tensor))]
    if isinstance(bad, torch.Tensor):
        rules += [("not_flat", bad.dim() != 1), ("not_contiguous", not bad.is_contiguous()),
                  ("empty_tensor", bad.numel() == 0)]
    messages = {name: getattr(chapter, name)(bad) for name, _ in rules}
    assert str(caught.value) == messages[message], _which_rule_answered(str(caught.value), message, rules, messages)


@pytest.mark.todo("expose")
@pytest.mark.parametrize(
    "view", [torch.arange(16.0)[5:6:4], torch.arange(16.0)[3:9], torch.nn.Parameter(torch.zeros(4))],
    ids=["one-element-stride-4", "offset-view", "parameter"])
def test_expose_takes_every_flat_contiguous_tensor(chapter, view):
    assert view.is_contiguous(), (
        f"the test's own input, shape {tuple(view.shape)}, stride {view.stride()}, is not one torch calls contiguous: "
        "this check runs none of your code")
    try:
        handle = chapter.expose(view)
    except (ValueError, TypeError) as err:
        pytest.fail(f"expose refused a 1-D {type(view).__name__} that torch calls contiguous (shape "
                    f"{tuple(view.shape)}, stride {view.stride()}): {err}. Refuse nothing else: any torch.Tensor is "
                    "a tensor (a subclass such as nn.Parameter too), and contiguous is what tensor.is_contiguous() "
                    "says (a one-element view's stride says nothing about its layout)")
    assert (handle.numel, handle.dtype) == (view.numel(), view.dtype), (
        f"expose of a 1-D {type(view).__name__} of {view.numel()} {view.dtype} gave a handle saying numel "
        f"{handle.numel!r}, dtype {handle.dtype!r}: a handle carries the exposed tensor's own dtype and element count")


# --- TODO 2: pull_into -----------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the remote bytes arrive equal, for every dtype
#       -> test_the_bytes_arrive_equal, test_the_client_can_pull_too
#   - fills the caller's destination and returns that same tensor
#       -> test_the_client_can_pull_too
#   - refuses, in order: another dtype (even of the same item size), not 1-D (0-D too) or not contiguous, another
#     count
#       -> test_pull_into_refuses_a_wrong_destination_by_the_right_rule
#   - refuses nothing else: contiguous is torch's is_contiguous(), so a one-element view with any stride is taken
#       -> test_pull_into_takes_every_flat_contiguous_destination
#   - the caller's `timeout` is the read's own (passed to read_into, not its default)
#       -> test_pull_into_waits_at_most_the_callers_timeout
#   - a read that times out raises TimeoutError to the caller (no stale destination returned)
#       -> test_pull_into_waits_at_most_the_callers_timeout


@pytest.mark.todo("pull_into")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8], ids=str)
def test_the_bytes_arrive_equal(chapter, procs, dtype):
    kind = str(dtype).removeprefix("torch.")
    owner = procs.slice(procs=0).spawn(f"owner_{kind}", chapter.TensorOwner, SMALL, dtype, 7)
    reader = procs.slice(procs=1).spawn(f"reader_{kind}", chapter.Reader, SMALL, dtype)
    handle = owner.handle.call_one().get(timeout=STARTUP_TIMEOUT)
    owners = owner.fingerprint.call_one().get(timeout=TIMEOUT)  # before the read: a read never changes the owner
    pulled = reader.pull.call_one(handle).get(timeout=TIMEOUT)
    assert owner.fingerprint.call_one().get(timeout=TIMEOUT) == owners, (
        "the owner's memory changed during the pull: pull_into reads the remote memory into the destination "
        "(read_into), it never writes the destination into it")
    assert pulled == owners, (
        f"the {kind} bytes the reader holds differ from the owner's: when pull_into returns, the read into "
        "`destination` itself must be done (awaited)")


@pytest.mark.todo("pull_into")
def test_the_client_can_pull_too(chapter, owner_and_reader):
    owner, _ = owner_and_reader
    handle = owner.handle.call_one().get(timeout=STARTUP_TIMEOUT)
    owners = owner.fingerprint.call_one().get(timeout=TIMEOUT)
    destination = torch.full((SMALL,), float("nan"))
    returned = asyncio.run(chapter.pull_into(handle, destination, timeout=int(TIMEOUT)))
    assert returned is destination, "pull_into fills the caller's tensor and returns it (no new allocation)"
    assert chapter.fingerprint(destination) == owners == owner.fingerprint.call_one().get(timeout=TIMEOUT), (
        "the destination must hold the owner's bytes, and the owner's stay as they were: a read, not a write")


@pytest.mark.todo("expose", "pull_into")
def test_a_reread_sees_in_place_updates(owner_and_reader):
    owner, reader = owner_and_reader
    handle = owner.handle.call_one().get(timeout=STARTUP_TIMEOUT)
    before = reader.pull.call_one(handle).get(timeout=TIMEOUT)
    after_update = owner.add_.call_one(1.0).get(timeout=TIMEOUT)
    assert after_update != before, (
        f"the reader's first pull, made before the owner's in-place add_(1.0), already matches the updated tensor "
        f"(fingerprint {before!r}): a pull must hold the owner's bytes as they were when it read")
    with checking("expose"):
        assert reader.pull.call_one(handle).get(timeout=TIMEOUT) == after_update, (
            "the same handle, read again, must show the owner's memory as it is now: expose must register "
            "the tensor's own memory, not a copy of it"
        )


@pytest.mark.todo("pull_into")
@pytest.mark.parametrize(
    "destination, message",
    [
        (torch.empty(8, dtype=torch.float16), "wrong_dtype"),
        (torch.empty(8, dtype=torch.int32), "wrong_dtype"),  # as many bytes per item, yet another dtype
        (torch.empty(7, dtype=torch.float16), "wrong_dtype"),  # dtype and count wrong: dtype comes first
        (torch.empty(2, 4, dtype=torch.float16), "wrong_dtype"),  # dtype and layout wrong: dtype comes first
        (torch.empty(2, 4), "wrong_layout"),
        (torch.empty(2, 3), "wrong_layout"),  # 2-D and the wrong count: the layout rule comes first
        (torch.empty(16)[::2], "wrong_layout"),
        (torch.empty(()), "wrong_layout"),  # 0-D: not 1-D either (and the wrong count: the layout rule comes first)
        (torch.empty(7), "wrong_count"),
        (torch.empty(9), "wrong_count"),  # bigger is refused too: the chapter wants exactly the handle's size
    ],
    ids=["dtype", "dtype-same-itemsize", "dtype-and-count", "dtype-and-layout", "2-D", "2-D-and-count", "strided",
         "0-D", "short", "long"],
)
def test_pull_into_refuses_a_wrong_destination_by_the_right_rule(chapter, destination, message):
    handle = chapter.expose(torch.arange(8, dtype=torch.float32))
    try:
        with pytest.raises(ValueError) as caught:
            asyncio.run(chapter.pull_into(handle, destination, timeout=int(TIMEOUT)))
    except pytest.fail.Exception:
        pytest.fail(f"pull_into accepted a {destination.dtype} destination of shape {tuple(destination.shape)}, "
                    f"stride {destination.stride()}, for a handle of 8 float32: refuse it (ValueError) with the "
                    f"{message}() message")
    rules = [("wrong_dtype", destination.dtype != handle.dtype),
             ("wrong_layout", destination.dim() != 1 or not destination.is_contiguous()),
             ("wrong_count", destination.numel() != handle.numel)]
    messages = {name: getattr(chapter, name)(destination, handle) for name, _ in rules}
    assert str(caught.value) == messages[message], _which_rule_answered(str(caught.value), message, rules, messages)


class CopyingBuffer:
    """Stands in for an RDMABuffer, in this process: a read copies its data into the destination."""

    def __init__(self, data: torch.Tensor):
        self.data = data

    def read_into(self, destination, *, timeout=60):
        async def read():
            destination.copy_(self.data)

        return read()


@pytest.mark.todo("pull_into")
@pytest.mark.parametrize(
    "destination", [torch.full((16,), -1.0)[5:6:4], torch.full((16,), -1.0)[3:4]],
    ids=["one-element-stride-4", "view-inside-its-storage"],
)
def test_pull_into_takes_every_flat_contiguous_destination(chapter, destination):
    handle = chapter.TensorHandle(CopyingBuffer(torch.tensor([7.0])), torch.float32, 1)
    assert starts_apart(destination, [7.0]), "the test's own premise: the destination starts unlike the sender"
    try:
        result = asyncio.run(asyncio.wait_for(chapter.pull_into(handle, destination, timeout=5), 10))
    except ValueError as refused:
        raise AssertionError(
            f"pull_into refused a 1-D destination of one float32, stride {destination.stride()}, that torch calls "
            f"contiguous (is_contiguous() is {destination.is_contiguous()}). Refuse only what torch judges not "
            f"contiguous: a one-element tensor is, whatever its stride. (Its message: {refused})") from refused
    assert result is destination and destination.tolist() == [7.0], (
        f"pull_into answered {result!r}, destination {destination.tolist()}: it reads into the destination itself "
        "and returns it")


class SlowBuffer:
    """Stands in for an RDMABuffer whose remote end never answers: a read gives up after its own timeout,
    as Monarch's does (a TimeoutError)."""

    def __init__(self):
        self.timeouts = []

    def read_into(self, destination, *, timeout=60):
        self.timeouts.append(timeout)

        async def read():
            await asyncio.sleep(timeout)
            raise TimeoutError(f"read_into gave up after {timeout} s")

        return read()


@pytest.mark.todo("pull_into")
def test_pull_into_waits_at_most_the_callers_timeout(chapter):
    handle = chapter.TensorHandle(SlowBuffer(), torch.float32, 8)

    async def pull() -> str:
        try:
            await chapter.pull_into(handle, torch.empty(8), timeout=1)
        except TimeoutError:
            return "gave up"
        return "read"

    try:
        outcome = asyncio.run(asyncio.wait_for(pull(), 10))
    except TimeoutError:
        outcome = "still waiting after 10 s"
    asked = handle.buffer.timeouts
    assert asked, f"pull_into(..., timeout=1) never called read_into on the handle's buffer ({outcome})"
    assert asked == [1], (
        f"read_into was asked to wait {asked[0]} s, but the caller gave timeout=1. The caller's timeout is the read's "
        "own: hand it to read_into, which ends the read itself (not its default, and not a wait_for around it)")
    assert outcome == "gave up", (
        f"the read gave up after the caller's 1 s, yet pull_into {'returned' if outcome == 'read' else outcome}: "
        "let read_into's TimeoutError reach the caller, who must not mistake a stale destination for fresh bytes")


@pytest.mark.todo("expose", "pull_into")
def test_a_flat_view_of_a_matrix_shares_its_memory_with_the_reader(chapter, procs, test_tag):
    matrix = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    handle = chapter.expose(matrix.view(-1))
    assert (handle.numel, handle.dtype, handle.nbytes) == (12, torch.float64, 96), (
        f"expose(matrix.view(-1)), 12 float64, gave a handle saying numel {handle.numel!r}, dtype {handle.dtype!r}: "
        "a handle carries the exposed tensor's own dtype and element count")
    reader = procs.slice(procs=1).spawn(f"reader_{test_tag}", chapter.Reader, 12, torch.float64)
    assert reader.pull.call_one(handle).get(timeout=STARTUP_TIMEOUT) == chapter.fingerprint(matrix), (
        "the reader's first pull of the flat view of a 3x4 float64 matrix does not hold the matrix's bytes: either "
        "expose does not point at the tensor's own memory, or pull_into returns before the read into `destination` "
        "itself is done (awaited)")
    matrix[1, 2] = -1.0  # change the matrix in place, here in the owner's process
    assert reader.pull.call_one(handle).get(timeout=TIMEOUT) == chapter.fingerprint(matrix), (
        "the reader must see the change: the handle points at the matrix's own memory, not at a copy"
    )


# --- TODO 3: TensorOwner.send_copy -----------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the reply is the tensor itself: every byte in the message
#       -> test_a_message_carries_every_byte
#   - itself, in its own dtype: no conversion on the way
#       -> test_a_copy_keeps_the_owners_dtype
#   - a copy is a snapshot: later updates do not reach it, while a handle sees them; a copy sent later
#     carries the tensor as it is then
#       -> test_a_copy_is_a_snapshot_and_a_handle_is_a_pointer


@pytest.mark.todo("TensorOwner.send_copy")
def test_a_message_carries_every_byte(chapter, owner_and_reader):
    owner, _ = owner_and_reader
    copy = owner.send_copy.call_one().get(timeout=STARTUP_TIMEOUT)
    assert isinstance(copy, torch.Tensor) and copy.shape == (SMALL,), (
        f"send_copy answered a {type(copy).__name__}: answer the owner's torch.Tensor itself, shape ({SMALL},)")
    assert chapter.fingerprint(copy) == owner.fingerprint.call_one().get(timeout=TIMEOUT), (
        "the copy send_copy answered does not hold the owner's bytes: answer the owner's tensor itself, every byte "
        "in the message")
    handle = owner.handle.call_one().get(timeout=TIMEOUT)
    assert chapter.message_bytes(copy) >= SMALL * 4 > chapter.message_bytes(handle), (
        "the copy pickles every byte; the handle does not"
    )


@pytest.mark.todo("TensorOwner.send_copy")
def test_a_copy_keeps_the_owners_dtype(chapter, procs, test_tag):
    owner = procs.slice(procs=0).spawn(f"bf16_owner_{test_tag}", chapter.TensorOwner, 8, torch.bfloat16)
    copy = owner.send_copy.call_one().get(timeout=STARTUP_TIMEOUT)
    assert isinstance(copy, torch.Tensor) and copy.dtype == torch.bfloat16, (
        f"the owner holds bfloat16 and the copy arrived as {getattr(copy, 'dtype', type(copy).__name__)}: "
        "send the tensor itself, with no conversion")
    assert chapter.fingerprint(copy) == owner.fingerprint.call_one().get(timeout=TIMEOUT), "the same bytes"


@pytest.mark.todo("TensorOwner.send_copy")
def test_a_copy_is_a_snapshot_and_a_handle_is_a_pointer(chapter, owner_and_reader):
    owner, reader = owner_and_reader
    handle = owner.handle.call_one().get(timeout=STARTUP_TIMEOUT)
    copy = owner.send_copy.call_one().get(timeout=TIMEOUT)
    updated = owner.add_.call_one(2.5).get(timeout=TIMEOUT)
    assert chapter.fingerprint(copy) != updated, "the copy was taken before the update and does not change"
    assert reader.pull.call_one(handle).get(timeout=TIMEOUT) == updated, "the handle reads the memory as it is now"
    again = owner.send_copy.call_one().get(timeout=TIMEOUT)
    assert chapter.fingerprint(again) == updated, (
        "a copy sent after the update carries the tensor as it is now: send the tensor itself each time, never a "
        "copy kept from before")
