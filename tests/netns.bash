# netns.bash: machines for the multi-node tests, made of network namespaces of this
# machine (tests/multinode.bats, tests/bench/bench_multinode.sh). Root only; needs `ip`
# (iproute2) and, for netns_impair, `tc`.
#
# netns_setup N makes hosts 1..N: namespaces cifar-h<i>-<run> (<run>: this run's own
# suffix, so that parallel runs never clash) with eth0 at 10.231.0.<i>/24 and lo, all on
# one bridge in a namespace of their own, cifar-br-<run>. Nothing leaves the machine:
# the hosts have no default route and the bridge has no port outside them. The
# filesystem is shared: a run folder under $BATS_TEST_TMPDIR is every host's.
#
#   netns_setup N [impairable]     the hosts (impairable: see netns_impair)
#   netns_addr I                   10.231.0.I
#   netns_exec I CMD...            CMD in host I, in the foreground
#   netns_run I NAME CMD...        CMD in host I in the background; stdout and stderr
#                                  in $NETNS_LOGS/NAME.log, its pid in NETNS_PID[NAME]
#   netns_wait NAME SECONDS        waits for NAME's command, at most SECONDS (then kills
#                                  its host and fails); its exit status in NETNS_STATUS
#                                  (128+N when a signal N ended it)
#   netns_kill_host I              SIGKILL to every process in host I (`ip netns pids`)
#   netns_pids I                   the processes in host I
#   netns_link_down I / _up I      cuts / restores host I's cable (its bridge port)
#   netns_impair LOSS DELAY_MS     LOSS% loss and DELAY_MS delay on every link
#                                  (`tc netem` on each host's eth0; on a kernel without
#                                  sch_netem the hosts made `impairable` are linked by
#                                  tests/netns_switch.py, which does the same in user space)
#   netns_teardown                 kills every process of the hosts, removes them
#   netns_sweep                    removes namespaces of this prefix whose run is gone
#
# Cleanup always happens: under bats the suite's teardown calls netns_teardown (and
# netns_setup sweeps what a run killed hard left); elsewhere netns_setup installs an
# EXIT trap. Every wait has a deadline.

NETNS_PREFIX=cifar
NETNS_NET=10.231.0
NETNS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
declare -gA NETNS_PID=() NETNS_HOST_OF=()  # -g: bats loads this file inside a function
NETNS_HOSTS=0
NETNS_MODE=
NETNS_STATUS=

# Why this machine cannot make hosts, or nothing when it can.
netns_unusable() {
    [ "$(id -u)" -eq 0 ] || { echo "network namespaces need root"; return 0; }
    command -v ip >/dev/null || { echo "no ip command (iproute2)"; return 0; }
    return 0
}

netns_host() { echo "$NETNS_PREFIX-h$1-$NETNS_RUN"; }
netns_bridge_ns() { echo "$NETNS_PREFIX-br-$NETNS_RUN"; }
netns_addr() { echo "$NETNS_NET.$1"; }

# The run's suffix: the pid of the shell that makes the hosts (the sweep's test of
# liveness; $BASHPID here, not in a $(...) subshell) and a random word (a recycled pid
# is not the same run).
netns_new_run_id() { NETNS_RUN="$BASHPID$(printf 'x%04x' $((RANDOM % 65536)))"; }

