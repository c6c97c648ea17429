#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS: build every libFuzzer target (tests/fuzz/fuzz_*.c) with
# clang -fsanitize=fuzzer,address,undefined and run each for SECONDS, with its
# corpus under build/fuzz/corpus_<name> (seeded from tests/fuzz/corpus_<name>/
# when present, and with generated seeds for the image and annotation targets).
# Exits non-zero when a build fails or a target finds a crash (the reproducer is
# left in build/fuzz/ as crash-*).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-30}
CLANG=${CLANG:-$(command -v clang || command -v clang-14 || true)}
[ -n "$CLANG" ] || { echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
OUT=build/fuzz
mkdir -p "$OUT"
FLAGS="-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Ishared -Iprep"
LIBS="-lpng -lturbojpeg -llmdb -lcjson -lm -lpthread"

sources_for() { # the library sources each target needs
    case "$1" in
        fuzz_annotations) echo "prep/annotations.c shared/data/classes.c shared/core/check.c shared/core/fsutil.c" ;;
        fuzz_image) echo "shared/data/image.c shared/core/check.c" ;;
        fuzz_snapshot) echo "shared/format/safetensors.c shared/core/check.c shared/core/fsutil.c" ;;
        fuzz_dataset) echo "shared/data/dataset.c shared/data/classes.c shared/data/crc32c.c shared/core/check.c shared/core/progress.c shared/core/fsutil.c" ;;
        *) ls shared/core/*.c shared/format/*.c shared/data/*.c shared/model/*.c shared/backend-cpu/*.c shared/comm/*.c shared/backend-cuda/cuda_loader.c | grep -v -e comm_mpi.c -e comm_nccl_cuda.c | tr '\n' ' ' ;;
    esac
}

seed_corpus() { # name dir
    local name=$1 dir=$2
    [ -d "tests/fuzz/corpus_${name#fuzz_}" ] && cp -n "tests/fuzz/corpus_${name#fuzz_}"/* "$dir"/ 2>/dev/null || true
    case "$name" in
        fuzz_annotations)
            printf '{"images":["a.png","b/c.jpg"],"categories":[0,7]}' > "$dir/seed-good.json"
            printf '{"images":["x.png"],"categories":[1.5]}' > "$dir/seed-frac.json"
            printf '{"images":[],"categories":[]}' > "$dir/seed-empty.json"
            printf '{"images":["a","b"],"categories":[1]}' > "$dir/seed-len.json" ;;
        fuzz_image)
            if [ -x bin/cifar-synth ]; then
                local tmp; tmp=$(mktemp -d)
                bin/cifar-synth "$tmp/rgb" --train 4 --test 1 --size 8 --jpeg-fraction 0.5 --seed 3 >/dev/null
                bin/cifar-synth "$tmp/gray" --train 4 --test 1 --size 8 --channels 1 --jpeg-fraction 0.5 --seed 4 >/dev/null
                for f in "$tmp"/*/train_cifar10/*; do cp "$f" "$dir/seed-$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")"; done
                rm -rf "$tmp"
            fi
            # palette, 16-bit, gray+alpha, interlaced PNGs from Python when available
            /usr/bin/python3 - "$dir" <<'PY' 2>/dev/null || true
import sys, numpy as np
from PIL import Image
d = sys.argv[1]
a = (np.arange(8*8*3).reshape(8, 8, 3) * 5 % 256).astype(np.uint8)
Image.fromarray(a).convert('P').save(d + '/seed-palette.png')
Image.fromarray(a).convert('LA').save(d + '/seed-graya.png')
Image.fromarray(a).convert('RGBA').save(d + '/seed-rgba.png', interlace=1)
Image.fromarray((a[:, :, 0].astype(np.uint16) * 257)).save(d + '/seed-gray16.png')
PY
            ;;
    esac
}

status=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    bin="$OUT/$name"
    echo "fuzz: building $name"
    # shellcheck disable=SC2046
    if ! "$CLANG" $FLAGS "$src" $(sources_for "$name") -o "$bin" $LIBS; then
        echo "fuzz: $name: build failed" >&2; status=1; continue
    fi
    corpus="$OUT/corpus_${name#fuzz_}"
    mkdir -p "$corpus"
    seed_corpus "$name" "$corpus"
    echo "fuzz: running $name for ${SECONDS_EACH}s (corpus $corpus)"
    if ! (cd "$OUT" && "./$name" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
            -print_final_stats=1 "corpus_${name#fuzz_}" 2>"$name.log"); then
        echo "fuzz: $name FOUND A PROBLEM; see $OUT/$name.log and $OUT/crash-*" >&2
        tail -40 "$OUT/$name.log" >&2
        status=1
    else
        grep -E '^stat::number_of_executed_units|^stat::peak_rss' "$OUT/$name.log" | sed "s/^/fuzz: $name: /"
    fi
done
exit $status
