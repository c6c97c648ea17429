/* augment.c: see augment.h. The GPU twin is augment_cuda.cu. */
#include "data/augment.h"

#include "core/rng.h"

/* One output pixel row: source row sy of the record (or zeros outside), mirrored
 * when flipped, then normalised; 0 inside the cutout square. */
static void augment_one(const AugmentSpec *s, const uint8_t *rec, int64_t sample, float *out) {
    const int h = s->h, w = s->w, c = s->c;
    const AugmentDraw d = augment_draw(s, s->epoch, sample);
    CutoutDraw cut = {0, 0};
    if (s->cutout > 0) cut = rng_cutout(s->seed, (uint64_t)s->epoch, (uint64_t)sample, h, w);
    float scale[4], shift[4];
    for (int ch = 0; ch < c; ch++) {
        scale[ch] = 1.0f / (255.0f * s->std[ch]);
        shift[ch] = -s->mean[ch] / s->std[ch];
    }
    for (int y = 0; y < h; y++) {
        int sy = y + d.dy - s->pad;
        for (int x = 0; x < w; x++) {
            int xx = d.flip ? w - 1 - x : x; /* flip after cropping, as torchvision */
            int sx = xx + d.dx - s->pad;
            float *o = out + ((int64_t)y * w + x) * c;
            if (augment_cut(s, cut, y, x)) {
                for (int ch = 0; ch < c; ch++) o[ch] = 0.0f;
            } else if (sy < 0 || sy >= h || sx < 0 || sx >= w) {
                for (int ch = 0; ch < c; ch++) o[ch] = shift[ch];
            } else {
                const uint8_t *p = rec + ((int64_t)sy * w + sx) * c;
                for (int ch = 0; ch < c; ch++) o[ch] = (float)p[ch] * scale[ch] + shift[ch];
            }
        }
    }
}

void augment_batch(const AugmentSpec *spec, const uint8_t *pixels, const int32_t *labels,
                   const int64_t *idx, int n, float *out, int32_t *out_labels) {
    const int64_t rec_bytes = (int64_t)spec->h * spec->w * spec->c;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        augment_one(spec, pixels + idx[i] * rec_bytes, idx[i], out + (int64_t)i * rec_bytes);
        out_labels[i] = labels[idx[i]];
    }
}

void augment_split(const AugmentSpec *spec, const HostSplit *split, const int64_t *idx, int n,
                   float *out, int32_t *out_labels) {
    if (!split->records) {
        augment_batch(spec, split->pixels, split->labels, idx, n, out, out_labels);
        return;
    }
    const int64_t rec_bytes = (int64_t)spec->h * spec->w * spec->c;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        augment_one(spec, split->records[idx[i]], idx[i], out + (int64_t)i * rec_bytes);
        out_labels[i] = split->labels[idx[i]];
    }
}
