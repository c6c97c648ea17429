/* op_cases_run.h: how op_cases.h's cases run on one op table, written once over the
 * table's scalar type. No include guard: op_cases.h includes it once per instance,
 * after defining
 *   OPC_REAL      float or double (the table's NET_REAL)
 *   OPC_T(name)   the instance's name of `name` (name, or name##D)
 * Host inputs and outputs are double (OpcRun); a case's inputs are uploaded in the
 * table's type and its outputs downloaded back to double. */

/* A device: its op table and context, host <-> device copies. */
typedef struct {
    const char *name;
    const struct OPC_T(NetOps) *ops;
    void *ctx;
    void (*upload)(void *ctx, void *dev, const void *host, size_t bytes);
    void (*download)(void *ctx, void *host, const void *dev, size_t bytes);
} OPC_T(OpBackend);

/* Device copy of host input i (the backend's memory and type). */
static OPC_REAL *OPC_T(opc_dev_in)(const OPC_T(OpBackend) *b, const OpcRun *r, int i) {
    size_t n = r->in_n[i];
    OPC_REAL *h = xmalloc((n ? n : 1) * sizeof(OPC_REAL));
    for (size_t j = 0; j < n; j++) h[j] = (OPC_REAL)r->in[i][j];
    OPC_REAL *d = b->ops->alloc(b->ctx, (n ? n : 1) * sizeof(OPC_REAL));
    b->upload(b->ctx, d, h, n * sizeof(OPC_REAL));
    free(h);
    return d;
}

static OPC_REAL *OPC_T(opc_dev_zero)(const OPC_T(OpBackend) *b, size_t n) {
    OPC_REAL *h = xcalloc(n ? n : 1, sizeof(OPC_REAL));
    OPC_REAL *d = b->ops->alloc(b->ctx, (n ? n : 1) * sizeof(OPC_REAL));
    b->upload(b->ctx, d, h, n * sizeof(OPC_REAL));
    free(h);
    return d;
}

/* Download device tensor d (n values) as output `name`, then free it. */
static void OPC_T(opc_take)(const OPC_T(OpBackend) *b, OpcRun *r, const char *name, OPC_REAL *d,
                            size_t n) {
    OPC_REAL *h = xmalloc((n ? n : 1) * sizeof(OPC_REAL));
    b->download(b->ctx, h, d, n * sizeof(OPC_REAL));
    b->ops->release(b->ctx, d);
    double *out = xmalloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) out[i] = (double)h[i];
    free(h);
    r->out[r->n_out] = out;
    r->out_n[r->n_out] = n;
    r->out_name[r->n_out++] = name;
}

static void OPC_T(opc_run_conv)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    const ConvSpec *s = &c->cs;
    void *plan = b->ops->conv_plan(b->ctx, s, c->n, c->hw, c->k, 1, 1);
    size_t wn = r->in_n[1], ws_bytes = b->ops->conv_workspace_bytes(b->ctx, plan);
    void *ws = b->ops->alloc(b->ctx, ws_bytes ? ws_bytes : 1);
    OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *wk = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *bias = OPC_T(opc_dev_in)(b, r, 2), *dy = OPC_T(opc_dev_in)(b, r, 3);
    OPC_REAL *w = OPC_T(opc_dev_zero)(b, wn), *dwd = OPC_T(opc_dev_zero)(b, wn);
    OPC_REAL *y = OPC_T(opc_dev_zero)(b, r->in_n[3]), *dx = OPC_T(opc_dev_zero)(b, r->in_n[0]);
    OPC_REAL *dw = OPC_T(opc_dev_zero)(b, wn), *db = OPC_T(opc_dev_zero)(b, (size_t)s->cout);
    b->ops->conv_weight_import(b->ctx, plan, wk, w);
    b->ops->conv_forward(b->ctx, plan, c->n, x, w, bias, y, ws, ws_bytes);
    b->ops->conv_backward(b->ctx, plan, c->n, x, w, dy, dx, dwd, db, ws, ws_bytes);
    b->ops->conv_weight_export(b->ctx, plan, dwd, dw);
    OPC_T(opc_take)(b, r, "y", y, r->in_n[3]);
    OPC_T(opc_take)(b, r, "dx", dx, r->in_n[0]);
    OPC_T(opc_take)(b, r, "dweight", dw, wn);
    OPC_T(opc_take)(b, r, "dbias", db, (size_t)s->cout);
    OPC_REAL *dev[] = {x, wk, bias, dy, w, dwd};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) b->ops->release(b->ctx, dev[i]);
    b->ops->release(b->ctx, ws);
    b->ops->conv_plan_free(b->ctx, plan);
}

