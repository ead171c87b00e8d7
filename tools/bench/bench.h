/*
 * The internal header of hvd-bench, the benchmark (tools/bench/). It holds
 * what the files of that folder share: the collectives, dtypes and
 * reduction operations it knows, the options, the backend table through
 * which hvd and MPI run the same code, and the model of --model. Each
 * group of declarations below names the file that defines it; main.c
 * tells how hvd-bench works as a whole. The header is part of the tool
 * only, neither of libhvd nor installed.
 */
#ifndef HVD_TOOLS_BENCH_BENCH_H
#define HVD_TOOLS_BENCH_BENCH_H

#include <hvd/hvd.h>

#include <stddef.h>
#include <stdio.h>

enum coll {
    COLL_ALLREDUCE,
    COLL_ALLGATHER,
    COLL_BROADCAST,
    COLL_ALLTOALL,
    COLL_REDUCESCATTER,
    NUM_COLLS
};

struct dtype_info {
    hvd_dtype dtype;
    const char *name;
    const char *alias;
    /* The largest integer the type holds exactly, with all smaller ones. */
    long max_exact;
};

struct op_info {
    hvd_op op;
    const char *name;
    const char *alias;
};

struct options {
    int run[NUM_COLLS];
    size_t minbytes;
    size_t maxbytes;
    size_t stepfactor;
    const struct dtype_info *dtype;
    const struct op_info *redop;
    int iters;
    int warmup;
    int inplace;
    int root;
    int check;
    const char *backend;
    const char *compare;    /* "mpi": MPI's collective after hvd's, or NULL */
    const char *csv;        /* --csv FILE, or NULL */
    const char *plot;       /* --plot FILE.png, or NULL */
    const char *model;      /* NULL: the sweep */
    const char *model_file; /* NULL: the model's file in shared/data */
    int memcpy;             /* --memcpy: the memory bandwidth instead */
};

/* ---- main.c ---- */

/* This process's place in the job, set by the backend's init. */
extern int g_rank;
extern int g_size;

/* ---- options.c: the command line and the tables it names ---- */

extern const char *const coll_names[NUM_COLLS];
extern const struct dtype_info dtypes[8];
extern const struct op_info redops[5];

/* 0 on success; -1 after printing why. */
int parse_args(int argc, char **argv, struct options *o);

/* ---- backend.c: the hvd and MPI backends, and which one runs ---- */

/*
 * Each member either succeeds or prints why (the library's own text) and
 * exits 1; the benchmark has nothing to clean up that exit does not.
 */
struct backend {
    const char *name;
    /** Joins the job and sets g_rank and g_size. */
    void (*init)(int *argc, char ***argv);
    void (*finalize)(void);
    /** sendbuf == recvbuf means in place. */
    void (*allreduce)(const void *sendbuf, void *recvbuf, size_t count,
                      hvd_dtype dtype, hvd_op op);
    /** In place when sendbuf == recvbuf + g_rank * count elements. */
    void (*allgather)(const void *sendbuf, void *recvbuf, size_t count,
                      hvd_dtype dtype);
    void (*broadcast)(void *buf, size_t count, hvd_dtype dtype, int root);
    /** count elements to every rank and from every rank (MPI_Alltoallv's
     * counts all equal). */
    void (*alltoall)(const void *sendbuf, void *recvbuf, size_t count,
                     hvd_dtype dtype);
    /** count elements in; this rank's hvd_reducescatter_count block out. */
    void (*reducescatter)(const void *sendbuf, void *recvbuf, size_t count,
                          hvd_dtype dtype, hvd_op op);
    void (*barrier)(void);
};

extern const struct backend hvd_backend;

/* Prints the failed call, the status and the library's last error, and
 * exits 1. */
void bench_hvd_check(const char *call, hvd_status s);
#ifdef HVD_BENCH_WITH_MPI
/* Prints MPI's text for rc and aborts the job. */
void bench_mpi_check(const char *call, int rc);
#endif
/* MPI's backend when --compare mpi, else NULL. */
const struct backend *compare_backend(const struct options *o);
/* Picks the backend and rejects what it cannot run, before init. */
const struct backend *choose_backend(const struct options *o);

/* ---- sweep.c: the sizes sweep, its values, table, CSV and plot ---- */

struct totals {
    double busbw_sum;
    int rows;
    long long wrong;
};

/* Where the rows go besides stdout (rank 0). */
extern FILE *g_csv;

double now_s(void);
void bench_coll(const struct backend *be, const struct options *o,
                enum coll coll, unsigned char *sendbuf, unsigned char *recvbuf,
                struct totals *t);
/* Draws busbw against size from the CSV at csv_path into png (rank 0).
 * Returns 0, or 1 after printing why. */
int plot(const struct options *o, const char *csv_path);

/* ---- model.c: --model ---- */

struct tensor {
    char *name; /* "grad.<name>", the operation's name */
    size_t count;
    float *buf; /* the gradient, reduced in place */
};

struct model {
    char *path;
    struct tensor *t; /* forward order; backward is t[n - 1] .. t[0] */
    int n;
    size_t total; /* elements over all tensors */
};

void model_free(struct model *m);
/* Reads the tensor list (before hvd_init: every rank reads its own copy,
 * and the engine reports a mismatch if they differ). Returns 0, or -1
 * after printing why. */
int model_load(const struct options *o, struct model *m);
/* Returns the exit status: 0, or 1 if a value was wrong. */
int bench_model(const struct options *o, struct model *m);

/* ---- membw.c: --memcpy ---- */

/* Prints memcpy's bandwidth on one and two threads. Returns the exit
 * status: 0, or 1 after printing why. */
int bench_memcpy(const struct options *o);

#endif /* HVD_TOOLS_BENCH_BENCH_H */
