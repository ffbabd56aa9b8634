//! The commands a fenced write may run, where their keys are, and how they
//! travel to the script: as data, never as script text.

use crate::error::LockError;

/// Where a command's keys are among its arguments (after the name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyPositions {
    /// The first argument; the rest are values.
    First,
    /// The first two arguments (source and destination).
    FirstTwo,
    /// Every argument (`DEL`, `UNLINK`).
    All,
    /// Every other argument, from the first (`MSET key value ...`).
    Pairs,
}

/// The allow-list: write commands whose keys sit at fixed positions, so the
/// client can declare every key the script touches (a cluster requires it,
/// and the slot check needs them). Each with its arity as Redis's command
/// table gives it (name included; negative: at least that many), checked
/// before sending, since a command that fails inside the script leaves the
/// ones before it applied.
const ALLOWED: &[(&str, i32, KeyPositions)] = &[
    // Strings
    ("SET", -3, KeyPositions::First),
    ("SETEX", 4, KeyPositions::First),
    ("PSETEX", 4, KeyPositions::First),
    ("SETNX", 3, KeyPositions::First),
    ("SETRANGE", 4, KeyPositions::First),
    ("APPEND", 3, KeyPositions::First),
    ("GETSET", 3, KeyPositions::First),
    ("GETDEL", 2, KeyPositions::First),
    ("GETEX", -2, KeyPositions::First),
    ("INCR", 2, KeyPositions::First),
    ("INCRBY", 3, KeyPositions::First),
    ("INCRBYFLOAT", 3, KeyPositions::First),
    ("DECR", 2, KeyPositions::First),
    ("DECRBY", 3, KeyPositions::First),
    ("SETBIT", 4, KeyPositions::First),
    ("MSET", -3, KeyPositions::Pairs),
    // KeyPositions
    ("DEL", -2, KeyPositions::All),
    ("UNLINK", -2, KeyPositions::All),
    ("EXPIRE", -3, KeyPositions::First),
    ("PEXPIRE", -3, KeyPositions::First),
    ("EXPIREAT", -3, KeyPositions::First),
    ("PEXPIREAT", -3, KeyPositions::First),
    ("PERSIST", 2, KeyPositions::First),
    ("RENAME", 3, KeyPositions::FirstTwo),
    // Hashes
    ("HSET", -4, KeyPositions::First),
    ("HSETNX", 4, KeyPositions::First),
    ("HMSET", -4, KeyPositions::First),
    ("HDEL", -3, KeyPositions::First),
    ("HINCRBY", 4, KeyPositions::First),
    ("HINCRBYFLOAT", 4, KeyPositions::First),
    // Lists
    ("LPUSH", -3, KeyPositions::First),
    ("RPUSH", -3, KeyPositions::First),
    ("LPUSHX", -3, KeyPositions::First),
    ("RPUSHX", -3, KeyPositions::First),
    ("LPOP", -2, KeyPositions::First),
    ("RPOP", -2, KeyPositions::First),
    ("LSET", 4, KeyPositions::First),
    ("LREM", 4, KeyPositions::First),
    ("LTRIM", 4, KeyPositions::First),
    ("LINSERT", 5, KeyPositions::First),
    ("LMOVE", 5, KeyPositions::FirstTwo),
    ("RPOPLPUSH", 3, KeyPositions::FirstTwo),
    // Sets
    ("SADD", -3, KeyPositions::First),
    ("SREM", -3, KeyPositions::First),
    ("SPOP", -2, KeyPositions::First),
    ("SMOVE", 4, KeyPositions::FirstTwo),
    // Sorted sets
    ("ZADD", -4, KeyPositions::First),
    ("ZREM", -3, KeyPositions::First),
    ("ZINCRBY", 4, KeyPositions::First),
    ("ZPOPMIN", -2, KeyPositions::First),
    ("ZPOPMAX", -2, KeyPositions::First),
    ("ZREMRANGEBYSCORE", 4, KeyPositions::First),
    ("ZREMRANGEBYRANK", 4, KeyPositions::First),
    ("ZREMRANGEBYLEX", 4, KeyPositions::First),
    // Streams, HyperLogLog
    ("XADD", -5, KeyPositions::First),
    ("XDEL", -3, KeyPositions::First),
    ("XTRIM", -4, KeyPositions::First),
    ("PFADD", -2, KeyPositions::First),
];

/// The names of the commands a fenced write accepts, upper case.
pub fn allowed_commands() -> impl Iterator<Item = &'static str> {
    ALLOWED.iter().map(|(name, ..)| *name)
}

/// Arguments one command may have: the script spreads them with Lua's
/// `unpack`, whose stack holds a little under 8,000 values.
const MAX_ARGS: usize = 4096;

/// One command, split for the script: its keys (to declare in `KEYS`) and
/// `name, kind, values...` (for `ARGV`).
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) argv: Vec<Vec<u8>>,
}

/// Write commands for one script call, as a builder's `.cmd(..)` gathers
/// them (a fenced write, a commit of a record with its writes): every
/// command's keys (for `KEYS`) and its encoded arguments (for `ARGV`), and
/// the first command refused, reported when the builder sends (builders do
/// not fail).
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) argv: Vec<Vec<u8>>,
    pub(crate) commands: usize,
    pub(crate) invalid: Option<LockError>,
}

impl Writes {
    /// Adds `cmd`, unless a command was refused before.
    pub(crate) fn push(&mut self, cmd: &redis::Cmd) {
        if self.invalid.is_some() {
            return;
        }
        match encode(cmd) {
            Ok(Encoded { keys, argv }) => {
                self.keys.extend(keys);
                self.argv.extend(argv);
                self.commands += 1;
            }
            Err(e) => self.invalid = Some(e),
        }
    }

