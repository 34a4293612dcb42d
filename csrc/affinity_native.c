/* affinity native core -- the only file of the project that includes <hwloc.h>.
 *
 * Thin shims with one prefix (aff_) over hwloc 2.x: topology discovery and
 * export, CPU binding of threads by Linux TID, whole-process binding that is
 * all-or-nothing, memory policies and area binding.
 * Every function returns 0 (or a count) on success, -1 with errno on failure;
 * a shim that makes several calls also records which one failed
 * (aff_failed_call()); the Python side (affinity/machine/_native.py) turns that
 * into exceptions that name the call.  errno is set by the failing step itself,
 * never left over from an earlier one.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hwloc.h>
#include <hwloc/linux.h>

#if HWLOC_API_VERSION < 0x00020100
#error "affinity needs hwloc >= 2.1 (hwloc_bitmap_from_ulongs)"
#endif
#if HWLOC_API_VERSION >= 0x00030000
#error "affinity is written against the hwloc 2.x API; hwloc 3 is not supported yet"
#endif

#include "affinity_native.h"

struct aff_topo {
    hwloc_topology_t topo;
    int nobjs;
    hwloc_obj_t *objs;
    int nwords;
};

/* The kernel's memory-policy modes (<linux/mempolicy.h>, enum mempolicy_mode),
 * named here: libnuma's <numaif.h> is not a build dependency, and the older
 * kernel headers lack the newer modes. */
enum {
    KERNEL_MPOL_DEFAULT = 0,
    KERNEL_MPOL_PREFERRED = 1,
    KERNEL_MPOL_BIND = 2,
    KERNEL_MPOL_INTERLEAVE = 3,
    KERNEL_MPOL_LOCAL = 4,
    KERNEL_MPOL_PREFERRED_MANY = 5,
    KERNEL_MPOL_WEIGHTED_INTERLEAVE = 6,
};
/* get_mempolicy(2) flag: the policy of the page at addr */
#define KERNEL_MPOL_F_ADDR (1UL << 1)
/* what aff_mempolicy_mode reports for a kernel mode it does not know: the mode + this */
#define AFF_MEM_UNKNOWN_BASE 100

/* The call the last failing multi-step shim of this thread failed in (a string
 * literal), or NULL: set by fail(), cleared when a shim starts. */
static __thread const char *last_failed_call;

const char *aff_failed_call(void) { return last_failed_call ? last_failed_call : ""; }

static void start(void) { last_failed_call = NULL; }

/* Record that `call` failed with `err` (0: keep the errno the call set, or EINVAL
 * when it set none) and return -1. */
static int fail(const char *call, int err)
{
    if (err)
        errno = err;
    else if (!errno)
        errno = EINVAL;
    last_failed_call = call;
    return -1;
}

unsigned aff_api_version_header(void) { return HWLOC_API_VERSION; }
unsigned aff_api_version_runtime(void) { return hwloc_get_api_version(); }

int aff_gettid(void) { return (int)syscall(SYS_gettid); }

/* The child's side of aff_spawn: only async-signal-safe calls between fork and exec
 * (the parent is a multi-threaded Python).  Any failure is reported through report
 * (close-on-exec: it closes at a successful exec) as an errno. */
static void spawn_child(const char *path, char *const argv[], char *const envp[], int out_fd,
                        int deathsig, pid_t parent, int report)
{
    sigset_t none;
    int err, in;

    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);  /* Python ignores them; a command expects the defaults */
    signal(SIGXFSZ, SIG_DFL);
    if (setsid() < 0)
        goto fail;
    if (deathsig && (prctl(PR_SET_PDEATHSIG, deathsig, 0, 0, 0) != 0 || getppid() != parent))
        goto fail_dead;
    in = open("/dev/null", O_RDONLY);
    if (in < 0 || dup2(in, 0) < 0)
        goto fail;
    if (in != 0)
        close(in);
    if (out_fd >= 0 && (dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0))
        goto fail;
    execve(path, argv, envp);
fail:
    err = errno;
    (void)!write(report, &err, sizeof err);
    _exit(127);
fail_dead:  /* the launcher died before the signal was armed: end as if it had been sent */
    err = ESRCH;
    (void)!write(report, &err, sizeof err);
    _exit(128 + deathsig);
}

