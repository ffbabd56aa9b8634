//! Running a scenario under a `metrics` recorder of its own.

use std::future::Future;

use lock_runtime::LockClient;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// Runs `body` with an embedded-backend client, on a current-thread runtime
/// of its own, under a debugging recorder of its own; `body` gets the
/// recorder's snapshotter to read what was reported so far, and so does the
/// caller afterwards.
pub fn on_memory_client<F: Future<Output = ()>>(
    body: impl FnOnce(LockClient, Snapshotter) -> F,
) -> Snapshotter {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let client = LockClient::builder()
                .memory()
                .build()
                .await
                .expect("an embedded-backend client");
            body(client, snapshotter.clone()).await;
        });
    });
    snapshotter
}
