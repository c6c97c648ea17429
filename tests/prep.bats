#!/usr/bin/env bats
# cifar-prep: the seed layout -> one LMDB file. Usage, the output contract (OUT as
# the last stdout line, stdin input, --split), the decoded pixels and statistics
# (checked against Python/PIL through mdb_dump), and every kind of bad input:
# each must exit 1 with ONE line "cifar-prep: <file>: <reason>" and leave neither
# OUT nor a temporary file behind.

bats_require_minimum_version 1.5.0
load helpers

setup_file() {
    export BASE="$BATS_FILE_TMPDIR/base"
    "$BIN/cifar-synth" "$BASE" --train 24 --test 8 --size 8 --jpeg-fraction 0.3 --seed 5 >/dev/null
}

setup() {
    D="$BATS_TEST_TMPDIR/d"
    cp -r "$BASE" "$D"
}

# No OUT and no temporary file next to it.
no_leftovers() { # dir
    local left
    left=$(find "$1" -maxdepth 1 -name '*.lmdb*' -o -maxdepth 1 -name '*.tmp-*')
    [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}

# cifar-prep must fail with exit 1 and exactly one line matching the regexp.
prep_fails() { # regexp args...
    local re=$1; shift
    run "$BIN/cifar-prep" --quiet "$@"
    assert_failure 1
    [ "${#lines[@]}" -eq 1 ] || { echo "expected one line, got: $output"; return 1; }
    assert_output --regexp "^cifar-prep: $re"
    no_leftovers "$D"
}

# make deps installs both (DEB_TEST): their absence fails, it is no reason to skip.
need_pil() { "$PY" -c 'import PIL, numpy' || { echo "needs $PY with PIL and numpy (make deps)"; return 1; }; }
need_mdb_dump() { command -v mdb_dump >/dev/null || { echo "needs mdb_dump (lmdb-utils; make deps)"; return 1; }; }

# Records of SPLIT as "label hexpixels" lines, through mdb_dump; fails when a
# record's CRC-32C (bytes 4..8: of the label, then the pixels) does not match.
records() { # file split
    mdb_dump -n -s "$2" "$1" | "$PY" "$BATS_TEST_DIRNAME/dataset_record.py" records "$2"
}

meta_json() { # file
    mdb_dump -n -s meta "$1" | "$PY" -c '
import sys
lines = [l.strip() for l in sys.stdin if l.startswith(" ")]
print(bytes.fromhex(lines[1]).decode())'
}

# ------------------------------------------------------------------ usage

@test "--help exits 0 and describes the options" {
    run "$BIN/cifar-prep" --help
    assert_success
    assert_output --partial "usage: cifar-prep DATA_DIR"
    assert_output --partial "--split NAME=ANNOTATIONS.json:IMAGE_DIR"
    for opt in --output --num-classes --classes --threads --force --quiet --help; do
        assert_output --partial -- "$opt"
    done
}

@test "bad usage exits 2" {
    run "$BIN/cifar-prep" --bogus "$D"
    assert_failure 2
    assert_output --partial "unknown option --bogus"
    run "$BIN/cifar-prep" --threads 0 "$D"
    assert_failure 2
    run "$BIN/cifar-prep" "$D" "$D"
    assert_failure 2
    run "$BIN/cifar-prep" --split nonsense
    assert_failure 2
    run "$BIN/cifar-prep" -o
    assert_failure 2
    no_leftovers "$D"
}

# ------------------------------------------------------------------ success

@test "converts the seed layout and prints OUT as the only stdout line" {
    run --separate-stderr "$BIN/cifar-prep" "$D"
    assert_success
    assert_output "$D/cifar10.lmdb"
    [ -f "$D/cifar10.lmdb" ]
    [ -z "$(find "$D" -maxdepth 1 -name '*.tmp-*' -o -maxdepth 1 -name '*-lock')" ]
    [[ "$stderr" == *"wrote 32 images (8x8x3, "* ]]
}

@test "reads DATA_DIR from stdin and honours -o" {
    run --separate-stderr bash -c "echo '$D' | '$BIN/cifar-prep' --quiet -o '$BATS_TEST_TMPDIR/x.lmdb'"
    assert_success
    assert_output "$BATS_TEST_TMPDIR/x.lmdb"
    [ -z "$stderr" ]
    [ -f "$BATS_TEST_TMPDIR/x.lmdb" ]
}

@test "records, labels and metadata match the annotations and Python's decoding" {
    need_pil; need_mdb_dump
    "$BIN/cifar-synth" "$D/p" --train 40 --test 10 --size 8 --jpeg-fraction 0 --classes 7 --seed 9 >/dev/null
    run "$BIN/cifar-prep" --quiet --threads 3 "$D/p"
    assert_success
    records "$D/p/cifar10.lmdb" train > "$D/train.txt"
    meta_json "$D/p/cifar10.lmdb" > "$D/meta.json"
    run "$PY" - "$D/p" "$D/train.txt" "$D/meta.json" <<'PY'
import json, sys, numpy as np
from PIL import Image
root, recs, meta = sys.argv[1], open(sys.argv[2]).read().split('\n'), json.load(open(sys.argv[3]))
ann = json.load(open(root + '/annotations/cifar10_train.json'))
imgs = [np.asarray(Image.open(root + '/train_cifar10/' + f)) for f in ann['images']]
assert len([r for r in recs if r]) == len(imgs) == 40
for i, (img, lab) in enumerate(zip(imgs, ann['categories'])):
    l, h = recs[i].split()
    assert int(l) == lab, (i, l, lab)
    assert bytes.fromhex(h) == img.tobytes(), i
assert meta['format'] == 'cifar-lmdb' and meta['version'] == 3
assert (meta['height'], meta['width'], meta['channels']) == (8, 8, 3)
assert meta['num_classes'] == max(ann['categories']) + 1
x = np.stack(imgs).astype(np.float64) / 255
s = meta['splits']['train']
assert s['count'] == 40 and meta['splits']['test']['count'] == 10
assert np.allclose(s['mean'], x.mean(axis=(0, 1, 2)), atol=1e-6), (s['mean'], x.mean(axis=(0, 1, 2)))
assert np.allclose(s['std'], x.std(axis=(0, 1, 2)), atol=1e-6), (s['std'], x.std(axis=(0, 1, 2)))
print('ok')
PY
    assert_output "ok"
}

@test "the output does not depend on the thread count" {
    need_mdb_dump
    run "$BIN/cifar-prep" --quiet --threads 1 -o "$BATS_TEST_TMPDIR/a.lmdb" "$D"
    assert_success
    run "$BIN/cifar-prep" --quiet --threads 5 -o "$BATS_TEST_TMPDIR/b.lmdb" "$D"
    assert_success
    for s in train test meta; do
        cmp <(mdb_dump -n -s $s "$BATS_TEST_TMPDIR/a.lmdb") <(mdb_dump -n -s $s "$BATS_TEST_TMPDIR/b.lmdb")
    done
}

@test "PNG palette+tRNS, 16-bit, low bit depth, gray+alpha, RGBA and interlaced are normalised" {
    need_pil; need_mdb_dump
    mkdir -p "$D/n/rgb" "$D/n/gray"
    "$PY" - "$D/n" <<'PY'
import json, sys, numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.default_rng(1)
rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
gray = rng.integers(0, 256, (6, 5), dtype=np.uint8)
exp_rgb, exp_gray, names_rgb, names_gray = [], [], [], []
def add(lst, names, name, img, expect):
    img.save(d + '/' + name, **({'interlace': 1} if 'inter' in name else {}))
    names.append(name.split('/', 1)[1]); lst.append(expect)
add(exp_rgb, names_rgb, 'rgb/plain.png', Image.fromarray(rgb), rgb)
add(exp_rgb, names_rgb, 'rgb/inter.png', Image.fromarray(rgb), rgb)
rgba = np.dstack([rgb, rng.integers(0, 256, (6, 5), dtype=np.uint8)])
add(exp_rgb, names_rgb, 'rgb/rgba.png', Image.fromarray(rgba, 'RGBA'), rgb)
pal = Image.fromarray(rgb).quantize(16)
pal.info['transparency'] = 3
add(exp_rgb, names_rgb, 'rgb/palette_trns.png', pal, np.asarray(pal.convert('RGB')))
rgb16 = rgb.astype(np.uint16) * 257 + 100   # 16-bit: scaled back to 8 with rounding
open(d + '/rgb/rgb16.png', 'wb')  # written by hand below (PIL cannot write 16-bit RGB)
import zlib, struct
def png(path, w, h, depth, ctype, raw_rows):
    def chunk(t, b): return struct.pack('>I', len(b)) + t + b + struct.pack('>I', zlib.crc32(t + b))
    data = b''.join(b'\0' + r for r in raw_rows)
    open(path, 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, depth, ctype, 0, 0, 0))
                           + chunk(b'IDAT', zlib.compress(data)) + chunk(b'IEND', b''))
