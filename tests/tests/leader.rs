//! Leader election, every scenario on the embedded backend, one
//! Redis, Sentinel and a three-master Cluster: one leader at a time, terms
//! that strictly increase, a resign that hands over at once, an observer on
//! another client that sees every change in order (and `None` after a
//! resign with nobody waiting), `run` cancelled with `Lost`, a bounded
//! campaign that gives `Busy`, and bad input as clear errors. Leaders in
//! other processes, killed with `SIGKILL`: `leader_processes.rs`.
//!
//! On the embedded backend the four "clients" are clones of one (it lives
//! in one process); elsewhere each has its own connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete_leader;
use lock_runtime::{Leader, LockClient, LockClientBuilder, LockError};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, SentinelSetup, Topology};
use tokio::sync::watch;

/// Generates one test per scenario for a backend whose setup is cheap.
macro_rules! per_scenario {
    ($backend:ident, $setup:ident) => {
        mod $backend {
            per_scenario!(@tests $setup;
                three_candidates_take_turns_one_leader_at_a_time_with_rising_terms,
                a_resign_hands_over_to_the_next_candidate_at_once,
                an_observer_on_a_fourth_client_sees_every_change_in_order_and_none_at_the_end,
                run_is_cancelled_with_lost_when_the_leadership_is_lost,
                a_bounded_campaign_against_a_leader_is_busy,
                bad_names_ttls_and_labels_are_clear_errors,
                leaders_lists_the_elected_leaders_with_labels_and_terms,
                a_leadership_and_a_lock_of_the_same_name_do_not_exclude_each_other,
                a_renewed_leader_stays_visible_long_past_its_first_lease,
            );
        }
    };
    (@tests $setup:ident; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (servers, clients) = super::$setup().await;
                super::$name(&clients, stringify!($name)).await;
                drop(clients);
                let _servers = servers;
            }
        )*
    };
}

per_scenario!(memory, memory_clients);
per_scenario!(redis, redis_clients);

/// Four clones of one embedded client.
async fn memory_clients() -> ((), Vec<LockClient>) {
    let client = memory_client().await;
    (
        (),
        vec![client.clone(), client.clone(), client.clone(), client],
    )
}

/// A `redis-server` of its own and four independent clients of it.
async fn redis_clients() -> (RedisServer, Vec<LockClient>) {
    let server = RedisServer::start();
    let builder = LockClient::builder().redis(server.url());
    (server, four_clients(&builder).await)
}

async fn four_clients(builder: &LockClientBuilder) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(builder).await);
    }
    clients
}

/// Every scenario on one topology (starting one per scenario would take
/// longer than the scenarios).
async fn all_scenarios(clients: &[LockClient], backend: &str) {
    three_candidates_take_turns_one_leader_at_a_time_with_rising_terms(clients, backend).await;
    a_resign_hands_over_to_the_next_candidate_at_once(clients, backend).await;
    an_observer_on_a_fourth_client_sees_every_change_in_order_and_none_at_the_end(clients, backend)
        .await;
    run_is_cancelled_with_lost_when_the_leadership_is_lost(clients, backend).await;
    a_bounded_campaign_against_a_leader_is_busy(clients, backend).await;
    bad_names_ttls_and_labels_are_clear_errors(clients, backend).await;
    leaders_lists_the_elected_leaders_with_labels_and_terms(clients, backend).await;
    a_leadership_and_a_lock_of_the_same_name_do_not_exclude_each_other(clients, backend).await;
    a_renewed_leader_stays_visible_long_past_its_first_lease(clients, backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_sentinel() {
    let (setup, builder) = tokio::task::block_in_place(SentinelSetup::start).with_builder();
    let clients = four_clients(&builder).await;
    all_scenarios(&clients, "sentinel").await;
    drop(clients);
    drop(setup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_a_three_master_cluster() {
    let (cluster, builder) = tokio::task::block_in_place(|| Cluster::start(3)).with_builder();
    let clients = four_clients(&builder).await;
    all_scenarios(&clients, "cluster").await;
    drop(clients);
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_on_redlock_is_a_config_error_that_says_why() {
    let redlock = tokio::task::block_in_place(|| test_support::topology::Redlock::start(3));
    let client = client(&redlock.builder()).await;
    let err = client.leader(key("r")).campaign().await.unwrap_err();
    assert!(
        matches!(&err, LockError::Config(why) if why.contains("Redlock")),
        "{err}"
    );
    let err = client.leader(key("r")).observe().await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err}");
}

// ---- the scenarios ---------------------------------------------------------

/// 3 candidates (clients 0..3) each win `ROUNDS` terms: never two leaders
/// at once, and the terms, in the order they were won, strictly increase.
async fn three_candidates_take_turns_one_leader_at_a_time_with_rising_terms(
    clients: &[LockClient],
    test: &str,
) {
    const ROUNDS: usize = 5;
    let name = key(&format!("{test}-turns"));
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, client) in clients[..3].iter().enumerate() {
        let (client, name, leading, terms) =
            (client.clone(), name.clone(), leading.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let leadership = client
                    .leader(&name)
                    .ttl(secs(5))
                    .label(format!("candidate-{i}"))
                    .campaign()
                    .await
                    .expect("elected");
                assert_eq!(leading.fetch_add(1, SeqCst), 0, "two leaders at once");
                terms.lock().unwrap().push(leadership.term());
                tokio::time::sleep(ms(20)).await;
                leading.fetch_sub(1, SeqCst);
                leadership.resign().await.expect("resigned");
            }
        }));
    }
    for task in tasks {
        within(secs(30), "the candidates' rounds", task)
            .await
            .expect("a candidate");
    }
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 3 * ROUNDS);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms in election order: {terms:?}"
    );
}

