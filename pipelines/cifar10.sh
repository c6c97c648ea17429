#!/usr/bin/env bash
# cifar10.sh: the official CIFAR-10 binary distribution to an evaluated model.
#
#   pipelines/cifar10.sh [--prep-only] [cifar-10-binary.tar.gz | cifar-10-batches-bin/]
#
# 1. the tarball: the one given, else WORK/cifar-10-binary.tar.gz, else a download
#    from CIFAR10_URL (curl or wget); its MD5 is checked against the published one
#    (c32a1d4ab5d03f1284b67883e8d87530) before anything is unpacked;
# 2. unpack: tar, then cifar-unpack writes the seed's layout (annotations/*.json and
#    PNG images) to WORK/seed (kept: a second run starts at step 3);
# 3. cifar-prep WORK/seed | cifar-train ... | cifar-eval, then RUN_DIR/curves.png.
# --prep-only stops after cifar-prep and prints the LMDB path. Rerunning resumes the
# training from RUN_DIR's latest snapshot (the same command, nothing else to do).
#
# Environment (all optional):
#   BIN=(../bin, PREFIX/bin or PATH)  WORK=data/cifar10  LMDB=WORK/cifar10.lmdb  RUN_DIR=run/cifar10
#   EPOCHS=30  BATCH=256 (per process)  NPROC=1 (N | gpu | auto)  DEVICE=auto
#   THREADS=  TRAIN_ARGS="--lr 0.1 --schedule cosine ..."   extra cifar-train options
#   CIFAR10_URL=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
#   CIFAR10_MD5=c32a1d4ab5d03f1284b67883e8d87530 (a mirror's own file: its own sum)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me=cifar10.sh

usage() { sed -n '2,22s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
fail() { echo "$me: $1" >&2; [ -z "${2:-}" ] || echo "---> HINT: $2" >&2; exit 1; }

prep_only=0
src=
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --prep-only) prep_only=1 ;;
    -*) echo "$me: unknown option $1; see --help" >&2; exit 2 ;;
    *) [ -z "$src" ] || { echo "$me: give one tarball or folder; see --help" >&2; exit 2; }
       src=$1 ;;
  esac
  shift
done

. "$here/cifar-bin.sh"
WORK=${WORK:-data/cifar10}
LMDB=${LMDB:-$WORK/cifar10.lmdb}
RUN_DIR=${RUN_DIR:-run/cifar10}
EPOCHS=${EPOCHS:-30}
BATCH=${BATCH:-256}
NPROC=${NPROC:-1}
DEVICE=${DEVICE:-auto}
THREADS=${THREADS:-}
TRAIN_ARGS=${TRAIN_ARGS:-}
CIFAR10_URL=${CIFAR10_URL:-https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz}
CIFAR10_MD5=${CIFAR10_MD5:-c32a1d4ab5d03f1284b67883e8d87530}

for c in cifar-unpack cifar-prep cifar-train cifar-eval; do
  [ -x "$BIN/$c" ] || fail "$BIN/$c: not built" "run make (or make CUDA=0) first"
done
mkdir -p "$WORK"
seed=$WORK/seed

# ---- 1. the tarball ----
md5_check() { # file
  local sum
  sum=$(md5sum "$1" | cut -d' ' -f1)
  [ "$sum" = "$CIFAR10_MD5" ] ||
    fail "$1: MD5 $sum, expected $CIFAR10_MD5 (a truncated or altered download)" \
         "delete it and run again to download it afresh; a mirror's file with its own sum: CIFAR10_MD5=..."
  echo "$me: $1: MD5 $sum matches" >&2
}

download() { # url, output
  local tmp=$2.part
  echo "$me: downloading $1 (163 MB)" >&2
  if command -v curl >/dev/null; then
    curl -fL --retry 2 --connect-timeout 20 -o "$tmp" "$1" || { rm -f "$tmp"; return 1; }
  elif command -v wget >/dev/null; then
    wget -q --tries=2 --timeout=20 -O "$tmp" "$1" || { rm -f "$tmp"; return 1; }
  else
    echo "$me: neither curl nor wget is installed" >&2
    return 1
  fi
  mv "$tmp" "$2"
}

batches=
if [ -n "$src" ] && [ -d "$src" ]; then
  batches=$src          # an unpacked cifar-10-batches-bin/: no tarball to check
elif [ -f "$seed/annotations/cifar10_test.json" ] && [ -z "$src" ]; then
  echo "$me: $seed: already unpacked" >&2
else
  tarball=${src:-$WORK/cifar-10-binary.tar.gz}
  if [ ! -f "$tarball" ]; then
    [ -z "$src" ] || fail "$src: no such file" "give cifar-10-binary.tar.gz or its unpacked cifar-10-batches-bin/ folder"
    download "$CIFAR10_URL" "$tarball" ||
      fail "cannot download $CIFAR10_URL (no network here?)" \
           "fetch cifar-10-binary.tar.gz on a machine with access and run: $0 /path/to/cifar-10-binary.tar.gz"
  fi
  md5_check "$tarball"
  rm -rf "$WORK/cifar-10-batches-bin"
  tar -xzf "$tarball" -C "$WORK" || fail "$tarball: tar could not unpack it" "fetch it again"
  batches=$WORK/cifar-10-batches-bin
  [ -d "$batches" ] || fail "$tarball: no cifar-10-batches-bin/ inside (not the binary version?)" \
                            "the binary version is cifar-10-binary.tar.gz, not the python or matlab one"
fi

# ---- 2. the seed's layout ----
if [ -n "$batches" ]; then
  rm -rf "$seed" "$LMDB"  # an LMDB of an earlier unpack would not match the new images
  "$BIN/cifar-unpack" "$batches" "$seed" >/dev/null
  [ "$batches" != "$WORK/cifar-10-batches-bin" ] || rm -rf "$batches"  # the PNGs replace it
fi

# ---- 3. prep | train | eval ----
if [ "$prep_only" = 1 ]; then
  "$BIN/cifar-prep" "$seed" -o "$LMDB" -f
  exit 0
fi
train_opts=(--epochs "$EPOCHS" --batch-size "$BATCH" --device "$DEVICE" --run-dir "$RUN_DIR")
[ "$NPROC" = 1 ] || train_opts+=(--nproc-per-node "$NPROC")
[ -z "$THREADS" ] || train_opts+=(--threads "$THREADS")
# shellcheck disable=SC2206 # TRAIN_ARGS is a list of options, split on purpose
[ -z "$TRAIN_ARGS" ] || train_opts+=($TRAIN_ARGS)
mkdir -p "$RUN_DIR"
# An LMDB from an earlier run is kept: rebuilding it would give the same bytes.
if [ -f "$LMDB" ]; then prep=(echo "$LMDB"); else prep=("$BIN/cifar-prep" "$seed" -o "$LMDB"); fi
echo "$me: ${prep[*]} | $BIN/cifar-train ${train_opts[*]} | $BIN/cifar-eval --device $DEVICE" >&2
"${prep[@]}" \
  | "$BIN/cifar-train" "${train_opts[@]}" \
  | "$BIN/cifar-eval" --device "$DEVICE" \
  | tee "$RUN_DIR/eval.txt"
if command -v gnuplot >/dev/null; then
  "$here/plot.sh" "$RUN_DIR" >/dev/null && echo "$me: curves: $RUN_DIR/curves.png" >&2
fi
