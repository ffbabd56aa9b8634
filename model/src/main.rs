//! Runs the model checks: `cargo run --release -p model -- [--exhaustive] [NAME...]`.

use model::check::{Run, check};
use model::lock::{Faults, LockConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let clients: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let total: u8 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    let wait: u8 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(4);
    let faults = if total == 0 { Faults::NONE } else { Faults::each_once(total) };
    let report = check(
        format!("lock, {clients} clients, {total} faults"),
        LockConfig::new(clients, wait, faults).into_model(),
        Run::default(),
    );
    println!("{report}");
}
