"""The maintainer's: keeping exercises/ in sync and proving that the tests gate every TODO.

Used by koans/cli.py (`koans verify`) and by maintainers (`python -m koans.maintain.stubgen`,
`python -m koans.maintain.contracts --update`). May import koans.course, koans.testkit and koans.learn
(verify shows a mutant's failure as `koans check` would); nothing imports it but koans/cli.py and tests.

  stubgen       writes exercises/ from the TODO regions of solutions/
  verify        `koans verify`: every chapter fails on its stubs, every TODO and every mutant is caught
  project_copy  the project copies verify runs in (one TODO stubbed, a mutant applied)
  mutants       plausible wrong answers (mutants/), applied one at a time
  contracts     every TODO's contract, clause by clause, with the tests that hold each
"""
