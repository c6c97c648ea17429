/* options.c: cifar-train's command line. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "core/options.h"
#include "core/settings.h"
#include "core/version.h"
#include "train.h"

static const char *usage_text =
    "usage: cifar-train [OPTIONS] [DATA.lmdb]\n"
    "Train the seed's ResNet on a cifar-prep LMDB (path from stdin when omitted).\n"
    "Rerunning the same command resumes from the latest valid snapshot in --run-dir.\n"
    "The final snapshot's path is the last line on stdout.\n"
    "\n"
    "Training:\n"
    "  --epochs N             epochs in all (default 30); a larger N continues a finished run\n"
    "  --batch-size N         images per process per step (default 256)\n"
    "  --lr X                 peak learning rate (default 0.1)\n"
    "  --momentum X           SGD momentum (default 0.9)\n"
    "  --nesterov             Nesterov momentum\n"
    "  --weight-decay X       L2 weight decay (default 5e-4)\n"
    "  --schedule S           const | step (x0.1 at 50% and 75%) | cosine (default cosine)\n"
    "  --warmup-epochs X      linear warm-up from 0 (default 1)\n"
    "  --label-smoothing X    cross-entropy label smoothing (default 0)\n"
    "  --seed N               initialisation, shuffling and augmentation (default 0)\n"
    "  --normalize M          dataset (its mean/std, default) | imagenet (the seed's constants)\n"
    "  --model FILE.json      network shape with the seed's Config fields (default: the seed's)\n"
    "  --augment LIST         random augmentation of training images: a comma list of crop\n"
    "                         and flip, or none (default crop,flip, as the seed)\n"
    "  --crop-padding P       zero padding around the image before the random crop, in\n"
    "                         pixels (default 4)\n"
    "  --cutout SIZE          set a random SIZE x SIZE square of each training image to 0\n"
    "                         after normalisation (DeVries & Taylor; default 0: none)\n"
    "  --ema DECAY            also keep an exponential moving average of the weights and\n"
    "                         BN buffers, updated every step (as timm's --model-ema; e.g.\n"
    "                         0.999; default 0: none); in the snapshots, used by cifar-eval\n"
    "  --ema-warmup           the average's decay warms up: min(DECAY, 1 - (1 + step)^(-2/3))\n"
    "                         (timm's --model-ema-warmup): for runs of a few thousand steps\n"
    "\n"
    "Validation:\n"
    "  --val-fraction F       hold out F (0 < F < 1) of the train split, stratified by class\n"
    "                         and fixed by --seed; val_loss/val_acc each epoch; the best\n"
    "                         epoch by val_acc is kept as RUN_DIR/best.safetensors (default 0:\n"
    "                         none)\n"
    "  --early-stop N         stop after N epochs without a better val_acc (needs\n"
    "                         --val-fraction; default 0: never)\n"
    "\n"
    "Snapshots:\n"
    "  --run-dir DIR          snapshots, metrics.jsonl and tb/ (TensorBoard event files)\n"
    "                         (default ./run); one job at a time\n"
    "  --log-every N          TensorBoard: train loss and lr every N steps (default 50)\n"
    "  --save-every N         snapshot every N epochs (default 5), and always at the end\n"
    "  --save-interval T      also a snapshot at the first step after each T of training:\n"
    "                         90s, 10m, 1h (default 10m; 0 = off), written in the background\n"
    "  --save-every-steps N   also a snapshot every N optimizer steps (default 0 = off)\n"
    "  --keep K               keep the newest K snapshots of any kind (default 3, 0 = all)\n"
    "  --signals-to-handle L  signals that write a snapshot at the next step and stop\n"
    "                         (exit 128+N): a comma list (default " SIGNALS_DEFAULT_TEXT ")\n"
    "  --fine-tune            resume from a snapshot of another dataset of the same shape\n"
    "                         (refused otherwise: its recorded dataset identity differs)\n"
    "\n"
    "Devices:\n"
    "  --device D             auto (GPU when usable, default) | cpu | cuda\n"
    "  --threads N            CPU threads per process (default: cores / local processes)\n"
    "  --precision P          fp32 | tf32 | bf16 (default tf32; the CPU computes tf32 as\n"
    "                         fp32, and bf16 where it has AVX512-BF16 or AMX-BF16 and\n"
    "                         the build has oneDNN: activations and convolutions in\n"
    "                         bf16, fp32 accumulation, weights and statistics)\n"
    "  --deterministic        deterministic GPU algorithms\n"
    "  --comm C               shm | mpi | gloo | nccl: the gradient exchange between\n"
    "                         processes (default: nccl on GPUs; on CPUs mpi under mpirun\n"
    "                         or srun --mpi=pmix, gloo under torchrun or on several nodes\n"
    "                         (--nnodes), else shm: one machine)\n"
    "\n"
    "Processes (torchrun's options; workers started with RANK etc. set run directly;\n"
    "CPUs on several machines: mpirun -np N cifar-train ... or srun --mpi=pmix):\n"
    "  --nproc-per-node N     N | gpu | auto: worker processes on this node\n"
    "  --nnodes N|MIN:MAX     nodes in the job (default 1); MIN:MAX: elastic, with\n"
    "                         --rdzv-endpoint (a round starts with MAX nodes, or MIN after\n"
    "                         --rdzv-timeout without a new one)\n"
    "  --rdzv-endpoint H:P    the nodes meet in rounds at the store served on H:P by the\n"
    "                         node that owns address H (node 0 of every round; the others\n"
    "                         connect); a failure anywhere restarts every node in a new\n"
    "                         round (default port 29400)\n"
    "  --rdzv-id ID           the job's identity at the store (default CIFAR_JOB_ID)\n"
    "  --rdzv-backend c10d    the only one (torchrun's default)\n"
    "  --rdzv-timeout S       seconds a round of MIN..MAX-1 nodes waits for one more (30)\n"
    "  --standalone           one node, nothing to meet (as torchrun's)\n"
    "  --node-rank R          this node's index in a static job (default 0)\n"
    "  --master-addr A        rank 0's host in a static job (default 127.0.0.1)\n"
    "  --master-port P        rank 0's port in a static job (default: a free one on one node)\n"
    "  --max-restarts N       restart after a failure up to N times (default 3), for the whole\n"
    "                         job with --rdzv-endpoint; never after a permanent one (exit\n"
    "                         status 2 or 3: every node ends with it)\n"
    "  --log-dir DIR          each worker's stdout and stderr, lines timestamped, also into\n"
    "                         DIR/attempt_K/rank_R.log (K: restarts so far, R: global rank)\n"
    "  --redirects S          with --log-dir, stream S only to the files: 1 stdout, 2 stderr,\n"
    "                         3 both, 0 none; or per local rank, 0:3,1:2 (default 0)\n"
    "  --tee S                the same syntax: streams to the files and the terminal (the\n"
    "                         default for both; wins over --redirects)\n"
    "  --local-ranks-filter L the local ranks whose lines reach the terminal, 0,2 (default\n"
    "                         all); rank 0's stdout always does (the snapshot's path)\n"
    "\n"
    "  --quiet                no progress output\n"
    "  -h, --help             this help\n"
    "  --version              the version\n"
    "\n" SETTINGS_HELP
    "  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT\n"
    "  (torchrun's), SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun's),\n"
    "  OMPI_COMM_WORLD_* (mpirun's)\n"
    "                         run as that rank of a job (launcher options are then ignored)\n"
    "  CIFAR_COMM_TIMEOUT=S   seconds a collective waits for a rank (300); then the run ends\n"
    "                         naming that rank (host, pid, last step)\n"
    "  CIFAR_JOB_ID=ID, CIFAR_JOB_TOKEN=SECRET\n"
    "                         the job's identity and shared secret at the rendezvous (and\n"
    "                         at the --rdzv-endpoint store)\n"
    "  CIFAR_RDZV_ROUND, TORCHELASTIC_RESTART_COUNT, GROUP_RANK, GROUP_WORLD_SIZE\n"
    "                         set by the launcher for its workers: the round (restarts so\n"
    "                         far), this node's rank and the nodes in the round\n"
    "  CIFAR_RENDEZVOUS_BIND=all|ADDR  where rank 0 listens (default: MASTER_ADDR)\n"
    "  CIFAR_PERMANENT_EXIT_STATUS=N   exit status of a permanent failure (1..125; 3)\n"
    "  CIFAR_CUDA_LIB=PATH, CIFAR_MPI_LIB=PATH, CIFAR_GLOO_LIB=PATH\n"
    "                         the GPU, MPI or Gloo library, if not beside the command\n"
    "  CIFAR_DNNL_LIB=PATH    oneDNN: the CPU's convolutions (AVX-512) and --precision bf16\n"
    "                         on the CPU (default libdnnl.so.2)\n"
    "  GLOO_SOCKET_IFNAME=IF  the network interface --comm gloo listens on (default: the\n"
    "                         address this machine reaches MASTER_ADDR from)\n"
    "  OMP_WAIT_POLICY, GOMP_SPINCOUNT  override the OpenMP wait policy chosen at start;\n"
    "  OPENBLAS_NUM_THREADS   1 unless set (the ops run BLAS inside their own threads)\n"
    "  CUDA_VISIBLE_DEVICES, NCCL_*     as for any CUDA or NCCL program\n"
    "\n"
    "Exit status: 0 done, 1 failed, 2 bad usage, 3 a permanent failure of a worker (a rank\n"
    "of a job: bad configuration, refused snapshot, bad data), 128+N stopped by signal N of\n"
    "--signals-to-handle after writing a snapshot (130 SIGINT, 143 SIGTERM, 138 SIGUSR1,\n"
    "129 SIGHUP), with no path on stdout: rerun the same command, or requeue the job, to\n"
    "resume.\n";

enum {
    OPT_EPOCHS = 256, OPT_SAVE_EVERY, OPT_BATCH, OPT_LR, OPT_MOMENTUM, OPT_NESTEROV, OPT_WD,
    OPT_SCHEDULE, OPT_WARMUP, OPT_SMOOTH, OPT_SEED, OPT_THREADS, OPT_RUN_DIR, OPT_DEVICE,
    OPT_NORMALIZE, OPT_KEEP, OPT_MODEL, OPT_PRECISION, OPT_DETERMINISTIC, OPT_QUIET, OPT_COMM,
    OPT_VAL_FRACTION, OPT_EARLY_STOP,
    OPT_SAVE_INTERVAL, OPT_SAVE_EVERY_STEPS, OPT_SIGNALS,
    OPT_AUGMENT, OPT_CROP_PADDING, OPT_CUTOUT, OPT_EMA, OPT_LOG_EVERY, OPT_EMA_WARMUP,
    OPT_FINE_TUNE, OPT_VERSION,
};

static const struct option long_options[] = {
    {"epochs", required_argument, 0, OPT_EPOCHS},
    {"save-every", required_argument, 0, OPT_SAVE_EVERY},
    {"batch-size", required_argument, 0, OPT_BATCH},
    {"lr", required_argument, 0, OPT_LR},
    {"momentum", required_argument, 0, OPT_MOMENTUM},
    {"nesterov", no_argument, 0, OPT_NESTEROV},
    {"weight-decay", required_argument, 0, OPT_WD},
    {"schedule", required_argument, 0, OPT_SCHEDULE},
    {"warmup-epochs", required_argument, 0, OPT_WARMUP},
    {"label-smoothing", required_argument, 0, OPT_SMOOTH},
    {"seed", required_argument, 0, OPT_SEED},
    {"threads", required_argument, 0, OPT_THREADS},
    {"run-dir", required_argument, 0, OPT_RUN_DIR},
    {"device", required_argument, 0, OPT_DEVICE},
    {"normalize", required_argument, 0, OPT_NORMALIZE},
    {"keep", required_argument, 0, OPT_KEEP},
    {"fine-tune", no_argument, 0, OPT_FINE_TUNE},
    {"model", required_argument, 0, OPT_MODEL},
    {"precision", required_argument, 0, OPT_PRECISION},
    {"deterministic", no_argument, 0, OPT_DETERMINISTIC},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"comm", required_argument, 0, OPT_COMM},
    {"val-fraction", required_argument, 0, OPT_VAL_FRACTION},
    {"early-stop", required_argument, 0, OPT_EARLY_STOP},
    {"save-interval", required_argument, 0, OPT_SAVE_INTERVAL},
    {"save-every-steps", required_argument, 0, OPT_SAVE_EVERY_STEPS},
    {"signals-to-handle", required_argument, 0, OPT_SIGNALS},
    {"augment", required_argument, 0, OPT_AUGMENT},
    {"crop-padding", required_argument, 0, OPT_CROP_PADDING},
    {"cutout", required_argument, 0, OPT_CUTOUT},
    {"ema", required_argument, 0, OPT_EMA},
    {"log-every", required_argument, 0, OPT_LOG_EVERY},
    {"ema-warmup", no_argument, 0, OPT_EMA_WARMUP},
    {"version", no_argument, 0, OPT_VERSION},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static const char *const normalize_names[] = {"dataset", "imagenet"};
static const char *const precision_names[] = {"fp32", "tf32", "bf16"};

static void train_options_default(TrainOptions *o) {
    memset(o, 0, sizeof *o);
    o->epochs = 30;
    o->save_every = 5;
    o->batch_size = 256;
    o->lr = 0.1;
    o->momentum = 0.9;
    o->weight_decay = 5e-4;
    o->schedule = SCHEDULE_COSINE;
    o->warmup_epochs = 1;
    o->run_dir = "run";
    o->device = DEVICE_AUTO;
    o->normalize = NORMALIZE_DATASET;
    o->keep = 3;
    o->precision = PRECISION_TF32;
    o->comm = -1;
    o->save_interval = 600; /* README "Snapshots": why ten minutes */
    char err[256];
    if (signal_set_parse(SIGNALS_DEFAULT_TEXT, &o->signals, err, sizeof err) != 0) die("%s", err);
    o->crop = o->flip = 1;
    o->crop_padding = 4;
    o->log_every = 50;
}

