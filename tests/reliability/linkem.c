/*
 * A link emulator in user space, for kernels without sch_netem: it joins
 * two network namespaces through a TUN device in each and does to the
 * packets crossing between them what `tc qdisc add ... netem delay D J
 * loss L% reorder R%` does on both ends of a veth pair.
 *
 *     hvd_linkem NETNS_A NETNS_B IFNAME [--delay-ms D] [--jitter-ms J]
 *                [--loss-pct L] [--reorder-pct R] [--limit N]
 *                [--seconds S] [--seed X]
 *
 * NETNS_A and NETNS_B are names under /var/run/netns (`ip netns add`),
 * each with a persistent TUN device IFNAME already made (`ip tuntap add
 * dev IFNAME mode tun`), addressed point to point and up. The emulator
 * attaches to both, then forwards: a packet that leaves one namespace
 * through IFNAME enters the other one through its IFNAME.
 *
 * Each packet, in each direction independently:
 * - is dropped with probability L % (netem `loss L%`);
 * - else with probability R % goes on at once (netem `reorder R%`: it
 *   overtakes the delayed packets before it);
 * - else waits D ms plus a uniform jitter in [-J, +J] ms (netem `delay D
 *   J`, whose jitter reorders too);
 * - and is dropped when N packets (default 1000, netem's limit) already
 *   wait.
 *
 * It runs until SIGTERM or SIGINT, or for S seconds (default 600) so that
 * it always ends, then prints one line of counts per direction:
 *   "linkem: A->B packets P dropped D reordered R"
 * (reordered: packets overtaken by a packet read after them in the same
 * direction). Exit status 0, or 1 with a sentence if it could not
 * attach, 2 for bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define PKT_MAX 2048 /* the TUN devices' MTU is 1500 */
#define POOL 4096    /* packet buffers, both directions together */

typedef struct packet {
    uint64_t due_ns; /* when it goes on */
    uint64_t seq;    /* order of reading, in its direction */
    int dir;         /* 0: A to B, 1: B to A */
    uint16_t len;
    uint8_t data[PKT_MAX];
} packet;

typedef struct direction {
    uint64_t read_seq;     /* packets read so far */
    uint64_t max_sent_seq; /* largest seq sent on, +1 */
    uint64_t sent, dropped, reordered;
    int waiting;
} direction;

static packet pool[POOL];
static packet *free_list[POOL];
static int n_free;
static packet *heap[POOL]; /* min-heap by (due_ns, seq) */
static int n_heap;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: the same seed gives the same drops and delays for the
 * same packet sequence. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static double rng_unit(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1du) >> 11) /
           (double)(1ull << 53);
}

static int earlier(const packet *a, const packet *b) {
    if (a->due_ns != b->due_ns)
        return a->due_ns < b->due_ns;
    if (a->dir != b->dir)
        return a->dir < b->dir;
    return a->seq < b->seq;
}

static void heap_push(packet *p) {
    int i = n_heap++;
    heap[i] = p;
    while (i > 0 && earlier(heap[i], heap[(i - 1) / 2])) {
        packet *t = heap[i];
        heap[i] = heap[(i - 1) / 2];
        heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static packet *heap_pop(void) {
    packet *top = heap[0];
    heap[0] = heap[--n_heap];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n_heap && earlier(heap[l], heap[m]))
            m = l;
        if (r < n_heap && earlier(heap[r], heap[m]))
            m = r;
        if (m == i)
            break;
        packet *t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
    return top;
}

/* Opens the TUN device ifname of namespace ns (joining it first). */
static int attach(const char *ns, const char *ifname) {
    char path[512];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
        fprintf(stderr, "linkem: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "linkem: cannot join namespace %s: %s\n", ns,
                strerror(errno));
        close(nsfd);
        return -1;
    }
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fprintf(stderr, "linkem: cannot open /dev/net/tun: %s\n",
                strerror(errno));
        return -1;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
        fprintf(stderr, "linkem: cannot attach to %s in %s: %s\n", ifname, ns,
                strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends on what is due by now. A write that fails (the other side is
 * down, its queue is full) loses the packet, as a link would. */
static void send_due(const int fd[2], direction dirs[2], uint64_t now) {
    while (n_heap > 0 && heap[0]->due_ns <= now) {
        packet *p = heap_pop();
        direction *d = &dirs[p->dir];
        if (write(fd[1 - p->dir], p->data, p->len) < 0)
            d->dropped++;
        else
            d->sent++;
        if (p->seq + 1 < d->max_sent_seq)
            d->reordered++;
        else
            d->max_sent_seq = p->seq + 1;
        d->waiting--;
        free_list[n_free++] = p;
    }
}

static int parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: hvd_linkem NETNS_A NETNS_B IFNAME [--delay-ms D] "
            "[--jitter-ms J] [--loss-pct L] [--reorder-pct R] [--limit N] "
            "[--seconds S] [--seed X]\n");
    return 2;
}

