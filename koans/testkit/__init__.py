"""What the chapters' tests stand on: conftest.py's plumbing, and the helpers the tests import.

Used by conftest.py, the chapter tests, and the packages above it (learn, grading, bench, maintain).
May import koans.course only.

  testing          timeouts and stand-ins the chapter tests share
  claim_actors     the actors of tests/test_monarch_claims.py
  monarch_compat   what Monarch does not export publicly yet
  code_under_test  --impl exercises|solutions, importing a chapter, its TODOs
  processes        Monarch hygiene: faults recorded, deaths seen quickly, no process outlives the session
  time_limit       a test's time limit, and a chapter's
  explain          failure messages that point at a TODO
  waits            which TODO a wait is for
  hangs            hang notices while a test runs (HangWatch)
  results          per-test JSON and progress events, written by pytest for the runner
  forkserver       the zygote and the launcher (runs as a script); zygote: the test session's side
"""