int aff_spawn(const char *path, char *const argv[], char *const envp[], int out_fd, int deathsig)
{
    int fds[2], err = 0;
    ssize_t n;
    pid_t parent = getpid(), pid;

    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    pid = fork();
    if (pid == 0)
        spawn_child(path, argv, envp, out_fd, deathsig, parent, fds[1]);
    err = errno;
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        errno = err;
        return -1;
    }
    do
        n = read(fds[0], &err, sizeof err);
    while (n < 0 && errno == EINTR);
    close(fds[0]);
    if (n == (ssize_t)sizeof err) {  /* the child failed before exec: reap it, say why */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        errno = err;
        return -1;
    }
    return (int)pid;
}

/* Which of tids[0..n) are not threads of this process now: tgkill(getpid(), tid, 0)
 * sends no signal and fails with ESRCH unless tid is a live thread of this thread
 * group.  The indexes of those that fail go to out[]; returns their count (the
 * caller asks /proc which of them are another process's and which are gone).  One
 * system call per TID, where listing /proc/self/task costs a directory read. */
int aff_tids_not_ours(int n, const int *tids, int *out)
{
    pid_t self = getpid();
    int k = 0;
    for (int i = 0; i < n; i++)
        if (syscall(SYS_tgkill, self, (pid_t)tids[i], 0) < 0)
            out[k++] = i;
    return k;
}

/* ------------------------------------------------------------------ sets */

static int to_words(hwloc_const_bitmap_t set, unsigned long *words, int nwords)
{
    if (hwloc_bitmap_weight(set) < 0 || hwloc_bitmap_last(set) >= nwords * (int)(8 * sizeof(unsigned long)))
        return fail("hwloc_bitmap_to_ulongs", ERANGE); /* caller's buffer too small (or infinite set) */
    errno = 0;
    return hwloc_bitmap_to_ulongs(set, (unsigned)nwords, words) < 0 ? fail("hwloc_bitmap_to_ulongs", 0) : 0;
}

static hwloc_bitmap_t from_words(const unsigned long *words, int nwords)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) {
        fail("hwloc_bitmap_alloc", ENOMEM);
        return NULL;
    }
    if (hwloc_bitmap_from_ulongs(set, (unsigned)nwords, words) < 0) {
        hwloc_bitmap_free(set);
        fail("hwloc_bitmap_from_ulongs", ENOMEM);
        return NULL;
    }
    return set;
}

/* A CPU set to bind to: never empty (EINVAL), which the kernel would refuse
 * anyway but only after part of a multi-thread bind was done. */
static hwloc_bitmap_t cpuset_from_words(const unsigned long *words, int nwords)
{
    hwloc_bitmap_t set = from_words(words, nwords);
    if (set && hwloc_bitmap_iszero(set)) {
        hwloc_bitmap_free(set);
        fail("aff_set_cpubind (an empty CPU set)", EINVAL);
        return NULL;
    }
    return set;
}

static int require_thissystem(aff_topo *t)
{
    start();
    if (!t || !t->topo)
        return fail("aff_topo (no topology)", EINVAL);
    if (!hwloc_topology_is_thissystem(t->topo))
        /* hwloc would return success and do nothing: refuse instead. */
        return fail("hwloc_topology_is_thissystem", EXDEV);
    return 0;
}

/* -------------------------------------------------------------- topology */

static int obj_kind(hwloc_obj_t o)
{
    switch (o->type) {
    case HWLOC_OBJ_MACHINE: return AFF_OBJ_MACHINE;
    case HWLOC_OBJ_PACKAGE: return AFF_OBJ_PACKAGE;
    case HWLOC_OBJ_DIE: return AFF_OBJ_DIE;
    case HWLOC_OBJ_GROUP: return AFF_OBJ_GROUP;
    case HWLOC_OBJ_NUMANODE: return AFF_OBJ_NUMANODE;
    case HWLOC_OBJ_L1CACHE:
    case HWLOC_OBJ_L2CACHE:
    case HWLOC_OBJ_L3CACHE:
    case HWLOC_OBJ_L4CACHE:
    case HWLOC_OBJ_L5CACHE: return AFF_OBJ_CACHE;
    case HWLOC_OBJ_CORE: return AFF_OBJ_CORE;
    case HWLOC_OBJ_PU: return AFF_OBJ_PU;
    default: return -1;
    }
}

static int collect_objs(aff_topo *t)
{
    int depth = hwloc_topology_get_depth(t->topo);
    int cap = 0, n = 0;
    for (int d = 0; d < depth; d++)
        cap += (int)hwloc_get_nbobjs_by_depth(t->topo, d);
    int nnuma = (int)hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE);
    cap += nnuma > 0 ? nnuma : 0;
    t->objs = calloc(cap ? (size_t)cap : 1, sizeof(hwloc_obj_t));
    if (!t->objs)
        return fail("calloc", ENOMEM);
    for (int d = 0; d < depth; d++) {
        unsigned nb = hwloc_get_nbobjs_by_depth(t->topo, d);
        for (unsigned i = 0; i < nb; i++) {
            hwloc_obj_t o = hwloc_get_obj_by_depth(t->topo, d, i);
            if (obj_kind(o) >= 0)
                t->objs[n++] = o;
        }
    }
    for (int i = 0; i < nnuma; i++)
        t->objs[n++] = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
    t->nobjs = n;
    return 0;
}

