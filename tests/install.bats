#!/usr/bin/env bats
# make install / make uninstall: an install into a temporary DESTDIR + PREFIX runs
# the pipeline from PREFIX/share/cifar/ in another working folder with nothing of
# the checkout on PATH; every man page renders (man -l) and lists every option of
# the command's --help; the GPU library (CUDA builds) is found next to the
# installed commands; uninstall removes exactly what install put. As root with
# unshare(1): the same into /usr/local itself (a private mount namespace with
# empty /usr/local/{bin,lib,share}), where plain `man cifar-train` must work.
#
# `make install` runs with the make variables of the make that runs the suite
# (MAKEFLAGS: BIN, BUILD, OPT under test-asan), so it installs what was built.

bats_require_minimum_version 1.5.0
load helpers

REPO=$(cd "$BATS_TEST_DIRNAME/.." && pwd)
COMMANDS="cifar-prep cifar-train cifar-eval cifar-predict cifar-synth cifar-unpack"
SCRIPTS="demo.sh cifar10.sh multi-gpu.sh resume.sh mpi.sh plot.sh slurm.sbatch cifar-bin.sh curves.gp"

setup_file() {
    export STAGE=$BATS_FILE_TMPDIR/stage PREFIX_DIR=/opt/cifar-test
    export ROOT=$STAGE$PREFIX_DIR
    # the jobserver of the calling make is not ours to use
    MAKEFLAGS=$(printf '%s' "${MAKEFLAGS:-}" | sed 's/--jobserver-auth=[^ ]*//; s/--jobserver-fds=[^ ]*//')
    make -C "$REPO" --no-print-directory install DESTDIR="$STAGE" PREFIX="$PREFIX_DIR" \
        > "$BATS_FILE_TMPDIR/install.log" 2>&1 || { cat "$BATS_FILE_TMPDIR/install.log" >&3; return 1; }
    # the GPU library that install copies: empty in CPU builds
    export CUDA_SO MPI_SO GLOO_SO
    CUDA_SO=$(make -C "$REPO" --no-print-directory -s print-CUDA_SO)
    MPI_SO=$(make -C "$REPO" --no-print-directory -s print-MPI_SO)
    GLOO_SO=$(make -C "$REPO" --no-print-directory -s print-GLOO_SO)
}

# Every file under a folder, relative to it, sorted.
files_under() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort); }

@test "install puts the commands, man pages and pipeline scripts under PREFIX" {
    for c in $COMMANDS; do
        [ -x "$ROOT/bin/$c" ] || fail "$ROOT/bin/$c: not installed"
        [ -f "$ROOT/share/man/man1/$c.1" ] || fail "$ROOT/share/man/man1/$c.1: not installed"
    done
    for s in $SCRIPTS; do [ -f "$ROOT/share/cifar/$s" ] || fail "$ROOT/share/cifar/$s: not installed"; done
    [ -x "$ROOT/share/cifar/demo.sh" ]
    # nothing outside PREFIX, nothing unlisted
    run files_under "$STAGE"
    assert_success
    expected=$( { for c in $COMMANDS; do echo "${PREFIX_DIR#/}/bin/$c"; echo "${PREFIX_DIR#/}/share/man/man1/$c.1"; done
                  for s in $SCRIPTS; do echo "${PREFIX_DIR#/}/share/cifar/$s"; done
                  if [ -n "$CUDA_SO" ]; then echo "${PREFIX_DIR#/}/lib/cifar/libcifar-cuda.so"; fi
                  if [ -n "$MPI_SO" ]; then echo "${PREFIX_DIR#/}/lib/cifar/libcifar-mpi.so"; fi
                  if [ -n "$GLOO_SO" ]; then echo "${PREFIX_DIR#/}/lib/cifar/libcifar-gloo.so"; fi
                } | sort)
    assert_output "$expected"
}

@test "the installed pipeline runs from another folder with only the prefix on PATH" {
    work=$BATS_TEST_TMPDIR/elsewhere
    mkdir -p "$work"
    cd "$work"
    run env -u BIN PATH="$ROOT/bin:/usr/bin:/bin" EPOCHS=1 TRAIN_IMAGES=200 TEST_IMAGES=100 SIZE=16 \
        DEVICE=cpu BATCH=50 "$ROOT/share/cifar/demo.sh"
    assert_success
    assert_output --partial "$ROOT/bin/cifar-prep"
    assert_output --regexp "demo: test accuracy [0-9.]+% after 1 epochs"
    [ -s "$work/run/demo/eval.txt" ]
    [ -s "$work/data/demo.lmdb" ]
    [ -s "$work/run/demo/curves.png" ] # plot.sh and curves.gp from share/cifar/
}

