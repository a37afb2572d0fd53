"""Chapter modules, chNN_<topic>.py; files named chNN_plumbing.py are given code you may skip.
Start with docs/00_overview.md."""

import os

# Notice a dead process within about a second instead of Monarch's default ten (chapter 05).
# Monarch reads this once, when a process first imports it, so it is set here, before any
# chapter module imports Monarch.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")
