#!/usr/bin/env bash
# plot.sh: draw a cifar-train run's curves with gnuplot.
#
#   pipelines/plot.sh RUN_DIR          (or: make plot RUN=RUN_DIR)
#
# Reads RUN_DIR/metrics.jsonl (one JSON object per epoch, written by cifar-train)
# and writes RUN_DIR/curves.png: loss (log scale) and accuracy per epoch, train and
# test. The PNG appears under its final name only when complete (rendered to a
# temporary name, then renamed). Prints the PNG's path as the last stdout line.
# Exit status: 0 done, 1 failure (no metrics, no gnuplot, gnuplot error), 2 bad usage.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=plot.sh

case "${1:-}" in
  -h|--help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
  '') echo "$me: give RUN_DIR (the --run-dir of cifar-train); see --help" >&2; exit 2 ;;
esac
[ $# -eq 1 ] || { echo "$me: give one RUN_DIR; see --help" >&2; exit 2; }
run=${1%/}
metrics=$run/metrics.jsonl
[ -d "$run" ] || { echo "$me: $run: no such folder" >&2; exit 1; }
[ -s "$metrics" ] || { echo "$me: $metrics: missing or empty (has the run finished an epoch?)" >&2; exit 1; }
command -v gnuplot >/dev/null || {
  echo "$me: gnuplot not found" >&2
  echo "---> HINT: sudo apt-get install gnuplot-nox (or: make deps)" >&2
  exit 1
}

table=$(mktemp "${TMPDIR:-/tmp}/cifar-curves.XXXXXX")
out=$run/curves.png
tmp=$out.tmp-$$
trap 'rm -f "$table" "$table.png" "$table.err" "$tmp"' EXIT

# One row per epoch; a later line for the same epoch wins (cifar-train truncates the
# file on resume, but a hand-concatenated file may repeat epochs). A missing field
# becomes NaN, which gnuplot leaves out of the line.
awk '
  function field(name,   m) {
    if (match($0, "\"" name "\":[-+0-9.eE]+|\"" name "\":(nan|inf|-inf|null)")) {
      m = substr($0, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
      return (m ~ /^[-+0-9.eE]+$/) ? m : "NaN"
    }
    return "NaN"
  }
  /"epoch":[0-9]+/ {
    e = field("epoch") + 0
    row[e] = e " " field("train_loss") " " field("train_acc") " " field("test_loss") " " field("test_acc")
    if (e > last) last = e
  }
  END { n = 0; for (e = 0; e <= last; e++) if (e in row) { print row[e]; n++ } if (n == 0) exit 3 }
' "$metrics" > "$table" || { echo "$me: $metrics: no epoch lines in it (not a cifar-train metrics file?)" >&2; exit 1; }

# gnuplot sees only mktemp names (no quotes to escape); the title loses any quote.
title=${run//[\'\"\\]/}
if ! gnuplot -e "datafile='$table'; outfile='$table.png'; runname='$title'" "$here/curves.gp" 2> "$table.err"; then
  echo "$me: gnuplot failed on $metrics:" >&2
  cat "$table.err" >&2
  exit 1
fi
[ -s "$table.png" ] || { echo "$me: gnuplot wrote nothing for $metrics" >&2; exit 1; }
cp "$table.png" "$tmp"
mv -f "$tmp" "$out"
echo "$out"
