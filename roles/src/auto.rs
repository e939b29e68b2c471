//! `--auto-failover` and the policy's knobs, shared by `taskd manager` and `taskd sim`
//! (docs/auto-failover.md explains each default).

use crate::flags;
use clap::Args;
use std::time::Duration;
use taskd_core::auto::AutoConfig;

/// The automatic failover flags. Every knob needs `--auto-failover`.
#[derive(Args, Debug, Clone)]
pub struct AutoArgs {
    /// Move devices to their backup NIC when their link fails, and back once it has
    /// recovered, without waiting for an operator (off by default).
    #[arg(long)]
    pub auto_failover: bool,
    /// How often each proxy probes both links of every device of its node.
    #[arg(long, value_name = "MS", default_value_t = 2_000, requires = "auto_failover", value_parser = flags::probe_ms())]
    pub link_probe_ms: u64,
    /// Consecutive failed probes before a device moves.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "auto_failover", value_parser = flags::probes())]
    pub down_after: u32,
    /// Devices failing within this long of each other move in one operation.
    #[arg(long, value_name = "MS", default_value_t = 200, requires = "auto_failover", value_parser = flags::span_ms())]
    pub coalesce_ms: u64,
    /// How long a device's primary link must stay up before it moves back from its backup.
    #[arg(long, value_name = "MS", default_value_t = 300_000, requires = "auto_failover", value_parser = flags::span_ms())]
    pub switchback_after_ms: u64,
    /// More link changes than this within --flap-window-ms hold a device where it is.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "auto_failover", value_parser = flags::probes())]
    pub max_flaps: u32,
    /// The window in which link changes are counted.
    #[arg(long, value_name = "MS", default_value_t = 60_000, requires = "auto_failover", value_parser = flags::deadline_ms())]
    pub flap_window_ms: u64,
    /// The shortest time between two automatic operations.
    #[arg(long, value_name = "MS", default_value_t = 30_000, requires = "auto_failover", value_parser = flags::span_ms())]
    pub min_interval_ms: u64,
    /// Move devices off a link that is down or degraded inside the step: abort the
    /// collectives stuck on it and finish the step on the backup, instead of pausing at the
    /// next step boundary (every training process needs an in-flight side: taskd's Gloo
    /// switch has one). Off by default.
    #[arg(long, requires = "auto_failover")]
    pub abort_in_flight: bool,
}

impl AutoArgs {
    /// The policy these flags ask for (`None` without `--auto-failover`). The flags' ranges
    /// keep every knob valid ([`AutoConfig::validate`]).
    pub fn config(&self) -> Option<AutoConfig> {
        let ms = Duration::from_millis;
        self.auto_failover.then(|| AutoConfig {
            link_probe: ms(self.link_probe_ms),
            down_after: self.down_after,
            coalesce: ms(self.coalesce_ms),
            switchback_after: ms(self.switchback_after_ms),
            max_flaps: self.max_flaps,
            flap_window: ms(self.flap_window_ms),
            min_interval: ms(self.min_interval_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        auto: AutoArgs,
    }

    #[test]
    fn the_defaults_are_the_policys_and_knobs_need_the_switch() {
        let off = Cli::try_parse_from(["t"]).unwrap();
        assert_eq!(off.auto.config(), None);
        let on = Cli::try_parse_from(["t", "--auto-failover"]).unwrap();
        let cfg = on.auto.config().unwrap();
        assert_eq!(cfg, AutoConfig::default());
        assert!(cfg.validate().is_ok());
        assert!(Cli::try_parse_from(["t", "--down-after", "2"]).is_err());
        for bad in [
            ["--link-probe-ms", "0"],
            ["--down-after", "0"],
            ["--max-flaps", "0"],
            ["--flap-window-ms", "0"],
        ] {
            let e = Cli::try_parse_from(["t", "--auto-failover", bad[0], bad[1]]);
            assert!(e.is_err(), "{bad:?}");
        }
    }
}
