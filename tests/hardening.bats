#!/usr/bin/env bats
# Hardening: no input or fault makes a stage crash, hang or lose a good file.
#   - corrupt inputs for every stage (LMDB truncated, wrong record length, label out of
#     range, from another tool, newer version; snapshot with a flipped byte, a truncated
#     header, tensors of the wrong shape, a newer version): exit 1 with a clear message;
#   - fault injection (tests/faultinject.c, LD_PRELOAD): ENOSPC/EIO at every write,
#     fsync and rename of a snapshot and of an LMDB, and SIGKILL at each of those points:
#     the previous file survives, no temporary survives the next run, resume is exact;
#   - resource limits: a dataset larger than the initial LMDB map, a low `ulimit -v`.
# A crash shows up as a status above 128 (or 86, ASan's exit code under make test-asan),
# never as the 1 every test expects.

bats_require_minimum_version 1.5.0
load helpers

PYTHON=${PYTHON:-/usr/bin/python3}

setup_file() {
    export T="$BATS_FILE_TMPDIR"
    # The shim: the Makefile's build when given, else compiled here.
    if [ -z "${FAULTINJECT:-}" ] || [ ! -f "$FAULTINJECT" ]; then
        cc -O2 -fPIC -shared -o "$T/libfaultinject.so" "$BATS_TEST_DIRNAME/faultinject.c" -ldl
        export FAULTINJECT="$T/libfaultinject.so"
    fi
    lmdbput_build
    export DATA="$T/data"
    make_dataset "$DATA" --train 128 --test 32 --size 8 --seed 7
    export LMDB="$DATA/cifar10.lmdb"
    small_model "$T/model.json"
    export MODEL="$T/model.json"
    # One epoch done (the state every save-path test starts from) and the reference:
    # the second epoch on top of it without a fault (the schedule depends on --epochs,
    # so 1 then 2 is not 2 straight).
    train "$T/base" --epochs 1 >/dev/null
    export BASE_SNAP=$(ls "$T/base"/snapshot-*.safetensors)
    cp -r "$T/base" "$T/ref"
    export REF2=$(data_checksum "$(train "$T/ref" --epochs 2 | tail -1)")
    # The fault points of one snapshot write (epoch 2 on top of base), as the shim counts them
    # (the epoch's TensorBoard events in RUN_DIR/tb first: their writes and fsyncs).
    cp -r "$T/base" "$T/probe"
    LD_PRELOAD="$FAULTINJECT" FI_PATH="$T/probe" FI_LOG="$T/snapshot-points.log" \
        train "$T/probe" --epochs 2 >/dev/null
    # ... and of a background one (--save-every-steps 2: step 6, mid-epoch 2, while
    # training goes on), then the last one (step 8). Only the snapshot files count: the
    # training thread's metrics.jsonl writes would interleave with the writer thread's.
    cp -r "$T/base" "$T/probe-bg"
    LD_PRELOAD="$FAULTINJECT" FI_PATH="$T/probe-bg/snapshot-" FI_LOG="$T/background-points.log" \
        train "$T/probe-bg" --epochs 2 --save-every-steps 2 >/dev/null
    # ... and of one LMDB write.
    cp -r "$DATA" "$T/probe-data"
    LD_PRELOAD="$FAULTINJECT" FI_PATH=".lmdb" FI_LOG="$T/lmdb-points.log" \
        "$BIN/cifar-prep" --quiet --force "$T/probe-data" >/dev/null
}

# lmdbput FILE DB KEY [VALUE-FILE]: put one record (delete it without VALUE-FILE) in a
# single-file LMDB, creating file and table as needed; DB "-" is the unnamed table.
lmdbput_build() {
    cat > "$T/lmdbput.c" <<'EOF'
#include <lmdb.h>
#include <stdio.h>
#include <string.h>
static char buf[1 << 24];
int main(int argc, char **argv) {
    MDB_env *env; MDB_txn *txn; MDB_dbi dbi; size_t n = 0; int rc;
    if (argc < 4) return 2;
    if (argc > 4) { FILE *f = fopen(argv[4], "rb"); if (!f) return 1; n = fread(buf, 1, sizeof buf, f); fclose(f); }
    if ((rc = mdb_env_create(&env)) || (rc = mdb_env_set_maxdbs(env, 16)) ||
        (rc = mdb_env_set_mapsize(env, 256u << 20)) ||
        (rc = mdb_env_open(env, argv[1], MDB_NOSUBDIR | MDB_NOLOCK, 0644)) ||
        (rc = mdb_txn_begin(env, NULL, 0, &txn)) ||
        (rc = mdb_dbi_open(txn, strcmp(argv[2], "-") ? argv[2] : NULL, MDB_CREATE, &dbi))) {
        fprintf(stderr, "lmdbput: %s\n", mdb_strerror(rc)); return 1;
    }
    MDB_val k = {strlen(argv[3]), argv[3]}, v = {n, buf};
    rc = argc > 4 ? mdb_put(txn, dbi, &k, &v, 0) : mdb_del(txn, dbi, &k, NULL);
    if (!rc) rc = mdb_txn_commit(txn);
    if (rc) { fprintf(stderr, "lmdbput: %s\n", mdb_strerror(rc)); return 1; }
    mdb_env_close(env);
    return 0;
}
EOF
    cc -O1 -o "$T/lmdbput" "$T/lmdbput.c" -llmdb
}

