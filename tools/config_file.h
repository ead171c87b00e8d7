/*
 * hvdrun --config-file FILE: horovodrun's YAML configuration file (its
 * sections and keys) read into the HVD_* variables of the same meaning.
 */
#ifndef HVD_TOOLS_CONFIG_FILE_H
#define HVD_TOOLS_CONFIG_FILE_H

#include <stddef.h>

typedef struct {
    char **vars; /* "HVD_NAME=value", in the file's order */
    size_t n;
    char **notes; /* what the file asks that hvd does otherwise, or not */
    size_t nnotes;
} hvd_config_vars;

/* Reads path into *out (which the caller frees with hvd_config_vars_free).
 * Returns 0, or -1 with a sentence in err (a bad key or value, bad YAML,
 * an unreadable file); *out is then empty. */
int hvd_config_file_read(const char *path, hvd_config_vars *out, char *err,
                         size_t errlen);

void hvd_config_vars_free(hvd_config_vars *v);

#endif
