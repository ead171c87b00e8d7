/*
 * The shared-memory transport's setup and teardown (see shm_internal.h):
 * the segments (their names, making and mapping them, a dead job's
 * leftovers), probe, open, goodbye and close.
 */
#include "transport/shm/shm_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* What each rank tells the others at open, twice: first its segment,
 * then whether it mapped and can read every same-host peer. */
typedef struct shm_blob {
    uint64_t magic;
    uint64_t probe_addr;
    uint64_t seg_len;
    int32_t pid;
    int32_t ok;      /* round 1: segment made; round 2: peers mapped */
    int32_t cma_ok;  /* round 2 */
    int32_t nospace; /* round 1: /dev/shm had no room for the segment */
    char err[200];
} shm_blob;

/*
 * The 32 hex digits that name a job's segments: HMAC-SHA256 keyed with the
 * job secret over "hvd-shm|" and the job id in hex, cut to 16 bytes.
 * /dev/shm is world-readable: a name made of the job id would show it to
 * every local user (and let one who guessed a name take it first); this
 * one says nothing about the job to whoever lacks the secret. The text
 * form of the job id lets a test script compute the same name
 * (openssl dgst -sha256 -hmac).
 */
static int segment_tag(const char *secret, const uint8_t job_id[HVD_JOB_ID_LEN],
                       char tag[33]) {
    char text[8 + 2 * HVD_JOB_ID_LEN + 1] = "hvd-shm|";
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;

    hvd_job_id_format(job_id, text + 8);
    if (secret == NULL)
        secret = "";
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret),
             (const unsigned char *)text, strlen(text), mac, &maclen) == NULL ||
        maclen < 16)
        return -1;
    for (int i = 0; i < 16; i++)
        snprintf(tag + 2 * i, 3, "%02x", mac[i]);
    return 0;
}

int hvd_shm_segment_name(const char *secret,
                         const uint8_t job_id[HVD_JOB_ID_LEN], int rank,
                         char *out, size_t outlen) {
    char tag[33];

    if (segment_tag(secret, job_id, tag) != 0)
        return -1;
    snprintf(out, outlen, "/hvd-%s-%d", tag, rank);
    return 0;
}

int hvd_shm_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN],
                        const char *secret) {
    char prefix[96];
    DIR *d;
    struct dirent *e;
    int removed = 0;
    size_t plen;

    if (hvd_shm_segment_name(secret, job_id, 0, prefix, sizeof(prefix)) != 0)
        return 0;
    plen = strlen(prefix) - 1; /* "/hvd-<tag>-" */
    d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (strncmp(name, prefix, plen) == 0 && shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

void hvd_shm_close(hvd_transport *t) {
    shm *tp = (shm *)t;

    if (tp == NULL)
        return;
    for (int p = 0; tp->peers != NULL && p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        if (pe->seg != NULL)
            munmap(pe->seg, pe->seg_len);
        if (pe->pidfd >= 0)
            close(pe->pidfd);
        for (int ch = 0; ch < NCHANNELS; ch++) {
            msgq *qs[2] = {&pe->sendq[ch], &pe->ackq[ch]};
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < qs[k]->count; i++) {
                    msg *m = &qs[k]->v[(qs[k]->head + i) & (qs[k]->cap - 1)];
                    if (m->owned)
                        free(m->buf);
                }
            free(pe->sendq[ch].v);
            free(pe->ackq[ch].v);
            free(pe->recvq[ch].v);
        }
    }
    if (tp->seg_named)
        shm_unlink(tp->seg_name);
    if (tp->seg != NULL)
        munmap(tp->seg, tp->seg_len);
    if (tp->load_on)
        hvd_hostload_close(&tp->load);
    free(tp->peers);
    free(tp->hosts);
    free(tp);
}

hvd_status hvd_shm_probe(const hvd_transport_params *params, hvd_caps *caps) {
    int same = 0;

    memset(caps, 0, sizeof(*caps));
    if (params->hosts != NULL)
        for (int i = 0; i < params->size; i++)
            same += strcmp(params->hosts[i], params->hosts[params->rank]) == 0;
    caps->usable = same > 1;
    caps->one_sided = 1;
    /* Only within a host, and there first. */
    caps->reach = HVD_REACH_SAME_HOST;
    caps->priority = 30;
    if (!caps->usable)
        snprintf(caps->reason, sizeof(caps->reason),
                 "no other rank runs on this host");
    return HVD_OK;
}

static int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) {
        fcntl((int)fd, F_SETFD, FD_CLOEXEC);
        return (int)fd;
    }
