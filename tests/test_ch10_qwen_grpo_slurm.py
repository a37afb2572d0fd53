"""Chapter 10 on a real Slurm cluster: the trainer on one Slurm node, its generators on two others
(monarch.job.SlurmJob; the given code is ch10_multihost.py). The cluster is the one koans/cluster/slurm_cluster.sh
starts: Slurm 24.11 from Debian's packages, three nodes in namespaces on this machine (root only).

    koans/cluster/slurm_cluster.sh start            # once; koans/cluster/slurm_cluster.sh stop ends it
    pytest tests/test_ch10_qwen_grpo_slurm.py --impl solutions

Where that cluster is not up, the tests skip and say why ($KOANS_REQUIRE_SLURM=1 makes that a failure,
as in CI). Each test runs the client in a process of its own, through `koans/cluster/slurm_cluster.sh run`:
SlurmJob switches Monarch's transport to TCP for the whole process it runs in, and that process must
resolve the nodes' names. That process is this file (`drive`), which answers what it saw as JSON.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = PROJECT_ROOT / "koans" / "cluster" / "slurm_cluster.sh"
NODES = 3
STEPS = 4
LOST_AFTER_S = 5.0  # Monarch calls a silent host's processes stopped after this long (get_proc_state_max_idle)
PROBE_TIMEOUT_S = 10.0  # a host where a new process does not start in this time is lost
RUN_TIMEOUT_S = 150.0  # one driven run, from submitting the job to the job's end
TODOS = ("group_advantages", "grpo_loss", "response_token_logprobs")

pytestmark = pytest.mark.slurm


# --- The cluster: up, or skip -------------------------------------------------------------------------


def clean_env() -> dict[str, str]:
    """This process's environment without the session tag: what the script starts must not count as
    this pytest session's leftovers (conftest.py)."""
    from koans.testkit.processes import SESSION_TAG_ENV

    return {k: v for k, v in os.environ.items() if k != SESSION_TAG_ENV}


def why_not_up() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm cluster of koans/cluster/slurm_cluster.sh needs root"
    try:
        status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"koans/cluster/slurm_cluster.sh status did not answer: {err}"
    found = re.search(r"(\d+) nodes idle", status.stdout)
    if status.returncode != 0 or not found:
        return f"no Slurm cluster of koans/cluster/slurm_cluster.sh is up ({(status.stdout + status.stderr).strip()})"
    if int(found.group(1)) < NODES:
        return f"the cluster has {found.group(1)} nodes; these tests need {NODES}: koans/cluster/slurm_cluster.sh start {NODES}"
    return None


@pytest.fixture(scope="module")
def cluster():
    why = why_not_up()
    if why:
        advice = f"{why}. As root: koans/cluster/slurm_cluster.sh start (docs/appendix/multihost.md)"
        if os.environ.get("KOANS_REQUIRE_SLURM") == "1":
            pytest.fail(f"KOANS_REQUIRE_SLURM=1 and {advice}", pytrace=False)
        pytest.skip(advice)
    return SCRIPT


def slurm(*args: str) -> str:
    """A Slurm client tool of the cluster (sinfo, squeue, ...), run from this machine."""
    return subprocess.run([str(SCRIPT), "run", *args], capture_output=True, text=True, timeout=60,
                          env=clean_env()).stdout


def drive_run(chapter, tmp_path, *options: str) -> dict:
    """Run `drive` (below) in a client process on the cluster; answer what it saw."""
    package = chapter.__name__.rsplit(".", 1)[0]
    command = [str(SCRIPT), "run", sys.executable, str(Path(__file__).resolve()), "--impl", package,
               "--log-dir", str(tmp_path / "slurm-logs"), *options]
    try:
        done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"")[-3000:]
        pytest.fail(f"the run on the Slurm cluster did not end within {RUN_TIMEOUT_S:g} s; its output ended:\n{output}")
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and found, (
        f"the client on the Slurm cluster failed (exit {done.returncode}); its output ended:\n"
        f"{(done.stdout + done.stderr)[-4000:]}")
    return json.loads(found[-1].removeprefix("RESULT "))


def assert_nothing_left(seen: dict) -> None:
    assert seen["job_processes_at_the_end"] >= 2 * NODES, (
        f"each node runs a worker and a process of the job: {seen['job_processes_at_the_end']} processes")
    assert seen["left_after_stop"] == [], (
        f"processes of Slurm job {seen['job_id']} outlived the job's stop: {seen['left_after_stop']}")
    assert seen["job_state_after_stop"] not in LIVE_JOB_STATES, (
        f"Slurm job {seen['job_id']} is still {seen['job_state_after_stop']} after the run: JobHosts.kill must "
        "cancel it (scancel)")
    live = slurm("squeue", "-h", "-o", "%i %T").split()
    assert seen["job_id"] not in live, f"squeue still lists the job: {live}"


