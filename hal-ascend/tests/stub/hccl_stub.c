/*
 * Stub libhccl.so: the HCCL entry points taskd-hal-ascend binds, recording every call.
 * Build with -pthread; with -DSTUB_OMIT_COMM_RESUME to leave out HcclCommResume (missing-symbol
 * test).
 *
 * Two kinds of communicator, both logged as comm=#<id>:
 *
 * - Framework-made ones (stub_hccl_new_comm): named and sized as told, with no peers in this
 *   process. Their all-reduce is the identity (send copied to recv) and returns at once; their
 *   NIC set only records.
 *
 * - Root-info ones (HcclCommInitRootInfo): the ranks that join with the same root info and
 *   nRanks form one *group*, as threads of one process (one per rank, as in the hardware rig).
 *   Every member's HcclGetCommName answers the group's name, "stubcomm_<id of the first
 *   member's comm>". Within a group the stub enforces what real HCCL requires:
 *     - HcclAllReduce is a real collective: each member blocks until every member has called,
 *       then receives the element-wise reduction (sum/prod/max/min of int8..int64, uint8..uint64,
 *       fp32, fp64; fp16/bf16 only in a one-rank group) of everyone's send buffer. Members must
 *       agree on count, dataType and op (else HCCL_E_PARA). A member that waits longer than the
 *       collective timeout (stub_hccl_set_collective_timeout_ms, default 60 s) gets
 *       HCCL_E_TIMEOUT and breaks the group; destroying a member breaks it too. Every later
 *       collective of a broken group, and every one waiting, fails with HCCL_E_REMOTE.
 *     - HcclCommWorkingDevNicSet does not block. It fails with HCCL_E_INTERNAL when this member
 *       never completed a collective ("NICSET_BEFORE_COLLECTIVE"), or while the same
 *       communicator is inside a collective ("NICSET_DURING_COLLECTIVE": training was not
 *       paused), and with HCCL_E_PARA when the k-th call of this member differs in ranks or
 *       useBackup from the k-th call of the member that made it first ("NICSET_MISMATCH"; the
 *       k-th call counts the calls that passed the two checks before).
 *       Its log line ends with " group=<name> rank=<group rank>".
 *     - HCCL's per-operator NIC rule (CANN's HcclCommWorkingDevNicSet page): a NIC set that
 *       succeeds reaches the member's set configuration and every operator (all-reduce of one
 *       count, dataType and op) the member had issued on the communicator; an operator first
 *       issued later starts on the default NIC (every rank primary). A collective whose members
 *       hold different configurations of its operator fails for all of them with
 *       HCCL_E_INTERNAL ("HcclAllReduce NIC_DISAGREE"); one that runs with a rank on its default
 *       NIC that a member's set configuration has on its backup NIC is logged
 *       ("HcclAllReduce DEFAULT_NIC group=<name> count=<count>") and counted
 *       (stub_hccl_collectives_on_default_nic).
 */
#include "stub_common.h" /* first: it sets the POSIX feature level */
#include <errno.h>
#include <stdbool.h>

typedef int32_t HcclResult;
typedef void *HcclComm;
typedef void *aclrtStream;
typedef struct {
    char internal[4108];
} HcclRootInfo;

#define HCCL_E_PARA 1
#define HCCL_E_PTR 2
#define HCCL_E_MEMORY 3
#define HCCL_E_INTERNAL 4
#define HCCL_E_NOT_SUPPORT 5
#define HCCL_E_TIMEOUT 9
#define HCCL_E_REMOTE 21

static struct stub_rc g_rc[] = {
    {"HcclCommWorkingDevNicSet", 0}, {"HcclGetRootInfo", 0}, {"HcclCommInitRootInfo", 0},
    {"HcclGetRankId", 0},            {"HcclGetRankSize", 0}, {"HcclAllReduce", 0},
    {"HcclCommResume", 0},           {"HcclCommDestroy", 0}, {"HcclGetCommName", 0},
    {0, 0},
};
static struct stub_rc *stub_rc_table(void) { return g_rc; }

