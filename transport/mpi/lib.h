/*
 * libmpi, loaded at run time instead of linked (transport/base/dlib.h): the
 * transport's files call MPI by its usual names, which this header, included
 * after <mpi.h> by mpi_internal.h, turns into calls through a table that
 * hvd_mpi_lib_load fills with dlsym. The table's types are <mpi.h>'s own, so
 * a call that does not match MPI's prototype still fails to compile.
 *
 * Loading libmpi itself, not a plug-in of hvd's built against it: the
 * transport's code calls libhvd's internal functions (errors, logging,
 * failures), which a separate shared object could not reach without
 * libhvd exporting them. The ABI is the family of the MPI hvd is built
 * with (<mpi.h> decides the handles' types): Open MPI 3.x to 5.x
 * (libmpi.so.40, whose predefined handles are the addresses of objects in
 * libmpi, also resolved here), or MPICH and its derivatives (libmpi.so.12,
 * whose handles are constants).
 */
#ifndef HVD_TRANSPORT_MPI_LIB_H
#define HVD_TRANSPORT_MPI_LIB_H

#include <mpi.h>

#include "transport/mpi/mpi.h"

/* Every MPI function the transport calls. */
/* clang-format off */
#define HVD_MPI_FUNCTIONS(X) \
    X(Allgather) X(Cancel) X(Comm_dup) X(Comm_free) X(Comm_rank) \
    X(Comm_set_errhandler) X(Comm_size) X(Error_class) X(Error_string) \
    X(Finalize) X(Finalized) X(Get_count) X(Iallgather) X(Iallreduce) \
    X(Ibcast) \
    X(Init_thread) X(Initialized) X(Irecv) X(Isend) X(Query_thread) \
    X(Request_free) X(Test) X(Testsome) X(Wait)
/* clang-format on */

#ifdef OPEN_MPI
#define HVD_MPI_SONAME "libmpi.so.40"
/* The objects behind the predefined handles the transport uses. */
/* clang-format off */
#define HVD_MPI_OBJECTS(X) \
    X(ompi_mpi_byte) X(ompi_mpi_comm_null) X(ompi_mpi_comm_world) \
    X(ompi_mpi_double) X(ompi_mpi_errors_return) X(ompi_mpi_float) \
    X(ompi_mpi_int32_t) X(ompi_mpi_int64_t) X(ompi_mpi_int8_t) \
    X(ompi_mpi_op_max) X(ompi_mpi_op_min) X(ompi_mpi_op_prod) \
    X(ompi_mpi_op_sum) X(ompi_mpi_uint8_t) X(ompi_request_null)
/* clang-format on */
#else
#define HVD_MPI_SONAME "libmpi.so.12"
#define HVD_MPI_OBJECTS(X)
#endif

#define HVD_MPI_FN_SLOT(name) __typeof__(MPI_##name) *f_##name;
#define HVD_MPI_OBJ_SLOT(name) __typeof__(name) *o_##name;
typedef struct hvd_mpi_lib {
    HVD_MPI_FUNCTIONS(HVD_MPI_FN_SLOT)
    HVD_MPI_OBJECTS(HVD_MPI_OBJ_SLOT)
} hvd_mpi_lib;

extern hvd_mpi_lib hvd_mpi_fn;

/*
 * hvd_mpi_lib_load (declared in mpi.h) loads libmpi with RTLD_GLOBAL (Open
 * MPI's own components resolve its symbols) and fills hvd_mpi_fn; libmpi
 * then stays loaded. With only_loaded it loads nothing the process does
 * not have already (the application's libmpi, or the one of a job mpirun
 * started).
 */

#ifndef HVD_MPI_LIB_TABLE
#define MPI_Allgather (*hvd_mpi_fn.f_Allgather)
#define MPI_Cancel (*hvd_mpi_fn.f_Cancel)
#define MPI_Comm_dup (*hvd_mpi_fn.f_Comm_dup)
#define MPI_Comm_free (*hvd_mpi_fn.f_Comm_free)
#define MPI_Comm_rank (*hvd_mpi_fn.f_Comm_rank)
#define MPI_Comm_set_errhandler (*hvd_mpi_fn.f_Comm_set_errhandler)
#define MPI_Comm_size (*hvd_mpi_fn.f_Comm_size)
#define MPI_Error_class (*hvd_mpi_fn.f_Error_class)
#define MPI_Error_string (*hvd_mpi_fn.f_Error_string)
#define MPI_Finalize (*hvd_mpi_fn.f_Finalize)
#define MPI_Finalized (*hvd_mpi_fn.f_Finalized)
#define MPI_Get_count (*hvd_mpi_fn.f_Get_count)
#define MPI_Iallgather (*hvd_mpi_fn.f_Iallgather)
#define MPI_Iallreduce (*hvd_mpi_fn.f_Iallreduce)
#define MPI_Ibcast (*hvd_mpi_fn.f_Ibcast)
#define MPI_Init_thread (*hvd_mpi_fn.f_Init_thread)
#define MPI_Initialized (*hvd_mpi_fn.f_Initialized)
#define MPI_Irecv (*hvd_mpi_fn.f_Irecv)
#define MPI_Isend (*hvd_mpi_fn.f_Isend)
#define MPI_Query_thread (*hvd_mpi_fn.f_Query_thread)
#define MPI_Request_free (*hvd_mpi_fn.f_Request_free)
#define MPI_Test (*hvd_mpi_fn.f_Test)
#define MPI_Testsome (*hvd_mpi_fn.f_Testsome)
#define MPI_Wait (*hvd_mpi_fn.f_Wait)
#ifdef OPEN_MPI
#define ompi_mpi_byte (*hvd_mpi_fn.o_ompi_mpi_byte)
#define ompi_mpi_comm_null (*hvd_mpi_fn.o_ompi_mpi_comm_null)
#define ompi_mpi_comm_world (*hvd_mpi_fn.o_ompi_mpi_comm_world)
#define ompi_mpi_double (*hvd_mpi_fn.o_ompi_mpi_double)
#define ompi_mpi_errors_return (*hvd_mpi_fn.o_ompi_mpi_errors_return)
#define ompi_mpi_float (*hvd_mpi_fn.o_ompi_mpi_float)
#define ompi_mpi_int32_t (*hvd_mpi_fn.o_ompi_mpi_int32_t)
#define ompi_mpi_int64_t (*hvd_mpi_fn.o_ompi_mpi_int64_t)
#define ompi_mpi_int8_t (*hvd_mpi_fn.o_ompi_mpi_int8_t)
#define ompi_mpi_op_max (*hvd_mpi_fn.o_ompi_mpi_op_max)
#define ompi_mpi_op_min (*hvd_mpi_fn.o_ompi_mpi_op_min)
#define ompi_mpi_op_prod (*hvd_mpi_fn.o_ompi_mpi_op_prod)
#define ompi_mpi_op_sum (*hvd_mpi_fn.o_ompi_mpi_op_sum)
#define ompi_mpi_uint8_t (*hvd_mpi_fn.o_ompi_mpi_uint8_t)
#define ompi_request_null (*hvd_mpi_fn.o_ompi_request_null)
#endif
#endif

#endif
