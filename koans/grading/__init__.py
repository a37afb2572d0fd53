"""Grading: the student edition's autograder, built so that no submission can fake its grade.

Who uses it: instructors (`koans autograder`, `koans grade`) and Gradescope (setup.sh, run_autograder).
It may import koans.course and koans.testkit; never koans.learn (nor bench, maintain). Nothing a learner
runs imports it, except the guards compiled into graded files (runtime) and conftest's grading options.

The layers, in the order a submission meets them (docs/appendix/instructors.md has the threat model):

  extract      only the TODO regions of a submitted file are used, in the pristine stub
  allowlist    each region's text is checked against lists of what a TODO may say
  rewrite      each region is compiled with run-time guards (runtime): attributes, writes, imports
  contain      each chapter runs as its own user, without network, in namespaces and a cgroup
  probes       the judge asks each TODO that is a function of data fresh questions, and compares
  plan, score  which tests count is decided before the run; skips and missing tests fail
  judge        runs the above per chapter and writes results.json after each
  supervisor   always leaves a results.json, whatever happens to the judge
  package      the Gradescope zip (setup.sh, run_autograder)
  edition      `koans edition DIR`: the student edition (what it holds is read by koans/course/edition_data.py)
"""