png(d + '/rgb/rgb16.png', 5, 6, 16, 2, [r.astype('>u2').tobytes() for r in rgb16])
names_rgb.append('rgb16.png'); exp_rgb.append(((rgb16.astype(np.uint32) * 255 + 32895) >> 16).astype(np.uint8))
add(exp_gray, names_gray, 'gray/plain.png', Image.fromarray(gray), gray)
la = np.dstack([gray, gray[::-1]])
add(exp_gray, names_gray, 'gray/la.png', Image.fromarray(la, 'LA'), gray)
bits = (gray > 127)
add(exp_gray, names_gray, 'gray/onebit.png', Image.fromarray(bits), bits.astype(np.uint8) * 255)
g16 = gray.astype(np.uint16) * 257
png(d + '/gray/g16.png', 5, 6, 16, 0, [r.astype('>u2').tobytes() for r in g16])
names_gray.append('g16.png'); exp_gray.append(gray)
for kind, names, exp in (('rgb', names_rgb, exp_rgb), ('gray', names_gray, exp_gray)):
    json.dump({'images': names, 'categories': list(range(len(names)))}, open(f'{d}/{kind}.json', 'w'))
    open(f'{d}/{kind}.expected', 'w').write('\n'.join(f'{i} {e.tobytes().hex()}' for i, e in enumerate(exp)) + '\n')
