"""The learner's: the `koans` runner's commands, and what the chapters' demos use.

Used by koans/cli.py, the chapters' code (demo, report, timeline, viz) and koans verify (show).
May import koans.course and koans.testkit; never koans.grading, koans.bench or koans.maintain.

  runner     runs one chapter's tests in a pytest subprocess and reads back the results
  state      .koans/state.json: results, hints shown, resets, depth
  syntax     syntax errors, before pytest
  show       reporting a run: counts, the first failure, the hint
  check      koans check, koans (walking the track), koans list
  hint, watch, reset, workshop   the commands of those names
  demo       runs a chapter's demo, pointing at unwritten TODOs
  report, timeline, viz   the demos' charts, timelines and `koans viz` (viz_page.html)
"""
