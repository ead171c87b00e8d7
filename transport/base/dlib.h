/*
 * Libraries loaded at run time, when first needed, instead of linked: what
 * must match the user's machine (libmpi, libibverbs) is not a dependency
 * of libhvd, so libhvd (and the binary wheel) loads where they are
 * missing, and the transports that need them say why they cannot serve.
 */
#ifndef HVD_BASE_DLIB_H
#define HVD_BASE_DLIB_H

#include <stddef.h>

/* A symbol the library must have, and where its address goes. */
typedef struct hvd_dl_symbol {
    const char *name;
    void **slot;
} hvd_dl_symbol;

/*
 * dlopen(file, flags), then dlsym of every symbol into its slot. Returns
 * 1 if all were found; else 0, with nothing kept open, no slot changed and
 * a sentence in why (what is missing, and what provides it: hint). With
 * only_loaded, opens file only if the process has it already (RTLD_NOLOAD).
 */
int hvd_dl_load(const char *file, int flags, int only_loaded,
                const hvd_dl_symbol *syms, size_t n, const char *hint,
                char *why, size_t len);

#endif