PY
    run "$BIN/cifar-prep" --quiet --split "train=$D/n/rgb.json:$D/n/rgb" -o "$D/n/rgb.lmdb"
    assert_success
    records "$D/n/rgb.lmdb" train | diff - "$D/n/rgb.expected"
    run "$BIN/cifar-prep" --quiet --split "train=$D/n/gray.json:$D/n/gray" -o "$D/n/gray.lmdb"
    assert_success
    records "$D/n/gray.lmdb" train | diff - "$D/n/gray.expected"
}

@test "grayscale datasets keep one channel; --num-classes sets K" {
    need_mdb_dump
    "$BIN/cifar-synth" "$D/g" --train 10 --test 4 --size 6 --channels 1 --classes 3 >/dev/null
    run "$BIN/cifar-prep" --quiet --num-classes 12 "$D/g"
    assert_success
    run meta_json "$D/g/cifar10.lmdb"
    assert_output --partial '"height":6,"width":6,"channels":1,"num_classes":12'
}

@test "--split reads other layouts and names the splits" {
    need_mdb_dump
    mkdir "$D/other"
    mv "$D/train_cifar10" "$D/other/pics"
    run --separate-stderr "$BIN/cifar-prep" --quiet --split "all=$D/annotations/cifar10_train.json:$D/other/pics" \
        --split "few=$D/annotations/cifar10_test.json:$D/test_cifar10" -o "$D/other/x.lmdb"
    assert_success
    assert_output "$D/other/x.lmdb"
    run meta_json "$D/other/x.lmdb"
    assert_output --partial '"all":{"count":24'
    assert_output --partial '"few":{"count":8'
    run "$BIN/cifar-prep" --split "all=$D/annotations/cifar10_train.json:$D/other/pics"
    assert_failure 2
}

# Add a "classes" list (JSON text) to an annotation file.
with_classes() { # annotation-file classes-json
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1]))
a["classes"] = json.loads(sys.argv[2])
json.dump(a, open(sys.argv[1], "w"))
PYEOF
}

TEN='["c0","c1","c2","c3","c4","c5","c6","c7","c8","c9"]'

@test "class names: the annotation files' \"classes\", or --classes FILE (JSON or lines), land in the metadata" {
    need_mdb_dump
    for s in train test; do with_classes "$D/annotations/cifar10_$s.json" "$TEN"; done
    run "$BIN/cifar-prep" --quiet "$D"
    assert_success
    run meta_json "$D/cifar10.lmdb"
    assert_output --partial ',"classes":["c0","c1","c2","c3","c4","c5","c6","c7","c8","c9"]}'
    # --classes replaces the files' list: one name per line (CRLF too) ...
    printf 'plane\r\ncar\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck with space\n' > "$D/names.txt"
    run "$BIN/cifar-prep" --quiet --force --classes "$D/names.txt" "$D"
    assert_success
    run meta_json "$D/cifar10.lmdb"
    assert_output --partial '"classes":["plane","car","bird","cat","deer","dog","frog","horse","ship","truck with space"]'
    # ... or a JSON array; its length sets K when --num-classes is not given
    printf '["a","b","c","d","e","f","g","h","i","j","k","l"]\n' > "$D/names.json"
    run "$BIN/cifar-prep" --quiet --force --classes "$D/names.json" "$D"
    assert_success
    run meta_json "$D/cifar10.lmdb"
    assert_output --partial '"num_classes":12,'
    assert_output --partial '"classes":["a","b","c","d","e","f","g","h","i","j","k","l"]'
}

