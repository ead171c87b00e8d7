/*
 * hvdrun's host lists: -H host1:2,host2:2 and --hostfile FILE, parsed into
 * (name, slots) pairs. A separate file so that the parsers are unit-tested
 * and fuzzed (tests/unit/test_hostfile.c, tests/fuzz/fuzz_hostfile.c)
 * without the rest of hvdrun.
 *
 * Syntax: a host is "host", "host:N", "[v6 address]" or "[v6 address]:N";
 * an unbracketed name with several colons is an IPv6 address of one slot.
 * A hostfile has one host a line, as above or as "host slots=N" (Open
 * MPI's form, which may add max_slots=M, checked and ignored); # starts a
 * comment to the end of the line; blank lines are skipped; spaces, tabs
 * and a CR before the newline separate fields. Kubeflow's MPI Operator
 * writes "host slots=N" for Open MPI and "host:N" for MPICH and Intel MPI. A
 * host named again gets the sum of its slots (as with mpirun). Slots are 1 to
 * HVD_HOST_MAX_SLOTS per entry and per host. Host names must be what ssh
 * accepts as one argument: no spaces, controls, quotes or commas, and no
 * leading '-'.
 */
#ifndef HVD_TOOLS_HOSTFILE_H
#define HVD_TOOLS_HOSTFILE_H

#include <stddef.h>

#define HVD_HOST_MAX_SLOTS 4096

typedef struct hvd_hostspec {
    char *name; /* owned */
    int slots;
} hvd_hostspec;

/* Hosts in the order first named. Zero-initialize before use. */
typedef struct hvd_hostlist {
    hvd_hostspec *v;
    int n;
    int cap;
} hvd_hostlist;

/*
 * Adds the hosts of an -H list ("a:2,b,[::1]:3") to list. Returns 0, or -1
 * with a sentence in err (which names "-H").
 */
int hvd_hostlist_parse_list(hvd_hostlist *list, const char *text, char *err,
                            size_t errlen);

/*
 * Adds the hosts of a hostfile's text (len bytes, need not end in NUL) to
 * list; where names the file in messages ("FILE:LINE: ..."). A text naming
 * no host is an error. Returns 0, or -1 with a sentence in err.
 */
int hvd_hostlist_parse_text(hvd_hostlist *list, const char *text, size_t len,
                            const char *where, char *err, size_t errlen);

/* Reads and parses hostfile path; 0, or -1 with a sentence in err. */
int hvd_hostlist_parse_file(hvd_hostlist *list, const char *path, char *err,
                            size_t errlen);

/* Frees the names and the array; the list is empty afterwards. */
void hvd_hostlist_free(hvd_hostlist *list);

#endif
