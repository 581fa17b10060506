/* A 2-D heat equation (Jacobi sweeps) in C/OpenMP, a user's own application for the TOML
 * workload tests and docs/plugins.md.
 *
 *   heat --n N [--block B] [--steps S]
 *
 * N x N interior points, the top edge held at 1, the others at 0. The sweeps go block by
 * block (B x B tiles, the knob), the block rows shared among OpenMP threads. Under mpiexec
 * every rank solves its own strip of N / PMI_SIZE rows (fixed edges, no halo exchange: a
 * stand-in for a domain decomposition, with no MPI library needed; under srun,
 * SLURM_PROCID / SLURM_NTASKS). Each rank prints
 *   rank=<r> time=<seconds of its sweeps> error=<max |blocked - plain sweeps|>
 * where the plain sweeps (untimed) are the reference: the two must agree exactly. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double *grid(int rows, int cols) {
    double *g = calloc((size_t)(rows + 2) * (cols + 2), sizeof(double));
    if (!g) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (int j = 0; j < cols + 2; j++) g[j] = 1.0; /* top edge */
    return g;
}

#define AT(g, i, j) (g)[(size_t)(i) * (cols + 2) + (j)]

static void sweep_blocked(const double *a, double *b, int rows, int cols, int block) {
    #pragma omp parallel for schedule(static)
    for (int bi = 1; bi <= rows; bi += block)
        for (int bj = 1; bj <= cols; bj += block)
            for (int i = bi; i < bi + block && i <= rows; i++)
                for (int j = bj; j < bj + block && j <= cols; j++)
                    AT(b, i, j) = 0.25 * (AT(a, i - 1, j) + AT(a, i + 1, j) +
                                          AT(a, i, j - 1) + AT(a, i, j + 1));
}

static void sweep_plain(const double *a, double *b, int rows, int cols) {
    for (int i = 1; i <= rows; i++)
        for (int j = 1; j <= cols; j++)
            AT(b, i, j) = 0.25 * (AT(a, i - 1, j) + AT(a, i + 1, j) +
                                  AT(a, i, j - 1) + AT(a, i, j + 1));
}

static double *solve(int rows, int cols, int steps, int block) {
    double *a = grid(rows, cols), *b = grid(rows, cols);
    for (int s = 0; s < steps; s++) {
        if (block > 0) sweep_blocked(a, b, rows, cols, block);
        else sweep_plain(a, b, rows, cols);
        double *t = a; a = b; b = t;
    }
    free(b);
    return a;
}

int main(int argc, char **argv) {
    int n = 0, block = 32, steps = 20;
    for (int k = 1; k + 1 < argc; k += 2) {
        if (!strcmp(argv[k], "--n")) n = atoi(argv[k + 1]);
        else if (!strcmp(argv[k], "--block")) block = atoi(argv[k + 1]);
        else if (!strcmp(argv[k], "--steps")) steps = atoi(argv[k + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[k]); return 2; }
    }
    if (n < 1 || block < 1 || steps < 1) {
        fprintf(stderr, "usage: heat --n N [--block B] [--steps S] (all positive)\n");
        return 2;
    }
    /* mpiexec (PMI) or srun (SLURM_*) says which rank this is; alone it is rank 0 of 1. */
    const char *r = getenv("PMI_RANK"), *p = getenv("PMI_SIZE");
    if (!r || !p) { r = getenv("SLURM_PROCID"); p = getenv("SLURM_NTASKS"); }
    int rank = r ? atoi(r) : 0, size = p ? atoi(p) : 1;
    int rows = n / size + (rank < n % size ? 1 : 0), cols = n;
    if (rows < 1) rows = 1;

    double start = omp_get_wtime();
    double *fast = solve(rows, cols, steps, block);
    double seconds = omp_get_wtime() - start;
    double *ref = solve(rows, cols, steps, 0);
    double error = 0.0;
    for (size_t k = 0; k < (size_t)(rows + 2) * (cols + 2); k++)
        error = fmax(error, fabs(fast[k] - ref[k]));
    printf("rank=%d threads=%d time=%.9f error=%.3e\n", rank, omp_get_max_threads(), seconds,
           error);
    free(fast);
    free(ref);
    return 0;
}
