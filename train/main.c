/* cifar-train: data-parallel training from a cifar-prep LMDB.
 *
 * A process started with RANK/WORLD_SIZE/... in its environment (by our own
 * launcher, torchrun, srun or mpirun) is a worker and trains. Otherwise, with
 * launcher options (--nproc-per-node, --nnodes, ...) it becomes the launcher:
 * it starts the workers as fresh processes and restarts the group when one
 * fails. Alone and without them, it simply trains in this process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "train.h"

int main(int argc, char **argv) {
    log_set_program("cifar-train");
    DistEnv env;
    char err[256];
    if (dist_env_read(&env, err, sizeof err) != 0) die_usage("%s", err);
    TrainOptions o;
    train_options_parse(&o, argc, argv);
    log_set_quiet(o.quiet);
    train_install_signal_handlers();
    return train_worker(&o, &env);
}