# --- The tests --------------------------------------------------------------------------------------


@pytest.mark.todo(*TODOS)
def test_a_few_steps_on_three_slurm_nodes_leave_every_generator_bit_equal_and_pulling_by_rdma(cluster, chapter,
                                                                                              tmp_path):
    seen = drive_run(chapter, tmp_path, "--steps", str(STEPS))
    assert seen["versions"] == list(range(1, STEPS + 1)), (
        f"the steps answered versions {seen['versions']}, expected {list(range(1, STEPS + 1))}: {STEPS} steps, each "
        "one train call that publishes the next version")
    assert seen["nodes"] == ["n1", "n2", "n3"], f"SlurmJob got the job's three nodes: {seen['nodes']}"
    final = seen["final"]
    assert sorted(final["generator_versions"].values()) == [STEPS, STEPS], (
        f"after the final sync the trainer is at version {final.get('version')!r} and the generators hold "
        f"{sorted(final['generator_versions'].values())}: expected {STEPS} everywhere, each generator loading the "
        "trainer's last version")
    assert list(final["generators"].values()) == [final["trainer"]] * 2, "bit-equal weights on every node"
    replicas = seen["report"]["replicas"]
    assert [(r["index"], r["host"]) for r in replicas] == [(0, "generators_0"), (1, "generators_1")], (
        f"replicas on {[(r['index'], r['host']) for r in replicas]}: HostService (given code) starts replica i on "
        "host i % hosts, so replica 0 on generators_0 and replica 1 on generators_1")
    assert [r["picked"] for r in replicas] == [["rdma"], ["rdma"]], (
        f"a generator on another node than the trainer's pulls by RDMA (here its TCP fallback): {replicas}")
    assert seen["generator_nodes"] == {"0": "n2", "1": "n3"}, (
        f"one generator on each node but the trainer's: {seen['generator_nodes']}")
    here, there = seen["probes"]
    assert (here["host"], here["picked"]) == ("n1/trainers_0", "shm"), (
        f"a reader on the trainer's node (n1) maps its shared memory: {here}")
    assert (there["host"], there["picked"]) == ("n3/generators_1", "rdma"), f"one on another node pulls: {there}"
    assert_nothing_left(seen)


@pytest.mark.todo(*TODOS)
@pytest.mark.time_limit(240)
def test_training_reaches_its_last_step_when_a_generator_node_dies(cluster, chapter, tmp_path):
    """After step 1, Slurm node n2 (generators_0) dies whole: its slurmd, the job's step there, the worker
    and its generator (SIGKILL, koans/cluster/slurm_cluster.sh's kill-node does the same). The service finds the
    host lost and moves its generator to n3. Slurm itself marks n2 DOWN after SlurmdTimeout: by default
    that would end the job, and the trainer with it; ch10_multihost submits with --no-kill (and
    SLURM_NO_KILL for srun), so the job runs on, on n1 and n3."""
    try:
        seen = drive_run(chapter, tmp_path, "--steps", str(STEPS), "--kill-host-at", "1")
    finally:
        revived = subprocess.run([str(SCRIPT), "start", str(NODES)], capture_output=True, text=True, timeout=180,
                                 env=clean_env())
    assert seen["versions"] == list(range(1, STEPS + 1)), "training went on to its last step"
    [kill] = seen["report"]["kills"]
    assert (kill["host"], kill["node"], kill["replica"]) == ("generators_0", "n2", 0), kill
    assert kill["killed"] >= 4, f"the whole node died (holder, slurmd, step, worker, generator): {kill}"
    silent = ("no status received from process", "timeout waiting for message from proc mesh agent")
    assert kill["reported"].startswith("SupervisionError") and any(s in kill["reported"] for s in silent), (
        f"what Monarch 0.7.0 answered a call into the dead node: {kill['reported']}")
    assert "did not start" in seen["report"]["lost"].get("generators_0", ""), f"host lost: {seen['report']['lost']}"
    assert seen["report"]["moves"] == [[0, "generators_0", "generators_1"]], seen["report"]["moves"]
    assert seen["node_state_after_kill"].startswith("down"), (
        f"Slurm marks the dead node down (SlurmdTimeout): sinfo says {seen['node_state_after_kill']!r}")
    assert seen["job_state_after_node_down"] == "RUNNING", (
        f"with n2 down, the job must run on (sbatch --no-kill, SLURM_NO_KILL for srun); it is "
        f"{seen['job_state_after_node_down']!r}")
    final = seen["final"]
    assert sorted(final["generator_versions"].values()) == [final["version"]] * 2, (
        f"after the final sync the trainer is at version {final['version']!r} and the generators hold "
        f"{sorted(final['generator_versions'].values())}: every generator, the moved one too, loads the last version")
    assert list(final["generators"].values()) == [final["trainer"]] * 2, "the moved generator caught up too"
    assert_nothing_left(seen)
    assert revived.returncode == 0 and "3 nodes idle" in revived.stderr, (
        f"koans/cluster/slurm_cluster.sh start brings the dead node back: {revived.stderr[-2000:]}")


