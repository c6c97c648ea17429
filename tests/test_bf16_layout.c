/* test_bf16_layout.c: the bf16 shadows' offset table (shared/backend-cuda/bf16_layout.h),
 * on any machine: for the seed model and a small one, every conv weight (and only
 * those) has a segment, each starts on a 128-byte boundary of the shadow (where
 * the conv weights' own fp32 offsets, doubled, are not all 128-byte aligned: the
 * old layout at the fp32 indices was 8-byte aligned), no two overlap, the shadow
 * wastes under 128 bytes per tensor, and the lookup maps every element of a conv
 * weight to its place and anything else (a bias, a BN weight) to none. */
#include <stdlib.h>
#include <string.h>

#include "backend-cuda/bf16_layout.h"
#include "core/check.h"
#include "model/model.h"
#include "unit.h"

static void check_model(const char *name, const ModelConfig *cfg) {
    Model m;
    char err[256] = "";
    EXPECT(model_build(&m, cfg, err, sizeof err) == 0, "%s: %s", name, err);
    int n = bf16_layout_segments(&m, NULL), convs = 0, unaligned_src = 0;
    for (int t = 0; t < m.n_tensors; t++) convs += m.tensors[t].kind == TENSOR_PARAM && m.tensors[t].ndim == 4;
    EXPECT(n == convs && n > 0, "%s: %d segments for %d conv weights", name, n, convs);
    Bf16Segment *seg = xcalloc((size_t)n, sizeof *seg);
    bf16_layout_segments(&m, seg);
    size_t total = bf16_layout_place(seg, n), sum = 0;
    for (int i = 0; i < n; i++) {
        sum += seg[i].count;
        unaligned_src += (seg[i].src * 2) % BF16_LAYOUT_ALIGN_BYTES != 0;
        EXPECT((seg[i].dst * sizeof(uint16_t)) % 128 == 0, "%s: conv weight %d at shadow byte %zu, not 128-aligned",
               name, i, seg[i].dst * sizeof(uint16_t));
        if (i) {
            EXPECT(seg[i].src >= seg[i - 1].src + seg[i - 1].count, "%s: segments %d and %d overlap in the params",
                   name, i - 1, i);
            EXPECT(seg[i].dst >= seg[i - 1].dst + seg[i - 1].count, "%s: segments %d and %d overlap in the shadow",
                   name, i - 1, i);
        }
        EXPECT(seg[i].dst + seg[i].count <= total, "%s: segment %d ends past the shadow", name, i);
        const size_t probe[3] = {seg[i].src, seg[i].src + seg[i].count / 2, seg[i].src + seg[i].count - 1};
        for (int k = 0; k < 3; k++)
            EXPECT(bf16_layout_find(seg, n, probe[k]) == &seg[i], "%s: flat index %zu not found in segment %d",
                   name, probe[k], i);
    }
    EXPECT(total % BF16_LAYOUT_ALIGN_ELEMS == 0 && total >= sum && total < sum + (size_t)n * BF16_LAYOUT_ALIGN_ELEMS,
           "%s: shadow of %zu bf16s for %zu weights in %d tensors", name, total, sum, n);
    EXPECT(unaligned_src > 0, "%s: every conv weight's fp32 offset is 64-float aligned: the test shows nothing", name);
    /* a bias and a BN weight are not conv weights */
    int others = 0;
    for (int t = 0; t < m.n_tensors; t++) {
        const TensorInfo *ti = &m.tensors[t];
        if (ti->kind != TENSOR_PARAM || ti->ndim == 4) continue;
        others++;
        EXPECT(bf16_layout_find(seg, n, ti->offset) == NULL, "%s: %s found in the conv weights' table", name,
               ti->name);
    }
    EXPECT(others > 0, "%s: no other params to look up", name);
    printf("%s %s: %d conv weights (%d of them at fp32 offsets that are not 128-byte aligned as bf16), shadow %zu "
           "bf16s for %zu\n",
           g_failures ? "FAIL" : "ok  ", name, n, unaligned_src, total, sum);
    free(seg);
    model_free(&m);
}

int main(void) {
    log_set_program("test_bf16_layout");
    ModelConfig cfg;
    model_config_seed(&cfg);
    cfg.img_channels = 3;
    cfg.img_height = cfg.img_width = 32;
    cfg.num_classes = 10;
    check_model("seed model", &cfg);
    /* basic blocks of odd widths: 3x3 weights of 7*3*9 = 189, 7*7*9 = 441 floats */
    char err[256] = "";
    EXPECT(model_config_parse_json("{\"n_channels\":[7,12],\"bottlenecks\":null,\"n_blocks\":[2,1],"
                                   "\"first_kernel_size\":3}",
                                   &cfg, err, sizeof err) == 0,
           "%s", err);
    cfg.img_channels = 3;
    cfg.img_height = cfg.img_width = 12;
    cfg.num_classes = 5;
    check_model("basic blocks [7, 12]", &cfg);
    return unit_report("test_bf16_layout");
}
