//! [`Commit`]: the handler's writes and the completed record in one commit,
//! so a request is exactly once across crashes.
//!
//! Without it, a handler's effect (an order inserted) and the layer's
//! completion of the record (in Redis, after the handler returned) are two
//! commits. A process killed between them (`SIGKILL`, the OOM killer, a lost
//! node) leaves the effect with no completed record: the claim's lease runs
//! out and the client's retry runs the handler again. That is the weaker
//! guarantee, **exactly once while the process lives, at least once across a
//! crash**, and what a handler gets when it does not use this module.
//!
//! With a commit store on the layer
//! (`commit_with_postgres`, feature `postgres`;
//! [`commit_with_redis`](super::IdempotencyLayer::commit_with_redis)), a
//! claimed request carries a [`Commit`] (an extractor). The handler makes
//! its response, then commits it with its writes:
//!
//! * **PostgreSQL** (`Commit::postgres`, feature `postgres`): the completed record (status,
//!   kept headers, body, fingerprint, expiry) is a row of
//!   `lock_idempotency` (`POSTGRES_SCHEMA`) inserted in the handler's own
//!   transaction, which the call then commits: the row and the handler's
//!   writes commit together or not at all.
//! * **Redis** ([`Commit::redis`]): the handler's write commands and the
//!   completed record (a hash beside the layer's record) go out as one script
//!   call, as [`fence::redis`](crate::fence::redis) sends its commands: one
//!   atomic step.
//! * **The lock server**
//!   ([`commit_on_lock_server`](super::IdempotencyLayer::commit_on_lock_server),
//!   where the handler's data lives on the server of its locks):
//!   [`Commit::redis`] runs the commands and completes the layer's record
//!   itself in one script call. The record is the committed copy: nothing
//!   is written beside it, the layer does not look before the handler runs
//!   (a claim that finds the record completed replays it, as always), and
//!   no completion follows the commit.
//!
//! Before a claimed request runs, the layer looks in a separate store: a committed
//! record is replayed (and copied into the layer's record, so later
//! duplicates get it without looking), no record means nothing committed
//! and the handler runs. So a process killed at any moment leaves either
//! nothing (the retry runs the work once the claim's lease ends) or both the
//! effect and its record (the retry is replayed): **exactly once across
//! crashes**, on the one condition that the handler's writes go through the
//! [`Commit`]. The claim still makes concurrent duplicates wait (`409`, or
//! [`wait`](super::IdempotencyLayer::wait)); it no longer decides whether the
//! work happened. Two claimers that both ran (the first was paused past its
//! lease) cannot both commit: the second finds the first's record in the
//! same step, writes nothing, and answers with the first's response.
//!
//! A commit that fails, or whose outcome is unknown (the connection dropped
//! during `COMMIT`), releases the claim instead of storing the handler's
//! error response: the retry looks in the store again and replays what
//! committed, or runs the work if nothing did. So does a `5xx` the handler
//! answers before committing (its own write failed: a lock timeout, a
//! deadlock, a pool exhausted), whatever
//! [`store_server_errors`](super::IdempotencyLayer::store_server_errors) says.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # mod example {
//! use axum::http::{StatusCode, header};
//! use axum::response::{IntoResponse, Response};
//! use axum::extract::State;
//! use lock_runtime::layer::idempotency::Commit;
//!
//! async fn create_order(
//!     State(pool): State<sqlx::PgPool>,
//!     commit: Commit,
//!     item: String,
//! ) -> Result<Response, StatusCode> {
//!     let failed = |_| StatusCode::SERVICE_UNAVAILABLE;
//!     let mut tx = pool.begin().await.map_err(failed)?;
//!     let id: i64 = sqlx::query_scalar("INSERT INTO orders (item) VALUES ($1) RETURNING id")
//!         .bind(&item)
//!         .fetch_one(&mut *tx)
//!         .await
//!         .map_err(failed)?;
//!     let response = (StatusCode::CREATED, [(header::LOCATION, format!("/orders/{id}"))]);
//!     // The order and its record commit together.
//!     commit.postgres(tx, response).await.map_err(|_| StatusCode::SERVICE_UNAVAILABLE)
//! }
//! # }
//! ```
//!
//! The order service (`examples/src/bin/order-service.rs`) does the same on
//! PostgreSQL and on Redis.

#[cfg(feature = "postgres")]
mod postgres;
mod redis;

use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

pub use self::redis::RedisCommit;
pub use crate::backend::records::committed::COMMITTED_SUFFIX;
#[cfg(feature = "postgres")]
pub use crate::backend::records::postgres::{POSTGRES_SCHEMA, prune_postgres};

use super::body::{Buffered, buffer};
use super::layer::Config;
use super::stored::{Rebuilt, encode_headers};
use crate::backend::records::CommitOutcome as Outcome;
use crate::backend::records::CommitStore;
use crate::backend::records::{Ours, StoredResponse};
use crate::client::LockClient;
use crate::error::LockError;
use crate::layer::problem::problem;
use crate::records::RecordGuard;

/// What became of a request's [`Commit`], read by the layer once the handler
/// returned.
#[derive(Debug, Default)]
pub(super) enum CommitState {
    /// Not used: the layer stores the handler's response as without a store.
    #[default]
    Unused,
    /// Committed with the handler's writes: the layer's record gets this.
    Committed(StoredResponse),
    /// Committed in the layer's record itself, on the lock server, which
    /// holds this response (or another claimer's, committed first): nothing
    /// left to complete.
    Completed,
    /// Tried, and it failed or its outcome is unknown: the claim is released
    /// and a retry looks in the store again.
    Failed,
}

