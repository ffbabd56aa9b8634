//! The lines of a client, locked: [`Keys`], which keeps the flag that
//! says whether any line exists true to them.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Line;

/// The locked lines, which say whether any is left as they are let go
/// (`Local`'s `any`).
pub(super) struct Keys<'a> {
    pub(super) map: MutexGuard<'a, HashMap<String, Line>>,
    pub(super) any: &'a AtomicBool,
}

impl Deref for Keys<'_> {
    type Target = HashMap<String, Line>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for Keys<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl Drop for Keys<'_> {
    // Before the lock is let go (the guard is dropped after this).
    fn drop(&mut self) {
        self.any.store(!self.map.is_empty(), Ordering::Release);
    }
}
