//! Support for `#[distributed_lock]`, and [`testing`] hooks for this
//! workspace's own tests. Not a stable API: only the attribute's expansion
//! and the workspace's tests may use it.
//!
//! For
//!
//! ```ignore
//! #[distributed_lock(key = "order:<order_id>", ttl = "30s", wait = "2s", client = self.locks)]
//! async fn pay(&self, order_id: u64) -> Result<Receipt, AppError> { body }
//! ```
//!
//! the attribute writes
//!
//! ```ignore
//! async fn pay(&self, order_id: u64) -> Result<Receipt, AppError> {
//!     let client = ::lock_runtime::__private::client(&(self.locks));
//!     let key = ::std::format!("order:{}", order_id);
//!     ::lock_runtime::__private::run(
//!         client,
//!         key,
//!         ::lock_runtime::__private::Options {
//!             kind: ::lock_runtime::__private::LockKind::Mutex,
//!             access: ::lock_runtime::__private::Access::Exclusive,
//!             lock: ::lock_runtime::__private::LockOptions::new()
//!                 .wait(2s).renew(true).hold_at_least(0s).ttl(30s)
//!                 .metrics_name("order:<order_id>"),
//!         },
//!         async move { body },
//!     )
//!     .await
//! }
//! ```
//!
//! (without `client = ...`, `client` is `None`: the global client; without
//! `ttl = ...`, no `.ttl(..)`: the client's default). `lock` is the
//! [`LockOptions`] value every request kind shares, written by its own
//! setters. `rw = "read"`, `rw = "write"` and `permits = 4` change only
//! `kind` and `access` (`LockKind::RwLock` with `Access::READ` or
//! `Access::Exclusive`, `LockKind::Semaphore` with `Access::Shared(4)`):
//! the kind type is the client's own, from `lock-keys`, which the attribute
//! reads too. `keys = ["account:<from>", "account:<to>"]` renders every key
//! into a `Vec<String>` and calls [`run_all`] instead, with
//! `kind: LockKind::Mutex`, `hold_at_least(0s)` and the templates joined by
//! `", "` as the metrics name.

use std::future::Future;
use std::sync::Arc;

pub use crate::client::LockOptions;
use crate::{client::LockClient, error::LockError};
pub use lock_keys::{Access, LockKind};

/// Options written in the attribute.
#[derive(Clone, Debug)]
pub struct Options {
    /// `rw = "..."`: [`LockKind::RwLock`]; `permits = n`:
    /// [`LockKind::Semaphore`]; neither: [`LockKind::Mutex`] (the attribute
    /// takes no other kind).
    pub kind: LockKind,
    /// `rw = "read"`: [`Access::READ`]; `permits = n`: [`Access::Shared`]`(n)`;
    /// else [`Access::Exclusive`].
    pub access: Access,
    /// `ttl`, `wait`, `renew`, `hold_at_least`, and the key template as
    /// the `name` label of the lock's metrics.
    pub lock: LockOptions,
}

/// What `client = <expr>` may be: a [`LockClient`] or anything that leads to
/// one (`&LockClient`, `Arc<LockClient>`, `Box<LockClient>`, references to those).
#[diagnostic::on_unimplemented(
    message = "`client = ...` in `#[distributed_lock]` must be a `LockClient`, a reference to one, or an `Arc`/`Box` of one; found `{Self}`",
    label = "not a `LockClient`"
)]
pub trait ClientHandle {
    /// A clone of the client (an `Arc` clone).
    fn lock_client(&self) -> LockClient;
}

impl ClientHandle for LockClient {
    fn lock_client(&self) -> LockClient {
        self.clone()
    }
}

impl<T: ClientHandle + ?Sized> ClientHandle for &T {
    fn lock_client(&self) -> LockClient {
        (**self).lock_client()
    }
}

impl<T: ClientHandle + ?Sized> ClientHandle for &mut T {
    fn lock_client(&self) -> LockClient {
        (**self).lock_client()
    }
}

impl<T: ClientHandle + ?Sized> ClientHandle for Arc<T> {
    fn lock_client(&self) -> LockClient {
        (**self).lock_client()
    }
}

impl<T: ClientHandle + ?Sized> ClientHandle for Box<T> {
    fn lock_client(&self) -> LockClient {
        (**self).lock_client()
    }
}

/// Evaluates `client = <expr>` before the body runs (the expansion passes
/// `&(expr)`, so `self.locks` is borrowed, not moved out of `self`).
pub fn client<C: ClientHandle + ?Sized>(client: &C) -> Option<LockClient> {
    Some(client.lock_client())
}

