/*
 * hvd-bench's command line: the --help text, parse_args() with its checks
 * of each value, and the tables of the collectives, dtypes and reduction
 * operations that the options name. Everything here runs before the
 * backend's init, so a mistake is reported before the job starts.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const coll_names[NUM_COLLS] = {
    "allreduce", "allgather", "broadcast", "alltoall", "reducescatter"};

const struct dtype_info dtypes[] = {
    {HVD_UINT8, "uint8", "uint8", 255},
    {HVD_INT8, "int8", "int8", 127},
    {HVD_INT32, "int32", "int", 1L << 30},
    {HVD_INT64, "int64", "int64", 1L << 30},
    {HVD_FLOAT16, "float16", "half", 2048},
    {HVD_BFLOAT16, "bfloat16", "bf16", 256},
    {HVD_FLOAT32, "float32", "float", 1L << 24},
    {HVD_FLOAT64, "float64", "double", 1L << 30},
};
#define NUM_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const struct op_info redops[] = {
    {HVD_SUM, "sum", "sum"},          {HVD_AVERAGE, "avg", "average"},
    {HVD_MIN, "min", "min"},          {HVD_MAX, "max", "max"},
    {HVD_PRODUCT, "prod", "product"},
};
#define NUM_REDOPS (sizeof(redops) / sizeof(redops[0]))

/* ------------------------------------------------------------------ */
/* Command line                                                        */

static void usage(FILE *f) {
    fprintf(f,
            "usage: hvd-bench [options]\n"
            "  --op allreduce|allgather|broadcast|alltoall|reducescatter|all\n"
            "                                                   (allreduce)\n"
            "  --minbytes N     smallest size, K/M/G suffixes   (8)\n"
            "  --maxbytes N     largest size                    (256M)\n"
            "  --stepfactor N   size multiplier between rows    (4)\n"
            "  --dtype T        uint8 int8 int32 int64 float16 bfloat16\n"
            "                   float32 float64                 (float32)\n"
            "  --redop OP       sum avg min max prod            (sum)\n"
            "  --iters N        timed iterations per size       (20)\n"
            "  --warmup N       untimed iterations before them  (5)\n"
            "  --inplace        in place (allreduce then uses min or max,\n"
            "                   the ops whose result repeats; sum, avg and\n"
            "                   prod become max)\n"
            "  --root R         broadcast root                  (0)\n"
            "  --check 0|1      check every result element      (1)\n"
            "  --backend hvd|mpi                                (hvd)\n"
            "  --compare mpi    also run MPI's collective on the same\n"
            "                   buffers after hvd's, print its busbw and\n"
            "                   the ratio hvd/MPI (under mpirun)\n"
            "  --csv FILE       one row per size: op,bytes,count,dtype,\n"
            "                   time_us,algbw,busbw,wrong,path[,mpi_busbw,\n"
            "                   ratio]\n"
            "  --plot FILE.png  busbw against size (gnuplot)\n"
            "  --model resnet50 instead of the sweep: per-tensor gradient\n"
            "                   allreduces of one training step against one\n"
            "                   pre-fused allreduce, then cached 4-byte\n"
            "                   latency against the bare collective (hvd\n"
            "                   backend; --iters (10) and --warmup (3) count\n"
            "                   steps; the sweep's other options do not\n"
            "                   apply)\n"
            "  --model-file P   the model's tensor list, name<TAB>shape<TAB>\n"
            "                   elements per line, forward order\n"
            "                   (shared/data/<model>_params.tsv)\n"
            "  --memcpy         instead of the sweep: memcpy bandwidth of\n"
            "                   --maxbytes buffers on one thread, then on\n"
            "                   two at once (run alone, no mpirun)\n"
            "  --help\n"
            "Size is the per-rank buffer (allreduce, broadcast, what a rank\n"
            "sends in alltoall, its input in reducescatter) or the total\n"
            "received (allgather), as in nccl-tests.\n");
}

static int parse_size(const char *s, size_t *size_out) {
    unsigned long long v, mult = 1;
    char *end;

    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        mult = 1ULL << 10;
        end++;
        break;
    case 'M':
    case 'm':
        mult = 1ULL << 20;
        end++;
        break;
    case 'G':
    case 'g':
        mult = 1ULL << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0' || v > SIZE_MAX / mult)
        return -1;
    *size_out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int min, int *value_out) {
    char *end;
    long v;

    if (s == NULL)
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < min || v > INT_MAX)
        return -1;
    *value_out = (int)v;
    return 0;
}

