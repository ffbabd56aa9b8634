//! Redis 8 for the tests: the server with `DELEX` and `SET .. IFEQ` (Redis
//! 8.4 and later), which the library releases and settles records with.
//! No package this machine reaches ships a Redis 8 binary that runs on it
//! (Debian 12 has Redis 7.0; Debian's newer ones need a newer glibc), so the
//! pinned release is built from its source: the upstream tarball as Debian
//! keeps it (`redis_<VERSION>.orig.tar.gz`, from Debian's own mirror), its
//! SHA-256 checked before anything in it is built, no TLS, once: the binary
//! is kept in a cache folder that `test-support` looks in
//! (`test_support::redis8_dir`), with a file beside it that names its
//! [`Flavor`]. `cargo xtask deps` builds it as Redis ships it (the bundled
//! jemalloc, `-O3` with link-time optimisation: about 200 CPU-seconds, under
//! two minutes on two idle cores), the build the benchmark's Redis 8 figures
//! are measured on; CI's lanes, which only test against it, build it with
//! glibc's allocator at `-O1` (about 50 CPU-seconds).
//!
//! A source that cannot be fetched (Debian drops an old upload from its
//! pool once a newer one replaces it) is not a failure of the tests: the
//! Redis 8 set is then skipped, and the report says so and why.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::valkey::{make_executable, path_str, sha256};

/// The server release the tests pin (`test_support::REDIS8_VERSION`).
pub(crate) const VERSION: &str = "8.6.3";
/// Where its source is fetched from.
const SOURCE_URL: &str = "http://deb.debian.org/debian/pool/main/r/redis/redis_8.6.3.orig.tar.gz";
/// The tarball's SHA-256 (Debian's `Checksums-Sha256` for it).
const SOURCE_SHA256: &str = "58d0d1eb49a1ea6c2179659707fec171b1e2e2b8d5157ed2ec59d1d66ad5a654";

/// The cache folder: `$XDG_CACHE_HOME/lock-runtime-tests/redis-<VERSION>`,
/// or under `~/.cache` (the same rule as `test_support::redis8_dir`).
pub(crate) fn dir() -> PathBuf {
    super::valkey::dir()
        .parent()
        .map_or_else(std::env::temp_dir, Path::to_path_buf)
        .join(format!("redis-{VERSION}"))
}

/// The server binary the tests run: `$REDIS8_SERVER`, or the cached one.
pub(crate) fn server() -> PathBuf {
    std::env::var_os("REDIS8_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir().join("redis-server"))
}

/// Whether a Redis 8 `redis-server` [`VERSION`] is where the tests look
/// (of either [`Flavor`]).
pub(crate) fn installed() -> bool {
    reports_version(&server())
}

/// How the cached `redis-server` was built; the file beside it,
/// `redis-server.flavor`, holds its name (`test_support::redis8_flavor`
/// reads it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// As Redis ships it: jemalloc, `-O3` with link-time optimisation. What
    /// `cargo xtask deps` builds, and the benchmark wants.
    Release,
    /// For the tests alone: glibc's allocator, `-O1`, no link-time
    /// optimisation; a quarter of the release build's CPU. What CI's lanes
    /// build beside the tests. Every command behaves the same.
    Tests,
}

impl Flavor {
    /// Its name in the file beside the binary.
    fn name(self) -> &'static str {
        match self {
            Flavor::Release => "release",
            Flavor::Tests => "tests",
        }
    }

    /// `make`'s variables for it (after the common ones).
    fn make_vars(self) -> &'static [&'static str] {
        match self {
            Flavor::Release => &[],
            Flavor::Tests => &["MALLOC=libc", "OPTIMIZATION=-O1"],
        }
    }

    /// The flavor of the cached binary: the file's, or a release build
    /// when there is no file (a binary cached before the file existed).
    fn cached() -> Flavor {
        match std::fs::read_to_string(flavor_file()) {
            Ok(name) if name.trim() == Flavor::Tests.name() => Flavor::Tests,
            _ => Flavor::Release,
        }
    }
}

/// The file beside the cached binary that names its [`Flavor`].
fn flavor_file() -> PathBuf {
    dir().join("redis-server.flavor")
}

/// How [`install`] runs: its output, and at which CPU priority.
#[derive(Clone, Copy)]
pub(crate) enum How<'a> {
    /// Its output shown as it goes, at the usual priority.
    Shown,
    /// Beside other work (CI's test build and lanes): its output to the
    /// file, the compiler at the lowest CPU priority (`nice -n 19`), so it
    /// takes only the cores the rest leaves idle.
    Beside(&'a std::fs::File),
}

impl How<'_> {
    fn run(self, program: &str, args: &[&str]) -> Result<(), String> {
        match self {
            How::Shown => crate::run(program, args, &[]),
            How::Beside(log) => crate::run_logged(program, args, &[], Some(log)),
        }
    }

    /// The build this way of running wants, and whether a cached binary of
    /// `cached` flavor does instead: shown (`cargo xtask deps`), a release
    /// build, replacing a build for the tests; beside the tests, whichever
    /// is there, else a build for the tests.
    fn wants(self, cached: Option<Flavor>) -> Option<Flavor> {
        match (self, cached) {
            (How::Shown, Some(Flavor::Release)) | (How::Beside(_), Some(_)) => None,
            (How::Shown, _) => Some(Flavor::Release),
            (How::Beside(_), None) => Some(Flavor::Tests),
        }
    }
}