/* The batch norm a conv -> BN case runs after the conv: c->c picks the executor's
 * pairing (opc_cases): 0 the inner convs (BN+ReLU), 1 the stem and the projections
 * (BN alone), 2 a block's last conv (BN + the residual z + ReLU); inference: bn eval. */
static NetBnForwardKind OPC_T(opc_conv_bn_kind)(const OpCase *c) {
    if (c->op == OPC_CONV_BN_EVAL) return NET_BN_EVAL;
    return c->c == 1 ? NET_BN_TRAIN : c->c == 2 ? NET_BN_TRAIN_ADD_RELU : NET_BN_TRAIN_RELU;
}

/* The training backward of a conv -> BN case from dy: the BN backward of its kind then
 * the conv backward into dx, as one call (the table's bn_conv_backward, or its
 * composition). The residual form (c->c 2) goes as the executor's block backward
 * does: through the table's folded form where it has one (keep: the masked dy left
 * in dy, the conv's dx ADDED to dx), else the plain path's ReLU pass on dy, BN
 * backward, conv backward and add; the same results either way. */
static void OPC_T(opc_conv_bn_backward)(const OpCase *c, const OPC_T(OpBackend) *b, void *plan,
                                        struct OPC_T(NetBnBackward) *bn, const OPC_REAL *x,
                                        const OPC_REAL *w, OPC_REAL *dx, OPC_REAL *dwd,
                                        OPC_REAL *dbias, void *ws, size_t ws_bytes, size_t nx) {
    const struct OPC_T(NetOps) *o = b->ops;
    bn->kind = c->c == 1 ? NET_BN_BACKWARD : NET_BN_RELU_BACKWARD;
    if (c->c != 2) {
        OPC_T(net_ops_bn_conv_backward)(o, b->ctx, bn, plan, c->n, x, w, dx, dwd, dbias, ws, ws_bytes, 0);
    } else if (o->bn_relu_backward_keep) {
        bn->kind = NET_BN_RELU_BACKWARD_KEEP;
        OPC_T(net_ops_bn_conv_backward)(o, b->ctx, bn, plan, c->n, x, w, dx, dwd, dbias, ws, ws_bytes, 1);
    } else {
        OPC_REAL *tmp = OPC_T(opc_dev_zero)(b, nx);
        size_t ny = (size_t)c->n * bn->hw * bn->c;
        o->relu_backward(b->ctx, ny, bn->y, bn->dy, bn->dy);
        bn->kind = NET_BN_BACKWARD;
        OPC_T(net_ops_bn_conv_backward)(o, b->ctx, bn, plan, c->n, x, w, tmp, dwd, dbias, ws, ws_bytes, 0);
        o->add(b->ctx, nx, dx, tmp, dx);
        o->release(b->ctx, tmp);
    }
}

/* A conv and the BN that reads its output, forward (training: and backward), as the
 * executor pairs them: through the table's fused entries (conv_bn_forward,
 * bn_conv_backward) where it has them, else their composition from the plain ones
 * (net_ops.h), so that a table's fused entries are checked against the CPU's
 * composition. */
