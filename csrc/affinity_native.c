/* affinity native core -- the only file of the project that includes <hwloc.h>.
 *
 * Thin shims with one prefix (aff_) over hwloc 2.x: topology discovery and
 * export, CPU binding of threads by Linux TID, whole-process binding that is
 * all-or-nothing, memory policies and area binding.
 * Every function returns 0 (or a count) on success, -1 with errno on failure;
 * the Python side (affinity/_native.py) turns that into exceptions that name
 * the call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
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

unsigned aff_api_version_header(void) { return HWLOC_API_VERSION; }
unsigned aff_api_version_runtime(void) { return hwloc_get_api_version(); }

int aff_gettid(void) { return (int)syscall(SYS_gettid); }

/* ------------------------------------------------------------------ sets */

static int to_words(hwloc_const_bitmap_t set, unsigned long *words, int nwords)
{
    if (hwloc_bitmap_weight(set) < 0 || hwloc_bitmap_last(set) >= nwords * (int)(8 * sizeof(unsigned long))) {
        errno = ERANGE; /* caller's buffer too small (or infinite set) */
        return -1;
    }
    return hwloc_bitmap_to_ulongs(set, (unsigned)nwords, words) < 0 ? -1 : 0;
}

static hwloc_bitmap_t from_words(const unsigned long *words, int nwords)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) {
        errno = ENOMEM;
        return NULL;
    }
    if (hwloc_bitmap_from_ulongs(set, (unsigned)nwords, words) < 0) {
        hwloc_bitmap_free(set);
        errno = ENOMEM;
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
        errno = EINVAL;
        return NULL;
    }
    return set;
}

static int require_thissystem(aff_topo *t)
{
    if (!t || !t->topo) {
        errno = EINVAL;
        return -1;
    }
    if (!hwloc_topology_is_thissystem(t->topo)) {
        /* hwloc would return success and do nothing: refuse instead. */
        errno = EXDEV;
        return -1;
    }
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
    if (!t->objs) {
        errno = ENOMEM;
        return -1;
    }
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

int aff_topo_load(int kind, const char *arg, aff_topo **out)
{
    aff_topo *t = calloc(1, sizeof(*t));
    if (!t) {
        errno = ENOMEM;
        return -1;
    }
    int err = 0;
    if (hwloc_topology_init(&t->topo) < 0)
        goto fail;
    /* Know the whole machine, including PUs outside our cgroup cpuset. */
    if (hwloc_topology_set_flags(t->topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) < 0)
        goto fail;
    hwloc_topology_set_icache_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    if (kind == AFF_LOAD_XML) {
        if (!arg || hwloc_topology_set_xml(t->topo, arg) < 0)
            goto fail;
    } else if (kind == AFF_LOAD_SYNTHETIC) {
        if (!arg || hwloc_topology_set_synthetic(t->topo, arg) < 0)
            goto fail;
    } else if (kind != AFF_LOAD_SYSTEM) {
        errno = EINVAL;
        goto fail;
    }
    if (hwloc_topology_load(t->topo) < 0)
        goto fail;
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
    err = errno ? errno : EINVAL;
    if (t->topo)
        hwloc_topology_destroy(t->topo);
    free(t->objs);
    free(t);
    errno = err;
    return -1;
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
    if (i < 0 || i >= t->nobjs) {
        errno = EINVAL;
        return -1;
    }
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
    hwloc_bitmap_t set = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t->topo));
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
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
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    unsigned nr_infos = 0;
    struct hwloc_info_s *infos = NULL;
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
    if (hwloc_cpukinds_get_info(t->topo, (unsigned)i, set, efficiency, &nr_infos, &infos, 0) < 0) {
        hwloc_bitmap_free(set);
        return -1;
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

static int set_tid(aff_topo *t, int tid, hwloc_const_bitmap_t set)
{
    if (tid == 0)
        return hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD);
    return hwloc_linux_set_tid_cpubind(t->topo, (pid_t)tid, set);
}

