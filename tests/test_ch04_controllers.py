"""Chapter 04: controllers. Run: pytest tests/test_ch04_controllers.py"""

import os
import types

import monarch.actor
import pytest
from monarch.actor import ActorError, get_or_spawn_controller, this_proc

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT


@pytest.fixture
def procs(shared_procs):
    return shared_procs(procs=3)


@pytest.fixture
def sink_name(test_tag):
    """A controller name of this test's own: controllers live as long as the whole job."""
    return "sink_" + test_tag


@pytest.fixture
def workers(chapter, procs, sink_name):
    return procs.spawn(f"workers_{sink_name}", chapter.Worker, sink_name)


# --- TODO 1: MetricsSink.record --------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - keeps each (source, metric, value) record, a repeat and a 0 too, the value as a float
#       -> test_the_sink_keeps_every_record
#   - answers how many records the sink now holds, over every metric
#       -> test_the_sink_keeps_every_record


@pytest.mark.todo("MetricsSink.record")
def test_the_sink_keeps_every_record(chapter, sink_name):
    sink = this_proc().spawn(sink_name, chapter.MetricsSink, "test")
    counts = [sink.record.call_one(source, metric, value).get(timeout=TIMEOUT)
              for source, metric, value in [("a", "loss", 1.0), ("b", "loss", 2.5), ("a", "loss", 1.0),
                                            ("a", "accuracy", 0.5), ("c", "accuracy", 0)]]
    assert counts == [1, 2, 3, 4, 5], (
        f"record() answered {counts}: it answers how many records the sink holds, all metrics together; a "
        "repeated record is a record too (a list, not a set), and so is a value of 0")
    summary = sink.summary.call_one().get(timeout=TIMEOUT)
    order = "; it is keyed by source: keep each record as (source, metric, value), in that order" \
        if set(summary) == {"a", "b", "c"} else ""
    assert summary == {"loss": {"count": 3, "total": 4.5, "sources": ["a", "b"]},
                       "accuracy": {"count": 2, "total": 0.5, "sources": ["a", "c"]}}, (
        f"summary {summary}" + (order or ": every record is kept with its value as a float (2.5 stays 2.5)"))


# --- TODO 2: find_sink -----------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the first caller creates the sink with its own created_by, in the root process
#       -> test_the_first_caller_creates_it_in_the_root_process, test_a_worker_can_be_the_first_caller
#   - every later caller gets that same actor; its arguments are ignored
#       -> test_later_callers_get_the_same_one_and_their_arguments_are_ignored, test_every_process_gets_the_same_instance
#   - the sink is found by the `name` given
#       -> test_every_process_gets_the_same_instance
#   - waits at most the caller's `timeout`
#       -> test_find_sink_waits_at_most_the_callers_timeout


@pytest.mark.todo("find_sink")
def test_the_first_caller_creates_it_in_the_root_process(chapter, sink_name):
    sink = chapter.find_sink("the test", sink_name, timeout=TIMEOUT)
    me = sink.identity.call_one().get(timeout=TIMEOUT)
    assert me["created_by"] == "the test", (
        f"find_sink('the test', {sink_name!r}) was the first call for that name, yet its sink was created_by "
        f"{me['created_by']!r}: the first caller creates the sink with its own created_by, under the `name` given")
    assert me["pid"] == os.getpid(), "controllers live in the job's root process"


@pytest.mark.todo("find_sink")
def test_later_callers_get_the_same_one_and_their_arguments_are_ignored(chapter, sink_name):
    first = chapter.find_sink("first", sink_name, timeout=TIMEOUT).identity.call_one().get(timeout=TIMEOUT)
    again = chapter.find_sink("second", sink_name, timeout=TIMEOUT).identity.call_one().get(timeout=TIMEOUT)
    assert again == first, "the second caller must get the first caller's sink, made with 'first'"


@pytest.mark.todo("find_sink")
def test_find_sink_waits_at_most_the_callers_timeout(chapter, monkeypatch):
    waited = []

    class Pending:  # stands in for the Future that get_or_spawn_controller answers
        def get(self, timeout=None):
            waited.append(timeout)
            return "the sink"

    def get_or_spawn(name, actor_class, *args, **kwargs):
        return Pending()

    monkeypatch.setattr(chapter, "get_or_spawn_controller", get_or_spawn)
    monkeypatch.setattr(monarch.actor, "get_or_spawn_controller", get_or_spawn)
    assert chapter.find_sink("the test", "a_sink", timeout=7) == "the sink", (
        f"with get_or_spawn_controller replaced by a stand-in whose future gives 'the sink', find_sink answered "
        f"something else (waits: {waited}): answer the sink that get_or_spawn_controller's future gives, once "
        "waited for")
    assert waited == [7], f"find_sink(..., timeout=7) waited with timeout={waited}: wait at most the caller's timeout"


