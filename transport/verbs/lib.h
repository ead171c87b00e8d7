/*
 * libibverbs, loaded at run time instead of linked (transport/base/dlib.h):
 * lib.c defines, inside libhvd (hidden), each libibverbs function the
 * transport calls (seam.c, and the inline functions of <infiniband/verbs.h>
 * it uses), forwarding to the library once loaded. Posting and polling are
 * inline in the header, through the device's own table, so the data path
 * never passes here. Where libibverbs is missing, the transport's probe
 * says so and auto leaves verbs out.
 */
#ifndef HVD_TRANSPORT_VERBS_LIB_H
#define HVD_TRANSPORT_VERBS_LIB_H

#define HVD_IBV_SONAME "libibverbs.so.1"

/* Loads libibverbs once; 1 if it is loaded, else 0 and hvd_ibv_lib_why()
 * says why. Thread safe. */
int hvd_ibv_lib_load(void);
const char *hvd_ibv_lib_why(void);

#endif