int main(int argc, char **argv) {
    double delay_ms = 20, jitter_ms = 5, loss = 2, reorder = 10;
    double limit = 1000, seconds = 600, seed = 1;
    if (argc < 4)
        return usage();
    for (int i = 4; i < argc; i += 2) {
        double *v = NULL, hi = 1e6;
        if (strcmp(argv[i], "--delay-ms") == 0)
            v = &delay_ms;
        else if (strcmp(argv[i], "--jitter-ms") == 0)
            v = &jitter_ms;
        else if (strcmp(argv[i], "--loss-pct") == 0)
            v = &loss, hi = 100;
        else if (strcmp(argv[i], "--reorder-pct") == 0)
            v = &reorder, hi = 100;
        else if (strcmp(argv[i], "--limit") == 0)
            v = &limit, hi = POOL - 1;
        else if (strcmp(argv[i], "--seconds") == 0)
            v = &seconds;
        else if (strcmp(argv[i], "--seed") == 0)
            v = &seed, hi = 1e15;
        if (v == NULL || i + 1 >= argc || parse_num(argv[i + 1], 0, hi, v))
            return usage();
    }
    if (jitter_ms > delay_ms)
        jitter_ms = delay_ms;
    rng_state ^= (uint64_t)seed * 0x100000001b3u;

    int fd[2];
    fd[0] = attach(argv[1], argv[3]);
    if (fd[0] < 0)
        return 1;
    fd[1] = attach(argv[2], argv[3]);
    if (fd[1] < 0)
        return 1;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    for (int i = 0; i < POOL; i++)
        free_list[i] = &pool[i];
    n_free = POOL;
    direction dirs[2];
    memset(dirs, 0, sizeof dirs);

    printf("linkem: %s <-> %s over %s: delay %.0f ms jitter %.0f ms, "
           "loss %.1f %%, reorder %.1f %%, limit %.0f\n",
           argv[1], argv[2], argv[3], delay_ms, jitter_ms, loss, reorder,
           limit);
    fflush(stdout);

    const uint64_t end_ns = now_ns() + (uint64_t)(seconds * 1e9);
    while (!stop) {
        uint64_t now = now_ns();
        if (now >= end_ns)
            break;
        send_due(fd, dirs, now);
        /* Wait to the nanosecond (ppoll): a poll timeout in whole
         * milliseconds, rounded up, held each packet up to 1 ms longer
         * than its delay. */
        uint64_t wait = n_heap > 0 ? heap[0]->due_ns - now : 100000000u;
        struct timespec timeout = {(time_t)(wait / 1000000000u),
                                   (long)(wait % 1000000000u)};
        struct pollfd pfd[2] = {{fd[0], POLLIN, 0}, {fd[1], POLLIN, 0}};
        int n = ppoll(pfd, 2, &timeout, NULL);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "linkem: poll: %s\n", strerror(errno));
            break;
        }
        now = now_ns();
        for (int k = 0; n > 0 && k < 2; k++) {
            if (!(pfd[k].revents & POLLIN))
                continue;
            /* Read what is there, a bounded batch per wake-up. */
            for (int batch = 0; batch < 64; batch++) {
                packet *p = n_free > 0 ? free_list[n_free - 1] : NULL;
                uint8_t scratch[PKT_MAX];
                ssize_t got =
                    read(fd[k], p != NULL ? p->data : scratch, PKT_MAX);
                if (got <= 0)
                    break;
                direction *d = &dirs[k];
                uint64_t seq = d->read_seq++;
                if (p == NULL || d->waiting >= (int)limit ||
                    rng_unit() * 100 < loss) {
                    d->dropped++;
                    continue;
                }
                n_free--;
                p->len = (uint16_t)got;
                p->dir = k;
                p->seq = seq;
                if (rng_unit() * 100 < reorder) {
                    p->due_ns = now;
                } else {
                    double ms = delay_ms + (2 * rng_unit() - 1) * jitter_ms;
                    p->due_ns = now + (uint64_t)(ms * 1e6);
                }
                d->waiting++;
                heap_push(p);
            }
        }
    }
    for (int k = 0; k < 2; k++)
        printf("linkem: %s packets %llu dropped %llu reordered %llu\n",
               k == 0 ? "A->B" : "B->A", (unsigned long long)dirs[k].sent,
               (unsigned long long)dirs[k].dropped,
               (unsigned long long)dirs[k].reordered);
    return 0;
}