/* hwloc 2.x has no call that points its Linux backend at another file-system
 * root: the backend reads HWLOC_FSROOT from the environment when it is
 * instantiated, inside hwloc_topology_load().  So the variable is set around that
 * one call and put back as it was (unset, or its previous value), under a lock
 * that keeps two such loads of this library apart.  The x86 backend (CPUID of the
 * machine we run on) is left out, as hwloc's own fsroot tests do
 * (HWLOC_COMPONENTS=linux,stop): the described machine is not this one. */
static pthread_mutex_t fsroot_lock = PTHREAD_MUTEX_INITIALIZER;

static int load_fsroot(aff_topo *t, const char *root, const char **call)
{
    *call = "hwloc_topology_set_components";
    errno = 0;
    if (hwloc_topology_set_components(t->topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86") < 0)
        return -1;
    pthread_mutex_lock(&fsroot_lock);
    const char *was = getenv("HWLOC_FSROOT");
    char *old = was ? strdup(was) : NULL;
    int rc = -1, err = ENOMEM;
    *call = "setenv (HWLOC_FSROOT)";
    if ((!was || old) && setenv("HWLOC_FSROOT", root, 1) == 0) {
        *call = "hwloc_topology_load (HWLOC_FSROOT)";
        errno = 0;
        rc = hwloc_topology_load(t->topo);
        err = errno;
        if (old)
            setenv("HWLOC_FSROOT", old, 1);
        else
            unsetenv("HWLOC_FSROOT");
    } else if (errno) {
        err = errno;
    }
    free(old);
    pthread_mutex_unlock(&fsroot_lock);
    errno = err;
    return rc;
}

/* Each step clears errno first, so a failure reports the errno of its own call
 * (EINVAL when hwloc sets none), never one left over from before. */
int aff_topo_load(int kind, const char *arg, aff_topo **out)
{
    start();
    aff_topo *t = calloc(1, sizeof(*t));
    if (!t)
        return fail("calloc", ENOMEM);
    const char *call = "hwloc_topology_init";
    errno = 0;
    if (hwloc_topology_init(&t->topo) < 0)
        goto fail;
    /* Know the whole machine, including PUs outside our cgroup cpuset. */
    call = "hwloc_topology_set_flags";
    errno = 0;
    if (hwloc_topology_set_flags(t->topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) < 0)
        goto fail;
    call = "hwloc_topology_set_icache_types_filter";
    errno = 0;
    if (hwloc_topology_set_icache_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_NONE) < 0)
        goto fail;
    errno = 0;
    if (kind == AFF_LOAD_XML) {
        call = "hwloc_topology_set_xml";
        if (!arg || hwloc_topology_set_xml(t->topo, arg) < 0)
            goto fail;
    } else if (kind == AFF_LOAD_SYNTHETIC) {
        call = "hwloc_topology_set_synthetic";
        if (!arg || hwloc_topology_set_synthetic(t->topo, arg) < 0)
            goto fail;
    } else if (kind == AFF_LOAD_FSROOT) {
        call = "aff_topo_load (no file-system root)";
        if (!arg)
            goto fail;
    } else if (kind != AFF_LOAD_SYSTEM) {
        call = "aff_topo_load (unknown kind)";
        errno = EINVAL;
        goto fail;
    }
    if (kind == AFF_LOAD_FSROOT) {
        if (load_fsroot(t, arg, &call) < 0)
            goto fail;
    } else {
        call = "hwloc_topology_load";
        errno = 0;
        if (hwloc_topology_load(t->topo) < 0)
            goto fail;
    }
    call = "calloc";
    errno = 0;
    if (collect_objs(t) < 0)
        goto fail;
    {
        int last = hwloc_bitmap_last(hwloc_topology_get_complete_cpuset(t->topo));
        long conf = kind == AFF_LOAD_SYSTEM ? sysconf(_SC_NPROCESSORS_CONF) : 0;
        int bits = last + 1 > conf ? last + 1 : (int)conf;
        /* room for kernel masks larger than the topology (offline CPUs) */
        t->nwords = bits / (int)(8 * sizeof(unsigned long)) + 2;
    }
    *out = t;
    return 0;
fail:
    {
        int err = errno ? errno : EINVAL;
        if (t->topo)
            hwloc_topology_destroy(t->topo);
        free(t->objs);
        free(t);
        return fail(call, err);
    }
}

void aff_topo_free(aff_topo *t)
{
    if (!t)
        return;
    if (t->topo)
        hwloc_topology_destroy(t->topo);
    free(t->objs);
    free(t);
}

int aff_topo_is_thissystem(aff_topo *t) { return hwloc_topology_is_thissystem(t->topo); }
int aff_topo_nwords(aff_topo *t) { return t->nwords; }
int aff_topo_nobjs(aff_topo *t) { return t->nobjs; }

int aff_topo_obj(aff_topo *t, int i, aff_obj *out, unsigned long *cpuset, int nwords)
{
    start();
    if (i < 0 || i >= t->nobjs)
        return fail("aff_topo_obj (index out of range)", EINVAL);
    hwloc_obj_t o = t->objs[i];
    memset(out, 0, sizeof(*out));
    out->type = obj_kind(o);
    out->os_index = o->os_index == HWLOC_UNKNOWN_INDEX ? -1 : (int)o->os_index;
    out->logical_index = (int)o->logical_index;
    out->depth = o->depth;
    if (out->type == AFF_OBJ_CACHE) {
        out->cache_level = (int)o->attr->cache.depth;
        out->size = o->attr->cache.size;
    } else if (out->type == AFF_OBJ_NUMANODE) {
        out->size = o->attr->numanode.local_memory;
    }
    if (o->subtype)
        snprintf(out->subtype, sizeof(out->subtype), "%s", o->subtype);
    return to_words(o->cpuset, cpuset, nwords);
}

int aff_topo_allowed(aff_topo *t, unsigned long *cpuset, int nwords)
{
    start();
    hwloc_bitmap_t set = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t->topo));
    if (!set)
        return fail("hwloc_bitmap_dup", ENOMEM);
    if (hwloc_topology_is_thissystem(t->topo)) {
        hwloc_bitmap_t mine = hwloc_bitmap_alloc();
        if (mine && hwloc_get_cpubind(t->topo, mine, HWLOC_CPUBIND_PROCESS) == 0)
            hwloc_bitmap_and(set, set, mine);
        hwloc_bitmap_free(mine);
    }
    int rc = to_words(set, cpuset, nwords);
    hwloc_bitmap_free(set);
    return rc;
}

