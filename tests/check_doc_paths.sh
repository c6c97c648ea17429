#!/bin/sh
# check_doc_paths.sh [--links-only] REPO FILE.md...: every repository path a document
# names exists.
#
# In each FILE, a `backticked` token is a repository path when its first component is
# an entry of REPO's top level (`shared/core/check.h`, `tests/`, `Makefile`): it must
# exist under REPO. A backticked bare file name with a source extension (`net_impl.h`)
# must be the name of some file under REPO. Markdown links to local files
# ([x](docs/DESIGN.md#memory)) must reach a file, relative to the document. Build
# outputs (bin/, build/) and placeholders (DATA_DIR/...) are not repository paths.
# --links-only checks the links alone (README.md also names files outside the tree, such
# as the seed's resnet.py). Prints one line per missing path; exits 1 if there was any.
set -eu
paths=1
if [ "$1" = --links-only ]; then
    paths=0
    shift
fi
repo=$1
shift
missing=0
for doc in "$@"; do
    dir=$(dirname "$doc")
    [ $paths = 1 ] && for tok in $(grep -o '`[^` ]*`' "$doc" | tr -d '`' | sort -u); do
        first=${tok%%/*}
        case $first in bin|build|.|..|'') continue ;; esac
        if [ -e "$repo/$first" ] && [ "$first" != "$tok" -o -f "$repo/$tok" ]; then
            [ -e "$repo/$tok" ] || { echo "$doc: $tok does not exist"; missing=1; }
        else
            case $tok in
            */*) ;;
            *.c|*.h|*.cu|*.sh|*.bats|*.py|*.md|*.gp|*.sbatch)
                [ -n "$(find "$repo" -path "$repo/.git" -prune -o -name "$tok" -print | head -1)" ] ||
                    { echo "$doc: no file is named $tok"; missing=1; } ;;
            esac
        fi
    done
    for link in $(grep -o '](\([^)#:]*\)[#)]' "$doc" | sed 's/^](//; s/[#)]$//' | sort -u); do
        [ -e "$dir/$link" ] || { echo "$doc: link to $link, which does not exist"; missing=1; }
    done
done
exit $missing
