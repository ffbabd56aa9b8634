//! The `metrics` feature for leader election: `lock_leader{name}` is 1 while
//! this process leads `name` (also while another of its tasks campaigns),
//! and 0 after a resign and after a lost lease; `lock_leader_terms_total{name}`
//! counts terms won.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// What `lock_leader{name}` and `lock_leader_terms_total{name}` moved by
/// since the last call (the debugging recorder's snapshots take both
/// counters' and gauges' changes, resetting them); `None`: not reported.
fn values(snapshotter: &Snapshotter, name: &str) -> (Option<f64>, Option<f64>) {
    let snapshot = snapshotter.snapshot().into_vec();
    let value = |metric: &str| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let labelled = key.labels().any(|l| l.key() == "name" && l.value() == name);
            (key.name() == metric && labelled).then(|| match value {
                DebugValue::Gauge(v) => v.into_inner(),
                DebugValue::Counter(n) => *n as f64,
                other => panic!("unexpected {other:?}"),
            })
        })
    };
    (value("lock_leader"), value("lock_leader_terms_total"))
}

#[test]
fn the_leader_gauge_follows_the_leadership_and_terms_are_counted() {
    tests::recorded::on_memory_client(|client, snapshotter| async move {
        // The gauge's and the counter's values: sums of the changes.
        let (mut gauge, mut terms) = (0.0, 0.0);
        let mut seen = || {
            let (g, t) = values(&snapshotter, "sweeper");
            assert!(g.is_some(), "the gauge is reported");
            gauge += g.unwrap_or(0.0);
            terms += t.unwrap_or(0.0);
            (gauge, terms)
        };

        let leadership = client.leader("sweeper").campaign().await.unwrap();
        assert_eq!(seen(), (1.0, 1.0));
        // Another candidate of the same process, busy: still led here.
        let busy = client
            .leader("sweeper")
            .wait(std::time::Duration::ZERO)
            .campaign()
            .await;
        assert!(busy.unwrap_err().is_busy());
        assert_eq!(seen(), (1.0, 1.0));
        leadership.resign().await.unwrap();
        assert_eq!(seen(), (0.0, 1.0));

        let leadership = client
            .leader("sweeper")
            .ttl(std::time::Duration::from_millis(300))
            .campaign()
            .await
            .unwrap();
        assert_eq!(seen(), (1.0, 2.0), "one more term");
        lock_runtime::__private::testing::force_delete_leader(&client, "sweeper")
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(2), leadership.lost())
            .await
            .expect("lost at the next renewal");
        tokio::task::yield_now().await;
        assert_eq!(seen().0, 0.0, "0 once the lease is lost");
        drop(leadership);
    });
}

/// Elections named per tenant share the series of their `metrics_name`,
/// for the leader metrics as for the lock metrics of their campaigns: no
/// series is named after an election.
#[test]
fn elections_with_a_metrics_name_share_its_series() {
    tests::recorded::on_memory_client(|client, snapshotter| async move {
        let a = client
            .leader("scheduler:tenant-1")
            .metrics_name("scheduler")
            .campaign()
            .await
            .unwrap();
        let b = client
            .leader("scheduler:tenant-2")
            .metrics_name("scheduler")
            .campaign()
            .await
            .unwrap();
        let snapshot = snapshotter.snapshot().into_vec();
        let names: Vec<String> = snapshot
            .iter()
            .flat_map(|(key, _, _, _)| {
                key.key()
                    .labels()
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with("scheduler:")),
            "a series named after an election: {names:?}"
        );
        let gauge = snapshot.iter().find_map(|(key, _, _, value)| {
            (key.key().name() == "lock_leader").then(|| match value {
                DebugValue::Gauge(v) => v.into_inner(),
                other => panic!("unexpected {other:?}"),
            })
        });
        assert_eq!(gauge, Some(2.0), "two elections of the name led here");
        a.resign().await.unwrap();
        b.resign().await.unwrap();
    });
}