static void OPC_T(opc_run_conv_bn)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    const ConvSpec *s = &c->cs;
    const struct OPC_T(NetOps) *o = b->ops;
    int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
    size_t nx = r->in_n[0], wn = r->in_n[1], ny = r->in_n[3], nc = (size_t)s->cout;
    int train = c->op == OPC_CONV_BN, residual = train && c->c == 2;
    void *plan = o->conv_plan(b->ctx, s, c->n, c->hw, c->k, train, train);
    size_t ws_bytes = o->conv_workspace_bytes(b->ctx, plan);
    void *ws = o->alloc(b->ctx, ws_bytes ? ws_bytes : 1);
    OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *wk = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *bias = OPC_T(opc_dev_in)(b, r, 2), *dy = OPC_T(opc_dev_in)(b, r, 3);
    OPC_REAL *g = OPC_T(opc_dev_in)(b, r, 4), *be = OPC_T(opc_dev_in)(b, r, 5);
    OPC_REAL *rm = OPC_T(opc_dev_in)(b, r, 6), *rv = OPC_T(opc_dev_in)(b, r, 7);
    OPC_REAL *z = residual ? OPC_T(opc_dev_in)(b, r, 8) : NULL;
    OPC_REAL *w = OPC_T(opc_dev_zero)(b, wn), *tmp = OPC_T(opc_dev_zero)(b, ny);
    OPC_REAL *conv_out = OPC_T(opc_dev_zero)(b, ny), *y = OPC_T(opc_dev_zero)(b, ny);
    OPC_REAL *mean = OPC_T(opc_dev_zero)(b, nc), *inv = OPC_T(opc_dev_zero)(b, nc);
    o->conv_weight_import(b->ctx, plan, wk, w);
    struct OPC_T(NetBnForward) fwd = {OPC_T(opc_conv_bn_kind)(c), oh * ow, s->cout, g, be, z, tmp, y,
                                      mean, inv, rm, rv, 0.1f, 1e-5f};
    OPC_T(net_ops_conv_bn_forward)(o, b->ctx, plan, c->n, x, w, bias, conv_out, ws, ws_bytes, &fwd);
    if (train) {
        OPC_REAL *dc = OPC_T(opc_dev_zero)(b, ny), *dg = OPC_T(opc_dev_zero)(b, nc);
        OPC_REAL *db = OPC_T(opc_dev_zero)(b, nc), *dwd = OPC_T(opc_dev_zero)(b, wn);
        /* dbias starts stale (the last input): it must be overwritten */
        OPC_REAL *dw = OPC_T(opc_dev_zero)(b, wn), *dbias = OPC_T(opc_dev_in)(b, r, residual ? 10 : 8);
        /* the residual form accumulates into dx: start from input 9 */
        OPC_REAL *dx = residual ? OPC_T(opc_dev_in)(b, r, 9) : OPC_T(opc_dev_zero)(b, nx);
        struct OPC_T(NetBnBackward) bwd = {NET_BN_BACKWARD, oh * ow, s->cout, conv_out, y, g, mean,
                                           inv, dy, dc, dg, db};
        OPC_T(opc_conv_bn_backward)(c, b, plan, &bwd, x, w, dx, dwd, dbias, ws, ws_bytes, nx);
        o->conv_weight_export(b->ctx, plan, dwd, dw);
        OPC_T(opc_take)(b, r, "y", y, ny);
        OPC_T(opc_take)(b, r, "conv out", conv_out, ny);
        OPC_T(opc_take)(b, r, "save_mean", mean, nc);
        OPC_T(opc_take)(b, r, "save_invstd", inv, nc);
        OPC_T(opc_take)(b, r, "running_mean", rm, nc);
        OPC_T(opc_take)(b, r, "running_var", rv, nc);
        OPC_T(opc_take)(b, r, "bn dx", dc, ny);
        OPC_T(opc_take)(b, r, "dgamma", dg, nc);
        OPC_T(opc_take)(b, r, "dbeta", db, nc);
        OPC_T(opc_take)(b, r, "conv dx", dx, nx);
        OPC_T(opc_take)(b, r, "conv dweight", dw, wn);
        OPC_T(opc_take)(b, r, "conv dbias", dbias, nc);
        if (residual) OPC_T(opc_take)(b, r, "dz (masked dy)", dy, ny);
        o->release(b->ctx, dwd);
        mean = inv = rm = rv = NULL;
        if (residual) dy = NULL;
    } else {
        OPC_T(opc_take)(b, r, "y", y, ny);
        OPC_T(opc_take)(b, r, "conv out", conv_out, ny);
    }
    OPC_REAL *dev[] = {x, wk, bias, dy, g, be, w, rm, rv, z, tmp, mean, inv};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) o->release(b->ctx, dev[i]);
    o->release(b->ctx, ws);
    o->conv_plan_free(b->ctx, plan);
}

/* The backward of a training BN (dy: input 6) as the executor calls it: BN+ReLU in
 * one op; BN+add+ReLU as the ReLU mask (in place on dy, which is then the residual's
 * gradient dz) and the BN backward. */