/* Guards communicators and groups; collectives wait on their group's condition variable. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_collective_timeout_ms = 60000;

#define MAX_NICSET_CALLS 256
#define MAX_OPS 64

struct stub_group;

/* One operator a member issued, and its NIC configuration (useBackup per group rank). */
struct stub_op {
    uint64_t count;
    int dtype, op;
    unsigned char *view;
};

static uint64_t g_default_nic;

#define COMM_MAGIC 0x434f4d4du
struct stub_comm {
    uint32_t magic;
    int id;
    char name[128];
    uint32_t size;
    uint32_t rank;
    int destroyed;
    /* Root-info communicators only. */
    struct stub_group *group;
    uint64_t collectives_done;
    int in_collective;
    uint32_t nicset_calls;
    /* The set configuration: what the NIC sets this member applied say, per group rank. */
    unsigned char *set_view;
    struct stub_op ops[MAX_OPS];
    int nops;
};

struct stub_group {
    uint32_t root_hash;
    uint32_t size;
    uint32_t joined;
    char name[128];
    struct stub_comm **members; /* by group rank */
    int broken;
    /* The collective in progress. */
    uint64_t generation; /* collectives completed */
    uint32_t arrived;
    uint64_t count;
    int dtype, op;
    unsigned char *accum, *result;
    size_t cap;
    pthread_cond_t done;
    /* The result every member of the round that completed last gets. */
    int round_rc;
    /* The first-made signature of each member's k-th NIC set. */
    char *nicset_sig[MAX_NICSET_CALLS];
    struct stub_group *next;
};

static struct stub_group *g_groups;
static int g_next_comm = 1;

/* Caller holds g_mu. */
static struct stub_comm *new_comm(const char *name, size_t name_len, uint32_t size, uint32_t rank) {
    struct stub_comm *c = calloc(1, sizeof *c);
    c->magic = COMM_MAGIC;
    c->id = g_next_comm++;
    memcpy(c->name, name, name_len < sizeof c->name ? name_len : sizeof c->name);
    c->size = size;
    c->rank = rank;
    return c;
}

/* Test helper: a communicator as a framework would have made it. Not logged. */
void *stub_hccl_new_comm(const char *name, uint32_t size, uint32_t rank) {
    pthread_mutex_lock(&g_mu);
    void *c = new_comm(name, strlen(name), size, rank);
    pthread_mutex_unlock(&g_mu);
    return c;
}

/* Test helper: a name of exactly 128 bytes, with no terminating NUL in HCCL's buffer. */
void *stub_hccl_new_comm_full_name(char fill, uint32_t size, uint32_t rank) {
    char name[128];
    memset(name, fill, sizeof name);
    pthread_mutex_lock(&g_mu);
    void *c = new_comm(name, sizeof name, size, rank);
    pthread_mutex_unlock(&g_mu);
    return c;
}

/* Test helper: how long a member of a group waits for its peers in a collective. */
void stub_hccl_set_collective_timeout_ms(long ms) {
    pthread_mutex_lock(&g_mu);
    g_collective_timeout_ms = ms;
    pthread_mutex_unlock(&g_mu);
}

static int comm_id(HcclComm comm) {
    struct stub_comm *c = comm;
    return c && c->magic == COMM_MAGIC ? c->id : -1;
}

