use std::time::{Duration, Instant};
use lock_runtime::LockClient;
use tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let server = RedisServer::start();
    let c = LockClient::builder().redis(server.url()).build().await.unwrap();
    let g = c.lock("k").ttl(Duration::from_millis(300)).acquire().await.unwrap();
    assert_eq!(g.fencing_token(), 1);
    assert!(c.lock("k").acquire().await.unwrap_err().is_busy());
    let c2 = c.clone();
    let t = tokio::spawn(async move {
        let s = Instant::now();
        let g = c2.lock("k").wait(Duration::from_secs(5)).acquire().await.unwrap();
        (s.elapsed(), g.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!g.is_lost());
    let r = Instant::now();
    g.release().await.unwrap();
    let (waited, fence) = t.await.unwrap();
    println!("waited {waited:?}, handoff {:?}, fence {fence}", r.elapsed());
    assert_eq!(fence, 2);
    println!("watchdogs {}", c.active_watchdogs());
}
