//! What the lock scripts answer, and how traces name clients: shared by the
//! lock model and the read-write lock and semaphore server.

/// What the acquire script answers.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AcqReply {
    /// `> 0`: ours, with this fencing token.
    Granted(u8),
    /// `<= 0`: held by another owner for `remaining` more ticks; a waiting
    /// attempt gets `{-remaining, counter}` (acquire.lua's busy path), a try-once
    /// attempt `-remaining` (`fence` 0, as `RedisBackend::acquire` reads it).
    Busy {
        /// The holder's remaining lease.
        remaining: u8,
        /// The slot counter when the script ran (`0` for try-once).
        fence: u8,
    },
}

/// Client names in traces.
pub fn name(c: u8) -> char {
    (b'A' + c) as char
}
