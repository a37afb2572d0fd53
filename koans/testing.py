"""What the chapter tests share: timeouts, and naming the TODO an assertion checks.

Every wait on Monarch in a test has a timeout, so a stub that never answers
fails the test instead of hanging it. The values are generous because CI
machines are small and busy; they bound a hang, they do not measure speed.
Set $KOANS_TIMEOUT to scale them (e.g. KOANS_TIMEOUT=5 for quick hang checks).
"""

import contextlib
import os

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