/* Whether `comm` is a live communicator of this stub. */
static int comm_ok(HcclComm comm) {
    struct stub_comm *c = comm;
    pthread_mutex_lock(&g_mu);
    int ok = c && c->magic == COMM_MAGIC && !c->destroyed;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* A destroyed or foreign communicator is reported and answered with HCCL_E_PTR (2). */
#define CHECK_COMM(comm)                                                                    \
    do {                                                                                    \
        if (!comm_ok(comm)) {                                                               \
            stub_record("BAD_COMM %s", __func__);                                           \
            return HCCL_E_PTR;                                                              \
        }                                                                                   \
    } while (0)

/* Test helper: collectives that ran on the default NIC of a switched communicator. */
uint64_t stub_hccl_collectives_on_default_nic(void) {
    pthread_mutex_lock(&g_mu);
    uint64_t n = g_default_nic;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Caller holds g_mu. A NIC set that succeeded on member c: its set configuration and every
 * operator it issued take the change. */
static void apply_nicset(struct stub_comm *c, const uint32_t *ranks, const bool *useBackup, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (ranks[i] >= c->size)
            continue;
        c->set_view[ranks[i]] = useBackup[i] ? 1 : 0;
        for (int o = 0; o < c->nops; o++)
            c->ops[o].view[ranks[i]] = useBackup[i] ? 1 : 0;
    }
}

/* Caller holds g_mu. Member c's configuration of an operator, issued now (on the default NIC)
 * if it is new; NULL when c has issued MAX_OPS operators already. */
static unsigned char *issue_op(struct stub_comm *c, uint64_t count, int dtype, int op) {
    for (int o = 0; o < c->nops; o++)
        if (c->ops[o].count == count && c->ops[o].dtype == dtype && c->ops[o].op == op)
            return c->ops[o].view;
    if (c->nops == MAX_OPS)
        return NULL;
    struct stub_op *n = &c->ops[c->nops++];
    n->count = count;
    n->dtype = dtype;
    n->op = op;
    n->view = calloc(c->size, 1);
    return n->view;
}

HcclResult HcclCommWorkingDevNicSet(HcclComm comm, uint32_t *ranks, bool *useBackup, uint32_t nRanks) {
    char args[8192];
    size_t off = 0;
    off += snprintf(args + off, sizeof args - off, "nRanks=%u ranks=[", nRanks);
    for (uint32_t i = 0; i < nRanks && off < sizeof args - 64; i++)
        off += snprintf(args + off, sizeof args - off, "%s%u", i ? "," : "", ranks[i]);
    off += snprintf(args + off, sizeof args - off, "] useBackup=[");
    for (uint32_t i = 0; i < nRanks && off < sizeof args - 64; i++)
        /* The raw byte, so a bool that is not 0/1 would show. */
        off += snprintf(args + off, sizeof args - off, "%s%u", i ? "," : "",
                        (unsigned)*(unsigned char *)&useBackup[i]);
    snprintf(args + off, sizeof args - off, "]");

    if (!comm_ok(comm)) {
        stub_record("HcclCommWorkingDevNicSet comm=#%d %s", comm_id(comm), args);
        stub_record("BAD_COMM %s", __func__);
        return HCCL_E_PTR;
    }
    struct stub_comm *c = comm;
    pthread_mutex_lock(&g_mu);
    struct stub_group *g = c->group;
    if (!g) {
        pthread_mutex_unlock(&g_mu);
        stub_record("HcclCommWorkingDevNicSet comm=#%d %s", c->id, args);
        return stub_rc_of(__func__);
    }
    /* Logged under g_mu so the lines of one group appear in the order the checks ran. */
    stub_record("HcclCommWorkingDevNicSet comm=#%d %s group=%s rank=%u", c->id, args, g->name, c->rank);
    int rc = 0;
    if (c->collectives_done == 0) {
        stub_record("NICSET_BEFORE_COLLECTIVE group=%s rank=%u", g->name, c->rank);
        rc = HCCL_E_INTERNAL;
    } else if (c->in_collective) {
        stub_record("NICSET_DURING_COLLECTIVE group=%s rank=%u", g->name, c->rank);
        rc = HCCL_E_INTERNAL;
    } else if (c->nicset_calls < MAX_NICSET_CALLS) {
        /* Only calls past the checks above count in a member's sequence. */
        uint32_t k = c->nicset_calls++;
        if (!g->nicset_sig[k]) {
            g->nicset_sig[k] = strdup(args);
        } else if (strcmp(g->nicset_sig[k], args) != 0) {
            stub_record("NICSET_MISMATCH group=%s rank=%u call=%u expected=%s got=%s", g->name, c->rank, k,
                        g->nicset_sig[k], args);
            rc = HCCL_E_PARA;
        }
    }
    if (!rc)
        rc = stub_rc_of(__func__);
    if (!rc)
        apply_nicset(c, ranks, useBackup, nRanks);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static int g_root_infos;

/* Every call returns a different root info, as HCCL's (which names a fresh rendezvous) does:
 * byte i of the k-th (from 0) is (i * 7 + 3 + 13 * k) & 0xff. */
HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    stub_record("HcclGetRootInfo");
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    int k = g_root_infos++;
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < (int)sizeof rootInfo->internal; i++)
        rootInfo->internal[i] = (char)((i * 7 + 3 + 13 * k) & 0xff);
    return 0;
}