static void OPC_T(opc_run_bn_train_backward)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r,
                                             const OPC_REAL *x, const OPC_REAL *g, const OPC_REAL *y,
                                             const OPC_REAL *mean, const OPC_REAL *inv) {
    size_t nx = r->in_n[0], nc = (size_t)c->c;
    const struct OPC_T(NetOps) *o = b->ops;
    OPC_REAL *dy = OPC_T(opc_dev_in)(b, r, 6), *dx = OPC_T(opc_dev_zero)(b, nx);
    OPC_REAL *dg = OPC_T(opc_dev_zero)(b, nc), *db = OPC_T(opc_dev_zero)(b, nc);
    if (c->op == OPC_BN_RELU_TRAIN) {
        o->bn_relu_backward(b->ctx, c->n, c->hw, c->c, x, y, g, mean, inv, dy, dx, dg, db);
    } else {
        if (c->op == OPC_BN_ADD_RELU_TRAIN) o->relu_backward(b->ctx, nx, y, dy, dy);
        o->bn_backward(b->ctx, c->n, c->hw, c->c, x, g, mean, inv, dy, dx, dg, db);
    }
    OPC_T(opc_take)(b, r, "dx", dx, nx);
    OPC_T(opc_take)(b, r, "dgamma", dg, nc);
    OPC_T(opc_take)(b, r, "dbeta", db, nc);
    if (c->op == OPC_BN_ADD_RELU_TRAIN)
        OPC_T(opc_take)(b, r, "dz", dy, nx);
    else
        o->release(b->ctx, dy);
}

static void OPC_T(opc_run_bn_forward)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    size_t nx = r->in_n[0], nc = (size_t)c->c;
    OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *g = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *be = OPC_T(opc_dev_in)(b, r, 2), *rm = OPC_T(opc_dev_in)(b, r, 3);
    OPC_REAL *rv = OPC_T(opc_dev_in)(b, r, 4), *z = OPC_T(opc_dev_in)(b, r, 5);
    OPC_REAL *y = OPC_T(opc_dev_zero)(b, nx), *tmp = OPC_T(opc_dev_zero)(b, nx);
    OPC_REAL *mean = OPC_T(opc_dev_zero)(b, nc), *inv = OPC_T(opc_dev_zero)(b, nc);
    const struct OPC_T(NetOps) *o = b->ops;
    if (c->op == OPC_BN_TRAIN)
        o->bn_train(b->ctx, c->n, c->hw, c->c, x, g, be, y, mean, inv, rm, rv, 0.1f, 1e-5f);
    else if (c->op == OPC_BN_RELU_TRAIN)
        o->bn_relu_train(b->ctx, c->n, c->hw, c->c, x, g, be, y, mean, inv, rm, rv, 0.1f, 1e-5f);
    else if (c->op == OPC_BN_ADD_RELU_TRAIN)
        o->bn_add_relu_train(b->ctx, c->n, c->hw, c->c, x, g, be, z, tmp, y, mean, inv, rm, rv, 0.1f,
                             1e-5f);
    else
        o->bn_eval(b->ctx, c->n, c->hw, c->c, x, g, be, rm, rv, 1e-5f, y);
    if (c->op != OPC_BN_EVAL) {
        OPC_T(opc_run_bn_train_backward)(c, b, r, x, g, y, mean, inv);
        OPC_T(opc_take)(b, r, "y", y, nx);
        OPC_T(opc_take)(b, r, "save_mean", mean, nc);
        OPC_T(opc_take)(b, r, "save_invstd", inv, nc);
        OPC_T(opc_take)(b, r, "running_mean", rm, nc);
        OPC_T(opc_take)(b, r, "running_var", rv, nc);
    } else {
        OPC_T(opc_take)(b, r, "y", y, nx);
        OPC_REAL *dev[] = {mean, inv, rm, rv};
        for (int i = 0; i < 4; i++) o->release(b->ctx, dev[i]);
    }
    OPC_REAL *dev[] = {x, g, be, z, tmp};
    for (int i = 0; i < 5; i++) o->release(b->ctx, dev[i]);
}