/// What an attributed function may return: `Result<T, E>` with
/// `E: From<LockError>`.
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` function must return `Result<T, E>` with `E: From<lock_runtime::LockError>`; found `{Self}`",
    label = "not a `Result`"
)]
pub trait LockResult {
    /// The error value for a lock failure.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// Runs `body` under the lock `key`, exactly like [`crate::LockRequest::run`]
/// (`client`: `None` for the global client), converting lock failures into the
/// function's error type.
pub async fn run<R, F>(client: Option<LockClient>, key: String, options: Options, body: F) -> R
where
    R: LockResult,
    F: Future<Output = R>,
{
    let Some(client) = client.or_else(crate::global_client) else {
        return R::from_lock_error(LockError::NoClient);
    };
    let request = match (options.kind, options.access) {
        (LockKind::Mutex, Access::Exclusive) => client.lock(key),
        (LockKind::RwLock, Access::READ) => client.rw_lock(key).read(),
        (LockKind::RwLock, Access::Exclusive) => client.rw_lock(key).write(),
        (LockKind::Semaphore, Access::Shared(permits)) => client.semaphore(key, permits),
        (kind, access) => {
            return R::from_lock_error(LockError::Config(format!(
                "the attribute takes a mutex, a read-write lock's side or a semaphore's \
                 permit, not a {} taken as {access:?}",
                kind.as_str()
            )));
        }
    };
    match request.options(options.lock).run(body).await {
        Ok(result) => result,
        Err(e) => R::from_lock_error(e),
    }
}

/// Runs `body` holding every lock in `keys` (all or none), exactly like
/// [`crate::LockAllRequest::run`], for `keys = [...]`; otherwise as [`run`].
///
/// The attribute refuses `rw` and `permits` with `keys` at compile time;
/// options that carry them anyway (a hand-written call) are
/// `LockError::Config`, and the body does not run. `hold_at_least` keeps
/// every key taken, as [`crate::LockAllRequest::hold_at_least`] does.
pub async fn run_all<R, F>(
    client: Option<LockClient>,
    keys: Vec<String>,
    options: Options,
    body: F,
) -> R
where
    R: LockResult,
    F: Future<Output = R>,
{
    if options.kind != LockKind::Mutex || options.access != Access::Exclusive {
        return R::from_lock_error(LockError::Config(
            "`keys = [...]` takes plain locks: no `rw` or `permits`".into(),
        ));
    }
    let Some(client) = client.or_else(crate::global_client) else {
        return R::from_lock_error(LockError::NoClient);
    };
    // Templates that render the same key (`transfer(1, 1)` with
    // `["account:<from>", "account:<to>"]`) name one lock, taken once.
    let mut keys = keys;
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.retain(|key| seen.insert(key.clone()));
    match client.lock_all(keys).options(options.lock).run(body).await {
        Ok(result) => result,
        Err(e) => R::from_lock_error(e),
    }
}

/// A placeholder value in a key, rendered with `Display` and escaped as by
/// [`crate::escape_key_part`].
pub struct KeyPart<'a>(&'a dyn std::fmt::Display);

impl std::fmt::Debug for KeyPart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyPart").field(&self.0.to_string()).finish()
    }
}

/// Wraps a placeholder value; the bound makes a value that is not `Display` an
/// error at the key template.
pub fn key_part<T: std::fmt::Display>(value: &T) -> KeyPart<'_> {
    KeyPart(value)
}

impl std::fmt::Display for KeyPart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct Escaping<'a, 'b>(&'a mut std::fmt::Formatter<'b>);
        impl std::fmt::Write for Escaping<'_, '_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                crate::key::push_escaped(self.0, s);
                Ok(())
            }
        }
        std::fmt::Write::write_fmt(&mut Escaping(f), format_args!("{}", self.0))
    }
}

/// Hooks for the workspace's tests and fault suite (not a stable API).
#[path = "private_testing.rs"]
pub mod testing;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn key_parts_are_escaped() {
        assert_eq!(key_part(&"a:{b}%").to_string(), "a%3A%7Bb%7D%25");
        assert_eq!(format!("x:{}", key_part(&42)), "x:42");
    }

    #[derive(Debug)]
    enum AppError {
        Lock(LockError),
        Own,
    }

    impl From<LockError> for AppError {
        fn from(e: LockError) -> Self {
            Self::Lock(e)
        }
    }

    /// What `#[distributed_lock(key = "k")]` writes.
    fn try_once() -> Options {
        with(MUTEX, LockOptions::new())
    }

    const MUTEX: (LockKind, Access) = (LockKind::Mutex, Access::Exclusive);
    const READ: (LockKind, Access) = (LockKind::RwLock, Access::READ);
    const WRITE: (LockKind, Access) = (LockKind::RwLock, Access::Exclusive);
    const fn permits(n: u32) -> (LockKind, Access) {
        (LockKind::Semaphore, Access::Shared(n))
    }

    fn with((kind, access): (LockKind, Access), lock: LockOptions) -> Options {
        Options {
            kind,
            access,
            lock: lock.metrics_name("k"),
        }
    }

    async fn memory() -> LockClient {
        LockClient::builder().memory().build().await.unwrap()
    }

    #[tokio::test]
    async fn every_client_form_leads_to_the_same_client() {
        let c = memory().await;
        let arc = Arc::new(c.clone());
        let boxed: Box<LockClient> = Box::new(c.clone());
        let mut owned = c.clone();
        for handle in [
            client(&c),
            client(&&c),
            client(&arc),
            client(&&arc),
            client(&boxed),
            client(&&mut owned),
        ] {
            assert!(Arc::ptr_eq(&handle.unwrap().0, &c.0));
        }
    }

    #[tokio::test]
    async fn the_body_runs_under_the_lock_and_keeps_its_own_errors() {
        let c = memory().await;
        let out: Result<u64, AppError> = run(Some(c.clone()), "k".into(), try_once(), async {
            let info = crate::current_lock().expect("inside the lock");
            assert_eq!(info.key, "k");
            Ok(info.fencing_token().await.unwrap())
        })
        .await;
        assert_eq!(out.unwrap(), 1);
        let out: Result<(), AppError> = run(Some(c.clone()), "k".into(), try_once(), async {
            Err(AppError::Own)
        })
        .await;
        assert!(matches!(out, Err(AppError::Own)));
        // Both guards were released: their watchdogs stop (asynchronously).
        tokio::time::timeout(Duration::from_secs(2), async {
            while c.renewed_leases() != 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("every watchdog stops after release");
    }

    #[tokio::test]
    async fn lock_failures_convert_into_the_error_type() {
        let c = memory().await;
        let _held = c.lock("k").acquire().await.unwrap();
        let out: Result<(), AppError> =
            run(Some(c.clone()), "k".into(), try_once(), async { Ok(()) }).await;
        assert!(matches!(out, Err(AppError::Lock(e)) if e.is_busy()));
        let options = with(MUTEX, LockOptions::new().ttl(Duration::from_millis(1)));
        let out: Result<(), LockError> = run(Some(c), "other".into(), options, async {
            unreachable!("a refused ttl never runs the body")
        })
        .await;
        assert!(out.unwrap_err().is_config());
    }

    #[tokio::test]
    async fn run_all_refuses_what_the_attribute_refuses() {
        let c = memory().await;
        for options in [
            with(READ, LockOptions::new()),
            with(permits(2), LockOptions::new()),
        ] {
            let shown = format!("{options:?}");
            let out: Result<(), LockError> = run_all(
                Some(c.clone()),
                vec!["a".into(), "b".into()],
                options,
                async { unreachable!("refused options never run the body") },
            )
            .await;
            assert!(out.unwrap_err().is_config(), "{shown}");
        }
    }

    #[tokio::test]
    async fn run_refuses_what_the_attribute_never_writes() {
        let c = memory().await;
        for options in [
            with((LockKind::Leader, Access::Exclusive), LockOptions::new()),
            with((LockKind::Mutex, Access::READ), LockOptions::new()),
            with((LockKind::Semaphore, Access::Exclusive), LockOptions::new()),
        ] {
            let shown = format!("{options:?}");
            let out: Result<(), LockError> = run(Some(c.clone()), "k".into(), options, async {
                unreachable!("refused options never run the body")
            })
            .await;
            assert!(out.unwrap_err().is_config(), "{shown}");
        }
    }

    #[tokio::test]
    async fn without_a_client_every_kind_is_no_client() {
        // No global client in this test binary's other tests either.
        if crate::global_client().is_some() {
            return;
        }
        for kind in [MUTEX, READ, WRITE, permits(3)] {
            let out: Result<(), LockError> =
                run(None, "k".into(), with(kind, LockOptions::new()), async {
                    unreachable!()
                })
                .await;
            assert!(matches!(out, Err(LockError::NoClient)), "{kind:?}");
        }
        let out: Result<(), LockError> =
            run_all(None, vec!["k".into()], try_once(), async { unreachable!() }).await;
        assert!(matches!(out, Err(LockError::NoClient)));
    }

    #[tokio::test]
    async fn options_reach_the_request() {
        let c = memory().await;
        let held = c.lock("k").acquire().await.unwrap();
        let waiting = with(
            MUTEX,
            LockOptions::new()
                .ttl(Duration::from_millis(200))
                .wait(Duration::from_secs(5))
                .renew(false),
        );
        let c2 = c.clone();
        let task = tokio::spawn(async move {
            run(Some(c2), "k".into(), waiting, async {
                // renew = false and ttl = 200ms: the lease runs out under us.
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, LockError>(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .expect("the fixed lease ends the body")
            .unwrap();
        assert!(out.unwrap_err().is_lost());
    }
}