/* --augment LIST: crop and flip in any order, or none alone. */
static void augment_parse(TrainOptions *o, const char *list) {
    static const char *const names[] = {"crop", "flip", "none"};
    char buf[64];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf || buf[0] == '\0')
        die_usage("--augment: expected crop, flip, crop,flip or none, got '%s'", list);
    int seen[3] = {0, 0, 0};
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < 3 && strcmp(item, names[i]) != 0) i++;
        if (i == 3) die_usage("--augment: unknown augmentation '%s' (crop, flip or none)", item);
        seen[i]++;
    }
    if (seen[2] && (seen[0] || seen[1] || seen[2] > 1))
        die_usage("--augment: 'none' stands alone, got '%s'", list);
    o->crop = seen[0] > 0;
    o->flip = seen[1] > 0;
}

/* --ema DECAY: 0 (off) or a decay below 1. */
static double ema_parse(const char *name, const char *text) {
    double d = option_real(name, text, 0, 1);
    if (d >= 1) die_usage("--ema: the decay must be below 1 (0 = no average), got '%s'", text);
    return d;
}

/* The data path: the positional argument, else the last non-empty line on stdin
 * (the previous stage prints its output path last). */
static const char *data_path_from_stdin(void) {
    static char path[4096];
    fs_input_path_from_stdin("DATA.lmdb", path, sizeof path);
    return path;
}