static void OPC_T(opc_run_bn_backward)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    size_t nx = r->in_n[0], nc = (size_t)c->c;
    OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *y = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *g = OPC_T(opc_dev_in)(b, r, 2), *mean = OPC_T(opc_dev_in)(b, r, 3);
    OPC_REAL *inv = OPC_T(opc_dev_in)(b, r, 4), *dy = OPC_T(opc_dev_in)(b, r, 5);
    OPC_REAL *dx = OPC_T(opc_dev_zero)(b, nx), *dg = OPC_T(opc_dev_zero)(b, nc);
    OPC_REAL *db = OPC_T(opc_dev_zero)(b, nc);
    if (c->op == OPC_BN_BACKWARD)
        b->ops->bn_backward(b->ctx, c->n, c->hw, c->c, x, g, mean, inv, dy, dx, dg, db);
    else
        b->ops->bn_relu_backward(b->ctx, c->n, c->hw, c->c, x, y, g, mean, inv, dy, dx, dg, db);
    OPC_T(opc_take)(b, r, "dx", dx, nx);
    OPC_T(opc_take)(b, r, "dgamma", dg, nc);
    OPC_T(opc_take)(b, r, "dbeta", db, nc);
    OPC_REAL *dev[] = {x, y, g, mean, inv, dy};
    for (int i = 0; i < 6; i++) b->ops->release(b->ctx, dev[i]);
}

/* relu: forward, and backward of its output with dy = input 1; add and add_relu of
 * inputs 0 and 1, and add_relu's backward (the ReLU mask) with dy = input 2. */
static void OPC_T(opc_run_elementwise)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    size_t n = r->in_n[0];
    OPC_REAL *a = OPC_T(opc_dev_in)(b, r, 0), *a2 = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *y = OPC_T(opc_dev_zero)(b, n), *y2 = OPC_T(opc_dev_zero)(b, n);
    if (c->op == OPC_RELU) {
        b->ops->relu_forward(b->ctx, n, a, y);
        b->ops->relu_backward(b->ctx, n, y, a2, y2);
        OPC_T(opc_take)(b, r, "relu", y, n);
        OPC_T(opc_take)(b, r, "relu_backward", y2, n);
    } else {
        OPC_REAL *dy = OPC_T(opc_dev_in)(b, r, 2), *dx = OPC_T(opc_dev_zero)(b, n);
        b->ops->add(b->ctx, n, a, a2, y);
        b->ops->add_relu(b->ctx, n, a, a2, y2);
        b->ops->relu_backward(b->ctx, n, y2, dy, dx);
        OPC_T(opc_take)(b, r, "add", y, n);
        OPC_T(opc_take)(b, r, "add_relu", y2, n);
        OPC_T(opc_take)(b, r, "add_relu_backward", dx, n);
        b->ops->release(b->ctx, dy);
    }
    b->ops->release(b->ctx, a);
    b->ops->release(b->ctx, a2);
}

static void OPC_T(opc_run_pool_linear)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    const struct OPC_T(NetOps) *o = b->ops;
    if (c->op == OPC_MEANPOOL) {
        OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *dy = OPC_T(opc_dev_in)(b, r, 1);
        OPC_REAL *y = OPC_T(opc_dev_zero)(b, r->in_n[1]), *dx = OPC_T(opc_dev_zero)(b, r->in_n[0]);
        o->meanpool_forward(b->ctx, c->n, c->hw, c->c, x, y);
        o->meanpool_backward(b->ctx, c->n, c->hw, c->c, dy, dx);
        OPC_T(opc_take)(b, r, "pool", y, r->in_n[1]);
        OPC_T(opc_take)(b, r, "pool_backward", dx, r->in_n[0]);
        o->release(b->ctx, x);
        o->release(b->ctx, dy);
        return;
    }
    OPC_REAL *x = OPC_T(opc_dev_in)(b, r, 0), *w = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *bias = OPC_T(opc_dev_in)(b, r, 2), *dy = OPC_T(opc_dev_in)(b, r, 3);
    OPC_REAL *y = OPC_T(opc_dev_zero)(b, r->in_n[3]), *dx = OPC_T(opc_dev_zero)(b, r->in_n[0]);
    OPC_REAL *dw = OPC_T(opc_dev_zero)(b, r->in_n[1]), *db = OPC_T(opc_dev_zero)(b, r->in_n[2]);
    o->linear_forward(b->ctx, c->n, c->c, c->k, x, w, bias, y);
    o->linear_backward(b->ctx, c->n, c->c, c->k, x, w, dy, dx, dw, db);
    OPC_T(opc_take)(b, r, "linear", y, r->in_n[3]);
    OPC_T(opc_take)(b, r, "dx", dx, r->in_n[0]);
    OPC_T(opc_take)(b, r, "dweight", dw, r->in_n[1]);
    OPC_T(opc_take)(b, r, "dbias", db, r->in_n[2]);
    OPC_REAL *dev[] = {x, w, bias, dy};
    for (int i = 0; i < 4; i++) o->release(b->ctx, dev[i]);
}

