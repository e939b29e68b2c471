//! The job's HCCL rank table file (`server_list[].device[].{device_id, rank_id}`), as every role
//! reads it: bounded in size ([`MAX_RANK_TABLE_BYTES`]) and in job size (the limits of
//! [`taskd_core::rank_table`]), with errors that name the file and the bad value.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use taskd_core::rank_table::{RankSlot, RankTableError};
use taskd_core::{DeviceId, GlobalRank, NodeName, RankTable};

/// The largest rank table file read: 64 MiB. A table of the largest job (65,536 ranks) is
/// about 10 MiB; anything bigger is not a rank table (or is `/dev/zero`), and reading it
/// whole would only use memory.
pub const MAX_RANK_TABLE_BYTES: u64 = 64 << 20;

/// Why a rank table file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RankTableFileError {
    /// The file cannot be read.
    #[error("cannot read the rank table {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_RANK_TABLE_BYTES`].
    #[error("the rank table {path} is larger than {max} bytes: not a rank table")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The bound.
        max: u64,
    },
    /// The contents are not a valid rank table.
    #[error("rank table {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: RankTableParseError,
    },
}

/// What is wrong in the text of a rank table.
#[derive(Debug, thiserror::Error)]
pub enum RankTableParseError {
    /// Not JSON of the rank table's shape.
    #[error("not an HCCL rank table: {0}")]
    Json(#[from] serde_json::Error),
    /// Not UTF-8 text.
    #[error("not an HCCL rank table: the file is not UTF-8 text")]
    NotText,
    /// A device or rank number is not a number.
    #[error("{field} {value:?} is not a number")]
    NotANumber {
        /// `device_id` or `rank_id`.
        field: &'static str,
        /// The value found.
        value: String,
    },
    /// A device or rank number does not fit in 32 bits.
    #[error("{field} {value} is too large")]
    TooLarge {
        /// `device_id` or `rank_id`.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A server's name (its `server_name`, else its `server_id`) is empty: no proxy could be
    /// that node.
    #[error("server {index} of server_list has an empty name (server_name or server_id)")]
    EmptyNode {
        /// Its index in `server_list`.
        index: usize,
    },
    /// Two servers of `server_list` have one name: their devices would be merged into one
    /// node without a word.
    #[error("servers {first} and {second} of server_list have one name, {name:?}: each node is one server")]
    DuplicateNode {
        /// The name.
        name: String,
        /// The index of its first server.
        first: usize,
        /// The index of its second server.
        second: usize,
    },
    /// The slots do not make a valid table (duplicates, gaps, above the job size limits).
    #[error(transparent)]
    Table(#[from] RankTableError),
}

/// A value of an HCCL rank table: a string (as HCCL writes them) or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Num {
    Text(String),
    Int(u64),
}

impl Num {
    fn get(&self, field: &'static str) -> Result<u32, RankTableParseError> {
        match self {
            Num::Int(n) => {
                u32::try_from(*n).map_err(|_| RankTableParseError::TooLarge { field, value: *n })
            }
            Num::Text(s) => s
                .trim()
                .parse()
                .map_err(|_| RankTableParseError::NotANumber {
                    field,
                    value: s.clone(),
                }),
        }
    }
}

#[derive(Deserialize)]
struct HcclDevice {
    device_id: Num,
    rank_id: Num,
}

#[derive(Deserialize)]
struct HcclServer {
    server_id: String,
    #[serde(default)]
    server_name: Option<String>,
    device: Vec<HcclDevice>,
}

#[derive(Deserialize)]
struct HcclRankTable {
    server_list: Vec<HcclServer>,
}

/// Reads an HCCL rank table file. A node is named by its `server_name` when the file has one,
/// else by its `server_id`.
pub fn load(path: &Path) -> Result<RankTable, RankTableFileError> {
    let read_err = |source| RankTableFileError::Read {
        path: path.to_owned(),
        source,
    };
    // A regular file only, opened without blocking: a FIFO or a device is refused at once.
    let bytes = match crate::files::read_regular(path, MAX_RANK_TABLE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(RankTableFileError::TooLarge {
                path: path.to_owned(),
                max: MAX_RANK_TABLE_BYTES,
            })
        }
        Err(e) => return Err(read_err(e)),
    };
    let invalid = |source| RankTableFileError::Invalid {
        path: path.to_owned(),
        source,
    };
    let text = String::from_utf8(bytes).map_err(|_| invalid(RankTableParseError::NotText))?;
    parse(&text).map_err(invalid)
}

/// Parses the text of an HCCL rank table.
pub fn parse(text: &str) -> Result<RankTable, RankTableParseError> {
    let t: HcclRankTable = serde_json::from_str(text)?;
    let mut slots = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (index, s) in t.server_list.into_iter().enumerate() {
        let name = s.server_name.unwrap_or(s.server_id);
        if name.trim().is_empty() {
            return Err(RankTableParseError::EmptyNode { index });
        }
        if let Some(first) = seen.insert(name.clone(), index) {
            return Err(RankTableParseError::DuplicateNode {
                name,
                first,
                second: index,
            });
        }
        let node = NodeName(name);
        for d in s.device {
            slots.push(RankSlot {
                node: node.clone(),
                // HCCL's `device_id` is the die's physical id (`/dev/davinciN`).
                device: DeviceId(d.device_id.get("device_id")?),
                rank: GlobalRank(d.rank_id.get("rank_id")?),
            });
        }
    }
    Ok(RankTable::new(slots)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use taskd_core::rank_table::{MAX_NODES, MAX_RANKS};

    #[test]
    fn reads_an_hccl_rank_table() {
        let t = parse(
            r#"{"version": "1.0", "server_count": "2", "status": "completed",
                "server_list": [
                  {"server_id": "10.0.0.1", "host_nic_ip": "reserve",
                   "device": [{"device_id": "0", "device_ip": "192.168.1.1", "rank_id": "0"},
                              {"device_id": "1", "device_ip": "192.168.1.2", "rank_id": "1"}]},
                  {"server_id": "10.0.0.2", "server_name": "node-b",
                   "device": [{"device_id": 0, "rank_id": 2}, {"device_id": 1, "rank_id": 3}]}
                ]}"#,
        )
        .unwrap();
        assert_eq!(t.world_size(), 4);
        assert_eq!(
            t.nodes(),
            [NodeName("10.0.0.1".into()), NodeName("node-b".into())]
        );
        assert_eq!(
            t.rank_of(&"node-b".into(), DeviceId(1)),
            Some(GlobalRank(3))
        );
        let e = parse(r#"{"server_list": [{"server_id": "a", "device": [{"device_id": "x", "rank_id": "0"}]}]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("device_id \"x\""), "{e}");
        let e = parse(r#"{"server_list": [{"server_id": "a", "device": [{"device_id": 0, "rank_id": 5000000000}]}]}"#)
            .unwrap_err();
        assert_eq!(e.to_string(), "rank_id 5000000000 is too large");
        assert!(parse("{}").is_err());
        for blank in [
            r#"{"server_list": [{"server_id": "", "device": [{"device_id": 0, "rank_id": 0}]}]}"#,
            r#"{"server_list": [{"server_id": "a", "server_name": " ", "device": [{"device_id": 0, "rank_id": 0}]}]}"#,
        ] {
            let e = parse(blank).unwrap_err();
            assert_eq!(
                e.to_string(),
                "server 0 of server_list has an empty name (server_name or server_id)"
            );
        }
    }

    /// Two servers of one name were merged into one node without a word; a name that would
    /// split a log line, or a megabyte long, went into every message about the node.
    #[test]
    fn servers_of_one_name_and_unusable_names_are_refused() {
        let e = parse(
            r#"{"server_list": [
              {"server_id": "a", "device": [{"device_id": 0, "rank_id": 0}]},
              {"server_id": "b", "server_name": "a", "device": [{"device_id": 1, "rank_id": 1}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "servers 0 and 1 of server_list have one name, \"a\": each node is one server"
        );
        let e = parse(r#"{"server_list": [{"server_id": "a\nb", "device": [{"device_id": 0, "rank_id": 0}]}]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
        let long = "x".repeat(1 << 20);
        let text = format!(
            r#"{{"server_list": [{{"server_id": "{long}", "device": [{{"device_id": 0, "rank_id": 0}}]}}]}}"#
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("more than 255") && e.len() < 200,
            "{}",
            &e[..e.len().min(300)]
        );
    }

    #[test]
    fn a_file_larger_than_the_bound_or_not_a_file_is_refused_naming_it() {
        let big = std::env::temp_dir().join(format!("taskd-big-table-{}", uuid::Uuid::new_v4()));
        // Sparse: nothing is written.
        std::fs::File::create(&big)
            .and_then(|f| f.set_len(MAX_RANK_TABLE_BYTES + 1))
            .unwrap();
        let e = load(&big).unwrap_err();
        std::fs::remove_file(&big).unwrap();
        assert!(matches!(e, RankTableFileError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains(&big.display().to_string()), "{e}");
        let e = load(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(e, RankTableFileError::Read { .. }), "{e}");
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        assert!(e.to_string().contains("a character device"), "{e}");
        let e = load(Path::new("/nonexistent/table.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/table.json"), "{e}");
    }

    /// A number as a rank table may spell it, or something that is not one.
    fn spelled(n: u64) -> impl Strategy<Value = String> {
        prop_oneof![
            30 => prop_oneof![Just(n.to_string()), Just(format!("\"{n}\""))],
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => prop_oneof![
                Just("null".to_string()),
                Just("-1".to_string()),
                Just("1.5".to_string()),
                "\"[ -~]{0,6}\"",
            ],
        ]
    }

    /// Rank-table-shaped JSON: mostly a valid table (ranks numbered in order across the
    /// servers, devices in order within each), with some values replaced by others or by
    /// things that are not numbers, and servers that share a name.
    fn table_json() -> impl Strategy<Value = String> {
        let server = ("[a-c]{0,2}", prop::option::of("[a-c]{1,2}"), 0usize..5);
        prop::collection::vec(server, 0..5).prop_flat_map(|servers| {
            let mut rank = 0u64;
            let mut parts = Vec::new();
            for (id, name, devices) in servers {
                let devs: Vec<_> = (0..devices as u64)
                    .map(|d| {
                        rank += 1;
                        (spelled(d), spelled(rank - 1))
                            .prop_map(|(d, r)| format!(r#"{{"device_id": {d}, "rank_id": {r}}}"#))
                    })
                    .collect();
                let name = name
                    .map(|n| format!(r#""server_name": "{n}", "#))
                    .unwrap_or_default();
                parts.push(devs.prop_map(move |devs| {
                    format!(
                        r#"{{{name}"server_id": "{id}", "device": [{}]}}"#,
                        devs.join(",")
                    )
                }));
            }
            parts.prop_map(|s| format!(r#"{{"server_list": [{}]}}"#, s.join(",")))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        // Arbitrary text never panics the parser.
        #[test]
        fn any_text_parses_or_is_refused(text in any::<String>()) {
            let _ = parse(&text);
        }

        // Table-shaped JSON: a table it accepts is a valid one (ranks 0..n, each (node,
        // device) once, within the limits); one it refuses says why.
        #[test]
        fn accepted_tables_are_valid(text in table_json()) {
            match parse(&text) {
                Ok(t) => {
                    prop_assert!(t.world_size() >= 1 && t.world_size() <= MAX_RANKS);
                    prop_assert!(t.nodes().len() <= MAX_NODES);
                    for (i, s) in t.slots().iter().enumerate() {
                        prop_assert_eq!(s.rank, GlobalRank(i as u32));
                        prop_assert_eq!(t.rank_of(&s.node, s.device), Some(s.rank));
                    }
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
