"""The koans runner and test plumbing: nothing in here is an exercise.

  manifest   the chapters, their files and hints
  stubgen    writes exercises/ from the TODO regions of solutions/
  harness    what conftest.py uses: code under test, Monarch hygiene, failure notes
  testing    timeouts the chapter tests share
  runner     runs a chapter's tests in a subprocess (for the CLI and verify)
  results    per-test JSON written by pytest for the runner
  cli        the `koans` command
  verify     `koans verify`: every chapter gates its TODOs
  demo       runs a chapter demo, pointing at unwritten TODOs
  timeline   per-actor spans: ASCII lanes, busy fractions, Chrome trace JSON
  bench_weight_sync   the chapter 07 benchmark (staged vs blocking weight sync)
"""
