//! The harness that runs one scenario: the servers, the worker processes,
//! the fault injector's loop, then the checker.

use super::inject::{InjectCtx, Injector, Step};
use super::sides::{LockSide, Running};
use super::*;

/// Scenario 13: the order service's instances, killed under retrying
/// clients, driven by `crate::orders` (the service next to `fault_exe`,
/// its logs in `dir`), then judged: every key one order.
fn run_orders(
    scenario: &Scenario,
    plan: &crate::orders::OrderPlan,
    fault_exe: &Path,
    dir: &Path,
    started: Instant,
) -> Result<Outcome, String> {
    let bin = crate::orders::service::binary(fault_exe)?;
    let ran = crate::orders::drive::drive(&bin, plan, dir)?;
    let (report, stats) = crate::orders::judge(&ran);
    Ok(Outcome {
        scenario: scenario.clone(),
        report,
        elapsed: started.elapsed(),
        faults: ran.kills,
        tokens: None,
        orders: Some(stats),
        error: None,
    })
}

/// Runs `scenario`, re-executing `exe` (the `fault` binary) as the workers;
/// logs and server files go to a temporary directory, kept when `keep` is set.
pub fn run(scenario: &Scenario, exe: &Path, keep: Option<&Path>) -> Result<Outcome, String> {
    let started = Instant::now();
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir: PathBuf = match keep {
        Some(d) => {
            let d = d.join(scenario.name);
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            d
        }
        None => tmp.path().to_path_buf(),
    };
    if let Some(plan) = &scenario.orders {
        return run_orders(scenario, plan, exe, &dir, started);
    }
    let mut lock = LockSide::start(scenario)?;
    let store_server = RedisServer::try_start(&[])?;
    let store_client = redis::Client::open(store_server.url()).map_err(|e| e.to_string())?;
    let mut store_conn = store_client.get_connection().map_err(|e| e.to_string())?;
    let keys: Vec<String> = (0..scenario.keys).map(|i| format!("k{i}")).collect();
    let pg_server = match scenario.postgres {
        true => {
            let server = PostgresServer::try_start()?;
            crate::postgres::setup(&server.url(), &keys)?;
            Some(server)
        }
        false => None,
    };
    let record_url = pg_server.as_ref().map(PostgresServer::url);

    let epoch = log::monotonic_micros();
    let clock = Clock::new(epoch);
    let sampler = match &lock {
        LockSide::Sentinel(group) => {
            let (servers, sentinels) = group.ports();
            // The workers' clients use the default prefix `lock:`.
            let fences = keys
                .iter()
                .map(|k| lock_runtime::__private::testing::fence_counter("lock:", k))
                .collect();
            Some(
                Sampler::start(
                    servers,
                    sentinels,
                    group.master_name().to_owned(),
                    fences,
                    clock,
                    &dir.join("timeline.jsonl"),
                )
                .map_err(|e| e.to_string())?,
            )
        }
        _ => None,
    };
    let (lock_url, store_url) = (lock.urls(), store_server.url());
    let (topology, replica_acks) = (lock.topology(), lock.replica_acks(scenario));
    // The fault's victim: worker 0 and its replacements.
    let victim = |id: u32| {
        (id == 0 || id >= scenario.workers)
            && matches!(scenario.fault, FaultPlan::StopHolder { .. })
    };
    let worker = |id: u32| WorkerConfig {
        id,
        kind: match scenario.victim_kind {
            Some(kind) if victim(id) => kind,
            _ => scenario.kind,
        },
        tasks: scenario.tasks,
        lock_url: lock_url.clone(),
        store_url: store_url.clone(),
        record_url: record_url.clone(),
        topology: topology.clone(),
        replica_acks,
        epoch,
        log_dir: dir.clone(),
        keys: keys.clone(),
        // Replacements (numbered from `workers` on) stand in for worker 0.
        affinity: (
            if id >= scenario.workers {
                0
            } else {
                u64::from(id) % keys.len() as u64
            },
            scenario.affinity_per_mille,
        ),
        budget: scenario.ops,
        // Scenario 12: a lease of its own per worker (its queue entry
        // names it), at most the scenario's.
        ttl_ms: match scenario.fifo {
            Some(_) => scenario.ttl_ms - (u64::from(id) % 100).min(scenario.ttl_ms / 2),
            None => scenario.ttl_ms,
        },
        try_once_per_mille: scenario.fifo,
        wait_ms: scenario.wait_ms,
        think_ms: scenario.think_ms,
        // The victim's first task thinks long: the harness strikes while it
        // holds (its other tasks, if any, wait in its line or go on).
        first_task_think_ms: match scenario.fault {
            FaultPlan::StopHolder {
                victim_think_ms, ..
            } if victim(id) => (victim_think_ms, victim_think_ms),
            _ => scenario.think_ms,
        },
        fencing: scenario.fencing,
        response_timeout_ms: scenario.response_timeout_ms,
        cancel_per_mille: scenario.cancel.0,
        cancel_max_ms: scenario.cancel.1,
        block_per_mille: scenario.block.0,
        block_keep_ms: scenario.block.1,
        block_lose_ms: scenario.block.2,
        seed: u64::from(id) * 7919 + epoch,
        token: scenario.token,
    };
    let spawn = |config: &WorkerConfig| -> Result<Running, String> {
        let stderr = std::fs::File::create(dir.join(format!("worker-{}.stderr", config.id)))
            .map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args(config.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.display()))?;
        Ok(Running {
            id: config.id,
            child,
            done: false,
        })
    };
    let mut running = Vec::new();
    for id in 0..scenario.workers {
        running.push(spawn(&worker(id))?);
    }

    let mut faults: Vec<Fault> = Vec::new();
    let mut fault_log = LogWriter::create(&dir.join("faults.jsonl")).map_err(|e| e.to_string())?;
    let deadline = started + Duration::from_secs(60) + Duration::from_millis(scenario.ops * 30);
    let mut injector = Injector::new(&scenario.fault);
    let mut next_victim = scenario.workers;
    loop {
        let mut all_done = true;
        for r in running.iter_mut().filter(|r| !r.done) {
            match r.child.try_wait() {
                Ok(Some(_)) => r.done = true,
                _ => all_done = false,
            }
        }
        if all_done || Instant::now() > deadline {
            break;
        }
        let step = injector.tick(InjectCtx {
            scenario,
            clock: &clock,
            lock: &mut lock,
            store: &mut store_conn,
            keys: &keys,
            running: &running,
        })?;
        match step {
            Some(Step::Fault(f)) => {
                let _ = fault_log.write(&f);
                faults.push(f);
            }
            Some(Step::KilledVictim(f)) => {
                let _ = fault_log.write(&f);
                faults.push(f);
                // A new victim takes over its role.
                let config = worker(next_victim);
                next_victim += 1;
                running.push(spawn(&config)?);
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    injector.finish(&mut lock, &running, &clock, &mut faults)?;
    let mut hung = Vec::new();
    for r in running.iter_mut() {
        if !r.done {
            // Not finished by the deadline, or a victim stopped at the end.
            match r.child.try_wait() {
                Ok(Some(_)) => {}
                _ => {
                    hung.push(r.id);
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
            }
        }
    }

    let mut workers = Vec::new();
    for r in &running {
        for task in 0..scenario.tasks {
            let id = worker::logical_id(r.id, task, scenario.tasks);
            let events: Vec<Event> = match log::read_lines(&worker::log_file(&dir, id)) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e.to_string()),
            };
            workers.push(WorkerLog {
                id,
                process: r.id,
                events,
            });
        }
    }
    let records = match &record_url {
        Some(url) => crate::postgres::fetch_records(url, &keys)?,
        None => {
            let mut records = BTreeMap::new();
            for key in &keys {
                records.insert(key.clone(), store::fetch_record(&mut store_conn, key)?);
            }
            records
        }
    };
    let drawn = store::fetch_drawn(&mut store_conn)?;
    let tokens = match &mut lock {
        LockSide::Single(server) if scenario.tasks > 1 => Some(TokenCalls::of(server)?),
        _ => None,
    };
    let data = RunData {
        kind: scenario.check_as.unwrap_or(scenario.kind),
        ttl_ms: scenario.ttl_ms,
        slack_ms: scenario.slack_ms,
        expect_monotonic_fences: scenario.expect_monotonic_fences,
        workers,
        faults: faults.clone(),
        records,
        drawn,
        hung,
        fifo: scenario.fifo.is_some(),
    };
    let report = checker::check(&data);
    drop(sampler);
    // A group that a stranger joined measured someone else's data: say so
    // instead of charging its violations to the library.
    let mut error = None;
    if let LockSide::Sentinel(group) = &lock {
        group.copy_logs(&dir);
        error = group
            .check_isolated()
            .err()
            .map(|e| format!("the Sentinel group was not isolated: {e}"));
    }
    drop(lock);
    drop(store_server);
    drop(pg_server);
    Ok(Outcome {
        scenario: scenario.clone(),
        report,
        elapsed: started.elapsed(),
        faults: faults.len(),
        tokens,
        orders: None,
        error,
    })
}
