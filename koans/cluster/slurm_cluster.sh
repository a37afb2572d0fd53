#!/usr/bin/env bash
# A real Slurm cluster of N nodes on this machine, from Debian's packages, for chapter 10's
# multi-host path (docs/appendix/multihost.md). For maintainers (CI) and curious learners with root.
#
#   koans/cluster/slurm_cluster.sh start [N]      start a controller and N nodes (default 3), n1..nN; a second
#                                         start restarts any node that died (kill-node) and waits
#   koans/cluster/slurm_cluster.sh run CMD...     run CMD as a client: Slurm's tools on PATH, the nodes' names
#                                         resolvable (Monarch needs that); e.g.
#       koans/cluster/slurm_cluster.sh run .venv/bin/python -m solutions.ch10_qwen_grpo --hosts 3 --scheduler slurm
#   koans/cluster/slurm_cluster.sh env            export lines for sinfo, squeue, scancel in this shell:
#                                         eval "$(koans/cluster/slurm_cluster.sh env)"
#   koans/cluster/slurm_cluster.sh status         is it up? (exit 0 if so) and sinfo
#   koans/cluster/slurm_cluster.sh kill-node NAME SIGKILL every process of node NAME, as when a machine fails
#   koans/cluster/slurm_cluster.sh stop           end everything start made: daemons, namespaces, mounts, bridge
#   koans/cluster/slurm_cluster.sh build          only build (or check) the cached Debian 13 root
#
# Why a Debian 13 root: Monarch 0.7.0's SlurmJob reads `squeue --json`, which it can use on Slurm 24.11
# but not on Debian 12's Slurm 22.05 (its squeue --json ignores --job; its job_resources.nodes is a
# string). So Debian 13's Slurm 24.11 is installed with debootstrap into a directory cached at
# $KOANS_SLURM_CACHE (default /var/cache/koans-slurm; about 300 MB, 1-2.5 minutes the first time).
#
# What start builds, all of it undone by stop (and by start itself if it fails or is interrupted):
#   - a bridge (koans-br0, $KOANS_SLURM_NET.1/24, default 10.77.0.1) on this machine;
#   - a controller "ctl" and nodes n1..nN: each a network, hostname and mount namespace held by one
#     process (argv[0] koans-slurm-<name>), on the bridge, with its own address. Its daemons
#     (munged and slurmctld on ctl, slurmd on a node) run chrooted into the Debian 13 root, with
#     this machine's /root, /home, /tmp, /work, /opt, /srv, the project and its Python bound in at
#     the same paths: the "shared filesystem" of the cluster. Jobs therefore run this machine's
#     Python from the project's .venv (the same interpreter at the same path on every node);
#   - a client ("login") mount namespace sharing this machine's network, with its own /etc/hosts:
#     the client (run) resolves n1..nN, and this machine's name to the bridge address, since
#     Monarch refuses a hostname that resolves only to loopback. This machine's /etc/hosts is
#     never touched;
#   - runtime files in /run/koans-slurm: slurm.conf, the munge key and socket, spool, logs, and
#     wrappers for Slurm's client tools (they run Debian 13's binaries with its own loader).
# Nothing is installed on this machine but debootstrap (apt-get, if missing).
#
# Settings (environment): KOANS_SLURM_CACHE (where the root is cached), KOANS_SLURM_NET (the /24 of the
# bridge, default 10.77.0), KOANS_SLURM_MIRROR (Debian mirror), KOANS_SLURM_PYTHON (the jobs' Python,
# default the project's .venv), KOANS_SLURM_SHARED (more directories every node sees),
# KOANS_SLURM_NODE_TIMEOUT (Slurm's SlurmdTimeout, default 30 s), KOANS_SLURM_KEEP=1 (a start that
# fails leaves what it made running, to read its logs in /run/koans-slurm/log; stop undoes it).
set -Eeuo pipefail