int aff_topo_ncpukinds(aff_topo *t) { return hwloc_cpukinds_get_nr(t->topo, 0); }

int aff_topo_cpukind(aff_topo *t, int i, unsigned long *cpuset, int nwords,
                     int *efficiency, char *coretype, int coretype_len)
{
    start();
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    unsigned nr_infos = 0;
    struct hwloc_info_s *infos = NULL;
    if (!set)
        return fail("hwloc_bitmap_alloc", ENOMEM);
    errno = 0;
    if (hwloc_cpukinds_get_info(t->topo, (unsigned)i, set, efficiency, &nr_infos, &infos, 0) < 0) {
        int err = errno;
        hwloc_bitmap_free(set);
        return fail("hwloc_cpukinds_get_info", err);
    }
    if (coretype_len > 0)
        coretype[0] = '\0';
    for (unsigned k = 0; k < nr_infos; k++)
        if (!strcmp(infos[k].name, "CoreType") && coretype_len > 0)
            snprintf(coretype, (size_t)coretype_len, "%s", infos[k].value);
    int rc = to_words(set, cpuset, nwords);
    hwloc_bitmap_free(set);
    return rc;
}

/* ------------------------------------------------------------ CPU binding */

/* Bind thread tid (0: the calling thread); on failure the call is recorded. */
static int set_tid(aff_topo *t, int tid, hwloc_const_bitmap_t set)
{
    errno = 0;
    if (tid == 0)
        return hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD) < 0 ? fail("hwloc_set_cpubind", 0) : 0;
    return hwloc_linux_set_tid_cpubind(t->topo, (pid_t)tid, set) < 0 ? fail("hwloc_linux_set_tid_cpubind", 0) : 0;
}

/* Read thread tid's mask (0: the calling thread); on failure the call is recorded. */
static int get_tid(aff_topo *t, int tid, hwloc_bitmap_t set)
{
    errno = 0;
    if (tid == 0)
        return hwloc_get_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD) < 0 ? fail("hwloc_get_cpubind", 0) : 0;
    return hwloc_linux_get_tid_cpubind(t->topo, (pid_t)tid, set) < 0 ? fail("hwloc_linux_get_tid_cpubind", 0) : 0;
}

