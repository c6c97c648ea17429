# bench_lib.bash: what the make bench scripts share (sourced, not run): reading JSON
# fields off lines, ranges and medians of a column of numbers, and whether this
# processor has bf16 instructions.

# The numeric value of a JSON field on every line of stdin ("images_per_s": 123.4).
column() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
field() { column "$1" | head -1; } # the first line's
# "LOW to HIGH" of the numbers on stdin, rounded to whole numbers.
range() { sort -g | awk '{ v[NR] = $1 } END { printf "%.0f to %.0f", v[1], v[NR] }'; }
# The median of the numbers on stdin (nothing for none), and the largest.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
largest() { sort -g | tail -1; }

# The bf16 instructions the processor reports (cpuinfo file: /proc/cpuinfo, or a copy of
# another machine's), space-separated: "avx512_bf16 amx_bf16", or nothing; fails (status
# 2, a message on stderr) when the file cannot be read.
cpu_bf16_features() { # cpuinfo
  local found rc=0
  found=$(grep -o -w -e avx512_bf16 -e amx_bf16 "$1") || rc=$?
  [ "$rc" -le 1 ] || { echo "bench: cannot read $1 (grep exit $rc)" >&2; return 2; }
  [ -z "$found" ] || sort -u <<< "$found" | paste -sd' '
}

# The bench's one line where the processor has no bf16 instructions: it then reports fp32 only.
bf16_lacking_line() { # cpuinfo
  echo "bf16: not measured: this processor lacks AVX512-BF16 and AMX (no avx512_bf16 or amx_bf16 in $1): fp32 only"
}
# The bench's one line where cifar-train refused --precision bf16 as bad usage (exit 2):
# its own first line of stderr says why.
bf16_refused_line() { # file holding the refused run's stderr
  echo "bf16: not measured: cifar-train refuses --precision bf16 here (exit 2): $(grep -m1 . "$1")"
}
