/* engine_cases_cuda.h: the GPU engine against the CPU engine (training steps eager,
 * captured and replayed, streamed data, staged state), a part of tests/test_ops_cuda.c
 * kept in its own file for length: included by it once, after its helpers (skip,
 * rand_vec, the unit.h counters are that translation unit's). */
#ifndef CIFAR_ENGINE_CASES_CUDA_H
#define CIFAR_ENGINE_CASES_CUDA_H

/* ---------------------------------------------------------------- engine */

/* The engine tests' data set and batches: 48 random 16x16x3 images, batches of 8;
 * steps 0..2 full batches (eager, captured, replayed), step 3 a partial one. */
enum { ENGINE_COUNT = 48, ENGINE_BATCH = 8, ENGINE_STEPS = 4 };
static const int engine_step_sizes[ENGINE_STEPS] = {ENGINE_BATCH, ENGINE_BATCH, ENGINE_BATCH, 5};
static const size_t engine_rec = (size_t)16 * 16 * 3;

static void engine_test_model(Model *m, int bottleneck) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    cfg.n_stages = 2;
    cfg.n_channels[0] = 8;
    cfg.n_channels[1] = 16;
    cfg.bottlenecks[0] = bottleneck ? 4 : 0;
    cfg.bottlenecks[1] = bottleneck ? 8 : 0;
    cfg.use_bottleneck = bottleneck;
    cfg.n_blocks[0] = 2;
    cfg.n_blocks[1] = 2;
    cfg.img_channels = 3;
    cfg.img_height = 16;
    cfg.img_width = 16;
    cfg.num_classes = 10;
    char err[256];
    if (model_build(m, &cfg, err, sizeof err) != 0) die("test model: %s", err);
}

static void engine_test_data(uint8_t **px, int32_t **lab) {
    *px = xmalloc(ENGINE_COUNT * engine_rec);
    *lab = xmalloc(ENGINE_COUNT * sizeof(int32_t));
    for (size_t i = 0; i < ENGINE_COUNT * engine_rec; i++) (*px)[i] = (uint8_t)(rng_u64(11, 12, i) & 255);
    for (int i = 0; i < ENGINE_COUNT; i++) (*lab)[i] = (int32_t)rng_below(13, 14, (uint64_t)i, 10);
}

static Comm *engine_test_comm(void) {
    DistEnv env;
    memset(&env, 0, sizeof env);
    env.world_size = env.local_world_size = 1;
    return comm_create(COMM_SINGLE, &env);
}

/* One process, deterministic (bf16: not), both splits the same data. */
static void engine_test_config(EngineConfig *ec, const Model *m, HostSplit data, Comm *comm,
                               Precision prec) {
    memset(ec, 0, sizeof *ec);
    ec->model = m;
    ec->train = data;
    ec->test = data;
    for (int i = 0; i < 3; i++) {
        ec->mean[i] = 0.5f;
        ec->std[i] = 0.25f;
    }
    ec->pad = 4;
    ec->flip = 1;
    ec->cutout = 5;
    ec->ema_decay = 0.6f;
    ec->ema_warmup = 1; /* the decay changes every step: read from device memory by the graph */
    ec->max_batch = ENGINE_BATCH;
    ec->seed = 21;
    ec->label_smoothing = 0.1f;
    ec->momentum = 0.9f;
    ec->weight_decay = 5e-4f;
    ec->threads = 1;
    ec->precision = prec;
    /* bf16 is compared within a tolerance: any cuDNN algorithm (a shape with no
     * deterministic bf16 algorithm would stop the test) */
    ec->deterministic = prec != PRECISION_BF16;
    ec->comm = comm;
    settings_from_env(&ec->settings);
}

static Engine *engine_test_cuda(const EngineConfig *ec) {
    char err[256];
    Engine *gpu = engine_create_cuda(ec, err, sizeof err);
    if (!gpu) die("engine_create_cuda: %s", err);
    return gpu;
}