#else
    (void)pid;
#endif
    return -1;
}

/* n bytes as "96 KiB", "1.1 MiB", for sentences. */
static void format_size(uint64_t n, char *out, size_t outlen) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    size_t u = 0;

    while (v >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
        v /= 1024;
        u++;
    }
    if (u == 0 || v >= 10 || v == (double)(uint64_t)v)
        snprintf(out, outlen, "%.0f %s", v, unit[u]);
    else
        snprintf(out, outlen, "%.1f %s", v, unit[u]);
}

/*
 * Gives the segment fd its pages now. ftruncate on tmpfs always succeeds
 * and a page is only taken when first touched, so a full /dev/shm used to
 * kill a rank with SIGBUS at the first write to a page the filesystem
 * could not give (at setup, or mid-run when a large message first reached
 * a cell). posix_fallocate takes every page now, or fails with ENOSPC and
 * gives back what it took; the sentence then says how much was needed and
 * how much was left. *nospace is 1 when there was no room.
 */
static hvd_status back_segment(shm *tp, int fd, int *nospace) {
    struct statvfs vfs;
    char need[32], have[32] = "an unknown amount";
    int err, tries = 0;

    /* A signal interrupts tmpfs's fallocate (EINTR); it gave back what it
     * had taken, and a retry starts over. */
    do
        err = posix_fallocate(fd, 0, (off_t)tp->seg_len);
    while (err == EINTR && ++tries < 100);
    if (err == 0)
        return HVD_OK;
    format_size(tp->seg_len, need, sizeof(need));
    if (fstatvfs(fd, &vfs) == 0)
        format_size((uint64_t)vfs.f_bavail * vfs.f_frsize, have, sizeof(have));
    *nospace = err == ENOSPC || err == ENOMEM;
    if (err == ENOSPC)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "/dev/shm has %s free but rank %d's segment "
                             "needs %s",
                             have, tp->rank, need);
    return hvd_error_set(HVD_ERR_TRANSPORT,
                         "posix_fallocate of rank %d's segment (%s) in "
                         "/dev/shm failed: %s (%s free)",
                         tp->rank, need, strerror(err), have);
}

