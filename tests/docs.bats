#!/usr/bin/env bats
# The documentation names only what exists: every repository path in
# docs/ARCHITECTURE.md, every local link in README.md and docs/*.md.

bats_require_minimum_version 1.5.0
load helpers

REPO=$(cd "$BATS_TEST_DIRNAME/.." && pwd)
CHECK=$BATS_TEST_DIRNAME/check_doc_paths.sh

@test "every repository path docs/ARCHITECTURE.md names exists" {
    run "$CHECK" "$REPO" "$REPO/docs/ARCHITECTURE.md"
    assert_success
    assert_output ""
}

@test "every local link of README.md and docs/ reaches a file" {
    run "$CHECK" --links-only "$REPO" "$REPO/README.md" "$REPO"/docs/*.md
    assert_success
    assert_output ""
}

@test "the check finds a path, a file name and a link that do not exist" {
    doc="$BATS_TEST_TMPDIR/doc.md"
    printf '%s\n' 'The walk is in `shared/model/net_impl.h` and `net_impl.h`.' > "$doc"
    run "$CHECK" "$REPO" "$doc"
    assert_success
    printf '%s\n' 'See `shared/model/gone.h`, `gone_impl.h` and [x](nowhere.md#a).' > "$doc"
    run "$CHECK" "$REPO" "$doc"
    assert_failure 1
    assert_line "$doc: shared/model/gone.h does not exist"
    assert_line "$doc: no file is named gone_impl.h"
    assert_line "$doc: link to nowhere.md, which does not exist"
}
