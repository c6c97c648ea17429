#!/usr/bin/env bats
# The pipelines: plot.sh (metrics.jsonl -> curves.png), cifar-unpack and cifar10.sh on
# a tiny fake CIFAR-10 binary tarball (MD5 checked, offline download refused
# clearly), demo.sh with tiny settings, and every script's --help.

bats_require_minimum_version 1.5.0
load helpers

PIPES=$BATS_TEST_DIRNAME/../pipelines

# A batch file in the official format: records of 1 label byte + R, G, B planes of
# 32x32. Record i has label (first + i) % 10; R = 8x, G = 8y, B = 20 * label, so a
# decoded pixel tells its position, its channel order and its record's label.
fake_batch() { # file, records, first
    perl -e '
        my ($n, $first) = @ARGV;
        for my $i (0 .. $n - 1) {
            my $l = ($first + $i) % 10;
            print chr($l);
            print map { chr(($_ % 32) * 8) } 0 .. 1023;
            print map { chr(int($_ / 32) * 8) } 0 .. 1023;
            print chr($l * 20) x 1024;
        }' "$2" "$3" > "$1"
}

# cifar-10-batches-bin/ with 5 train batches of `per` records and a test batch of `test`.
fake_batches() { # dir, per, test
    mkdir -p "$1"
    for b in 1 2 3 4 5; do fake_batch "$1/data_batch_$b.bin" "$2" $(((b - 1) * $2)); done
    fake_batch "$1/test_batch.bin" "$3" 3
    printf 'airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n' > "$1/batches.meta.txt"
}

fake_tarball() { # output .tar.gz, per, test
    local d
    d=$(mktemp -d "$BATS_TEST_TMPDIR/tar.XXXXXX")
    fake_batches "$d/cifar-10-batches-bin" "$2" "$3"
    tar -czf "$1" -C "$d" cifar-10-batches-bin
}

metrics_line() { # epoch, train_loss, train_acc, test_loss, test_acc
    printf '{"epoch":%d,"train_loss":%s,"train_acc":%s,"test_loss":%s,"test_acc":%s,"lr":0.1,"images_per_s":100.0,"seconds":1.0,"world_size":1,"restarts":0,"device":"cpu"}\n' "$@"
}

is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }

@test "every pipeline script answers --help with exit 0" {
    for s in demo.sh cifar10.sh plot.sh resume.sh multi-gpu.sh; do
        run "$PIPES/$s" --help
        assert_success
        assert_output --partial "$s"
    done
    run "$BIN/cifar-unpack" --help
    assert_success
    assert_output --partial "usage: cifar-unpack BATCH_DIR OUT_DIR"
    bash -n "$PIPES/slurm.sbatch"
}