int aff_get_thread_cpubind(aff_topo *t, int tid, unsigned long *cpuset, int nwords)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fail("hwloc_bitmap_alloc", ENOMEM);
    int rc = get_tid(t, tid, set);
    if (rc == 0)
        rc = to_words(set, cpuset, nwords);
    hwloc_bitmap_free(set);
    return rc;
}

int aff_set_thread_cpubind(aff_topo *t, int tid, const unsigned long *cpuset, int nwords)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = cpuset_from_words(cpuset, nwords);
    if (!set)
        return -1;
    int rc = set_tid(t, tid, set);
    hwloc_bitmap_free(set);
    return rc;
}

/* Bind threads tids[i] to cpusets[i] (nwords words each).  The previous masks
 * are stored in old_cpusets.  A thread that exited meanwhile (ESRCH) is skipped
 * and its old mask left all-zero.  Any other failure undoes every change made
 * so far, sets *failed_index and returns -1: all or nothing. */
int aff_set_threads_cpubind(aff_topo *t, int n, const int *tids, const unsigned long *cpusets,
                            int nwords, unsigned long *old_cpusets, int *failed_index)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc(), old = hwloc_bitmap_alloc();
    int rc = 0, i, err = 0;
    const char *call = "hwloc_bitmap_alloc";
    if (!set || !old) {
        rc = fail(call, ENOMEM);
        goto out;
    }
    *failed_index = -1;
    memset(old_cpusets, 0, sizeof(unsigned long) * (size_t)nwords * (size_t)n);
    for (i = 0; i < n; i++) {
        unsigned long *oldw = old_cpusets + (size_t)i * (size_t)nwords;
        if (hwloc_bitmap_from_ulongs(set, (unsigned)nwords, cpusets + (size_t)i * (size_t)nwords) < 0
            || hwloc_bitmap_iszero(set)) {
            err = EINVAL;
            call = "aff_set_threads_cpubind (an empty CPU set)";
            goto undo;
        }
        if (get_tid(t, tids[i], old) < 0) {
            if (errno == ESRCH)
                continue;
            err = errno;
            call = last_failed_call;
            goto undo;
        }
        if (to_words(old, oldw, nwords) < 0) {
            err = errno;
            call = last_failed_call;
            goto undo;
        }
        if (set_tid(t, tids[i], set) < 0) {
            memset(oldw, 0, sizeof(unsigned long) * (size_t)nwords);
            if (errno == ESRCH)
                continue;
            err = errno;
            call = last_failed_call;
            goto undo;
        }
    }
    goto out;
undo:
    *failed_index = i;
    for (int j = i - 1; j >= 0; j--) {
        const unsigned long *oldw = old_cpusets + (size_t)j * (size_t)nwords;
        hwloc_bitmap_from_ulongs(old, (unsigned)nwords, oldw);
        if (!hwloc_bitmap_iszero(old))
            set_tid(t, tids[j], old); /* best effort: restoring a mask it had */
    }
    rc = fail(call, err); /* the step that failed, not one of the restores */
out:
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(old);
    return rc;
}

/* The TIDs of this process, from /proc/self/task: the count, which may exceed
 * max (the caller retries with a larger buffer); -1 with errno on failure.
 * Used only by the all-or-nothing process bind below (Python lists threads
 * itself: affinity.binding.threads.task_ids). */
static int list_threads(int *tids, int max)
{
    errno = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return fail("opendir(/proc/self/task)", 0);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (n < max)
            tids[n] = atoi(e->d_name);
        n++;
    }
    closedir(d);
    return n; /* may exceed max: the caller retries with a larger buffer */
}

/* Bind every thread of the process, including threads that appear while we
 * work (re-scan until no new thread shows up).  All or nothing. */
