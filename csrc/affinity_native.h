/* affinity native core: the cdef seen by cffi (declarations and constants only).
 *
 * Conventions (hwloc's): every function returns 0 (or a count) on success and
 * -1 with errno set on failure.  CPU and node sets cross the boundary as arrays
 * of `unsigned long` words, little-endian bit order (bit i of word i/64 = CPU i).
 * A `tid` of 0 means the calling thread.
 */

#define AFF_OBJ_MACHINE 0
#define AFF_OBJ_PACKAGE 1
#define AFF_OBJ_DIE 2
#define AFF_OBJ_GROUP 3
#define AFF_OBJ_NUMANODE 4
#define AFF_OBJ_CACHE 5
#define AFF_OBJ_CORE 6
#define AFF_OBJ_PU 7

#define AFF_LOAD_SYSTEM 0
#define AFF_LOAD_XML 1
#define AFF_LOAD_SYNTHETIC 2
#define AFF_LOAD_FSROOT 3   /* a Linux file-system root holding sys/ (and proc/), as HWLOC_FSROOT */

#define AFF_MEM_DEFAULT 0
#define AFF_MEM_BIND 1
#define AFF_MEM_INTERLEAVE 2
#define AFF_MEM_PREFERRED 3
#define AFF_MEM_LOCAL 4

#define AFF_MEMF_STRICT 1
#define AFF_MEMF_MIGRATE 2

typedef struct aff_topo aff_topo;

typedef struct {
    int type;               /* AFF_OBJ_* */
    int os_index;           /* -1 when unknown */
    int logical_index;
    int depth;
    int cache_level;        /* caches only */
    unsigned long long size;/* cache size, or NUMA local memory, in bytes */
    char subtype[32];       /* hwloc subtype (Group "Tile", "Module", ...) */
} aff_obj;

/* versions */
unsigned aff_api_version_header(void);
unsigned aff_api_version_runtime(void);

/* topology */
int aff_topo_load(int kind, const char *arg, aff_topo **out);
void aff_topo_free(aff_topo *t);
int aff_topo_is_thissystem(aff_topo *t);
int aff_topo_nwords(aff_topo *t);
int aff_topo_nobjs(aff_topo *t);
int aff_topo_obj(aff_topo *t, int i, aff_obj *out, unsigned long *cpuset, int nwords);
int aff_topo_allowed(aff_topo *t, unsigned long *cpuset, int nwords);
int aff_topo_ncpukinds(aff_topo *t);
int aff_topo_cpukind(aff_topo *t, int i, unsigned long *cpuset, int nwords,
                     int *efficiency, char *coretype, int coretype_len);

/* CPU binding of threads of this process */
int aff_get_thread_cpubind(aff_topo *t, int tid, unsigned long *cpuset, int nwords);
int aff_set_thread_cpubind(aff_topo *t, int tid, const unsigned long *cpuset, int nwords);
int aff_set_threads_cpubind(aff_topo *t, int n, const int *tids, const unsigned long *cpusets,
                            int nwords, unsigned long *old_cpusets, int *failed_index);
int aff_set_process_cpubind(aff_topo *t, const unsigned long *cpuset, int nwords, int *failed_tid);
int aff_get_last_cpu(aff_topo *t, int tid);
int aff_gettid(void);
int aff_tids_not_ours(int n, const int *tids, int *out);

/* Start path in a new session (the launcher's instances): stdin from /dev/null,
 * stdout and stderr to out_fd unless it is -1, SIGPIPE and SIGXFSZ back to their
 * defaults and no signal blocked, and deathsig (0: none) sent to the child when the
 * caller's thread dies -- set before exec, with the parent checked after it.  The
 * caller's descriptors marked close-on-exec are not passed on.  Returns the PID, or
 * -1 with errno set: exec's own errno when the command could not be executed (the
 * child is reaped then). */
int aff_spawn(const char *path, char *const argv[], char *const envp[], int out_fd, int deathsig);

/* memory policy (calling thread) and memory areas */
int aff_set_membind(aff_topo *t, const unsigned long *nodeset, int nwords, int policy, int flags);
int aff_get_mempolicy(int *mode, unsigned long *nodeset, int nwords);

/* memory policies by raw system call, as numactl sets them (no hwloc): the calling
 * thread's policy with `local` as MPOL_LOCAL and `preferred` as MPOL_PREFERRED
 * (MPOL_PREFERRED_MANY for several nodes); the policy of the page at addr; and
 * move_pages(2) (nodes NULL: query where each page is; status[i] = node or -errno) */
int aff_set_mempolicy(int policy, const unsigned long *nodeset, int nwords);
int aff_get_mempolicy_addr(void *addr, int *mode, unsigned long *nodeset, int nwords);
long aff_move_pages(int pid, unsigned long count, void **pages, const int *nodes, int *status,
                    int flags);

int aff_set_area_membind(aff_topo *t, void *addr, size_t len, const unsigned long *nodeset,
                         int nwords, int policy, int flags);
int aff_get_area_membind(aff_topo *t, void *addr, size_t len, unsigned long *nodeset, int nwords,
                         int *policy);
int aff_get_area_memlocation(aff_topo *t, void *addr, size_t len, unsigned long *nodeset,
                             int nwords);

/* OpenMP: run one parallel region of an already-loaded runtime through its GOMP
 * entry point (libgomp, and the GOMP ABI of libiomp5/libomp) and bind team
 * member i to cpusets[i] from inside the region.  tids[i] and readback[i]
 * report what each member is and what the kernel applied; errs[i] its errno
 * (AFF_NEVER_RAN: the runtime ran no member i) and calls[i] the call that failed. */
#define AFF_NEVER_RAN -1
int aff_omp_pin_team(aff_topo *t, void *gomp_parallel, void *omp_get_thread_num, int n,
                     const unsigned long *cpusets, int nwords, int *tids,
                     unsigned long *readback, int *errs, const char **calls);

/* The call the last failing shim of the calling thread failed in ("" if it
 * recorded none): the step of a multi-step shim, named for error messages. */
const char *aff_failed_call(void);
