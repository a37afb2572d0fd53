"""Monarch names this project uses that Monarch does not export publicly yet, in one place.

Chapters and tests import them from here, so a Monarch upgrade that moves one changes one line.
Check a new release with `.ci/try-monarch VERSION` (docs/appendix/monarch.md).
"""

# What a caller gets when the process behind a call dies (a RuntimeError). Neither 0.7.0 nor the
# 0.8 nightlies export it from monarch.actor.
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

# The meshes Monarch spawns by itself on every process it starts: 0.7.0 has "logger-..."; the 0.8
# nightlies add "log_level-..." (_LogLevelSetter). They fail whenever their process dies, so a pool
# that kills its own processes expects their failures too (chapter 06's given ReplicaPool).
MONARCH_PROCESS_MESHES = ("logger", "log_level")

# A mesh's name, as failures report it, is the name it was spawned with cut to this many characters,
# then "-" and a unique suffix (0.7.0).
MESH_NAME_LIMIT = 63

__all__ = ["MESH_NAME_LIMIT", "MONARCH_PROCESS_MESHES", "SupervisionError"]
