#!/usr/bin/env bats
# Several machines, made of network namespaces of this one (tests/netns.bash): hosts
# 10.231.0.1..3 on a bridge, nothing routed off the machine, the filesystem shared.
#
# First the harness itself, with the rendezvous that exists on every build
# (`test_comm rendezvous-rank`, the exchange of shared/comm/rendezvous.c) run between
# hosts: the hosts reach each other and nothing else; strangers on rank 0's port from
# another host; a whole host killed; a link cut and restored; loss and delay on every
# link; and the cleanup. Then issue 22's scenarios, one `cifar-train --nnodes 2:3
# --nproc-per-node 2 --device cpu --rdzv-endpoint 10.231.0.1:PORT` per host: a host
# killed mid-epoch, a link cut and restored, loss and delay, a stranger on the
# rendezvous port, node 0's host lost and the rerun.
#
# Root only (CI is root): skipped, saying why, without root or `ip`.

bats_require_minimum_version 1.5.0
load helpers
load netns

setup_file() {
    if [ -n "$(netns_unusable)" ]; then return 0; fi
    export DATA="$BATS_FILE_TMPDIR/data"
    make_dataset "$DATA" --train 384 --test 64 --size 16 --seed 7
    export LMDB="$DATA/cifar10.lmdb"
    small_model "$BATS_FILE_TMPDIR/model.json"
    export MODEL="$BATS_FILE_TMPDIR/model.json"
    export STRANGERS="$BATS_FILE_TMPDIR/strangers.py"
    write_strangers "$STRANGERS"
}

