/*
 * Fuzz target: what hvd reads from its environment and hvdrun from its
 * host lists.
 *
 *   byte 0 (mod 3) selects:
 *   0  an environment: the rest is lines NAME=VALUE, given to
 *      hvd_config_load (api/runtime/config.c) and hvd_discover
 * (api/runtime/discovery.c) through their lookup function, as getenv() would
 * answer, and every value to the HVD_* value parsers (transport/base/env.c). A
 *      configuration or a process description that is accepted must be
 *      consistent (rank < size, local rank < local size, sizes in range).
 *   1  a hostfile's text (tools/hostfile.c)
 *   2  an -H list
 *   For 1 and 2, what is accepted must be non-empty names without the
 *   characters refused, with 1 to HVD_HOST_MAX_SLOTS slots each.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/config.h"
#include "api/runtime/discovery.h"
#include "tools/hostfile.h"
#include "transport/base/env.h"

#define MAX_VARS 64

struct fake_env {
    char *names[MAX_VARS];
    char *values[MAX_VARS];
    int n;
};

static const char *lookup(const char *name, void *ctx) {
    const struct fake_env *e = ctx;

    /* The last definition wins, as with putenv in order. */
    for (int i = e->n - 1; i >= 0; i--)
        if (strcmp(e->names[i], name) == 0)
            return e->values[i];
    return NULL;
}

static void environment(const uint8_t *data, size_t size) {
    struct fake_env e = {.n = 0};
    char *text = malloc(size + 1), *save = NULL;
    hvd_config cfg;
    hvd_procinfo pi;

    if (text == NULL)
        return;
    memcpy(text, data, size);
    text[size] = '\0';
    for (char *line = strtok_r(text, "\n", &save);
         line != NULL && e.n < MAX_VARS; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        e.names[e.n] = line;
        e.values[e.n] = eq + 1;
        e.n++;
    }
    for (int i = 0; i < e.n; i++) {
        long l;
        uint64_t b;
        int v;
        hvd_env_parse_long(e.names[i], e.values[i], -5, 1L << 40, &l);
        hvd_env_parse_bytes(e.names[i], e.values[i], &b);
        hvd_env_parse_bool(e.names[i], e.values[i], &v);
    }
    if (hvd_config_load(lookup, &e, &cfg) == HVD_OK) {
        if (cfg.timeout_ns <= 0 || cfg.start_timeout_ns <= 0 ||
            cfg.comm.depth < 1 || cfg.comm.chunk_bytes < 64 ||
            cfg.cache_capacity < 0 ||
            memchr(cfg.transport, '\0', sizeof(cfg.transport)) == NULL ||
            memchr(cfg.hostname, '\0', sizeof(cfg.hostname)) == NULL)
            __builtin_trap();
    }
    if (hvd_discover(lookup, &e, &pi) == HVD_OK) {
        if (pi.size < 1 || pi.rank < 0 || pi.rank >= pi.size ||
            (pi.local_rank >= 0 && pi.local_size >= 0 &&
             pi.local_rank >= pi.local_size) ||
            pi.local_size > pi.size || pi.local_rank >= pi.size ||
            pi.cross_rank >= pi.size || pi.cross_size > pi.size ||
            (pi.cross_rank >= 0 && pi.cross_size >= 0 &&
             pi.cross_rank >= pi.cross_size) ||
            (pi.rdv_addr[0] != '\0' &&
             (pi.rdv_port < 1 || pi.rdv_port > 65535)) ||
            memchr(pi.secret, '\0', sizeof(pi.secret)) == NULL)
            __builtin_trap();
    }
    free(text);
}

static void check_hosts(const hvd_hostlist *l) {
    for (int h = 0; h < l->n; h++) {
        const char *name = l->v[h].name;
        if (name[0] == '\0' || name[0] == '-' || l->v[h].slots < 1 ||
            l->v[h].slots > HVD_HOST_MAX_SLOTS)
            __builtin_trap();
        for (const char *c = name; *c; c++)
            if ((unsigned char)*c <= ' ' || *c == ',' || *c == '\'' ||
                *c == '"' || *c == 0x7f)
                __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hvd_hostlist l = {0};
    char err[512];

    if (size < 1)
        return 0;
    switch (data[0] % 3) {
    case 0:
        environment(data + 1, size - 1);
        break;
    case 1:
        if (hvd_hostlist_parse_text(&l, (const char *)data + 1, size - 1,
                                    "hosts", err, sizeof(err)) == 0)
            check_hosts(&l);
        break;
    default: {
        char *text = malloc(size);
        if (text == NULL)
            break;
        memcpy(text, data + 1, size - 1);
        text[size - 1] = '\0';
        if (hvd_hostlist_parse_list(&l, text, err, sizeof(err)) == 0)
            check_hosts(&l);
        free(text);
        break;
    }
    }
    hvd_hostlist_free(&l);
    return 0;
}
