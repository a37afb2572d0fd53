"""The koans runner and test plumbing: nothing in here is an exercise.

  manifest   the chapters, their files and hints
  stubgen    writes exercises/ from the TODO regions of solutions/
  harness    what conftest.py uses: code under test, Monarch hygiene, failure notes
  testing    timeouts the chapter tests share
  forkserver the tests' Monarch processes, forked from a warm Python instead of started cold
  runner     runs a chapter's tests in a subprocess (for the CLI and verify)
  results    per-test JSON written by pytest for the runner
  cli        the `koans` command
  verify     `koans verify`: every chapter gates its TODOs
  demo       runs a chapter demo, pointing at unwritten TODOs
  timeline   per-actor spans: ASCII lanes, busy fractions, Chrome trace JSON
  bench_weight_sync   the chapter 07 benchmark (staged vs blocking weight sync)
"""

import atexit
import gc

# Every process of the course imports this package, and a Monarch process that loaded torch spends a
# quarter of a second or more of CPU at exit in Python's last garbage collections, which walk every
# object left. Tests start and stop many processes, so at exit the heap is frozen (gc.freeze: those
# collections skip it). Other exit handlers still run; nothing of ours needs the collections (files,
# shared memory and process groups are closed explicitly).
atexit.register(gc.freeze)
