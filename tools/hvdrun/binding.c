/*
 * The ranks' threads and CPU binding. Every rank gets OMP_NUM_THREADS,
 * MKL_NUM_THREADS and OPENBLAS_NUM_THREADS (thread_vars) set to the cores
 * it may use, unless the user set them: without that, each of torch's,
 * MKL's and OpenBLAS's pools starts one thread per CPU of the machine in
 * every rank, and the ranks of a host fight over the same cores.
 *
 * The cores of a host are the CPUs its ranks may run on: for this
 * machine, hvdrun's affinity mask (sched_getaffinity(), which taskset,
 * cgroups' cpusets and Slurm's allocations narrow); for a remote host,
 * the wrapper's there (computed by the wrapper, remote_binding()). With
 * --bind-to none a rank's cores are its host's divided by the ranks on
 * that host; with core it is bound to that many consecutive ones (in
 * local rank order); with socket to every CPU of one socket, the ranks
 * spread round-robin over the sockets. A rank of this machine is bound
 * by sched_setaffinity() in the child before exec; a remote one by
 * taskset(1) there.
 *
 * The placement is by "slot": a rank's local rank among its host's ranks,
 * or an elastic worker's slot among its host's slots (which stays put
 * while workers come and go).
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/log.h"

const char *const thread_vars[] = {"OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                   "OPENBLAS_NUM_THREADS"};

const char *bind_name(enum bind_to b) {
    return b == BIND_CORE ? "core" : b == BIND_SOCKET ? "socket" : "none";
}

int bind_parse(const char *text, enum bind_to *out) {
    if (strcmp(text, "none") == 0)
        *out = BIND_NONE;
    else if (strcmp(text, "core") == 0)
        *out = BIND_CORE;
    else if (strcmp(text, "socket") == 0)
        *out = BIND_SOCKET;
    else
        return -1;
    return 0;
}

/* The socket of CPU cpu (its physical_package_id), 0 when unknown. */
static int cpu_socket(int cpu) {
    char path[96];
    FILE *f;
    int id = 0;

    snprintf(path, sizeof(path),
             "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%d", &id) != 1 || id < 0)
        id = 0;
    fclose(f);
    return id;
}

/* The CPU quota in dir (a cgroup's directory) in whole CPUs, at least 1;
 * 0 for none. v2: cpu.max "QUOTA PERIOD" or "max PERIOD"; v1:
 * cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us. */
static long quota_in(const char *dir, int v2) {
    char path[PATH_MAX + 32];
    long quota = -1, period = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir,
             v2 ? "cpu.max" : "cpu.cfs_quota_us");
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    if (v2) {
        char q[32];
        if (fscanf(f, "%31s %ld", q, &period) != 2 || strcmp(q, "max") == 0)
            quota = -1;
        else
            quota = strtol(q, NULL, 10);
    } else if (fscanf(f, "%ld", &quota) != 1) {
        quota = -1;
    }
    fclose(f);
    if (!v2) {
        snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
        if ((f = fopen(path, "r")) == NULL)
            return 0;
        if (fscanf(f, "%ld", &period) != 1)
            period = 0;
        fclose(f);
    }
    if (quota <= 0 || period <= 0)
        return 0;
    return quota / period > 0 ? quota / period : 1;
}

/* The smallest quota of cgroup path (from /proc/self/cgroup) and of its
 * parents, under each place the hierarchy may be mounted. */
static long quota_of_path(const char *path, int v2) {
    static const char *const v2_roots[] = {"/sys/fs/cgroup",
                                           "/sys/fs/cgroup/unified"};
    static const char *const v1_roots[] = {"/sys/fs/cgroup/cpu",
                                           "/sys/fs/cgroup/cpu,cpuacct"};
    const char *const *roots = v2 ? v2_roots : v1_roots;
    long best = 0;

    for (size_t r = 0; r < 2; r++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s%s", roots[r], path);
        for (;;) {
            long q = quota_in(dir, v2);
            if (q > 0 && (best == 0 || q < best))
                best = q;
            char *slash = strrchr(dir, '/');
            if (slash == NULL || (size_t)(slash - dir) < strlen(roots[r]))
                break;
            *slash = '\0';
        }
    }
    return best;
}

