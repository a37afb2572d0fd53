"""What the chapter tests share: timeouts, naming the TODO an assertion checks, and stand-in actors.

Every wait on Monarch in a test has a timeout, so a stub that never answers
fails the test instead of hanging it. The values are generous because CI
machines are small and busy; they bound a hang, they do not measure speed.
Set $KOANS_TIMEOUT to scale them (e.g. KOANS_TIMEOUT=5 for quick hang checks).
"""

import asyncio
import contextlib
import os
import threading
import time

#: Seconds to wait for one reply from an actor that is already running.
TIMEOUT = float(os.environ.get("KOANS_TIMEOUT", "20"))

#: Seconds for a first call on new processes, which may still be importing torch.
STARTUP_TIMEOUT = 2 * TIMEOUT


@contextlib.contextmanager
def checking(todo: str, hint: int | None = None):
    """A failure inside is about TODO `todo` (and its hint number `hint`, 1-based, fits it best).

    For a test marked with several TODOs: the failure message, the "Look at" line
    and the runner's hint then name the TODO whose contract this part checks.

        with checking("ReplayBuffer.put", hint=3):
            assert woke, "put must wake a waiting sample"
    """
    try:
        yield
    except BaseException as err:
        if not getattr(err, "koans_todos", None):
            err.koans_todos, err.koans_hint = (todo,), hint
        raise


def small_grpo_config(chapter, **changes):
    """Chapter 10's RunConfig, as small as a test of the whole trainer needs: the tiny offline policy,
    2 generators, 6 steps of 2 groups of 4 short responses, max lag 1."""
    options = dict(model=None, steps=6, groups_per_step=2, group_size=4, max_new_tokens=6, generators=2,
                   max_lag=1, seed=0)
    options.update(changes)
    return chapter.RunConfig(**options)


#: An endpoint of a StandIn given as NEVER never answers (a hung or dead actor, as its caller sees it).
NEVER = "never answers"


class StandIn:
    """Stands in for an actor, in this process: each keyword is one of its endpoints.

        store = StandIn(acquire=lambda newer_than: None, claim=NEVER)
        await store.acquire.call_one(3)        # None; store.acquire.calls == [(3,)]
        store.claim.call_one().get(timeout=1)  # TimeoutError after 1 s: it never answers

    A call answers fn(*args) (or raises what fn raises). Like a Monarch Future it can be
    awaited (it answers after one turn of the event loop, so other tasks run meanwhile) or
    waited on with `.get(timeout=...)`.
    """

    def __init__(self, **endpoints):
        for name, fn in endpoints.items():
            setattr(self, name, _StandInEndpoint(fn))


class _StandInEndpoint:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def call_one(self, *args, **kwargs):
        self.calls.append(args)
        return _StandInReply(self.fn, args, kwargs)

    def choose(self, *args, **kwargs):
        """One actor of the mesh, picked by Monarch: a stand-in is one actor, so the same as call_one."""
        return self.call_one(*args, **kwargs)


class _StandInReply:
    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __await__(self):
        if self.fn is NEVER:
            yield from asyncio.get_running_loop().create_future().__await__()  # nobody ever sets it
        yield from asyncio.sleep(0).__await__()
        return self.fn(*self.args, **self.kwargs)

    def as_asyncio(self) -> asyncio.Future:
        """Like a Monarch Future's: an asyncio future of the same reply, on the running loop."""
        async def reply():
            return await self

        return asyncio.ensure_future(reply())

    def get(self, timeout=None):
        if self.fn is NEVER:
            if timeout is None:
                raise AssertionError("waited with no timeout for a call that never answers: that would hang forever")
            time.sleep(timeout)
            raise TimeoutError(f"no answer within {timeout} s")
        return self.fn(*self.args, **self.kwargs)


class AwaitedStandIn(StandIn):
    """A StandIn whose calls must be awaited: `.get()` on one fails the test.

    Inside async code a blocking `.get()` stops the whole event loop until the reply comes (Monarch
    only warns): every other task on that loop, a trainer's next step say, freezes meanwhile.
    A real actor answers such a call anyway, so only a stand-in that refuses it can show the mistake.
    """

    def __init__(self, **endpoints):
        for name, fn in endpoints.items():
            setattr(self, name, _AwaitedEndpoint(fn, name))


class _AwaitedEndpoint(_StandInEndpoint):
    def __init__(self, fn, name):
        super().__init__(fn)
        self.name = name

    def call_one(self, *args, **kwargs):
        self.calls.append(args)
        return _AwaitedReply(self.fn, args, kwargs, self.name)