/// A resign elects the candidate in line in about one round trip (well
/// under its lease, which would be the fallback).
async fn a_resign_hands_over_to_the_next_candidate_at_once(clients: &[LockClient], test: &str) {
    let name = key(&format!("{test}-resign"));
    let first = clients[0]
        .leader(&name)
        .ttl(secs(10))
        .campaign()
        .await
        .unwrap();
    let next = {
        let (client, name) = (clients[1].clone(), name.clone());
        tokio::spawn(async move {
            let leadership = client.leader(&name).ttl(secs(10)).campaign().await;
            (Instant::now(), leadership)
        })
    };
    tokio::time::sleep(ms(200)).await; // in line
    let resigned = Instant::now();
    let first_term = first.term();
    first.resign().await.unwrap();
    let (elected, second) = within(secs(5), "the next candidate", next).await.unwrap();
    let second = second.expect("elected");
    let took = elected.duration_since(resigned);
    assert!(took < ms(500), "hand-over took {took:?}");
    assert!(second.term() > first_term);
    second.resign().await.unwrap();
}

/// The next value of an observer, within a second: a change comes by
/// notice, in about one round trip (the leases here, the fallback, are
/// longer).
async fn next_seen(rx: &mut watch::Receiver<Option<Leader>>, what: &str) -> Option<Leader> {
    within(secs(1), what, rx.changed())
        .await
        .expect("the observer still runs");
    rx.borrow_and_update().clone()
}

/// Client 3 observes while 0, 1 and 2 lead in turn and resign: it sees
/// each leader (label, term) in order, then `None` after the last resign,
/// with nobody waiting.
async fn an_observer_on_a_fourth_client_sees_every_change_in_order_and_none_at_the_end(
    clients: &[LockClient],
    test: &str,
) {
    let name = key(&format!("{test}-observed"));
    let mut rx = clients[3].leader(&name).observe().await.unwrap();
    assert_eq!(*rx.borrow_and_update(), None, "nobody leads yet");
    let a = clients[0]
        .leader(&name)
        .label("a")
        .ttl(secs(10))
        .campaign()
        .await
        .unwrap();
    let seen = next_seen(&mut rx, "leader a").await.expect("a leads");
    assert_eq!((seen.label.as_str(), seen.term), ("a", a.term()));
    assert_eq!(seen.name, name);
    let campaign = |i: usize, label: &'static str| {
        let (client, name) = (clients[i].clone(), name.clone());
        tokio::spawn(async move {
            client
                .leader(&name)
                .label(label)
                .ttl(secs(10))
                .campaign()
                .await
        })
    };
    let b = campaign(1, "b");
    tokio::time::sleep(ms(100)).await;
    let c = campaign(2, "c");
    tokio::time::sleep(ms(100)).await;
    assert!(
        !rx.has_changed().unwrap(),
        "candidates in line change nothing"
    );
    let mut last = a.term();
    a.resign().await.unwrap();
    for (label, task) in [("b", b), ("c", c)] {
        let leadership = within(secs(5), label, task).await.unwrap().unwrap();
        let seen = next_seen(&mut rx, label).await.expect("a leader");
        assert_eq!((seen.label.as_str(), seen.term), (label, leadership.term()));
        assert!(seen.term > last, "terms rise");
        last = seen.term;
        leadership.resign().await.unwrap();
    }
    assert_eq!(next_seen(&mut rx, "nobody").await, None);
}