/*
 * The CPU quota of hvdrun's cgroup and its parents, in whole CPUs (0:
 * none). A container's CPU limit (Kubernetes' resources.limits.cpu, docker
 * --cpus) is such a quota and leaves the affinity mask whole: without it
 * every rank of a pod limited to 4 CPUs on a 64-CPU node would count 64.
 */
static long cgroup_quota(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[PATH_MAX + 64];
    long best = 0;

    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *c1 = strchr(line, ':');
        char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        *c2 = '\0';
        c2[1 + strcspn(c2 + 1, "\n")] = '\0';
        const char *ctl = c1 + 1;
        int v2 = *ctl == '\0';
        int cpu = v2;
        for (const char *p = ctl; !cpu && *p != '\0';) {
            size_t n = strcspn(p, ",");
            cpu = n == 3 && strncmp(p, "cpu", 3) == 0;
            p += n + (p[n] == ',');
        }
        if (!cpu)
            continue;
        long q = quota_of_path(strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1, v2);
        if (q > 0 && (best == 0 || q < best))
            best = q;
    }
    fclose(f);
    return best;
}

/* Reads hvdrun's affinity mask and the sockets of its CPUs into b. */
static int read_cpus(struct binding *b) {
    size_t size = CPU_ALLOC_SIZE(CPU_SETSIZE);
    cpu_set_t *set = CPU_ALLOC(CPU_SETSIZE);

    if (set == NULL)
        return -1;
    if (sched_getaffinity(0, size, set) != 0) {
        HVD_WARN("hvdrun",
                 "sched_getaffinity() failed: %s; counting one CPU for the "
                 "thread defaults",
                 strerror(errno));
        CPU_ZERO_S(size, set);
        CPU_SET_S(0, size, set);
    }
    int n = CPU_COUNT_S(size, set);
    b->cpus = calloc((size_t)(n > 0 ? n : 1), sizeof(*b->cpus));
    b->sockets = calloc((size_t)(n > 0 ? n : 1), sizeof(*b->sockets));
    if (b->cpus == NULL || b->sockets == NULL) {
        CPU_FREE(set);
        return -1;
    }
    for (int c = 0; c < CPU_SETSIZE && b->ncpus < n; c++) {
        if (CPU_ISSET_S(c, size, set)) {
            b->cpus[b->ncpus] = c;
            b->sockets[b->ncpus++] = cpu_socket(c);
        }
    }
    if (b->ncpus == 0)
        b->cpus[b->ncpus++] = 0;
    CPU_FREE(set);
    return 0;
}

int binding_setup(struct job *job) {
    struct binding *b = &job->bind;

    for (size_t k = 0; k < ARRAY_LEN(thread_vars); k++)
        if (env_get(&job->env, thread_vars[k]) != NULL)
            b->user_set |= 1u << k;
    if (read_cpus(b) != 0) {
        say("out of memory");
        return -1;
    }
    b->quota = (int)cgroup_quota();
    if (b->quota > 0)
        HVD_INFO("hvdrun",
                 "this machine: %d CPUs in the affinity mask, a CPU "
                 "quota of %d",
                 b->ncpus, b->quota);
    b->set = CPU_ALLOC(CPU_SETSIZE);
    if (b->set == NULL) {
        say("out of memory");
        return -1;
    }
    return 0;
}

void binding_free(struct binding *b) {
    free(b->cpus);
    free(b->sockets);
    if (b->set != NULL)
        CPU_FREE(b->set);
    memset(b, 0, sizeof(*b));
}

/* The index in b->cpus of the first CPU of the socket that slot gets, and
 * (*count) its CPUs and (*sharing) the slots of nslots that share it.
 * Sockets are taken in the order of their first CPU. */