train() { # run-dir, extra args...
    local dir=$1; shift
    "$BIN/cifar-train" --quiet --threads 1 --batch-size 32 --model "$MODEL" --save-every 1 \
        --run-dir "$dir" "$@" "$LMDB"
}

train_verbose() { # run-dir, extra args...: train with the log on stderr
    local dir=$1; shift
    "$BIN/cifar-train" --threads 1 --batch-size 32 --model "$MODEL" --save-every 1 \
        --run-dir "$dir" "$@" "$LMDB"
}

# The command failed the way a user should see it: status 1, a message naming
# `what`, no sanitizer report.
assert_clean_failure() { # what
    [ "$status" -eq 1 ] || { echo "status $status (expected 1)"; echo "$output"; false; }
    assert_output --partial "$1"
    refute_output --partial "Sanitizer"
    refute_output --partial "runtime error"
}

no_temporaries() { # dir
    [ -z "$(ls -A "$1" | grep -- '\.tmp-')" ] || { ls -la "$1"; false; }
}

# A value file in the dataset format (version 3): int32 LE label, the CRC-32C of the
# split name, index, label and pixels, then `bytes` pixel bytes.
record_file() { # out label bytes split index
    "$PYTHON" "$BATS_TEST_DIRNAME/dataset_record.py" make "$@"
}

# Put a metadata document (a file) and its checksum (version 3) into a dataset.
meta_put() { # lmdb json-file
    "$PYTHON" "$BATS_TEST_DIRNAME/dataset_record.py" meta-crc "$2" | tr -d '\n' > "$2.crc"
    "$T/lmdbput" "$1" meta dataset "$2"
    "$T/lmdbput" "$1" meta dataset.crc32c "$2.crc"
}

meta_json() { # version
    printf '{"format":"cifar-lmdb","version":%d,"height":8,"width":8,"channels":3,"num_classes":10,"splits":{"train":{"count":128,"mean":[0.5,0.5,0.5],"std":[0.2,0.2,0.2]},"test":{"count":32,"mean":[0.5,0.5,0.5],"std":[0.2,0.2,0.2]}}}' "$1"
}

# Both readers of a dataset refuse it with `reason`.
dataset_refused() { # lmdb reason
    run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$1"
    assert_clean_failure "$1: $2"
    run "$BIN/cifar-eval" --quiet --threads 1 --data "$1" "$BASE_SNAP"
    assert_clean_failure "$1: $2"
}

# ------------------------------------------------------------ corrupt datasets

@test "a truncated LMDB (at several sizes) is refused, not a SIGBUS" {
    for size in 100 4096 8192 20000 40000; do
        cp "$LMDB" "$BATS_TEST_TMPDIR/t.lmdb"
        truncate -s "$size" "$BATS_TEST_TMPDIR/t.lmdb"
        run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/t.lmdb"
        assert_clean_failure "t.lmdb: "
        run "$BIN/cifar-eval" --quiet --threads 1 --data "$BATS_TEST_TMPDIR/t.lmdb" "$BASE_SNAP"
        assert_clean_failure "t.lmdb: "
    done
    cp "$LMDB" "$BATS_TEST_TMPDIR/t.lmdb"
    truncate -s 40000 "$BATS_TEST_TMPDIR/t.lmdb"
    dataset_refused "$BATS_TEST_TMPDIR/t.lmdb" "truncated LMDB file"
}

@test "an LMDB record of the wrong length is named" {
    cp "$LMDB" "$BATS_TEST_TMPDIR/w.lmdb"
    record_file "$BATS_TEST_TMPDIR/rec" 3 100 train 5
    "$T/lmdbput" "$BATS_TEST_TMPDIR/w.lmdb" train 00000005 "$BATS_TEST_TMPDIR/rec"
    run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/w.lmdb"
    assert_clean_failure "record train/00000005 has 108 bytes, expected 200"
    cp "$LMDB" "$BATS_TEST_TMPDIR/w.lmdb"
    record_file "$BATS_TEST_TMPDIR/rec" 3 1000 test 31
    "$T/lmdbput" "$BATS_TEST_TMPDIR/w.lmdb" test 00000031 "$BATS_TEST_TMPDIR/rec"
    dataset_refused "$BATS_TEST_TMPDIR/w.lmdb" "record test/00000031 has 1008 bytes"
    # An empty value
    cp "$LMDB" "$BATS_TEST_TMPDIR/w.lmdb"
    : > "$BATS_TEST_TMPDIR/empty"
    "$T/lmdbput" "$BATS_TEST_TMPDIR/w.lmdb" test 00000000 "$BATS_TEST_TMPDIR/empty"
    dataset_refused "$BATS_TEST_TMPDIR/w.lmdb" "record test/00000000 has 0 bytes"
}

@test "an LMDB label out of range (too large, negative) is named" {
    cp "$LMDB" "$BATS_TEST_TMPDIR/l.lmdb"
    record_file "$BATS_TEST_TMPDIR/rec" 10 192 test 7
    "$T/lmdbput" "$BATS_TEST_TMPDIR/l.lmdb" test 00000007 "$BATS_TEST_TMPDIR/rec"
    dataset_refused "$BATS_TEST_TMPDIR/l.lmdb" "record test/00000007 has label 10, outside [0, 10)"
    cp "$LMDB" "$BATS_TEST_TMPDIR/l.lmdb"
    record_file "$BATS_TEST_TMPDIR/rec" -1 192 train 127
    "$T/lmdbput" "$BATS_TEST_TMPDIR/l.lmdb" train 00000127 "$BATS_TEST_TMPDIR/rec"
    run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/l.lmdb"
    assert_clean_failure "record train/00000127 has label -1"
}