@test "class names that disagree, repeat, are too few, or break a line are refused" {
    with_classes "$D/annotations/cifar10_train.json" "$TEN"
    with_classes "$D/annotations/cifar10_test.json" '["x","c1","c2","c3","c4","c5","c6","c7","c8","c9"]'
    prep_fails "$D/annotations/cifar10_test.json: its \"classes\" differ from those of $D/annotations/cifar10_train.json" "$D"
    with_classes "$D/annotations/cifar10_test.json" '["a","b"]'
    prep_fails "$D/annotations/cifar10_test.json: categories\[[0-9]+\] = [0-9]+, but \"classes\" names 2 classes$" "$D"
    with_classes "$D/annotations/cifar10_test.json" '["a","a"]'
    prep_fails "$D/annotations/cifar10_test.json: \"classes\": class name \"a\" is given twice \(0 and 1\)$" "$D"
    with_classes "$D/annotations/cifar10_test.json" '["a\tb"]'
    prep_fails "$D/annotations/cifar10_test.json: \"classes\": class name 0 is not 1 to 63 characters" "$D"
    with_classes "$D/annotations/cifar10_test.json" "$TEN"
    printf 'a\nb\n' > "$D/two.txt"
    prep_fails "$D/annotations/cifar10_train.json: categories\[[0-9]+\] = [0-9]+ is out of range for 2 classes \($D/two.txt\)$" --classes "$D/two.txt" "$D"
    prep_fails "$D/annotations/cifar10_train.json: names 10 classes, but --num-classes is 11$" --num-classes 11 "$D"
    prep_fails "$D/missing.txt: cannot read the class names \(No such file or directory\)$" --classes "$D/missing.txt" "$D"
    printf 'a\n\nb\n' > "$D/blank.txt"
    prep_fails "$D/blank.txt: class name 1 is not 1 to 63 characters" --classes "$D/blank.txt" "$D"
}

@test "an existing OUT is kept without --force and replaced with it" {
    echo "precious" > "$D/cifar10.lmdb"
    run "$BIN/cifar-prep" --quiet "$D"
    assert_failure 1
    assert_output "cifar-prep: $D/cifar10.lmdb: already exists (use --force to replace it)"
    [ "$(cat "$D/cifar10.lmdb")" = precious ]
    run "$BIN/cifar-prep" --quiet --force "$D"
    assert_success
    [ "$(head -c 8 "$D/cifar10.lmdb")" != precious ]
    [ -z "$(find "$D" -name '*.tmp-*')" ]
}

@test "each record carries the CRC-32C of its label and pixels; a flipped byte shows" {
    need_mdb_dump
    run "$BIN/cifar-prep" --quiet "$D"
    assert_success
    run records "$D/cifar10.lmdb" train
    assert_success
    [ "${#lines[@]}" -eq 24 ]
    run records "$D/cifar10.lmdb" test
    assert_success
    [ "${#lines[@]}" -eq 8 ]
    # The check above can fail: the same dump with one pixel byte changed.
    mdb_dump -n -s test "$D/cifar10.lmdb" > "$BATS_TEST_TMPDIR/dump"
    "$PY" - "$BATS_TEST_TMPDIR/dump" <<'PY'
import sys
p = sys.argv[1]
lines = open(p).read().split('\n')
vals = [i for i, l in enumerate(lines) if l.startswith(' ')][1::2]
l = lines[vals[3]]
lines[vals[3]] = l[:40] + ('0' if l[40] != '0' else '1') + l[41:]
open(p, 'w').write('\n'.join(lines))
PY
    mdb_load -n -f "$BATS_TEST_TMPDIR/dump" -s test "$BATS_TEST_TMPDIR/bad.lmdb"
    run records "$BATS_TEST_TMPDIR/bad.lmdb" test
    assert_failure
    assert_output --partial "record 00000003: checksum mismatch"
}

@test "--force replaces OUT by rename: a reader of the old file keeps its bytes" {
    run "$BIN/cifar-prep" --quiet "$D"
    assert_success
    cp "$D/cifar10.lmdb" "$BATS_TEST_TMPDIR/old.lmdb"
    before=$(stat -c %i "$D/cifar10.lmdb")
    sleep 300 < "$D/cifar10.lmdb" 3>&- & # holds the old file open, as a running job's map does
    holder=$!
    "$BIN/cifar-synth" "$D" --train 24 --test 8 --size 8 --seed 99 >/dev/null
    run "$BIN/cifar-prep" --quiet --force "$D"
    assert_success
    [ "$(stat -c %i "$D/cifar10.lmdb")" != "$before" ]
    ! cmp -s "$D/cifar10.lmdb" "$BATS_TEST_TMPDIR/old.lmdb"
    cmp "/proc/$holder/fd/0" "$BATS_TEST_TMPDIR/old.lmdb"
    kill "$holder"
}

# ------------------------------------------------------------------ bad input

@test "missing annotation file" {
    rm "$D/annotations/cifar10_test.json"
    prep_fails "$D/annotations/cifar10_test.json: cannot read the annotation file \(No such file or directory\)$" "$D"
}

@test "unreadable annotation file" {
    rm "$D/annotations/cifar10_train.json"
    mkdir "$D/annotations/cifar10_train.json"
    prep_fails "$D/annotations/cifar10_train.json: cannot read the annotation file \(it is a folder\)$" "$D"
    if [ "$(id -u)" != 0 ]; then
        rmdir "$D/annotations/cifar10_train.json"
        cp "$BASE/annotations/cifar10_train.json" "$D/annotations/"
        chmod 000 "$D/annotations/cifar10_train.json"
        prep_fails "$D/annotations/cifar10_train.json: cannot read the annotation file \(Permission denied\)$" "$D"
    fi
}