@pytest.mark.todo("find_sink")
def test_every_process_gets_the_same_instance(chapter, sink_name, workers):
    seen = workers.sink_identity.call().get(timeout=STARTUP_TIMEOUT)
    instances = {me["instance"] for me in seen.values()}
    assert len(instances) == 1, f"three processes found {len(instances)} different sinks"
    ours = chapter.find_sink("the test", sink_name, timeout=TIMEOUT).identity.call_one().get(timeout=TIMEOUT)
    assert ours["instance"] in instances, "the client finds the same sink as the workers"


@pytest.mark.todo("find_sink")
def test_a_worker_can_be_the_first_caller(sink_name, workers):
    made = workers.slice(procs=2).sink_identity.call_one().get(timeout=STARTUP_TIMEOUT)
    assert made["created_by"] == "worker2", (
        f"the sink worker 2 found was built by {made['created_by']!r}: worker 2 asked first for the sink named "
        f"{sink_name!r}, so its created_by built it; look the sink up under the `name` given (not a default)")
    others = workers.sink_identity.call().get(timeout=TIMEOUT)
    assert {me["created_by"] for me in others.values()} == {"worker2"}, (
        f"after worker 2 built the sink, the workers found sinks created_by "
        f"{[me['created_by'] for me in others.values()]!r}: every later caller gets that same sink, made with "
        "'worker2'; its arguments are ignored")
    assert made["pid"] == os.getpid(), "even when a worker creates it, it lives in the root process"


# --- TODO 3: Worker.work ---------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - answers the sum of squares of `items`
#       -> test_workers_report_to_the_sink_without_being_given_it
#   - records items_done = len(items) in the sink found by name, 0 included
#       -> test_workers_report_to_the_sink_without_being_given_it, test_a_worker_with_nothing_to_do_still_reports_zero
#   - the source is worker<rank> with the worker's own (spawn) rank, even through a slice
#       -> test_a_worker_reports_under_its_own_rank_even_through_a_slice
#   - it asks find_sink under that same name, so the first worker to report builds the sink as itself
#       -> test_the_first_worker_to_report_builds_the_sink_under_its_own_name
#   - waits for the record's reply before returning, and a record the sink refuses fails work()
#       -> test_work_waits_for_the_sinks_reply
#   - waits at most TIMEOUT: a sink that never answers cannot hang the worker
#       -> test_work_waits_for_the_reply_at_most_TIMEOUT


@pytest.mark.todo("Worker.work")
def test_work_waits_for_the_sinks_reply(chapter, plumbing, procs, sink_name):
    """A sink that refuses every record: a work() that waited for the reply learns it and fails; one that
    sent the record and went on returns as if all were well (and its report may not be in yet)."""
    get_or_spawn_controller(sink_name, plumbing.RefusingSink, "the test").get(timeout=TIMEOUT)
    default = get_or_spawn_controller(chapter.SINK_NAME, chapter.MetricsSink, "the test").get(timeout=TIMEOUT)

    def recorded_by_default() -> int:
        return default.summary.call_one().get(timeout=TIMEOUT).get("items_done", {}).get("count", 0)

    before = recorded_by_default()
    worker = procs.slice(procs=0).spawn(f"worker_{sink_name}", chapter.Worker, sink_name)
    try:
        result = worker.work.call_one([1, 2]).get(timeout=STARTUP_TIMEOUT)
    except ActorError as err:
        assert "refuses every record" in str(err), (
            f"work() failed, but not with the sink's refusal: {err}")
    else:
        if recorded_by_default() > before:
            pytest.fail(f"work() returned {result}, and its record went to the default sink {chapter.SINK_NAME!r}: "
                        f"this worker was made with sink_name={sink_name!r}; find the sink by the worker's own "
                        "sink_name")
        pytest.fail(f"work() returned {result} though the sink refused its record: either it did not wait for "
                    "the sink's reply, or it caught the refusal. Wait for the reply, and let a refused record fail "
                    "work(): the caller must learn that the report is not in")


