/* libaffinity_pin.so -- pin threads as they are created (LD_PRELOAD).
 *
 * `affinity run --pin-threads` preloads this library.  It wraps pthread_create:
 * each new thread starts in a small trampoline that binds it (sched_setaffinity
 * on its own TID) to the next slot of the plan, in creation order, before the
 * thread's own start routine runs -- so it never runs, allocates or
 * first-touches memory anywhere else.  The main thread takes slot 0 when the
 * library is loaded (likwid-pin's model).  Plain C, no hwloc, no Python.
 *
 * Configuration, read once when the library is loaded:
 *   AFFINITY_PIN_SLOTS    slots separated by ';', each a CPU list in the
 *                         kernel's syntax: "0;1;2-3;8,10".  Unset or empty:
 *                         the library does nothing.
 *   AFFINITY_PIN_SKIP     hex mask over created threads (bit i = the i-th
 *                         pthread_create call, 0-based): those threads are not
 *                         pinned and take no slot (helper threads such as
 *                         Intel OpenMP's monitor).  Default 0.
 *   AFFINITY_PIN_MAIN     "0": leave the main thread alone; created threads then
 *                         start at slot 0.  Default "1".
 *   AFFINITY_PIN_VERBOSE  "1": report every pin on stderr as
 *                         "affinity-pin: pid P tid T thread N bound to OS proc set {0-3}".
 *   AFFINITY_PIN_CHILDREN "1": processes the command starts (which inherit the
 *                         preload) pin their threads too, each from slot 0 again.
 *                         Default: only the command's own process pins: the
 *                         library marks it (AFFINITY_PIN_OWNER=<pid>, exported to
 *                         what it starts); a process of another pid -- a
 *                         multiprocessing worker, a helper a shell script runs --
 *                         gets every CPU of the plan (not the one slot its creator
 *                         was on) and no pinning, while the exec chain of the
 *                         command (a pyenv shim exec'ing the real python keeps
 *                         its pid) is pinned.
 * Threads beyond the last slot wrap around to slot 0.  A failed
 * sched_setaffinity is always reported on stderr; the thread then runs with the
 * mask it inherited.
 *
 * A process forked without exec (a multiprocessing or DataLoader worker under
 * the "fork" start method) is such a process too: a pthread_atfork handler gives
 * it every CPU of the plan and stops pinning in it, or with AFFINITY_PIN_CHILDREN=1
 * pins it from slot 0 again, as an exec'd child would be.
 *
 * Safety: the creation counter is a lock-free atomic; the only allocation is a
 * 3-word record per pthread_create (freed by the new thread, or at once if the
 * creation fails); no lock is ever held, so fork() at any moment is harmless; the
 * fork handler makes one system call on a set computed at load.  Reports are
 * formatted in a stack buffer and written with one write(2).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PIN_API __attribute__((visibility("default")))

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

static create_fn real_create;
static cpu_set_t **slots;      /* nslots sets of setsize bytes */
static int nslots;
static size_t setsize;
static unsigned char *skip;    /* skip[i] != 0: the i-th created thread is skipped */
static unsigned nskip;
static int pin_main = 1;
static int pin_children;       /* AFFINITY_PIN_CHILDREN=1 */
static cpu_set_t *plan_cpus;   /* every CPU of the slots: a started process's mask */
static int verbose;
static unsigned created;       /* pthread_create calls so far (atomic) */
static unsigned pinned;        /* created threads that took a slot (atomic) */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void say(const char *text, size_t len)
{
    while (len > 0) {
        ssize_t w = write(2, text, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        text += w;
        len -= (size_t)w;
    }
}

/* "0-3,8" into buf (always NUL-terminated, truncated with "..." when too long) */
static void format_set(const cpu_set_t *set, char *buf, size_t len)
{
    size_t n = 0;
    int ncpu = (int)(setsize * 8), first = 1;
    buf[0] = '\0';
    for (int c = 0; c < ncpu; c++) {
        if (!CPU_ISSET_S(c, setsize, set))
            continue;
        int e = c;
        while (e + 1 < ncpu && CPU_ISSET_S(e + 1, setsize, set))
            e++;
        int w = e == c ? snprintf(buf + n, len - n, "%s%d", first ? "" : ",", c)
                       : snprintf(buf + n, len - n, "%s%d-%d", first ? "" : ",", c, e);
        if (w < 0 || (size_t)w >= len - n) {
            if (len > 4)
                strcpy(buf + len - 4, "...");
            return;
        }
        n += (size_t)w;
        first = 0;
        c = e;
    }
}

static void report_bad_config(const char *what, const char *value)
{
    char msg[512];
    int w = snprintf(msg, sizeof msg, "affinity-pin: bad %s=\"%.300s\": thread pinning disabled\n",
                     what, value);
    if (w > 0)
        say(msg, (size_t)w < sizeof msg ? (size_t)w : sizeof msg - 1);
}

/* parse "a-b,c" into set; 0 on success */
static int parse_list(const char *s, const char *end, cpu_set_t *set)
{
    CPU_ZERO_S(setsize, set);
    int any = 0;
    while (s < end) {
        char *p;
        long a = strtol(s, &p, 10), b;
        if (p == s || a < 0)
            return -1;
        b = a;
        if (p < end && *p == '-') {
            s = p + 1;
            b = strtol(s, &p, 10);
            if (p == s || b < a)
                return -1;
        }
        if ((size_t)b >= setsize * 8)
            return -1;
        for (long c = a; c <= b; c++)
            CPU_SET_S((int)c, setsize, set);
        any = 1;
        if (p < end && *p != ',')
            return -1;
        s = p < end ? p + 1 : p;
    }
    return any ? 0 : -1;
}

static int parse_slots(const char *text)
{
    long maxcpu = -1;
    int count = 1;
    for (const char *p = text; *p; p++) {
        if (*p == ';')
            count++;
        else if (*p >= '0' && *p <= '9') {
            long v = strtol(p, (char **)&p, 10);
            if (v > maxcpu)
                maxcpu = v;
            p--;
        }
    }
    if (maxcpu < 0 || maxcpu > (1L << 20))
        return -1;
    setsize = CPU_ALLOC_SIZE((int)maxcpu + 1);
    slots = calloc((size_t)count, sizeof *slots);
    if (!slots)
        return -1;
    const char *s = text;
    for (int i = 0; i < count; i++) {
        const char *e = strchr(s, ';');
        if (!e)
            e = s + strlen(s);
        slots[i] = CPU_ALLOC((int)maxcpu + 1);
        if (!slots[i] || parse_list(s, e, slots[i]) < 0)
            return -1;
        s = *e ? e + 1 : e;
    }
    nslots = count;
    return 0;
}

static int parse_skip(const char *text)
{
    const char *p = text;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        p += 2;
    size_t digits = strlen(p);
    if (digits == 0)
        return -1;
    nskip = (unsigned)(digits * 4);
    skip = calloc(nskip, 1);
    if (!skip)
        return -1;
    for (size_t k = 0; k < digits; k++) {
        char ch = p[digits - 1 - k];
        int v = ch >= '0' && ch <= '9' ? ch - '0'
              : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (v < 0)
            return -1;
        for (int b = 0; b < 4; b++)
            skip[k * 4 + (size_t)b] = (unsigned char)((v >> b) & 1);
    }
    return 0;
}

static void free_config(void)
{
    for (int i = 0; slots && i < nslots; i++)
        CPU_FREE(slots[i]);
    free(slots);
    free(skip);
    slots = NULL;
    skip = NULL;
    nslots = 0;
    nskip = 0;
}

static void pin_self(int slot, unsigned thread_no)
{
    const cpu_set_t *set = slots[slot];
    char cpus[256], msg[400];
    int w;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    if (sched_setaffinity(0, setsize, set) != 0) {
        int err = errno;
        format_set(set, cpus, sizeof cpus);
        w = snprintf(msg, sizeof msg,
                     "affinity-pin: sched_setaffinity(tid %d, {%s}) failed for thread %u: %s\n",
                     (int)tid, cpus, thread_no, strerror(err));
        if (w > 0)
            say(msg, (size_t)w < sizeof msg ? (size_t)w : sizeof msg - 1);
        return;
    }
    if (verbose) {
        format_set(set, cpus, sizeof cpus);
        w = snprintf(msg, sizeof msg, "affinity-pin: pid %d tid %d thread %u bound to OS proc set {%s}\n",
                     (int)getpid(), (int)tid, thread_no, cpus);
        if (w > 0)
            say(msg, (size_t)w < sizeof msg ? (size_t)w : sizeof msg - 1);
    }
}

/* Whether this process is the one to pin (see AFFINITY_PIN_CHILDREN); marks it. */
static int owned_here(void)
{
    const char *children = getenv("AFFINITY_PIN_CHILDREN");
    if (children && strcmp(children, "1") == 0)
        return 1;
    char me[24];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    const char *owner = getenv("AFFINITY_PIN_OWNER");
    if (owner && *owner)
        return strcmp(owner, me) == 0;
    setenv("AFFINITY_PIN_OWNER", me, 1); /* constructors run before any thread */
    return 1;
}

/* The union of the slots (NULL if it cannot be allocated). */
static cpu_set_t *slots_union(void)
{
    cpu_set_t *all = CPU_ALLOC((int)(setsize * 8));
    if (all) {
        CPU_ZERO_S(setsize, all);
        for (int i = 0; i < nslots; i++)
            CPU_OR_S(setsize, all, all, slots[i]);
    }
    return all;
}

/* A process the command started inherits the one-slot mask of the thread that
 * started it: give it every CPU of the plan instead, and pin nothing in it. */
static void release_child(const char *text)
{
    if (!text || !*text || parse_slots(text) < 0) {
        free_config();
        return;
    }
    cpu_set_t *all = slots_union();
    if (all) {
        sched_setaffinity(0, setsize, all); /* best effort: the inherited mask stays otherwise */
        CPU_FREE(all);
    }
    free_config();
}

/* pthread_atfork's child handler: the forked process is one the command started
 * (it runs the forking thread alone, on that thread's slot). */
static void forked_child(void)
{
    if (nslots == 0)
        return;
    if (pin_children) { /* from slot 0 again, as a process that execs this library is */
        __atomic_store_n(&created, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pinned, 0, __ATOMIC_RELAXED);
        if (pin_main)
            pin_self(0, 0);
        return;
    }
    if (plan_cpus)
        sched_setaffinity(0, setsize, plan_cpus); /* best effort, as release_child */
    nslots = 0; /* pin nothing here (the slots stay allocated: no free() after fork) */
}

static void init(void)
{
    real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (!owned_here()) {
        release_child(getenv("AFFINITY_PIN_SLOTS"));
        return;
    }
    const char *v = getenv("AFFINITY_PIN_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    v = getenv("AFFINITY_PIN_MAIN");
    pin_main = !(v && strcmp(v, "0") == 0);
    const char *text = getenv("AFFINITY_PIN_SLOTS");
    if (!text || !*text)
        return;
    if (parse_slots(text) < 0) {
        report_bad_config("AFFINITY_PIN_SLOTS", text);
        free_config();
        return;
    }
    v = getenv("AFFINITY_PIN_SKIP");
    if (v && *v && parse_skip(v) < 0) {
        report_bad_config("AFFINITY_PIN_SKIP", v);
        free_config();
        return;
    }
    v = getenv("AFFINITY_PIN_CHILDREN");
    pin_children = v && strcmp(v, "1") == 0;
    plan_cpus = slots_union();
    pthread_atfork(NULL, NULL, forked_child);
}

__attribute__((constructor)) static void pin_main_thread(void)
{
    pthread_once(&once, init);
    if (nslots > 0 && pin_main)
        pin_self(0, 0);
}

struct start {
    void *(*fn)(void *);
    void *arg;
    int slot;       /* -1: not pinned */
    unsigned thread_no;
};

static void *trampoline(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    if (s.slot >= 0)
        pin_self(s.slot, s.thread_no);
    else if (verbose) {
        char msg[160];
        int w = snprintf(msg, sizeof msg,
                         "affinity-pin: pid %d tid %d thread %u skipped (AFFINITY_PIN_SKIP)\n",
                         (int)getpid(), (int)syscall(SYS_gettid), s.thread_no);
        if (w > 0)
            say(msg, (size_t)w < sizeof msg ? (size_t)w : sizeof msg - 1);
    }
    return s.fn(s.arg);
}

PIN_API int pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                           void *(*start_routine)(void *), void *arg)
{
    pthread_once(&once, init);
    if (!real_create)
        return EAGAIN; /* no pthread_create further down: nothing sane to do */
    if (nslots == 0)
        return real_create(thread, attr, start_routine, arg);
    struct start *s = malloc(sizeof *s);
    if (!s)
        return EAGAIN;
    unsigned k = __atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
    s->fn = start_routine;
    s->arg = arg;
    s->thread_no = k + 1;
    if (k < nskip && skip[k]) {
        s->slot = -1;
    } else {
        unsigned n = __atomic_fetch_add(&pinned, 1, __ATOMIC_RELAXED);
        s->slot = (int)((n + (pin_main ? 1u : 0u)) % (unsigned)nslots);
    }
    int rc = real_create(thread, attr, trampoline, s);
    if (rc != 0)
        free(s);
    return rc;
}