int aff_set_process_cpubind(aff_topo *t, const unsigned long *cpuset, int nwords, int *failed_tid)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = cpuset_from_words(cpuset, nwords);
    if (!set)
        return -1;
    int cap = 64, ndone = 0, rc = 0, err = 0;
    const char *call = "malloc";
    int *done = malloc(sizeof(int) * (size_t)cap);
    hwloc_bitmap_t *olds = malloc(sizeof(hwloc_bitmap_t) * (size_t)cap);
    int tcap = 256;
    int *tids = malloc(sizeof(int) * (size_t)tcap);
    *failed_tid = 0;
    if (!done || !olds || !tids) {
        err = ENOMEM;
        goto undo;
    }
    for (int pass = 0; pass < 100; pass++) {
        int nt = list_threads(tids, tcap);
        if (nt < 0) {
            err = errno;
            call = last_failed_call;
            goto undo;
        }
        if (nt > tcap) {
            int *bigger = realloc(tids, sizeof(int) * (size_t)nt * 2);
            if (!bigger) {
                err = ENOMEM;
                call = "realloc";
                goto undo;
            }
            tids = bigger;
            tcap = nt * 2;
            pass--;
            continue;
        }
        int fresh = 0;
        for (int k = 0; k < nt; k++) {
            int seen = 0;
            for (int j = 0; j < ndone && !seen; j++)
                seen = done[j] == tids[k];
            if (seen)
                continue;
            fresh = 1;
            if (ndone == cap) {
                int *d2 = realloc(done, sizeof(int) * (size_t)cap * 2);
                if (d2)
                    done = d2;
                hwloc_bitmap_t *o2 = realloc(olds, sizeof(hwloc_bitmap_t) * (size_t)cap * 2);
                if (o2)
                    olds = o2;
                if (!d2 || !o2) {
                    err = ENOMEM;
                    call = "realloc";
                    goto undo;
                }
                cap *= 2;
            }
            hwloc_bitmap_t old = hwloc_bitmap_alloc();
            if (!old) {
                err = ENOMEM;
                call = "hwloc_bitmap_alloc";
                goto undo;
            }
            if (get_tid(t, tids[k], old) < 0 || set_tid(t, tids[k], set) < 0) {
                hwloc_bitmap_free(old);
                if (errno == ESRCH)
                    continue; /* exited meanwhile */
                err = errno;
                call = last_failed_call;
                *failed_tid = tids[k];
                goto undo;
            }
            done[ndone] = tids[k];
            olds[ndone++] = old;
        }
        if (!fresh)
            goto out;
    }
    goto out;
undo:
    for (int j = ndone - 1; j >= 0; j--)
        hwloc_linux_set_tid_cpubind(t->topo, done[j], olds[j]); /* best effort */
    rc = -1;
out:
    for (int j = 0; j < ndone; j++)
        hwloc_bitmap_free(olds[j]);
    free(done);
    free(olds);
    free(tids);
    hwloc_bitmap_free(set);
    if (rc < 0)
        return fail(call, err); /* the step that failed, not one of the restores */
    return rc;
}

int aff_get_last_cpu(aff_topo *t, int tid)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fail("hwloc_bitmap_alloc", ENOMEM);
    errno = 0;
    int rc = hwloc_linux_get_tid_last_cpu_location(t->topo, (pid_t)(tid ? tid : aff_gettid()), set);
    if (rc == 0)
        rc = hwloc_bitmap_first(set);
    else
        fail("hwloc_linux_get_tid_last_cpu_location", 0);
    hwloc_bitmap_free(set);
    return rc;
}

/* ---------------------------------------------------------------- memory */

static int to_hwloc_policy(int policy, int flags, hwloc_membind_policy_t *p, int *hflags)
{
    *hflags = HWLOC_MEMBIND_BYNODESET;
    if (flags & AFF_MEMF_STRICT)
        *hflags |= HWLOC_MEMBIND_STRICT;
    if (flags & AFF_MEMF_MIGRATE)
        *hflags |= HWLOC_MEMBIND_MIGRATE;
    switch (policy) {
    case AFF_MEM_BIND: /* MPOL_BIND on Linux needs hwloc's strict flag */
        *p = HWLOC_MEMBIND_BIND;
        *hflags |= HWLOC_MEMBIND_STRICT;
        return 0;
    case AFF_MEM_PREFERRED: /* without strict hwloc uses MPOL_PREFERRED(_MANY) */
        *p = HWLOC_MEMBIND_BIND;
        *hflags &= ~HWLOC_MEMBIND_STRICT;
        return 0;
    case AFF_MEM_INTERLEAVE:
        *p = HWLOC_MEMBIND_INTERLEAVE;
        return 0;
    case AFF_MEM_LOCAL:
    case AFF_MEM_DEFAULT:
        *p = HWLOC_MEMBIND_DEFAULT;
        return 0;
    default:
        return fail("aff_membind (unknown policy)", EINVAL);
    }
}

/* The arguments of an hwloc membind call: policy, flags and the nodeset (every
 * node for the default policy).  NULL with errno set on a bad request. */
static hwloc_bitmap_t membind_args(aff_topo *t, const unsigned long *nodeset, int nwords, int policy,
                                   int flags, hwloc_membind_policy_t *p, int *hflags)
{
    if (require_thissystem(t) < 0 || to_hwloc_policy(policy, flags, p, hflags) < 0)
        return NULL;
    hwloc_bitmap_t set = from_words(nodeset, nwords);
    if (set && *p == HWLOC_MEMBIND_DEFAULT)
        hwloc_bitmap_copy(set, hwloc_topology_get_topology_nodeset(t->topo));
    return set;
}

