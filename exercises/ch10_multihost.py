"""Chapter 10 beyond one host: the same trainer, with its roles on a job's hosts. Given code, not a
TODO; you may skip it. docs/appendix/multihost.md tells the story.

    python -m exercises.ch10_qwen_grpo --hosts 3                     the trainer on one host, the
                                                                     generators spread over two others
    python -m exercises.ch10_qwen_grpo --hosts 3 --kill-host-at 40   ... and a generator host dies

A Monarch *job* hands out hosts, one HostMesh per role. `monarch.job.ProcessJob` makes each host a
local worker process on a socket of its own: that is what runs here and in the tests. SlurmJob and
KubernetesJob hand out the same HostMeshes on a cluster (--scheduler). koans/cluster/slurm_cluster.sh starts
a real Slurm cluster whose nodes are namespaces on this machine (root only), and tests run on it too:

    koans/cluster/slurm_cluster.sh run .venv/bin/python -m exercises.ch10_qwen_grpo --hosts 3 --scheduler slurm

The actors, the loops and the weight sync are chapter 10's; only where their processes start changes.

    HostsSpec        how many hosts, which scheduler, what to do to them (from the command line)
    JobHosts         starts the job; a process on the trainer's host; a Service on the generators'
                     hosts; kill() ends the job and every process on it
    HostService      chapter 06's Service with its replicas spread over hosts; a replica whose
                     host is lost comes back on a live one
    killing_host_at  after a step, SIGKILL a host that runs on this machine; note what Monarch says
    host_report      where each generator ran and which transport it picked, for the summary
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from monarch.actor import Actor, ProcMesh, default_bootstrap_cmd, endpoint

from .ch06_plumbing import replica_label
from .ch06_service import Service
from .ch07_transports import HOST_ENV, host_identity, pick_transport

ROLES = ("trainers", "generators")  # the job's host meshes (KubernetesJob wants lower-case letters only)
TRAINER_HOST = "trainers_0"
SCHEDULERS = ("process", "slurm", "kubernetes")
K8S_READY_TIMEOUT_S = 1800  # KubernetesJob waits this long for its pods (pulling an image takes a while)
# By default Slurm ends a job when one of its nodes fails, and srun ends the step that runs the workers:
# the trainer would go with a generator's node. --no-kill (sbatch) and SLURM_NO_KILL (srun) keep the rest.
SLURM_KEEP_GOING = ("--no-kill", "--export=ALL,SLURM_NO_KILL=set")


@dataclass(frozen=True)
class HostsSpec:
    """What --hosts and its companions ask for. The trainer gets one host, the generators the rest."""

    hosts: int
    scheduler: str = "process"
    gpus_per_host: int | None = None  # a cluster's GPUs per host; each generator on a host gets its own
    kill_host_at: int = 0  # after this step, the host of generator replica 0 dies (hosts on this machine only)
    lost_after_s: float | None = 10.0  # a host silent this long is lost to Monarch (None: Monarch's 60 s)
    probe_timeout_s: float = 20.0  # a host where a new process does not start in this time is lost
    slurm: dict = field(default_factory=dict)  # more keyword arguments for monarch.job.SlurmJob
    kubernetes: dict = field(default_factory=dict)  # namespace, image, kubeconfig, shm

    def __post_init__(self):
        if self.hosts < 2:
            raise ValueError(f"hosts={self.hosts}: one host for the trainer and at least one for the generators")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, not {self.scheduler!r}")
        if self.kill_host_at and self.hosts < 3:
            raise ValueError("killing a generator host needs another generator host to carry on: hosts >= 3")
        if self.kill_host_at and self.scheduler == "kubernetes":
            raise ValueError("only hosts on this machine can be killed from here: simulated ones (scheduler "
                             "'process'), or the Slurm nodes of koans/cluster/slurm_cluster.sh (scheduler 'slurm')")

    @property
    def meshes(self) -> dict[str, int]:
        return dict(zip(ROLES, (1, self.hosts - 1)))

    def describe(self) -> str:
        kind = {"process": "ProcessJob: each host a local worker process", "slurm": "SlurmJob",
                "kubernetes": "KubernetesJob"}[self.scheduler]
        return f"{self.hosts} hosts ({kind}): the trainer on {TRAINER_HOST}, generators on generators_0.." \
               f"generators_{self.hosts - 2}"


def monarch_job(spec: HostsSpec):
    """The Monarch job that hands out `spec`'s hosts; `job.state()` starts it."""
    if spec.scheduler == "process":
        from monarch.job import ProcessJob

        return ProcessJob(spec.meshes)
    if spec.scheduler == "slurm":
        from monarch.job import SlurmJob

        # The workers run this interpreter: the same environment, at the same path, on every host.
        options = {"slurm_args": SLURM_KEEP_GOING, **spec.slurm}
        return SlurmJob(spec.meshes, python_exe=sys.executable, gpus_per_node=spec.gpus_per_host, **options)
    from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob  # needs `pip install kubernetes`

    options = spec.kubernetes
    kubeconfig = KubeConfig.from_path(options["kubeconfig"]) if options.get("kubeconfig") else None
    job = KubernetesJob(namespace=options["namespace"], timeout=K8S_READY_TIMEOUT_S, kubeconfig=kubeconfig)
    resources = {"nvidia.com/gpu": spec.gpus_per_host} if spec.gpus_per_host else None
    for role, count in spec.meshes.items():
        job.add_mesh(role, count, image_spec=ImageSpec(options["image"], resources=resources,
                                                        shared_memory_size=options.get("shm")))
    return job


