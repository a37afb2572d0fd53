"""Small actors for tests/test_monarch_claims.py: they live in a module the spawned processes can
import (a test module cannot be imported there). Nothing here is an exercise."""

import os

import torch
from monarch.actor import Actor, context, current_rank, endpoint
from monarch.rdma import RDMABuffer


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise ValueError("an endpoint error")

    @endpoint
    def die(self) -> None:
        os._exit(1)

    @endpoint
    def places(self) -> tuple[dict, dict]:
        return dict(current_rank()), dict(context().actor_instance.rank)


class Broken(Actor):
    def __init__(self):
        raise RuntimeError("a constructor that fails")

    @endpoint
    def ping(self) -> int:
        return os.getpid()


class Holder(Actor):
    def __init__(self):
        self.memory = torch.zeros(16)
        self.handle = RDMABuffer(self.memory)

    @endpoint
    def buffer(self) -> RDMABuffer:
        return self.handle

    @endpoint
    def fill(self, value: float) -> None:
        self.memory.fill_(value)
