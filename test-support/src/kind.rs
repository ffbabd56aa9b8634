//! Which server the tests run on: Redis (the default), Redis 8 or Valkey, chosen for
//! every launcher at once (standalone, Sentinel, Cluster, Redlock masters) by
//! one environment variable, [`SERVER_ENV`].

use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The server a program chose for itself ([`ServerKind::choose`]), which
/// wins over the environment.
static CHOSEN: OnceLock<ServerKind> = OnceLock::new();

/// The environment variable that chooses the server: `redis` (the default
/// when unset or empty), `redis8` or `valkey`.
pub const SERVER_ENV: &str = "LOCK_TEST_SERVER";

/// The Valkey release `cargo xtask deps` installs and the tests look for.
pub const VALKEY_VERSION: &str = "9.1.2";

/// The Redis 8 release `cargo xtask deps` builds and the tests look for.
pub const REDIS8_VERSION: &str = "8.6.3";

/// A server the tests can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// `redis-server` from the `PATH` (Debian 12: Redis 7.0), or
    /// `$REDIS_SERVER`.
    Redis,
    /// `redis-server` 8 as `cargo xtask deps` builds it (see
    /// [`redis8_dir`]), or `$REDIS8_SERVER`: the server with `DELEX` and
    /// `SET .. IFEQ`.
    Redis8,
    /// `valkey-server` as `cargo xtask deps` caches it (see
    /// [`valkey_dir`]), or `$VALKEY_SERVER`.
    Valkey,
}

impl ServerKind {
    /// Reads [`SERVER_ENV`]; an unknown value is an error that names the
    /// choices.
    pub fn try_from_env() -> crate::Result<Self> {
        match std::env::var(SERVER_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Self::Redis),
            Ok(value) => Self::parse(&value),
            Err(e) => Err(format!("{SERVER_ENV}: {e}")),
        }
    }

    /// `redis`, `redis8` or `valkey` (any case; empty means Redis).
    pub fn parse(value: &str) -> crate::Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "redis" => Ok(Self::Redis),
            "redis8" => Ok(Self::Redis8),
            "valkey" => Ok(Self::Valkey),
            other => Err(format!(
                "{SERVER_ENV}={other:?}: expected `redis`, `redis8` or `valkey`"
            )),
        }
    }

    /// The server the launchers of this process start: the one
    /// [`ServerKind::choose`] set, else [`SERVER_ENV`]'s. Panics on an
    /// unknown [`SERVER_ENV`] (a typo must not silently test Redis instead).
    pub fn current() -> Self {
        Self::try_current().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ServerKind::current`], with an unknown [`SERVER_ENV`] as an error.
    pub fn try_current() -> crate::Result<Self> {
        match CHOSEN.get() {
            Some(&chosen) => Ok(chosen),
            None => Self::try_from_env(),
        }
    }

    /// Makes `self` the server of every launcher in this process, whatever
    /// [`SERVER_ENV`] says (the `--server` option of the `fault` and
    /// `bench` programs). An error if another server was chosen before.
    pub fn choose(self) -> crate::Result<()> {
        let chosen = *CHOSEN.get_or_init(|| self);
        if chosen == self {
            Ok(())
        } else {
            Err(format!(
                "the server was already chosen: {chosen}, not {self}"
            ))
        }
    }

    /// The server binary: `$REDIS_SERVER` / `$REDIS8_SERVER` /
    /// `$VALKEY_SERVER` when set, else `redis-server` from the `PATH` /
    /// `redis-server` in [`redis8_dir`] / `valkey-server` in [`valkey_dir`].
    pub fn server_bin(self) -> PathBuf {
        match self {
            Self::Redis => std::env::var_os("REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-server")),
            Self::Redis8 => std::env::var_os("REDIS8_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| redis8_dir().join("redis-server")),
            Self::Valkey => std::env::var_os("VALKEY_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| valkey_dir().join("valkey-server")),
        }
    }

    /// `redis 7.0.15` / `valkey 9.1.2`, from the binary's `--version`; an
    /// error naming the binary when it does not run.
    pub fn version(self) -> crate::Result<String> {
        let bin = self.server_bin();
        let out = std::process::Command::new(&bin)
            .arg("--version")
            .output()
            .map_err(|e| {
                format!(
                    "cannot run {} ({e}); {}",
                    bin.display(),
                    self.install_hint()
                )
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .ok_or_else(|| format!("{} --version said {text:?}", bin.display()))?;
        Ok(format!("{self} {version}"))
    }

    /// What to do when the binary cannot be started.
    pub(crate) fn install_hint(self) -> &'static str {
        match self {
            Self::Redis => "install redis-server (or set REDIS_SERVER)",
            Self::Redis8 => "run `cargo xtask deps` (or set REDIS8_SERVER)",
            Self::Valkey => "run `cargo xtask deps` (or set VALKEY_SERVER)",
        }
    }

    /// Whether this server's binary serves TLS (`--tls-port`). The Valkey
    /// and Redis 8 builds the tests install have no TLS.
    pub fn has_tls(self) -> bool {
        matches!(self, Self::Redis)
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Redis => "redis",
            Self::Redis8 => "redis8",
            Self::Valkey => "valkey",
        })
    }
}

/// What an `INFO server` answer says the server is: `valkey 9.1.2` or
/// `redis 7.0.15` (Valkey also answers `redis_version:7.2.4`, the Redis
/// release it is compatible with, so that field alone misleads).
pub fn describe_server(info_server: &str) -> String {
    let field = |name: &str| {
        let prefix = format!("{name}:");
        info_server
            .lines()
            .find_map(|l| l.trim().strip_prefix(&prefix))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    match (field("server_name"), field("valkey_version")) {
        (Some(name), Some(version)) => format!("{name} {version}"),
        (_, Some(version)) => format!("valkey {version}"),
        _ => format!("redis {}", field("redis_version").unwrap_or("?")),
    }
}

/// Where `cargo xtask deps` unpacks `valkey-server`:
/// `$XDG_CACHE_HOME/lock-runtime-tests/valkey-<VALKEY_VERSION>` (or under
/// `~/.cache`). xtask computes the same folder (`xtask/src/valkey.rs`).
pub fn valkey_dir() -> PathBuf {
    cache_dir().join(format!("valkey-{VALKEY_VERSION}"))
}

/// Where `cargo xtask deps` puts the Redis 8 `redis-server` it builds:
/// `$XDG_CACHE_HOME/lock-runtime-tests/redis-<REDIS8_VERSION>` (or under
/// `~/.cache`). xtask computes the same folder (`xtask/src/redis8.rs`).
pub fn redis8_dir() -> PathBuf {
    cache_dir().join(format!("redis-{REDIS8_VERSION}"))
}

/// How the Redis 8 in [`redis8_dir`] was built, as the file xtask writes
/// beside it says: `"release"` (as Redis ships it, what `cargo xtask deps`
/// builds) or `"tests"` (glibc's allocator at `-O1`, what CI's lanes build:
/// the same commands, not the same speed); `None` without the file (and
/// for `$REDIS8_SERVER`, which is the caller's own).
pub fn redis8_flavor() -> Option<String> {
    if std::env::var_os("REDIS8_SERVER").is_some() {
        return None;
    }
    std::fs::read_to_string(redis8_dir().join("redis-server.flavor"))
        .ok()
        .map(|name| name.trim().to_owned())
}

/// `$XDG_CACHE_HOME/lock-runtime-tests`, or under `~/.cache`.
fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("lock-runtime-tests")
}

/// The compare-and-delete command of its own that a server whose `INFO
/// server` answer is `info_server` has, which the library must find and
/// release with: `DELIFEQ` on Valkey 9.0 and later, `DELEX` on Redis 8.4
/// and later, else `None` (the script).
pub fn native_release(info_server: &str) -> Option<&'static str> {
    let description = describe_server(info_server);
    let (name, version) = description.split_once(' ')?;
    let mut numbers = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next()?, numbers.next().unwrap_or(0));
    match name {
        "valkey" if major >= 9 => Some("DELIFEQ"),
        "redis" if (major, minor) >= (8, 4) => Some("DELEX"),
        _ => None,
    }
}

