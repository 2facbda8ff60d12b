/* What a traced process costs at start: runs PROG ARGS N times under each
 * configuration in turn (interleaved, so that every configuration sees the
 * same spells of machine noise) and prints the best and the median wall
 * time.  A configuration is a comma-separated list of KEY=VALUE added to
 * the environment (the LD_*, FTRAMP_* of the caller's are removed), or "-"
 * for none.  Used by scripts/startup-cost.sh; see README "Clock". */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s N 'CONFIG'... -- PROG ARGS...\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]), nc = 0;
    while (2 + nc < argc && strcmp(argv[2 + nc], "--"))
        nc++;
    char **prog = argv + 3 + nc;
    if (n < 1 || nc < 1 || 3 + nc >= argc) {
        fprintf(stderr, "usage: %s N 'CONFIG'... -- PROG ARGS...\n", argv[0]);
        return 2;
    }
    double *t = calloc((size_t)n * nc, sizeof *t);
    int nenv = 0;
    for (char **e = environ; *e; e++)
        nenv++;
    char **envs = calloc(nenv + 64, sizeof *envs);
    for (int r = 0; r < n; r++)
        for (int c = 0; c < nc; c++) {
            int k = 0;
            for (char **e = environ; *e; e++)
                if (strncmp(*e, "LD_", 3) && strncmp(*e, "FTRAMP_", 7))
                    envs[k++] = *e;
            char *conf = strdup(argv[2 + c]);
            if (strcmp(conf, "-"))
                for (char *s = strtok(conf, ","); s && k < nenv + 63; s = strtok(NULL, ","))
                    envs[k++] = s;
            envs[k] = NULL;
            pid_t p;
            double t0 = now_ms();
            if (posix_spawn(&p, prog[0], NULL, NULL, prog, envs)) {
                perror(prog[0]);
                return 1;
            }
            int st;
            waitpid(p, &st, 0);
            t[c * n + r] = now_ms() - t0;
            free(conf);
        }
    for (int c = 0; c < nc; c++) {
        qsort(t + c * n, n, sizeof *t, cmp);
        printf("best %7.3f ms  median %7.3f ms  %s\n", t[c * n], t[c * n + n / 2], argv[2 + c]);
    }
    return 0;
}
