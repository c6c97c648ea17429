#!/usr/bin/env bats
# The rendezvous that hands the NCCL id to the ranks (shared/comm/rendezvous.c),
# run by `test_comm rendezvous-rank` on the CPU: a 2-rank job rendezvous while
# strangers connect to rank 0's port (silent, wrong magic, another job, a wrong
# token, a second rank 0), each built here in Python from the documented wire
# format; a stale rank of another job cannot take the place of the real rank 1;
# rank 0 listens on MASTER_ADDR only, on every interface only when asked.

bats_require_minimum_version 1.5.0
load helpers

setup() {
    TEST_COMM=${TEST_COMM:-$(ls "$BATS_TEST_DIRNAME"/../build/*/tests/test_comm 2>/dev/null | head -1)}
    [ -x "$TEST_COMM" ] || { echo "no test_comm binary (make test-bins, or set TEST_COMM)"; return 1; }
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    JOB="bats-$$-$BATS_TEST_NUMBER"
    OUT="$BATS_TEST_TMPDIR"
}

rank() { # rank world job [env...]: one rank of the exchange, in the background; stderr to $OUT/err-<rank>
    local r=$1 w=$2 job=$3; shift 3
    env -u CIFAR_RUN_ID -u SLURM_JOB_ID -u TORCHELASTIC_RUN_ID -u PMIX_NAMESPACE -u CIFAR_JOB_TOKEN \
        RANK="$r" WORLD_SIZE="$w" MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" CIFAR_JOB_ID="$job" \
        CIFAR_COMM_TIMEOUT=20 "$@" "$TEST_COMM" rendezvous-rank "$OUT" 2> "$OUT/err-$r-$job" &
}

listening() { # the local address of the listener on $PORT, once it listens
    for _ in $(seq 100); do
        addr=$(ss -Hltn "sport = :$PORT" | awk '{print $4}')
        [ -n "$addr" ] && { echo "$addr"; return 0; }
        sleep 0.05
    done
    return 1
}

# Connects as each stranger, prints "<name> <answer>" per line: the status rank 0
# answered (0 ok .. 4 duplicate) or "closed" (no answer).
strangers() {
    python3 - "$PORT" "$JOB" <<'PY'
import hashlib, socket, struct, sys, time
port, job = int(sys.argv[1]), sys.argv[2].encode()
def sha(prefix, text): return hashlib.sha256(prefix + text).digest()
def hello(rank, world, job_id, token_src=None):
    job_hash = sha(b"cifar-job-id/v1\n", b"user:" + job_id)
    token = sha(b"cifar-job-token/v1\n", token_src if token_src else b"user:" + job_id)
    return struct.pack(">IIiiI", 0x43465256, 1, rank, world, 128) + job_hash + token
def ask(name, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    reply = b""
    while len(reply) < 8:
        chunk = s.recv(8 - len(reply))
        if not chunk: break
        reply += chunk
    s.close()
    print(name, struct.unpack(">II", reply)[1] if len(reply) == 8 else "closed", flush=True)
silent = socket.create_connection(("127.0.0.1", port), timeout=10)  # never says a word
ask("http", b"GET / HTTP/1.0\r\n\r\n" + b"x" * 66)
ask("other-job", hello(1, 2, job + b"-old"))
ask("wrong-token", hello(1, 2, job, b"a guess"))
ask("second-rank-0", hello(0, 2, job))
ask("world-3", hello(1, 3, job))
print("strangers done", flush=True)
time.sleep(0.5)
silent.close()
PY
}

@test "a 2-rank job rendezvous while strangers knock: rank 0 answers only its rank 1" {
    rank 0 2 "$JOB"
    r0=$!
    listening >/dev/null
    run strangers
    echo "$output"
    assert_success
    assert_line "http closed"
    assert_line "other-job 1"
    assert_line "wrong-token 2"
    assert_line "second-rank-0 3"
    assert_line "world-3 3"
    kill -0 "$r0"                         # rank 0 is still there, waiting for its rank 1
    rank 1 2 "$JOB"
    r1=$!
    wait "$r1"
    wait "$r0"
    cat "$OUT/err-0-$JOB"
    [ "$(wc -l < "$OUT/rendezvous-0")" -eq 1 ]
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
    [ "$(grep -c 'dropped a connection' "$OUT/err-0-$JOB")" -ge 5 ]
    grep -q "wrong magic" "$OUT/err-0-$JOB"
    grep -q "another job" "$OUT/err-0-$JOB"
    grep -q "wrong token" "$OUT/err-0-$JOB"
    grep -q "a second rank 0" "$OUT/err-0-$JOB"
    grep -q "rank 1 of world size 3" "$OUT/err-0-$JOB"
}

@test "a stale rank 1 of another job on the port: refused, rank 0 keeps waiting for its own" {
    rank 0 2 "$JOB"
    r0=$!
    listening >/dev/null
    rank 1 2 "$JOB-stale" CIFAR_COMM_TIMEOUT=1
    stale=$!
    status=0
    wait "$stale" || status=$?
    cat "$OUT/err-1-$JOB-stale"
    [ "$status" -eq 1 ]
    grep -q "the last answer: it serves another job" "$OUT/err-1-$JOB-stale"
    [ ! -e "$OUT/rendezvous-1" ]
    rank 1 2 "$JOB"
    wait $!
    wait "$r0"
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
}

@test "CIFAR_JOB_TOKEN: a rank without the job's token is refused, with it served" {
    rank 0 2 "$JOB" CIFAR_JOB_TOKEN=s3cret
    r0=$!
    listening >/dev/null
    rank 1 2 "$JOB" CIFAR_COMM_TIMEOUT=1
    status=0
    wait $! || status=$?
    [ "$status" -eq 1 ]
    grep -q "CIFAR_JOB_TOKEN differs" "$OUT/err-1-$JOB"
    rank 1 2 "$JOB" CIFAR_JOB_TOKEN=s3cret
    wait $!
    wait "$r0"
    cmp "$OUT/rendezvous-0" "$OUT/rendezvous-1"
}

@test "rank 0 listens on MASTER_ADDR (127.0.0.1), on every interface only with CIFAR_RENDEZVOUS_BIND=all" {
    rank 0 2 "$JOB"
    r0=$!
    addr=$(listening)
    echo "MASTER_ADDR=127.0.0.1: $addr"
    [ "$addr" = "127.0.0.1:$PORT" ]
    rank 1 2 "$JOB"
    wait $!
    wait "$r0"
    rank 0 2 "$JOB-all" CIFAR_RENDEZVOUS_BIND=all
    r0=$!
    addr=$(listening)
    echo "CIFAR_RENDEZVOUS_BIND=all: $addr"
    [[ "$addr" == "*:$PORT" || "$addr" == "0.0.0.0:$PORT" || "$addr" == "[::]:$PORT" ]]
    rank 1 2 "$JOB-all"
    wait $!
    wait "$r0"
}

@test "an impostor on rank 0's port that knows CIFAR_JOB_ID but not the token: the rank names the refusal at once" {
    rank 0 2 "$JOB" CIFAR_JOB_TOKEN=a-guess    # the impostor holds the port
    r0=$!
    listening >/dev/null
    rank 1 2 "$JOB" CIFAR_JOB_TOKEN=s3cret CIFAR_COMM_TIMEOUT=60
    status=0
    wait $! || status=$?
    cat "$OUT/err-1-$JOB"
    [ "$status" -eq 1 ]
    grep -q "rank 1: the rendezvous at 127.0.0.1:$PORT refused this rank: this rank's CIFAR_JOB_TOKEN differs from rank 0's" "$OUT/err-1-$JOB"
    [ -z "$(grep "timed out" "$OUT/err-1-$JOB")" ]
    kill "$r0"
    wait "$r0" || [ $? -eq 143 ]
}

# SIGTERM to a rank of the exchange: it must be gone within 10 s (its grace is half a
# second; CIFAR_COMM_TIMEOUT is 300), with status 143 and `message` in its stderr.
stops_on_sigterm() { # pid rank message
    kill -TERM "$1"
    local status=0
    timeout 10 tail --pid="$1" -f /dev/null || status=$?
    [ "$status" -eq 0 ] || { echo "rank $2 still waits 10 s after SIGTERM"; kill -9 "$1"; false; }
    status=0
    wait "$1" || status=$?
    cat "$OUT/err-$2-$JOB"
    [ "$status" -eq 143 ]
    grep -q "$3" "$OUT/err-$2-$JOB"
}

@test "SIGTERM ends a rendezvous wait at once (rank 0 waiting for its ranks, a rank waiting for rank 0): exit 143" {
    rank 0 2 "$JOB" CIFAR_COMM_TIMEOUT=300
    r0=$!
    listening >/dev/null
    sleep 0.2
    stops_on_sigterm "$r0" 0 "rank 0: stopped by signal 15 during the rendezvous at 127.0.0.1:$PORT"
    # A rank whose rank 0 never comes.
    rank 1 2 "$JOB" CIFAR_COMM_TIMEOUT=300
    r1=$!
    sleep 0.3
    stops_on_sigterm "$r1" 1 "rank 1: stopped by signal 15 during the rendezvous"
}