class _AwaitedReply(_StandInReply):
    def __init__(self, fn, args, kwargs, name):
        super().__init__(fn, args, kwargs)
        self.name = name

    def get(self, timeout=None):
        raise AssertionError(
            f"a blocking .get() on {self.name}(...) inside async code: it stops the event loop until the reply "
            "comes, and every other task on that loop freezes meanwhile. Await the call (with a timeout) instead")


class StuckForever(AssertionError):
    """run_on_virtual_clock: every task waits, and no timer is set that could ever wake one."""


class _VirtualSelector:
    """Wraps an event loop's selector: never sleeps; when nothing is ready, moves the loop's clock on instead."""

    def __init__(self, real, loop):
        self._real, self._loop = real, loop

    def select(self, timeout=None):
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only another thread could still wake a task (give it a while)
            events = self._real.select(5.0)
            if events:
                return events
            raise StuckForever("every task waits, and no timer is set that could wake one: something was awaited "
                               "with no timeout on a call that never answers")
        self._loop.virtual_now += timeout
        if self._loop.virtual_now > self._loop.virtual_limit:
            raise StuckForever(f"still waiting after {self._loop.virtual_limit:g} virtual seconds")
        return events

    def __getattr__(self, name):
        return getattr(self._real, name)


class _VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self, limit_s: float):
        super().__init__()
        self.virtual_now, self.virtual_limit = 0.0, limit_s
        self._selector = _VirtualSelector(self._selector, self)

    def time(self) -> float:
        return self.virtual_now


def run_on_virtual_clock(main, limit_s: float = 3600.0):
    """Run coroutine `main` on an event loop whose clock is virtual, and answer its result.

    The clock starts at 0 and stands still while tasks run; when every task waits, it jumps at once to
    the next timer (a sleep, a timeout). So timeouts fire exactly, in order, and cost no real time:
    `asyncio.get_running_loop().time()` says when something happened. For code that waits on asyncio
    alone (stand-ins in this process, no Monarch): a thread's work is waited for only while no timer is
    set. A wait that no timer can ever end (an await with no timeout on a call that never answers)
    raises StuckForever instead of hanging. On the loop's own thread, `time.monotonic()` and `time.time()`
    move with the virtual clock too, so a deadline kept with either and awaited as a timeout
    (`wait_for(..., deadline - time.monotonic())`) fires here as on a real clock. (A deadline only polled
    between `sleep(0)`s never passes here: the clock stands still while tasks run.)
    """
    loop = _VirtualClockLoop(limit_s)
    try:
        with _clocks_follow(loop):
            return loop.run_until_complete(main)
    finally:
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                with _clocks_follow(loop):
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        except StuckForever:
            pass
        finally:
            loop.close()


@contextlib.contextmanager
def _clocks_follow(loop: "_VirtualClockLoop"):
    """time.monotonic() and time.time(), read on this thread, start where they are and move only with the
    loop's virtual clock; other threads (a stand-in's worker, Monarch's) read the real ones."""
    real_monotonic, real_time = time.monotonic, time.time
    thread = threading.get_ident()
    monotonic_at_0, time_at_0 = real_monotonic() - loop.virtual_now, real_time() - loop.virtual_now

    def virtual_monotonic() -> float:
        return monotonic_at_0 + loop.virtual_now if threading.get_ident() == thread else real_monotonic()

    def virtual_time() -> float:
        return time_at_0 + loop.virtual_now if threading.get_ident() == thread else real_time()

    time.monotonic, time.time = virtual_monotonic, virtual_time
    try:
        yield
    finally:
        time.monotonic, time.time = real_monotonic, real_time


def starts_apart(receiver, sender) -> bool:
    """True when `receiver` differs from `sender` at every position a transfer test compares (NaN differs from
    everything). A green run is not a transfer: a receiver that already held the sender's values would pass a
    transfer that moved nothing, so a transfer test checks this before the transfer."""
    import torch

    receiver, sender = torch.as_tensor(receiver), torch.as_tensor(sender)
    return receiver.shape == sender.shape and bool((receiver.double() != sender.double()).all())


def backward(loss, what: str = "logps") -> None:
    """loss.backward(), where a loss cut off from its inputs fails with a sentence, not PyTorch's bare RuntimeError."""
    try:
        loss.backward()
    except RuntimeError as err:
        if "does not require grad" not in str(err):
            raise
        raise AssertionError(
            f"the loss carries no gradient back to {what} ({err}): it must be computed from {what} as given; a "
            ".detach(), a torch.no_grad() block or a .item() on the way cuts the gradient off") from None
