#!/usr/bin/env bash
# tests/gpu/fetch_debs.sh: download (not install) the .deb files of the Debian
# libraries the build needs into .debs/ of the repository, for a GPU machine that
# has CUDA but neither these libraries nor network access. tests/gpu/run.sh unpacks
# them under /tmp there when the system lacks them. Run here, with apt configured:
#   tests/gpu/fetch_debs.sh && echo /.debs/ >> .git/info/exclude
# then send .debs along with the working tree (the device tool's `carry`).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$repo/.debs"
cd "$repo/.debs"
apt-get download libpng-dev libpng16-16 zlib1g-dev libturbojpeg0-dev libturbojpeg0 \
    liblmdb-dev liblmdb0 libcjson-dev libcjson1 libopenblas-dev libopenblas0 \
    libopenblas0-pthread libopenblas-pthread-dev libgfortran5
ls -l "$repo/.debs"
