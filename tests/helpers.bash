# helpers.bash: what every bats suite shares. Each suite starts with
#     bats_require_minimum_version 1.5.0
#     load helpers
# and gets bats-support, bats-assert, $BIN and $PY, and the functions below.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

BIN=${BIN:-$BATS_TEST_DIRNAME/../bin}
PY=${PYTHON_TORCH:-/usr/bin/python3}
# The test build of cifar-train (make test-build; make test-bats passes its folder):
# the shipped one plus the CIFAR_TEST_* fault injection (tests/train_hooks.c), beside
# links to the other commands of $BIN.
TEST_BIN=${TEST_BIN:-}

# For a test that sets a CIFAR_TEST_ variable, first: $BIN is the test build's folder
# for the rest of the test (the shipped cifar-train reads no CIFAR_TEST_ variable).
use_test_build() {
    if [ -z "$TEST_BIN" ] || [ ! -x "$TEST_BIN/cifar-train" ]; then
        fail "no test build of cifar-train (TEST_BIN=$TEST_BIN): run the suite with make test-bats, or make test-build and set TEST_BIN to its folder (build/MODE/test-bin)"
    fi
    BIN=$TEST_BIN
}

# The FNV-1a checksum of a snapshot's whole data section (every tensor, momentum
# included): equal checksums mean bit-identical weights and optimizer state.
data_checksum() { # snapshot
    head -c 65536 "$1" | grep -ao '"data_checksum":"[0-9a-f]*"'
}

# Rewrite a snapshot's JSON header with a Python expression over `h` (the header dict);
# the data section, and so the checksum, stay as they are.
snapshot_edit() { # in out python-statement
    "$PY" - "$1" "$2" "$3" <<'EOF'
import json, struct, sys
src, dst, stmt = sys.argv[1:4]
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
exec(stmt)
t = json.dumps(h, separators=(',', ':')).encode()
t += b' ' * (-len(t) % 8)
open(dst, 'wb').write(struct.pack('<Q', len(t)) + t + b[8 + n:])
EOF
}

# A synthetic dataset in DIR and its LMDB (DIR/cifar10.lmdb); args go to cifar-synth.
make_dataset() { # dir, cifar-synth args...
    local dir=$1
    shift
    "$BIN/cifar-synth" "$dir" "$@" >/dev/null
    "$BIN/cifar-prep" --quiet "$dir" >/dev/null
}

# A synthetic dataset whose annotation files name its classes ("classes": the JSON
# array given), and its LMDB (DIR/cifar10.lmdb); args after it go to cifar-synth.
make_named_dataset() { # dir classes-json cifar-synth-args...
    local dir=$1 names=$2
    shift 2
    "$BIN/cifar-synth" "$dir" "$@" >/dev/null
    for f in "$dir"/annotations/*.json; do
        "$PY" -c 'import json, sys
a = json.load(open(sys.argv[1])); a["classes"] = json.loads(sys.argv[2])
json.dump(a, open(sys.argv[1], "w"))' "$f" "$names"
    done
    "$BIN/cifar-prep" --quiet "$dir" >/dev/null
}

# A network small enough for tests that train many times.
small_model() { # file
    echo '{"n_channels":[8,16],"bottlenecks":[4,8],"n_blocks":[1,1],"first_kernel_size":3}' > "$1"
}

# Processes whose command line mentions this test's temporary folder (pgrep's
# status 1 means none; 2 and 3 are errors and fail the caller).
leftover_processes() {
    pgrep -f "$BATS_TEST_TMPDIR" || [ $? -eq 1 ]
}
no_leftover_processes() { [ -z "$(leftover_processes)" ]; }

# Poll a command every 0.1 s: succeeds as soon as it does, fails with a message
# after `tenths` tries.
wait_until() { # tenths, command...
    local tries=$1
    shift
    for _ in $(seq "$tries"); do
        "$@" && return 0
        sleep 0.1
    done
    echo "still false after $tries tries: $*"
    return 1
}

# At least n lines in a run folder's metrics.jsonl (n epochs done).
epochs_done() { # run-dir, n
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ]
}

# A random moment of a run: after a random count of epochs in [1, most], and a
# random fraction of 50 ms more; the chosen point is printed.
random_moment() { # run-dir, most
    local n at
    n=$((RANDOM % $2 + 1))
    wait_until 600 epochs_done "$1" "$n"
    at=$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.3f", 0.05 * rand() }')
    sleep "$at"
    echo "# the moment: $n epoch(s) done, then $at s"
}

# Skip a test and say why where the TAP output shows it (bats' `skip` alone is
# easily missed in a summary of passes).
skip_because() { # reason
    echo "# SKIP: $BATS_TEST_DESCRIPTION: $1" >&3
    skip "$1"
}