@test "the pipeline scripts find the commands on PATH when they are not next to them" {
    loose=$BATS_TEST_TMPDIR/loose
    mkdir -p "$loose"
    cp "$ROOT/share/cifar/"{demo.sh,cifar-bin.sh,plot.sh,curves.gp} "$loose/"
    cd "$BATS_TEST_TMPDIR"
    run env -u BIN PATH="$ROOT/bin:/usr/bin:/bin" EPOCHS=1 TRAIN_IMAGES=100 TEST_IMAGES=50 SIZE=8 \
        DEVICE=cpu BATCH=50 "$loose/demo.sh"
    assert_success
    assert_output --partial "$ROOT/bin/cifar-train"
    # nowhere: the "not built" message names where it looked
    run env -u BIN PATH=/usr/bin:/bin "$loose/demo.sh"
    assert_failure 1
    assert_output --partial "cifar-synth: not built"
}

@test "man -l renders every page, with every option of the command's --help" {
    for c in $COMMANDS; do
        page=$ROOT/share/man/man1/$c.1
        run env MANWIDTH=250 LC_ALL=C man --no-hyphenation --no-justification -l "$page"
        assert_success
        assert_output --partial "NAME"
        assert_output --regexp "$c - [a-z]"
        assert_output --partial "SYNOPSIS"
        rendered=$output
        synopsis=$("$ROOT/bin/$c" --help | sed -n '1s/^usage: *//p' | tr -s ' ')
        [ -n "$synopsis" ] || fail "$c --help does not start with usage:"
        tr -s ' ' <<< "$rendered" | grep -qF -- "$synopsis" || fail "$c.1 lacks the synopsis $synopsis"
        opts=$("$ROOT/bin/$c" --help | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u)
        for o in $opts; do
            grep -qF -- "$o" <<< "$rendered" || fail "$c.1 lacks $o of $c --help"
        done
    done
}

@test "man finds the pages of a prefix whose bin/ is on PATH" {
    run env -u MANPATH PATH="$ROOT/bin:/usr/bin:/bin" man -w cifar-train
    assert_success
    assert_output "$ROOT/share/man/man1/cifar-train.1"
}

@test "the installed commands load the GPU library from PREFIX/lib/cifar (CUDA builds)" {
    [ -n "$CUDA_SO" ] || skip "no GPU build (no CUDA toolkit found by make): no libcifar-cuda.so to install"
    [ -f "$ROOT/lib/cifar/libcifar-cuda.so" ]
    data=$BATS_TEST_TMPDIR/data
    "$ROOT/bin/cifar-synth" "$data" --train 64 --test 32 --size 8 >/dev/null
    lmdb=$("$ROOT/bin/cifar-prep" --quiet "$data" | tail -1)
    cd "$BATS_TEST_TMPDIR"
    run env -u CIFAR_CUDA_LIB -u LD_LIBRARY_PATH "$ROOT/bin/cifar-train" --device auto --epochs 1 \
        --batch-size 32 --run-dir "$BATS_TEST_TMPDIR/run" "$lmdb"
    assert_success
    refute_output --partial "cannot load the GPU code"
}

@test "uninstall removes exactly what install put, and keeps other files" {
    copy=$BATS_TEST_TMPDIR/stage
    cp -a "$STAGE" "$copy"
    echo mine > "$copy$PREFIX_DIR/bin/not-ours"
    run make -C "$REPO" --no-print-directory uninstall DESTDIR="$copy" PREFIX="$PREFIX_DIR"
    assert_success
    run files_under "$copy"
    assert_success
    assert_output "${PREFIX_DIR#/}/bin/not-ours"
    [ ! -e "$copy$PREFIX_DIR/share/cifar" ] || fail "share/cifar/ left behind"
    [ ! -e "$copy$PREFIX_DIR/lib/cifar" ] || fail "lib/cifar/ left behind"
    # and on the untouched staging tree: nothing at all is left
    run make -C "$REPO" --no-print-directory uninstall DESTDIR="$STAGE" PREFIX="$PREFIX_DIR"
    assert_success
    run files_under "$STAGE"
    assert_success
    assert_output ""
}

@test "make install PREFIX=/usr/local: man cifar-train works (private mount namespace)" {
    [ "$(id -u)" = 0 ] || skip "not root: mounting over /usr/local in a private namespace needs root"
    command -v unshare # util-linux, essential in Debian
    unshare -m true 2>/dev/null || skip "root without CAP_SYS_ADMIN (a container): unshare -m is not permitted"
    run unshare -m bash -c '
        set -e
        for d in bin lib share; do mkdir -p /usr/local/$d; mount -t tmpfs none /usr/local/$d; done
        make -C "$1" --no-print-directory install PREFIX=/usr/local >/dev/null
        PATH=/usr/local/bin:/usr/bin:/bin
        command -v cifar-train
        env -u MANPATH MANWIDTH=200 man cifar-train | grep -m1 "cifar-train - "
        make -C "$1" --no-print-directory uninstall PREFIX=/usr/local >/dev/null
        find /usr/local/bin /usr/local/lib /usr/local/share -type f | wc -l
    ' _ "$REPO"
    assert_success
    assert_line --index 0 /usr/local/bin/cifar-train
    assert_line --index 1 --regexp "^ +cifar-train - train"
    assert_line --index 2 0
}