setup() {
    why=$(netns_unusable)
    [ -z "$why" ] || skip_because "$why"
    TEST_COMM=${TEST_COMM:-$(ls "$BATS_TEST_DIRNAME"/../build/*/tests/test_comm 2>/dev/null | head -1)}
    [ -x "$TEST_COMM" ] || { echo "no test_comm binary (make test-bins, or set TEST_COMM)"; return 1; }
    PORT=$((20000 + RANDOM % 20000))  # every host has its own ports: no clash between runs
    JOB="bats-$$-$BATS_TEST_NUMBER"
    OUT="$BATS_TEST_TMPDIR"
    NETNS_LOGS="$OUT/hosts"
}

teardown() {
    netns_teardown
}

# ---------------------------------------------------------------- the harness

# Rank r of a world of w, in host h, for `test_comm rendezvous-rank` (rank 0 on host
# 1's address), in the background: the log hosts/rv-<r>.log, the blob $OUT/rendezvous-<r>.
rv_rank() { # host r w [env...]
    local h=$1 r=$2 w=$3
    shift 3
    netns_run "$h" "rv-$r" env -u CIFAR_RUN_ID -u SLURM_JOB_ID -u TORCHELASTIC_RUN_ID -u PMIX_NAMESPACE \
        -u CIFAR_JOB_TOKEN RANK="$r" WORLD_SIZE="$w" MASTER_ADDR="$(netns_addr 1)" MASTER_PORT="$PORT" \
        CIFAR_JOB_ID="$JOB" CIFAR_COMM_TIMEOUT=20 "$@" "$TEST_COMM" rendezvous-rank "$OUT"
}

ns_busy() { [ -n "$(ip netns pids "$1")" ]; } # namespace
processes_in() { [ "$(netns_pids "$1" | wc -l)" -eq "$2" ]; } # host count

# Host h listens on addr:port (ss run inside the host).
listening_in() { # host addr port
    netns_exec "$1" ss -Hltn "sport = :$3" | awk '{print $4}' | grep -qx "$2:$3"
}

# The strangers of issue 22 against ADDR:PORT, from the host this runs in: garbage
# (random bytes, then a close), a slowloris (a valid-looking first byte every 0.5 s,
# never a whole message), and COUNT connections held open at once. Prints one line
# per kind once done; holds the slowloris and the crowd for HOLD seconds.
#     /usr/bin/python3 $STRANGERS addr port count hold
write_strangers() { # file
    cat > "$1" <<'PY'
import os, socket, sys, time
addr, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def connect():
    return socket.create_connection((addr, port), timeout=5)
g = connect(); g.sendall(os.urandom(4096)); g.close()
time.sleep(0.5)  # judged before the crowd comes (a full server drops its oldest connection)
print("garbage sent", flush=True)
slow = connect()
crowd = []
for _ in range(count):
    try:
        crowd.append(connect())
    except OSError:
        pass  # the server may close some at once: they count as tried
print(f"crowd of {count}: {len(crowd)} connected", flush=True)
end = time.time() + hold
while time.time() < end:
    try:
        slow.send(b"C")
    except OSError:
        break  # dropped by the server: the slowloris is over
    time.sleep(0.5)
print("slowloris done", flush=True)
PY
}

@test "harness: 3 hosts on a bridge reach each other, nothing else; no default route, no port outside" {
    netns_setup 3
    for i in 1 2 3; do
        [ -z "$(netns_exec "$i" ip route show default)" ]
        [ "$(netns_exec "$i" ip -o -4 addr show dev eth0 | awk '{print $4}')" = "$(netns_addr "$i")/24" ]
    done
    # Only the hosts' ports on the bridge, in a namespace with no other link.
    [ "$(ip -n "$(netns_bridge_ns)" -o link show master br0 | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\n' ' ')" = "p1 p2 p3 " ]
    [ "$(ip -n "$(netns_bridge_ns)" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\n' ' ')" = "br0 lo p1 p2 p3 " ]
    # An address off the machine (TEST-NET-1) is unreachable at once from a host.
    run netns_exec 2 /usr/bin/python3 -c 'import socket; socket.create_connection(("192.0.2.1", 80), timeout=5)'
    assert_failure
    assert_output --partial "Network is unreachable"
    rv_rank 1 0 2
    netns_deadline 10 listening_in 1 "$(netns_addr 1)" "$PORT"
    rv_rank 2 1 2
    netns_wait rv-1 30
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-1; false; }
    netns_wait rv-0 30
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-0; false; }
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
}

@test "harness: strangers from host 3 on rank 0's port (garbage, slowloris, 200 connections): host 2's rank is served" {
    netns_setup 3
    rv_rank 1 0 2
    netns_deadline 10 listening_in 1 "$(netns_addr 1)" "$PORT"
    netns_run 3 strangers /usr/bin/python3 "$STRANGERS" "$(netns_addr 1)" "$PORT" 200 4
    netns_deadline 20 grep -qs "crowd of 200" "$NETNS_LOGS/strangers.log"
    rv_rank 2 1 2
    netns_wait rv-1 30
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-1; false; }
    netns_wait rv-0 30
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-0; false; }
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
    netns_log rv-0
    grep -q "wrong magic" "$NETNS_LOGS/rv-0.log"
    grep -q "dropped a connection from $(netns_addr 3)" "$NETNS_LOGS/rv-0.log"
    netns_wait strangers 30
    netns_log strangers
    [ "$NETNS_STATUS" -eq 0 ]
}

@test "harness: a host killed: none of its processes left, rank 0 on another host names the rank that never came" {
    netns_setup 2
    rv_rank 2 1 2   # waits for a rank 0 not there yet
    netns_run 2 sleeper sleep 300
    netns_deadline 5 processes_in 2 2
    netns_kill_host 2
    [ -z "$(netns_pids 2)" ]
    netns_wait rv-1 5
    [ "$NETNS_STATUS" -eq 137 ]
    netns_wait sleeper 5
    [ "$NETNS_STATUS" -eq 137 ]
    rv_rank 1 0 2 CIFAR_COMM_TIMEOUT=2
    netns_wait rv-0 30
    netns_log rv-0
    [ "$NETNS_STATUS" -eq 1 ]
    grep -q "rank 0: timed out after 2 s waiting for rank 1 to connect to port $PORT" "$NETNS_LOGS/rv-0.log"
}

@test "harness: a link cut, then restored: the rank that waited behind it gets through" {
    netns_setup 2
    rv_rank 1 0 2
    netns_deadline 10 listening_in 1 "$(netns_addr 1)" "$PORT"
    netns_link_down 2
    run netns_exec 2 /usr/bin/python3 -c "import socket; socket.create_connection(('$(netns_addr 1)', $PORT), timeout=1)"
    assert_failure   # the cable is out: nothing gets through
    rv_rank 2 1 2
    sleep 2
    [ ! -e "$OUT/rendezvous-1" ]
    netns_link_up 2
    netns_wait rv-1 30
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-1; false; }
    netns_wait rv-0 30
    [ "$NETNS_STATUS" -eq 0 ]
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
}

# A probe of the link from host 2 to host 1: the fastest of 5 TCP connects (a round
# trip each) and how many of 400 UDP datagrams arrived, as "connect_s=S received=N".
# The sink on host 1 counts the datagrams and tells the count over TCP when asked.
write_link_probe() { # file
    cat > "$1" <<'PY'
import select, socket, sys, time
role, addr = sys.argv[1], sys.argv[2]
if role == "sink":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, 9999))
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((addr, 9998)); t.listen(16)
    n, end = 0, time.time() + 60
    while time.time() < end:
        ready, _, _ = select.select([u, t], [], [], 1)
        if u in ready:
            u.recv(100); n += 1
        if t in ready:
            c, _ = t.accept(); c.settimeout(5)
            try:
                if c.recv(5) == b"count": c.sendall(b"%d\n" % n)
            except OSError:
                pass
            c.close()
    sys.exit(0)
best = 1e9
for _ in range(5):
    t0 = time.monotonic(); c = socket.create_connection((addr, 9998), timeout=10)
    best = min(best, time.monotonic() - t0); c.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(400):
    u.sendto(b"x", (addr, 9999)); time.sleep(0.002)
time.sleep(0.5)  # the last datagrams' delay
c = socket.create_connection((addr, 9998), timeout=10); c.sendall(b"count")
print("connect_s=%.3f received=%s" % (best, c.makefile().readline().strip()))
PY
}

probe_link() {
    local probe="$BATS_TEST_TMPDIR/probe.py"
    write_link_probe "$probe"
    netns_run 1 sink /usr/bin/python3 "$probe" sink "$(netns_addr 1)"
    netns_deadline 10 listening_in 1 "$(netns_addr 1)" 9998
    netns_exec 2 /usr/bin/python3 "$probe" probe "$(netns_addr 1)"
    netns_kill_host 1
}

@test "harness: 5% loss and 50 ms delay on every link: round trips take 100 ms, datagrams are lost, the rendezvous completes" {
    netns_setup 2 impairable
    run probe_link
    echo "unimpaired: $output"
    [[ "$output" == *"received=400"* ]]
    netns_impair 5 50
    run probe_link
    echo "impaired ($NETNS_MODE): $output"
    connect=$(echo "$output" | sed -n 's/.*connect_s=\([0-9.]*\).*/\1/p')
    received=$(echo "$output" | sed -n 's/.*received=\([0-9]*\).*/\1/p')
    # A connect is one round trip: 50 ms each way at least (docs/test-margins.md).
    awk -v c="$connect" 'BEGIN { exit !(c >= 0.1) }'
    # 400 datagrams at 5% loss: all 400 arrive with probability 0.95^400 < 1e-8.
    [ "$received" -lt 400 ]
    rv_rank 1 0 2
    netns_deadline 10 listening_in 1 "$(netns_addr 1)" "$PORT"
    rv_rank 2 1 2
    netns_wait rv-1 60
    [ "$NETNS_STATUS" -eq 0 ] || { netns_log rv-1; false; }
    netns_wait rv-0 60
    [ "$NETNS_STATUS" -eq 0 ]
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
}

@test "harness: teardown kills the hosts' processes and removes them; the sweep removes a dead run's namespaces" {
    netns_setup 2 impairable   # the switch too, where the kernel has no netem
    run_id=$NETNS_RUN
    netns_run 1 sleeper sleep 300
    netns_run 2 sleeper2 sleep 300
    netns_deadline 5 netns_host_busy 2
    victims="$(netns_pids 1) $(netns_pids 2) ${NETNS_PID[switch]:-}"
    netns_teardown
    [ -z "$(ip netns list | grep -- "-$run_id")" ]
    for p in $victims; do
        if kill -0 "$p" 2>/dev/null; then echo "pid $p survived the teardown"; false; fi
    done
    # A run killed before its cleanup: namespaces named after a pid that cannot be
    # alive (above the kernel's pid_max).
    dead=$(($(cat /proc/sys/kernel/pid_max) + 1))
    ip netns add "cifar-h1-${dead}x0bad"
    ip netns add "cifar-br-${dead}x0bad"
    netns_detached ip netns exec "cifar-h1-${dead}x0bad" sleep 300 >/dev/null 2>&1 &
    orphan=$!
    netns_deadline 5 ns_busy "cifar-h1-${dead}x0bad"   # in the namespace before the sweep
    run netns_sweep
    echo "$output"
    assert_output --partial "removing the stale namespace cifar-h1-${dead}x0bad"
    [ -z "$(ip netns list | grep -- "-${dead}x0bad")" ]
    wait "$orphan" || [ $? -eq 137 ]
    # A live run's namespaces are left alone.
    netns_setup 1
    netns_sweep
    ip netns list | grep -q -- "cifar-h1-$NETNS_RUN"
}

# ---------------------------------------------------------------- the scenarios
# One agent per host: `cifar-train --nnodes 2:3 --nproc-per-node 2 --device cpu
# --rdzv-endpoint 10.231.0.1:PORT` (host 1 serves the store), the run folder shared.
# --rdzv-timeout 6: a round closes at once when all 3 are in (MAX); a late agent on a
# loaded machine has 6 s before a round of 2 would start without it.
# 384 images of 16x16, the small network, batch 16: 4 steps an epoch with 6 ranks, 6
# with 4; a snapshot every epoch and every 2 steps, all kept (--keep 0).
EPOCHS=8

agent() { # host name run-dir [extra args...]
    local h=$1 name=$2 dir=$3
    shift 3
    netns_run "$h" "$name" env CIFAR_COMM_TIMEOUT=20 "$BIN/cifar-train" --device cpu --threads 1 \
        --nnodes 2:3 --nproc-per-node 2 --rdzv-endpoint "$(netns_addr 1):$PORT" --rdzv-id "$JOB" \
        --rdzv-timeout 6 --batch-size 16 --model "$MODEL" --epochs "$EPOCHS" --save-every 1 \
        --save-every-steps 2 --keep 0 --run-dir "$dir" "$@" "$LMDB"
}

# The three agents of a job, host 1's first (it serves the store).
three_agents() { # run-dir [extra args...]
    agent 1 node1 "$@"
    netns_deadline 30 grep -q "serving the rendezvous store" "$NETNS_LOGS/node1.log"
    agent 2 node2 "$@"
    agent 3 node3 "$@"
}

# An agent ends by itself within SECONDS with STATUS.
agent_ends() { # name seconds status
    netns_wait "$1" "$2" || { netns_log "$1"; return 1; }
    [ "$NETNS_STATUS" -eq "$3" ] || { echo "$1: status $NETNS_STATUS, expected $3"; netns_log "$1"; return 1; }
}

# The world sizes of a run's epochs, in order, on one line ("6 6 4 4 ...").
world_sizes() { # run-dir
    sed 's/.*"world_size":\([0-9]*\).*/\1/' "$1/metrics.jsonl" | tr '\n' ' '
}

# The final snapshot an agent printed (its stdout's last line, in its log).
printed_snapshot() { # log-name
    grep -E '^/.*\.safetensors$' "$NETNS_LOGS/$1.log" | tail -1
}

# The snapshot the last round resumed from (rank 0 names it, on host 1's log).
last_resumed_from() { # log-name
    sed -n 's/.*resuming from \([^:]*\): .*/\1/p' "$NETNS_LOGS/$1.log" | tail -1
}

# The same job resumed from SNAPSHOT (copied into a fresh run folder) on hosts 1 and 2
# only: its final snapshot.
two_node_rerun_from() { # snapshot
    local ref="$OUT/ref"
    mkdir -p "$ref"
    cp "$1" "$ref/"
    agent 1 ref1 "$ref" --nnodes 2
    netns_deadline 30 grep -q "serving the rendezvous store" "$NETNS_LOGS/ref1.log"
    agent 2 ref2 "$ref" --nnodes 2
    agent_ends ref1 180 0
    agent_ends ref2 30 0
    printed_snapshot ref1
}

@test "a host killed mid-epoch (SIGKILL of its agent and workers): the other two go on within seconds, finish, and end as a 2-node run resumed from the same snapshot" {
    netns_setup 3
    run_dir="$OUT/run"
    three_agents "$run_dir"
    netns_deadline 120 epochs_done "$run_dir" 2
    netns_kill_host 3
    netns_deadline 30 grep -q "round 1: node 0 of 2, world size 4" "$NETNS_LOGS/node1.log"
    agent_ends node1 180 0
    agent_ends node2 30 0
    grep -q "round 0: node 0 of 3, world size 6" "$NETNS_LOGS/node1.log"
    echo "world sizes: $(world_sizes "$run_dir")"
    [[ "$(world_sizes "$run_dir")" == "6 6 "*" 4 " ]]
    [ "$(wc -l < "$run_dir/metrics.jsonl")" -eq "$EPOCHS" ]
    from=$(last_resumed_from node1)
    [ -f "$from" ]
    final=$(printed_snapshot node1)
    ref=$(two_node_rerun_from "$from")
    [ "$(data_checksum "$final")" = "$(data_checksum "$ref")" ]
}

@test "a host's link cut mid-epoch: the other two go on as a 2-node job, the cut agent says the store is gone; back on the link it rejoins at the next round" {
    netns_setup 3
    run_dir="$OUT/run"
    three_agents "$run_dir" --epochs 40   # still running when the cut host is back
    netns_deadline 120 epochs_done "$run_dir" 2
    netns_link_down 3
    netns_deadline 30 grep -q "round 1: node 0 of 2, world size 4" "$NETNS_LOGS/node1.log"
    agent_ends node3 30 1
    grep -q "the rendezvous store at $(netns_addr 1):$PORT is gone" "$NETNS_LOGS/node3.log"
    netns_deadline 10 netns_host_empty 3   # its workers stopped too
    # an epoch of the 2-node round recorded first: a host back before one ends starts the
    # next round from the last snapshot of world size 6, and no epoch of 4 is left to see
    netns_deadline 120 grep -q '"world_size":4' "$run_dir/metrics.jsonl"
    netns_link_up 3
    agent 3 node3-again "$run_dir" --epochs 40
    agent_ends node1 240 0
    agent_ends node2 30 0
    agent_ends node3-again 30 0
    grep -q "round 2: node 0 of 3, world size 6" "$NETNS_LOGS/node1.log"
    echo "world sizes: $(world_sizes "$run_dir")"
    [[ "$(world_sizes "$run_dir")" == "6 6 "*"4 "*"6 " ]]
}

@test "5% loss and 50 ms delay on every link: the job finishes, its weights those of 6 shared-memory workers on one machine" {
    netns_setup 3 impairable
    netns_impair 5 50
    run_dir="$OUT/run"
    three_agents "$run_dir" --epochs 3 --nnodes 3:3   # one world size, whatever the load
    agent_ends node1 180 0
    agent_ends node2 30 0
    agent_ends node3 30 0
    [ "$(world_sizes "$run_dir")" = "6 6 6 " ]
    # every epoch at 6 all through (not resharded within: world_sizes [6] on each line)
    [ "$(grep -c '"world_sizes":\[6\],' "$run_dir/metrics.jsonl")" -eq 3 ] ||
        { grep "round\|resuming" "$NETNS_LOGS/node1.log"; cat "$run_dir/metrics.jsonl"; false; }
    final=$(printed_snapshot node1)
    ref=$("$BIN/cifar-train" --quiet --device cpu --threads 1 --nproc-per-node 6 --batch-size 16 \
        --model "$MODEL" --epochs 3 --save-every 1 --run-dir "$OUT/shm" "$LMDB" | tail -1)
    [ "$(data_checksum "$final")" = "$(data_checksum "$ref")" ]
}

@test "a stranger on the rendezvous port (garbage, slowloris, 200 connections): the job goes on, no round lost" {
    netns_setup 3
    run_dir="$OUT/run"
    three_agents "$run_dir"
    netns_deadline 60 grep -q "round 0: node 0 of 3" "$NETNS_LOGS/node1.log"
    netns_run 3 strangers /usr/bin/python3 "$STRANGERS" "$(netns_addr 1)" "$PORT" 200 6
    agent_ends strangers 60 0
    netns_log strangers
    agent_ends node1 180 0
    agent_ends node2 30 0
    agent_ends node3 30 0
    [ "$(world_sizes "$run_dir")" = "$(printf '6 %.0s' $(seq "$EPOCHS"))" ]
    run grep -q "round 1" "$NETNS_LOGS/node1.log"
    assert_failure
    grep -q '"restarts":0' "$run_dir/metrics.jsonl"
}

@test "node 0's host lost (the store lived there): the others end within the timeout saying so; a rerun of every node resumes from the snapshot" {
    netns_setup 3
    run_dir="$OUT/run"
    three_agents "$run_dir"
    netns_deadline 120 epochs_done "$run_dir" 2
    netns_kill_host 1
    for n in node2 node3; do
        agent_ends "$n" 30 1
        [ "$(grep -c "the rendezvous store at $(netns_addr 1):$PORT is gone" "$NETNS_LOGS/$n.log")" -eq 1 ]
    done
    for h in 1 2 3; do netns_deadline 10 netns_host_empty "$h"; done
    done_before=$(wc -l < "$run_dir/metrics.jsonl")
    agent 1 rerun1 "$run_dir"
    netns_deadline 30 grep -q "serving the rendezvous store" "$NETNS_LOGS/rerun1.log"
    agent 2 rerun2 "$run_dir"
    agent 3 rerun3 "$run_dir"
    agent_ends rerun1 180 0
    agent_ends rerun2 30 0
    agent_ends rerun3 30 0
    grep -q "resuming from " "$NETNS_LOGS/rerun1.log"
    [ "$(wc -l < "$run_dir/metrics.jsonl")" -eq "$EPOCHS" ]
    [ "$done_before" -ge 2 ]
}
