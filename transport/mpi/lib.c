/*
 * Loading libmpi (transport/mpi/lib.h).
 */
#define HVD_MPI_LIB_TABLE 1
#include "transport/mpi/lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include "transport/base/dlib.h"

hvd_mpi_lib hvd_mpi_fn;

#define HVD_MPI_FN_SYM(name) {"MPI_" #name, (void **)&hvd_mpi_fn.f_##name},
#define HVD_MPI_OBJ_SYM(name) {#name, (void **)&hvd_mpi_fn.o_##name},
static const hvd_dl_symbol symbols[] = {HVD_MPI_FUNCTIONS(HVD_MPI_FN_SYM)
                                            HVD_MPI_OBJECTS(HVD_MPI_OBJ_SYM)};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;
static char why[256];

int hvd_mpi_lib_load(int only_loaded) {
    int ok;

    pthread_mutex_lock(&lock);
    if (!loaded)
        loaded = hvd_dl_load(
            HVD_MPI_SONAME, RTLD_NOW | RTLD_GLOBAL, only_loaded, symbols,
            sizeof(symbols) / sizeof(symbols[0]),
            "the MPI transport needs the MPI hvd was built with "
            "(" HVD_MPI_SONAME
            ") on the loader's path: install it, or add its folder to "
            "LD_LIBRARY_PATH",
            why, sizeof(why));
    ok = loaded;
    pthread_mutex_unlock(&lock);
    return ok;
}

const char *hvd_mpi_lib_why(void) { return why; }
