//! Keeping the client's registry entry (its label, see
//! `backend::labels`) alive while the client lives.

use std::sync::{Arc, Weak};

use crate::backend::labels::REGISTRY_RENEWAL;
use crate::client::inner::{Inner, Registration};

/// Writes the client's entry, and starts the task that renews it. A failed
/// write is a warning, not an error: labels are for operators, and the
/// locks work without them (the task tries again).
pub(crate) async fn register(inner: &Arc<Inner>) {
    if matches!(inner.backend, crate::backend::Backend::Memory(_)) {
        // The embedded backend has one client, which knows its own label.
        return;
    }
    renew(inner).await;
    start(inner, Arc::downgrade(inner));
}

/// Starts the task again if it ended with the runtime it ran on.
pub(crate) fn restart_if_ended(inner: &Inner) {
    let client = match &*lock(inner) {
        Some(r) if r.task.is_finished() => r.client.clone(),
        _ => return,
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        start(inner, client);
    }
}

fn start(inner: &Inner, client: Weak<Inner>) {
    let weak = client.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(REGISTRY_RENEWAL).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            renew(&inner).await;
        }
    });
    *lock(inner) = Some(Registration { task, client });
}

async fn renew(inner: &Inner) {
    let id = inner.salt.client_id();
    if let Err(e) = inner
        .backend
        .register_label(&inner.prefix, id, &inner.label)
        .await
    {
        tracing::warn!(error = %e, label = %inner.label, "cannot register the client's label");
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, Option<Registration>> {
    inner.registration.lock().unwrap_or_else(|e| e.into_inner())
}
