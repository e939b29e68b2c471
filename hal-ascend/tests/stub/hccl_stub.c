/*
 * Stub libhccl.so: the HCCL entry points taskd-hal-ascend binds, recording every call.
 * Build with -DSTUB_OMIT_COMM_RESUME to leave out HcclCommResume (missing-symbol test).
 * Communicators are fake: created by HcclCommInitRootInfo or stub_hccl_new_comm, named and
 * sized as told, and logged as comm=#<id>.
 */
#include <stdbool.h>
#include "stub_common.h"

typedef int32_t HcclResult;
typedef void *HcclComm;
typedef void *aclrtStream;
typedef struct {
    char internal[4108];
} HcclRootInfo;

static struct stub_rc g_rc[] = {
    {"HcclCommWorkingDevNicSet", 0}, {"HcclGetRootInfo", 0}, {"HcclCommInitRootInfo", 0},
    {"HcclGetRankId", 0},            {"HcclGetRankSize", 0}, {"HcclAllReduce", 0},
    {"HcclCommResume", 0},           {"HcclCommDestroy", 0}, {"HcclGetCommName", 0},
    {0, 0},
};
static struct stub_rc *stub_rc_table(void) { return g_rc; }


#define COMM_MAGIC 0x434f4d4du
struct stub_comm {
    uint32_t magic;
    int id;
    char name[128];
    uint32_t size;
    uint32_t rank;
    int destroyed;
};
static int g_next_comm = 1;

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
    return new_comm(name, strlen(name), size, rank);
}

/* Test helper: a name of exactly 128 bytes, with no terminating NUL in HCCL's buffer. */
void *stub_hccl_new_comm_full_name(char fill, uint32_t size, uint32_t rank) {
    char name[128];
    memset(name, fill, sizeof name);
    return new_comm(name, sizeof name, size, rank);
}

static int comm_id(HcclComm comm) {
    struct stub_comm *c = comm;
    return c && c->magic == COMM_MAGIC ? c->id : -1;
}

/* A destroyed or foreign communicator is reported and answered with HCCL_E_PTR (2). */
#define CHECK_COMM(comm)                                                                    \
    do {                                                                                    \
        struct stub_comm *c_ = (comm);                                                      \
        if (!c_ || c_->magic != COMM_MAGIC || c_->destroyed) {                              \
            stub_record("BAD_COMM %s", __func__);                                           \
            return 2;                                                                       \
        }                                                                                   \
    } while (0)

HcclResult HcclCommWorkingDevNicSet(HcclComm comm, uint32_t *ranks, bool *useBackup, uint32_t nRanks) {
    char buf[8192];
    size_t off = 0;
    off += snprintf(buf + off, sizeof buf - off, "HcclCommWorkingDevNicSet comm=#%d nRanks=%u ranks=[",
                    comm_id(comm), nRanks);
    for (uint32_t i = 0; i < nRanks && off < sizeof buf - 64; i++)
        off += snprintf(buf + off, sizeof buf - off, "%s%u", i ? "," : "", ranks[i]);
    off += snprintf(buf + off, sizeof buf - off, "] useBackup=[");
    for (uint32_t i = 0; i < nRanks && off < sizeof buf - 64; i++)
        /* The raw byte, so a bool that is not 0/1 would show. */
        off += snprintf(buf + off, sizeof buf - off, "%s%u", i ? "," : "",
                        (unsigned)*(unsigned char *)&useBackup[i]);
    snprintf(buf + off, sizeof buf - off, "]");
    stub_record("%s", buf);
    CHECK_COMM(comm);
    return stub_rc_of(__func__);
}

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    stub_record("HcclGetRootInfo");
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    for (int i = 0; i < (int)sizeof rootInfo->internal; i++)
        rootInfo->internal[i] = (char)((i * 7 + 3) & 0xff);
    return 0;
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
    uint32_t sum = 0;
    const unsigned char *b = (const unsigned char *)rootInfo->internal;
    for (int i = 0; i < (int)sizeof rootInfo->internal; i++)
        sum = sum * 31u + b[i];
    int rc = stub_rc_of(__func__);
    if (rc) {
        stub_record("HcclCommInitRootInfo nRanks=%u rank=%u root_hash=%u", nRanks, rank, sum);
        return rc;
    }
    char name[32];
    int n = snprintf(name, sizeof name, "stubcomm_%d", g_next_comm);
    struct stub_comm *c = new_comm(name, (size_t)n, nRanks, rank);
    *comm = c;
    stub_record("HcclCommInitRootInfo nRanks=%u rank=%u root_hash=%u -> comm=#%d", nRanks, rank, sum, c->id);
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

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, int dataType, int op, HcclComm comm,
                         aclrtStream stream) {
    stub_record("HcclAllReduce send=buf#%d recv=buf#%d count=%llu dataType=%d op=%d comm=#%d stream=#%d",
                stub_buf_id(sendBuf), stub_buf_id(recvBuf), (unsigned long long)count, dataType, op,
                comm_id(comm), stub_stream_id(stream));
    CHECK_COMM(comm);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    /* One rank's all-reduce is the identity: copy send to recv. */
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
    ((struct stub_comm *)comm)->destroyed = 1; /* kept allocated so a later use is caught */
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
