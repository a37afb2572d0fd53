"""Chapter 04: plausible wrong answers (see mutants/README.md).

`Worker.work` recording without waiting for the sink's reply is caught by a
sink that refuses every record (ch04_plumbing.RefusingSink): only a work()
that waited learns of it.
"""

from koans.maintain.mutants import Mutant

MUTANTS = [
    Mutant("MetricsSink.record", "answers the count from before the record", '''
        count = len(self.records)
        self.records.append((source, metric, float(value)))
        return count
    ''', clause='how many records the sink holds'),
    Mutant("MetricsSink.record", "stores the metric where the source belongs", '''
        self.records.append((metric, source, float(value)))
        return len(self.records)
    ''', clause='keyed by source'),
    Mutant("find_sink", "spawns a sink of its own in the caller's process", '''
        from monarch.actor import this_proc

        return this_proc().spawn(name, MetricsSink, created_by)
    ''', clause="first caller's sink"),
    Mutant("find_sink", "looks up the default name, whatever name it was given", '''
        return get_or_spawn_controller(SINK_NAME, MetricsSink, created_by).get(timeout=timeout)
    ''', clause='under the name given'),
    Mutant("Worker.work", "records under another metric name", '''
        result = sum(x * x for x in items)
        sink = find_sink(f"worker{self.rank}", self.sink_name)
        sink.record.call_one(f"worker{self.rank}", "items", len(items)).get(timeout=TIMEOUT)
        return result
    ''', clause='items_done'),
    Mutant("Worker.work", "records the result instead of the number of items", '''
        result = sum(x * x for x in items)
        sink = find_sink(f"worker{self.rank}", self.sink_name)
        sink.record.call_one(f"worker{self.rank}", "items_done", result).get(timeout=TIMEOUT)
        return result
    ''', clause='items_done is len(items)'),
    Mutant("MetricsSink.record", "answers how many records this source has made", '''
        self.records.append((source, metric, float(value)))
        return sum(1 for kept in self.records if kept[0] == source)
    ''', clause='how many records the sink holds'),
    Mutant("find_sink", "waits with no timeout (a learner's)", '''
        return get_or_spawn_controller(name, MetricsSink, created_by).get()
    ''', clause="caller's timeout"),
    Mutant("Worker.work", "sends the record and does not wait for the reply (a learner's)", '''
        result = sum(x * x for x in items)
        sink = find_sink(f"worker{self.rank}", self.sink_name)
        sink.record.call_one(f"worker{self.rank}", "items_done", len(items))
        return result
    ''', clause="did not wait for the sink's reply"),
    Mutant("Worker.work", "names the source by the message's rank, which a slice renumbers (a learner's)", '''
        rank = current_rank().rank
        result = sum(x * x for x in items)
        sink = find_sink(f"worker{rank}", self.sink_name)
        sink.record.call_one(f"worker{rank}", "items_done", len(items)).get(timeout=TIMEOUT)
        return result
    ''', clause='spawn rank'),
    Mutant("Worker.work", "asks find_sink as 'worker', without its rank", '''
        result = sum(x * x for x in items)
        sink = find_sink("worker", self.sink_name)
        sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get(timeout=TIMEOUT)
        return result
    ''', clause='worker<rank>'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('MetricsSink.record', 'truncates the value to an int', '''
        self.records.append((source, metric, int(value)))
        return len(self.records)
    ''', clause='as a float'),
    Mutant('MetricsSink.record', 'answers how many records this metric has, not how many the sink holds', '''
        self.records.append((source, metric, float(value)))
        return sum(1 for r in self.records if r[1] == metric)
    ''', clause='all metrics together'),
    Mutant('MetricsSink.record', 'skips a record equal to one already kept (set semantics)', '''
        if (source, metric, float(value)) not in self.records:
            self.records.append((source, metric, float(value)))
        return len(self.records)
    ''', clause='a list, not a set'),
    Mutant('Worker.work', 'records nothing for an empty list of items', '''
        result = sum(x * x for x in items)
        if items:
            sink = find_sink(f"worker{self.rank}", self.sink_name)
            sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get(timeout=TIMEOUT)
        return result
    ''', clause='no items still records'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('Worker.work', 'waits for the record with no timeout (breaks: wait with timeout=TIMEOUT)', '''
result = sum(x * x for x in items)
sink = find_sink(f"worker{self.rank}", self.sink_name)
sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get()
return result
''', clause='wait at most TIMEOUT'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('MetricsSink.record', "skips zero values: breaks 'Keep one record' for a report of 0 (a worker given no items)", '''
if value:
    self.records.append((source, metric, float(value)))
return len(self.records)
''', clause='so is a value of 0'),
]


# The ninth independent set (blind learners) wrote these; the contract now states the clause each breaks.
MUTANTS += [
    Mutant("Worker.work", "waits for the reply but swallows a refused record (breaks: a record the sink refuses fails work())", '''
result = sum(x * x for x in items)
try:
    sink = find_sink(f"worker{self.rank}", self.sink_name)
    sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get(timeout=TIMEOUT)
except Exception as err:  # metrics must never break the actual work
    print(f"worker{self.rank}: could not report items_done: {err}")
return result
''', clause='caught the refusal'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("Worker.work", "sent to the default sink", '''
        result = sum(x * x for x in items)
        sink = find_sink(f"worker{self.rank}")
        sink.record.call_one(f"worker{self.rank}", "items_done", len(items)).get(timeout=TIMEOUT)
        return result
    ''', clause="sink_name | the sink named | its own sink"),
]