@test "plot.sh renders curves.png from a metrics file and prints its path" {
    run_dir="$BATS_TEST_TMPDIR/run"
    mkdir -p "$run_dir"
    metrics_line 1 2.1 0.25 389.5 0.10 > "$run_dir/metrics.jsonl"
    metrics_line 2 0.9 0.70 0.60 0.78 >> "$run_dir/metrics.jsonl"
    metrics_line 3 0.3 0.91 0.25 0.93 >> "$run_dir/metrics.jsonl"
    run --separate-stderr "$PIPES/plot.sh" "$run_dir"
    assert_success
    assert_equal "${lines[-1]}" "$run_dir/curves.png"
    is_png "$run_dir/curves.png"
    [ "$(stat -c %s "$run_dir/curves.png")" -gt 5000 ]
    [ -z "$(compgen -G "$run_dir/*tmp*")" ] # no temporary left (compgen prints the matches)
    # make plot RUN=dir is the same thing
    rm "$run_dir/curves.png"
    run make -s -C "$BATS_TEST_DIRNAME/.." plot RUN="$run_dir"
    assert_success
    is_png "$run_dir/curves.png"
}

@test "plot.sh refuses a missing folder, empty or foreign metrics, and no argument" {
    run "$PIPES/plot.sh"
    assert_failure 2
    run "$PIPES/plot.sh" "$BATS_TEST_TMPDIR/none"
    assert_failure 1
    assert_output --partial "none: no such folder"
    mkdir -p "$BATS_TEST_TMPDIR/r"
    : > "$BATS_TEST_TMPDIR/r/metrics.jsonl"
    run "$PIPES/plot.sh" "$BATS_TEST_TMPDIR/r"
    assert_failure 1
    assert_output --partial "missing or empty"
    echo '{"something":"else"}' > "$BATS_TEST_TMPDIR/r/metrics.jsonl"
    run "$PIPES/plot.sh" "$BATS_TEST_TMPDIR/r"
    assert_failure 1
    assert_output --partial "no epoch lines"
    [ ! -e "$BATS_TEST_TMPDIR/r/curves.png" ]
}

@test "cifar-unpack writes the seed layout: labels, record order, pixels in HWC order" {
    fake_batches "$BATS_TEST_TMPDIR/b" 4 6
    run --separate-stderr "$BIN/cifar-unpack" "$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/seed"
    assert_success
    assert_equal "${lines[-1]}" "$BATS_TEST_TMPDIR/seed"
    seed=$BATS_TEST_TMPDIR/seed
    [ "$(ls "$seed/train_cifar10" | wc -l)" -eq 20 ]
    [ "$(ls "$seed/test_cifar10" | wc -l)" -eq 6 ]
    # train record i has label i % 10 (batches continue each other's numbering)
    grep -q '"categories":\[0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9\]' "$seed/annotations/cifar10_train.json"
    grep -q '"images":\["img_00000.png","img_00001.png"' "$seed/annotations/cifar10_train.json"
    grep -q '"categories":\[3,4,5,6,7,8\]' "$seed/annotations/cifar10_test.json"
    names='"classes":\["airplane","automobile","bird","cat","deer","dog","frog","horse","ship","truck"\]'
    grep -q "$names" "$seed/annotations/cifar10_train.json"
    grep -q "$names" "$seed/annotations/cifar10_test.json"
    "$PY" - "$seed" <<'PYEOF'
import sys
from PIL import Image
seed = sys.argv[1]
for split, first, n in (("train", 0, 20), ("test", 3, 6)):
    for i in range(n):
        im = Image.open(f"{seed}/{split}_cifar10/img_{i:05d}.png")
        assert im.mode == "RGB" and im.size == (32, 32), (split, i, im.mode, im.size)
        label = (first + i) % 10
        for (x, y) in ((0, 0), (31, 0), (5, 17), (31, 31)):
            got = im.getpixel((x, y))
            assert got == (8 * x, 8 * y, 20 * label), (split, i, x, y, got)
PYEOF
    # and cifar-prep takes it as it is
    run --separate-stderr "$BIN/cifar-prep" --quiet "$seed"
    assert_success
    assert_equal "${lines[-1]}" "$seed/cifar10.lmdb"
}

@test "cifar-unpack names a missing, truncated or foreign batch file and writes no annotations" {
    fake_batches "$BATS_TEST_TMPDIR/b" 2 2
    rm "$BATS_TEST_TMPDIR/b/data_batch_4.bin"
    run "$BIN/cifar-unpack" "$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/s1"
    assert_failure 1
    assert_output --partial "data_batch_4.bin: no such file"
    fake_batch "$BATS_TEST_TMPDIR/b/data_batch_4.bin" 2 0
    head -c 5000 "$BATS_TEST_TMPDIR/b/test_batch.bin" > "$BATS_TEST_TMPDIR/t" && mv "$BATS_TEST_TMPDIR/t" "$BATS_TEST_TMPDIR/b/test_batch.bin"
    run "$BIN/cifar-unpack" "$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/s2"
    assert_failure 1
    assert_output --partial "test_batch.bin: 5000 bytes is not a whole number of 3073-byte records"
    fake_batch "$BATS_TEST_TMPDIR/b/test_batch.bin" 2 0
    printf '\x0c' | dd of="$BATS_TEST_TMPDIR/b/data_batch_2.bin" bs=1 seek=3073 conv=notrunc 2>/dev/null
    run "$BIN/cifar-unpack" "$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/s3"
    assert_failure 1
    assert_output --partial "data_batch_2.bin: record 1: label 12 is not a CIFAR-10 class"
    [ ! -e "$BATS_TEST_TMPDIR/s3/annotations/cifar10_train.json" ]
    run "$BIN/cifar-unpack" "$BATS_TEST_TMPDIR/b"
    assert_failure 2
}

@test "cifar10.sh: a local tarball, checksum checked, through prep | train | eval, then resumed" {
    cd "$BATS_TEST_TMPDIR"
    fake_tarball "$BATS_TEST_TMPDIR/cifar-10-binary.tar.gz" 40 50
    sum=$(md5sum cifar-10-binary.tar.gz | cut -d' ' -f1)
    CIFAR10_MD5=$sum EPOCHS=1 BATCH=50 THREADS=2 run --separate-stderr "$PIPES/cifar10.sh" cifar-10-binary.tar.gz
    assert_success
    assert_output --partial "accuracy: "
    assert_output --partial "(split test, 50 images)"
    [[ "$stderr" == *"MD5 $sum matches"* ]]
    [ "$(wc -l < run/cifar10/metrics.jsonl)" -eq 1 ]
    is_png run/cifar10/curves.png
    [ -f data/cifar10/seed/annotations/cifar10_train.json ]
    [ "$(ls data/cifar10/seed/train_cifar10 | wc -l)" -eq 200 ]
    # the same command with more epochs continues from the snapshot, skipping the unpack
    CIFAR10_MD5=$sum EPOCHS=2 BATCH=50 THREADS=2 run --separate-stderr "$PIPES/cifar10.sh"
    assert_success
    [[ "$stderr" == *"already unpacked"* ]]
    [[ "$stderr" == *"from 1"* ]]
    [ "$(wc -l < run/cifar10/metrics.jsonl)" -eq 2 ]
    # --prep-only ends with the LMDB path
    CIFAR10_MD5=$sum run --separate-stderr "$PIPES/cifar10.sh" --prep-only
    assert_success
    assert_equal "${lines[-1]}" "data/cifar10/cifar10.lmdb"
}

@test "cifar10.sh refuses a tarball whose MD5 is not the published one, before unpacking" {
    cd "$BATS_TEST_TMPDIR"
    fake_tarball "$BATS_TEST_TMPDIR/fake.tar.gz" 2 2
    run "$PIPES/cifar10.sh" fake.tar.gz
    assert_failure 1
    assert_output --partial "fake.tar.gz: MD5"
    assert_output --partial "expected c32a1d4ab5d03f1284b67883e8d87530"
    [ ! -e data/cifar10/seed ]
    [ ! -e data/cifar10/cifar-10-batches-bin ]
}

@test "cifar10.sh without a local copy and without network fails with a clear message" {
    cd "$BATS_TEST_TMPDIR"
    CIFAR10_URL=http://127.0.0.1:9/cifar-10-binary.tar.gz run "$PIPES/cifar10.sh"
    assert_failure 1
    assert_output --partial "cannot download http://127.0.0.1:9/cifar-10-binary.tar.gz (no network here?)"
    assert_output --partial "HINT"
    [ ! -e data/cifar10/cifar-10-binary.tar.gz ]
    [ ! -e data/cifar10/cifar-10-binary.tar.gz.part ]
    run "$PIPES/cifar10.sh" missing.tar.gz
    assert_failure 1
    assert_output --partial "missing.tar.gz: no such file"
}

@test "demo.sh with tiny settings: synthetic data, the pipeline, accuracy line, curves" {
    cd "$BATS_TEST_TMPDIR"
    TRAIN_IMAGES=256 TEST_IMAGES=64 SIZE=16 EPOCHS=2 BATCH=64 THREADS=2 run --separate-stderr "$PIPES/demo.sh"
    assert_success
    assert_output --regexp "demo: test accuracy [0-9.]+% after 2 epochs on demo, wall time [0-9]+:[0-9]{2}"
    assert_output --partial "accuracy: "
    [ "$(wc -l < run/demo/metrics.jsonl)" -eq 2 ]
    is_png run/demo/curves.png
    grep -q '^accuracy: ' run/demo/eval.txt
    # DATA=dir takes a dataset in the seed's layout; the run folder is named after it
    "$BIN/cifar-synth" mine --train 128 --test 32 --size 16 >/dev/null
    DATA=mine EPOCHS=1 BATCH=64 THREADS=2 run --separate-stderr "$PIPES/demo.sh"
    assert_success
    assert_output --partial "after 1 epochs on mine"
    [ -f run/mine/metrics.jsonl ]
    DATA=nowhere run "$PIPES/demo.sh"
    assert_failure 1
    assert_output --partial "nowhere: not the seed's layout"
}

@test "resume.sh: a SIGKILLed run resumes when rerun; the launcher restarts a group after a worker dies" {
    cd "$BATS_TEST_TMPDIR"
    EPOCHS=3 TRAIN_IMAGES=384 TEST_IMAGES=64 SIZE=16 BATCH=64 run "$PIPES/resume.sh"
    assert_success
    assert_output --partial "resuming from run/resume-demo/crash/snapshot-"
    assert_output --partial "restarting the group (1/2)"
    assert_output --regexp "crash/snapshot-[0-9]+\.safetensors: [0-9.]+%"
    assert_output --regexp "launcher/snapshot-[0-9]+\.safetensors: [0-9.]+%"
    # both runs completed every epoch; the second one records its restart
    [ "$(wc -l < run/resume-demo/crash/metrics.jsonl)" -eq 3 ]
    tail -1 run/resume-demo/launcher/metrics.jsonl | grep -q '"epoch":3,.*"restarts":1'
}

@test "multi-gpu.sh runs without a GPU (CPU workers) and takes an LMDB or DATA" {
    cd "$BATS_TEST_TMPDIR"
    "$BIN/cifar-synth" d --train 128 --test 32 --size 16 >/dev/null
    lmdb=$("$BIN/cifar-prep" --quiet d | tail -1)
    NPROC=2 DEVICE=cpu EPOCHS=1 BATCH=32 TRAIN_ARGS="--threads 1" run --separate-stderr "$PIPES/multi-gpu.sh" "$lmdb"
    assert_success
    assert_output --partial "accuracy: "
    grep -q '"world_size":2' run/multi-gpu/metrics.jsonl
    is_png run/multi-gpu/curves.png
    run "$PIPES/multi-gpu.sh"
    assert_failure 2
    run "$PIPES/multi-gpu.sh" nowhere.lmdb
    assert_failure 1
    assert_output --partial "nowhere.lmdb: no such LMDB file"
}

# srun and scontrol stand-ins: `srun ... CMD` starts SLURM_NTASKS copies of CMD with
# SLURM_PROCID/SLURM_LOCALID set (one node), or one with --ntasks=1.
fake_slurm() { # bin dir
    mkdir -p "$1"
    cat > "$1/srun" <<'SH'
#!/usr/bin/env bash
n=$SLURM_NTASKS
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
    [ "$1" != --ntasks=1 ] || n=1
    shift
done
pids=()
for ((i = 0; i < n; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=$n SLURM_TASKS_PER_NODE=$n "$@" & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do st=0; wait "$p" || st=$?; [ "$st" -le "$rc" ] || rc=$st; done
exit $rc # the highest status of the tasks, as srun's
SH
    # scontrol show hostnames: this host; scontrol requeue: recorded in $SCONTROL_LOG
    printf '#!/bin/sh\n[ "$1" != requeue ] || { echo "requeue $2" >> "$SCONTROL_LOG"; exit 0; }\necho 127.0.0.1\n' > "$1/scontrol"
    chmod +x "$1/srun" "$1/scontrol"
}

# slurm.sbatch as job JOB_ID of 2 tasks on one node, with the fake srun and scontrol
# (in the test's folder: a dataset d/, outputs in run/), under `run`.
slurm_job() { # job id
    cd "$BATS_TEST_TMPDIR"
    fake_slurm "$BATS_TEST_TMPDIR/fakebin"
    "$BIN/cifar-synth" d --train 128 --test 32 --size 16 >/dev/null
    lmdb=$("$BIN/cifar-prep" --quiet d | tail -1)
    PATH="$BATS_TEST_TMPDIR/fakebin:$PATH" SLURM_JOB_ID=$1 SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=1 \
        SLURM_JOB_NODELIST=localhost BIN="$BIN" DEVICE=cpu EPOCHS=1 BATCH=32 TRAIN_ARGS="--threads 1" \
        SCONTROL_LOG="$BATS_TEST_TMPDIR/scontrol.log" run "$PIPES/slurm.sbatch" "$lmdb"
}

@test "slurm.sbatch: srun tasks train as ranks of one job, then rank 0's snapshot is evaluated" {
    slurm_job 4242
    assert_success
    assert_output --partial "2 tasks on 1 nodes"
    assert_output --partial "accuracy: "
    grep -q '"world_size":2' run/slurm-4242/metrics.jsonl
    [ "$(grep -c safetensors run/slurm-4242/final.txt)" -eq 1 ]
    run env -u SLURM_JOB_ID "$PIPES/slurm.sbatch" "$lmdb"
    assert_failure 2
    assert_output --partial "not inside a Slurm job"
}

@test "slurm.sbatch: ranks stopped by SIGUSR1 (Slurm's warning) write a snapshot, exit 138, and the job is requeued" {
    use_test_build
    # each rank raises SIGUSR1 after step 1 of 2 (the test hook stands in for Slurm's signal)
    CIFAR_TEST_SIGNAL=10 CIFAR_TEST_SIGINT_AFTER_STEPS=1 slurm_job 4343
    assert_success
    assert_output --partial "stopped by a signal with a snapshot written (exit 138): requeueing job 4343"
    [ "$(cat "$BATS_TEST_TMPDIR/scontrol.log")" = "requeue 4343" ]
    [ -f run/slurm-4343/snapshot-000001.safetensors ]
    [[ "$output" != *"accuracy: "* ]]   # not evaluated: the requeued job finishes first
}