/* Step s's sample indices (engine_step_sizes[s] of them). */
static void engine_step_idx(int s, int64_t *idx) {
    for (int i = 0; i < engine_step_sizes[s]; i++) idx[i] = (s * 11 + i * 5) % ENGINE_COUNT;
}

/* Step s of the test on engines a and b alike: their losses and hits. */
typedef struct {
    float loss[2];
    int hits[2];
} PairStep;

static PairStep engine_pair_step(Engine *a, Engine *b, int s) {
    int64_t idx[ENGINE_BATCH];
    engine_step_idx(s, idx);
    PairStep r = {{0, 0}, {-1, -1}};
    float lr = 0.05f * (float)(s + 1);
    Engine *e[2] = {a, b};
    for (int k = 0; k < 2; k++)
        r.loss[k] = e[k]->ops->train_step(e[k], idx, engine_step_sizes[s], 1 + s / 2, s, lr, &r.hits[k]);
    return r;
}

/* The same initial state (model_init, seed 5) into engines a and b; the caller
 * frees *params and *buffers. */
static void engine_pair_init(Engine *a, Engine *b, const Model *m, float **params, float **buffers) {
    *params = xmalloc(m->num_params * sizeof(float));
    *buffers = xmalloc(m->num_buffers * sizeof(float));
    model_init(m, *params, *buffers, 5);
    a->ops->state_from_host(a, *params, *buffers, NULL);
    b->ops->state_from_host(b, *params, *buffers, NULL);
    if (a->cfg.ema_decay > 0) { /* the average starts from the same weights */
        a->ops->ema_from_host(a, *params, *buffers);
        b->ops->ema_from_host(b, *params, *buffers);
    }
}