@test "a missing record, an extra record and a miscounted split are named" {
    cp "$LMDB" "$BATS_TEST_TMPDIR/m.lmdb"
    "$T/lmdbput" "$BATS_TEST_TMPDIR/m.lmdb" test 00000004
    dataset_refused "$BATS_TEST_TMPDIR/m.lmdb" "split \"test\" holds 31 records, the metadata says 32"
    record_file "$BATS_TEST_TMPDIR/rec" 1 192 test 99
    "$T/lmdbput" "$BATS_TEST_TMPDIR/m.lmdb" test 00000099 "$BATS_TEST_TMPDIR/rec"
    dataset_refused "$BATS_TEST_TMPDIR/m.lmdb" "record test/00000004 is missing"
}

@test "an LMDB from another tool (no metadata, foreign metadata) is refused" {
    # Caffe-style: keys in the unnamed table, no "meta".
    record_file "$BATS_TEST_TMPDIR/rec" 1 192 - 0
    "$T/lmdbput" "$BATS_TEST_TMPDIR/caffe.lmdb" - 00000000_cat.png "$BATS_TEST_TMPDIR/rec"
    dataset_refused "$BATS_TEST_TMPDIR/caffe.lmdb" "no cifar-lmdb metadata"
    printf '{"format":"imagenet-lmdb","version":1}' > "$BATS_TEST_TMPDIR/meta"
    "$T/lmdbput" "$BATS_TEST_TMPDIR/caffe.lmdb" meta dataset "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/caffe.lmdb" "not a cifar-lmdb dataset"
    printf 'not json at all' > "$BATS_TEST_TMPDIR/meta"
    "$T/lmdbput" "$BATS_TEST_TMPDIR/caffe.lmdb" meta dataset "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/caffe.lmdb" "metadata is not valid JSON"
    # A folder-style LMDB (data.mdb inside a directory), as most tools write.
    mkdir "$BATS_TEST_TMPDIR/dir.lmdb"
    cp "$LMDB" "$BATS_TEST_TMPDIR/dir.lmdb/data.mdb"
    dataset_refused "$BATS_TEST_TMPDIR/dir.lmdb" "not a regular file"
}

@test "dataset metadata from a newer format version is refused as such" {
    cp "$LMDB" "$BATS_TEST_TMPDIR/v.lmdb"
    meta_json 4 > "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/v.lmdb" "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/v.lmdb" "written by a newer cifar-prep (format version 4"
    # The same document at version 3 is accepted: only the version was wrong.
    meta_json 3 > "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/v.lmdb" "$BATS_TEST_TMPDIR/meta"
    run "$BIN/cifar-eval" --quiet --threads 1 --data "$BATS_TEST_TMPDIR/v.lmdb" "$BASE_SNAP"
    assert_success
}

@test "dataset metadata with bad sizes is refused" {
    cp "$LMDB" "$BATS_TEST_TMPDIR/s.lmdb"
    meta_json 3 | sed 's/"channels":3/"channels":9/' > "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/s.lmdb" "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/s.lmdb" "metadata \"channels\" must be an integer"
    meta_json 3 | sed 's/"height":8/"height":1e300/' > "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/s.lmdb" "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/s.lmdb" "metadata \"height\" must be an integer"
    # A split name with a newline: the reason stays on one line (a fuzzer find).
    meta_json 3 | sed 's/"test":/"te\\nst":/' > "$BATS_TEST_TMPDIR/meta"
    grep -q 'te\\nst' "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/s.lmdb" "$BATS_TEST_TMPDIR/meta"
    dataset_refused "$BATS_TEST_TMPDIR/s.lmdb" 'metadata has an invalid split name "te?st"'
    # Height and width swapped to a size the records do not have.
    meta_json 3 | sed 's/"height":8/"height":4/' > "$BATS_TEST_TMPDIR/meta"
    meta_put "$BATS_TEST_TMPDIR/s.lmdb" "$BATS_TEST_TMPDIR/meta"
    run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$BATS_TEST_TMPDIR/s.lmdb"
    assert_clean_failure "has 200 bytes, expected 104"
}

# ------------------------------------------------------------ corrupt snapshots