/* Cross-entropy with label smoothing c->c percent. */
static void OPC_T(opc_run_xent)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    const struct OPC_T(NetOps) *o = b->ops;
    int32_t *lab_h = xmalloc((size_t)c->n * sizeof(int32_t));
    for (int i = 0; i < c->n; i++) lab_h[i] = (int32_t)r->in[1][i] % c->k;
    int32_t *lab = o->alloc(b->ctx, (size_t)c->n * sizeof(int32_t));
    b->upload(b->ctx, lab, lab_h, (size_t)c->n * sizeof(int32_t));
    OPC_REAL *logits = OPC_T(opc_dev_in)(b, r, 0), *dl = OPC_T(opc_dev_zero)(b, r->in_n[0]);
    OPC_REAL *loss = OPC_T(opc_dev_zero)(b, 1);
    int *hits_d = o->alloc(b->ctx, sizeof(int));
    o->xent(b->ctx, c->n, c->k, logits, lab, (OPC_REAL)(c->c * 0.01), dl, loss, hits_d);
    int hits = -1;
    b->download(b->ctx, &hits, hits_d, sizeof hits);
    o->release(b->ctx, hits_d);
    OPC_T(opc_take)(b, r, "loss", loss, 1);
    OPC_REAL *hits_r = OPC_T(opc_dev_zero)(b, 1);
    OPC_REAL hr = (OPC_REAL)hits;
    b->upload(b->ctx, hits_r, &hr, sizeof hr);
    OPC_T(opc_take)(b, r, "hits", hits_r, 1);
    OPC_T(opc_take)(b, r, "dlogits", dl, r->in_n[0]);
    o->release(b->ctx, logits);
    o->release(b->ctx, lab);
    free(lab_h);
}

/* SGD (k: Nesterov) with momentum and weight decay, one step past the first. */
static void OPC_T(opc_run_sgd)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    const struct OPC_T(NetOps) *o = b->ops;
    size_t n = r->in_n[0];
    OPC_REAL *p = OPC_T(opc_dev_in)(b, r, 0), *g = OPC_T(opc_dev_in)(b, r, 1);
    OPC_REAL *m = OPC_T(opc_dev_in)(b, r, 2);
    const float lr = 0.05f;
    const int32_t first = 0;
    float *lr_d = o->alloc(b->ctx, sizeof lr);
    int32_t *first_d = o->alloc(b->ctx, sizeof first);
    b->upload(b->ctx, lr_d, &lr, sizeof lr);
    b->upload(b->ctx, first_d, &first, sizeof first);
    o->sgd(b->ctx, n, p, g, m, NULL, lr_d, 0.9f, 5e-4f, c->k, first_d);
    o->release(b->ctx, lr_d);
    o->release(b->ctx, first_d);
    OPC_T(opc_take)(b, r, "param", p, n);
    OPC_T(opc_take)(b, r, "momentum", m, n);
    o->release(b->ctx, g);
}

/* Runs case c on backend b from r's inputs, appending its outputs to r. */
static void OPC_T(opc_run)(const OpCase *c, const OPC_T(OpBackend) *b, OpcRun *r) {
    switch (c->op) {
    case OPC_CONV: OPC_T(opc_run_conv)(c, b, r); break;
    case OPC_CONV_BN:
    case OPC_CONV_BN_EVAL: OPC_T(opc_run_conv_bn)(c, b, r); break;
    case OPC_BN_TRAIN:
    case OPC_BN_RELU_TRAIN:
    case OPC_BN_ADD_RELU_TRAIN:
    case OPC_BN_EVAL: OPC_T(opc_run_bn_forward)(c, b, r); break;
    case OPC_BN_BACKWARD:
    case OPC_BN_RELU_BACKWARD: OPC_T(opc_run_bn_backward)(c, b, r); break;
    case OPC_RELU:
    case OPC_ADD_RELU: OPC_T(opc_run_elementwise)(c, b, r); break;
    case OPC_MEANPOOL:
    case OPC_LINEAR: OPC_T(opc_run_pool_linear)(c, b, r); break;
    case OPC_XENT: OPC_T(opc_run_xent)(c, b, r); break;
    case OPC_SGD: OPC_T(opc_run_sgd)(c, b, r); break;
    }
}