@test "invalid JSON" {
    printf '{"images": ["a.png"], "categories": [1' > "$D/annotations/cifar10_train.json"
    prep_fails "$D/annotations/cifar10_train.json: invalid JSON near byte [0-9]+$" "$D"
}

@test "images and categories of different lengths" {
    printf '{"images": ["img_000000.png", "img_000001.png"], "categories": [1]}' > "$D/annotations/cifar10_train.json"
    prep_fails "$D/annotations/cifar10_train.json: \"images\" has 2 entries but \"categories\" has 1$" "$D"
}

@test "labels that are not non-negative integers" {
    for bad in -1 1.5 '"3"' null 3e10; do
        printf '{"images": ["img_000000.png", "img_000001.png"], "categories": [1, %s]}' "$bad" \
            > "$D/annotations/cifar10_train.json"
        prep_fails "$D/annotations/cifar10_train.json: categories\[1\] is not a non-negative integer label" "$D"
    done
}

@test "a label >= --num-classes" {
    printf '{"images": ["img_000000.png", "img_000001.png"], "categories": [1, 7]}' > "$D/annotations/cifar10_train.json"
    prep_fails "$D/annotations/cifar10_train.json: categories\[1\] = 7 is out of range for 5 classes" --num-classes 5 "$D"
}

@test "an empty split" {
    printf '{"images": [], "categories": []}' > "$D/annotations/cifar10_test.json"
    prep_fails "$D/annotations/cifar10_test.json: no images \(empty split\)$" "$D"
}

@test "a missing image" {
    rm -f "$D/train_cifar10/img_000005.png" "$D/train_cifar10/img_000005.jpg" # the one that exists
    prep_fails "$D/train_cifar10/img_000005.(png|jpg): cannot read the image \(No such file or directory\)$" "$D"
}

first_png() { ls "$D/train_cifar10/" | grep png | sed -n 3p; }
first_jpg() { ls "$D/train_cifar10/" | grep jpg | sed -n 2p; }

@test "a truncated PNG" {
    f="$D/train_cifar10/$(first_png)"
    head -c 60 "$BASE/train_cifar10/$(basename "$f")" > "$f"
    prep_fails "$f: truncated PNG \(the file ends early\)$" "$D"
}

@test "a corrupt PNG" {
    f="$D/train_cifar10/$(first_png)"
    size=$(stat -c %s "$f")
    printf '\x00\x01\x02\x03\x04\x05\x06\x07' | dd of="$f" bs=1 seek=$((size - 30)) conv=notrunc status=none
    prep_fails "$f: corrupt PNG \(.+\)$" "$D"
}

@test "a truncated JPEG" {
    [ -n "$(first_jpg)" ] # seed 5's data holds JPEGs (--jpeg-fraction 0.3)
    f="$D/train_cifar10/$(first_jpg)"
    head -c 300 "$BASE/train_cifar10/$(basename "$f")" > "$f"
    prep_fails "$f: (truncated|corrupt) JPEG \(.+\)$" "$D"
}

@test "a corrupt JPEG" {
    [ -n "$(first_jpg)" ]
    f="$D/train_cifar10/$(first_jpg)"
    # an unexpected restart marker 20 bytes into the entropy-coded scan
    "$PY" - "$f" <<'PY'
import sys
d = bytearray(open(sys.argv[1], 'rb').read())
i = d.find(b'\xff\xda') + 20
d[i:i + 2] = b'\xff\xd3'
open(sys.argv[1], 'wb').write(d)
PY
    prep_fails "$f: corrupt JPEG \(Corrupt JPEG data: .+\)$" "$D"
}