static void test_engine(int bottleneck, Precision prec, float tol) {
    Model m;
    engine_test_model(&m, bottleneck);
    const int count = ENGINE_COUNT, batch = ENGINE_BATCH;
    uint8_t *px;
    int32_t *lab;
    engine_test_data(&px, &lab);
    Comm *comm = engine_test_comm();
    EngineConfig ec;
    engine_test_config(&ec, &m, (HostSplit){.pixels = px, .labels = lab, .count = count}, comm, prec);
    Engine *cpu = engine_create_cpu(&ec);
    Engine *gpu = engine_test_cuda(&ec);

    float *params, *buffers;
    engine_pair_init(cpu, gpu, &m, &params, &buffers);
    char name[160];
    const char *kind = bottleneck ? "bottleneck" : "basic";
    const char *pn = prec == PRECISION_BF16 ? "bf16" : prec == PRECISION_TF32 ? "tf32" : "fp32";
    const int *sizes = engine_step_sizes;
    for (int s = 0; s < ENGINE_STEPS; s++) {
        PairStep r = engine_pair_step(cpu, gpu, s);
        float lc = r.loss[0], lg = r.loss[1];
        int cc = r.hits[0], gc = r.hits[1];
        snprintf(name, sizeof name, "engine %s %s step %d (n=%d): loss", kind, pn, s, sizes[s]);
        expect_close(name, &lg, &lc, 1, tol, tol);
        snprintf(name, sizeof name, "engine %s %s step %d: correct %d == %d", kind, pn, s, gc, cc);
        expect_true(name, prec != PRECISION_FP32 || gc == cc);
    }
    /* The second full batch is captured and replayed, the third replayed: a failed
     * capture (eager steps, with the same results) must not pass unnoticed. */
    const char *graphs = getenv("CIFAR_CUDA_GRAPH"), *phases = getenv("CIFAR_CUDA_PHASES");
    /* CIFAR_CUDA_PHASES=1 (make bench-gpu's timing) runs every step eagerly too */
    if (!(graphs && strcmp(graphs, "0") == 0) && !(phases && strcmp(phases, "1") == 0)) {
        long replays = engine_cuda_graph_replays(gpu);
        snprintf(name, sizeof name, "engine %s %s: %ld steps replayed through the CUDA graph (want 2)", kind,
                 pn, replays);
        expect_true(name, replays == 2);
    }
    float *pc = xmalloc(m.num_params * sizeof(float)), *pg = xmalloc(m.num_params * sizeof(float));
    float *bc = xmalloc(m.num_buffers * sizeof(float)), *bg = xmalloc(m.num_buffers * sizeof(float));
    float *mc = xmalloc(m.num_params * sizeof(float)), *mg = xmalloc(m.num_params * sizeof(float));
    cpu->ops->state_to_host(cpu, pc, bc, mc);
    gpu->ops->state_to_host(gpu, pg, bg, mg);
    snprintf(name, sizeof name, "engine %s %s after 4 steps: params", kind, pn);
    expect_tensors(name, &m, TENSOR_PARAM, pg, pc, params, tol);
    snprintf(name, sizeof name, "engine %s %s after 4 steps: BN buffers", kind, pn);
    expect_tensors(name, &m, TENSOR_BUFFER, bg, bc, buffers, tol);
    snprintf(name, sizeof name, "engine %s %s after 4 steps: momentum", kind, pn);
    expect_tensors(name, &m, TENSOR_PARAM, mg, mc, NULL, tol);
    /* the moving average (updated inside the captured graph from the second full step) */
    cpu->ops->ema_to_host(cpu, pc, bc);
    gpu->ops->ema_to_host(gpu, pg, bg);
    snprintf(name, sizeof name, "engine %s %s after 4 steps: moving average of the params", kind, pn);
    expect_tensors(name, &m, TENSOR_PARAM, pg, pc, params, tol);
    snprintf(name, sizeof name, "engine %s %s after 4 steps: moving average of the BN buffers", kind, pn);
    expect_tensors(name, &m, TENSOR_BUFFER, bg, bc, buffers, tol);
    gpu->ops->state_to_host(gpu, pg, bg, mg);
    /* state_from_host(state_to_host(x)) is the identity through the layout conversion */
    gpu->ops->state_from_host(gpu, pg, bg, mg);
    float *pg2 = xmalloc(m.num_params * sizeof(float));
    gpu->ops->state_to_host(gpu, pg2, bg, NULL);
    snprintf(name, sizeof name, "engine %s state round trip", kind);
    expect_true(name, memcmp(pg2, pg, m.num_params * sizeof(float)) == 0);

    int64_t eidx[8];
    for (int i = 0; i < batch; i++) eidx[i] = (i * 3 + 1) % count;
    double lsc = 0, lsg = 0;
    int64_t hc = 0, hg = 0;
    int32_t predc[8], predg[8];
    float *logc = xmalloc((size_t)batch * m.fc_out * sizeof(float));
    float *logg = xmalloc((size_t)batch * m.fc_out * sizeof(float));
    cpu->ops->eval_batch(cpu, eidx, batch, &lsc, &hc, predc, logc);
    gpu->ops->eval_batch(gpu, eidx, batch, &lsg, &hg, predg, logg);
    float flc = (float)lsc, flg = (float)lsg;
    snprintf(name, sizeof name, "engine %s %s eval: loss sum", kind, pn);
    expect_close(name, &flg, &flc, 1, tol * batch, tol);
    snprintf(name, sizeof name, "engine %s %s eval: logits", kind, pn);
    expect_close(name, logg, logc, (size_t)batch * m.fc_out, tol, tol);
    free(logc);
    free(logg);
    if (prec == PRECISION_FP32) {
        snprintf(name, sizeof name, "engine %s eval: hits %lld == %lld and predictions", kind,
                 (long long)hg, (long long)hc);
        expect_true(name, hg == hc && memcmp(predc, predg, sizeof predc) == 0);
    }
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    comm_destroy(comm);
    model_free(&m);
    free(px); free(lab); free(params); free(buffers); free(pc); free(pg); free(pg2);
    free(bc); free(bg); free(mc); free(mg);
}

/* Model state of an engine, on the host. */
typedef struct {
    float *params, *buffers, *momentum;
} HostState;

