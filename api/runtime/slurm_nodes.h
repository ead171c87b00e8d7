/*
 * Slurm's compressed lists, as srun and sbatch put them in the environment:
 * host lists ("node[10-12,20]", "rack[1-2]-n[01-02],login") and task counts
 * per node ("2(x3),1"). Both are expanded in Slurm's order, with at most
 * HVD_SLURM_MAX_NODES entries: a longer list is an error, not gigabytes of
 * names.
 */
#ifndef HVD_API_SLURM_NODES_H
#define HVD_API_SLURM_NODES_H

#include <stddef.h>

#include "hvd/types.h"

#define HVD_SLURM_MAX_NODES 65536
/* The longest host name accepted, without its NUL. */
#define HVD_SLURM_MAX_NAME 255

/* Expanded host names: names[k] points into one buffer. */
typedef struct hvd_slurm_nodes {
    char **names;
    size_t n;
} hvd_slurm_nodes;

/*
 * Expands the host list text, the value of the variable var (named in the
 * sentence of HVD_ERR_INVALID_ARG for a malformed list, with the value).
 * Bracket groups hold numbers and ranges ("1-3", zero padding kept); a name
 * may hold several, the leftmost varying slowest. On success *out owns the
 * names (hvd_slurm_nodes_free).
 */
hvd_status hvd_slurm_nodes_expand(const char *var, const char *text,
                                  hvd_slurm_nodes *out);
void hvd_slurm_nodes_free(hvd_slurm_nodes *nodes);

/* Index of name in nodes, or -1. */
long hvd_slurm_nodes_find(const hvd_slurm_nodes *nodes, const char *name);

/*
 * Expands a task count per node ("2(x3),1" is 2, 2, 2, 1) into a malloc'd
 * array of *n_out counts (each 1 or more). HVD_ERR_INVALID_ARG names var and
 * the value when it is malformed.
 */
hvd_status hvd_slurm_tasks_expand(const char *var, const char *text,
                                  int **counts_out, size_t *n_out);

#endif
