//! Runs the model checks and prints state counts, times and counterexamples.
//!
//! ```sh
//! cargo run --release -p model                 # the CI configurations
//! cargo run --release -p model -- --exhaustive # the larger ones too (minutes)
//! cargo run --release -p model -- --exhaustive crash # only those whose name has "crash"
//! ```

use model::check::{Report, Run, check};
use model::configs;

/// Checks each `name => configuration` in order whose name contains
/// `$only` (the configurations are of different model types, hence a macro
/// rather than a slice).
macro_rules! checks {
    ($run:expr, $only:expr; $($name:literal => $config:expr),* $(,)?) => {{
        let mut reports = Vec::new();
        $(if $name.contains($only) {
            // A check expected to fail stops at its first counterexample
            // (the tests do the same): the rest of its states say nothing.
            let run = Run {
                stop_at_first_failure: $name.contains("counterexample expected"),
                ..$run
            };
            reports.push(check($name, $config.into_model(), run));
        })*
        reports
    }};
}

fn main() {
    let exhaustive = std::env::args().any(|a| a == "--exhaustive");
    let only = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_default();
    let only = only.as_str();
    let run = Run::default();
    let mut reports: Vec<Report> = checks![run, only;
        "lock: 2 clients, every fault kind, <= 2 faults" =>
            configs::lock_two_clients_two_faults(),
        "lock: 2 clients, every fault kind, <= 1 fault, 1 other key's token" =>
            configs::lock_two_clients_one_fault_other_key(),
        "lock: 3 clients, no faults" => configs::lock_three_clients_no_faults(),
        "lock: 3 clients, 1 pause" => configs::lock_three_clients_one_pause(),
        "lock: 3 clients, 1 crash, one waiting a tick" => configs::lock_three_clients_one_crash(),
        "lock: 3 clients, 1 crash, the acquire.lua before 7dbf470 (counterexample expected)" => {
            let mut cfg = configs::lock_three_clients_one_crash();
            cfg.fifo_on_expiry = false;
            cfg
        },
        "lock: 3 clients, 1 crash, no skipping of ended waits (counterexample expected)" => {
            let mut cfg = configs::lock_three_clients_one_crash();
            cfg.skip_ended_waits = false;
            cfg
        },
        "lock: 3 clients, 1 pause, no stale-grant check (counterexample expected)" => {
            let mut cfg = configs::lock_three_clients_one_pause();
            cfg.check_stale_grants = false;
            cfg
        },
        "lock: 3 clients, 1 pause, no stale-grant check, hand-overs always confirmed" => {
            let mut cfg = configs::lock_three_clients_one_pause();
            cfg.check_stale_grants = false;
            cfg.confirm_every_handoff = true;
            cfg
        },
        "lock: 2 tasks of one process, every fault kind, <= 2 faults" =>
            configs::lock_line_of_two(2),
        "lock: 2 tasks of one process and another process, start together, no faults" =>
            configs::lock_line_of_two_and_another_process_starting_together(),
        "lock: 2 tasks of one process, hand-over below the block (counterexample expected)" => {
            let mut cfg = configs::lock_line_of_two(0);
            cfg.hand_on_below_block = true;
            cfg
        },
        "rw: reader, writer, reader, 1 pause" => configs::rw_reader_writer_reader_one_pause(),
        "rw: writer and reader, every fault kind, <= 2 faults" => configs::rw_writer_and_reader(2),
        "semaphore: 3 takers of 2 permits, every fault kind, <= 1 fault" =>
            configs::semaphore_three_takers_of_two(1),
        "rw: reader, writer, reader, newcomers admitted past the queue (counterexample expected)" => {
            let mut cfg = configs::rw_reader_writer_reader();
            if let Some(shared) = &mut cfg.shared {
                shared.admit_past_queue = true;
            }
            cfg
        },
        "redlock: 3 nodes, 2 clients, <= 2 lost messages, 1 pause" =>
            configs::redlock_two_clients(),
        "records: 2 requests, <= 2 faults" => configs::records_two_requests(),
        "records with a commit store: 2 requests, <= 2 faults" =>
            configs::records_two_requests_commit_store(),
        "records with a commit store that nobody looks in before running (counterexample expected)" => {
            let mut cfg = configs::records_two_requests_commit_store();
            if let Some(store) = &mut cfg.store {
                store.look = false;
            }
            cfg
        },
        "records with a commit that does not check for a committed copy (counterexample expected)" => {
            let mut cfg = configs::records_two_requests_commit_store();
            if let Some(store) = &mut cfg.store {
                store.commit_checks = false;
            }
            cfg
        },
        "records committed on the lock server: 2 requests, <= 2 faults" =>
            configs::records_two_requests_commit_on_lock_server(),
        "records committed on the lock server without the check for a completed record (counterexample expected)" => {
            let mut cfg = configs::records_two_requests_commit_on_lock_server();
            if let Some(store) = &mut cfg.store {
                store.commit_checks = false;
            }
            cfg
        },
    ];
    if exhaustive {
        reports.extend(checks![run, only;
            "lock: 3 clients, 1 pause, 1 other key's token" =>
                configs::lock_three_clients_one_pause_other_key(),
            "lock: 3 clients, every fault kind, <= 1 fault" =>
                configs::lock_three_clients_one_fault(),
            "lock: 3 clients start together, every fault kind, <= 1 fault, one waiting a tick" =>
                configs::lock_three_clients_one_fault_one_waiting_a_tick(),
            "lock: 2 waiters and a try-once newcomer, starting by t=3, 1 crash" =>
                configs::lock_two_waiters_and_a_try_once_newcomer_one_crash(),
            "lock: 2 waiters and a try-once newcomer, the acquire.lua before 7dbf470 (counterexample expected)" => {
                let mut cfg = configs::lock_two_waiters_and_a_try_once_newcomer_one_crash();
                cfg.fifo_on_expiry = false;
                cfg
            },
            "lock: 2 waiters and a try-once newcomer, 1 crash, no pin (counterexample expected)" => {
                let mut cfg = configs::lock_two_waiters_and_a_try_once_newcomer_one_crash();
                cfg.line_pins_key = false;
                cfg
            },
            "lock: 2 clients, 1 pause, mint.lua without the ownership check (counterexample expected)" => {
                let mut cfg = configs::lock_two_clients_one_pause();
                cfg.mint_checks_owner = false;
                cfg
            },
            "lock: 2 tasks of one process and another process, no faults" =>
                configs::lock_line_of_two_and_another_process(),
            "lock: 2 tasks of one process and another process, every fault kind, <= 1 fault" =>
                configs::lock_line_of_two_and_another_process_one_fault(),
            "redlock: 3 nodes, 3 clients, <= 2 lost messages, 1 pause" =>
                configs::redlock_three_clients(),
            "records: 3 requests, <= 3 faults" => configs::records_three_requests(),
            "records with a commit store: 2 requests, <= 3 faults" =>
                configs::records_two_requests_three_faults_commit_store(),
            "rw: reader, writer, reader, no faults, longer holds" =>
                configs::rw_reader_writer_reader_longer(),
            "rw: reader, writer, reader, every fault kind, <= 1 fault" =>
                configs::rw_reader_writer_reader_one_fault(),
            "semaphore: 3 takers of 2 permits, every fault kind, <= 2 faults" =>
                configs::semaphore_three_takers_of_two(2),
        ]);
    }
    for r in &reports {
        println!("{r}");
    }
    println!("summary:");
    for r in &reports {
        println!(
            "  {:<75} {:>11} states {:>9.2?}  {}",
            r.name,
            r.unique_states,
            r.elapsed,
            if r.is_clean() {
                "ok".to_string()
            } else {
                format!(
                    "FAILED: {}{}",
                    r.counterexamples
                        .iter()
                        .map(|c| c.property)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if r.unreached.is_empty() {
                        String::new()
                    } else {
                        format!(" unreached: {}", r.unreached.join(", "))
                    }
                )
            }
        );
    }
}