static int get_tid(aff_topo *t, int tid, hwloc_bitmap_t set)
{
    if (tid == 0)
        return hwloc_get_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD);
    return hwloc_linux_get_tid_cpubind(t->topo, (pid_t)tid, set);
}

int aff_get_thread_cpubind(aff_topo *t, int tid, unsigned long *cpuset, int nwords)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
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
    if (!set || !old) {
        errno = ENOMEM;
        rc = -1;
        goto out;
    }
    *failed_index = -1;
    memset(old_cpusets, 0, sizeof(unsigned long) * (size_t)nwords * (size_t)n);
    for (i = 0; i < n; i++) {
        unsigned long *oldw = old_cpusets + (size_t)i * (size_t)nwords;
        if (hwloc_bitmap_from_ulongs(set, (unsigned)nwords, cpusets + (size_t)i * (size_t)nwords) < 0
            || hwloc_bitmap_iszero(set)) {
            err = EINVAL;
            goto undo;
        }
        if (get_tid(t, tids[i], old) < 0) {
            if (errno == ESRCH)
                continue;
            err = errno;
            goto undo;
        }
        if (to_words(old, oldw, nwords) < 0) {
            err = errno;
            goto undo;
        }
        if (set_tid(t, tids[i], set) < 0) {
            if (errno == ESRCH) {
                memset(oldw, 0, sizeof(unsigned long) * (size_t)nwords);
                continue;
            }
            err = errno;
            memset(oldw, 0, sizeof(unsigned long) * (size_t)nwords);
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
    errno = err;
    rc = -1;
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
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
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
            goto undo;
        }
        if (nt > tcap) {
            int *bigger = realloc(tids, sizeof(int) * (size_t)nt * 2);
            if (!bigger) {
                err = ENOMEM;
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
                    goto undo;
                }
                cap *= 2;
            }
            hwloc_bitmap_t old = hwloc_bitmap_alloc();
            if (!old) {
                err = ENOMEM;
                goto undo;
            }
            if (hwloc_linux_get_tid_cpubind(t->topo, tids[k], old) < 0
                || hwloc_linux_set_tid_cpubind(t->topo, tids[k], set) < 0) {
                hwloc_bitmap_free(old);
                if (errno == ESRCH)
                    continue; /* exited meanwhile */
                err = errno;
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
        hwloc_linux_set_tid_cpubind(t->topo, done[j], olds[j]);
    rc = -1;
out:
    for (int j = 0; j < ndone; j++)
        hwloc_bitmap_free(olds[j]);
    free(done);
    free(olds);
    free(tids);
    hwloc_bitmap_free(set);
    if (rc < 0)
        errno = err;
    return rc;
}

int aff_get_last_cpu(aff_topo *t, int tid)
{
    if (require_thissystem(t) < 0)
        return -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
    int rc = hwloc_linux_get_tid_last_cpu_location(t->topo, (pid_t)(tid ? tid : aff_gettid()), set);
    if (rc == 0)
        rc = hwloc_bitmap_first(set);
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
        errno = EINVAL;
        return -1;
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
    int rc = hwloc_set_membind(t->topo, set, p, hflags | HWLOC_MEMBIND_THREAD);
    hwloc_bitmap_free(set);
    return rc;
}

static int mode_from_kernel(int m)
{
    switch (m) {
    case 0: return AFF_MEM_DEFAULT;
    case 1: /* MPOL_PREFERRED */
    case 5: /* MPOL_PREFERRED_MANY */ return AFF_MEM_PREFERRED;
    case 2: return AFF_MEM_BIND;
    case 3: /* MPOL_INTERLEAVE */
    case 6: /* MPOL_WEIGHTED_INTERLEAVE */ return AFF_MEM_INTERLEAVE;
    case 4: return AFF_MEM_LOCAL;
    default: return m + 100;
    }
}

/* The calling thread's policy, read from the kernel (hwloc folds PREFERRED
 * into BIND; users want to see which one they have). */
int aff_get_mempolicy(int *mode, unsigned long *nodeset, int nwords)
{
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
    int m = 0;
    memset(nodeset, 0, sizeof(unsigned long) * (size_t)nwords);
    if (syscall(SYS_get_mempolicy, &m, nodeset, (unsigned long)nwords * 8 * sizeof(unsigned long),
                addr, 2UL /* MPOL_F_ADDR */) < 0)
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
    switch (policy) {
    case AFF_MEM_DEFAULT: m = 0; break;
    case AFF_MEM_PREFERRED: m = several ? 5 /* MPOL_PREFERRED_MANY */ : 1; break;
    case AFF_MEM_BIND: m = 2; break;
    case AFF_MEM_INTERLEAVE: m = 3; break;
    case AFF_MEM_LOCAL: m = 4; break;
    default:
        errno = EINVAL;
        return -1;
    }
    if (m == 0 || m == 4)
        return (int)syscall(SYS_set_mempolicy, m, NULL, 0UL);
    if (!any) {
        errno = EINVAL;
        return -1;
    }
    /* the kernel reads maxnode-1 bits (a historical off-by-one libnuma also pads) */
    return (int)syscall(SYS_set_mempolicy, m, nodeset,
                        (unsigned long)nwords * 8 * sizeof(unsigned long) + 1);
}

long aff_move_pages(int pid, unsigned long count, void **pages, const int *nodes, int *status,
                    int flags)
{
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
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
    int rc = hwloc_get_area_membind(t->topo, addr, len, set, &p, HWLOC_MEMBIND_BYNODESET);
    if (rc == 0) {
        switch (p) {
        case HWLOC_MEMBIND_BIND: *policy = AFF_MEM_BIND; break;
        case HWLOC_MEMBIND_INTERLEAVE: *policy = AFF_MEM_INTERLEAVE; break;
        case HWLOC_MEMBIND_FIRSTTOUCH:
        case HWLOC_MEMBIND_DEFAULT: *policy = AFF_MEM_DEFAULT; break;
        default: *policy = (int)p + 100; break;
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
    if (!set) {
        errno = ENOMEM;
        return -1;
    }
    int rc = hwloc_get_area_memlocation(t->topo, addr, len, set, HWLOC_MEMBIND_BYNODESET);
    if (rc == 0)
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
};

static void aff_pin_member(void *arg)
{
    struct aff_pin_team *c = arg;
    int i = c->thread_num();
    if (i < 0 || i >= c->n)
        return;
    c->tids[i] = aff_gettid();
    hwloc_bitmap_t set = from_words(c->cpusets + (size_t)i * (size_t)c->nwords, c->nwords);
    if (!set) {
        c->errs[i] = ENOMEM;
        return;
    }
    if (hwloc_set_cpubind(c->t->topo, set, HWLOC_CPUBIND_THREAD) < 0) {
        c->errs[i] = errno ? errno : EINVAL;
    } else if (hwloc_get_cpubind(c->t->topo, set, HWLOC_CPUBIND_THREAD) < 0
               || to_words(set, c->readback + (size_t)i * (size_t)c->nwords, c->nwords) < 0) {
        c->errs[i] = errno ? errno : EINVAL;
    } else {
        c->errs[i] = 0;
    }
    hwloc_bitmap_free(set);
}

int aff_omp_pin_team(aff_topo *t, void *gomp_parallel, void *omp_get_thread_num, int n,
                     const unsigned long *cpusets, int nwords, int *tids,
                     unsigned long *readback, int *errs)
{
    if (require_thissystem(t) < 0)
        return -1;
    if (!gomp_parallel || !omp_get_thread_num || n <= 0) {
        errno = EINVAL;
        return -1;
    }
    struct aff_pin_team c = {t, (aff_omp_thread_num_fn)omp_get_thread_num, n, nwords, cpusets,
                             tids, readback, errs};
    for (int i = 0; i < n; i++) {
        tids[i] = 0;
        errs[i] = ESRCH; /* "this member never ran" until it reports */
    }
    ((aff_gomp_parallel_fn)gomp_parallel)(aff_pin_member, &c, (unsigned)n, 0);
    for (int i = 0; i < n; i++)
        if (errs[i]) {
            errno = errs[i];
            return -1;
        }
    return 0;
}
