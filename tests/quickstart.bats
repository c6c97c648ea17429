#!/usr/bin/env bats
# README.md's quick start, run as written in a fresh copy of the tree.
#
# The commands between <!-- quickstart --> and <!-- /quickstart --> are run one by one
# in a copy of the source tree without build/, bin/, data/ or run/ (the tracked and
# untracked-but-not-ignored files, as a fresh clone with this tree's changes would be),
# so nothing built or installed by hand beforehand helps. The only overrides are
# variables the commands already honour: a tiny demo (EPOCHS, TRAIN_IMAGES, TEST_IMAGES,
# SIZE, BATCH). `make test` inside `make test` would recurse and double the suite's time:
# it runs for real with QUICKSTART_FULL=1 (its own quickstart.bats is then skipped),
# otherwise as `make -n test` (the target must resolve in the fresh copy).
# Also: every option of every command's --help appears in the README.

bats_require_minimum_version 1.5.0
load helpers

REPO=$(cd "$BATS_TEST_DIRNAME/.." && pwd)

# The quick-start commands: the lines of the fenced block between the markers, without
# comments and blank lines.
quickstart_commands() {
    awk '/<!-- quickstart -->/ { on = 1; next } /<!-- \/quickstart -->/ { on = 0 }
         on && /^```/ { fence = !fence; next }
         on && fence' "$REPO/README.md" | sed 's/[[:space:]]#.*$//; /^[[:space:]]*$/d'
}

fresh_copy() { # destination
    mkdir -p "$1"
    if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
            xargs -0 -I{} sh -c '[ -e "$1" ] && printf "%s\0" "$1"' _ {} |
            tar --null -T - -cf -) | tar -xf - -C "$1"
    else
        tar -C "$REPO" --exclude=./build --exclude=./bin --exclude=./data --exclude=./run -cf - . |
            tar -xf - -C "$1"
    fi
}

@test "README has a quick-start block with make pipeline and make test" {
    run quickstart_commands
    assert_success
    assert_line "make pipeline"
    assert_line "make test"
    [ "${#lines[@]}" -le 3 ]
}

@test "the quick start runs as written in a fresh copy of the tree" {
    [ -z "${CIFAR_QUICKSTART_NESTED:-}" ] || skip_because "inside the quick start's own make test"
    [ -z "${CIFAR_ASAN:-}" ] || skip_because "builds and runs the plain binaries, not the sanitized ones"
    copy="$BATS_FILE_TMPDIR/fresh"
    fresh_copy "$copy"
    [ -f "$copy/Makefile" ]
    [ -f "$copy/pipelines/demo.sh" ]
    [ -f "$copy/tests/helpers.bash" ]
    [ ! -e "$copy/bin" ]
    [ ! -e "$copy/build" ]
    cd "$copy"
    # The suite's BIN (the tree under test, given by make test-bats) must not reach the
    # copy's make: with it, make would build into and run the original tree's bin/.
    unset BIN FAULTINJECT
    while IFS= read -r cmd; do
        echo "# quick start: $cmd" >&3
        if [ "$cmd" = "make test" ] && [ -z "${QUICKSTART_FULL:-}" ]; then
            run make -n test
            assert_success
            continue
        fi
        CIFAR_QUICKSTART_NESTED=1 EPOCHS=2 TRAIN_IMAGES=300 TEST_IMAGES=100 SIZE=16 BATCH=50 \
            run bash -c "$cmd"
        echo "$output" | tail -5 >&3
        assert_success
    done < <(quickstart_commands)
    # make pipeline built the commands, ran the pipeline and drew the curves
    [ -x bin/cifar-train ]
    [ -x bin/cifar-unpack ]
    [ "$(wc -l < run/demo/metrics.jsonl)" -eq 2 ]
    grep -q '^accuracy: ' run/demo/eval.txt
    [ "$(head -c 4 run/demo/curves.png | od -An -c | tr -d ' ')" = '211PNG' ]
}

@test "every option in each command's --help is documented in the README" {
    for c in cifar-prep cifar-train cifar-eval cifar-synth cifar-unpack; do
        run "$BIN/$c" --help
        assert_success
        for opt in $(echo "$output" | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u); do
            grep -qF -- "$opt" "$REPO/README.md" || fail "$c $opt is not in README.md"
        done
    done
    for s in demo.sh cifar10.sh resume.sh multi-gpu.sh plot.sh; do
        grep -qF "pipelines/$s" "$REPO/README.md" || fail "pipelines/$s is not in README.md"
    done
}
