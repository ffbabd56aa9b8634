//! Who is waiting for which key: the wake-up side of "waiting without polling".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One entry per notice channel that somebody in this process waits on.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) notify: Notify,
}

/// Channel name -> slot. Shared by a backend and its waiters.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Registry {
    /// The slot for `channel`, created if missing.
    pub(crate) fn slot(&self, channel: &str) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(channel) {
            return slot.clone();
        }
        let slot = Arc::new(Slot::default());
        slots.insert(channel.to_owned(), slot.clone());
        slot
    }

    /// Wakes every waiter of `channel`, if any.
    pub(crate) fn wake(&self, channel: &str) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(channel) {
            slot.notify.notify_waiters();
        }
    }

    /// Wakes every waiter of every channel (after notices may have been missed).
    pub(crate) fn wake_all(&self) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for slot in slots.values() {
            slot.notify.notify_waiters();
        }
    }

    /// Drops `channel`'s slot if `slot` is the last handle outside the registry.
    pub(crate) fn forget_if_unused(&self, channel: &str, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        // One reference is the registry's, one the caller's.
        if Arc::strong_count(slot) <= 2 {
            if let Some(current) = slots.get(channel) {
                if Arc::ptr_eq(current, slot) {
                    slots.remove(channel);
                }
            }
        }
    }

    /// Removes and returns the channels nobody outside the registry refers to.
    pub(crate) fn take_unused(&self) -> Vec<String> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let unused: Vec<String> = slots
            .iter()
            .filter(|(_, slot)| Arc::strong_count(slot) == 1)
            .map(|(channel, _)| channel.clone())
            .collect();
        for channel in &unused {
            slots.remove(channel);
        }
        unused
    }

    /// The channels currently waited on.
    pub(crate) fn channels(&self) -> Vec<String> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.keys().cloned().collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }
}

/// A waiter's handle on the wake-ups for one key.
pub(crate) struct Subscription {
    pub(crate) slot: Arc<Slot>,
    /// Set for backends that drop unused slots eagerly (the embedded one).
    pub(crate) cleanup: Option<(Arc<Registry>, String)>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some((registry, channel)) = &self.cleanup {
            registry.forget_if_unused(channel, &self.slot);
        }
    }
}