int aff_set_membind(aff_topo *t, const unsigned long *nodeset, int nwords, int policy, int flags)
{
    hwloc_membind_policy_t p;
    int hflags;
    hwloc_bitmap_t set = membind_args(t, nodeset, nwords, policy, flags, &p, &hflags);
    if (!set)
        return -1;
    errno = 0;
    int rc = hwloc_set_membind(t->topo, set, p, hflags | HWLOC_MEMBIND_THREAD);
    int err = errno;
    hwloc_bitmap_free(set);
    return rc < 0 ? fail("hwloc_set_membind", err) : rc;
}

static int mode_from_kernel(int m)
{
    switch (m) {
    case KERNEL_MPOL_DEFAULT: return AFF_MEM_DEFAULT;
    case KERNEL_MPOL_PREFERRED:
    case KERNEL_MPOL_PREFERRED_MANY: return AFF_MEM_PREFERRED;
    case KERNEL_MPOL_BIND: return AFF_MEM_BIND;
    case KERNEL_MPOL_INTERLEAVE:
    case KERNEL_MPOL_WEIGHTED_INTERLEAVE: return AFF_MEM_INTERLEAVE;
    case KERNEL_MPOL_LOCAL: return AFF_MEM_LOCAL;
    default: return m + AFF_MEM_UNKNOWN_BASE;
    }
}

/* The calling thread's policy, read from the kernel (hwloc folds PREFERRED
 * into BIND; users want to see which one they have). */
int aff_get_mempolicy(int *mode, unsigned long *nodeset, int nwords)
{
    start();
    int m = 0;
    memset(nodeset, 0, sizeof(unsigned long) * (size_t)nwords);
    if (syscall(SYS_get_mempolicy, &m, nodeset, (unsigned long)nwords * 8 * sizeof(unsigned long),
                NULL, 0UL) < 0)
        return -1;
    *mode = mode_from_kernel(m);
    return 0;
}

/* The policy of the page at addr (get_mempolicy with MPOL_F_ADDR): the area's own
 * policy if it has one, the thread's otherwise. */
int aff_get_mempolicy_addr(void *addr, int *mode, unsigned long *nodeset, int nwords)
{
    start();
    int m = 0;
    memset(nodeset, 0, sizeof(unsigned long) * (size_t)nwords);
    if (syscall(SYS_get_mempolicy, &m, nodeset, (unsigned long)nwords * 8 * sizeof(unsigned long),
                addr, KERNEL_MPOL_F_ADDR) < 0)
        return -1;
    *mode = mode_from_kernel(m);
    return 0;
}

/* The calling thread's policy set by set_mempolicy(2) itself, exactly as numactl
 * does: MPOL_LOCAL for `local`, MPOL_PREFERRED(_MANY) for `preferred`. */
int aff_set_mempolicy(int policy, const unsigned long *nodeset, int nwords)
{
    int m;
    int several = 0, any = 0;
    for (int i = 0; i < nwords; i++) {
        unsigned long w = nodeset[i];
        if (w && (any || (w & (w - 1))))
            several = 1;
        any |= w != 0;
    }
    start();
    switch (policy) {
    case AFF_MEM_DEFAULT: m = KERNEL_MPOL_DEFAULT; break;
    case AFF_MEM_PREFERRED: m = several ? KERNEL_MPOL_PREFERRED_MANY : KERNEL_MPOL_PREFERRED; break;
    case AFF_MEM_BIND: m = KERNEL_MPOL_BIND; break;
    case AFF_MEM_INTERLEAVE: m = KERNEL_MPOL_INTERLEAVE; break;
    case AFF_MEM_LOCAL: m = KERNEL_MPOL_LOCAL; break;
    default:
        return fail("aff_set_mempolicy (unknown policy)", EINVAL);
    }
    if (m == KERNEL_MPOL_DEFAULT || m == KERNEL_MPOL_LOCAL)
        return (int)syscall(SYS_set_mempolicy, m, NULL, 0UL);
    if (!any)
        return fail("aff_set_mempolicy (no node)", EINVAL);
    /* the kernel reads maxnode-1 bits (a historical off-by-one libnuma also pads) */
    return (int)syscall(SYS_set_mempolicy, m, nodeset,
                        (unsigned long)nwords * 8 * sizeof(unsigned long) + 1);
}