def on_host(env: dict[str, str]):
    """How to start a process with `env` added to its host's environment (its job host's name, its GPU)."""
    return default_bootstrap_cmd().with_env(env)


class JobHosts:
    """A started job: a process for the trainer on its host, a Service on the generators' hosts.

    kill() ends the job, and with it every process on its hosts. Monarch notices a host that went
    silent after `lost_after_s` (its setting get_proc_state_max_idle); this sets it for as long as
    the job runs.
    """

    def __init__(self, spec: HostsSpec):
        import monarch
        from monarch.config import get_global_config

        self.spec = spec
        self.service: HostService | None = None
        self.kills: list[dict] = []  # what killing_host_at did, and what Monarch answered
        self.pending: list[asyncio.Task] = []
        self._restore = None
        if spec.scheduler != "process" and (problem := hostname_problem()):
            raise RuntimeError(problem)
        if spec.lost_after_s is not None:
            self._restore = get_global_config()["get_proc_state_max_idle"]
            monarch.configure(get_proc_state_max_idle=f"{spec.lost_after_s:g}s")
        self.job = monarch_job(spec)
        chatty = logging.getLogger("monarch._src.job.job")  # "Applying current job" and the like, at INFO
        level = chatty.level
        chatty.setLevel(logging.WARNING)
        try:
            self.state = self.job.state(cached_path=None)  # starts the hosts (ProcessJob: in well under a second)
        except BaseException:
            self.kill()
            raise
        finally:
            chatty.setLevel(level)

    def trainer_procs(self) -> ProcMesh:
        return self.state.trainers.spawn_procs(per_host={"procs": 1}, bootstrap_command=on_host({HOST_ENV: TRAINER_HOST}))

    def generator_service(self, actor_class: type, *args, **kwargs) -> "HostService":
        self.service = HostService(self.state.generators, "generators", actor_class, *args,
                                   gpus_per_host=self.spec.gpus_per_host, probe_timeout=self.spec.probe_timeout_s,
                                   **kwargs)
        return self.service

    def kill(self) -> None:
        """End the job: every host's worker process and every process on it (ProcessJob reaps them all)."""
        try:
            self.job.kill()
        finally:
            if self._restore is not None:
                import monarch

                monarch.configure(get_proc_state_max_idle=self._restore)
                self._restore = None


