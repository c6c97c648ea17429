#!/usr/bin/env bash
# skip_summary.sh: run a test command, then list every test it skipped and why.
#
#   tests/skip_summary.sh LOG COMMAND...     (make test, make test-asan)
#
# COMMAND's stdout and stderr go to the terminal and to LOG. Afterwards one line per
# skip: the bats tests reported as "ok N NAME # skip REASON" (TAP) and the unit tests'
# "SKIP" lines, then their count. Only the absence of a GPU (or of the CUDA toolkit)
# or of root may skip (README, Tests): the summary is where anything else shows.
# Exits with COMMAND's status.
set -uo pipefail
log=$1
shift
mkdir -p "$(dirname "$log")"
"$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
{
    sed -n 's/^ok [0-9]* \(.*\) # skip \{0,1\}\(.*\)$/  bats: \1: \2/p' "$log"
    grep -E '(^|: )SKIP\b' "$log" | grep -vE '^(ok |not ok |#)' | sed 's/^/  unit: /'
} > "$log.skips"
echo "== skipped tests: $(wc -l < "$log.skips") (a skip is for want of hardware, a GPU, or of root)"
cat "$log.skips"
exit "$status"