static HostState engine_state(Engine *e, const Model *m) {
    HostState st = {xmalloc(m->num_params * sizeof(float)), xmalloc(m->num_buffers * sizeof(float)),
                    xmalloc(m->num_params * sizeof(float))};
    e->ops->state_to_host(e, st.params, st.buffers, st.momentum);
    return st;
}

static int host_state_equal(const HostState *a, const HostState *b, const Model *m) {
    return memcmp(a->params, b->params, m->num_params * sizeof(float)) == 0 &&
           memcmp(a->buffers, b->buffers, m->num_buffers * sizeof(float)) == 0 &&
           memcmp(a->momentum, b->momentum, m->num_params * sizeof(float)) == 0;
}

static void host_state_free(HostState *st) {
    free(st->params);
    free(st->buffers);
    free(st->momentum);
}

static Engine *engine_with_data_mode(const EngineConfig *ec, const char *mode) {
    EngineConfig with = *ec;
    setenv("CIFAR_CUDA_DATA", mode, 1);
    settings_from_env(&with.settings);
    unsetenv("CIFAR_CUDA_DATA");
    return engine_test_cuda(&with);
}

/* What engine e is told before step s of test_engine_stream: step s+1's indices
 * as the epoch loop does (step 0 is gathered on demand), and at step 1 indices
 * that no step takes (step 2 is gathered on demand, into the stale hint's slot:
 * both slots are taken then) and step 1's own again (not gathered twice). */
static void engine_stream_hint(Engine *e, int s) {
    int64_t idx[ENGINE_BATCH];
    if (s + 1 >= ENGINE_STEPS) return;
    engine_step_idx(s + 1, idx);
    if (s == 1)
        for (int i = 0; i < engine_step_sizes[s + 1]; i++) idx[i] = (idx[i] + 1) % ENGINE_COUNT;
    e->ops->prefetch(e, idx, engine_step_sizes[s + 1], 1);
    if (s == 1) {
        engine_step_idx(s, idx);
        e->ops->prefetch(e, idx, engine_step_sizes[s], 1);
    }
}

/* Evaluation i of test_engine_stream on engine e (its loss sum, hits and
 * predictions): the first after a hint of other test indices and a hint of its
 * own indices for the training split (gathered on demand from the test split),
 * the second after a hint of its own. */
typedef struct {
    double loss;
    int64_t hits;
    int32_t pred[ENGINE_BATCH];
} EvalOut;

static EvalOut engine_stream_eval(Engine *e, int i) {
    int64_t eidx[ENGINE_BATCH], other[ENGINE_BATCH];
    for (int k = 0; k < ENGINE_BATCH; k++) {
        eidx[k] = (k * 3 + 1 + i * 5) % ENGINE_COUNT;
        other[k] = (k * 7 + 2) % ENGINE_COUNT;
    }
    if (i == 0) {
        e->ops->prefetch(e, other, ENGINE_BATCH, 0);
        e->ops->prefetch(e, eidx, ENGINE_BATCH, 1);
    } else {
        e->ops->prefetch(e, eidx, ENGINE_BATCH, 0);
    }
    EvalOut r = {0, 0, {0}};
    e->ops->eval_batch(e, eidx, ENGINE_BATCH, &r.loss, &r.hits, r.pred, NULL);
    return r;
}

/* The same steps on an engine whose splits stay in device memory and on one that
 * streams them (CIFAR_CUDA_DATA=resident / stream:3: the loader hands 3 records
 * over at a time, so the copies of a batch of 8 gathered on demand interleave with
 * its gather), from record pointers as a dataset's map gives them (in reverse
 * memory order; the test split another order of the same records), with the
 * prefetch hints of engine_stream_hint and engine_stream_eval, some matching and
 * some not: losses, hits, weights, BN buffers, momentum, evaluation and
 * predictions bit for bit. */