/* Makes and maps this rank's segment, every page of it backed. */
static hvd_status make_segment(shm *tp, const hvd_transport_params *params,
                               int *nospace) {
    int fd;
    hvd_status st;

    if (hvd_shm_segment_name(params->secret, params->job_id, tp->rank,
                             tp->seg_name, sizeof(tp->seg_name)) != 0)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "HMAC-SHA256 failed to name the segment");
    tp->seg_len = segment_bytes(tp->nlocal);
    fd = shm_open(tp->seg_name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Left by an earlier run of this job (its name needs the secret):
         * not ours to keep. */
        shm_unlink(tp->seg_name);
        fd =
            shm_open(tp->seg_name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "shm_open(%s) failed: %s",
                             tp->seg_name, strerror(errno));
    tp->seg_named = 1;
    st = back_segment(tp, fd, nospace);
    if (st != HVD_OK) {
        close(fd);
        return st;
    }
    void *p =
        mmap(NULL, tp->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return hvd_error_set(HVD_ERR_TRANSPORT, "mmap(%s, %zu) failed: %s",
                             tp->seg_name, tp->seg_len, strerror(errno));
    tp->seg = p;
    seg_hdr *h = hdr_of(tp->seg);
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->nlocal = (uint32_t)tp->nlocal;
    h->pid = (int32_t)getpid();
    tp->membar = hvd_shm_membar_setup();
    atomic_store(&h->membar, (uint32_t)tp->membar);
    for (int ch = 0; ch < NCHANNELS; ch++) {
        h->ncells[ch] = ncells_of[ch];
        h->cell_bytes[ch] = cell_bytes_of[ch];
    }
    return HVD_OK;
}

/* Maps peer p's segment and checks it; err gets the reason on failure. */
static int map_peer(shm *tp, const hvd_transport_params *params, int p,
                    const shm_blob *b, char *err, size_t errlen) {
    speer *pe = &tp->peers[p];
    char name[96];
    struct stat sb;
    int fd;

    if (hvd_shm_segment_name(params->secret, params->job_id, p, name,
                             sizeof(name)) != 0) {
        snprintf(err, errlen, "HMAC-SHA256 failed to name a segment");
        return -1;
    }
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s) of rank %d failed: %s", name, p,
                 strerror(errno));
        return -1;
    }
    /* A page past the file's end would be SIGBUS at the first touch: a
     * segment shorter than its owner said is refused here. */
    if (fstat(fd, &sb) != 0 || b->seg_len != tp->seg_len ||
        (uint64_t)sb.st_size < b->seg_len) {
        close(fd);
        snprintf(err, errlen,
                 "the segment of rank %d (%s) is not one this hvd can use "
                 "(another version of hvd?)",
                 p, name);
        return -1;
    }
    void *m = mmap(NULL, (size_t)b->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s) of rank %d failed: %s", name, p,
                 strerror(errno));
        return -1;
    }
    pe->seg = m;
    pe->seg_len = (size_t)b->seg_len;
    seg_hdr *h = hdr_of(pe->seg);
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION ||
        h->nlocal != (uint32_t)tp->nlocal) {
        snprintf(err, errlen,
                 "the segment of rank %d (%s) is not one this hvd can use "
                 "(another version of hvd?)",
                 p, name);
        return -1;
    }
    pe->pid = (pid_t)b->pid;
    pe->pidfd = open_pidfd(pe->pid);
    return 0;
}

/* A transport with its peers numbered on this host, no segment yet. */
static hvd_status shm_new(const hvd_transport_params *params,
                          const hvd_shm_settings *set, shm **out) {
    shm *tp = calloc(1, sizeof(*tp));

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_shm_ops;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->timeout_ns = params->timeout_ns;
    tp->eager_max = cell_bytes_of[HVD_CHANNEL_DATA];
    tp->cma_probe = SHM_MAGIC;
    tp->spin_ns = set->spin_us * 1000LL;
    tp->membar_judge = HVD_SHM_MEMBAR_JUDGE;
    tp->membar_slow_ns = HVD_SHM_MEMBAR_SLOW_NS;
    hvd_shm_thp_init(&tp->thp, set->hugepages, HVD_SHM_THP_MIN);
    tp->peers = calloc((size_t)tp->size, sizeof(*tp->peers));
    if (params->hosts != NULL) {
        tp->hosts = malloc((size_t)tp->size * sizeof(*tp->hosts));
        if (tp->hosts != NULL)
            memcpy(tp->hosts, params->hosts,
                   (size_t)tp->size * sizeof(*tp->hosts));
    }
    if (tp->peers == NULL || (params->hosts != NULL && tp->hosts == NULL)) {
        /* Not hvd_shm_close: the peers' pidfds are not set to -1 yet. */
        free(tp->peers);
        free(tp->hosts);
        free(tp);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        pe->pidfd = -1;
        pe->local = -1;
        if (params->hosts != NULL &&
            strcmp(params->hosts[p], params->hosts[tp->rank]) == 0) {
            if (p == tp->rank)
                tp->my_local = tp->nlocal;
            pe->local = tp->nlocal++;
        }
    }
    /* Where this host's ranks outnumber its cores the spin yields at every
     * look anyway (the cores are the ranks'). */
    if (tp->spin_ns > 0) {
        hvd_hostload_open(&tp->load, NULL, 0);
        tp->load_on = tp->nlocal <= tp->load.ncpu;
        if (!tp->load_on)
            hvd_hostload_close(&tp->load);
    }
    *out = tp;
    return HVD_OK;
}

/* Round 1: every rank with a same-host peer makes its segment, and all
 * tell each other how that went (all: one blob per rank). */
