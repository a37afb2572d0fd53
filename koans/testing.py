"""What the chapter tests share: timeouts, naming the TODO an assertion checks, and stand-in actors.

Every wait on Monarch in a test has a timeout, so a stub that never answers
fails the test instead of hanging it. The values are generous because CI
machines are small and busy; they bound a hang, they do not measure speed.
Set $KOANS_TIMEOUT to scale them (e.g. KOANS_TIMEOUT=5 for quick hang checks).
"""

import asyncio
import contextlib
import os
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


class _StandInReply:
    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __await__(self):
        if self.fn is NEVER:
            yield from asyncio.get_running_loop().create_future().__await__()  # nobody ever sets it
        yield from asyncio.sleep(0).__await__()
        return self.fn(*self.args, **self.kwargs)

    def get(self, timeout=None):
        if self.fn is NEVER:
            if timeout is None:
                raise AssertionError("waited with no timeout for a call that never answers: that would hang forever")
            time.sleep(timeout)
            raise TimeoutError(f"no answer within {timeout} s")
        return self.fn(*self.args, **self.kwargs)