# --- The client process: runs on the cluster, answers JSON --------------------------------------------


def job_processes(job_id: str) -> list[int]:
    """Live processes on this machine that belong to Slurm job `job_id` (the nodes are namespaces here)."""
    needle = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


LIVE_JOB_STATES = ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING")


def tool(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60).stdout.strip()


def wait_until(check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def drive(argv: list[str]) -> None:
    """The client: chapter 10 on the cluster's three nodes; prints what it saw as one JSON line."""
    import asyncio
    import importlib

    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", default="solutions")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--kill-host-at", type=int, default=0)
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(PROJECT_ROOT))
    chapter = importlib.import_module(f"{args.impl}.ch10_qwen_grpo")
    plumbing = importlib.import_module(f"{args.impl}.ch10_plumbing")
    multihost = importlib.import_module(f"{args.impl}.ch10_multihost")
    from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT

    spec = multihost.HostsSpec(hosts=NODES, scheduler="slurm", kill_host_at=args.kill_host_at,
                               lost_after_s=LOST_AFTER_S, probe_timeout_s=PROBE_TIMEOUT_S,
                               slurm={"log_dir": args.log_dir, "job_name": "koans_test"})
    config = chapter.RunConfig(model=None, steps=args.steps, groups_per_step=2, group_size=4, max_new_tokens=6,
                               generators=2, max_lag=1, seed=0, lease_timeout_s=2.0)
    seen: dict = {}

    async def scenario():
        job = plumbing.Job.start(config, name="t10slurm", hosts=spec)
        slurm_job = job.hosts.job
        seen["job_id"], seen["nodes"] = slurm_job._slurm_job_id, list(slurm_job._all_hostnames)
        try:
            job.start_loading()
            await job.warm_up()
            on_step = multihost.killing_host_at(job, spec.kill_host_at) if spec.kill_host_at else None
            run = await plumbing.run_async(job, on_step=on_step, timeout=4 * STARTUP_TIMEOUT)
            seen["versions"] = [r["version"] for r in run["results"]]
            seen["report"] = await multihost.host_report(job, await job.spans())
            if spec.kill_host_at:
                await job.service.fanout("whoami")  # if no request met the dead replica yet, this one does
                await job.service.wait_recovered(timeout=STARTUP_TIMEOUT)
                seen["report"] = await multihost.host_report(job, [])  # the host found lost, the replica moved
                node = seen["report"]["kills"][0]["node"]
                seen["node_state_after_kill"] = wait_until(
                    lambda: (state := tool("sinfo", "-h", "-n", node, "-o", "%T")).startswith("down") and state,
                    timeout=90) or tool("sinfo", "-h", "-n", node, "-o", "%T")
                seen["job_state_after_node_down"] = tool("squeue", "-h", "-j", seen["job_id"], "-o", "%T")
            else:
                pids = await job.service.fanout("whoami")
                seen["generator_nodes"] = {str(i): multihost.slurm_node(multihost.worker_process(
                    pid, job.service.where(i))) for i, pid in pids.items()}
                state = job.hosts.state
                near_procs, near = multihost.spawn_on(state.trainers, 0, "trainers_0", multihost.TransportProbe)
                far_procs, far = multihost.spawn_on(state.generators, 1, "generators_1", multihost.TransportProbe)
                try:
                    seen["probes"] = await asyncio.wait_for(
                        asyncio.gather(near.pick.call_one(job.store), far.pick.call_one(job.store)), STARTUP_TIMEOUT)
                finally:
                    await asyncio.wait_for(asyncio.gather(near_procs.stop(), far_procs.stop()), TIMEOUT)
            seen["final"] = await job.final_sync()
            seen["job_processes_at_the_end"] = len(job_processes(seen["job_id"]))
        finally:
            await job.stop()

    asyncio.run(scenario())
    seen["left_after_stop"] = wait_until(lambda: not job_processes(seen["job_id"]), timeout=30) or \
        job_processes(seen["job_id"])
    if seen["left_after_stop"] is True:
        seen["left_after_stop"] = []
    # After scancel a job passes through COMPLETING while its nodes clean up (seconds, longer on a busy machine):
    # wait for it to leave the live states; a job never cancelled stays RUNNING and fails the assertion.
    def job_state() -> str:
        return tool("squeue", "-h", "-j", seen["job_id"], "-o", "%T")

    wait_until(lambda: job_state() not in LIVE_JOB_STATES, timeout=120)
    seen["job_state_after_stop"] = job_state()
    print("RESULT " + json.dumps(seen, default=str), flush=True)


if __name__ == "__main__":
    drive(sys.argv[1:])
