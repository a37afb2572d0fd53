"""The koans runner and test plumbing: nothing in here is an exercise. One package per concern; a
package imports only packages of lower rank, or its own (tests/course/test_architecture.py holds it):

  course/    [0] what the course is: chapters, hints, TODO regions, what this checkout holds, the time model
  testkit/   [1] what the chapters' tests stand on: conftest's plumbing, timeouts, the forkserver, failure notes
  learn/     [2] the learner's runner (koans check, hint, watch, reset, ...), the chapters' demos, viz
  grading/   [2] the instructor's: the student edition and the autograder
  bench/     [2] benchmarks (koans bench, each chapter's --bench)
  maintain/  [3] the maintainer's: stubgen, koans verify, mutants, contracts
  cluster/       the Slurm cluster script of chapter 10's multi-host tests (not Python)
  cli.py     [4] the `koans` command: parses and dispatches; nothing imports it

docs/appendix/maintainers.md draws the picture and says where to change what.
"""

import atexit
import gc

# Every process of the course imports this package, and a Monarch process that loaded torch spends a
# quarter of a second or more of CPU at exit in Python's last garbage collections, which walk every
# object left. Tests start and stop many processes, so at exit the heap is frozen (gc.freeze: those
# collections skip it). Other exit handlers still run; nothing of ours needs the collections (files,
# shared memory and process groups are closed explicitly).
atexit.register(gc.freeze)
