//! The process-wide client used by `#[distributed_lock]` without `client = ...`.

use std::sync::RwLock;

use crate::client::LockClient;

static GLOBAL: RwLock<Option<LockClient>> = RwLock::new(None);

/// Installs the client that `#[distributed_lock]` uses when no `client = ...` is
/// given. Call it once at startup; a later call replaces the client (functions
/// already running keep the one they started with).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let client = lock_runtime::LockClient::builder().memory().build().await?;
/// lock_runtime::set_global_client(client.clone());
/// assert!(lock_runtime::global_client().is_some());
/// # Ok(())
/// # }
/// ```
pub fn set_global_client(client: LockClient) {
    *GLOBAL.write().unwrap_or_else(|e| e.into_inner()) = Some(client);
}

/// The client installed by [`set_global_client`], if any.
pub fn global_client() -> Option<LockClient> {
    GLOBAL.read().unwrap_or_else(|e| e.into_inner()).clone()
}