static hvd_status publish_segments(shm *tp, const hvd_transport_params *params,
                                   shm_blob *all) {
    shm_blob mine;

    memset(&mine, 0, sizeof(mine));
    mine.magic = SHM_MAGIC;
    mine.pid = (int32_t)getpid();
    mine.probe_addr = (uint64_t)(uintptr_t)&tp->cma_probe;
    mine.ok = 1;
    if (tp->nlocal > 1) {
        int nospace = 0;
        if (make_segment(tp, params, &nospace) != HVD_OK) {
            mine.ok = 0;
            mine.nospace = nospace;
            snprintf(mine.err, sizeof(mine.err), "%s", hvd_error_get());
        }
        mine.seg_len = tp->seg_len;
    }
    return params->bootstrap->allgather(params->bootstrap, &mine, sizeof(mine),
                                        all);
}

/*
 * Round 2: maps every same-host peer's segment and tests process_vm_readv
 * on each (unless cma is 0), then tells every rank whether that worked
 * (made: round 1's blobs; mapped gets round 2's).
 */
static hvd_status map_segments(shm *tp, const hvd_transport_params *params,
                               int cma, shm_blob *made, shm_blob *mapped) {
    shm_blob mine;
    int ok = made[tp->rank].ok, cma_ok = cma;
    char err[200] = "";

    for (int p = 0; p < tp->size && ok; p++) {
        if (p == tp->rank || tp->peers[p].local < 0)
            continue;
        made[p].err[sizeof(made[p].err) - 1] = '\0';
        if (!made[p].ok) {
            ok = 0;
            snprintf(err, sizeof(err), "rank %d: %.150s", p, made[p].err);
            break;
        }
        if (map_peer(tp, params, p, &made[p], err, sizeof(err)) != 0) {
            ok = 0;
            break;
        }
        uint64_t word = 0;
        struct iovec l = {&word, sizeof(word)};
        struct iovec r = {(void *)(uintptr_t)made[p].probe_addr, sizeof(word)};
        if (cma_ok && (process_vm_readv(made[p].pid, &l, 1, &r, 1, 0) !=
                           (ssize_t)sizeof(word) ||
                       word != SHM_MAGIC)) {
            HVD_INFO("shm",
                     "process_vm_readv from rank %d is not permitted (%s): "
                     "large messages go through the shared segments",
                     p, strerror(errno));
            cma_ok = 0;
        }
    }
    memset(&mine, 0, sizeof(mine));
    mine.ok = ok;
    mine.cma_ok = cma_ok;
    snprintf(mine.err, sizeof(mine.err), "%s", err);
    return params->bootstrap->allgather(params->bootstrap, &mine, sizeof(mine),
                                        mapped);
}

/*
 * Every rank judges the same way from the same data (both rounds' blobs):
 * one failed rank fails the transport everywhere, and one-sided reads are
 * used only if every rank can make them. The cause is the first rank that
 * could not make its segment (round 1), else the first that could not map
 * its peers' (round 2: a peer's failure in round 1 fails the whole host
 * there too, and is not the cause). A rank that failed itself says so in
 * its own words; the others name the first that did, so that auto's
 * warning (transport/choose.c) is logged by the failed ranks and once
 * more on a host that did not fail, not by every rank.
 */
static hvd_status agree(shm *tp, const hvd_transport_params *params,
                        shm_blob *made, shm_blob *mapped) {
    const shm_blob *b = NULL;
    int who = -1;
    char advice[160] = "";

    tp->cma = 1;
    for (int p = 0; p < tp->size; p++) {
        made[p].err[sizeof(made[p].err) - 1] = '\0';
        mapped[p].err[sizeof(mapped[p].err) - 1] = '\0';
        tp->cma &= mapped[p].cma_ok;
    }
    for (int round = 0; round < 2 && who < 0; round++) {
        b = round == 0 ? made : mapped;
        for (int p = 0; p < tp->size && who < 0; p++)
            if (!b[p].ok)
                who = b[tp->rank].ok ? p : tp->rank;
    }
    if (who < 0)
        return HVD_OK;
    /* Where the transport was asked for by name, the sentence says what
     * to do; under auto the job goes on over another transport. */
    if (b[who].nospace && !params->may_fall_back)
        snprintf(advice, sizeof(advice),
                 " (HVD_TRANSPORT=%s); free space in /dev/shm or use "
                 "HVD_TRANSPORT=%s",
                 hvd_shm_ops.name, hvd_transport_always());
    if (who == tp->rank)
        return hvd_error_set(HVD_ERR_TRANSPORT, "shared memory: %s%s",
                             b[who].err, advice);
    return hvd_error_set(HVD_ERR_TRANSPORT,
                         "shared memory could not be set up on rank %d's "
                         "host (%s): %s%s",
                         who, tp->hosts ? tp->hosts[who] : "?", b[who].err,
                         advice);
}