static void test_engine_stream(void) {
    Model m;
    engine_test_model(&m, 0);
    uint8_t *px;
    int32_t *lab;
    engine_test_data(&px, &lab);
    const uint8_t **recs = xmalloc(ENGINE_COUNT * sizeof *recs), **recs_t = xmalloc(ENGINE_COUNT * sizeof *recs_t);
    int32_t *lab_t = xmalloc(ENGINE_COUNT * sizeof *lab_t);
    uint8_t *rev = xmalloc(ENGINE_COUNT * engine_rec); /* record i at the mirrored place */
    for (int i = 0; i < ENGINE_COUNT; i++) {
        recs[i] = rev + (size_t)(ENGINE_COUNT - 1 - i) * engine_rec;
        memcpy(rev + (size_t)(ENGINE_COUNT - 1 - i) * engine_rec, px + (size_t)i * engine_rec, engine_rec);
    }
    for (int i = 0; i < ENGINE_COUNT; i++) { /* 5 is prime to 48: a permutation */
        recs_t[i] = recs[(i * 5 + 3) % ENGINE_COUNT];
        lab_t[i] = lab[(i * 5 + 3) % ENGINE_COUNT];
    }
    Comm *comm = engine_test_comm();
    EngineConfig ec;
    engine_test_config(&ec, &m, (HostSplit){.labels = lab, .count = ENGINE_COUNT, .records = recs}, comm,
                       PRECISION_FP32);
    ec.test = (HostSplit){.labels = lab_t, .count = ENGINE_COUNT, .records = recs_t};
    Engine *res = engine_with_data_mode(&ec, "resident");
    Engine *str = engine_with_data_mode(&ec, "stream:3");
    expect_true("engine: the CUDA engine has a prefetch op", str->ops->prefetch != NULL);
    float *params, *buffers;
    engine_pair_init(res, str, &m, &params, &buffers);
    char name[200];
    for (int s = 0; s < ENGINE_STEPS; s++) {
        engine_stream_hint(res, s); /* nothing to gather on a resident split */
        engine_stream_hint(str, s);
        PairStep r = engine_pair_step(res, str, s);
        snprintf(name, sizeof name, "engine streamed step %d (n=%d, prefetch hints): loss %.9g == resident %.9g, hits %d == %d",
                 s, engine_step_sizes[s], r.loss[1], r.loss[0], r.hits[1], r.hits[0]);
        expect_true(name, memcmp(&r.loss[0], &r.loss[1], sizeof(float)) == 0 && r.hits[0] == r.hits[1]);
    }
    HostState a = engine_state(res, &m), b = engine_state(str, &m);
    expect_true("engine streamed after 4 steps: params, BN buffers and momentum bit-identical to resident",
                host_state_equal(&a, &b, &m));
    for (int i = 0; i < 2; i++) {
        EvalOut er = engine_stream_eval(res, i), es = engine_stream_eval(str, i);
        snprintf(name, sizeof name, "engine streamed eval %d (%s hint): loss sum, hits and predictions bit-identical to resident",
                 i, i == 0 ? "mismatching" : "matching");
        expect_true(name, memcmp(&er.loss, &es.loss, sizeof er.loss) == 0 && er.hits == es.hits &&
                              memcmp(er.pred, es.pred, sizeof er.pred) == 0);
    }
    host_state_free(&a);
    host_state_free(&b);
    res->ops->destroy(res);
    str->ops->destroy(str); /* logs: 3 batches prefetched (steps 1 and 3, eval 1), 3 on demand */
    comm_destroy(comm);
    model_free(&m);
    free(px); free(lab); free(recs); free(recs_t); free(lab_t); free(rev); free(params); free(buffers);
}

/* engine.h's state_stage / state_staged (background snapshots): the state staged
 * after the steps queued so far, read on another thread (the snapshot writer's,
 * which sets its device) while a later step (a CUDA graph replay, then the SGD)
 * changes the params, is bit for bit what state_to_host gave at the stage; and a
 * second stage after more steps gives the new state. fp32 and bf16 (fp32 master
 * weights), resident and streamed data. */
