/*
 * hvdrun --config-file: horovodrun's YAML configuration file, read with
 * libyaml, turned into the HVD_* variables that mean the same.
 *
 * The keys are Horovod's (horovod/runner/common/util/config_parser.py):
 *
 *   params:       fusion_threshold_mb, cycle_time_ms, cache_capacity,
 *                 hierarchical_allreduce, hierarchical_allgather
 *   timeline:     filename, mark_cycles
 *   stall_check:  enabled, warning_time_seconds, shutdown_time_seconds
 *   logging:      level
 *   autotune, library_options, controller: accepted with a note on what
 *                 hvd does instead (nothing is silently dropped)
 *
 * Anything else is refused with a sentence naming the key.
 */
#include "tools/config_file.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define MAX_DEPTH 4

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int add_var(hvd_config_vars *out, const char *name, const char *value) {
    char **vars;
    char *var;

    if (asprintf(&var, "%s=%s", name, value) < 0)
        return -1;
    vars = realloc(out->vars, (out->n + 1) * sizeof(*vars));
    if (vars == NULL) {
        free(var);
        return -1;
    }
    out->vars = vars;
    out->vars[out->n++] = var;
    return 0;
}

static int add_note(hvd_config_vars *out, const char *note) {
    char **notes = realloc(out->notes, (out->nnotes + 1) * sizeof(*notes));

    if (notes == NULL)
        return -1;
    out->notes = notes;
    out->notes[out->nnotes] = strdup(note);
    return out->notes[out->nnotes++] == NULL ? -1 : 0;
}

static int parse_bool(const char *v, int *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};

    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return *out = 1, 0;
        if (strcasecmp(v, no[i]) == 0)
            return *out = 0, 0;
    }
    return -1;
}

static int parse_number(const char *v, double lo, double hi, double *out) {
    char *end;
    double d;

    errno = 0;
    d = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(d >= lo && d <= hi))
        return -1;
    *out = d;
    return 0;
}

/* One "section.key: value" of the file. */
static int apply(const char *section, const char *key, const char *value,
                 hvd_config_vars *out, char *err, size_t errlen) {
    char text[64], note[512];
    double d;
    int b;

#define WANT(cond, what)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            set_err(err, errlen, "%s.%s: '%s' is not %s", section, key, value, \
                    what);                                                     \
            return -1;                                                         \
        }                                                                      \
    } while (0)

    if (strcmp(section, "params") == 0) {
        if (strcmp(key, "fusion_threshold_mb") == 0) {
            WANT(parse_number(value, 0, 1 << 20, &d) == 0, "a number of MiB");
            snprintf(text, sizeof(text), "%.0f", d * 1024 * 1024);
            return add_var(out, "HVD_FUSION_THRESHOLD", text);
        }
        if (strcmp(key, "cycle_time_ms") == 0) {
            WANT(parse_number(value, 0, 1000, &d) == 0,
                 "a time in ms from 0 to 1000");
            /* hvd's cycle time is whole ms (0: as soon as work is there). */
            snprintf(text, sizeof(text), "%.0f", floor(d + 0.5));
            if (floor(d) != d) {
                snprintf(note, sizeof(note),
                         "params.cycle_time_ms %s: hvd's cycle time is whole "
                         "milliseconds; using %s",
                         value, text);
                if (add_note(out, note) != 0)
                    return -1;
            }
            return add_var(out, "HVD_CYCLE_TIME_MS", text);
        }
        if (strcmp(key, "cache_capacity") == 0) {
            WANT(parse_number(value, 0, 1 << 20, &d) == 0 && floor(d) == d,
                 "a whole number of entries");
            return add_var(out, "HVD_CACHE_CAPACITY", value);
        }
        if (strcmp(key, "hierarchical_allreduce") == 0) {
            WANT(parse_bool(value, &b) == 0, "true or false");
            return b ? add_var(out, "HVD_ALGORITHM", "hier") : 0;
        }
        if (strcmp(key, "hierarchical_allgather") == 0 ||
            strcmp(key, "torus_allreduce") == 0) {
            WANT(parse_bool(value, &b) == 0, "true or false");
            snprintf(note, sizeof(note),
                     "params.%s: hvd chooses the allgather's path itself "
                     "(HVD_TRANSPORT, the selector); ignored",
                     key);
            return b ? add_note(out, note) : 0;
        }
    } else if (strcmp(section, "timeline") == 0) {
        if (strcmp(key, "filename") == 0)
            return add_var(out, "HVD_TIMELINE", value);
        if (strcmp(key, "mark_cycles") == 0) {
            WANT(parse_bool(value, &b) == 0, "true or false");
            return add_var(out, "HVD_TIMELINE_MARK_CYCLES", b ? "1" : "0");
        }
    } else if (strcmp(section, "stall_check") == 0) {
        if (strcmp(key, "enabled") == 0) {
            WANT(parse_bool(value, &b) == 0, "true or false");
            return b ? 0 : add_var(out, "HVD_STALL_CHECK_SECONDS", "0");
        }
        if (strcmp(key, "warning_time_seconds") == 0 ||
            strcmp(key, "shutdown_time_seconds") == 0) {
            WANT(parse_number(value, 0, 7 * 24 * 3600, &d) == 0 &&
                     floor(d) == d,
                 "a whole number of seconds");
            return add_var(out,
                           key[0] == 'w' ? "HVD_STALL_CHECK_SECONDS"
                                         : "HVD_STALL_SHUTDOWN_SECONDS",
                           value);
        }
    } else if (strcmp(section, "logging") == 0) {
        if (strcmp(key, "level") == 0) {
            static const char *const map[][2] = {
                {"trace", "debug"},  {"debug", "debug"}, {"info", "info"},
                {"warning", "warn"}, {"warn", "warn"},   {"error", "error"},
                {"fatal", "error"}};
            for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                if (strcasecmp(value, map[i][0]) == 0)
                    return add_var(out, "HVD_LOG_LEVEL", map[i][1]);
            WANT(0, "one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
        }
        if (strcmp(key, "hide_timestamp") == 0)
            return 0; /* hvd's log lines carry no timestamp */
    } else if (strcmp(section, "autotune") == 0) {
        if (strcmp(key, "enabled") == 0) {
            WANT(parse_bool(value, &b) == 0, "true or false");
            return b ? add_note(out, "autotune.enabled: hvd tunes ahead of "
                                     "the job instead (hvd-tune writes "
                                     "HVD_TUNING_FILE); ignored")
                     : 0;
        }
        return 0; /* the autotuner's own knobs mean nothing without it */
    } else if (strcmp(section, "library_options") == 0) {
        snprintf(note, sizeof(note),
                 "library_options.%s: no such knob in hvd; ignored", key);
        return add_note(out, note);
    }
    set_err(err, errlen, "%s.%s: not a key of horovodrun's configuration file",
            section, key);
    return -1;
#undef WANT
}

