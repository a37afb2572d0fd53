"""Benchmarks: `koans bench --gpu`, `koans bench --data-plane` and each chapter's `--bench`.

Used by koans/cli.py and by the chapters' given code (chNN_plumbing.py --bench).
May import koans.course and koans.testkit; never koans.learn, koans.grading or koans.maintain.

  weight_sync   chapter 07: staged weight sync against a blocking broadcast
  rdma          chapter 03: RDMABuffer reads; chapter 07's snapshot pull against one raw read
  reshard       chapter 08: resharding by overlap against torch's redistribute
  kv_recompute  chapter 12: recomputing the KV cache after a weight update, against keeping it
  async_depth   chapters 11 and 12: how much latency async generation hides
  data_plane    `koans bench --data-plane`: rdma, reshard and async_depth into one JSON
  gpu           `koans bench --gpu`: every GPU test and benchmark into one JSON
"""