@test "a file that is neither PNG nor JPEG" {
    f="$D/test_cifar10/img_000003.png"
    [ -f "$f" ] || f=$(ls "$D"/test_cifar10/* | head -1)
    echo "GIF89a not really" > "$f"
    prep_fails "$f: not a PNG or JPEG image$" "$D"
}

@test "an image of another size" {
    "$BIN/cifar-synth" "$D/big" --train 2 --test 1 --size 9 --jpeg-fraction 0 >/dev/null
    f="$D/test_cifar10/$(ls "$D/test_cifar10" | head -2 | tail -1)"
    cp "$D/big/train_cifar10/img_000000.png" "$f"
    prep_fails "$f: image is 9x9x3 \(HxWxC\), the others are 8x8x3 \(as $D/train_cifar10/img_000000.(png|jpg)\)$" "$D"
}

@test "an image with another channel count" {
    "$BIN/cifar-synth" "$D/gray" --train 2 --test 1 --size 8 --channels 1 --jpeg-fraction 0 >/dev/null
    f="$D/train_cifar10/$(first_png)"
    cp "$D/gray/train_cifar10/img_000000.png" "$f"
    prep_fails "$f: image is 8x8x1 \(HxWxC\), the others are 8x8x3" "$D"
}

@test "dimensions over the side limit are refused before decoding" {
    f="$D/train_cifar10/$(first_png)"
    # A valid PNG header claiming 50000 x 50000 pixels, with a tiny IDAT.
    "$PY" - "$f" <<'PY'
import struct, sys, zlib
def chunk(t, b): return struct.pack('>I', len(b)) + t + b + struct.pack('>I', zlib.crc32(t + b))
open(sys.argv[1], 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 50000, 50000, 8, 2, 0, 0, 0))
                               + chunk(b'IDAT', zlib.compress(b'\0' * 1000)) + chunk(b'IEND', b''))
PY
    prep_fails "$f: image is 50000x50000, over the 4096-pixel side limit \(not decoded\)$" "$D"
}

@test "an unwritable output folder" {
    mkdir "$D/ro"
    if [ "$(id -u)" = 0 ]; then
        mount -t tmpfs -o ro,size=64k tmpfs "$D/ro" 2>/dev/null || skip "root without CAP_SYS_ADMIN (a container): cannot mount a read-only tmpfs"
    else
        chmod 555 "$D/ro"
    fi
    run "$BIN/cifar-prep" --quiet -o "$D/ro/out.lmdb" "$D"
    left=$(ls -A "$D/ro")   # before unmounting: the tmpfs is what must stay empty
    if [ "$(id -u)" = 0 ]; then umount "$D/ro"; fi
    assert_failure 1
    [ "${#lines[@]}" -eq 1 ]
    assert_output --regexp "^cifar-prep: $D/ro/out.lmdb: cannot create $D/ro/out.lmdb.tmp-[0-9]+: (Read-only file system|Permission denied)( \(.*\))?$"
    [ -z "$left" ]
}

@test "a full disk" {
    [ "$(id -u)" = 0 ] || skip "not root: mounting a tiny tmpfs needs root"
    mkdir "$D/full"
    mount -t tmpfs -o size=200k tmpfs "$D/full" 2>/dev/null || skip "root without CAP_SYS_ADMIN (a container): cannot mount a tmpfs"
    "$BIN/cifar-synth" "$D/many" --train 400 --test 20 --size 16 >/dev/null  # ~320 KB of pixels
    run "$BIN/cifar-prep" --quiet -o "$D/full/out.lmdb" "$D/many"
    left=$(ls -A "$D/full")
    umount "$D/full"
    assert_failure 1
    [ "${#lines[@]}" -eq 1 ]
    assert_output --regexp "^cifar-prep: $D/full/out.lmdb: cannot (write|sync) $D/full/out.lmdb.tmp-[0-9]+ \(No space left on device\)$"
    [ -z "$left" ]
}

@test "SIGINT leaves nothing behind" {
    "$BIN/cifar-synth" "$D/slow" --train 600 --test 10 --size 96 --jpeg-fraction 0 >/dev/null
    "$BIN/cifar-prep" --threads 1 "$D/slow" >/dev/null 2>"$D/err" &
    pid=$!
    for _ in $(seq 1 500); do
        [ -n "$(find "$D/slow" -maxdepth 1 -name 'cifar10.lmdb.tmp-*')" ] && break
        sleep 0.01
    done
    [ -n "$(find "$D/slow" -maxdepth 1 -name 'cifar10.lmdb.tmp-*')" ] || { echo "no temporary file seen"; false; }
    kill -INT "$pid"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" -eq 130 ] || { echo "exit status $rc"; cat "$D/err"; false; }
    grep -q "interrupted; removed the partial output" "$D/err"
    no_leftovers "$D/slow"
}

# ------------------------------------------------------------------ trust boundaries (issue 20)

# Rewrite an annotation file with a Python statement over `a` (the document).
ann_edit() { # file python-statement
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
path, stmt = sys.argv[1:3]
a = json.load(open(path))
exec(stmt)
open(path, 'w').write(json.dumps(a))
PYEOF
}

@test "-f with a FIFO, a symlink or a folder as OUT: refused, the node left as it was" {
    mkfifo "$BATS_TEST_TMPDIR/fifo"
    run timeout -k 2 30 "$BIN/cifar-prep" --quiet -f -o "$BATS_TEST_TMPDIR/fifo" "$D"
    assert_failure 1
    assert_output "cifar-prep: $BATS_TEST_TMPDIR/fifo: is a FIFO, not a regular file: --force replaces only a regular file (a previous dataset) ---> HINT: give -o a file name"
    [ -p "$BATS_TEST_TMPDIR/fifo" ]
    echo precious > "$BATS_TEST_TMPDIR/victim"
    ln -s "$BATS_TEST_TMPDIR/victim" "$BATS_TEST_TMPDIR/link.lmdb"
    prep_fails ".*/link.lmdb: is a symlink, not a regular file: --force" -f -o "$BATS_TEST_TMPDIR/link.lmdb" "$D"
    [ -L "$BATS_TEST_TMPDIR/link.lmdb" ]
    [ "$(cat "$BATS_TEST_TMPDIR/victim")" = precious ]
    # A previous dataset (a regular file) is still replaced.
    run "$BIN/cifar-prep" --quiet -o "$BATS_TEST_TMPDIR/ok.lmdb" "$D"
    assert_success
    run "$BIN/cifar-prep" --quiet -f -o "$BATS_TEST_TMPDIR/ok.lmdb" "$D"
    assert_success
    [ -f "$BATS_TEST_TMPDIR/ok.lmdb" ]
}

@test "-f with a device as OUT (root: /dev/null's twin): refused, still a device" {
    [ "$(id -u)" -eq 0 ] || skip_because "needs root to make a device node"
    mknod "$BATS_TEST_TMPDIR/null" c 1 3
    prep_fails ".*/null: is a device, not a regular file" -f -o "$BATS_TEST_TMPDIR/null" "$D"
    [ -c "$BATS_TEST_TMPDIR/null" ]
}

@test "-f -o naming an input (annotation file, image) is refused before anything is read or written" {
    ann="$D/annotations/cifar10_train.json"
    cp "$ann" "$BATS_TEST_TMPDIR/ann.before"
    prep_fails "$ann: is an input of this run \($ann\): refusing to overwrite it" -f -o "$ann" "$D"
    cmp "$ann" "$BATS_TEST_TMPDIR/ann.before"
    img="$D/train_cifar10/$(ls "$D/train_cifar10" | sed -n 3p)"
    cp "$img" "$BATS_TEST_TMPDIR/img.before"
    run "$BIN/cifar-prep" --quiet -f -o "$img" "$D"
    assert_failure 1
    assert_output "cifar-prep: $img: is an input of this run ($img): refusing to overwrite it ---> HINT: give -o another file name"
    cmp "$img" "$BATS_TEST_TMPDIR/img.before"
    # Through another name of the same file (a hard link) too.
    ln "$ann" "$BATS_TEST_TMPDIR/same.json"
    run "$BIN/cifar-prep" --quiet -f -o "$BATS_TEST_TMPDIR/same.json" "$D"
    assert_failure 1
    assert_output --partial "is an input of this run ($ann)"
}

@test "annotation names: '..' and absolute paths refused; a symlink out of the image folder only with --allow-outside-symlinks" {
    ann="$D/annotations/cifar10_train.json"
    cp "$D/train_cifar10/$(ls "$D/train_cifar10" | grep png | head -1)" "$BATS_TEST_TMPDIR/outside.png"
    cp "$ann" "$BATS_TEST_TMPDIR/ann.orig"
    ann_edit "$ann" "a['images'][2] = '../../outside.png'"
    prep_fails "$ann: images\[2\] \"../../outside.png\" has a \"..\" component: names are paths inside the image folder$" "$D"
    ann_edit "$ann" "a['images'][2] = 'sub/../../x.png'"
    prep_fails "$ann: images\[2\] \"sub/../../x.png\" has a \"..\" component" "$D"
    ann_edit "$ann" "a['images'][2] = '$BATS_TEST_TMPDIR/outside.png'"
    prep_fails "$ann: images\[2\] \".*/outside.png\" is an absolute path" "$D"
    # A symlink in the image folder that leads out of it.
    cp "$BATS_TEST_TMPDIR/ann.orig" "$ann"
    name=$(ls "$D/train_cifar10" | grep png | sed -n 2p)
    rm "$D/train_cifar10/$name"
    ln -s "$BATS_TEST_TMPDIR/outside.png" "$D/train_cifar10/$name"
    prep_fails "$D/train_cifar10/$name: the name leads outside the image folder \(through a symlink\): refused ---> HINT: --allow-outside-symlinks" "$D"
    run "$BIN/cifar-prep" --quiet --allow-outside-symlinks "$D"
    assert_success
    # One that stays inside is read as ever.
    rm "$D/train_cifar10/$name" "$D/cifar10.lmdb"
    cp "$BATS_TEST_TMPDIR/outside.png" "$D/train_cifar10/real.png"
    ln -s real.png "$D/train_cifar10/$name"
    run "$BIN/cifar-prep" --quiet "$D"
    assert_success
}

@test "a FIFO as an image or as an annotation file is refused at once, not waited on" {
    name=$(ls "$D/train_cifar10" | sed -n 4p)
    rm "$D/train_cifar10/$name"
    mkfifo "$D/train_cifar10/$name"
    run timeout -k 2 30 "$BIN/cifar-prep" --quiet "$D"
    assert_failure 1
    assert_output "cifar-prep: $D/train_cifar10/$name: not a regular file"
    # The first image (read alone, for the shape) too.
    rm "$D/train_cifar10/$name"
    cp -r "$BASE/train_cifar10/$name" "$D/train_cifar10/$name"
    first=$(ls "$D/train_cifar10" | head -1)
    rm "$D/train_cifar10/$first"
    mkfifo "$D/train_cifar10/$first"
    run timeout -k 2 30 "$BIN/cifar-prep" --quiet "$D"
    assert_failure 1
    assert_output "cifar-prep: $D/train_cifar10/$first: not a regular file"
    rm "$D/annotations/cifar10_test.json"
    mkfifo "$D/annotations/cifar10_test.json"
    run timeout -k 2 30 "$BIN/cifar-prep" --quiet "$D"
    assert_failure 1
    assert_output "cifar-prep: $D/annotations/cifar10_test.json: cannot read the annotation file (it is a FIFO, not a regular file)"
}

@test "a label above the class cap without --num-classes names the cap, not --num-classes" {
    ann="$D/annotations/cifar10_train.json"
    ann_edit "$ann" "a['categories'][1] = 1000000"
    prep_fails "$ann: categories\[1\] = 1000000 is above the largest label cifar-prep accepts, 999999 \(at most 1000000 classes\)$" "$D"
    refute_output --partial "--num-classes"
}

@test "annotation JSON: the nesting limit, trailing data, a duplicate key and a NUL in a name are named" {
    ann="$D/annotations/cifar10_train.json"
    "$PY" -c "import sys; sys.stdout.write('[' * 200000 + ']' * 200000)" > "$ann"
    prep_fails "$ann: JSON nested deeper than 1000 levels near byte [0-9]+ \(the parser's limit" "$D"
    cp "$BASE/annotations/cifar10_train.json" "$ann"
    printf ' {"more": 1}' >> "$ann"
    prep_fails "$ann: unexpected data after the JSON document at byte [0-9]+$" "$D"
    cp "$BASE/annotations/cifar10_train.json" "$ann"
    "$PY" - "$ann" <<'PYEOF'
import sys
p = sys.argv[1]
t = open(p).read().strip()
open(p, 'w').write(t[:-1] + ', "images": ["x.png"]}')
PYEOF
    prep_fails "$ann: the key \"images\" appears more than once$" "$D"
    cp "$BASE/annotations/cifar10_train.json" "$ann"
    sed -i 's/"img_000001\.\(png\|jpg\)"/"img_000001.\1\\u0000.evil"/' "$ann"
    grep -q 'u0000' "$ann"
    prep_fails "$ann: a NUL character \(\\\\u0000\) in a string at byte [0-9]+: names cannot hold one$" "$D"
}

# A 2x2 PNG (color type 6: RGBA, or 2: RGB) made with zlib alone.
png_rgba() { # out color-type
    "$PY" - "$1" "$2" <<'PYEOF'
import struct, sys, zlib
out, ctype = sys.argv[1], int(sys.argv[2])
ch = 4 if ctype == 6 else 3
raw = b''.join(b'\0' + bytes([10 * (x + y + c) for x in range(8) for c in range(ch)]) for y in range(8))
def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
open(out, 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 8, 8, 8, ctype, 0, 0, 0))
                      + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
PYEOF
}

