//! The MindCluster / HCCL environment flags, parsed from their string values. Reading the
//! environment is the caller's job; these functions only interpret what it found.

/// Whether a flag list such as `{TTP:1,TSP:1}` or `L0:0, L1:1, L2:1` sets `key` to `1`.
/// Braces, quotes and blanks are ignored; keys compare case-insensitively.
pub fn flag_enabled(list: &str, key: &str) -> bool {
    list.trim()
        .trim_matches(|c| c == '{' || c == '}' || c == '\'' || c == '"')
        .split(',')
        .filter_map(|kv| kv.split_once(':'))
        .any(|(k, v)| k.trim().eq_ignore_ascii_case(key) && v.trim() == "1")
}

/// `MS_ENABLE_TFT` enables the switch-back feature (`TSP:1`).
pub fn tsp_enabled(ms_enable_tft: Option<&str>) -> bool {
    ms_enable_tft.is_some_and(|v| flag_enabled(v, "TSP"))
}

/// `HCCL_OP_RETRY_ENABLE` enables HCCL's L2 retry (`L2:1`), without which
/// `HcclCommWorkingDevNicSet` reports success and switches nothing.
pub fn l2_retry_enabled(hccl_op_retry_enable: Option<&str>) -> bool {
    hccl_op_retry_enable.is_some_and(|v| flag_enabled(v, "L2"))
}

/// The node rank of a process: `MS_NODE_RANK` (MindSpore) or `RANK / LOCAL_WORLD_SIZE`
/// (PyTorch).
pub fn node_rank(
    ms_node_rank: Option<&str>,
    rank: Option<&str>,
    local_world_size: Option<&str>,
) -> Option<u32> {
    if let Some(r) = ms_node_rank.and_then(|v| v.trim().parse().ok()) {
        return Some(r);
    }
    let rank: u32 = rank?.trim().parse().ok()?;
    let lws: u32 = local_world_size?.trim().parse().ok()?;
    (lws > 0).then(|| rank / lws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reference_deployment_values() {
        assert!(tsp_enabled(Some("{TTP:1,TSP:1}")));
        assert!(tsp_enabled(Some("'{TTP:1,TSP:1}'")));
        assert!(!tsp_enabled(Some("{TTP:1,TSP:0}")));
        assert!(!tsp_enabled(Some("{TTP:1}")));
        assert!(!tsp_enabled(None));
        assert!(l2_retry_enabled(Some("L0:0, L1:1, L2:1")));
        assert!(!l2_retry_enabled(Some("L0:0, L1:1, L2:0")));
        assert!(!l2_retry_enabled(Some("L1:1")));
        assert!(!l2_retry_enabled(Some("")));
    }

    #[test]
    fn node_rank_from_either_framework() {
        assert_eq!(node_rank(Some("3"), None, None), Some(3));
        assert_eq!(node_rank(None, Some("37"), Some("16")), Some(2));
        assert_eq!(node_rank(None, Some("37"), Some("0")), None);
        assert_eq!(node_rank(None, None, Some("16")), None);
    }
}
