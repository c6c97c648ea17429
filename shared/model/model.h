/* model.h: the seed's ResNet (ResNetBase + Linear), its parameter layout and
 * its CPU forward/backward.
 *
 *   nn.Sequential(ResNetBase(n_blocks, n_channels, bottlenecks, img_channels,
 *                            first_kernel_size), nn.Linear(n_channels[-1], K))
 *
 * Details kept from the seed: every conv has a bias; the stem conv has stride 2
 * and is followed by BN with no ReLU; only the very first block has stride 2
 * (on its 3x3 conv); a 1x1 conv+BN projection shortcut where the stride or the
 * channel count changes; global mean pool; linear head. bottlenecks absent gives
 * basic (3x3, 3x3) blocks.
 *
 * All trainable parameters live in ONE flat float buffer (params), in the order
 * of PyTorch's state_dict(); BN running statistics live in a second flat buffer
 * (buffers). Layers hold offsets into them. The tensor table (model->tensors)
 * maps every state_dict key to its place, which is what snapshots are made of. */
#ifndef CIFAR_MODEL_H
#define CIFAR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAX_STAGES 8
#define MODEL_BN_EPS 1e-5f
#define MODEL_BN_MOMENTUM 0.1f

typedef struct {
    int n_stages;
    int n_blocks[MODEL_MAX_STAGES];
    int n_channels[MODEL_MAX_STAGES];
    int bottlenecks[MODEL_MAX_STAGES]; /* all 0 when use_bottleneck == 0 */
    int use_bottleneck;
    int first_kernel_size;
    int stem_stride;       /* 2 in the seed */
    int first_block_stride;/* 2 in the seed */
    /* From the dataset, not the JSON file: */
    int img_channels, img_height, img_width, num_classes;
} ModelConfig;

/* The seed preset: n_channels [16,32,64], bottlenecks [8,16,16], n_blocks [6,6,6],
 * first kernel 3. Image shape and classes must still be set. */
void model_config_seed(ModelConfig *cfg);
/* Parse the seed's Config fields from JSON text ({"n_channels":[..],"bottlenecks":[..]|null,
 * "n_blocks":[..],"first_kernel_size":k, optional "stem_stride","first_block_stride"}).
 * Fields left out keep their values in *cfg; an unknown key is an error. Returns 0, or -1
 * with a reason in err (an unknown key: named, with the known ones). */
int model_config_parse_json(const char *json, ModelConfig *cfg, char *err, size_t errlen);
/* Canonical JSON of the whole config (malloc'd), stored in snapshots. */
char *model_config_to_json(const ModelConfig *cfg);
/* 1 when a and b describe the same network. */
int model_config_equal(const ModelConfig *a, const ModelConfig *b);

typedef struct {
    ConvSpec spec;
    size_t weight, bias; /* offsets into params */
} ConvLayer;

typedef struct {
    int c;
    size_t gamma, beta;            /* offsets into params */
    size_t running_mean, running_var; /* offsets into buffers */
} BNLayer;

typedef struct {
    int in_h, in_w, out_h, out_w; /* spatial size entering / leaving the block */
    int cin, cmid, cout;
    int bottleneck;               /* 1: conv1 1x1, conv2 3x3 (stride), conv3 1x1; 0: two 3x3 */
    ConvLayer conv1, conv2, conv3;
    BNLayer bn1, bn2, bn3;
    int has_projection;
    ConvLayer proj_conv;
    BNLayer proj_bn;
} Block;

typedef enum { TENSOR_PARAM, TENSOR_BUFFER, TENSOR_COUNTER } TensorKind;

/* One state_dict entry. TENSOR_COUNTER is num_batches_tracked (I64, shape []),
 * whose value is the model's step counter, the same for every BN layer. */
typedef struct {
    char name[96];
    TensorKind kind;
    int ndim;
    int64_t shape[4];
    size_t offset; /* into params or buffers (floats) */
    size_t numel;
    int decay;     /* weight decay applies (all params do, as in the seed's optimizer) */
} TensorInfo;

typedef struct {
    ModelConfig cfg;
    ConvLayer stem_conv;
    BNLayer stem_bn;
    int stem_h, stem_w; /* spatial size after the stem */
    Block *blocks;
    int n_blocks;
    int fc_in, fc_out;
    size_t fc_weight, fc_bias;
    size_t num_params;  /* floats in the params buffer */
    size_t num_buffers; /* floats in the buffers buffer */
    TensorInfo *tensors;
    int n_tensors;
} Model;

/* The main path of a block: conv i (0-based; 2 or 3 of them), its BN, and the
 * spatial size entering conv i. */
static inline int model_block_n_convs(const Block *b) { return b->bottleneck ? 3 : 2; }
static inline const ConvLayer *model_block_conv(const Block *b, int i) {
    return i == 0 ? &b->conv1 : i == 1 ? &b->conv2 : &b->conv3;
}
static inline const BNLayer *model_block_bn(const Block *b, int i) {
    return i == 0 ? &b->bn1 : i == 1 ? &b->bn2 : &b->bn3;
}
static inline void model_block_conv_input(const Block *b, int i, int *h, int *w) {
    *h = b->in_h;
    *w = b->in_w;
    for (int j = 0; j < i; j++) {
        const ConvSpec *s = &model_block_conv(b, j)->spec;
        *h = conv_out_size(*h, s->k, s->stride, s->pad);
        *w = conv_out_size(*w, s->k, s->stride, s->pad);
    }
}

/* Lay out the network for cfg. Returns 0, or -1 with a reason (e.g. an image too
 * small for the strides) in err. */
int model_build(Model *m, const ModelConfig *cfg, char *err, size_t errlen);
void model_free(Model *m);

/* PyTorch's default initialisation, from counter-based randomness keyed by seed:
 * conv/linear weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform
 * with a=sqrt(5)); BN gamma 1, beta 0, running mean 0, running var 1. */
void model_init(const Model *m, float *params, float *buffers, uint64_t seed);

/* Activations and scratch for batches of up to max_batch on the CPU. */
typedef struct ModelRun ModelRun;
ModelRun *model_run_create(const Model *m, int max_batch);
/* Forward in inference mode only (model_forward_eval): the activations share a few
 * buffers of the largest layer's size instead of one each (net_impl.h). */
ModelRun *model_run_create_inference(const Model *m, int max_batch);
void model_run_free(ModelRun *run);

/* One training forward + backward on x[n,H,W,C] (normalised NHWC floats):
 * BN in training mode (running statistics in `buffers` updated), gradients of the
 * mean loss OVERWRITTEN into grads (num_params floats). Returns the mean loss;
 * *correct (may be NULL) gets the number of arg-max hits. */
float model_forward_backward(const Model *m, ModelRun *run, const float *params,
                             float *buffers, const float *x, const int32_t *labels, int n,
                             float label_smoothing, float *grads, int *correct);

/* The logits[n, num_classes] of the latest forward on this run (training or eval);
 * valid until the next call on the run. */
const float *model_run_logits(const ModelRun *run);

/* Inference forward (BN with running statistics): logits[n, num_classes]. */
void model_forward_eval(const Model *m, ModelRun *run, const float *params,
                        const float *buffers, const float *x, int n, float *logits);

/* Multiply-accumulates of one forward pass for one image (for FLOP figures). */
double model_forward_macs(const Model *m);

#ifdef __cplusplus
}
#endif
#endif
