//! The client registry: one entry per client, `prefix + C{id}`, holding its
//! label (`LockClientBuilder::label`) with a lease of its own, which the
//! client renews while it lives. Tokens carry the client's id, so `inspect`
//! names holders and waiters with one read per distinct client and no cost
//! per acquire.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::timeout;

use super::Backend;
use super::redis::RedisBackend;
use crate::error::{BackendError, LockError};

/// How long a registry entry outlives its client's last renewal.
pub(crate) const REGISTRY_LEASE: Duration = Duration::from_secs(60);

/// How often a living client renews its entry.
pub(crate) const REGISTRY_RENEWAL: Duration = Duration::from_secs(20);

/// The longest label, in bytes: a client's
/// ([`LockClientBuilder::label`](crate::LockClientBuilder::label)) or a
/// leader's ([`LeaderRequest::label`](crate::LeaderRequest::label)).
pub const MAX_LABEL_LEN: usize = 128;

/// The registry entry of client `id`.
pub(crate) fn registry_name(prefix: &str, id: &str) -> String {
    format!("{prefix}C{{{id}}}")
}

impl Backend {
    /// Writes (or renews) the entry of client `id`. On Redlock, on every
    /// node that answers; an error when none did.
    pub(crate) async fn register_label(
        &self,
        prefix: &str,
        id: &str,
        label: &str,
    ) -> Result<(), LockError> {
        let name = registry_name(prefix, id);
        match self {
            Backend::Redis(b) => write(b, &name, label).await,
            Backend::Redlock(b) => {
                let per_node = b.node_timeout();
                let wrote = join_all(
                    b.nodes()
                        .iter()
                        .map(|node| timeout(per_node, write(node, &name, label))),
                )
                .await
                .into_iter()
                .filter(|answer| matches!(answer, Ok(Ok(()))))
                .count();
                if wrote == 0 {
                    return Err(BackendError::new("no Redlock node took the client's label").into());
                }
                Ok(())
            }
            // One client per embedded backend: it knows its own label.
            Backend::Memory(_) => Ok(()),
        }
    }

    /// The labels of the clients `ids` that have a live entry (the others
    /// are left out: their client is gone, or never registered).
    pub(crate) async fn labels_of(
        &self,
        prefix: &str,
        ids: &[&str],
    ) -> Result<HashMap<String, String>, LockError> {
        let mut found = HashMap::new();
        let nodes: Vec<&RedisBackend> = match self {
            Backend::Redis(b) => vec![b],
            Backend::Redlock(b) => b.nodes().iter().map(|n| &**n).collect(),
            Backend::Memory(_) => return Ok(found),
        };
        for node in nodes {
            let missing: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| !found.contains_key(*id))
                .collect();
            if missing.is_empty() {
                break;
            }
            // One GET per id: on a cluster the entries live in other slots.
            let answers = join_all(missing.iter().map(|id| async move {
                let mut conn = node.connection();
                let label: redis::RedisResult<Option<String>> = redis::cmd("GET")
                    .arg(registry_name(prefix, id))
                    .query_async(&mut conn)
                    .await;
                (*id, label)
            }))
            .await;
            for (id, label) in answers {
                match label {
                    Ok(Some(label)) => {
                        found.insert(id.to_owned(), label);
                    }
                    Ok(None) => {}
                    // On Redlock another node may answer.
                    Err(_) if matches!(self, Backend::Redlock(_)) => {}
                    Err(e) => {
                        return Err(BackendError::with_source(
                            "cannot read the clients' labels",
                            e,
                        )
                        .into());
                    }
                }
            }
        }
        Ok(found)
    }
}

async fn write(node: &RedisBackend, name: &str, label: &str) -> Result<(), LockError> {
    redis::cmd("SET")
        .arg(name)
        .arg(label)
        .arg("PX")
        .arg(REGISTRY_LEASE.as_millis() as u64)
        .exec_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("cannot register the client's label", e).into())
}

/// Checks a client's label: see [`validate`].
pub(crate) fn validate_label(label: &str) -> Result<(), LockError> {
    validate("client label", label)
}

/// Checks `what` (a client's or a leader's label): 1 to [`MAX_LABEL_LEN`]
/// bytes, no control characters (labels are printed by `lockctl` and in
/// logs). A label is shown to anybody who can read the lock keys: never a
/// secret.
pub(crate) fn validate(what: &str, label: &str) -> Result<(), LockError> {
    if label.is_empty() || label.len() > MAX_LABEL_LEN {
        return Err(LockError::Config(format!(
            "the {what} is {} bytes long; it must have 1 to {MAX_LABEL_LEN}",
            label.len()
        )));
    }
    if let Some(c) = label.chars().find(|c| c.is_control()) {
        return Err(LockError::Config(format!(
            "the {what} may not contain control characters (found {c:?})"
        )));
    }
    Ok(())
}

/// `hostname:pid`: the label of a client that sets none.
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    let label = format!("{host}:{}", std::process::id());
    // A host name is short and printable; if not, keep what is.
    let label: String = label.chars().filter(|c| !c.is_control()).collect();
    match label.char_indices().nth(MAX_LABEL_LEN / 4) {
        Some((cut, _)) if label.len() > MAX_LABEL_LEN => label[..cut].to_owned(),
        _ => label,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_checked_and_the_default_is_host_and_pid() {
        assert!(validate_label("pod-a").is_ok());
        for bad in ["", "a\nb", "\u{7}", &"x".repeat(MAX_LABEL_LEN + 1)] {
            let err = validate_label(bad).unwrap_err();
            assert!(err.to_string().contains("label"), "{err}");
        }
        let label = default_label();
        assert!(validate_label(&label).is_ok(), "{label:?}");
        assert!(
            label.ends_with(&format!(":{}", std::process::id())),
            "{label}"
        );
    }
}
