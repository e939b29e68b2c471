//! A role's configuration: a JSON object whose keys are the long flags of the matching `taskd`
//! subcommand with dashes as underscores (`"switch_timeout_ms": 5000` is
//! `--switch-timeout-ms 5000`), plus the reference TaskD's keys ([`Keys`]). The object is
//! turned into that command line and parsed by the subcommand's own parser, so every flag is
//! accepted with the same defaults (environment variables included), limits and messages.

use crate::error::CapiError;
use clap::{ArgAction, Command};
use serde_json::{Map, Value};

/// How a role reads the reference TaskD's keys.
pub struct Keys<'a> {
    /// `(reference key, flag key)`: the same setting under the reference's name.
    pub renamed: &'a [(&'a str, &'a str)],
    /// Reference keys accepted and not used by taskd (they configure what it does not do).
    pub ignored: &'a [&'a str],
}

/// Parses `json` as a JSON object (keys to values).
pub fn object(role: &'static str, json: &str) -> Result<Map<String, Value>, CapiError> {
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(CapiError::Argument(format!(
            "the {role} configuration must be a JSON object, not {other}"
        ))),
        Err(e) => Err(CapiError::Argument(format!(
            "the {role} configuration is not JSON: {e}"
        ))),
    }
}

/// The command line `cmd` gets for the configuration `map`.
pub fn to_args(
    role: &'static str,
    cmd: &Command,
    map: &Map<String, Value>,
    keys: &Keys<'_>,
) -> Result<Vec<String>, CapiError> {
    let mut args = Vec::new();
    for (key, value) in map {
        if keys.ignored.contains(&key.as_str()) {
            tracing::info!(
                role,
                key,
                "configuration key accepted and not used by taskd"
            );
            continue;
        }
        let flag_key = keys
            .renamed
            .iter()
            .find(|(from, _)| from == key)
            .map_or(key.as_str(), |(_, to)| to);
        let long = flag_key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .filter(|a| is_setting(a))
            .find(|a| a.get_long() == Some(long.as_str()))
            .ok_or_else(|| CapiError::Config {
                role,
                message: format!(
                    "unknown key {key:?} (the keys are the flags of `taskd {role}` with \
                     underscores: {})",
                    known_keys(cmd)
                ),
            })?;
        let takes_value = arg.get_action().takes_values();
        push_value(
            role,
            key,
            &format!("--{long}"),
            takes_value,
            value,
            &mut args,
        )?;
    }
    Ok(args)
}