hvd_status hvd_shm_open(const hvd_transport_params *params,
                        hvd_transport **out) {
    hvd_shm_settings set;
    shm *tp = NULL;
    shm_blob *all = NULL;
    hvd_status st = hvd_transport_read_settings(&hvd_shm_ops, params, &set);

    if (st == HVD_OK)
        st = shm_new(params, &set, &tp);
    if (st != HVD_OK)
        return st;
    /* Round 1's blobs, then round 2's. */
    all = calloc(2 * (size_t)tp->size, sizeof(*all));
    if (all == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto close_tp;
    }
    st = publish_segments(tp, params, all);
    if (st == HVD_OK)
        st = map_segments(tp, params, set.cma, all, all + tp->size);
    if (st == HVD_OK)
        st = agree(tp, params, all, all + tp->size);
    if (st != HVD_OK)
        goto close_tp;
    /* Every same-host rank has mapped every segment: the names can go, so
     * that nothing is left in /dev/shm whatever happens next. */
    if (tp->seg_named) {
        shm_unlink(tp->seg_name);
        tp->seg_named = 0;
    }
    free(all);
    HVD_DEBUG("shm",
              "%d ranks on this host share memory (%zu bytes a segment); "
              "large messages by %s",
              tp->nlocal, tp->seg_len,
              tp->cma ? "process_vm_readv" : "copy through the segments");
    *out = &tp->base;
    return HVD_OK;
close_tp:
    free(all);
    hvd_shm_close(&tp->base);
    return st;
}

/*
 * Says goodbye, then writes out what is still queued: a control message
 * the FIFO could not take was copied and completed at once (hvd_shm_isend), so
 * without this it would be lost when the process exits, or, sent by
 * reference (CELL_RNDV), read from memory that is gone; a peer still
 * waiting for it would find this rank gone (found by the transport suite,
 * tests/transport). Towards each peer it stops once the queue is empty,
 * the peer has said goodbye too (it reads nothing more) or has gone, or
 * after the timeout.
 */
hvd_status hvd_shm_shutdown(hvd_transport *t) {
    shm *tp = (shm *)t;
    int64_t end;

    if (tp->failure.status != HVD_OK || tp->seg == NULL)
        return HVD_OK;
    atomic_store(&hdr_of(tp->seg)->bye, 1);
    for (int p = 0; p < tp->size; p++)
        if (tp->peers[p].seg != NULL)
            hvd_shm_ring(tp->peers[p].seg);
    end = hvd_now_ns() + tp->timeout_ns;
    for (;;) {
        int left = 0;
        for (int p = 0; p < tp->size; p++) {
            speer *pe = &tp->peers[p];
            if (pe->seg == NULL || atomic_load(&hdr_of(pe->seg)->bye) ||
                atomic_load(&hdr_of(pe->seg)->failed) != HVD_OK)
                continue;
            for (int ch = 0; ch < NCHANNELS; ch++) {
                if (pe->sendq[ch].count == 0 && pe->ackq[ch].count == 0)
                    continue;
                hvd_shm_push(tp, p, ch);
                /* A message sent by reference (CELL_RNDV) is read from
                 * this process's memory: it must wait to be read. */
                if ((pe->sendq[ch].count > 0 || pe->ackq[ch].count > 0) &&
                    !hvd_shm_peer_exited(pe))
                    left = 1;
            }
        }
        if (!left || tp->failure.status != HVD_OK || hvd_now_ns() > end)
            break;
        sched_yield();
    }
    return HVD_OK;
}
