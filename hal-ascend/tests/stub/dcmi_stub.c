/*
 * Stub libdcmi.so: card enumeration, logical-id mapping and RoCE network health, recording
 * every call. Topology: `cards` cards with ids card_base, card_base+1, ..., each with `dies`
 * chips; logical id L is on card card_base + L / dies, chip L % dies. Health per chip is
 * DCMI_RDFX_DETECT_OK (0) until set.
 */
#include "stub_common.h"

#define DCMI_ERR_CODE_INVALID_DEVICE_ID (-8007)
#define MAX_CARDS 64
#define MAX_DIES 4

static struct stub_rc g_rc[] = {
    {"dcmi_init", 0}, {"dcmi_get_card_list", 0}, {"dcmi_get_device_num_in_card", 0},
    {"dcmi_get_card_id_device_id_from_logicid", 0}, {"dcmi_get_device_network_health", 0},
    {0, 0},
};
static struct stub_rc *stub_rc_table(void) { return g_rc; }


static int g_cards = 2, g_dies = 2, g_card_base = 10;
static int g_health[MAX_CARDS][MAX_DIES];

void stub_dcmi_set_topology(int cards, int dies, int card_base) {
    g_cards = cards < MAX_CARDS ? cards : MAX_CARDS;
    g_dies = dies < MAX_DIES ? dies : MAX_DIES;
    g_card_base = card_base;
}

/* Sets the dcmi_rdfx_detect_result of (card_id, device_id). -1 if out of range. */
int stub_dcmi_set_health(int card_id, int device_id, int result) {
    int c = card_id - g_card_base;
    if (c < 0 || c >= g_cards || device_id < 0 || device_id >= g_dies)
        return -1;
    g_health[c][device_id] = result;
    return 0;
}

static int valid(int card_id, int device_id) {
    int c = card_id - g_card_base;
    return c >= 0 && c < g_cards && device_id >= 0 && device_id < g_dies;
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
    *card_num = g_cards;
    for (int i = 0; i < g_cards && i < list_len; i++)
        card_list[i] = g_card_base + i;
    return 0;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    stub_record("dcmi_get_device_num_in_card card_id=%d", card_id);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    if (!valid(card_id, 0))
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    *device_num = g_dies;
    return 0;
}

int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id) {
    stub_record("dcmi_get_card_id_device_id_from_logicid device_logic_id=%u", device_logic_id);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    if (device_logic_id >= (unsigned)(g_cards * g_dies))
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    *card_id = g_card_base + (int)device_logic_id / g_dies;
    *device_id = (int)device_logic_id % g_dies;
    return 0;
}

int dcmi_get_device_network_health(int card_id, int device_id, int *result) {
    stub_record("dcmi_get_device_network_health card_id=%d device_id=%d", card_id, device_id);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    if (!valid(card_id, device_id))
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    *result = g_health[card_id - g_card_base][device_id];
    return 0;
}