void train_options_parse(TrainOptions *o, int argc, char **argv) {
    train_options_default(o);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        const char *name = c >= 256 ? long_options[c - 256].name : "";
        switch (c) {
        case OPT_EPOCHS: o->epochs = (int)option_int(name, optarg, 1, 1000000); break;
        case OPT_SAVE_EVERY: o->save_every = (int)option_int(name, optarg, 1, 1000000); break;
        case OPT_BATCH: o->batch_size = (int)option_int(name, optarg, 1, 65536); break;
        case OPT_LR: o->lr = option_real(name, optarg, 0, 100); break;
        case OPT_MOMENTUM: o->momentum = option_real(name, optarg, 0, 1); break;
        case OPT_NESTEROV: o->nesterov = 1; break;
        case OPT_WD: o->weight_decay = option_real(name, optarg, 0, 1); break;
        case OPT_SCHEDULE: o->schedule = (Schedule)option_choice(name, optarg, schedule_names, SCHEDULE_COUNT); break;
        case OPT_WARMUP: o->warmup_epochs = option_real(name, optarg, 0, 1e6); break;
        case OPT_SMOOTH: o->label_smoothing = option_real(name, optarg, 0, 0.999); break;
        case OPT_SEED: o->seed = (uint64_t)option_int(name, optarg, 0, (1LL << 62)); break;
        case OPT_THREADS: o->threads = (int)option_int(name, optarg, 1, 1024); break;
        case OPT_RUN_DIR:
            /* The snapshot's path is printed as the last stdout line (the pipeline
             * contract): a line break in it would make that line another path. */
            if (strpbrk(optarg, "\n\r"))
                die_usage("--run-dir: the folder name holds a line break, which would break the "
                          "last-line contract (the snapshot path is the last stdout line)");
            o->run_dir = optarg;
            break;
        case OPT_DEVICE: o->device = (DeviceChoice)option_choice(name, optarg, device_choice_names, 3); break;
        case OPT_NORMALIZE:
            o->normalize = (NormalizeChoice)option_choice(name, optarg, normalize_names, 2);
            break;
        case OPT_KEEP: o->keep = (int)option_int(name, optarg, 0, 1000000); break;
        case OPT_FINE_TUNE: o->fine_tune = 1; break;
        case OPT_MODEL: o->model_file = optarg; break;
        case OPT_PRECISION:
            o->precision = (Precision)option_choice(name, optarg, precision_names, 3);
            break;
        case OPT_DETERMINISTIC: o->deterministic = 1; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_COMM: {
            CommKind k;
            if (comm_kind_parse(optarg, &k) != 0 || k == COMM_SINGLE)
                die_usage("--comm: unknown value '%s' (shm | mpi | gloo | nccl)", optarg);
            o->comm = (int)k;
            break;
        }
        case OPT_VAL_FRACTION:
            o->val_fraction = option_real(name, optarg, 0, 1);
            if (o->val_fraction >= 1) die_usage("--val-fraction: expected a fraction below 1, got '%s'", optarg);
            break;
        case OPT_EARLY_STOP: o->early_stop = (int)option_int(name, optarg, 0, 1000000); break;
        case OPT_SAVE_INTERVAL: o->save_interval = option_duration(name, optarg, 1e6 * 3600); break;
        case OPT_SAVE_EVERY_STEPS:
            o->save_every_steps = option_int(name, optarg, 0, (1LL << 62));
            break;
        case OPT_SIGNALS: {
            char err[256];
            if (signal_set_parse(optarg, &o->signals, err, sizeof err) != 0) die_usage("%s", err);
            break;
        }
        case OPT_AUGMENT: augment_parse(o, optarg); break;
        case OPT_CROP_PADDING: o->crop_padding = (int)option_int(name, optarg, 0, 256); break;
        case OPT_CUTOUT: o->cutout = (int)option_int(name, optarg, 0, 4096); break;
        case OPT_EMA: o->ema_decay = ema_parse(name, optarg); break;
        case OPT_EMA_WARMUP: o->ema_warmup = 1; break;
        case OPT_LOG_EVERY: o->log_every = (int)option_int(name, optarg, 1, 1000000000); break;
        case 'h': fputs(usage_text, stdout); exit(0);
        case OPT_VERSION: version_print_and_exit();
        default: fputs("see `cifar-train --help`\n", stderr); exit(2);
        }
    }
    if (o->early_stop && o->val_fraction == 0)
        die_usage("--early-stop needs a validation split: give --val-fraction");
    if (o->ema_warmup && o->ema_decay == 0) die_usage("--ema-warmup: needs --ema DECAY (the average it warms up)");
    if (argc - optind > 1) die_usage("expected one DATA.lmdb, got %d arguments", argc - optind);
    o->data_path = optind < argc ? argv[optind] : data_path_from_stdin();
}