static int socket_of_slot(const struct binding *b, int slot, int nslots,
                          int *count, int *sharing) {
    int nsock = 0, first = 0;

    for (int k = 0; k < b->ncpus; k++) {
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = b->sockets[j] == b->sockets[k];
        nsock += !seen;
    }
    int want = slot % nsock;
    for (int k = 0, s = 0; k < b->ncpus; k++) {
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = b->sockets[j] == b->sockets[k];
        if (seen)
            continue;
        if (s++ == want) {
            first = k;
            break;
        }
    }
    *count = 0;
    for (int k = 0; k < b->ncpus; k++)
        *count += b->sockets[k] == b->sockets[first];
    *sharing = (nslots - want + nsock - 1) / nsock;
    return first;
}

int binding_place(struct binding *b, enum bind_to how, int slot, int nslots) {
    size_t size = CPU_ALLOC_SIZE(CPU_SETSIZE);
    int n = b->ncpus;
    int threads;

    if (nslots < 1)
        nslots = 1;
    slot %= nslots; /* a slot is below its host's slots; kept in range */
    b->bound = how != BIND_NONE;
    CPU_ZERO_S(size, b->set);
    if (how == BIND_SOCKET) {
        int count, sharing;
        int first = socket_of_slot(b, slot, nslots, &count, &sharing);
        for (int k = 0; k < n; k++)
            if (b->sockets[k] == b->sockets[first])
                CPU_SET_S(b->cpus[k], size, b->set);
        threads = count / sharing;
    } else if (how == BIND_CORE && n < nslots) {
        CPU_SET_S(b->cpus[slot % n], size, b->set);
        threads = 1;
        if (!b->said_shared) {
            HVD_WARN("hvdrun",
                     "--bind-to core: %d ranks on this machine but %d core%s; "
                     "ranks share cores round-robin",
                     nslots, n, n == 1 ? "" : "s");
            b->said_shared = 1;
        }
    } else {
        int per = n / nslots;
        for (int k = 0; how == BIND_CORE && k < per; k++)
            CPU_SET_S(b->cpus[slot * per + k], size, b->set);
        threads = per;
    }
    /* A CPU quota caps the threads, not the binding: the rank may run on
     * any of its CPUs, but only so many at a time without throttling. */
    if (b->quota > 0 && threads > b->quota / nslots)
        threads = b->quota / nslots;
    return threads > 0 ? threads : 1;
}

int binding_thread_env(struct job *job, int threads) {
    for (size_t k = 0; k < ARRAY_LEN(thread_vars); k++)
        if (!(job->bind.user_set & (1u << k)) &&
            env_set_int(&job->env, thread_vars[k], threads) != 0)
            return -1;
    return 0;
}

void binding_apply(const struct binding *b) {
    if (b->bound)
        sched_setaffinity(0, CPU_ALLOC_SIZE(CPU_SETSIZE), b->set);
}

/* " NAME=VALUE ..." of the thread variables for a rank with threads
 * threads (0: computed on the far side), the user's values as such. */
static void thread_text(const struct job *job, int threads, char *out,
                        size_t len) {
    size_t used = 0;

    out[0] = '\0';
    for (size_t k = 0; k < ARRAY_LEN(thread_vars) && used < len; k++) {
        const char *v = env_get(&job->env, thread_vars[k]);
        int n;
        if (job->bind.user_set & (1u << k))
            n = snprintf(out + used, len - used, " %s=%s (as set)",
                         thread_vars[k], v != NULL ? v : "");
        else if (threads > 0)
            n = snprintf(out + used, len - used, " %s=%d", thread_vars[k],
                         threads);
        else
            n = snprintf(out + used, len - used, " %s=(its cores)",
                         thread_vars[k]);
        used += n > 0 ? (size_t)n : 0;
    }
}

