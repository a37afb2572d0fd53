"""Timeouts the chapter tests share.

Every wait on Monarch in a test has a timeout, so a stub that never answers
fails the test instead of hanging it. The values are generous because CI
machines are small and busy; they bound a hang, they do not measure speed.
Set $KOANS_TIMEOUT to scale them (e.g. KOANS_TIMEOUT=5 for quick hang checks).
"""

import os

#: Seconds to wait for one reply from an actor that is already running.
TIMEOUT = float(os.environ.get("KOANS_TIMEOUT", "20"))

#: Seconds for a first call on new processes, which may still be importing torch.
STARTUP_TIMEOUT = 2 * TIMEOUT