/// Builds `redis-server` [`VERSION`] into [`dir`] unless a binary that
/// reports it is already there, of the [`Flavor`] `how` wants (or
/// `$REDIS8_SERVER` names one). An error says what failed; the caller
/// decides whether that stops the run.
pub(crate) fn install(how: How<'_>) -> Result<(), String> {
    let binary = server();
    let named = std::env::var_os("REDIS8_SERVER").is_some();
    let cached = reports_version(&binary).then(Flavor::cached);
    if named && cached.is_some() {
        return Ok(());
    }
    let Some(flavor) = how.wants(cached) else {
        return Ok(());
    };
    if named {
        return Err(format!(
            "REDIS8_SERVER={} is not a redis-server {VERSION}",
            binary.display()
        ));
    }
    let target = dir();
    let building = format!(
        "building redis-server {VERSION} ({} build) into {} (once)",
        flavor.name(),
        target.display()
    );
    match how {
        How::Shown => eprintln!("{building}"),
        How::Beside(mut log) => {
            let _ = std::io::Write::write_all(&mut log, format!("{building}\n").as_bytes());
        }
    }
    let build = target.join("build");
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build)
        .map_err(|e| format!("cannot create {}: {e}", build.display()))?;
    // A binary of the other flavor is no longer what the file says.
    let _ = std::fs::remove_file(flavor_file());
    let built = fetch_and_build(&build, how, flavor);
    let outcome = built.and_then(|source| {
        let from = source.join("src").join("redis-server");
        std::fs::copy(&from, &binary).map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                from.display(),
                binary.display()
            )
        })?;
        make_executable(&binary)
    });
    let _ = std::fs::remove_dir_all(&build);
    outcome?;
    if reports_version(&binary) {
        std::fs::write(flavor_file(), flavor.name())
            .map_err(|e| format!("cannot write {}: {e}", flavor_file().display()))
    } else {
        Err(format!(
            "{} does not run or is not Redis {VERSION} (`--version`)",
            binary.display()
        ))
    }
}

/// Fetches the source into `build`, checks it, unpacks and builds it: the
/// source folder.
fn fetch_and_build(build: &Path, how: How<'_>, flavor: Flavor) -> Result<PathBuf, String> {
    let tarball = build.join(format!("redis_{VERSION}.orig.tar.gz"));
    how.run(
        "curl",
        &[
            "--fail",
            "--silent",
            "--show-error",
            "--location",
            "--max-time",
            "300",
            "--output",
            path_str(&tarball)?,
            SOURCE_URL,
        ],
    )
    .map_err(|e| format!("cannot fetch the Redis {VERSION} source ({SOURCE_URL}): {e}"))?;
    let actual = sha256(&tarball)?;
    if actual != SOURCE_SHA256 {
        return Err(format!(
            "{} has SHA-256 {actual}, expected {SOURCE_SHA256}: not built",
            tarball.display()
        ));
    }
    how.run(
        "tar",
        &["-xzf", path_str(&tarball)?, "-C", path_str(build)?],
    )?;
    let source = build.join(format!("redis-{VERSION}"));
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    let jobs = format!("-j{jobs}");
    let make = [
        &[
            "-C",
            path_str(&source)?,
            &jobs,
            "BUILD_TLS=no",
            "USE_SYSTEMD=no",
        ][..],
        flavor.make_vars(),
        &["redis-server"],
    ]
    .concat();
    let built = match how {
        How::Shown => how.run("make", &make),
        How::Beside(_) => how.run("nice", &[&["-n", "19", "make"][..], &make].concat()),
    };
    built.map_err(|e| {
        format!("building Redis {VERSION} failed (needs make and a C compiler): {e}")
    })?;
    Ok(source)
}

/// `true` when `binary --version` names Redis [`VERSION`].
fn reports_version(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            o.status.success()
                && text.starts_with("Redis server")
                && text.contains(&format!("v={VERSION} "))
        })
}

#[cfg(test)]
mod tests {
    use super::{Flavor, How};

    #[test]
    fn deps_wants_a_release_build_and_the_lanes_take_whichever_is_there() {
        let log = std::fs::File::open("/dev/null").unwrap();
        let beside = How::Beside(&log);
        assert_eq!(How::Shown.wants(None), Some(Flavor::Release));
        assert_eq!(How::Shown.wants(Some(Flavor::Tests)), Some(Flavor::Release));
        assert_eq!(How::Shown.wants(Some(Flavor::Release)), None);
        assert_eq!(beside.wants(None), Some(Flavor::Tests));
        assert_eq!(beside.wants(Some(Flavor::Tests)), None);
        assert_eq!(beside.wants(Some(Flavor::Release)), None);
    }
}
