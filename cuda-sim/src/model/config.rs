//! The simulator's settings, read once from the environment (the crate documentation lists
//! them).

use std::sync::LazyLock;
use std::time::Duration;

/// Settings from the environment.
pub(crate) struct Config {
    pub(crate) devices: i32,
    pub(crate) memory: usize,
    pub(crate) op_delay: Duration,
    pub(crate) abort_on_violation: bool,
    pub(crate) log: bool,
    pub(crate) no_peer: NoPeer,
    /// The HIP version the HIP face models (`HIP_VERSION` encoding).
    pub(crate) hip_version: u32,
}

/// A setting from the environment: an integer in `range`, or `default` (with a word on stderr
/// when the variable is set to something else).
fn env(name: &str, default: u64, range: std::ops::RangeInclusive<u64>) -> u64 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    match v.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => n,
        _ => {
            eprintln!(
                "cuda-sim: ignoring {name}={v:?}: expected an integer from {} to {}; using {default}",
                range.start(),
                range.end()
            );
            default
        }
    }
}

/// The most devices `CUDA_SIM_DEVICES` allows: the device address space (`memory`) is laid
/// out for them.
pub(crate) const MAX_DEVICES: u64 = 64;

pub(crate) fn config() -> &'static Config {
    static CONFIG: LazyLock<Config> = LazyLock::new(|| Config {
        devices: env("CUDA_SIM_DEVICES", 2, 1..=MAX_DEVICES) as i32,
        memory: env("CUDA_SIM_MEMORY", 4 << 30, 1..=1 << 40) as usize,
        op_delay: Duration::from_micros(env("CUDA_SIM_OP_DELAY_US", 0, 0..=10_000_000)),
        abort_on_violation: env("CUDA_SIM_ABORT_ON_VIOLATION", 0, 0..=1) != 0,
        log: env("CUDA_SIM_LOG", 0, 0..=1) != 0,
        no_peer: NoPeer::from_env(),
        hip_version: env("CUDA_SIM_HIP_VERSION", 70_000_000, 0..=999_999_999) as u32,
    });
    &CONFIG
}

/// Device pairs that cannot access each other's memory (`CUDA_SIM_NO_PEER`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum NoPeer {
    /// Every pair of distinct devices can (the default).
    #[default]
    None,
    /// No pair can.
    All,
    /// These pairs cannot, either way (each stored as given).
    Pairs(Vec<(i32, i32)>),
}

impl NoPeer {
    /// Parses `all`, or pairs `a:b` separated by commas (`0:1,2:3`); blanks are ignored and
    /// an empty value is [`NoPeer::None`]. Ordinals are not checked against the device count
    /// here: a pair naming a device that does not exist changes nothing.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::None);
        }
        if text.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        let mut pairs = Vec::new();
        for item in text.split(',') {
            let item = item.trim();
            let (a, b) = item
                .split_once(':')
                .ok_or_else(|| format!("expected a pair `a:b`, found {item:?}"))?;
            let ordinal = |s: &str| {
                s.trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (0..64).contains(n))
                    .ok_or_else(|| format!("expected a device ordinal from 0 to 63, found {s:?}"))
            };
            pairs.push((ordinal(a)?, ordinal(b)?));
        }
        Ok(Self::Pairs(pairs))
    }

    /// The setting from the environment: [`NoPeer::None`] when unset or unreadable (with a
    /// word on stderr).
    pub(crate) fn from_env() -> Self {
        let Ok(v) = std::env::var("CUDA_SIM_NO_PEER") else {
            return Self::None;
        };
        Self::parse(&v).unwrap_or_else(|why| {
            eprintln!(
                "cuda-sim: ignoring CUDA_SIM_NO_PEER={v:?}: {why} (or `all`); every pair of \
                 devices can access each other"
            );
            Self::None
        })
    }

    /// Whether `dev` can access `peer`'s memory directly: never a device itself (the driver
    /// answers 0 for a device with itself), every other pair unless listed.
    pub(crate) fn can_access(&self, dev: i32, peer: i32) -> bool {
        if dev == peer {
            return false;
        }
        match self {
            Self::None => true,
            Self::All => false,
            Self::Pairs(pairs) => !pairs
                .iter()
                .any(|&(a, b)| (a, b) == (dev, peer) || (b, a) == (dev, peer)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NoPeer;

    #[test]
    fn the_setting_reads_all_pairs_or_nothing() {
        assert_eq!(NoPeer::parse(""), Ok(NoPeer::None));
        assert_eq!(NoPeer::parse(" ALL "), Ok(NoPeer::All));
        assert_eq!(
            NoPeer::parse("0:1, 2 : 3"),
            Ok(NoPeer::Pairs(vec![(0, 1), (2, 3)]))
        );
        assert!(NoPeer::parse("0-1").unwrap_err().contains("a pair `a:b`"));
        assert!(NoPeer::parse("0:64").unwrap_err().contains("from 0 to 63"));
    }

    #[test]
    fn a_device_never_accesses_itself_as_a_peer_and_listed_pairs_never_either_way() {
        let none = NoPeer::None;
        assert!(!none.can_access(1, 1));
        assert!(none.can_access(0, 1) && none.can_access(1, 0));
        assert!(!NoPeer::All.can_access(0, 1));
        let pairs = NoPeer::parse("1:2").unwrap();
        assert!(!pairs.can_access(1, 2) && !pairs.can_access(2, 1));
        assert!(pairs.can_access(0, 2) && pairs.can_access(2, 0) && pairs.can_access(3, 1));
    }
}
