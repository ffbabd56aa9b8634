//! Leader election across processes: this test binary runs itself three
//! times as a candidate (`candidate_process`, ignored unless run that way),
//! against one Redis and against a three-master Cluster. Exactly one leads;
//! killed with `SIGKILL` it is replaced within its lease plus a margin by a
//! candidate with a higher term; an observer on a fourth client (this
//! process) sees each leader; the last one resigns and the observer sees
//! `None`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_runtime::{Leader, LockClient, LockClientBuilder};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, Topology};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

/// What a candidate process is told: `redis <url>` or `cluster <url> <url> ..`.
const SERVERS: &str = "LEADER_TEST_SERVERS";
const NAME: &str = "LEADER_TEST_NAME";
const LABEL: &str = "LEADER_TEST_LABEL";

/// The candidates' lease.
const TTL: Duration = Duration::from_millis(1000);

/// A candidate, when run by `three_candidate_processes` (with the variables
/// above): campaigns, prints `LEADER <label> <term>` once elected, and
/// leads until killed, or until a line on its standard input tells it to
/// resign (then it prints `RESIGNED` and ends).
#[tokio::test]
#[ignore = "a child process of the tests below, not a test of its own"]
async fn candidate_process() {
    let servers = std::env::var(SERVERS).expect("run by the tests below");
    let mut words = servers.split(' ');
    let builder = match words.next() {
        Some("redis") => LockClient::builder().redis(words.next().unwrap()),
        _ => LockClient::builder().cluster(words.map(str::to_owned).collect::<Vec<_>>()),
    };
    let client = builder.build().await.expect("a client");
    let label = std::env::var(LABEL).unwrap();
    let leadership = client
        .leader(std::env::var(NAME).unwrap())
        .ttl(TTL)
        .label(&label)
        .campaign()
        .await
        .expect("elected");
    println!("LEADER {label} {}", leadership.term());
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
        .await
        .unwrap()
        .unwrap();
    leadership.resign().await.expect("resigned");
    println!("RESIGNED {label}");
}

struct Candidate {
    child: Child,
    label: String,
}

/// Starts candidate `i`; its output lines go to `lines` as `(i, line)`.
fn spawn_candidate(
    i: usize,
    servers: &str,
    name: &str,
    lines: mpsc::UnboundedSender<(usize, String)>,
) -> Candidate {
    let label = format!("process-{i}");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "candidate_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SERVERS, servers)
        .env(NAME, name)
        .env(LABEL, &label)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("a candidate process");
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            // The harness may have printed `test candidate_process ... `
            // on the same line.
            if let Some(at) = line.find("LEADER ").or_else(|| line.find("RESIGNED ")) {
                let _ = lines.send((i, line[at..].to_owned()));
            }
        }
    });
    Candidate { child, label }
}

/// The next `LEADER` line: (candidate, term), within `limit`.
async fn next_leader(
    lines: &mut mpsc::UnboundedReceiver<(usize, String)>,
    limit: Duration,
    what: &str,
) -> (usize, u64, Instant) {
    let (i, line) = within(limit, what, lines.recv()).await.expect("a line");
    let at = Instant::now();
    let term = line
        .strip_prefix("LEADER ")
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{what}: candidate {i} said {line:?}"));
    (i, term, at)
}

/// Waits until the observer shows `label` in `term`.
async fn observed(rx: &mut watch::Receiver<Option<Leader>>, label: &str, term: u64) {
    let want = |l: &Option<Leader>| {
        l.as_ref()
            .is_some_and(|l| l.label == label && l.term == term)
    };
    within(secs(5), "the observer sees the new leader", async {
        while !want(&rx.borrow_and_update()) {
            rx.changed().await.expect("the observer runs");
        }
    })
    .await;
}

async fn three_candidate_processes(builder: LockClientBuilder, servers: String) {
    let name = key("processes");
    let observer = client(&builder).await;
    let mut rx = observer.leader(&name).observe().await.unwrap();
    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut candidates: Vec<_> = (0..3)
        .map(|i| spawn_candidate(i, &servers, &name, tx.clone()))
        .collect();
    let (mut leader, mut term, _) = next_leader(&mut lines, secs(30), "a first leader").await;
    observed(&mut rx, &candidates[leader].label, term).await;
    // Exactly one: nobody else is elected while it lives.
    let quiet = tokio::time::timeout(TTL * 2, lines.recv()).await;
    assert!(
        quiet.is_err(),
        "a second leader while the first lives: {quiet:?}"
    );
    for round in 0..2 {
        candidates[leader].child.start_kill().unwrap(); // SIGKILL
        let killed = Instant::now();
        candidates[leader].child.wait().await.unwrap();
        let (next, next_term, at) =
            next_leader(&mut lines, secs(10), "a leader after the kill").await;
        let took = at.duration_since(killed);
        println!("round {round}: candidate {next} took over in {took:?}, term {next_term}");
        assert_ne!(next, leader);
        assert!(
            took < TTL + ms(700),
            "replaced {took:?} after the kill; lease {TTL:?}"
        );
        assert!(next_term > term, "terms rise: {term} then {next_term}");
        observed(&mut rx, &candidates[next].label, next_term).await;
        (leader, term) = (next, next_term);
    }
    // The last one resigns with nobody waiting: the observer sees nobody.
    let stdin = candidates[leader].child.stdin.as_mut().unwrap();
    stdin.write_all(b"resign\n").await.unwrap();
    stdin.flush().await.unwrap();
    let (_, line) = within(secs(5), "the resign", lines.recv()).await.unwrap();
    assert!(line.starts_with("RESIGNED"), "{line}");
    within(secs(5), "the observer sees nobody", async {
        while rx.borrow_and_update().is_some() {
            rx.changed().await.expect("the observer runs");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidate_processes_on_one_redis_one_leads_a_killed_leader_is_replaced() {
    let server = RedisServer::start();
    let builder = LockClient::builder().redis(server.url());
    three_candidate_processes(builder, format!("redis {}", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidate_processes_on_a_cluster_one_leads_a_killed_leader_is_replaced() {
    let (cluster, builder) = tokio::task::block_in_place(|| Cluster::start(3)).with_builder();
    let servers = format!("cluster {}", cluster.seed_urls().join(" "));
    three_candidate_processes(builder, servers).await;
    drop(cluster);
}
