"""What the course is: its chapters, their TODOs and hints, and what this checkout holds.

Used by everyone (the runner, the tests' plumbing, the grader, the benchmarks, the maintainers' tools).
Imports nothing else of koans, and nothing heavy (no Monarch, no torch), so it is cheap to import.

  manifest      the chapters, in learning order; PROJECT_ROOT
  hints         progressive hints, per TODO
  todos         the TODO regions of a solution file, and the stub text made from them
  edition_data  what this checkout holds: the course repository, or a student edition (koans/edition.json)
  depth         the workshop's depth (stretch TODOs given as code) and self-study's
  model         the time model: `python -m koans.course.model [--update | --fit]`
"""
