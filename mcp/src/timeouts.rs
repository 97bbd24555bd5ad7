//! Every deadline and the reconnect backoff, in one place.
//!
//! rmcp puts no deadline on anything: an `initialize`, a `tools/list` page or a
//! `tools/call` that is never answered waits forever. Every request psych-mcp sends goes
//! through one of these deadlines.

use std::time::Duration;

/// Deadlines for talking to servers. [`Timeouts::default`] suits interactive agents; tests
/// use shorter ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeouts {
    /// Starting a server and completing `initialize` (HTTP: the first exchange).
    pub connect: Duration,
    /// One `tools/list` page.
    pub page: Duration,
    /// A whole listing, every page together.
    pub listing: Duration,
    /// One `tools/call`; when it passes, `notifications/cancelled` is sent to the server.
    /// Once an answer is arriving, this is a deadline for silence: a call past it whose
    /// connection read bytes of an unfinished message within the last `call` goes on (a
    /// multi-GiB answer over a slow link is not cut while it arrives), up to
    /// [`transfer`](Self::transfer) from the call's start.
    pub call: Duration,
    /// The most one `tools/call` may take while its answer keeps arriving (see
    /// [`call`](Self::call)), so that a peer dripping bytes cannot hold a call forever. At
    /// most `call` makes `call` the whole deadline again.
    pub transfer: Duration,
    /// How long a stdio server's process group gets after SIGTERM before SIGKILL, on
    /// shutdown or after its connection is lost.
    pub shutdown_grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(30),
            page: Duration::from_secs(15),
            listing: Duration::from_secs(60),
            call: Duration::from_secs(120),
            transfer: Duration::from_secs(30 * 60),
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

impl Timeouts {
    /// The same deadline for everything but the shutdown grace (tests mostly); a call ends
    /// at it even while its answer arrives.
    pub fn uniform(deadline: Duration) -> Self {
        Self {
            connect: deadline,
            page: deadline,
            listing: deadline,
            call: deadline,
            transfer: deadline,
            shutdown_grace: Duration::from_secs(2),
        }
    }

    /// Sets the call deadline.
    pub fn with_call(mut self, call: Duration) -> Self {
        self.call = call;
        self
    }

    /// The longest one `tools/call` can take, its answer's transfer included: what a
    /// caller's own deadline around a call should be at least, so as not to cut an answer
    /// still arriving.
    pub fn longest_call(&self) -> Duration {
        self.call.max(self.transfer)
    }

    /// Sets the longest a call may take while its answer keeps arriving.
    pub fn with_transfer(mut self, transfer: Duration) -> Self {
        self.transfer = transfer;
        self
    }

    /// Sets the connect deadline.
    pub fn with_connect(mut self, connect: Duration) -> Self {
        self.connect = connect;
        self
    }

    /// Sets the page and whole-listing deadlines.
    pub fn with_listing(mut self, page: Duration, listing: Duration) -> Self {
        self.page = page;
        self.listing = listing;
        self
    }

    /// Sets the shutdown grace.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
}

/// Exponential backoff between reconnect attempts of one server: `initial`, then times
/// `factor` after each failure, capped at `max`. A connection lost sooner than the next
/// delay would be counts as a failure; one that lasted that long steps the backoff back
/// one delay, and one that lasted `max` starts it over. So a server that keeps dying is
/// restarted about as often as its sessions last (up to `max` apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
    /// The growth factor (at least 1).
    pub factor: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            factor: 2,
        }
    }
}

impl Backoff {
    /// A backoff from `initial` up to `max`, doubling.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            factor: 2,
        }
    }

    /// The delay before attempt `failures + 1`, after `failures` consecutive failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let mut delay = self.initial;
        for _ in 0..failures {
            delay = delay.saturating_mul(self.factor.max(1));
            if delay >= self.max {
                return self.max;
            }
        }
        delay.min(self.max)
    }

    /// The count of failures after a session that connected after `failures` of them and
    /// was lost after `lasted`: unchanged when it was lost sooner than [`delay`] would wait
    /// now (the next delay grows), one less when it lasted that long, none when it lasted
    /// `max` (see the type's docs).
    ///
    /// [`delay`]: Backoff::delay
    pub(crate) fn after_session(&self, failures: u32, lasted: Duration) -> u32 {
        if lasted >= self.max {
            0
        } else if lasted >= self.delay(failures) {
            failures.saturating_sub(1)
        } else {
            failures
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let delays: Vec<u128> = (0..6).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 700, 700, 700]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_millis(700));
    }

    #[test]
    fn a_session_steps_the_backoff_back_by_how_long_it_lasted() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let ms = Duration::from_millis;
        // Lost at once: a failure like any.
        assert_eq!(backoff.after_session(3, ms(10)), 3);
        // As long as the delay it would wait (400 ms after 2): one delay back.
        assert_eq!(backoff.after_session(2, ms(400)), 1);
        assert_eq!(backoff.after_session(0, ms(100)), 0);
        // The longest delay: over.
        assert_eq!(backoff.after_session(9, ms(700)), 0);
    }
}
