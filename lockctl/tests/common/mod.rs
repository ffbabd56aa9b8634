//! What the `lockctl` tests share: running the binary and reading its
//! output.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

/// Runs `lockctl` pointed at `target` (`["--redis", url]`, `["--cluster",
/// seed]`) with `args`, `stdin` on its standard input and `REDIS_URL`
/// unset, so that only `target` names the server.
pub(crate) fn lockctl(target: &[&str], args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .args(target)
        .args(args)
        .env_remove("REDIS_URL")
        .stderr(Stdio::piped());
    test_support::output_with_input(&mut command, stdin).expect("lockctl runs")
}

/// An output stream as text.
pub(crate) fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}
