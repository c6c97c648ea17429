/* engine.c: what every engine shares (engine.h). */
#include <string.h>

#include "model/ema.h"
#include "model/engine.h"

float engine_ema_decay(const Engine *e, int64_t step) {
    return ema_decay_at(e->cfg.ema_decay, step, e->cfg.ema_warmup);
}

AugmentSpec engine_augment_spec(const Engine *e, int64_t epoch, int train) {
    const ModelConfig *mc = &e->cfg.model->cfg;
    AugmentSpec s;
    memset(&s, 0, sizeof s);
    s.h = mc->img_height;
    s.w = mc->img_width;
    s.c = mc->img_channels;
    s.pad = train ? e->cfg.pad : 0;
    s.flip = train && e->cfg.flip;
    s.cutout = train ? e->cfg.cutout : 0;
    s.seed = e->cfg.seed;
    s.epoch = epoch;
    memcpy(s.mean, e->cfg.mean, sizeof s.mean);
    memcpy(s.std, e->cfg.std, sizeof s.std);
    return s;
}

void engine_prefetch(Engine *e, const int64_t *idx, int n, int train) {
    if (e->ops->prefetch) e->ops->prefetch(e, idx, n, train);
}

int engine_batch_in_order(int64_t *idx, int64_t first, int batch, int64_t n) {
    int b = (int)(n - first < batch ? n - first : batch);
    for (int i = 0; i < b; i++) idx[i] = first + i;
    return b;
}