    /// Adds the keys and then the command count and the arguments to a
    /// script's invocation (after its own keys and arguments).
    pub(crate) fn add_to(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        for k in &self.keys {
            invocation.key(k.as_slice());
        }
        invocation.arg(self.commands);
        for a in &self.argv {
            invocation.arg(a.as_slice());
        }
    }
}

/// Checks `cmd` against the allow-list and splits it; `Config` names what is
/// wrong.
pub(crate) fn encode(cmd: &redis::Cmd) -> Result<Encoded, LockError> {
    let mut args = Vec::with_capacity(cmd.args_iter().len());
    for arg in cmd.args_iter() {
        match arg {
            redis::Arg::Simple(bytes) => args.push(bytes),
            _ => {
                return Err(LockError::Config(
                    "a fenced command cannot take a cursor argument".into(),
                ));
            }
        }
    }
    let Some((name, rest)) = args.split_first() else {
        return Err(LockError::Config("a fenced command is empty".into()));
    };
    let upper = String::from_utf8_lossy(name).to_ascii_uppercase();
    let Some(&(name, arity, keys)) = ALLOWED.iter().find(|(n, ..)| *n == upper) else {
        return Err(LockError::Config(format!(
            "`{}` cannot run in a fenced write: it takes write commands whose keys are at \
             known positions ({})",
            upper.escape_debug(),
            allowed_commands().collect::<Vec<_>>().join(", ")
        )));
    };
    let given = args.len();
    let arity_ok = match usize::try_from(arity) {
        Ok(exact) => given == exact,
        Err(_) => given >= arity.unsigned_abs() as usize,
    } && (keys != KeyPositions::Pairs || rest.len() % 2 == 0);
    if !arity_ok {
        return Err(LockError::Config(format!(
            "`{name}` with {} argument(s): wrong number of arguments",
            rest.len()
        )));
    }
    if rest.len() > MAX_ARGS {
        return Err(LockError::Config(format!(
            "`{name}` with {} arguments: a fenced command takes at most {MAX_ARGS}",
            rest.len()
        )));
    }
    let mut kind = Vec::with_capacity(rest.len());
    let mut encoded = Encoded {
        keys: Vec::new(),
        argv: vec![name.as_bytes().to_vec(), Vec::new()],
    };
    for (i, arg) in rest.iter().enumerate() {
        let is_key = match keys {
            KeyPositions::First => i == 0,
            KeyPositions::FirstTwo => i < 2,
            KeyPositions::All => true,
            KeyPositions::Pairs => i % 2 == 0,
        };
        if is_key {
            kind.push(b'K');
            encoded.keys.push(arg.to_vec());
        } else {
            kind.push(b'V');
            encoded.argv.push(arg.to_vec());
        }
    }
    encoded.argv[1] = kind;
    Ok(encoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_ok(cmd: &redis::Cmd) -> (Vec<String>, Vec<String>) {
        let e = encode(cmd).expect("allowed");
        let text = |v: Vec<Vec<u8>>| {
            v.into_iter()
                .map(|b| String::from_utf8(b).unwrap())
                .collect()
        };
        (text(e.keys), text(e.argv))
    }

    #[test]
    fn keys_are_split_from_values_by_the_commands_layout() {
        let (keys, argv) = encode_ok(redis::cmd("hset").arg("order:1").arg("status").arg("paid"));
        assert_eq!(keys, ["order:1"]);
        assert_eq!(argv, ["HSET", "KVV", "status", "paid"]);

        let (keys, argv) = encode_ok(redis::cmd("MSET").arg("a").arg("1").arg("b").arg("2"));
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(argv, ["MSET", "KVKV", "1", "2"]);

        let (keys, argv) = encode_ok(redis::cmd("DEL").arg("a").arg("b"));
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(argv, ["DEL", "KK"]);

        let (keys, argv) = encode_ok(
            redis::cmd("LMOVE")
                .arg("a")
                .arg("b")
                .arg("LEFT")
                .arg("RIGHT"),
        );
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(argv, ["LMOVE", "KKVV", "LEFT", "RIGHT"]);
    }

    #[test]
    fn commands_off_the_allow_list_are_refused_by_name() {
        for name in ["EVAL", "FLUSHALL", "GET", "CONFIG", "set\0", ""] {
            let err = encode(redis::cmd(name).arg("x")).unwrap_err();
            assert!(err.is_config(), "{name}: {err}");
        }
        let err = encode(redis::cmd("FLUSHALL").arg("x")).unwrap_err();
        assert!(err.to_string().contains("`FLUSHALL` cannot run"), "{err}");
        assert!(encode(&redis::Cmd::new()).unwrap_err().is_config());
    }

    #[test]
    fn wrong_argument_counts_are_refused_before_sending() {
        assert!(encode(redis::cmd("HSET").arg("k").arg("f")).is_err());
        assert!(encode(redis::cmd("INCRBY").arg("k")).is_err());
        assert!(encode(redis::cmd("INCRBY").arg("k").arg(1).arg(2)).is_err());
        assert!(encode(redis::cmd("MSET").arg("a").arg("1").arg("b")).is_err());
        assert!(encode(&redis::cmd("DEL")).is_err());
        assert!(encode(redis::cmd("SET").arg("k").arg("v").arg("EX").arg(5)).is_ok());
        let mut big = redis::cmd("SADD");
        big.arg("k").arg(vec!["m"; MAX_ARGS]);
        assert!(encode(&big).unwrap_err().is_config());
    }

    #[test]
    fn every_allowed_command_is_named_once_in_upper_case() {
        let names: Vec<_> = allowed_commands().collect();
        for name in &names {
            assert_eq!(*name, name.to_ascii_uppercase());
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
    }
}