long aff_move_pages(int pid, unsigned long count, void **pages, const int *nodes, int *status,
                    int flags)
{
    start();
    return syscall(SYS_move_pages, pid, count, pages, nodes, status, flags);
}

int aff_set_area_membind(aff_topo *t, void *addr, size_t len, const unsigned long *nodeset,
                         int nwords, int policy, int flags)
{
    hwloc_membind_policy_t p;
    int hflags;
    hwloc_bitmap_t set = membind_args(t, nodeset, nwords, policy, flags, &p, &hflags);
    if (!set)
        return -1;
    int rc = hwloc_set_area_membind(t->topo, addr, len, set, p, hflags);
    hwloc_bitmap_free(set);
    return rc;
}

int aff_get_area_membind(aff_topo *t, void *addr, size_t len, unsigned long *nodeset, int nwords,
                         int *policy)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_membind_policy_t p;
    if (!set)
        return fail("hwloc_bitmap_alloc", ENOMEM);
    errno = 0;
    int rc = hwloc_get_area_membind(t->topo, addr, len, set, &p, HWLOC_MEMBIND_BYNODESET);
    if (rc < 0) {
        fail("hwloc_get_area_membind", 0);
    } else {
        switch (p) {
        case HWLOC_MEMBIND_BIND: *policy = AFF_MEM_BIND; break;
        case HWLOC_MEMBIND_INTERLEAVE: *policy = AFF_MEM_INTERLEAVE; break;
        case HWLOC_MEMBIND_FIRSTTOUCH:
        case HWLOC_MEMBIND_DEFAULT: *policy = AFF_MEM_DEFAULT; break;
        default: *policy = (int)p + AFF_MEM_UNKNOWN_BASE; break;
        }
        rc = to_words(set, nodeset, nwords);
    }
    hwloc_bitmap_free(set);
    return rc;
}

int aff_get_area_memlocation(aff_topo *t, void *addr, size_t len, unsigned long *nodeset,
                             int nwords)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fail("hwloc_bitmap_alloc", ENOMEM);
    errno = 0;
    int rc = hwloc_get_area_memlocation(t->topo, addr, len, set, HWLOC_MEMBIND_BYNODESET);
    if (rc < 0)
        fail("hwloc_get_area_memlocation", 0);
    else
        rc = to_words(set, nodeset, nwords);
    hwloc_bitmap_free(set);
    return rc;
}

/* ---------------------------------------------------------------- OpenMP */

typedef void (*aff_gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*aff_omp_thread_num_fn)(void);

struct aff_pin_team {
    aff_topo *t;
    aff_omp_thread_num_fn thread_num;
    int n, nwords;
    const unsigned long *cpusets;
    int *tids;
    unsigned long *readback;
    int *errs;
    const char **calls;
};

static void aff_pin_member(void *arg)
{
    struct aff_pin_team *c = arg;
    int i = c->thread_num();
    if (i < 0 || i >= c->n)
        return;
    c->tids[i] = aff_gettid();
    /* this runs in the member's own thread: its failing call is recorded per member */
    hwloc_bitmap_t set = from_words(c->cpusets + (size_t)i * (size_t)c->nwords, c->nwords);
    if (!set
        || set_tid(c->t, 0, set) < 0
        || get_tid(c->t, 0, set) < 0
        || to_words(set, c->readback + (size_t)i * (size_t)c->nwords, c->nwords) < 0) {
        c->errs[i] = errno;
        c->calls[i] = last_failed_call;
    } else {
        c->errs[i] = 0;
    }
    hwloc_bitmap_free(set);
}

int aff_omp_pin_team(aff_topo *t, void *gomp_parallel, void *omp_get_thread_num, int n,
                     const unsigned long *cpusets, int nwords, int *tids,
                     unsigned long *readback, int *errs, const char **calls)
{
    if (require_thissystem(t) < 0)
        return -1;
    if (!gomp_parallel || !omp_get_thread_num || n <= 0)
        return fail("aff_omp_pin_team (no runtime or no team)", EINVAL);
    struct aff_pin_team c = {t, (aff_omp_thread_num_fn)omp_get_thread_num, n, nwords, cpusets,
                             tids, readback, errs, calls};
    for (int i = 0; i < n; i++) {
        tids[i] = 0;
        errs[i] = AFF_NEVER_RAN; /* until the member reports */
        calls[i] = "GOMP_parallel";
    }
    ((aff_gomp_parallel_fn)gomp_parallel)(aff_pin_member, &c, (unsigned)n, 0);
    for (int i = 0; i < n; i++)
        if (errs[i])
            return fail(calls[i], errs[i] == AFF_NEVER_RAN ? ECHILD : errs[i]);
    return 0;
}