void binding_report(struct job *job, const char *host, int remote, int nranks) {
    char vars[512];
    int threads = 0;
    int cores = job->bind.ncpus;
    char quota[48] = "";

    if (!job->opt->verbose)
        return;
    if (!remote) {
        /* The first rank's share; with socket on unequal sockets the
         * others' may differ (--verbose shows each at debug level). */
        threads = binding_place(&job->bind, job->opt->bind_to, 0, nranks);
        job->bind.bound = 0;
    }
    thread_text(job, threads, vars, sizeof(vars));
    if (job->bind.quota > 0)
        snprintf(quota, sizeof(quota), " (CPU quota %d)", job->bind.quota);
    if (remote)
        say("host %s: %d rank%s, its cores counted there (nproc), bound "
            "there: %s:%s (set them, or -x them, to override)",
            host, nranks, nranks == 1 ? "" : "s", bind_name(job->opt->bind_to),
            vars);
    else
        say("host %s: %d rank%s, %d core%s%s, --bind-to %s:%s (set them, "
            "or -x them, to override)",
            host, nranks, nranks == 1 ? "" : "s", cores, cores == 1 ? "" : "s",
            quota, bind_name(job->opt->bind_to), vars);
}

/*
 * The sh of a remote rank's wrapper that does there what binding_place()
 * does here, for slot of nslots: hvd_t gets the rank's cores, and hvd_b
 * the taskset command that binds it (empty with --bind-to none, or
 * without taskset there: the wrapper of slot 0 says so). The CPUs are the
 * wrapper's Cpus_allowed_list, the sockets their physical_package_id.
 * Then each thread variable the user did not set is exported as hvd_t,
 * and the user's values are passed on.
 */