@pytest.mark.todo("Worker.work")
def test_work_waits_for_the_reply_at_most_TIMEOUT(chapter, monkeypatch):
    """Stand-ins, no process: work()'s own code runs against a sink whose reply records how long it was
    waited for."""
    waited = []

    class Reply:  # stands in for the Future that record.call_one answers
        def get(self, timeout=None):
            waited.append(timeout)
            return 1

    class Sink:
        class record:
            @staticmethod
            def call_one(*args, **kwargs):  # positional or by keyword, as the learner likes
                return Reply()

    monkeypatch.setattr(chapter, "find_sink", lambda *args, **kwargs: Sink())
    monkeypatch.setattr(chapter, "TIMEOUT", 7.0)
    worker = types.SimpleNamespace(rank=3, sink_name="a_sink")
    assert chapter.Worker.__dict__["work"]._method(worker, [1, 2]) == 5, (
        "work([1, 2]), run against a stand-in sink, did not answer 5: work() answers the sum of squares of `items`")
    assert waited == [7.0], (
        f"work() waited for the record's reply with timeout={waited} while TIMEOUT was 7.0: wait at most TIMEOUT, "
        "so a sink that never answers cannot hang the worker")


@pytest.mark.todo("Worker.work")
def test_workers_report_to_the_sink_without_being_given_it(chapter, sink_name, workers):
    results = workers.work.call([1, 2, 3, 4]).get(timeout=STARTUP_TIMEOUT)
    assert list(results.values()) == [30, 30, 30], "work() still returns the sum of squares"
    summary = chapter.find_sink("the test", sink_name, timeout=TIMEOUT).summary.call_one().get(timeout=TIMEOUT)
    assert "items_done" in summary, "every worker records items_done in the sink it finds by name"
    assert summary["items_done"]["count"] == 3 and summary["items_done"]["total"] == 12.0, (
        f"items_done {summary['items_done']}: 3 workers given 4 items each record 3 reports totalling 12.0; "
        "items_done is len(items), one record per work() call")
    assert sorted(summary["items_done"]["sources"]) == ["worker0", "worker1", "worker2"], (
        f"items_done came from sources {summary['items_done']['sources']!r}, not worker0, worker1 and worker2: each "
        "worker reports under the source worker<rank>, its own spawn rank")


@pytest.mark.todo("Worker.work")
def test_a_worker_with_nothing_to_do_still_reports_zero(chapter, sink_name, workers):
    assert workers.slice(procs=0).work.call_one([]).get(timeout=STARTUP_TIMEOUT) == 0, (
        "work([]) did not answer 0: work() answers the sum of squares of `items`, 0 for no items")
    summary = chapter.find_sink("the test", sink_name, timeout=TIMEOUT).summary.call_one().get(timeout=TIMEOUT)
    assert summary.get("items_done") == {"count": 1, "total": 0.0, "sources": ["worker0"]}, (
        f"summary {summary}: a worker given no items still records items_done = 0; the sink learns it ran")


@pytest.mark.todo("Worker.work")
def test_the_first_worker_to_report_builds_the_sink_under_its_own_name(chapter, sink_name, workers):
    assert workers.slice(procs=1).work.call_one([3]).get(timeout=STARTUP_TIMEOUT) == 9, (
        "work([3]) on worker 1 did not answer 9: work() answers the sum of squares of `items`")
    made = chapter.find_sink("the test", sink_name, timeout=TIMEOUT).identity.call_one().get(timeout=TIMEOUT)
    assert made["created_by"] == "worker1", (
        f"worker 1 reported first, yet the sink was built by {made['created_by']!r}: a worker asks find_sink "
        "under its own name, worker<rank> with its spawn rank (self.rank), the same it reports under; worker 1 was "
        "called through a one-actor slice, where the message's rank is 0")


@pytest.mark.todo("Worker.work")
def test_a_worker_reports_under_its_own_rank_even_through_a_slice(chapter, sink_name, workers):
    pair = workers.slice(procs=slice(1, 3))  # the message renumbers these two as 0 and 1
    assert list(pair.work.call([1, 2]).get(timeout=STARTUP_TIMEOUT).values()) == [5, 5], (
        "work([1, 2]) through the slice of workers 1 and 2 did not answer 5 from each: work() answers the sum of "
        "squares of `items`")
    summary = chapter.find_sink("the test", sink_name, timeout=TIMEOUT).summary.call_one().get(timeout=TIMEOUT)
    sources = sorted(summary["items_done"]["sources"])
    assert sources == ["worker1", "worker2"], (
        f"workers 1 and 2, called through a slice, reported as {sources}: the source is the worker's own rank "
        "(self.rank, where it was spawned), not the message's rank, which a slice renumbers from 0")