/// The means to commit a handler's writes and its idempotency record
/// together: an extractor, on a route behind an
/// [`IdempotencyLayer`](super::IdempotencyLayer) given a commit store. See
/// the [module docs](self).
///
/// Rejects with `500` where there is none (no store on the layer, or a
/// request without an `Idempotency-Key` where the key is optional, or a
/// layer that [failed open](super::IdempotencyLayer::fail_open)); take
/// `Option<Commit>` where that is expected.
#[derive(Clone)]
pub struct Commit(Arc<CommitShared>);

pub(super) struct CommitShared {
    pub(super) config: Arc<Config>,
    pub(super) store: CommitStore,
    /// The claim, where the record itself is committed on the lock server.
    pub(super) claim: Option<(LockClient, Ours)>,
    /// The layer's record name: the committed record's name in the store.
    pub(super) record: String,
    pub(super) fingerprint: String,
    pub(super) state: Mutex<CommitState>,
}

impl fmt::Debug for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Commit")
            .field("record", &self.0.record)
            .field("store", &self.0.store)
            .finish_non_exhaustive()
    }
}

impl Commit {
    pub(super) fn new(
        config: Arc<Config>,
        store: CommitStore,
        record: &RecordGuard,
        fingerprint: String,
    ) -> Self {
        let claim = matches!(store, CommitStore::LockServer).then(|| record.claim());
        let record = record.record().to_owned();
        Commit(Arc::new(CommitShared {
            config,
            store,
            claim,
            record,
            fingerprint,
            state: Mutex::new(CommitState::Unused),
        }))
    }

    /// What the handler did with it (the layer takes it once).
    pub(super) fn take_state(&self) -> CommitState {
        std::mem::take(&mut *lock(&self.0.state))
    }

    fn set_state(&self, state: CommitState) {
        *lock(&self.0.state) = state;
    }

    /// The record's name in the store (for logs and tests).
    pub fn record(&self) -> &str {
        &self.0.record
    }

    /// Reads `response` as the layer stores it (status, kept headers, the
    /// body up to the storage limit), and gives back the response to send.
    async fn prepare(&self, response: impl IntoResponse) -> Result<Prepared, LockError> {
        let (head, body) = response.into_response().into_parts();
        let limit = self.0.config.max_response_body;
        let buffered = buffer(body, limit).await.map_err(|e| {
            LockError::Config(format!(
                "the response to commit could not be read, so nothing was committed: {e}"
            ))
        })?;
        let (stored_body, body_too_large, rebuilt) = match buffered {
            Buffered::Complete { data, trailers } => (
                data.clone(),
                false,
                axum::body::Body::new(Rebuilt::<std::pin::Pin<Box<axum::body::Body>>>::new(
                    data, trailers, None,
                )),
            ),
            Buffered::Partial { data, rest } => (
                bytes::Bytes::new(),
                true,
                axum::body::Body::new(Rebuilt::new(data, None, Some(rest))),
            ),
        };
        let stored = StoredResponse {
            status: head.status.as_u16(),
            headers: encode_headers(&head.headers, &self.0.config.stored_headers),
            body: stored_body,
            body_too_large,
        };
        Ok(Prepared {
            stored,
            response: Response::from_parts(head, rebuilt),
        })
    }

    /// Marks the commit's outcome and passes `result` on.
    fn settle(
        &self,
        result: Result<Outcome, LockError>,
        response: Response,
    ) -> Result<Response, LockError> {
        match result {
            Ok(Outcome::Committed(stored)) => {
                self.set_state(CommitState::Committed(stored));
                Ok(response)
            }
            Ok(Outcome::Completed) => {
                self.set_state(CommitState::Completed);
                Ok(response)
            }
            Ok(Outcome::Found(found)) => {
                // Another claimer of this record committed first (ours was
                // paused past its lease): nothing of ours was written; its
                // response is the request's.
                if found.fingerprint != self.0.fingerprint {
                    self.set_state(CommitState::Failed);
                    return Err(LockError::Config(format!(
                        "record `{}` was committed for another request",
                        self.0.record
                    )));
                }
                tracing::warn!(record = %self.0.record,
                    "idempotency: another claimer committed this record first; nothing of ours \
                     was committed, its response is replayed");
                let replayed = super::stored::replay(found.stored.clone());
                self.set_state(match self.0.claim {
                    // The record holds it already.
                    Some(_) => CommitState::Completed,
                    None => CommitState::Committed(found.stored),
                });
                Ok(replayed)
            }
            Err(e) => {
                self.set_state(CommitState::Failed);
                Err(e)
            }
        }
    }
}

/// A response read for storage, and the same response to send.
struct Prepared {
    stored: StoredResponse,
    response: Response,
}

fn lock(state: &Mutex<CommitState>) -> std::sync::MutexGuard<'_, CommitState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: Send + Sync> FromRequestParts<S> for Commit {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Commit>().cloned().ok_or_else(|| {
            tracing::error!(
                path = %parts.uri.path(),
                "`Commit` extracted on a request no IdempotencyLayer with a commit store claimed"
            );
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "this route commits an idempotency record that no IdempotencyLayer claimed",
            )
            .into_response()
        })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Commit {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Commit>().cloned())
    }
}