class HostService(Service):
    """Chapter 06's Service with its replicas on the hosts of `hosts` (a HostMesh), one after another.

    Replica i starts on host i % number of hosts. A replacement (chapter 06's recovery) goes to its
    replica's host while that host lives; once the host is lost, to the live host with the fewest
    replicas. Whether a host lives is asked by starting a bare process there: on Monarch 0.7.0 a lost
    host answers nothing, and a process started on it never comes up (docs/appendix/multihost.md).
    """

    def __init__(self, hosts, role: str, actor_class: type, *args, gpus_per_host: int | None = None,
                 probe_timeout: float = 20.0, **kwargs):
        self.hosts, self.gpus_per_host, self.probe_timeout = hosts, gpus_per_host, probe_timeout
        self.host_names = [f"{role}_{n}" for n in range(hosts.sizes["hosts"])]
        self.host_of: dict[int, int] = {}  # replica index -> the host its newest process is on
        self.gpu_of: dict[int, int] = {}  # replica index -> its GPU on that host (with gpus_per_host)
        self.lost: dict[str, str] = {}  # host name -> how we know it is gone
        self.moves: list[tuple[int, str, str]] = []  # (replica index, from host, to host)
        super().__init__(actor_class, *args, **kwargs)

    def where(self, index: int) -> str:
        return self.host_names[self.host_of[index]]

    def _choose_host(self, index: int) -> int:
        home = self.host_of.get(index, index % len(self.host_names))
        if self.host_names[home] not in self.lost:
            return home
        live = [h for h, name in enumerate(self.host_names) if name not in self.lost]
        if not live:
            raise RuntimeError(f"replica {index}: every host of the service is lost: {self.lost}")
        load = Counter(h for i, h in self.host_of.items() if i != index)
        return min(live, key=lambda h: (load[h], h))

    def _new_procs(self, index: int) -> ProcMesh:
        host = self._choose_host(index)
        if index in self.host_of and self.host_of[index] != host:
            self.moves.append((index, self.where(index), self.host_names[host]))
        self.host_of[index] = host
        env = {HOST_ENV: self.host_names[host]}
        if self.gpus_per_host:  # one GPU each: the lowest one no other replica on this host holds
            taken = {self.gpu_of.get(i) for i, h in self.host_of.items() if h == host and i != index}
            free = [g for g in range(self.gpus_per_host) if g not in taken]
            self.gpu_of[index] = free[0] if free else index % self.gpus_per_host
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_of[index])
        return self.hosts.slice(hosts=host).spawn_procs(per_host={"procs": 1}, bootstrap_command=on_host(env))

    async def _retire(self, old) -> None:
        if await self._host_alive(self.host_of[old.index]):
            await self._stop(old.procs)
        elif old.procs in self._spawned:  # it went with its host; a stop there only returns after ~38 s (measured)
            self._spawned.remove(old.procs)

    async def _host_alive(self, host: int) -> bool:
        name = self.host_names[host]
        if name in self.lost:
            return False
        probe = self.hosts.slice(hosts=host).spawn_procs(per_host={"procs": 1}, bootstrap_command=on_host({HOST_ENV: name}))
        try:
            await asyncio.wait_for(probe.initialized, self.probe_timeout)
        except Exception as err:  # TimeoutError: Monarch itself gives up only after 30 s (mesh_proc_spawn_max_idle)
            self.lost[name] = f"a new process there did not start within {self.probe_timeout:g} s " \
                              f"({type(err).__name__})"
            return False
        await self._stop(probe)
        return True


# --- Losing a host (simulated) -----------------------------------------------------------------


def worker_process(pid: int, host: str) -> int:
    """The host worker process that started process `pid` on job host `host`: its parent, checked to be a
    worker. On a cluster of separate machines `pid` is not a process here at all, which this checks too."""
    try:
        ours = f"{HOST_ENV}={host}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        command = Path(f"/proc/{parent}/cmdline").read_bytes()
    except OSError:
        ours = False
    if not ours:
        raise RuntimeError(f"process {pid} of host {host} does not run on this machine: only hosts that do can be "
                           "killed from here (--scheduler process, or the nodes of koans/cluster/slurm_cluster.sh)")
    if b"run_worker_loop_forever" not in command and b"_process_worker" not in command:
        raise RuntimeError(f"process {pid}'s parent {parent} is no host worker; only simulated hosts "
                           "(--scheduler process) and the nodes of koans/cluster/slurm_cluster.sh can be killed from here")
    return parent