/* Caller holds g_mu. The group `rank` of `n_ranks` joins for this root info: the first one still
 * waiting for that rank, or a new one. */
static struct stub_group *group_to_join(uint32_t hash, uint32_t n_ranks, uint32_t rank) {
    for (struct stub_group *g = g_groups; g; g = g->next)
        if (g->root_hash == hash && g->size == n_ranks && g->joined < g->size && !g->members[rank])
            return g;
    struct stub_group *g = calloc(1, sizeof *g);
    g->root_hash = hash;
    g->size = n_ranks;
    g->members = calloc(n_ranks, sizeof *g->members);
    pthread_cond_init(&g->done, NULL);
    g->next = g_groups;
    g_groups = g;
    return g;
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
    uint32_t sum = 0;
    const unsigned char *b = (const unsigned char *)rootInfo->internal;
    for (int i = 0; i < (int)sizeof rootInfo->internal; i++)
        sum = sum * 31u + b[i];
    int rc = stub_rc_of(__func__);
    if (!rc && (nRanks == 0 || rank >= nRanks))
        rc = HCCL_E_PARA;
    if (rc) {
        stub_record("HcclCommInitRootInfo nRanks=%u rank=%u root_hash=%u", nRanks, rank, sum);
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    struct stub_group *g = group_to_join(sum, nRanks, rank);
    struct stub_comm *c = new_comm("", 0, nRanks, rank);
    if (g->joined == 0)
        snprintf(g->name, sizeof g->name, "stubcomm_%d", c->id);
    memcpy(c->name, g->name, sizeof c->name);
    g->members[rank] = c;
    g->joined++;
    c->group = g;
    c->set_view = calloc(nRanks, 1);
    *comm = c;
    stub_record("HcclCommInitRootInfo nRanks=%u rank=%u root_hash=%u -> comm=#%d", nRanks, rank, sum, c->id);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
    stub_record("HcclGetRankId comm=#%d", comm_id(comm));
    CHECK_COMM(comm);
    int rc = stub_rc_of(__func__);
    if (!rc)
        *rank = ((struct stub_comm *)comm)->rank;
    return rc;
}

HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
    stub_record("HcclGetRankSize comm=#%d", comm_id(comm));
    CHECK_COMM(comm);
    int rc = stub_rc_of(__func__);
    if (!rc)
        *rankSize = ((struct stub_comm *)comm)->size;
    return rc;
}

static size_t dtype_size(int t) {
    static const size_t sizes[] = {1, 2, 4, 2, 4, 8, 8, 1, 2, 4, 8, 2};
    return t >= 0 && t < 12 ? sizes[t] : 0;
}