# Set element 0 of a snapshot's F32 tensor to a value (nan, inf) and fix the data
# checksum (FNV-1a 64 of the data section), so that only the value is wrong.
snapshot_poison() { # in out tensor value
    "$PYTHON" - "$@" <<'EOF'
import json, struct, sys
src, dst, name, value = sys.argv[1:5]
b = bytearray(open(src, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
start = 8 + n + h[name]['data_offsets'][0]
b[start:start + 4] = struct.pack('<f', float(value))
s = 0xcbf29ce484222325
for x in bytes(b[8 + n:]):
    s = ((s ^ x) * 0x100000001b3) & 0xffffffffffffffff
old = h['__metadata__']['data_checksum']
b[8:8 + n] = bytes(b[8:8 + n]).replace(old.encode(), ('%016x' % s).encode())
open(dst, 'wb').write(b)
EOF
}


@test "a snapshot with a flipped byte: eval refuses it, train skips to the previous one" {
    cp "$BASE_SNAP" "$BATS_TEST_TMPDIR/f.safetensors"
    size=$(stat -c %s "$BATS_TEST_TMPDIR/f.safetensors")
    for off in $((size - 1)) $((size / 2)) 2000; do
        cp "$BASE_SNAP" "$BATS_TEST_TMPDIR/f.safetensors"
        printf '\x5a' | dd of="$BATS_TEST_TMPDIR/f.safetensors" bs=1 seek="$off" conv=notrunc status=none
        run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/f.safetensors"
        assert_clean_failure "f.safetensors: "
    done
    # A flip in the data section is a checksum mismatch.
    cp "$BASE_SNAP" "$BATS_TEST_TMPDIR/f.safetensors"
    printf '\x5a' | dd of="$BATS_TEST_TMPDIR/f.safetensors" bs=1 seek=$((size - 1)) conv=notrunc status=none
    run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/f.safetensors"
    assert_clean_failure "checksum mismatch"
}

@test "a truncated snapshot header (or file) is refused" {
    for n in 0 4 8 20 200; do
        head -c "$n" "$BASE_SNAP" > "$BATS_TEST_TMPDIR/t.safetensors"
        run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/t.safetensors"
        assert_clean_failure "t.safetensors: "
    done
    head -c 200 "$BASE_SNAP" > "$BATS_TEST_TMPDIR/t.safetensors"
    run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/t.safetensors"
    assert_clean_failure "truncated header"
    size=$(stat -c %s "$BASE_SNAP")
    head -c $((size - 16)) "$BASE_SNAP" > "$BATS_TEST_TMPDIR/t.safetensors"
    run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/t.safetensors"
    assert_clean_failure "truncated data"
}

@test "snapshot tensors of the wrong shape, a missing or an extra tensor are refused" {
    s="$BATS_TEST_TMPDIR/s.safetensors"
    snapshot_edit "$BASE_SNAP" "$s" "h['1.weight']['shape'] = [16, 10]"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "1.weight"
    snapshot_edit "$BASE_SNAP" "$s" "h['1.weight']['shape'] = [160]"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "1.weight"
    snapshot_edit "$BASE_SNAP" "$s" "h['1.biasx'] = h.pop('1.bias')"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "1.bias"
    snapshot_edit "$BASE_SNAP" "$s" "h['1.weight']['dtype'] = 'I64'; h['1.weight']['shape'] = [80]"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "1.weight"
    # train: a snapshot it cannot load is skipped with a warning, never overwritten in place
    # by a different state: the run starts again from the one before.
    dir="$BATS_TEST_TMPDIR/run"
    cp -r "$T/base" "$dir"
    train "$dir" --epochs 2 >/dev/null
    latest=$(ls "$dir"/snapshot-*.safetensors | sort | tail -1)
    snapshot_edit "$latest" "$latest" "h['1.weight']['shape'] = [16, 10]"
    run train "$dir" --epochs 2
    assert_success
    assert_output --partial "skipping this snapshot"
    [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
}

@test "snapshot metadata from a newer format version, or another tool's safetensors, is refused" {
    s="$BATS_TEST_TMPDIR/s.safetensors"
    snapshot_edit "$BASE_SNAP" "$s" "h['__metadata__']['format_version'] = '2'"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "written by a newer version (format_version 2"
    snapshot_edit "$BASE_SNAP" "$s" "del h['__metadata__']['format']"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "not a cifar snapshot"
    snapshot_edit "$BASE_SNAP" "$s" "del h['__metadata__']"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "not a cifar snapshot"
    snapshot_edit "$BASE_SNAP" "$s" "h['__metadata__']['model'] = '{\"n_channels\":[8,16],'"
    run "$BIN/cifar-eval" --quiet --threads 1 "$s"
    assert_clean_failure "s.safetensors: "
}

# ------------------------------------------------------------ faults on the save path

# Fail one counted call (line of the probe log) of the epoch-2 snapshot write.
snapshot_fault() { # point errno-name expected-text
    dir=$(mktemp -d "$BATS_TEST_TMPDIR/f$1-$2-XXXX")
    cp -r "$T/base/." "$dir"
    LD_PRELOAD="$FAULTINJECT" FI_PATH="$dir" FI_FAIL_AT="$1" FI_ERRNO="$2" run train "$dir" --epochs 2
    assert_clean_failure "$3"
    # No snapshot temporary. (A failed metrics.jsonl rewrite leaves its temporary until
    # the next run removes it: train/trainer.c metrics_truncate, reported.)
    [ -z "$(ls -A "$dir" | grep -- '\.safetensors\.tmp-')" ] || { ls -la "$dir"; false; }
    cmp "$BASE_SNAP" "$dir/$(basename "$BASE_SNAP")" # the good snapshot is untouched
    run train "$dir" --epochs 2                      # and the rerun finishes exactly
    assert_success
    [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
    no_temporaries "$dir"
}

@test "ENOSPC and EIO at every kind of point of a snapshot write: clear error, old snapshot kept" {
    log="$T/snapshot-points.log"
    n=$(wc -l < "$log")
    echo "snapshot write points: $n"; awk '{print $3}' "$log" | sort | uniq -c
    [ "$n" -gt 5 ]
    first_write=$(awk '$3 == "write" { print $2; exit }' "$log")
    last_write=$(awk '$3 == "write" { n = $2 } END { print n }' "$log")
    for p in "$first_write" $((first_write + 1)) $((first_write + 2)) "$last_write"; do
        snapshot_fault "$p" ENOSPC "No space left on device"
    done
    snapshot_fault $((first_write + 3)) EIO "Input/output error"
    # fsync of the file, the rename, fsync of the folder, and the metrics file's rename.
    for p in $(awk '$3 != "write" { print $2 }' "$log"); do
        snapshot_fault "$p" EIO "Input/output error"
    done
    # The last point is the folder's fsync after the rename: said as such (it once read
    # "cannot rename into place" although the rename had happened).
    snapshot_fault "$(tail -1 "$log" | awk '{ print $2 }')" EIO "renamed, but cannot fsync the folder of"
}

@test "SIGKILL at each point of a snapshot write: resume finds the last complete snapshot" {
    log="$T/snapshot-points.log"
    points=$(awk '{ print $2 }' "$log")
    if [ -n "${CIFAR_ASAN:-}" ]; then # sanitized binaries are slow: every kind of point once
        points=$(awk '$3 != "write" || $3 != prev { print $2 } { prev = $3 }' "$log"; \
                 awk '$3 == "write" { n = $2 } END { print n }' "$log")
    fi
    tried=0
    for p in $points; do
        dir="$BATS_TEST_TMPDIR/k$p"
        cp -r "$T/base" "$dir"
        LD_PRELOAD="$FAULTINJECT" FI_PATH="$dir" FI_KILL_AT="$p" run train "$dir" --epochs 2
        [ "$status" -eq 137 ] || { echo "point $p: status $status"; echo "$output"; false; }
        cmp "$BASE_SNAP" "$dir/$(basename "$BASE_SNAP")"
        # Every snapshot present is complete: eval accepts each.
        for s in "$dir"/snapshot-*.safetensors; do
            "$BIN/cifar-eval" --quiet --threads 1 "$s" >/dev/null
        done
        run train "$dir" --epochs 2
        assert_success
        [ "$(data_checksum "${lines[-1]}")" = "$REF2" ] || { echo "point $p: not exact"; false; }
        [ "$(wc -l < "$dir/metrics.jsonl")" -eq 2 ]
        no_temporaries "$dir"
        rm -rf "$dir"
        tried=$((tried + 1))
    done
    echo "SIGKILL points tried: $tried"
}

@test "SIGKILL at each point of a background snapshot write: the previous snapshot stays valid, resume exact" {
    log="$T/background-points.log"
    points=$(awk '$4 ~ /snapshot-000006/ { print $2 }' "$log")
    [ "$(echo "$points" | wc -w)" -gt 5 ] || { cat "$log"; false; }
    if [ -n "${CIFAR_ASAN:-}" ]; then # sanitized binaries are slow: a third of the points
        points=$(echo "$points" | awk 'NR % 3 == 1')
    fi
    for p in $points; do
        dir="$BATS_TEST_TMPDIR/k$p"
        cp -r "$T/base" "$dir"
        LD_PRELOAD="$FAULTINJECT" FI_PATH="$dir/snapshot-" FI_KILL_AT="$p" run train "$dir" --epochs 2 --save-every-steps 2
        [ "$status" -eq 137 ] || { echo "point $p: status $status"; echo "$output"; false; }
        cmp "$BASE_SNAP" "$dir/$(basename "$BASE_SNAP")"
        [ ! -f "$dir/snapshot-000008.safetensors" ]
        for s in "$dir"/snapshot-*.safetensors; do
            "$BIN/cifar-eval" --quiet --threads 1 "$s" >/dev/null
        done
        run train "$dir" --epochs 2 --save-every-steps 2
        assert_success
        [ "$(data_checksum "${lines[-1]}")" = "$REF2" ] || { echo "point $p: not exact"; false; }
        no_temporaries "$dir"
        rm -rf "$dir"
    done
}

@test "ENOSPC or EIO in a background snapshot write: the run stops with the reason, old snapshot kept, rerun exact" {
    log="$T/background-points.log"
    first_write=$(awk '$4 ~ /snapshot-000006/ && $3 == "write" { print $2; exit }' "$log")
    fsync=$(awk '$4 ~ /snapshot-000006/ && $3 == "fsync" { print $2; exit }' "$log")
    [ -n "$first_write" ] || { cat "$log"; false; }
    [ -n "$fsync" ] || { cat "$log"; false; }
    for fault in "$first_write:ENOSPC:No space left on device" "$fsync:EIO:Input/output error"; do
        p=${fault%%:*}; rest=${fault#*:}
        dir=$(mktemp -d "$BATS_TEST_TMPDIR/bg$p-XXXX")
        cp -r "$T/base/." "$dir"
        LD_PRELOAD="$FAULTINJECT" FI_PATH="$dir/snapshot-" FI_FAIL_AT="$p" FI_ERRNO="${rest%%:*}" \
            run train "$dir" --epochs 2 --save-every-steps 2
        assert_clean_failure "${rest#*:}"
        assert_output --partial "snapshot-000006.safetensors: cannot write the snapshot"
        [ -z "$(ls -A "$dir" | grep -- '\.safetensors\.tmp-')" ] || { ls -la "$dir"; false; }
        cmp "$BASE_SNAP" "$dir/$(basename "$BASE_SNAP")"
        run train "$dir" --epochs 2 --save-every-steps 2
        assert_success
        [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
    done
}

@test "ENOSPC, EIO and SIGKILL at each point of an LMDB write: old dataset kept, no temporary" {
    log="$T/lmdb-points.log"
    echo "LMDB write points: $(wc -l < "$log")"; awk '{print $3}' "$log" | sort | uniq -c
    [ "$(wc -l < "$log")" -ge 3 ]
    d="$BATS_TEST_TMPDIR/d"
    cp -r "$DATA" "$d"
    for p in $(awk '{ print $2 }' "$log"); do
        for e in ENOSPC EIO; do
            LD_PRELOAD="$FAULTINJECT" FI_PATH=".lmdb" FI_FAIL_AT="$p" FI_ERRNO="$e" \
                run "$BIN/cifar-prep" --quiet --force "$d"
            [ "$e" = ENOSPC ] && msg="No space left on device" || msg="Input/output error"
            assert_clean_failure "$msg"
            assert_output --partial "$d/cifar10.lmdb"
            cmp "$LMDB" "$d/cifar10.lmdb"
            no_temporaries "$d"
        done
        LD_PRELOAD="$FAULTINJECT" FI_PATH=".lmdb" FI_KILL_AT="$p" run "$BIN/cifar-prep" --quiet --force "$d"
        [ "$status" -eq 137 ]
        cmp "$LMDB" "$d/cifar10.lmdb"
    done
    # The next run removes what the killed ones left and writes the same dataset.
    run "$BIN/cifar-prep" --quiet --force "$d"
    assert_success
    no_temporaries "$d"
    run "$BIN/cifar-eval" --quiet --threads 1 --data "$d/cifar10.lmdb" "$BASE_SNAP"
    assert_success
}

# ------------------------------------------------------------ resource limits

@test "a dataset larger than the initial 16 MiB LMDB map grows the map" {
    big="$BATS_TEST_TMPDIR/big"
    "$BIN/cifar-synth" "$big" --train 1400 --test 10 --size 64 --jpeg-fraction 0 --seed 3 >/dev/null
    run "$BIN/cifar-prep" --quiet "$big"
    assert_success
    size=$(stat -c %s "$big/cifar10.lmdb")
    echo "LMDB size: $size bytes"
    [ "$size" -gt $((16 << 20)) ]
    # Every record reads back (train loads the whole split and checks each record).
    echo '{"n_channels":[4],"bottlenecks":null,"n_blocks":[1],"first_kernel_size":3}' > "$BATS_TEST_TMPDIR/m.json"
    run "$BIN/cifar-train" --quiet --threads 1 --epochs 1 --batch-size 700 --model "$BATS_TEST_TMPDIR/m.json" \
        --run-dir "$BATS_TEST_TMPDIR/run" "$big/cifar10.lmdb"
    assert_success
}

# The smallest of a few `ulimit -v` values (KiB) under which a command starts at all.
vm_floor() { # binary
    for kb in 100000 200000 400000 800000 1600000 3200000; do
        if timeout -k 2 20 bash -c "ulimit -v $kb; exec '$1' --help" >/dev/null 2>&1; then echo "$kb"; return; fi
    done
    echo 0
}

@test "a low ulimit -v gives a clear error, not a crash or a hang" {
    [ -z "${CIFAR_ASAN:-}" ] || skip "ASan reserves terabytes of address space"
    # Every run is exec'd under `timeout` (status 124 = a hang), so nothing outlives it.
    # Below 512 MiB train and eval refuse to start (OpenBLAS would retry a failed
    # allocation forever); above it, our own checked allocations fail first.
    for cmd in cifar-train cifar-eval; do
        run timeout -k 5 60 bash -c "ulimit -v 250000; exec '$BIN/$cmd' --quiet --data '$LMDB' '$LMDB' 2>&1"
        assert_clean_failure "ulimit -v"
    done
    run timeout -k 5 120 bash -c "ulimit -v 700000; exec '$BIN/cifar-train' --quiet --device cpu --threads 1 \
        --epochs 1 --batch-size 65536 --run-dir '$BATS_TEST_TMPDIR/run' '$LMDB' 2>&1"
    assert_clean_failure "out of memory"
    assert_output --partial "lower --batch-size"
    run timeout -k 5 120 bash -c "ulimit -v 700000; exec '$BIN/cifar-eval' --quiet --device cpu \
        --threads 1 --batch-size 100000 --data '$LMDB' '$BASE_SNAP' 2>&1"
    echo "$output"
    [ "$status" -eq 0 ] || assert_clean_failure "cifar-eval: "
    floor=$(vm_floor "$BIN/cifar-prep")
    run timeout -k 5 120 bash -c "ulimit -v $((floor + 20000)); exec '$BIN/cifar-prep' --quiet --force \
        -o '$BATS_TEST_TMPDIR/o.lmdb' '$DATA' 2>&1"
    echo "$output"
    [ "$status" -eq 0 ] || assert_clean_failure "cifar-prep: "
    no_temporaries "$BATS_TEST_TMPDIR"
}

# ------------------------------------------------------------ files that are not ours (issue 20)

@test "RUN/lock as a symlink or a FIFO is refused, its target untouched" {
    dir="$BATS_TEST_TMPDIR/run"
    mkdir -p "$dir"
    echo precious > "$BATS_TEST_TMPDIR/victim"
    ln -s "$BATS_TEST_TMPDIR/victim" "$dir/lock"
    run train "$dir" --epochs 1
    assert_clean_failure "$dir/lock: a symlink, not a regular file: the run folder lock is not followed"
    [ "$(cat "$BATS_TEST_TMPDIR/victim")" = precious ]
    rm "$dir/lock"
    mkfifo "$dir/lock"
    run timeout -k 2 30 "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$dir" "$LMDB"
    assert_clean_failure "$dir/lock: not a regular file: the run folder lock is not used"
    [ -p "$dir/lock" ]
}

@test "metrics.jsonl as a symlink is refused, never appended through" {
    dir="$BATS_TEST_TMPDIR/run"
    mkdir -p "$dir"
    echo precious > "$BATS_TEST_TMPDIR/victim"
    ln -s "$BATS_TEST_TMPDIR/victim" "$dir/metrics.jsonl"
    run train "$dir" --epochs 1
    assert_clean_failure "$dir/metrics.jsonl is a symlink, not a regular file: not replaced"
    [ "$(cat "$BATS_TEST_TMPDIR/victim")" = precious ]
    [ -L "$dir/metrics.jsonl" ]
}

@test "a FIFO as cifar-eval's snapshot or as a snapshot in the run folder never blocks" {
    mkfifo "$BATS_TEST_TMPDIR/s.safetensors"
    run timeout -k 2 30 "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/s.safetensors"
    assert_clean_failure "s.safetensors: a FIFO, not a regular file"
    dir="$BATS_TEST_TMPDIR/run"
    cp -r "$T/base" "$dir"
    mkfifo "$dir/snapshot-999999.safetensors"
    run timeout -k 2 60 "$BIN/cifar-train" --quiet --threads 1 --batch-size 32 --model "$MODEL" \
        --save-every 1 --run-dir "$dir" --epochs 2 "$LMDB"
    assert_success
    assert_output --partial "snapshot-999999.safetensors: skipping this snapshot: a FIFO, not a regular file"
    [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
}

@test "a stray snapshot-1000000 (a copy of an old one) neither wins the resume nor makes --keep delete the newest" {
    dir="$BATS_TEST_TMPDIR/run"
    train "$dir" --epochs 3 --keep 3 >/dev/null
    cp "$dir/snapshot-000004.safetensors" "$dir/snapshot-1000000.safetensors"
    run train_verbose "$dir" --epochs 4 --keep 2
    assert_success
    # Resumed from the most progress recorded inside a snapshot, named as the file read.
    assert_output --partial "resuming from $dir/snapshot-000012.safetensors: 3 epochs done"
    [ -f "$dir/snapshot-000016.safetensors" ]
    [ -f "$dir/snapshot-000012.safetensors" ]
    [ -f "$dir/snapshot-1000000.safetensors" ] # not this run's to delete either
    [ ! -f "$dir/snapshot-000008.safetensors" ]
    [ "$(wc -l < "$dir/metrics.jsonl")" -eq 4 ]
    # The rerun has nothing left to do.
    run train_verbose "$dir" --epochs 4 --keep 2
    assert_success
    assert_output --partial "resuming from $dir/snapshot-000016.safetensors: 4 epochs done"
    assert_output --partial "already trained for 4 epochs"
}

@test "a snapshot holding NaN or infinite weights: eval refuses it by name, resume falls back to the previous finite one" {
    for v in nan inf; do
        s="$BATS_TEST_TMPDIR/$v.safetensors"
        snapshot_poison "$BASE_SNAP" "$s" 1.weight "$v"
        run "$BIN/cifar-eval" --quiet --threads 1 "$s"
        if [ "$v" = nan ]; then word=NaN; else word=infinite; fi
        assert_clean_failure "$v.safetensors: tensor 1.weight holds $word values (element 0)"
    done
    snapshot_poison "$BASE_SNAP" "$BATS_TEST_TMPDIR/m.safetensors" optimizer.momentum nan
    run "$BIN/cifar-eval" --quiet --threads 1 "$BATS_TEST_TMPDIR/m.safetensors"
    assert_clean_failure "tensor optimizer.momentum holds NaN values"
    dir="$BATS_TEST_TMPDIR/run"
    cp -r "$T/base" "$dir"
    train "$dir" --epochs 2 >/dev/null
    latest=$(ls "$dir"/snapshot-*.safetensors | sort | tail -1)
    snapshot_poison "$latest" "$latest" 1.weight nan
    run train "$dir" --epochs 2
    assert_success
    assert_output --partial "$(basename "$latest"): skipping this snapshot: tensor 1.weight holds NaN values"
    [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
}

# ------------------------------------------------------------ messages that mislead (issue 20)

@test "a 0-byte LMDB is called empty, not 'Bad file descriptor'" {
    : > "$BATS_TEST_TMPDIR/empty.lmdb"
    dataset_refused "$BATS_TEST_TMPDIR/empty.lmdb" "an empty file (0 bytes), not a cifar-prep LMDB"
    refute_output --partial "Bad file descriptor"
}

@test "numbers are decimal: --lr 0x10 (strtod's 16), inf and nan are refused" {
    for v in 0x10 0X1p-3 inf nan; do
        run "$BIN/cifar-train" --lr "$v" --run-dir "$BATS_TEST_TMPDIR/r" "$LMDB"
        [ "$status" -eq 2 ] || { echo "--lr $v: status $status"; echo "$output"; false; }
        assert_output --partial "--lr: expected a number in [0, 100], got '$v'"
    done
    [ ! -e "$BATS_TEST_TMPDIR/r" ]
}

@test "a --run-dir with a line break is refused (the last stdout line is the snapshot's path)" {
    run "$BIN/cifar-train" --quiet --run-dir "$BATS_TEST_TMPDIR/a
b" "$LMDB"
    [ "$status" -eq 2 ]
    assert_output --partial "--run-dir: the folder name holds a line break"
    [ ! -e "$BATS_TEST_TMPDIR/a" ]
}

@test "WORLD_SIZE without RANK is refused instead of training alone" {
    WORLD_SIZE=2 run "$BIN/cifar-train" --quiet --threads 1 --model "$MODEL" --run-dir "$BATS_TEST_TMPDIR/r" "$LMDB"
    [ "$status" -eq 2 ] || { echo "status $status"; echo "$output"; false; }
    assert_output --partial "WORLD_SIZE is set but RANK is not: this process does not know its rank"
    [ ! -e "$BATS_TEST_TMPDIR/r/metrics.jsonl" ]
}

@test "a snapshot of another dataset of the same shape is refused on resume; --fine-tune continues on purpose" {
    other="$BATS_TEST_TMPDIR/other"
    make_dataset "$other" --train 128 --test 32 --size 8 --seed 8
    dir="$BATS_TEST_TMPDIR/run"
    cp -r "$T/base" "$dir"
    run "$BIN/cifar-train" --quiet --threads 1 --batch-size 32 --model "$MODEL" --run-dir "$dir" \
        --epochs 2 "$other/cifar10.lmdb"
    assert_clean_failure "the snapshot was trained on other data of the same shape (dataset identity"
    assert_output --partial "--fine-tune to continue on this data on purpose"
    [ -z "$(ls "$dir" | grep snapshot-000008)" ]
    run "$BIN/cifar-train" --threads 1 --batch-size 32 --model "$MODEL" --run-dir "$dir" \
        --epochs 2 --fine-tune "$other/cifar10.lmdb"
    assert_success
    assert_output --partial "trained on other data (dataset identity"
    assert_output --partial "continuing on this data (--fine-tune)"
    # The same data rebuilt (cifar-prep -f: the same bytes) is the same dataset.
    cp -r "$DATA" "$BATS_TEST_TMPDIR/again"
    "$BIN/cifar-prep" --quiet -f "$BATS_TEST_TMPDIR/again" >/dev/null
    dir2="$BATS_TEST_TMPDIR/run2"
    cp -r "$T/base" "$dir2"
    run "$BIN/cifar-train" --quiet --threads 1 --batch-size 32 --model "$MODEL" --save-every 1 \
        --run-dir "$dir2" --epochs 2 "$BATS_TEST_TMPDIR/again/cifar10.lmdb"
    assert_success
    [ "$(data_checksum "${lines[-1]}")" = "$REF2" ]
}

# The step rank R last reported on its progress board (RUN_DIR/ranks/rank-R), 0 before.
board_step() { # run-dir rank
    local s
    s=$(grep -o 'step=[0-9]*' "$1/ranks/rank-$2" 2>/dev/null | cut -d= -f2)
    echo "${s:-0}"
}
board_past_step() { [ "$(board_step "$1" 0)" -ge "$2" ]; }

@test "SIGTERM to two ranks while rank 0's stop snapshot syncs slowly: rank 1 waits for it (srun --kill-on-bad-exit keeps the snapshot)" {
    # Once every rank has agreed to stop, the waits of the last snapshot and of the final
    # barrier are no longer cut short by the stop grace (0.5 s): rank 1 used to leave
    # after it with 143 while rank 0 was still in fsync, and srun --kill-on-bad-exit
    # then killed rank 0 before its snapshot was in place. Here the ranks are started
    # as srun starts them (each its own process with the job's variables, each
    # signalled), and the first to end with a failure gets its peer SIGKILLed.
    dir="$BATS_TEST_TMPDIR/slow"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pids=()
    for r in 0 1; do
        LD_PRELOAD="$FAULTINJECT" FI_PATH=".safetensors" FI_OPS=sync FI_DELAY_MS=3000 \
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port CIFAR_RUN_ID="slow-$port" \
            "$BIN/cifar-train" --device cpu --threads 1 --batch-size 32 --model "$MODEL" \
            --save-every 1000 --epochs 500 --run-dir "$dir" "$LMDB" >"$dir.$r.out" 2>"$dir.$r.err" &
        pids+=($!)
    done
    wait_until 600 board_past_step "$dir" 3
    kill -TERM "${pids[@]}"
    first=0
    wait -n "${pids[@]}" || first=$?
    kill -KILL "${pids[@]}" 2>/dev/null || [ $? -eq 1 ]   # --kill-on-bad-exit
    wait "${pids[@]}" || [ $? -ne 0 ]
    [ "$first" -eq 143 ] || { echo "first exit: $first"; cat "$dir".*.err; false; }
    snaps=("$dir"/snapshot-*.safetensors)
    [ -f "${snaps[0]}" ] || { echo "no snapshot"; cat "$dir".*.err; false; }
    "$BIN/cifar-eval" --quiet --threads 1 "${snaps[-1]}" >/dev/null
    no_temporaries "$dir"
    no_leftover_processes
}