void binding_remote(struct sbuf *s, const struct job *job, const struct rank *r,
                    int slot, int nslots) {
    enum bind_to how = job->opt->bind_to;
    char num[96];

    snprintf(num, sizeof(num), " hvd_k=%d; hvd_n=%d;", slot,
             nslots > 0 ? nslots : 1);
    sbuf_add(s, num);
    /* The CPUs, one a word: "0-3,8" becomes "0 1 2 3 8". */
    sbuf_add(s, " hvd_c=; hvd_a=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*"
                "//p' /proc/self/status 2>/dev/null); hvd_o=$IFS; IFS=,; "
                "for hvd_r in $hvd_a; do hvd_i=${hvd_r%-*}; hvd_j=${hvd_r#*-}; "
                "while [ \"$hvd_i\" -le \"$hvd_j\" ]; do hvd_c=\"$hvd_c "
                "$hvd_i\"; hvd_i=$((hvd_i+1)); done; done; IFS=$hvd_o; "
                "test -n \"$hvd_c\" || hvd_c=$(seq 0 $(($(nproc 2>/dev/null "
                "|| echo 1)-1)));");
    if (how == BIND_SOCKET) {
        /* Keeps the CPUs of the socket of the slot, hvd_m of them shared
         * by hvd_h slots. */
        sbuf_add(s, " hvd_sk() { cat /sys/devices/system/cpu/cpu$1/topology/"
                    "physical_package_id 2>/dev/null || echo 0; }; hvd_p=; "
                    "for hvd_i in $hvd_c; do hvd_q=$(hvd_sk $hvd_i); case \" "
                    "$hvd_p \" in *\" $hvd_q \"*) ;; *) hvd_p=\"$hvd_p "
                    "$hvd_q\";; esac; done; set -- $hvd_p; hvd_ns=$#; "
                    "hvd_w=$((hvd_k % hvd_ns)); shift $hvd_w; hvd_q=$1; "
                    "hvd_l=; hvd_m=0; for hvd_i in $hvd_c; do [ \"$(hvd_sk "
                    "$hvd_i)\" = \"$hvd_q\" ] && { hvd_l=\"$hvd_l,$hvd_i\"; "
                    "hvd_m=$((hvd_m+1)); }; done; hvd_h=$(((hvd_n - hvd_w + "
                    "hvd_ns - 1) / hvd_ns)); hvd_t=$((hvd_m / hvd_h));");
    } else {
        /* core: hvd_t consecutive CPUs from slot * hvd_t on, or one
         * round-robin when there are fewer CPUs than slots. */
        sbuf_add(s, " set -- $hvd_c; hvd_m=$#; hvd_t=$((hvd_m / hvd_n)); "
                    "if [ \"$hvd_t\" -ge 1 ]; then hvd_f=$((hvd_k * hvd_t)); "
                    "else hvd_f=$((hvd_k % hvd_m)); hvd_t=1; fi; hvd_l=; "
                    "hvd_i=0; for hvd_q in $hvd_c; do [ \"$hvd_i\" -ge "
                    "\"$hvd_f\" ] && [ \"$hvd_i\" -lt $((hvd_f + hvd_t)) ] && "
                    "hvd_l=\"$hvd_l,$hvd_q\"; hvd_i=$((hvd_i+1)); done;");
    }
    /* A CPU quota there (its own cgroup's, v2 or v1) caps hvd_t. */
    sbuf_add(s, " hvd_g2=$(sed -n 's/^0:://p' /proc/self/cgroup 2>/dev/null);"
                " hvd_g1=$(sed -n 's/^[0-9]*:\\(cpu,cpuacct\\|cpuacct,cpu\\|"
                "cpu\\)://p' /proc/self/cgroup 2>/dev/null); hvd_qc=0;"
                " for hvd_f in \"/sys/fs/cgroup${hvd_g2%/}/cpu.max\""
                " /sys/fs/cgroup/cpu.max; do set -- $(cat \"$hvd_f\""
                " 2>/dev/null); if [ $# = 2 ] && [ \"$1\" != max ] &&"
                " [ \"$2\" -gt 0 ]; then hvd_qc=$(($1 / $2)); break; fi; done;"
                " for hvd_f in \"/sys/fs/cgroup/cpu${hvd_g1%/}\""
                " \"/sys/fs/cgroup/cpu,cpuacct${hvd_g1%/}\" /sys/fs/cgroup/cpu;"
                " do [ \"$hvd_qc\" = 0 ] || break; hvd_q=$(cat"
                " \"$hvd_f/cpu.cfs_quota_us\" 2>/dev/null); hvd_r=$(cat"
                " \"$hvd_f/cpu.cfs_period_us\" 2>/dev/null); if [ -n \"$hvd_q\""
                " ] && [ \"$hvd_q\" -gt 0 ] && [ \"${hvd_r:-0}\" -gt 0 ]; then"
                " hvd_qc=$((hvd_q / hvd_r)); [ $hvd_qc -ge 1 ] || hvd_qc=1; fi;"
                " done; if [ \"$hvd_qc\" -gt 0 ] && [ \"$hvd_t\" -gt"
                " $((hvd_qc / hvd_n)) ]; then hvd_t=$((hvd_qc / hvd_n)); fi;");
    sbuf_add(s, " [ \"$hvd_t\" -ge 1 ] || hvd_t=1; hvd_b=;");
    if (how != BIND_NONE) {
        sbuf_add(s, " if command -v taskset >/dev/null 2>&1; then "
                    "hvd_b=\"taskset -c ${hvd_l#,}\"; elif [ \"$hvd_k\" = 0 ]; "
                    "then ");
        snprintf(num, sizeof(num), "%.60s", r->host->name);
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "hvdrun: host %s: no taskset there; --bind-to %s is not "
                 "applied there",
                 num, bind_name(how));
        sbuf_add(s, "printf '%s\\n' ");
        sbuf_quote(s, msg);
        sbuf_add(s, " >&2; fi;");
    }
    for (size_t k = 0; k < ARRAY_LEN(thread_vars); k++) {
        const char *v = env_get(&job->env, thread_vars[k]);
        sbuf_add(s, " export ");
        sbuf_add(s, thread_vars[k]);
        sbuf_add(s, "=");
        if (job->bind.user_set & (1u << k))
            sbuf_quote(s, v != NULL ? v : "");
        else
            sbuf_add(s, "$hvd_t");
        sbuf_add(s, ";");
    }
}
