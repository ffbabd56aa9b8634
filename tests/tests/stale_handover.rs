//! A waiter whose process is paused past its hand-over lease must not take
//! the lock from the client that got it meanwhile: the model checker's
//! counterexample (FAULTS.md, "What is model-checked"), on real Redis.
//!
//! B waits for a key held by C. B's process stops (its only runtime thread
//! blocks) while its retry timer runs out; C releases, handing the key to B
//! with a 2 s lease and a notice; the lease runs out and A takes the key.
//! When B resumes, its timer and the old notice are both ready: if the timer
//! wins, B tries again, finds the key busy (A), and then picks up the old
//! hand-over. It must see that the hand-over is older than that busy answer
//! (its token is not above the counter the attempt saw) and keep waiting.

use std::sync::mpsc;

use lock_runtime::LockError;
use test_support::RedisServer;
use test_support::helpers::{ms, one_worker_runtime, redis_url_client, secs};

/// One round; `Ok` when B kept waiting (and timed out) while A held the key.
fn round(url: String, key: String) -> Result<(), String> {
    let main = one_worker_runtime();
    let client = |url: String| async move { redis_url_client(url).await.expect("a client") };
    let (a, c) = main.block_on(async { (client(url.clone()).await, client(url.clone()).await) });
    let held_by_c = main.block_on(c.lock(&key).ttl(secs(1)).acquire()).unwrap();

    // B: a process of its own (one runtime thread), waiting for the key.
    let (pause_tx, pause_rx) = tokio::sync::oneshot::channel::<()>();
    let (result_tx, result_rx) = mpsc::channel();
    let b_key = key.clone();
    let b = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let b = client(url).await;
            tokio::spawn(async move {
                if pause_rx.await.is_ok() {
                    // SIGSTOP, as far as this runtime can tell.
                    std::thread::sleep(secs(3));
                }
            });
            let got = b.lock(&b_key).ttl(secs(2)).wait(secs(4)).acquire().await;
            let fencing = match &got {
                Ok(g) => g.fencing_token().await.ok(),
                Err(_) => None,
            };
            result_tx.send(got.map(|_| fencing)).unwrap();
        });
    });

    let outcome = main.block_on(async move {
        tokio::time::sleep(ms(300)).await; // B waits
        pause_tx.send(()).unwrap();
        tokio::time::sleep(ms(100)).await;
        held_by_c.release().await.unwrap(); // handed to the paused B
        // A waits out B's hand-over lease and takes the key.
        let held_by_a = a.lock(&key).wait(secs(5)).acquire().await.unwrap();
        let a_fencing = held_by_a.fencing_token().await.unwrap();
        let b_result = tokio::task::spawn_blocking(move || result_rx.recv().unwrap())
            .await
            .unwrap();
        let still_a = !held_by_a.is_lost();
        held_by_a.release().await.unwrap();
        match b_result {
            Err(LockError::Busy { .. }) => Ok(()),
            Ok(b_fencing) => Err(format!(
                "B acquired (token {b_fencing:?}) while A held the key (token {a_fencing}, \
                 lease valid: {still_a})"
            )),
            Err(e) => Err(format!("B: {e:?}")),
        }
    });
    b.join().unwrap();
    outcome
}

#[test]
fn a_waiter_paused_past_its_hand_over_does_not_take_the_key_from_the_next_holder() {
    let server = RedisServer::start();
    // Rounds run side by side (one key each); in each, whether B's timer or
    // the old notice is seen first after the pause is up to the scheduler.
    let rounds: Vec<_> = (0..6)
        .map(|i| {
            let (url, key) = (server.url(), format!("stale-handover:{i}"));
            std::thread::spawn(move || round(url, key))
        })
        .collect();
    let failures: Vec<String> = rounds
        .into_iter()
        .filter_map(|r| r.join().unwrap().err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of 6 rounds: {failures:#?}",
        failures.len()
    );
}
