/*
 * The environment hvdrun gives its ranks: hvdrun's own, less other
 * launchers' variables, plus the --config-file settings, the -x variables
 * and the options that set HVD_* variables. A separate file because both
 * ways of starting ranks read it: fork/exec takes it as environ, the ssh
 * wrapper exports its HVD_* and -x variables, and --mpi passes them to
 * mpirun.
 */
#include "tools/hvdrun/hvdrun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/base/env.h"
#include "transport/base/log.h"

/* Variables hvdrun sets for each rank; -x cannot override them. */
const char *const job_vars[] = {
    "HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE",
    "HVD_CROSS_RANK", "HVD_CROSS_SIZE", "HVD_RENDEZVOUS_ADDR",
    "HVD_RENDEZVOUS_PORT", "HVD_SECRET", "HVD_JOB_ID",
    /* What horovodrun (Gloo) sets, for
     * scripts and tests that read it. */
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"};

/* Variables of other launchers that the library would otherwise read.
 * torch's MASTER_ADDR and MASTER_PORT stay: without RANK and WORLD_SIZE
 * they name no job to hvd, and an application may use them itself. */
const char *const foreign_vars[] = {
    "PMI_RANK",         "PMI_SIZE",   "SLURM_PROCID",    "SLURM_NTASKS",
    "SLURM_LOCALID",    "RANK",       "WORLD_SIZE",      "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"};
const char foreign_prefix[] = "OMPI_COMM_WORLD_";

/* ---- environment ---- */

ssize_t env_find(const struct env *e, const char *name, size_t len) {
    for (size_t k = 0; k < e->n; k++) {
        if (strncmp(e->vars[k], name, len) == 0 && e->vars[k][len] == '=')
            return (ssize_t)k;
    }
    return -1;
}

const char *env_get(const struct env *e, const char *name) {
    size_t len = strlen(name);
    ssize_t k = env_find(e, name, len);

    return k < 0 ? NULL : e->vars[k] + len + 1;
}

/* Adds var ("NAME=VALUE", now owned by e), replacing NAME's old value. */
static int env_put(struct env *e, char *var) {
    ssize_t k = env_find(e, var, strcspn(var, "="));

    if (k >= 0) {
        free(e->vars[k]);
        e->vars[k] = var;
        return 0;
    }
    if (e->n + 1 >= e->cap) {
        size_t cap = e->cap == 0 ? 64 : 2 * e->cap;
        char **vars = realloc(e->vars, cap * sizeof(*vars));
        if (vars == NULL) {
            free(var);
            return -1;
        }
        e->vars = vars;
        e->cap = cap;
    }
    e->vars[e->n++] = var;
    e->vars[e->n] = NULL;
    return 0;
}

int env_set(struct env *e, const char *name, const char *value) {
    char *var;

    if (asprintf(&var, "%s=%s", name, value) < 0)
        return -1;
    return env_put(e, var);
}

int env_set_int(struct env *e, const char *name, long value) {
    char text[24];

    snprintf(text, sizeof(text), "%ld", value);
    return env_set(e, name, text);
}

/* Removes every variable whose "NAME=VALUE" starts with prefix. */
static void env_unset_prefix(struct env *e, const char *prefix) {
    size_t len = strlen(prefix);
    size_t kept = 0;

    for (size_t k = 0; k < e->n; k++) {
        if (strncmp(e->vars[k], prefix, len) == 0)
            free(e->vars[k]);
        else
            e->vars[kept++] = e->vars[k];
    }
    e->n = kept;
    if (e->vars != NULL)
        e->vars[kept] = NULL;
}

void env_unset(struct env *e, const char *name) {
    ssize_t k = env_find(e, name, strlen(name));

    if (k < 0)
        return;
    free(e->vars[k]);
    memmove(&e->vars[k], &e->vars[k + 1],
            (e->n - (size_t)k) * sizeof(*e->vars));
    e->n--;
}

void env_free(struct env *e) {
    for (size_t k = 0; k < e->n; k++)
        free(e->vars[k]);
    free(e->vars);
    memset(e, 0, sizeof(*e));
}

/* Reads --config-file into *cv and warns of its notes; says why not. */
int config_read(const struct options *opt, hvd_config_vars *cv) {
    char err[512];

    if (hvd_config_file_read(opt->config_file, cv, err, sizeof(err)) != 0) {
        say("--config-file %s: %s", opt->config_file, err);
        return -1;
    }
    for (size_t k = 0; k < cv->nnotes; k++)
        HVD_WARN("hvdrun", "--config-file %s: %s", opt->config_file,
                 cv->notes[k]);
    return 0;
}

/* 1 if the configuration file's var ("HVD_NAME=value") is set neither in
 * its HVD_ nor in its HOROVOD_ form where get looks. */
int config_var_unset(const char *var,
                     const char *(*get)(void *ctx, const char *name),
                     void *ctx) {
    char name[128];
    const char *alias;

    snprintf(name, sizeof(name), "%.*s", (int)strcspn(var, "="), var);
    alias = hvd_env_horovod_name(name);
    return get(ctx, name) == NULL && (alias == NULL || get(ctx, alias) == NULL);
}

static const char *env_lookup(void *e, const char *name) {
    return env_get(e, name);
}

const char *environ_lookup(void *unused, const char *name) {
    (void)unused;
    return getenv(name);
}

/* hvdrun's environment, less other launchers' variables, plus the
 * configuration file, -x and the options that set variables. Returns 0, -1
 * out of memory, -2 for a bad configuration file (said why). */
int env_build(struct env *e, const struct options *opt) {
    char *var;

    for (char **v = environ; *v != NULL; v++) {
        if (strchr(*v, '=') == NULL)
            continue;
        if ((var = strdup(*v)) == NULL || env_put(e, var) != 0)
            return -1;
    }
    env_unset_prefix(e, foreign_prefix);
    for (size_t k = 0; k < ARRAY_LEN(foreign_vars); k++) {
        if (asprintf(&var, "%s=", foreign_vars[k]) < 0)
            return -1;
        env_unset_prefix(e, var);
        free(var);
    }

    /* The configuration file: below hvdrun's own environment (a variable
     * already set, in its HVD_ or HOROVOD_ form, wins) and below -x. */
    if (opt->config_file != NULL) {
        hvd_config_vars cv;

        if (config_read(opt, &cv) != 0)
            return -2;
        for (size_t k = 0; k < cv.n; k++) {
            if (!config_var_unset(cv.vars[k], env_lookup, e))
                continue;
            if ((var = strdup(cv.vars[k])) == NULL || env_put(e, var) != 0) {
                hvd_config_vars_free(&cv);
                return -1;
            }
        }
        hvd_config_vars_free(&cv);
    }

    for (int k = 0; k < opt->nexports; k++) {
        const char *arg = opt->exports[k];

        if (strchr(arg, '=') != NULL) {
            var = strdup(arg);
        } else {
            const char *value = getenv(arg);
            if (value == NULL) {
                HVD_WARN("hvdrun", "-x %s: %s is not set; not passed on", arg,
                         arg);
                continue;
            }
            if (asprintf(&var, "%s=%s", arg, value) < 0)
                var = NULL;
        }
        if (var == NULL || env_put(e, var) != 0)
            return -1;
    }

    if (opt->iface != NULL && env_set(e, "HVD_IFACE", opt->iface) != 0)
        return -1;
    if (opt->start_timeout_s > 0 &&
        env_get(e, "HVD_START_TIMEOUT_SECONDS") == NULL &&
        env_set_int(e, "HVD_START_TIMEOUT_SECONDS", opt->start_timeout_s) != 0)
        return -1;
    return 0;
}