def host_processes(worker: int) -> list[int]:
    """What dies with the host of `worker`. A simulated host (ProcessJob) shares this process's network:
    its worker alone, whose processes die with it. A node of koans/cluster/slurm_cluster.sh is a network namespace
    of its own: every process in it (its slurmd, the job's step, the worker and the processes it started,
    the process that holds the namespace), as when a machine fails."""
    network = os.readlink(f"/proc/{worker}/ns/net")
    if network == os.readlink("/proc/self/ns/net"):
        return [worker]
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "net") == network:
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def slurm_node(worker: int) -> str | None:
    """The Slurm node a worker runs on (its SLURMD_NODENAME), or None outside Slurm."""
    for item in Path(f"/proc/{worker}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"SLURMD_NODENAME="):
            return item.split(b"=", 1)[1].decode()
    return None


def hostname_problem() -> str | None:
    """Why Monarch's TCP transport (SlurmJob, KubernetesJob) cannot start here, or None. It binds to this
    machine's name and panics if that resolves only to loopback or link-local addresses."""
    import ipaddress
    import socket

    name = socket.gethostname()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError as err:
        addresses, reason = set(), f"does not resolve ({err})"
    else:
        reason = f"resolves only to {', '.join(sorted(addresses))}"
    if any(not (a.is_loopback or a.is_link_local) for a in map(ipaddress.ip_address, addresses)):
        return None
    return (f"this machine's name {name!r} {reason}, and Monarch's TCP transport needs an address other machines "
            "can reach: give the name such an address in /etc/hosts (or DNS); on the cluster of "
            "koans/cluster/slurm_cluster.sh, run the command through `koans/cluster/slurm_cluster.sh run`")


def _picked(spans: list) -> list[str]:
    """The transports a generator's weight loads used, from its timeline."""
    return sorted({s.info["transport"] for s in spans if s.kind == "sync" and s.info.get("loaded")})


def first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: " + " ".join(lines)[:500]


async def kill_host(job, step: int) -> dict:
    """SIGKILL the host generator replica 0 is on (host_processes: its worker process, or a whole Slurm
    node of koans/cluster/slurm_cluster.sh), as when a machine fails. Then call that replica once more, and record
    what Monarch answers, and when."""
    service, hosts = job.service, job.hosts
    replica = service.replicas[0]
    record = {"step": step, "host": service.where(0), "replica": 0, "generation": replica.generation}
    hosts.kills.append(record)
    pid = await asyncio.wait_for(replica.actor.whoami.call_one(), service.call_timeout)
    record["picked"] = _picked(await asyncio.wait_for(replica.actor.timeline.call_one(), service.call_timeout))
    record["worker"] = worker_process(pid, record["host"])
    record["node"] = slurm_node(record["worker"])
    victims = host_processes(record["worker"])
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    record["killed"] = len(victims)
    node = f" (Slurm node {record['node']}: all its {len(victims)} processes, slurmd too)" if record["node"] else ""
    print(f"  ** after step {step}: SIGKILL host {record['host']}'s worker process (pid {record['worker']}){node}; "
          f"generator replica 0 (pid {pid}) dies with it **")
    started = time.monotonic()
    try:
        await asyncio.wait_for(replica.actor.whoami.call_one(), (hosts.spec.lost_after_s or 60.0) + 60.0)
        record["reported"] = "nothing: it still answered"
    except Exception as err:
        record["reported"] = first_line(err)
    record["reported_after_s"] = time.monotonic() - started
    return record


def killing_host_at(job, step: int, on_step=None):
    """Wrap `on_step` so that right after `step` a generator host dies (kill_host)."""

    def wrapped(result: dict) -> None:
        if result["version"] == step:
            job.hosts.pending.append(asyncio.get_running_loop().create_task(kill_host(job, step)))
        if on_step is not None:
            on_step(result)

    return wrapped


# --- The summary ---------------------------------------------------------------------------------


async def host_report(job, spans: list) -> dict:
    """Where each generator ran and which transport its weight loads picked; what became of lost hosts."""
    hosts, service = job.hosts, job.service
    if hosts.pending:
        done, _ = await asyncio.wait(hosts.pending, timeout=(hosts.spec.lost_after_s or 60.0) + 2 * service.call_timeout)
        for task in done:
            if task.exception() is not None:  # the kill itself failed: say why
                raise task.exception()
    pids = await service.fanout("whoami")
    picked = {s.actor for s in spans}
    replicas = []
    for r in service.replicas:
        actor = replica_label(f"{service.name}{r.index}_g{r.generation}", "generator") if r.index in pids else None
        replicas.append({"index": r.index, "generation": r.generation, "host": service.where(r.index),
                         "healthy": r.healthy and r.index in pids,
                         "picked": _picked([s for s in spans if s.actor == actor]) if actor in picked else []})
    return {"spec": hosts.spec.describe(), "trainer": TRAINER_HOST, "replicas": replicas, "lost": dict(service.lost),
            "moves": list(service.moves), "kills": [dict(k) for k in hosts.kills],
            "recovery_errors": list(service.recovery_errors)}


def describe_hosts(report: dict, service: dict) -> str:
    """The summary's lines about hosts: who ran where and what each generator picked."""
    lines = [f"hosts: {report['spec']}"]
    for kill in report["kills"]:
        lines.append(f"  generator {kill['replica']} (generation {kill['generation']}) on {kill['host']}: picked "
                     f"{', '.join(kill.get('picked', [])) or 'no load yet'}; lost with its host after step {kill['step']}")
    for r in report["replicas"]:
        state = "" if r["healthy"] else " (out of rotation)"
        lines.append(f"  generator {r['index']} (generation {r['generation']}) on {r['host']}: picked "
                     f"{', '.join(r['picked']) or 'no load during the run'}{state}")
    for kill in report["kills"]:
        node = f", Slurm node {kill['node']}" if kill.get("node") else ""
        lines.append(f"  host {kill['host']} killed after step {kill['step']} (worker pid {kill.get('worker')}{node}); "
                     f"a call into it got, {kill.get('reported_after_s', float('nan')):.1f} s later: "
                     f"{kill.get('reported', 'no answer yet')}")
    for name, why in report["lost"].items():
        lines.append(f"  host {name} lost: {why}")
    for index, source, target in report["moves"]:
        lines.append(f"  generator {index} moved from {source} to {target}")
    if report["kills"] or report["lost"]:
        lines.append(f"  the service retried {service['retries']} request(s) on other replicas; "
                     f"{service['failed']} failed")
    for error in report["recovery_errors"]:
        lines.append(f"  recovery error: {error}")
    return "\n".join(lines)


# --- A transport probe (for tests): which transport would a reader on this host pick? -----------


class TransportProbe(Actor):
    """Takes a lease on the newest snapshot, says which transport a generator here would pick, gives it back."""

    @endpoint
    async def pick(self, store) -> dict:
        import torch

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where a generator here computes
        snapshot = await asyncio.wait_for(store.acquire.call_one(-1), 60)  # any version, the first (0) included
        if snapshot is None:
            raise RuntimeError("the store holds no version yet: let the trainer publish one before probing")
        try:
            return {"host": host_identity(), "picked": pick_transport(snapshot.offers, "auto", device),
                    "offered_by": {name: getattr(offer, "host", None) for name, offer in snapshot.offers.items()}}
        finally:
            await asyncio.wait_for(store.release.call_one(snapshot.lease), 60)


def spawn_on(hosts, host: int, name: str, actor_class: type, *args):
    """`actor_class` on a new process on host number `host` of `hosts`, named as a job host (for tests)."""
    procs = hosts.slice(hosts=host).spawn_procs(per_host={"procs": 1}, bootstrap_command=on_host({HOST_ENV: name}))
    return procs, procs.spawn(f"{actor_class.__name__.lower()}_{name}", actor_class, *args)


# --- The command line ------------------------------------------------------------------------------


def add_host_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("beyond one host (docs/appendix/multihost.md)")
    group.add_argument("--hosts", type=int, default=0, metavar="N",
                       help="the trainer on one host, the generators spread over N-1 others, through a Monarch job")
    group.add_argument("--scheduler", choices=SCHEDULERS, default="process",
                       help="who starts the hosts: process (each host a local worker process, the default), "
                            "slurm (monarch.job.SlurmJob) or kubernetes (monarch.job.kubernetes.KubernetesJob)")
    group.add_argument("--kill-host-at", type=int, default=0, metavar="STEP",
                       help="SIGKILL a generator host after this step (hosts on this machine: simulated ones, "
                            "or a node of koans/cluster/slurm_cluster.sh)")
    group.add_argument("--gpus-per-host", type=int, default=None, metavar="G",
                       help="GPUs per cluster host: each generator on a host gets one of them")
    group.add_argument("--slurm-partition", help="SlurmJob: the partition to submit to")
    group.add_argument("--slurm-account", help="SlurmJob: the account to charge")
    group.add_argument("--slurm-time", metavar="HH:MM:SS", help="SlurmJob: the job's time limit")
    group.add_argument("--slurm-log-dir", default=".koans/slurm", metavar="DIR",
                       help="SlurmJob: where the workers' output goes (default: .koans/slurm, under the current "
                            "directory, which every node must see)")
    group.add_argument("--k8s-namespace", help="KubernetesJob: the namespace of the MonarchMesh resources")
    group.add_argument("--k8s-image", help="KubernetesJob: the worker image (this project and its environment inside)")
    group.add_argument("--k8s-shm", metavar="SIZE", help="KubernetesJob: size of each pod's /dev/shm, e.g. 16Gi "
                                                         "(the trainer stages its weights there)")
    group.add_argument("--kubeconfig", metavar="PATH", help="KubernetesJob: a kubeconfig, to run from outside the cluster")


def missing_scheduler(scheduler: str) -> str | None:
    """What this machine lacks to launch on `scheduler`, as a message that says what to do; None if nothing."""
    import importlib.util
    import shutil

    if scheduler == "slurm" and shutil.which("sbatch") is None:
        return ("--scheduler slurm submits the job with sbatch, which is not on this machine's PATH: run the "
                "command on a Slurm login node (docs/appendix/multihost.md), or leave --scheduler out to simulate "
                "the hosts here")
    if scheduler == "kubernetes" and importlib.util.find_spec("kubernetes") is None:
        return ("--scheduler kubernetes needs the kubernetes package, which this project does not install: "
                "pip install kubernetes (docs/appendix/multihost.md)")
    return None


def hosts_from_args(parser: argparse.ArgumentParser, args) -> HostsSpec | None:
    """The HostsSpec the flags ask for, or None for today's single host."""
    if not args.hosts:
        if args.kill_host_at or args.scheduler != "process":
            parser.error("--kill-host-at and --scheduler need --hosts N")
        return None
    if args.scheduler == "kubernetes" and not (args.k8s_namespace and args.k8s_image):
        parser.error("--scheduler kubernetes needs --k8s-namespace and --k8s-image")
    slurm = {key: value for key, value in (("partition", args.slurm_partition), ("account", args.slurm_account),
                                          ("time_limit", args.slurm_time),
                                          ("log_dir", args.slurm_log_dir and os.path.abspath(args.slurm_log_dir)))
             if value is not None}
    kubernetes = {"namespace": args.k8s_namespace, "image": args.k8s_image, "shm": args.k8s_shm,
                  "kubeconfig": args.kubeconfig}
    try:
        return HostsSpec(args.hosts, args.scheduler, args.gpus_per_host, args.kill_host_at,
                         lost_after_s=10.0 if args.scheduler == "process" else None, slurm=slurm,
                         kubernetes=kubernetes)
    except ValueError as err:
        parser.error(str(err))