/// `run` while leading: the leadership's lock deleted behind its back (an
/// operator's `DEL`), the work is cancelled with `Lost` at the next renewal.
async fn run_is_cancelled_with_lost_when_the_leadership_is_lost(
    clients: &[LockClient],
    test: &str,
) {
    let name = key(&format!("{test}-lost"));
    let started = Arc::new(tokio::sync::Notify::new());
    let run = {
        let (client, name, started) = (clients[0].clone(), name.clone(), started.clone());
        tokio::spawn(async move {
            client
                .leader(&name)
                .ttl(ms(600))
                .run(async move {
                    started.notify_one();
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    within(secs(5), "the work starts", started.notified()).await;
    force_delete_leader(&clients[1], &name).await.unwrap();
    let ended = within(secs(3), "run ends", run).await.unwrap();
    assert!(
        matches!(&ended, Err(LockError::Lost { key }) if *key == name),
        "{ended:?}"
    );
    // And `run` whose work ends resigns: somebody else is elected at once.
    let term = clients[0].leader(&name).run(async {}).await;
    assert!(term.is_ok());
    let again = clients[1]
        .leader(&name)
        .wait(Duration::ZERO)
        .campaign()
        .await
        .expect("free after run");
    again.resign().await.unwrap();
}

async fn a_bounded_campaign_against_a_leader_is_busy(clients: &[LockClient], test: &str) {
    let name = key(&format!("{test}-busy"));
    let leader = clients[0].leader(&name).campaign().await.unwrap();
    let started = Instant::now();
    let err = clients[1]
        .leader(&name)
        .wait(ms(300))
        .campaign()
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert!(started.elapsed() >= ms(300));
    // Out of the line: the resign leaves nobody leading.
    let mut rx = clients[2].leader(&name).observe().await.unwrap();
    leader.resign().await.unwrap();
    assert_eq!(next_seen(&mut rx, "nobody").await, None);
}

async fn bad_names_ttls_and_labels_are_clear_errors(clients: &[LockClient], test: &str) {
    let client = &clients[0];
    let err = client.leader("").campaign().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey(_)), "{err}");
    let err = client.leader("").observe().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey(_)), "{err}");
    let name = key(&format!("{test}-bad"));
    let err = client
        .leader(&name)
        .ttl(Duration::ZERO)
        .campaign()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Config(m) if m.contains("lease")),
        "{err}"
    );
    for label in ["", "a\nb"] {
        let err = client.leader(&name).label(label).campaign().await;
        assert!(
            matches!(&err, Err(LockError::Config(m)) if m.contains("label")),
            "{label:?}: {err:?}"
        );
    }
    let long = "x".repeat(lock_runtime::MAX_LABEL_LEN + 1);
    assert!(client.leader(&name).label(long).campaign().await.is_err());
}

async fn leaders_lists_the_elected_leaders_with_labels_and_terms(
    clients: &[LockClient],
    test: &str,
) {
    let base = key(&format!("{test}-listed"));
    let one = clients[0]
        .leader(format!("{base}:one"))
        .label("pod-a")
        .campaign()
        .await
        .unwrap();
    let two = clients[1]
        .leader(format!("{base}:two"))
        .label("pod-b")
        .campaign()
        .await
        .unwrap();
    let listed = clients[3].leaders(&base, 100).await.unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|l| (l.name.clone(), l.label.clone(), l.term))
        .collect();
    assert_eq!(
        seen,
        [
            (format!("{base}:one"), "pod-a".to_owned(), one.term()),
            (format!("{base}:two"), "pod-b".to_owned(), two.term()),
        ]
    );
    assert_eq!(clients[3].leaders(&base, 1).await.unwrap().len(), 1);
    one.resign().await.unwrap();
    let listed = clients[3].leaders(&base, 100).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    two.resign().await.unwrap();
    assert!(clients[3].leaders(&base, 100).await.unwrap().is_empty());
}

async fn a_leadership_and_a_lock_of_the_same_name_do_not_exclude_each_other(
    clients: &[LockClient],
    test: &str,
) {
    let name = key(&format!("{test}-both"));
    let leadership = clients[0].leader(&name).campaign().await.unwrap();
    let lock = clients[1]
        .lock(&name)
        .acquire()
        .await
        .expect("another kind");
    assert!(
        clients[1]
            .lock(&name)
            .acquire()
            .await
            .unwrap_err()
            .is_busy()
    );
    lock.release().await.unwrap();
    // And the task that leads takes the lock of that name, not the leadership.
    let nested = clients[0]
        .leader(format!("{name}-run"))
        .run(async {
            let guard = clients[0].lock(format!("{name}-run")).acquire().await;
            guard.map(|g| g.is_reentrant())
        })
        .await
        .unwrap();
    assert!(!nested.unwrap(), "a lock inside a leadership is its own");
    leadership.resign().await.unwrap();
}

