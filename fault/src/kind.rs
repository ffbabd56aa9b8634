//! Which synchronizer a run's workers take (`fault worker --kind ...`), and
//! what the checker may allow of it: how many holders at once, whether an
//! operation is shared or exclusive, how far apart acquisitions must be.

use std::fmt;

/// The synchronizer a worker takes for each operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// `client.lock(key)`: one holder (every scenario before 11).
    #[default]
    Mutex,
    /// `client.rw_lock(key)`: each operation reads (shared; the store is
    /// only read) with this chance per mille, else writes (exclusive; a
    /// fenced read-modify-write). `write` is `rw:0`.
    Rw {
        /// Reads per mille.
        reads_per_mille: u64,
    },
    /// `client.semaphore(key, permits)`: at most `permits` holders at once;
    /// each enters and leaves the record (store-logged) without changing it.
    Semaphore {
        /// Permits.
        permits: u32,
    },
    /// `client.lock(key).hold_at_least(ms)`: a mutex whose key stays taken
    /// until `ms` after each acquisition.
    HoldAtLeast {
        /// The minimum hold, ms.
        ms: u64,
    },
    /// `client.lock_all(keys)`: `keys` distinct keys at once, named in a
    /// random order; a fenced read-modify-write of each with its own token.
    All {
        /// Keys per operation.
        keys: usize,
    },
}

/// The side of a read-write lock an operation took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

impl Kind {
    /// Parses `mutex`, `write`, `rw`, `rw:R` (reads per mille), `semaphore:N`,
    /// `hold-at-least:MS`, `all:K`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (s, None),
        };
        let num = |what: &str| -> Result<u64, String> {
            arg.ok_or_else(|| format!("--kind {s:?}: {name} needs :{what}"))?
                .parse()
                .map_err(|e| format!("--kind {s:?}: {e}"))
        };
        let kind = match (name, arg) {
            ("mutex", None) => Kind::Mutex,
            ("write", None) => Kind::Rw { reads_per_mille: 0 },
            ("rw", None) => Kind::Rw {
                reads_per_mille: 700,
            },
            ("rw", Some(_)) => Kind::Rw {
                reads_per_mille: num("R")?.min(1000),
            },
            ("semaphore", _) => Kind::Semaphore {
                permits: u32::try_from(num("N")?).map_err(|e| e.to_string())?,
            },
            ("hold-at-least", _) => Kind::HoldAtLeast { ms: num("MS")? },
            ("all", _) => Kind::All {
                keys: num("K")? as usize,
            },
            _ => {
                return Err(format!(
                    "--kind {s:?}: expected one of mutex, write, rw[:R], semaphore:N, hold-at-least:MS, all:K"
                ));
            }
        };
        match kind {
            Kind::Semaphore { permits: 0 } | Kind::All { keys: 0 } => {
                Err(format!("--kind {s:?}: needs at least 1"))
            }
            kind => Ok(kind),
        }
    }

    /// How many holders of `side` may hold a key together with the other
    /// holders counted in `shared` and `exclusive` (the holds already
    /// active): whether one more is allowed.
    pub(crate) fn admits(self, side: Side, shared: u64, exclusive: u64) -> bool {
        match (self, side) {
            (Kind::Semaphore { permits }, _) => shared + exclusive < u64::from(permits),
            (Kind::Rw { .. }, Side::Read) => exclusive == 0,
            _ => shared + exclusive == 0,
        }
    }

    /// Whether a holder on `a` can keep one on `b` out: all but two
    /// readers (a semaphore's holder does, when it has the last permit; see
    /// [`Kind::admits`]).
    pub(crate) fn conflicts(self, a: Side, b: Side) -> bool {
        !matches!((self, a, b), (Kind::Rw { .. }, Side::Read, Side::Read))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Mutex => write!(f, "mutex"),
            Kind::Rw { reads_per_mille } => write!(f, "rw:{reads_per_mille}"),
            Kind::Semaphore { permits } => write!(f, "semaphore:{permits}"),
            Kind::HoldAtLeast { ms } => write!(f, "hold-at-least:{ms}"),
            Kind::All { keys } => write!(f, "all:{keys}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_flag() {
        for kind in [
            Kind::Mutex,
            Kind::Rw {
                reads_per_mille: 700,
            },
            Kind::Semaphore { permits: 3 },
            Kind::HoldAtLeast { ms: 40 },
            Kind::All { keys: 2 },
        ] {
            assert_eq!(Kind::parse(&kind.to_string()), Ok(kind));
        }
        assert_eq!(Kind::parse("write"), Ok(Kind::Rw { reads_per_mille: 0 }));
        assert_eq!(
            Kind::parse("rw"),
            Ok(Kind::Rw {
                reads_per_mille: 700
            })
        );
        for bad in ["semaphore", "semaphore:0", "all:x", "rwlock", "mutex:1"] {
            assert!(Kind::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn who_may_hold_together() {
        let rw = Kind::Rw {
            reads_per_mille: 700,
        };
        assert!(rw.admits(Side::Read, 5, 0));
        assert!(!rw.admits(Side::Read, 0, 1));
        assert!(!rw.admits(Side::Write, 1, 0));
        let sem = Kind::Semaphore { permits: 3 };
        assert!(sem.admits(Side::Read, 2, 0));
        assert!(!sem.admits(Side::Read, 3, 0));
        assert!(!Kind::Mutex.admits(Side::Write, 0, 1));
        assert!(!rw.conflicts(Side::Read, Side::Read));
        assert!(rw.conflicts(Side::Read, Side::Write));
        assert!(Kind::Mutex.conflicts(Side::Write, Side::Write));
        assert!(sem.conflicts(Side::Read, Side::Read));
    }
}
