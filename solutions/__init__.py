"""Chapter modules, chNN_<topic>.py; files named chNN_plumbing.py are given code you may skip.
Start with docs/00_overview.md."""

import os

# Notice a dead process within about a second instead of Monarch's default ten (chapter 05).
# Monarch reads this once, when a process first imports it, so it is set here, before any
# chapter module imports Monarch.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

# Without an RDMA card, Monarch's RDMA falls back to TCP. There, cutting each read into pieces of
# 4 MB made a single read about 1.1x faster than Monarch's default on a 2-core machine, and reads
# issued together 1.3-1.6x (docs/appendix/benchmarks.md). With an RDMA card, Monarch's default stands.
if not (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")):
    os.environ.setdefault("MONARCH_RDMA_MAX_CHUNK_SIZE_MB", "4")