int hvd_config_file_read(const char *path, hvd_config_vars *out, char *err,
                         size_t errlen) {
    FILE *f = fopen(path, "r");
    yaml_parser_t parser;
    yaml_event_t ev;
    char keys[MAX_DEPTH][128];
    int depth = 0, expect_key[MAX_DEPTH + 1], done = 0, rc = 0;

    memset(out, 0, sizeof(*out));
    err[0] = '\0';
    if (f == NULL) {
        set_err(err, errlen, "cannot open it: %s", strerror(errno));
        return -1;
    }
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        set_err(err, errlen, "out of memory");
        return -1;
    }
    yaml_parser_set_input_file(&parser, f);
    expect_key[0] = 1;
    while (!done && rc == 0) {
        if (!yaml_parser_parse(&parser, &ev)) {
            set_err(err, errlen, "line %zu: %s", parser.problem_mark.line + 1,
                    parser.problem != NULL ? parser.problem : "bad YAML");
            rc = -1;
            break;
        }
        switch (ev.type) {
        case YAML_MAPPING_START_EVENT:
            if (depth > 0 && expect_key[depth]) {
                set_err(err, errlen, "line %zu: a mapping as a key",
                        ev.start_mark.line + 1);
                rc = -1;
            } else if (depth >= 2) {
                set_err(err, errlen,
                        "line %zu: '%s.%s' is nested deeper "
                        "than horovodrun's sections go",
                        ev.start_mark.line + 1, keys[0], keys[1]);
                rc = -1;
            } else {
                expect_key[depth] = 1; /* the value is done with */
                depth++;
                expect_key[depth] = 1;
            }
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (depth == 0) {
                break; /* an empty or scalar document */
            } else if (expect_key[depth]) {
                snprintf(keys[depth - 1], sizeof(keys[0]), "%s", v);
                expect_key[depth] = 0;
            } else if (depth == 1) {
                if (strcmp(keys[0], "controller") == 0 ||
                    strcmp(keys[0], "verbose") == 0) {
                    char note[256];
                    snprintf(
                        note, sizeof(note), "%s: %s: %s; ignored", keys[0], v,
                        keys[0][0] == 'c' ? "hvd has one controller, its engine"
                                          : "hvd logs by logging.level "
                                            "(HVD_LOG_LEVEL)");
                    rc = add_note(out, note);
                } else {
                    set_err(err, errlen,
                            "line %zu: '%s' is not a section "
                            "of horovodrun's configuration file",
                            ev.start_mark.line + 1, keys[0]);
                    rc = -1;
                }
                expect_key[depth] = 1;
            } else {
                rc = apply(keys[0], keys[1], v, out, err, errlen);
                expect_key[depth] = 1;
            }
            break;
        }
        case YAML_SEQUENCE_START_EVENT:
            set_err(err, errlen, "line %zu: horovodrun's keys take no lists",
                    ev.start_mark.line + 1);
            rc = -1;
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc != 0 && err[0] == '\0')
        set_err(err, errlen, "out of memory");
    if (rc != 0)
        hvd_config_vars_free(out);
    return rc;
}

void hvd_config_vars_free(hvd_config_vars *v) {
    for (size_t i = 0; i < v->n; i++)
        free(v->vars[i]);
    for (size_t i = 0; i < v->nnotes; i++)
        free(v->notes[i]);
    free(v->vars);
    free(v->notes);
    memset(v, 0, sizeof(*v));
}