/// The environment variable naming a file to which skipped tests append a
/// line each (`cargo xtask test` sets it and prints the file after the run:
/// libtest shows a passing test's output only with `--nocapture`).
pub const SKIPS_ENV: &str = "LOCK_TEST_SKIPS";

/// `true` when the current server serves TLS. Otherwise records
/// `SKIPPED on <server>: <test> (no TLS in this build)` (on the test's
/// output, and in the file [`SKIPS_ENV`] names) and returns `false`: the
/// caller then returns without asserting anything, and the run says by name
/// what did not run.
pub fn tls_available(test: &str) -> bool {
    let kind = ServerKind::current();
    if kind.has_tls() {
        return true;
    }
    record_skip(&format!(
        "SKIPPED on {kind}: {test} (this {kind} build has no TLS)"
    ));
    false
}

/// Prints `line` and appends it to the file [`SKIPS_ENV`] names, if any.
/// Panics when that file cannot be written: a skip nobody hears of is what
/// this exists to prevent.
fn record_skip(line: &str) {
    use std::io::Write;
    println!("{line}");
    let Some(path) = std::env::var_os(SKIPS_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"))
        .unwrap_or_else(|e| panic!("{SKIPS_ENV}={}: {e}", path.to_string_lossy()));
}

#[cfg(test)]
mod tests {
    use super::{ServerKind, native_release};

    #[test]
    fn the_server_names_parse_and_a_typo_is_an_error_naming_the_choices() {
        assert_eq!(ServerKind::parse("").unwrap(), ServerKind::Redis);
        assert_eq!(ServerKind::parse("Redis").unwrap(), ServerKind::Redis);
        assert_eq!(ServerKind::parse(" valkey ").unwrap(), ServerKind::Valkey);
        assert_eq!(ServerKind::parse("REDIS8").unwrap(), ServerKind::Redis8);
        assert_eq!(ServerKind::Redis8.to_string(), "redis8");
        let err = ServerKind::parse("valky").unwrap_err();
        assert!(
            err.contains("LOCK_TEST_SERVER")
                && err.contains("`valkey`")
                && err.contains("`redis8`"),
            "{err}"
        );
    }

    #[test]
    fn the_native_release_is_found_from_the_servers_own_name_and_version() {
        let info = |fields: &str| format!("# Server\r\n{fields}\r\n");
        let valkey = info("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2");
        assert_eq!(native_release(&valkey), Some("DELIFEQ"));
        let valkey8 = info("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.0");
        assert_eq!(native_release(&valkey8), None);
        assert_eq!(native_release(&info("redis_version:8.6.3")), Some("DELEX"));
        assert_eq!(native_release(&info("redis_version:8.4.0")), Some("DELEX"));
        assert_eq!(native_release(&info("redis_version:8.2.1")), None);
        assert_eq!(native_release(&info("redis_version:7.0.15")), None);
        assert_eq!(native_release(&info("redis_version:10.0.0")), Some("DELEX"));
    }

    #[test]
    fn a_valkey_is_named_by_its_own_version_not_the_redis_version_it_reports() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(super::describe_server(valkey), "valkey 9.1.2");
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(super::describe_server(redis), "redis 7.0.15");
    }
}
