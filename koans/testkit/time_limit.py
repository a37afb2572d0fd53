"""Time limits: a test body's (a backstop for waits with no timeout of their own) and a chapter's run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

#: Seconds a chapter's whole test run may take in the runner and in the grader ($KOANS_CHAPTER_TIME_LIMIT).
CHAPTER_TIME_LIMIT_S = float(os.environ.get("KOANS_CHAPTER_TIME_LIMIT", "600"))


class TestTimeLimit(TimeoutError):
    """A test ran past its time limit: something in it waited without a timeout."""


TIME_LIMIT_REPEAT_S = 2.0  # see expire() below


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TestTimeLimit in this (main) thread if the block runs past `seconds`.

    A backstop for waits that have no timeout of their own, such as a
    `.get()` in a learner's code. SIGALRM interrupts Monarch's waits too.
    """
    if seconds <= 0 or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    message = f"the test ran past its {seconds:g} s time limit and was stopped"
    alarms = 0

    def expire(signum, frame):
        # asyncio logs and drops an exception raised inside one of its callbacks, and goes on
        # running. So the alarm repeats while the block runs, and from the second one on it
        # also stops the event loop this thread is running, if any.
        nonlocal alarms
        alarms += 1
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_REPEAT_S)
        if alarms > 1:
            with contextlib.suppress(RuntimeError):  # no loop running here
                asyncio.get_running_loop().stop()
        raise TestTimeLimit(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Exception as error:
        if alarms and not isinstance(error, TestTimeLimit):  # e.g. "Event loop stopped before Future completed"
            raise TestTimeLimit(message).with_traceback(error.__traceback__) from error
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