#define REDUCE_AS(T)                                                                        \
    do {                                                                                    \
        T *a = (T *)acc;                                                                    \
        const T *x = (const T *)in;                                                         \
        for (uint64_t i = 0; i < count; i++)                                                \
            switch (op) {                                                                   \
            case 0: a[i] = (T)(a[i] + x[i]); break;                                         \
            case 1: a[i] = (T)(a[i] * x[i]); break;                                         \
            case 2: a[i] = a[i] > x[i] ? a[i] : x[i]; break;                                \
            default: a[i] = a[i] < x[i] ? a[i] : x[i]; break;                               \
            }                                                                               \
    } while (0)

/* acc[i] = acc[i] <op> in[i]. 0, or HCCL_E_NOT_SUPPORT for a type the stub cannot reduce. */
static int reduce_into(unsigned char *acc, const unsigned char *in, uint64_t count, int dtype, int op) {
    switch (dtype) {
    case 0: REDUCE_AS(int8_t); return 0;
    case 1: REDUCE_AS(int16_t); return 0;
    case 2: REDUCE_AS(int32_t); return 0;
    case 4: REDUCE_AS(float); return 0;
    case 5: REDUCE_AS(int64_t); return 0;
    case 6: REDUCE_AS(uint64_t); return 0;
    case 7: REDUCE_AS(uint8_t); return 0;
    case 8: REDUCE_AS(uint16_t); return 0;
    case 9: REDUCE_AS(uint32_t); return 0;
    case 10: REDUCE_AS(double); return 0;
    default: return HCCL_E_NOT_SUPPORT;
    }
}

/* Caller holds g_mu. Breaks the group: everyone waiting, and every later collective, fails. */
static void break_group(struct stub_group *g) {
    g->broken = 1;
    pthread_cond_broadcast(&g->done);
}

/* Caller holds g_mu. The round of operator (count, dtype, op) just completed: every member
 * issued it, so each holds a configuration of it. Members that disagree fail the round;
 * agreeing ones that leave a switched rank on its default NIC are counted. */
static int judge_round(struct stub_group *g, uint64_t count, int dtype, int op) {
    unsigned char *first = issue_op(g->members[0], count, dtype, op);
    int on_default = 0;
    for (uint32_t m = 0; m < g->size; m++) {
        struct stub_comm *c = g->members[m];
        unsigned char *v = issue_op(c, count, dtype, op);
        if (!v || !first || memcmp(v, first, g->size) != 0) {
            stub_record("HcclAllReduce NIC_DISAGREE group=%s rank=%u count=%llu", g->name, m,
                        (unsigned long long)count);
            return HCCL_E_INTERNAL;
        }
        for (uint32_t r = 0; r < g->size; r++)
            on_default |= c->set_view[r] && !first[r];
    }
    if (on_default) {
        g_default_nic++;
        stub_record("HcclAllReduce DEFAULT_NIC group=%s count=%llu", g->name, (unsigned long long)count);
    }
    return 0;
}