# Namespaces of this prefix whose run's shell is gone (a run killed before its
# cleanup): their processes killed, the namespaces removed.
netns_sweep() {
    local ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$NETNS_PREFIX-(h[0-9]+|br)-[0-9]+x[0-9a-f]{4}\$"); do
        pid=${ns##*-}
        pid=${pid%x*}
        kill -0 "$pid" 2>/dev/null && continue
        echo "netns: removing the stale namespace $ns (its run, pid $pid, is gone)" >&2
        netns_kill_ns "$ns"
        ip netns del "$ns" 2>/dev/null || true  # it may vanish under a parallel sweep
    done
}

netns_kill_ns() { # namespace
    local p
    for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
}

# Whether this kernel has tc's netem (probed in a namespace of its own).
netns_kernel_has_netem() {
    local probe
    probe="$NETNS_PREFIX-probe-$BASHPID"
    ip netns add "$probe" || return 1
    local ok=1
    ip netns exec "$probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
    ip netns del "$probe"
    return $ok
}

netns_setup() { # hosts [impairable]
    local n=$1 i host
    local why
    why=$(netns_unusable)
    [ -z "$why" ] || { echo "netns_setup: $why" >&2; return 1; }
    netns_sweep
    netns_new_run_id
    NETNS_HOSTS=$n
    NETNS_LOGS=${NETNS_LOGS:-${BATS_TEST_TMPDIR:-$(mktemp -d /tmp/cifar-netns.XXXXXX)}/hosts}
    mkdir -p "$NETNS_LOGS"
    [ -n "${BATS_TEST_NAME:-}" ] || trap netns_teardown EXIT
    NETNS_MODE=bridge
    if [ "${2:-}" = impairable ] && ! netns_kernel_has_netem; then NETNS_MODE=switch; fi
    for i in $(seq "$n"); do
        host=$(netns_host "$i")
        ip netns add "$host"
        ip -n "$host" link set lo up
    done
    if [ "$NETNS_MODE" = bridge ]; then netns_link_bridge; else netns_link_switch; fi
    for i in $(seq "$n"); do
        host=$(netns_host "$i")
        ip -n "$host" addr add "$(netns_addr "$i")/24" dev eth0
        ip -n "$host" link set eth0 up
    done
    netns_wait_links
}

# Hosts on a kernel bridge: a veth pair per host, eth0 in the host, p<i> on the bridge.
netns_link_bridge() {
    local br i
    br=$(netns_bridge_ns)
    ip netns add "$br"
    ip -n "$br" link add br0 type bridge
    ip -n "$br" link set br0 up
    for i in $(seq "$NETNS_HOSTS"); do
        ip link add eth0 netns "$(netns_host "$i")" type veth peer name "p$i" netns "$br"
        ip -n "$br" link set "p$i" master br0
        ip -n "$br" link set "p$i" up
    done
}

# Hosts on tests/netns_switch.py: a TAP device per host, made by the switch (in this
# namespace, under a unique name), moved into the host as its eth0.
netns_link_switch() {
    local i taps=()
    for i in $(seq "$NETNS_HOSTS"); do taps+=("ct$i$NETNS_RUN"); done  # 15 characters at most
    NETNS_SWITCH_CONTROL="$NETNS_LOGS/switch.control"
    echo "0 0" > "$NETNS_SWITCH_CONTROL"
    rm -f "$NETNS_LOGS/switch.ready"
    netns_detached /usr/bin/python3 "$NETNS_HERE/netns_switch.py" --owner "$BASHPID" --control "$NETNS_SWITCH_CONTROL" \
        --ready "$NETNS_LOGS/switch.ready" "${taps[@]}" > "$NETNS_LOGS/switch.log" 2>&1 &
    NETNS_PID[switch]=$!
    netns_deadline 10 test -s "$NETNS_LOGS/switch.ready" || { cat "$NETNS_LOGS/switch.log" >&2; return 1; }
    for i in $(seq "$NETNS_HOSTS"); do
        ip link set "${taps[$((i - 1))]}" netns "$(netns_host "$i")"
        ip -n "$(netns_host "$i")" link set "${taps[$((i - 1))]}" name eth0
    done
    echo "netns: this kernel has no tc netem: the hosts are linked by tests/netns_switch.py" >&2
}

# Polls CMD every 0.1 s for at most SECONDS: its success, or failure at the deadline.
netns_deadline() { # seconds cmd...
    local tries=$(($1 * 10))
    shift
    for _ in $(seq "$tries"); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}

netns_link_ready() { # i: eth0 up with its address usable (not tentative)
    ip -n "$(netns_host "$1")" -4 addr show dev eth0 | grep -q "inet $(netns_addr "$1")/" &&
        ip -n "$(netns_host "$1")" link show dev eth0 | grep -q "state UP\|state UNKNOWN"
}

netns_wait_links() {
    local i
    for i in $(seq "$NETNS_HOSTS"); do
        netns_deadline 10 netns_link_ready "$i" || { echo "netns: host $i's eth0 never came up" >&2; return 1; }
    done
}

netns_exec() { # i cmd...
    local i=$1
    shift
    ip netns exec "$(netns_host "$i")" "$@"
}

netns_run() { # i name cmd...
    local i=$1 name=$2
    shift 2
    rm -f "$NETNS_LOGS/$name.status"
    # The status through a file: bash may forget a background job's status once it has
    # reported it done. Not holding bats' fd 3: a leftover would hold the suite open.
    (
        status=0
        (netns_detached ip netns exec "$(netns_host "$i")" "$@") > "$NETNS_LOGS/$name.log" 2>&1 || status=$?
        echo "$status" > "$NETNS_LOGS/$name.status"
    ) >/dev/null 2>&1 3>&- &  # not bats' stdout or fd 3 (a leftover would hold the suite); no "Killed" lines
    NETNS_PID[$name]=$!
    NETNS_HOST_OF[$name]=$i
}

# Becomes CMD (an exec: call it in a subshell or in the background) without the
# descriptors above stderr (bats' fd 3 and its internal pipes among them): a process
# left running that holds one keeps the suite open. Closed in a fresh shell: bats' own
# traps in this one write to them.
netns_detached() { # cmd...
    exec bash -c 'for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; exec "$@"' netns "$@"
}

netns_log() { cat "$NETNS_LOGS/$1.log"; } # name

netns_wait() { # name seconds
    local name=$1
    NETNS_STATUS=
    if ! netns_deadline "$2" test -s "$NETNS_LOGS/$name.status"; then
        echo "netns: $name still runs after $2 s: its host $((NETNS_HOST_OF[$name])) is killed" >&2
        netns_kill_host "${NETNS_HOST_OF[$name]}"
        return 1
    fi
    NETNS_STATUS=$(cat "$NETNS_LOGS/$name.status")
    wait "${NETNS_PID[$name]}" 2>/dev/null || true  # reaped; its status is the file's
}

netns_pids() { ip netns pids "$(netns_host "$1")"; } # i

netns_kill_host() { # i
    netns_kill_ns "$(netns_host "$1")"
    netns_deadline 5 netns_host_empty "$1"
}

netns_host_empty() { [ -z "$(netns_pids "$1")" ]; } # i
netns_host_busy() { [ -n "$(netns_pids "$1")" ]; }  # i

netns_link_down() { netns_link_set "$1" down; } # i
netns_link_up() { netns_link_set "$1" up; }     # i

netns_link_set() { # i down|up: the bridge's port of host i (the host's eth0 under the switch)
    if [ "$NETNS_MODE" = bridge ]; then
        ip -n "$(netns_bridge_ns)" link set "p$1" "$2"
    else
        ip -n "$(netns_host "$1")" link set eth0 "$2"
    fi
}

netns_impair() { # loss-percent delay-ms
    local i
    if [ "$NETNS_MODE" = switch ]; then
        echo "$1 $2" > "$NETNS_SWITCH_CONTROL"
        kill -USR1 "${NETNS_PID[switch]}"
        netns_deadline 5 cmp -s "$NETNS_SWITCH_CONTROL" "$NETNS_SWITCH_CONTROL.applied"
        return
    fi
    for i in $(seq "$NETNS_HOSTS"); do
        ip netns exec "$(netns_host "$i")" tc qdisc replace dev eth0 root netem loss "$1%" delay "$2ms" ||
            { echo "netns: tc netem refused (a host made without 'impairable' on a kernel without netem?)" >&2; return 1; }
    done
}

# Waits at most 5 s for a background command of ours to end (its host's processes
# were killed), then kills it and what it started; reaps it.
netns_reap() { # pid
    if ! netns_deadline 5 netns_gone "$1"; then
        echo "netns: pid $1 outlived its host: killed" >&2
        pkill -9 -P "$1" || true  # its own children only; none left is fine
        kill -9 "$1" 2>/dev/null || true
    fi
    wait "$1" 2>/dev/null || true  # its status is not ours to judge here
}

netns_gone() { # pid: exited (a zombie until reaped counts as gone)
    local state
    state=$(ps -o stat= -p "$1") || return 0
    [[ "$state" == Z* ]]
}

netns_teardown() {
    local i ns
    [ -n "${NETNS_RUN:-}" ] || return 0
    for i in $(seq "$NETNS_HOSTS"); do netns_kill_ns "$(netns_host "$i")"; done
    if [ -n "${NETNS_PID[switch]:-}" ]; then kill "${NETNS_PID[switch]}" 2>/dev/null || true; fi
    for ns in $(ip netns list | awk '{print $1}' | grep -E -- "-$NETNS_RUN\$"); do
        ip netns del "$ns" 2>/dev/null || true  # already gone is fine
    done
    for i in "${!NETNS_PID[@]}"; do netns_reap "${NETNS_PID[$i]}"; done
    NETNS_PID=()
    NETNS_HOST_OF=()
    NETNS_RUN=
}
