//! A scheduler whose task ended with the tokio runtime it ran on (a client
//! built in one runtime and used in another) is restarted on the runtime in
//! use; the leases under watch stay where they are, in [`Scheduler`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Leases, Scheduler, Watchdog, run};
use crate::error::LockError;

impl Watchdog {
    /// `true` when the scheduler's task has ended (its runtime shut down).
    pub(crate) fn has_ended(&self) -> bool {
        !self.shared.running.load(Ordering::Acquire)
    }

    /// Restarts the scheduler on the runtime in use if its task has ended
    /// with the runtime it ran on (a client built in one runtime and used in
    /// another); nothing if it runs. The
    /// leases under watch are kept; renewals that were in flight are due at
    /// once. An error when there is no tokio runtime to restart it on.
    pub(crate) fn restart_if_ended(&self) -> Result<(), LockError> {
        if !self.has_ended() {
            return Ok(());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            crate::error::BackendError::new(
                "the lock client's watchdog ended with the tokio runtime it ran on, and this \
                 call runs outside a tokio runtime to restart it on: use the client from a \
                 tokio runtime",
            )
        })?;
        if self
            .shared
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(()); // restarted by another caller meanwhile
        }
        {
            let mut state = self.shared.state();
            let now = Instant::now();
            let Leases {
                entries, timers, ..
            } = &mut *state;
            for (id, entry) in entries.iter_mut().filter(|(_, e)| e.busy) {
                entry.busy = false;
                entry.due = now;
                timers.insert((now, *id));
            }
            state.sleeping_until = None;
        }
        runtime.spawn(run(
            self.backend.clone(),
            SchedulerAlive(self.shared.clone()),
        ));
        tracing::info!(
            "lock client: the watchdog ended with the tokio runtime it ran on; restarted on the \
             runtime in use"
        );
        Ok(())
    }
}

/// Clears [`Scheduler::running`] when the scheduler's future is dropped: it
/// returned, or its runtime shut down.
pub(super) struct SchedulerAlive(pub(super) Arc<Scheduler>);

impl Drop for SchedulerAlive {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}
