//! The fencing tokens a line hands on: blocks reserved by `reserve.lua`,
//! one in use and one reserved ahead ([`Blocks`]).

use std::time::Duration;

use tokio::time::Instant;

/// Fencing tokens reserved per round trip: local hand-overs between two
/// checks that nobody waits on the server.
pub(crate) const BLOCK: u64 = 8;

/// How long a reserved block may be used: bounds what a waiter on the server
/// waits for a chain of local hand-overs with long holds.
pub(crate) const BLOCK_FOR: Duration = Duration::from_millis(5);

/// The reserved tokens of one line's lease.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    /// In use: `next..=top`, usable until `until`.
    current: Option<(u64, u64, Instant)>,
    /// The block after it, reserved ahead (top, send time of its request),
    /// so a chain does not stop for a round trip when a block runs out.
    ahead: Option<(u64, Instant)>,
    /// A reservation ahead is in flight.
    reserving: bool,
    /// The highest fencing token handed on: a block reserved ahead is only
    /// used if it lies above (one reserved ahead may arrive after a later
    /// block a holder reserved itself, and be lower).
    issued: u64,
}

impl Blocks {
    /// Forgets the blocks (a new lease: they were reserved under another).
    pub(crate) fn clear(&mut self) {
        self.current = None;
        self.ahead = None;
    }

    /// The next token, if a block is left and still fresh; and whether to
    /// reserve the next block in the background now (half of the tokens or
    /// of the time of this one used, and none kept or in flight).
    pub(crate) fn take(&mut self) -> Option<(u64, bool)> {
        let now = Instant::now();
        let usable = |b: &(u64, u64, Instant)| b.0 <= b.1 && now < b.2;
        if !self.current.as_ref().is_some_and(usable) {
            // The block reserved ahead, if it is still fresh and above
            // every token handed on so far.
            let issued = self.issued;
            self.current = self
                .ahead
                .take()
                .map(|(top, reserved)| (top + 1 - BLOCK, top, reserved + BLOCK_FOR))
                .filter(|b| usable(b) && b.0 > issued);
        }
        let (next, top, until) = self.current.as_mut()?;
        let token = *next;
        *next += 1;
        let running_out = *top + 1 - *next <= BLOCK / 2 || *until <= now + BLOCK_FOR / 2;
        self.issued = token;
        let reserve = running_out && self.ahead.is_none() && !self.reserving;
        if reserve {
            self.reserving = true;
        }
        Some((token, reserve))
    }

    /// Uses the block up to `top`, reserved by a request sent at `reserved`,
    /// and returns its first token: that one is used however long the
    /// reservation took (see `handover::hand_on`).
    pub(crate) fn set(&mut self, top: u64, reserved: Instant) -> u64 {
        let first = top + 1 - BLOCK;
        self.current = Some((first + 1, top, reserved + BLOCK_FOR));
        self.issued = first;
        first
    }

    /// The reservation ahead came back: its block (`None`: refused, or
    /// failed), kept if `same_lease`.
    pub(crate) fn set_ahead(&mut self, top: Option<(u64, Instant)>, same_lease: bool) {
        self.reserving = false;
        if same_lease {
            self.ahead = top;
        }
    }
}