fn push_value(
    role: &'static str,
    key: &str,
    flag: &str,
    takes_value: bool,
    value: &Value,
    args: &mut Vec<String>,
) -> Result<(), CapiError> {
    let bad = |what: &str| CapiError::Config {
        role,
        message: format!("{key}: {what}, got {value}"),
    };
    match (value, takes_value) {
        (Value::Null, _) | (Value::Bool(false), false) => {}
        (Value::Bool(true), false) => args.push(flag.to_owned()),
        (_, false) => return Err(bad("expected true or false")),
        (Value::Array(items), true) => {
            for item in items {
                let text = scalar(item).ok_or_else(|| bad("expected a list of values"))?;
                args.push(format!("{flag}={text}"));
            }
        }
        (v, true) => {
            let text = scalar(v).ok_or_else(|| bad("expected a string, number or boolean"))?;
            // One token: a value starting with `-` stays a value.
            args.push(format!("{flag}={text}"));
        }
    }
    Ok(())
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether an argument is a setting (not `--help` or `--version`).
fn is_setting(a: &clap::Arg) -> bool {
    !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
}

/// The keys to name in a refusal: the deprecated ones (hidden flags) are read but not offered.
fn known_keys(cmd: &Command) -> String {
    cmd.get_arguments()
        .filter(|a| is_setting(a) && !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .map(|l| l.replace('-', "_"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A parser's refusal in the configuration's words: its message without the usage, on one
/// line, flags named as keys.
pub fn parse_error(role: &'static str, cmd: &Command, e: &clap::Error) -> CapiError {
    let rendered = e.render().to_string();
    let lines: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
        .map(str::trim)
        .collect();
    let mut message = lines.join(" ").trim_start_matches("error: ").to_owned();
    let mut longs: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
    // Longest first, so that `--tls-ca` does not eat the start of `--tls-ca-file`.
    longs.sort_by_key(|l| std::cmp::Reverse(l.len()));
    for long in longs {
        message = message.replace(&format!("--{long}"), &long.replace('-', "_"));
    }
    if e.kind() == clap::error::ErrorKind::MissingRequiredArgument {
        for arg in cmd.get_arguments() {
            if let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) {
                if message.contains(&long.replace('-', "_")) {
                    let key = long.replace('-', "_");
                    message.push_str(&format!(
                        " ({key} may also come from ${})",
                        var.to_string_lossy()
                    ));
                }
            }
        }
    }
    CapiError::Config { role, message }
}

/// The environment variable `name` when it is set and not blank.
pub fn env_value(name: &str) -> Option<String> {
    taskd_core::env::get(&taskd_core::env::process_env, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cmd() -> Command {
        Command::new("t")
            .no_binary_name(true)
            .arg(Arg::new("nodes").long("nodes").action(ArgAction::Set))
            .arg(Arg::new("force").long("force").action(ArgAction::SetTrue))
            .arg(
                Arg::new("dev")
                    .long("sim-link-down")
                    .action(ArgAction::Append),
            )
            .arg(Arg::new("tsp").long("tsp").action(ArgAction::Set))
    }

    const NONE: Keys<'static> = Keys {
        renamed: &[("node_nums", "nodes")],
        ignored: &["plugin_dir"],
    };

    fn args(json: &str) -> Result<Vec<String>, CapiError> {
        to_args("manager", &cmd(), &object("manager", json)?, &NONE)
    }

    #[test]
    fn keys_become_flags() {
        let a = args(
            r#"{"node_nums": 2, "force": true, "sim_link_down": [1, "3"], "tsp": false,
                "plugin_dir": "/x", "nodes_unused": null}"#,
        );
        let e = a.unwrap_err().to_string();
        assert!(e.contains("unknown key \"nodes_unused\""), "{e}");
        assert!(e.contains("nodes, force, sim_link_down, tsp"), "{e}");
        let one = |json: &str| args(json).unwrap();
        assert_eq!(
            one(r#"{"node_nums": 2, "plugin_dir": "/x"}"#),
            ["--nodes=2"]
        );
        assert_eq!(one(r#"{"force": true}"#), ["--force"]);
        assert_eq!(
            one(r#"{"sim_link_down": [1, "3"]}"#),
            ["--sim-link-down=1", "--sim-link-down=3"]
        );
        assert_eq!(one(r#"{"tsp": false}"#), ["--tsp=false"]);
        assert_eq!(one(r#"{"nodes": "-1"}"#), ["--nodes=-1"]);
        assert_eq!(
            args(r#"{"force": false, "nodes": null}"#).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn bad_shapes_are_named() {
        let e = args(r#"{"force": "yes"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "manager configuration: force: expected true or false, got \"yes\""
        );
        let e = args(r#"{"nodes": {"a": 1}}"#).unwrap_err();
        assert!(e.to_string().contains("nodes: expected a string"), "{e}");
        let e = args("[1]").unwrap_err();
        assert_eq!(e.code(), crate::error::TASKD_ERR_ARGUMENT);
        assert!(args("{").unwrap_err().to_string().contains("not JSON"));
    }

    #[test]
    fn parser_errors_speak_of_keys() {
        let c = cmd().arg(
            Arg::new("ms")
                .long("switch-timeout-ms")
                .value_parser(clap::value_parser!(u64)),
        );
        let e = c
            .clone()
            .try_get_matches_from(["--switch-timeout-ms=soon"])
            .unwrap_err();
        let msg = parse_error("manager", &c, &e).to_string();
        assert!(
            msg.starts_with("manager configuration: invalid value 'soon' for 'switch_timeout_ms"),
            "{msg}"
        );
    }
}
