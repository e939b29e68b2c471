/*
 * Stub libdcmi.so: card enumeration, id mapping and RoCE network health, recording every call.
 *
 * Topology (stub_dcmi_set_topology): `cards` cards with ids card_base, card_base+1, ..., each
 * with `dies` chips. The die on card index c, chip k has the physical id c * dies + k (so with
 * two dies per card the two dies of an NPU are physical 2n and 2n+1, as on Atlas A3).
 *
 * Visibility (stub_dcmi_set_visible): the dies this node (container) sees, as a list of
 * physical ids; logical id i is the i-th of them, as a container renumbers its devices. By
 * default every die is visible and logical == physical. Calls on a die that is not visible fail
 * with DCMI_ERR_CODE_DEVICE_NOT_EXIST, on one that does not exist with
 * DCMI_ERR_CODE_INVALID_DEVICE_ID. dcmi_get_card_list lists the cards with a visible die;
 * dcmi_get_device_num_in_card counts a card's visible dies.
 *
 * Health per chip is DCMI_RDFX_DETECT_OK (0) until set. A chip marked blocking
 * (stub_dcmi_block_health) makes dcmi_get_device_network_health wait on a condition variable
 * until stub_dcmi_release(), as DCMI's probe does after a card drops; the test waits for the
 * call to be blocked with stub_dcmi_wait_blocked(), never by sleeping.
 */
#include "stub_common.h" /* first: it sets the POSIX feature level */
#include <errno.h>

#define DCMI_ERR_CODE_INVALID_DEVICE_ID (-8007)
#define DCMI_ERR_CODE_DEVICE_NOT_EXIST (-8008)
#define MAX_CARDS 64
#define MAX_DIES 4
#define MAX_PHYS (MAX_CARDS * MAX_DIES)

static struct stub_rc g_rc[] = {
    {"dcmi_init", 0},
    {"dcmi_get_card_list", 0},
    {"dcmi_get_device_num_in_card", 0},
    {"dcmi_get_card_id_device_id_from_logicid", 0},
    {"dcmi_get_card_id_device_id_from_phyid", 0},
    {"dcmi_get_device_phyid_from_logicid", 0},
    {"dcmi_get_device_network_health", 0},
    {0, 0},
};
static struct stub_rc *stub_rc_table(void) { return g_rc; }

/* Guards everything below; the blocking probe waits on g_cv. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_cards = 2, g_dies = 2, g_card_base = 10;
static int g_health[MAX_CARDS][MAX_DIES];
static int g_block[MAX_CARDS][MAX_DIES];
static int g_blocked;    /* probes waiting now */
static long g_released;  /* bumped by stub_dcmi_release */
/* Logical id i -> physical id; -1 entries are unused. g_nlogical < 0: identity, all visible. */
static int g_logical[MAX_PHYS];
static int g_nlogical = -1;

static int total(void) { return g_cards * g_dies; }
static int nlogical(void) { return g_nlogical < 0 ? total() : g_nlogical; }
static int phys_of_logical(int l) { return g_nlogical < 0 ? l : g_logical[l]; }

/* Caller holds g_mu. */
static int visible_phys(int p) {
    if (g_nlogical < 0)
        return p >= 0 && p < total();
    for (int i = 0; i < g_nlogical; i++)
        if (g_logical[i] == p)
            return 1;
    return 0;
}

void stub_dcmi_set_topology(int cards, int dies, int card_base) {
    pthread_mutex_lock(&g_mu);
    g_cards = cards < MAX_CARDS ? cards : MAX_CARDS;
    g_dies = dies < MAX_DIES ? dies : MAX_DIES;
    g_card_base = card_base;
    g_nlogical = -1;
    pthread_mutex_unlock(&g_mu);
}

