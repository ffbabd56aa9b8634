//! [`Backoff`]: the one exponential back-off of the crate.

use std::time::Duration;

/// Pauses that double from `first` up to `max`: between reconnects of the
/// notice connection, and between an acquire's retries after a broken
/// connection.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The pause the next [`wait`](Self::wait) takes.
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Takes the next pause (without sleeping) and doubles the one after.
    pub(crate) fn advance(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// Sleeps for the next pause.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.advance()).await;
    }

    /// Back to the first pause, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap_and_reset_to_the_first() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
        let pauses: Vec<u128> = (0..5).map(|_| b.advance().as_millis()).collect();
        assert_eq!(pauses, [20, 40, 80, 100, 100]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(20));
    }
}