/* 0 on success; -1 after printing why. */
int parse_args(int argc, char **argv, struct options *o) {
    int i;
    size_t k;

    for (i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 0, step = 0;

        if (strcmp(opt, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(opt, "--inplace") == 0) {
            o->inplace = 1;
            ok = 1;
        } else if (strcmp(opt, "--memcpy") == 0) {
            o->memcpy = 1;
            ok = 1;
        } else if (val == NULL) {
            ok = 0;
        } else if (strcmp(opt, "--op") == 0) {
            step = 1;
            memset(o->run, 0, sizeof(o->run));
            for (k = 0; k < NUM_COLLS; k++)
                if (strcmp(val, coll_names[k]) == 0 ||
                    strcmp(val, "all") == 0) {
                    o->run[k] = 1;
                    ok = 1;
                }
        } else if (strcmp(opt, "--minbytes") == 0) {
            step = 1;
            ok = parse_size(val, &o->minbytes) == 0;
        } else if (strcmp(opt, "--maxbytes") == 0) {
            step = 1;
            ok = parse_size(val, &o->maxbytes) == 0;
        } else if (strcmp(opt, "--stepfactor") == 0) {
            step = 1;
            ok = parse_size(val, &o->stepfactor) == 0 && o->stepfactor >= 2;
        } else if (strcmp(opt, "--dtype") == 0) {
            step = 1;
            for (k = 0; k < NUM_DTYPES; k++)
                if (strcmp(val, dtypes[k].name) == 0 ||
                    strcmp(val, dtypes[k].alias) == 0) {
                    o->dtype = &dtypes[k];
                    ok = 1;
                }
        } else if (strcmp(opt, "--redop") == 0) {
            step = 1;
            for (k = 0; k < NUM_REDOPS; k++)
                if (strcmp(val, redops[k].name) == 0 ||
                    strcmp(val, redops[k].alias) == 0) {
                    o->redop = &redops[k];
                    ok = 1;
                }
        } else if (strcmp(opt, "--iters") == 0) {
            step = 1;
            ok = parse_int(val, 1, &o->iters) == 0;
        } else if (strcmp(opt, "--warmup") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->warmup) == 0;
        } else if (strcmp(opt, "--root") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->root) == 0;
        } else if (strcmp(opt, "--check") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->check) == 0 && o->check <= 1;
        } else if (strcmp(opt, "--backend") == 0) {
            step = 1;
            o->backend = val;
            ok = strcmp(val, "hvd") == 0 || strcmp(val, "mpi") == 0;
        } else if (strcmp(opt, "--compare") == 0) {
            step = 1;
            o->compare = val;
            ok = strcmp(val, "mpi") == 0;
        } else if (strcmp(opt, "--csv") == 0) {
            step = 1;
            o->csv = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--plot") == 0) {
            step = 1;
            o->plot = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--model") == 0) {
            step = 1;
            o->model = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--model-file") == 0) {
            step = 1;
            o->model_file = val;
            ok = *val != '\0';
        }
        if (!ok) {
            if (val != NULL && step)
                fprintf(stderr, "hvd-bench: bad value for %s: %s\n", opt, val);
            else
                fprintf(stderr,
                        "hvd-bench: unknown option or missing value: "
                        "%s\n",
                        opt);
            usage(stderr);
            return -1;
        }
        i += step;
    }
    if (o->minbytes == 0 || o->minbytes > o->maxbytes) {
        fprintf(stderr, "hvd-bench: need 0 < --minbytes <= --maxbytes\n");
        return -1;
    }
    if (o->inplace && (o->run[COLL_ALLTOALL] || o->run[COLL_REDUCESCATTER])) {
        fprintf(stderr, "hvd-bench: --inplace is for allreduce, allgather "
                        "and broadcast; alltoall and reducescatter run out "
                        "of place\n");
        return -1;
    }
    if (o->model_file != NULL && o->model == NULL) {
        fprintf(stderr, "hvd-bench: --model-file needs --model NAME (the "
                        "name the report gives the model)\n");
        return -1;
    }
    if (o->model != NULL && o->model_file == NULL &&
        strcmp(o->model, "resnet50") != 0) {
        fprintf(stderr,
                "hvd-bench: unknown --model %s (built in: resnet50); give "
                "its tensor list with --model-file PATH\n",
                o->model);
        return -1;
    }
    /* A model step is far longer than one sweep iteration. */
    if (o->iters < 0)
        o->iters = o->model != NULL ? 10 : 20;
    if (o->warmup < 0)
        o->warmup = o->model != NULL ? 3 : 5;
    return 0;
}