typedef struct {
    Engine *e;
    const float *params, *buffers, *momentum;
} StagedRead;

static void *staged_read_thread(void *p) {
    StagedRead *r = p;
    r->e->ops->state_staged(r->e, &r->params, &r->buffers, &r->momentum);
    return NULL;
}

static int staged_equal(const StagedRead *r, const HostState *want, const Model *m) {
    return memcmp(r->params, want->params, m->num_params * sizeof(float)) == 0 &&
           memcmp(r->buffers, want->buffers, m->num_buffers * sizeof(float)) == 0 &&
           memcmp(r->momentum, want->momentum, m->num_params * sizeof(float)) == 0;
}

static void test_engine_stage(Precision prec, const char *data_mode) {
    Model m;
    engine_test_model(&m, 0);
    uint8_t *px;
    int32_t *lab;
    engine_test_data(&px, &lab);
    Comm *comm = engine_test_comm();
    EngineConfig ec;
    engine_test_config(&ec, &m, (HostSplit){.pixels = px, .labels = lab, .count = ENGINE_COUNT}, comm,
                       prec);
    Engine *e = engine_with_data_mode(&ec, data_mode);
    const char *pn = prec == PRECISION_BF16 ? "bf16" : "fp32";
    char name[200];
    expect_true("engine: the CUDA engine stages snapshots", e->ops->state_stage && e->ops->state_staged);
    float *params = xmalloc(m.num_params * sizeof(float)), *buffers = xmalloc(m.num_buffers * sizeof(float));
    model_init(&m, params, buffers, 5);
    e->ops->state_from_host(e, params, buffers, NULL);
    int64_t idx[ENGINE_BATCH];
    for (int round = 0; round < 2; round++) {
        /* round 0: steps 0..2 (eager, captured, replayed); round 1: step 3 (partial) */
        for (int s = round ? 3 : 0; s < (round ? 4 : 3); s++) {
            engine_step_idx(s, idx);
            e->ops->train_step(e, idx, engine_step_sizes[s], 1, s, 0.05f * (float)(s + 1), NULL);
        }
        HostState want = engine_state(e, &m);
        e->ops->state_stage(e);
        engine_step_idx(round, idx); /* a full step right after: replayed, it changes the params */
        e->ops->train_step(e, idx, ENGINE_BATCH, 2, 10 + round, 0.1f, NULL);
        StagedRead r = {e, NULL, NULL, NULL};
        pthread_t t;
        if (pthread_create(&t, NULL, staged_read_thread, &r) != 0) die("pthread_create failed");
        pthread_join(t, NULL);
        snprintf(name, sizeof name, "engine %s %s stage %d: params, BN buffers and momentum read on "
                 "another thread after a later step are those of the stage", pn, data_mode, round);
        expect_true(name, staged_equal(&r, &want, &m));
        HostState now = engine_state(e, &m);
        snprintf(name, sizeof name, "engine %s %s stage %d: the later step changed the params", pn,
                 data_mode, round);
        expect_true(name, memcmp(now.params, want.params, m.num_params * sizeof(float)) != 0);
        host_state_free(&want);
        host_state_free(&now);
    }
    e->ops->state_stage(e); /* destroyed with a copy maybe in flight: waited for there */
    e->ops->destroy(e);
    comm_destroy(comm);
    model_free(&m);
    free(px); free(lab); free(params); free(buffers);
}

/* The engine functions of this program are cuda_loader.c's forwarders (libcifar.a
 * defines them too): point the loader at the library this test is linked with, so
 * it finds it already loaded. */
/* bf16 needs compute capability 8.0 (the engine refuses it below, exit status 2):
 * there the bf16 cases print SKIP with the reason. */
static int bf16_device_ok(void) {
    int cc = ops_cuda_compute_capability(0);
    if (cc >= 80) return 1;
    printf("test_ops_cuda: SKIP bf16 cases: device 0 has compute capability %d.%d (bf16 needs 8.0)\n",
           cc / 10, cc % 10);
    return 0;
}

#endif
