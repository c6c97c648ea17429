#!/usr/bin/env bash
# tests/gpu/fetch_debs.sh: download (not install) the .deb files of the Debian
# libraries the build needs into .debs/ of the repository, for a GPU machine that
# has CUDA but neither these libraries nor network access. tests/gpu/run.sh unpacks
# them under /tmp there when the system lacks them. Run here, as root, with apt
# configured (the package lists are updated first):
#   tests/gpu/fetch_debs.sh          (.debs/ is in .gitignore)
# then send .debs along with the working tree (the device tool's `carry`). The lent
# machine needs a glibc at least as new as this machine's for these files to load.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "fetch_debs.sh: run as root (apt-get update)" >&2; exit 1; }
apt-get update -qq
mkdir -p "$repo/.debs"
cd "$repo/.debs"
rm -f ./*.deb # one version of each package: run.sh unpacks them all
# The libraries, their -dev packages, and what the runtime libraries need beyond
# libc (zlib for libpng; libgfortran and libquadmath for OpenBLAS).
apt-get download libpng-dev libpng16-16 zlib1g-dev libturbojpeg0-dev libturbojpeg0 \
    liblmdb-dev liblmdb0 libcjson-dev libcjson1 libopenblas-dev libopenblas0 \
    libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0 \
    libprotobuf-c-dev libprotobuf-c1
ls -l "$repo/.debs"