char *train_options_to_json(const TrainOptions *o) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "epochs", o->epochs);
    cJSON_AddNumberToObject(j, "batch_size", o->batch_size);
    cJSON_AddNumberToObject(j, "lr", o->lr);
    cJSON_AddNumberToObject(j, "momentum", o->momentum);
    cJSON_AddBoolToObject(j, "nesterov", o->nesterov);
    cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
    cJSON_AddStringToObject(j, "schedule", schedule_names[o->schedule]);
    cJSON_AddNumberToObject(j, "warmup_epochs", o->warmup_epochs);
    cJSON_AddNumberToObject(j, "label_smoothing", o->label_smoothing);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddStringToObject(j, "normalize", normalize_names[o->normalize]);
    cJSON_AddStringToObject(j, "precision", precision_names[o->precision]);
    if (o->val_fraction > 0) cJSON_AddNumberToObject(j, "val_fraction", o->val_fraction);
    if (o->early_stop) cJSON_AddNumberToObject(j, "early_stop", o->early_stop);
    const char *augment = o->crop && o->flip ? "crop,flip" : o->crop ? "crop" : o->flip ? "flip" : "none";
    cJSON_AddStringToObject(j, "augment", augment);
    cJSON_AddNumberToObject(j, "crop_padding", o->crop_padding);
    cJSON_AddNumberToObject(j, "cutout", o->cutout);
    cJSON_AddNumberToObject(j, "ema", o->ema_decay);
    cJSON_AddBoolToObject(j, "ema_warmup", o->ema_warmup);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    CHECK_ALLOC(text, 1024);
    return text;
}

LrSchedule train_lr_schedule(const TrainOptions *o) {
    LrSchedule s = {o->schedule, o->lr, o->warmup_epochs, o->epochs};
    return s;
}
