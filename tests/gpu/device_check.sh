#!/usr/bin/env bash
# tests/gpu/device_check.sh: the one prepared command a session lent a GPU machine
# runs as is (README, "GPU build"): through the device tool, from the repository
# root, with the .deb files carried (made here first with tests/gpu/fetch_debs.sh):
#
#   run  command: tests/gpu/device_check.sh   carry: [".debs"]   timeout_s: 600
#
# It runs tests/gpu/run.sh with T_TOTAL=540 (every stage cut to fit 9 minutes: the
# tool stops a command at 10, and a lent machine has about 15 minutes of device time
# in all, its start included) and SKIP_BENCH=1, both unless set. run.sh's logs go to
# $OUT/logs and are packed into $OUT/logs.tar.gz, summary.txt beside it: the tool
# brings back at most 8 files from $OUT. Exit status: run.sh's.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/cifar-gpu-check}
logs=$out/logs
rm -rf "$logs"
mkdir -p "$logs"
export T_TOTAL=${T_TOTAL:-540} SKIP_BENCH=${SKIP_BENCH:-1}
OUT=$logs "$here/run.sh"
rc=$?
cp "$logs/summary.txt" "$out/summary.txt" 2>/dev/null
if tar -czf "$out/logs.tar.gz" -C "$out" logs; then
    rm -rf "$logs"
fi
echo "device_check: tests/gpu/run.sh exited $rc; $out/summary.txt, every log in $out/logs.tar.gz"
exit $rc