@test "RGBA PNGs: the dropped alpha channel is said once" {
    for i in 3 5 6; do
        name=$(ls "$D/train_cifar10" | sed -n ${i}p)
        png_rgba "$D/train_cifar10/$name" 6
    done
    run "$BIN/cifar-prep" --quiet --threads 1 "$D"
    assert_success
    [ "$(grep -c 'has an alpha channel' <<< "$output")" -eq 1 ] || { echo "$output"; false; }
    assert_output --partial "has an alpha channel (transparency), dropped: the dataset keeps gray or RGB pixels only"
    # Without alpha, nothing is said.
    rm "$D/cifar10.lmdb"
    for i in 3 5 6; do
        name=$(ls "$D/train_cifar10" | sed -n ${i}p)
        png_rgba "$D/train_cifar10/$name" 2
    done
    run "$BIN/cifar-prep" --quiet "$D"
    assert_success
    refute_output --partial "alpha"
}

@test "a large annotation file (1M entries) is parsed within twice its size of memory" {
    "$PY" - "$D" <<'PYEOF'
import json, sys
d = sys.argv[1]
n = 1000000
json.dump({"images": ["img_%07d.png" % i for i in range(n)], "categories": [i % 10 for i in range(n)]},
          open(d + '/annotations/cifar10_train.json', 'w'))
PYEOF
    size_kb=$(( $(stat -c %s "$D/annotations/cifar10_train.json") / 1024 ))
    # Peak resident memory (kB) of a command, from getrusage (no sampling).
    peak_kb() { "$PY" -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"; }
    base=$(peak_kb "$BIN/cifar-prep" --help)
    # It stops at the first image (there are none of these names): the parse is what ran.
    run "$BIN/cifar-prep" --quiet "$D"
    assert_failure 1
    assert_output --partial "img_0000000.png: cannot read the image"
    peak=$(peak_kb "$BIN/cifar-prep" --quiet "$D")
    echo "file ${size_kb} kB, peak ${peak} kB, at --help ${base} kB"
    [ $(( peak - base )) -le $(( 2 * size_kb )) ]
}