CACHE=${KOANS_SLURM_CACHE:-/var/cache/koans-slurm}
ROOT=$CACHE/trixie
STATE=/run/koans-slurm
NET=${KOANS_SLURM_NET:-10.77.0}
BRIDGE=koans-br0
MIRROR=${KOANS_SLURM_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
PACKAGES=slurmd,slurmctld,slurm-client,munge,libffi8,libssl3t64,libsqlite3-0,zlib1g,liblzma5,libbz2-1.0,libreadline8t64,libuuid1,libncursesw6,libexpat1,libstdc++6
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # koans/cluster/ -> the project
PYTHON=${KOANS_SLURM_PYTHON:-$REPO/.venv/bin/python}
MARK=koans-slurm-  # argv[0] prefix of the processes that hold the namespaces
TOOLS="sbatch srun squeue scancel sinfo scontrol salloc sacct"
START_TIMEOUT=${KOANS_SLURM_START_TIMEOUT:-60}

exec 7>&2  # messages go here, even from a trap that runs while a command's stderr is /dev/null
say() { printf 'slurm_cluster: %s\n' "$*" >&7; }
die() { say "$*"; exit 1; }

# --- what this machine must have --------------------------------------------------------------

check_machine() {
    local missing=()
    [ "$(id -u)" -eq 0 ] || die "must run as root (it creates network namespaces, a bridge and mounts)"
    for tool in unshare nsenter ip chroot setsid mount flock; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing commands: ${missing[*]} (Debian packages util-linux, iproute2, coreutils)"
    unshare --net --uts --mount true 2>/dev/null \
        || die "cannot create network, hostname and mount namespaces here (unshare --net --uts --mount failed): a container without CAP_SYS_ADMIN, or a kernel without namespaces"
    if ip -4 addr show | grep -q " inet $NET\." && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        die "the subnet $NET.0/24 is already in use on this machine: pick another with KOANS_SLURM_NET=10.x.y"
    fi
}

check_python() {  # the jobs run the client's Python at its path: it must be on a directory the nodes share
    local python=$PYTHON real
    if [ ! -x "$python" ]; then  # no .venv yet (CI starts the cluster first): the one python3 would make
        python=$(command -v python3 || true)
        say "no $PYTHON yet: the nodes will see it once it exists (the project's directory is shared)"
        [ -n "$python" ] || return 0
    fi
    real=$(readlink -f "$python")
    case "$real" in
        /usr/local/*) ;;
        /usr/*|/bin/*|/lib/*) die "the jobs' Python $python is $real, in this machine's /usr, which the nodes (a Debian 13 root) do not share: make the .venv from a Python installed elsewhere (pyenv, uv), or set KOANS_SLURM_PYTHON";;
    esac
}

# --- the Debian 13 root (cached) ------------------------------------------------------------------

root_ready() {  # the daemons are links through the root's own /etc/alternatives: look from inside
    [ -d "$ROOT/usr" ] && chroot "$ROOT" test -x /usr/sbin/slurmd -a -x /usr/sbin/slurmctld -a -x /usr/sbin/munged
}

build_root() {
    if root_ready; then
        return 0
    fi
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap (apt-get install debootstrap)"
        apt-get update -qq >/dev/null || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
            || die "debootstrap is missing and apt-get could not install it"
    fi
    [ -e /usr/share/debootstrap/scripts/$SUITE ] || die "this debootstrap does not know Debian 13 ($SUITE): update the debootstrap package"
    local started=$SECONDS partial=$ROOT.partial
    say "building the Debian 13 root with Slurm 24.11 in $ROOT (once; 2-3 minutes)"
    mkdir -p "$CACHE"
    rm -rf "$partial"
    # In a mount namespace of its own: the /proc and /sys that debootstrap mounts go with it, even if
    # it is interrupted.
    if ! unshare --mount --propagation private debootstrap --variant=minbase --include="$PACKAGES" \
            "$SUITE" "$partial" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
        tail -n 20 "$CACHE/debootstrap.log" >&2
        rm -rf "$partial"
        die "debootstrap failed (log: $CACHE/debootstrap.log)"
    fi
    rm -f "$partial"/var/cache/apt/archives/*.deb
    mv "$partial" "$ROOT"
    say "built the root in $((SECONDS - started)) s: $(chroot "$ROOT" dpkg-query -W -f='${Package} ${Version}\n' slurmd munge | tr '\n' ' ')"
}

# --- namespaces -----------------------------------------------------------------------------------

holder_pid() {  # the pid of the process that holds namespace $1, or nothing
    local pid
    for pid in $(pgrep -f "^$MARK$1( |\$)" 2>/dev/null || true); do
        echo "$pid"
        return 0
    done
}

all_holders() { pgrep -f "^$MARK" 2>/dev/null || true; }

new_holder() {  # new_holder NAME UNSHARE-FLAGS...: a process in new namespaces, named $MARK$NAME
    local name=$1
    shift
    # A clean environment: nothing of the caller's (a test session's tag, say) lives on in the cluster.
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin setsid unshare "$@" --propagation private -- \
        bash -c "exec -a $MARK$name sleep infinity" \
        </dev/null >/dev/null 2>&1 7>&- 9>&- &
    local pid=$!
    for _ in $(seq 50); do
        [ "$(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null)" = "$MARK$name infinity " ] && { echo "$pid"; return 0; }
        sleep 0.05
    done
    die "the namespaces of $name did not come up"
}

members() {  # members HOLDER-PID: every live process in the holder's mount namespace
    local ns
    ns=$(readlink "/proc/$1/ns/mnt" 2>/dev/null) || return 0
    find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/mnt' -printf '%l %h\n' 2>/dev/null \
        | awk -v ns="$ns" '$1 == ns {split($2, part, "/"); print part[3]}'
    return 0
}

kill_namespace() {  # kill_namespace HOLDER-PID: SIGKILL every process in it; the namespaces go with them
    local pids
    pids=$(members "$1")
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    for _ in $(seq 100); do
        alive "$1" || return 0
        sleep 0.05
    done
    return 0
}

alive() {  # a process that runs (a killed one may stay a zombie for a while: its parent reaps it)
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

in_ns() {  # in_ns HOLDER-PID CMD...: run CMD in the holder's network, hostname and mount namespaces
    local pid=$1
    shift
    nsenter --target "$pid" --net --uts --mount -- "$@" 7>&- 9>&-
}

shared_dirs() {  # this machine's directories every node sees at the same path
    local dirs="/root /home /tmp /work /opt /srv $REPO ${KOANS_SLURM_SHARED:-}" python
    for python in "$PYTHON" "$(command -v python3 || true)"; do  # the Python's installation, wherever it is
        [ -x "$python" ] && dirs="$dirs $(dirname "$(dirname "$(readlink -f "$python")")")"
    done
    for d in $dirs; do
        [ -d "$d" ] || continue
        d=$(readlink -f "$d")
        case "$d" in  # never over the root's own system directories (/usr/local is empty there)
            /usr/local|/usr/local/*) ;;
            /|/usr|/usr/*|/bin|/sbin|/lib|/lib64|/etc|/etc/*|/var|/boot|/proc*|/sys*|/dev*|/run*) continue;;
        esac
        echo "$d"
    done | sort -u
}

enter_root() {  # mount, in the holder's mount namespace, what the chroot of a node needs
    local pid=$1 shared=$2
    in_ns "$pid" bash -euc '
        root=$1; state=$2; shift 2
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /dev "$root/dev"
        mkdir -p "$root$state"
        mount --bind "$state" "$root$state"
        mount --bind "$state/hosts" "$root/etc/hosts"
        for d in "$@"; do
            mkdir -p "$root$d"
            mount --rbind "$d" "$root$d"
        done' enter "$ROOT" "$STATE" $shared
}

plug() {  # plug HOLDER-PID HOST-END ADDRESS HOSTNAME: a veth from the bridge into the namespace
    local pid=$1 end=$2 address=$3 name=$4
    ip link add "$end" type veth peer name eth0 netns "$pid"
    ip link set "$end" master "$BRIDGE" up
    in_ns "$pid" bash -euc "
        ip link set lo up
        ip addr add $address/24 dev eth0
        ip link set eth0 up
        ip route add default via $NET.1
        hostname $name"
}

in_root() {  # in_root HOLDER-PID CMD...: CMD chrooted into the Debian 13 root, with a clean environment
    local pid=$1
    shift
    in_ns "$pid" chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root SLURM_CONF="$STATE/slurm.conf" "$@"
}

# --- configuration --------------------------------------------------------------------------------

node_names() { seq -f 'n%g' 1 "$1"; }

write_config() {
    local nodes=$1 n
    mkdir -p "$STATE"/{bin,log,munge,ctld,spool}
    chmod 0755 "$STATE" "$STATE/munge"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
        chmod 0400 "$STATE/munge/munge.key"
    fi
    {
        echo "127.0.0.1 localhost"
        echo "$NET.1 $(hostname)"
        echo "$NET.2 ctl"
        for n in $(seq "$nodes"); do echo "$NET.$((10 + n)) n$n"; done
    } >"$STATE/hosts"
    echo "$nodes" >"$STATE/nodes"
    cat >"$STATE/slurm.conf" <<EOF
# written by koans/cluster/slurm_cluster.sh: a controller and $nodes nodes in namespaces on this machine
ClusterName=koans
SlurmctldHost=ctl($NET.2)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket.2
PluginDir=$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/ctld/slurmctld.pid
SlurmdPidFile=$STATE/spool/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout=${KOANS_SLURM_NODE_TIMEOUT:-30}
InactiveLimit=0
KillWait=5
MinJobAge=60
EOF
    for n in $(seq "$nodes"); do
        echo "NodeName=n$n NodeAddr=$NET.$((10 + n)) CPUs=$(nproc) State=UNKNOWN" >>"$STATE/slurm.conf"
    done
    echo "PartitionName=koans Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$STATE/slurm.conf"
    # The client tools run Debian 13's binaries with Debian 13's own loader and libraries, so nothing
    # of them leaks into the environment of what they start. Inside a node the same paths work too:
    # the root holds a link from $ROOT to / (made by start).
    local tool
    for tool in $TOOLS; do
        cat >"$STATE/bin/$tool" <<EOF
#!/bin/sh
export SLURM_CONF="\${SLURM_CONF:-$STATE/slurm.conf}"
exec "$ROOT/usr/lib64/ld-linux-x86-64.so.2" --library-path "$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm" "$ROOT/usr/bin/$tool" "\$@"
EOF
        chmod 0755 "$STATE/bin/$tool"
    done
}

client_env() {
    echo "export KOANS_SLURM=$STATE"
    echo "export SLURM_CONF=$STATE/slurm.conf"
    echo "export PATH=$STATE/bin:\$PATH"
}

# --- start ----------------------------------------------------------------------------------------

start_node() {  # start_node NAME ADDRESS SHARED-DIRS
    local name=$1 address=$2 shared=$3 pid
    pid=$(new_holder "$name" --net --uts --mount)
    plug "$pid" "ks-$name" "$address" "$name"
    enter_root "$pid" "$shared"
    mkdir -p "$STATE/spool/$name"
    in_root "$pid" /usr/sbin/slurmd -N "$name" </dev/null >>"$STATE/log/start.log" 2>&1
}

wait_for() {  # wait_for SECONDS WHAT CMD...: until CMD succeeds
    local limit=$1 what=$2 deadline=$((SECONDS + $1))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            say "$what: not after $limit s; the logs say:"
            tail -n 5 "$STATE"/log/*.log >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.3
    done
}

sinfo_() { "$STATE/bin/sinfo" "$@"; }

nodes_idle() {  # all N nodes idle (nothing running, nothing completing)
    local want=$1 idle
    idle=$(sinfo_ -h -N -t idle -o '%N' | sort -u | wc -l)
    [ "$idle" -eq "$want" ]
}

no_jobs() { [ -z "$("$STATE/bin/squeue" -h -o %i)" ]; }

cmd_start() {
    local nodes=${1:-3} started=$SECONDS
    [[ "$nodes" =~ ^[1-9][0-9]?$ ]] || die "start N: N is the number of nodes, 1 to 99 (got '$nodes')"
    check_machine
    check_python
    mkdir -p "$CACHE"
    exec 9>"$CACHE/lock"
    flock -w 300 9 || die "another start or stop of the cluster is running (lock $CACHE/lock)"
    if [ -n "$(holder_pid ctl)" ]; then
        local had
        had=$(cat "$STATE/nodes" 2>/dev/null || echo 0)
        if [ "$had" = "$nodes" ]; then
            revive_nodes "$nodes"
            return 0
        fi
        say "running with $had nodes: stopping it first"
        stop_all
    elif [ -n "$(all_holders)" ] || [ -d "$STATE" ] || ip link show "$BRIDGE" >/dev/null 2>&1; then
        say "cleaning up what a previous start left"
        stop_all
    fi
    if [ -n "${KOANS_SLURM_KEEP:-}" ]; then  # for debugging a start: leave what failed running
        trap 'say "start failed; KOANS_SLURM_KEEP is set, so it stays as it is (logs: $STATE/log; stop undoes it)"' EXIT
    else
        trap 'say "start failed or was interrupted: undoing it"; stop_all' EXIT
    fi
    trap 'exit 130' INT TERM HUP
    local cached=yes
    root_ready || cached=no
    build_root
    local built=$SECONDS
    mkdir -p "$(dirname "$ROOT$ROOT")"
    [ -L "$ROOT$ROOT" ] || ln -sfn / "$ROOT$ROOT"  # $ROOT/... names the same file inside a node as outside
    touch "$ROOT/etc/hosts"  # a mount point for the cluster's hosts file
    write_config "$nodes"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local ctl shared
    shared=$(shared_dirs | tr '\n' ' ')
    ctl=$(new_holder ctl --net --uts --mount)
    plug "$ctl" ks-ctl "$NET.2" ctl
    enter_root "$ctl" ""
    in_root "$ctl" /usr/sbin/munged --force --key-file="$STATE/munge/munge.key" \
        --socket="$STATE/munge/munge.socket.2" --pid-file="$STATE/munge/munged.pid" \
        --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed" >>"$STATE/log/start.log" 2>&1
    wait_for 10 "munged" test -S "$STATE/munge/munge.socket.2"
    in_root "$ctl" /usr/sbin/slurmctld -c </dev/null >>"$STATE/log/start.log" 2>&1
    local login
    login=$(new_holder login --mount)
    nsenter --target "$login" --mount -- mount --bind "$STATE/hosts" /etc/hosts
    wait_for 30 "slurmctld answering" sinfo_ -h
    local n
    for n in $(seq "$nodes"); do
        start_node "n$n" "$NET.$((10 + n))" "$shared"
    done
    wait_for "$START_TIMEOUT" "all $nodes nodes idle" nodes_idle "$nodes"
    trap - EXIT INT TERM HUP
    say "up: controller ctl and $nodes nodes in $((SECONDS - started)) s (the Debian 13 root: $([ $cached = yes ] && echo cached || echo "built in $((built - started)) s"))"
    sinfo_ -N -o '%N %T %c %o' >&2
}

revive_nodes() {  # start again the nodes that died (kill-node), then wait until all are idle and no job is left
    local nodes=$1 n shared
    shared=$(shared_dirs | tr '\n' ' ')
    for n in $(seq "$nodes"); do
        if [ -z "$(holder_pid "n$n")" ]; then
            say "node n$n is gone: starting it again"
            ip link del "ks-n$n" 2>/dev/null || true
            start_node "n$n" "$NET.$((10 + n))" "$shared"
        fi
    done
    wait_for "$START_TIMEOUT" "all $nodes nodes idle" nodes_idle "$nodes"
    wait_for "$START_TIMEOUT" "no job left" no_jobs
    say "up: $nodes nodes idle"
}

# --- stop -----------------------------------------------------------------------------------------

stop_all() {
    # Every process in the namespaces of the cluster (the clients of run, the nodes, the controller),
    # at once; then wait until they are gone, reaped too, so that ps shows none of them.
    local holder pids="" pid
    for holder in $(all_holders); do
        pids="$pids $(members "$holder")"
    done
    if [ -n "${pids// }" ]; then
        kill -9 $pids 2>/dev/null || true
        for _ in $(seq 100); do
            for pid in $pids; do [ -e "/proc/$pid" ] && break; pid=""; done
            [ -z "$pid" ] && break
            sleep 0.05
        done
    fi
    ip link del "$BRIDGE" 2>/dev/null || true
    local end
    for end in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^ks-' || true); do
        ip link del "$end" 2>/dev/null || true
    done
    rm -rf "$STATE"
    [ -z "$(all_holders)" ] || say "warning: processes still hold namespaces: $(all_holders | tr '\n' ' ')"
}

cmd_stop() {
    [ "$(id -u)" -eq 0 ] || die "must run as root"
    local started=$SECONDS
    if [ -d "$CACHE" ]; then
        exec 9>"$CACHE/lock"
        flock -w 300 9 || say "another start or stop holds $CACHE/lock: stopping anyway"
    fi
    trap '' INT TERM HUP  # finish undoing, whatever arrives
    stop_all
    say "stopped in $((SECONDS - started)) s: no Slurm daemon, namespace, mount or bridge of the cluster left (the Debian 13 root stays cached in $ROOT)"
}

# --- the rest -------------------------------------------------------------------------------------

cmd_status() {
    if [ -z "$(holder_pid ctl)" ] || [ ! -x "$STATE/bin/sinfo" ]; then
        echo "not running"
        return 1
    fi
    local nodes
    nodes=$(cat "$STATE/nodes")
    if ! nodes_idle "$nodes" 2>/dev/null; then
        echo "running, but not all $nodes nodes are idle:"
        sinfo_ -N -o '%N %T' 2>&1 || true
        return 1
    fi
    echo "running: controller ctl, $nodes nodes idle ($(sinfo_ -V 2>&1))"
}

cmd_run() {
    [ $# -gt 0 ] || die "run CMD...: which command?"
    local login
    login=$(holder_pid login)
    [ -n "$login" ] || die "the cluster is not running: koans/cluster/slurm_cluster.sh start"
    [ "$(id -u)" -eq 0 ] || die "must run as root"
    exec nsenter --target "$login" --mount --wd="$PWD" -- env KOANS_SLURM="$STATE" SLURM_CONF="$STATE/slurm.conf" \
        PATH="$STATE/bin:$PATH" "$@" 7>&-
}

cmd_kill_node() {
    local name=${1:-} pid
    [ -n "$name" ] || die "kill-node NAME: which node (n1, n2, ...)?"
    pid=$(holder_pid "$name")
    [ -n "$pid" ] || die "no node $name is running"
    kill_namespace "$pid"
    say "node $name killed: its slurmd, its jobs' processes and its network are gone (start brings it back)"
}

case "${1:-help}" in
    start) shift; cmd_start "$@";;
    stop) cmd_stop;;
    status) cmd_status;;
    env) client_env;;
    run) shift; [ "${1:-}" = "--" ] && shift; cmd_run "$@";;
    kill-node) shift; cmd_kill_node "$@";;
    build) check_machine; build_root; say "the root is ready in $ROOT";;
    help|-h|--help) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//';;
    *) die "unknown command '$1' (start, run, env, status, kill-node, stop, build, help)";;
esac