/* The dies this node sees, by physical id, in logical order. -1 if one does not exist. */
int stub_dcmi_set_visible(const int *phys, int n) {
    pthread_mutex_lock(&g_mu);
    int ok = n >= 0 && n <= MAX_PHYS;
    for (int i = 0; ok && i < n; i++)
        ok = phys[i] >= 0 && phys[i] < total();
    if (ok) {
        for (int i = 0; i < n; i++)
            g_logical[i] = phys[i];
        g_nlogical = n;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : -1;
}

/* Caller holds g_mu. The (card index, chip) of an existing chip, or -1. */
static int chip_index(int card_id, int device_id, int *c) {
    *c = card_id - g_card_base;
    return *c >= 0 && *c < g_cards && device_id >= 0 && device_id < g_dies ? 0 : -1;
}

/* Sets the dcmi_rdfx_detect_result of (card_id, device_id). -1 if out of range. */
int stub_dcmi_set_health(int card_id, int device_id, int result) {
    int c, rc;
    pthread_mutex_lock(&g_mu);
    rc = chip_index(card_id, device_id, &c);
    if (!rc)
        g_health[c][device_id] = result;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* From now on, probes of (card_id, device_id) block until stub_dcmi_release(). */
int stub_dcmi_block_health(int card_id, int device_id) {
    int c, rc;
    pthread_mutex_lock(&g_mu);
    rc = chip_index(card_id, device_id, &c);
    if (!rc)
        g_block[c][device_id] = 1;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Wakes every blocked probe (it then answers normally) and clears every block. */
void stub_dcmi_release(void) {
    pthread_mutex_lock(&g_mu);
    memset(g_block, 0, sizeof g_block);
    g_released++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Waits until at least n probes are blocked, or timeout_ms passes: 0, or -1 on timeout. */
int stub_dcmi_wait_blocked(int n, long timeout_ms) {
    struct timespec until = stub_deadline_after_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&g_mu);
    while (g_blocked < n && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&g_cv, &g_mu, &until);
    int ok = g_blocked >= n;
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : -1;
}

int dcmi_init(void) {
    stub_record("dcmi_init");
    return stub_rc_of(__func__);
}

int dcmi_get_card_list(int *card_num, int *card_list, int list_len) {
    stub_record("dcmi_get_card_list list_len=%d", list_len);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    int n = 0;
    for (int c = 0; c < g_cards; c++) {
        int seen = 0;
        for (int k = 0; k < g_dies; k++)
            seen |= visible_phys(c * g_dies + k);
        if (seen) {
            if (n < list_len)
                card_list[n] = g_card_base + c;
            n++;
        }
    }
    *card_num = n;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    stub_record("dcmi_get_device_num_in_card card_id=%d", card_id);
    int rc = stub_rc_of(__func__), c;
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (chip_index(card_id, 0, &c)) {
        pthread_mutex_unlock(&g_mu);
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    }
    int n = 0;
    for (int k = 0; k < g_dies; k++)
        n += visible_phys(c * g_dies + k);
    *device_num = n;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* Caller holds g_mu. */
static void place(int phys, int *card_id, int *device_id) {
    *card_id = g_card_base + phys / g_dies;
    *device_id = phys % g_dies;
}

int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id) {
    stub_record("dcmi_get_card_id_device_id_from_logicid device_logic_id=%u", device_logic_id);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (device_logic_id >= (unsigned)nlogical())
        rc = DCMI_ERR_CODE_INVALID_DEVICE_ID;
    else
        place(phys_of_logical((int)device_logic_id), card_id, device_id);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int device_phy_id) {
    stub_record("dcmi_get_card_id_device_id_from_phyid device_phy_id=%u", device_phy_id);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (device_phy_id >= (unsigned)total())
        rc = DCMI_ERR_CODE_INVALID_DEVICE_ID;
    else if (!visible_phys((int)device_phy_id))
        rc = DCMI_ERR_CODE_DEVICE_NOT_EXIST;
    else
        place((int)device_phy_id, card_id, device_id);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid) {
    stub_record("dcmi_get_device_phyid_from_logicid logicid=%u", logicid);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (logicid >= (unsigned)nlogical())
        rc = DCMI_ERR_CODE_INVALID_DEVICE_ID;
    else
        *phyid = (unsigned)phys_of_logical((int)logicid);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int dcmi_get_device_network_health(int card_id, int device_id, int *result) {
    stub_record("dcmi_get_device_network_health card_id=%d device_id=%d", card_id, device_id);
    int rc = stub_rc_of(__func__), c;
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (chip_index(card_id, device_id, &c)) {
        rc = DCMI_ERR_CODE_INVALID_DEVICE_ID;
    } else if (!visible_phys(c * g_dies + device_id)) {
        rc = DCMI_ERR_CODE_DEVICE_NOT_EXIST;
    } else {
        long released = g_released;
        if (g_block[c][device_id]) {
            g_blocked++;
            pthread_cond_broadcast(&g_cv);
            while (g_released == released)
                pthread_cond_wait(&g_cv, &g_mu);
            g_blocked--;
        }
        *result = g_health[c][device_id];
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
