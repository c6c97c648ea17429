/* omp_env.h: OpenMP settings that must be in the environment before the
 * process starts (libgomp reads them once, at load time). */
#ifndef CIFAR_OMP_ENV_H
#define CIFAR_OMP_ENV_H

/* Unless the user chose OMP_WAIT_POLICY, set it to "passive" and re-execute this
 * program with the same arguments (stdin and signals are untouched: call it first
 * thing in main). Why: the CPU ops run many short parallel regions; with the
 * default spinning wait, a thread that the OS deschedules (any other load on
 * the machine, or more threads than free cores) stalls every barrier, and one
 * step was measured 5 to 50 times slower on this project's 2-core machines;
 * passive waiting cost nothing measurable when the machine was idle.
 * Returns only when no re-execution was needed (or it failed). */
void omp_env_prefer_passive(int argc, char **argv);

#endif