/* The collective of a root-info communicator. Caller holds g_mu; returns with it held. */
static int group_all_reduce(struct stub_comm *c, const void *send, void *recv, uint64_t count, int dtype,
                            int op) {
    struct stub_group *g = c->group;
    size_t bytes = (size_t)count * dtype_size(dtype);
    if (g->broken) {
        stub_record("HcclAllReduce BROKEN_GROUP group=%s rank=%u", g->name, c->rank);
        return HCCL_E_REMOTE;
    }
    if (dtype_size(dtype) == 0 || op < 0 || op > 3)
        return HCCL_E_PARA;
    if (g->size > 1 && reduce_into(NULL, NULL, 0, dtype, op) != 0)
        return HCCL_E_NOT_SUPPORT;
    if (g->arrived > 0 && (g->count != count || g->dtype != dtype || g->op != op)) {
        stub_record("HcclAllReduce MISMATCH group=%s rank=%u count=%llu/%llu dataType=%d/%d op=%d/%d", g->name,
                    c->rank, (unsigned long long)g->count, (unsigned long long)count, g->dtype, dtype, g->op, op);
        return HCCL_E_PARA;
    }
    if (!issue_op(c, count, dtype, op))
        return HCCL_E_MEMORY;
    if (g->arrived == 0) {
        if (g->cap < bytes) {
            free(g->accum);
            free(g->result);
            g->accum = malloc(bytes ? bytes : 1);
            g->result = malloc(bytes ? bytes : 1);
            g->cap = bytes;
        }
        memcpy(g->accum, send, bytes);
        g->count = count;
        g->dtype = dtype;
        g->op = op;
    } else {
        reduce_into(g->accum, send, count, dtype, op);
    }
    uint64_t mine = g->generation;
    g->arrived++;
    if (g->arrived == g->size) {
        unsigned char *done = g->accum;
        g->accum = g->result;
        g->result = done;
        g->arrived = 0;
        g->round_rc = judge_round(g, count, dtype, op);
        g->generation++;
        pthread_cond_broadcast(&g->done);
    } else {
        struct timespec until = stub_deadline_after_ms(g_collective_timeout_ms);
        c->in_collective = 1;
        while (g->generation == mine && !g->broken) {
            if (pthread_cond_timedwait(&g->done, &g_mu, &until) == ETIMEDOUT && g->generation == mine) {
                c->in_collective = 0;
                stub_record("HcclAllReduce TIMEOUT group=%s rank=%u", g->name, c->rank);
                break_group(g);
                return HCCL_E_TIMEOUT;
            }
        }
        c->in_collective = 0;
        if (g->generation == mine) {
            stub_record("HcclAllReduce BROKEN_GROUP group=%s rank=%u", g->name, c->rank);
            return HCCL_E_REMOTE;
        }
    }
    /* Nobody can complete the next collective before this member joins it, so `result` and
     * `round_rc` still hold this one's. */
    c->collectives_done++;
    if (g->round_rc)
        return g->round_rc;
    memcpy(recv, g->result, bytes);
    return 0;
}

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, int dataType, int op, HcclComm comm,
                         aclrtStream stream) {
    stub_record("HcclAllReduce send=buf#%d recv=buf#%d count=%llu dataType=%d op=%d comm=#%d stream=#%d",
                stub_buf_id(sendBuf), stub_buf_id(recvBuf), (unsigned long long)count, dataType, op,
                comm_id(comm), stub_stream_id(stream));
    CHECK_COMM(comm);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    struct stub_comm *c = comm;
    pthread_mutex_lock(&g_mu);
    if (c->group) {
        rc = group_all_reduce(c, sendBuf, recvBuf, count, dataType, op);
        pthread_mutex_unlock(&g_mu);
        return rc;
    }
    pthread_mutex_unlock(&g_mu);
    /* A communicator without peers here: the all-reduce is the identity, copy send to recv. */
    if (sendBuf && recvBuf && sendBuf != recvBuf)
        memcpy(recvBuf, sendBuf, (size_t)count * dtype_size(dataType));
    return 0;
}

#ifndef STUB_OMIT_COMM_RESUME
HcclResult HcclCommResume(HcclComm comm) {
    stub_record("HcclCommResume comm=#%d", comm_id(comm));
    CHECK_COMM(comm);
    return stub_rc_of(__func__);
}
#endif

HcclResult HcclCommDestroy(HcclComm comm) {
    stub_record("HcclCommDestroy comm=#%d", comm_id(comm));
    CHECK_COMM(comm);
    struct stub_comm *c = comm;
    pthread_mutex_lock(&g_mu);
    c->destroyed = 1; /* kept allocated so a later use is caught */
    if (c->group)
        break_group(c->group);
    pthread_mutex_unlock(&g_mu);
    return stub_rc_of(__func__);
}

HcclResult HcclGetCommName(HcclComm comm, char *commName) {
    stub_record("HcclGetCommName comm=#%d", comm_id(comm));
    CHECK_COMM(comm);
    int rc = stub_rc_of(__func__);
    if (!rc)
        memcpy(commName, ((struct stub_comm *)comm)->name, 128);
    return rc;
}