/// The record is renewed with the lease: a leader with a 300 ms lease,
/// renewed by the watchdog, is still seen by observers and listed two
/// seconds on (its record would have expired with the first lease).
async fn a_renewed_leader_stays_visible_long_past_its_first_lease(
    clients: &[LockClient],
    test: &str,
) {
    let name = key(&format!("{test}-renewed"));
    let mut rx = clients[3].leader(&name).observe().await.unwrap();
    let leadership = clients[0]
        .leader(&name)
        .ttl(ms(300))
        .label("steady")
        .campaign()
        .await
        .unwrap();
    let seen = next_seen(&mut rx, "the leader").await.expect("a leader");
    assert_eq!(seen.term, leadership.term());
    tokio::time::sleep(secs(2)).await;
    assert!(!leadership.is_lost());
    assert!(!rx.has_changed().unwrap(), "{:?}", *rx.borrow());
    let listed = clients[3].leaders(&name, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].label, "steady");
    leadership.resign().await.unwrap();
    assert_eq!(next_seen(&mut rx, "nobody").await, None);
}

/// A candidate whose notices are refused (an ACL user without channels)
/// takes over by looking again, not by the hand-over notice: it confirms
/// the hand-over itself. It leads under the term observers see (the
/// record's, not the name's slot counter, which a lock of the same name
/// raised meanwhile), and stays listed for as long as it leads (the record
/// written with the hand-over's short lease is re-armed with its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_without_notices_leads_under_the_term_observers_see() {
    let server = RedisServer::start();
    let deaf = [
        "ACL",
        "SETUSER",
        "deaf",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "+@all",
    ];
    assert_eq!(server.cli(&deaf), "OK");
    let a = client(&LockClient::builder().redis(server.url())).await;
    let deaf_url = server.url().replacen("redis://", "redis://deaf:pw@", 1);
    let b = client(&LockClient::builder().redis(deaf_url)).await;
    let name = key("deaf-candidate");
    let first = a
        .leader(&name)
        .ttl(secs(1))
        .label("a")
        .campaign()
        .await
        .unwrap();
    let campaign = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            let request = b.leader(&name).ttl(secs(1)).label("b").wait(secs(10));
            request.campaign().await
        })
    };
    tokio::time::sleep(ms(300)).await; // in line
    first.resign().await.unwrap();
    // A lock of the same name counts its tokens with the election's terms.
    let lock = a.lock(&name).acquire().await.unwrap();
    let minted = lock.fencing_token().await.unwrap();
    lock.release().await.unwrap();
    let second = tokio::time::timeout(secs(5), campaign)
        .await
        .expect("the candidate without notices was not elected")
        .unwrap()
        .unwrap();
    let listed = a.leaders(&name, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].label.as_str(), listed[0].term),
        ("b", second.term()),
        "a lock's token in between: {minted}"
    );
    // Three leases on, it still leads and is still listed.
    tokio::time::sleep(secs(3)).await;
    assert!(!second.is_lost());
    let listed = a.leaders(&name, 10).await.unwrap();
    assert_eq!(
        listed.len(),
        1,
        "the leader vanished from the list: {listed:?}"
    );
    assert_eq!(listed[0].term, second.term());
    second.resign().await.unwrap();
}

/// A task that leads and campaigns again for the same name is told so: a
/// second `Leadership` would show another label than observers see, and its
/// resign would step nobody down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_inside_the_same_leadership_is_a_clear_error() {
    let client = memory_client().await;
    let name = key("nested-campaign");
    let inner = client.clone();
    let nested = client
        .leader(&name)
        .label("outer")
        .run(async move { inner.leader(&name).label("inner").campaign().await })
        .await
        .unwrap();
    let e = nested.unwrap_err();
    assert_eq!(
        e.config_reason(),
        Some(lock_runtime::ConfigReason::NestedCampaign),
        "{e}"
    );
}

/// Reads after the server closed the client's idle connections (a
/// `timeout` in its config, a proxy, `CLIENT KILL`) are answered: the first
/// command on a connection only then finds it broken, and a read is sent
/// again once, as an acquire is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_the_server_closed_idle_connections_are_answered() {
    let server = RedisServer::start();
    let (a, b) = (
        client(&LockClient::builder().redis(server.url())).await,
        client(&LockClient::builder().redis(server.url())).await,
    );
    let name = key("idle-reads");
    let leading = a.leader(&name).label("a").campaign().await.unwrap();
    for read in ["leaders", "observe", "inspect", "list"] {
        server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        match read {
            "leaders" => assert_eq!(b.leaders(&name, 10).await.unwrap().len(), 1),
            "observe" => {
                let rx = b.leader(&name).observe().await.unwrap();
                assert_eq!(rx.borrow().as_ref().map(|l| l.term), Some(leading.term()));
            }
            "inspect" => assert!(b.inspect(&name).await.unwrap().held),
            _ => assert!(b.list("", 10).await.unwrap().is_empty(), "no lock held"),
        }
    }
    leading.resign().await.unwrap();
}
