//! Runs the model checks: `cargo run --release -p model -- CLIENTS FAULTS TOTAL [WAIT]`.

use model::check::{Run, check};
use model::lock::{Faults, LockConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let clients: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let kinds = args.get(1).cloned().unwrap_or_default();
    let total: u8 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let wait: u8 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(4);
    let mut faults = Faults::NONE;
    for k in kinds.split(',') {
        match k {
            "crash" => faults.crash = 1,
            "pause" => faults.pause = 1,
            "request" => faults.lost_request = 1,
            "reply" => faults.lost_reply = 1,
            "notice" => faults.lost_notice = 1,
            "all" => faults = Faults::each_once(0),
            _ => {}
        }
    }
    faults.total = total;
    let mut cfg = LockConfig::new(clients, wait, faults);
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u8>().ok());
    if let Some(v) = env("START_BY") {
        cfg.start_by = v;
    }
    if let Some(v) = env("HOLD_MAX") {
        cfg.hold_max = v;
    }
    cfg.confirm_every_handoff = env("FIX") == Some(1);
    let report = check(
        format!("lock, {clients} clients, {faults:?}"),
        cfg.into_model(),
        Run::default(),
    );
    println!("{report}");
}
