//! The disk budget of answers kept in files: one [`SpillBudget`] per
//! [`McpManager`](crate::McpManager), shared by every connection, bounds the bytes that
//! answers too large for memory hold on disk at once, across every call in flight and
//! every spilled result not yet logged.
//!
//! Bytes are reserved before they are written: a spilling answer reserves each chunk as it
//! is read (stdio lines, HTTP JSON bodies, server-sent events), and each long text split off
//! it reserves what it decodes, in steps of [`STEP`]. A reservation is given back when what
//! it covers is gone: the answer's file once its texts are split off, each text's file when
//! the last holder of its [`SpilledText`](psych_types::SpilledText) drops it (after the
//! record log has stored it). An answer whose next bytes would pass the budget is read past
//! without being kept, and its call fails with [`McpError::SpillBudget`](crate::McpError)
//! as soon as it has gone by; the connection, and every other call, goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default [`SpillBudget`]: 10 GiB, room for the largest answer kept
/// ([`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER), 4 GiB) while its texts are split
/// off into files of their own, with room to spare for other calls.
pub const DEFAULT_SPILL_BUDGET: u64 = 10 * 1024 * 1024 * 1024;

/// The reservation step of a text being decoded into a file: a text holds at most this
/// much of the budget past its bytes while it grows, and exactly its bytes once done.
pub(crate) const STEP: u64 = 1024 * 1024;

/// How many bytes answers kept in files may hold on disk at once (see the module docs).
///
/// Cloning it shares it: every clone counts against the same bytes. Reserving is one atomic
/// compare-and-swap: nothing here blocks.
///
/// ```
/// let budget = psych_mcp::SpillBudget::new(64 * 1024 * 1024);
/// assert_eq!(budget.limit(), 64 * 1024 * 1024);
/// assert_eq!(budget.in_use(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct SpillBudget {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limit: u64,
    in_use: AtomicU64,
}

impl SpillBudget {
    /// A budget of `limit` bytes. 0 keeps nothing in files: every answer over the in-memory
    /// limits fails its call.
    pub fn new(limit: u64) -> Self {
        Self {
            inner: Arc::new(Shared {
                limit,
                in_use: AtomicU64::new(0),
            }),
        }
    }

    /// The most bytes held at once.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// The bytes held now, by answers being read and by spilled texts not yet dropped.
    pub fn in_use(&self) -> u64 {
        self.inner.in_use.load(Ordering::Acquire)
    }

    /// A reservation of nothing yet, to grow as bytes are written.
    pub(crate) fn reserve(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    fn take(&self, bytes: u64) -> Result<(), OverBudget> {
        let limit = self.inner.limit;
        self.inner
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                in_use.checked_add(bytes).filter(|after| *after <= limit)
            })
            .map(|_| ())
            .map_err(|in_use| OverBudget {
                wanted: bytes,
                in_use,
                limit,
            })
    }

    fn give_back(&self, bytes: u64) {
        if bytes > 0 {
            self.inner.in_use.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

impl Default for SpillBudget {
    /// [`DEFAULT_SPILL_BUDGET`].
    fn default() -> Self {
        Self::new(DEFAULT_SPILL_BUDGET)
    }
}

/// More bytes than the budget has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{wanted} more bytes would pass the spill budget of {limit} bytes, {in_use} of which \
     other answers hold"
)]
pub(crate) struct OverBudget {
    /// The bytes asked for.
    pub(crate) wanted: u64,
    /// The bytes held when they were asked for.
    pub(crate) in_use: u64,
    /// The budget.
    pub(crate) limit: u64,
}

/// Bytes of a [`SpillBudget`] held by one file, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: SpillBudget,
    bytes: u64,
}

impl Reservation {
    /// Holds `more` bytes more, if the budget has them; else holds what it held.
    pub(crate) fn grow(&mut self, more: u64) -> Result<(), OverBudget> {
        self.budget.take(more)?;
        self.bytes += more;
        Ok(())
    }

    /// Holds at least `bytes` in all, taking [`STEP`] or more at a time (one atomic per
    /// step rather than per write).
    pub(crate) fn cover(&mut self, bytes: u64) -> Result<(), OverBudget> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let short = bytes - self.bytes;
        // A step past what is needed where the budget has it, else exactly what is.
        self.grow(short.max(STEP)).or_else(|_| self.grow(short))
    }

    /// Gives back what is held past `bytes`.
    pub(crate) fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    /// The bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use super::*;

    #[test]
    fn reservations_hold_what_they_grow_by_until_dropped_and_never_pass_the_limit() {
        let budget = SpillBudget::new(10 * STEP);
        let mut a = budget.reserve();
        a.grow(4 * STEP).unwrap();
        let mut b = budget.reserve();
        b.cover(STEP / 2).unwrap();
        assert_eq!(b.bytes(), STEP, "a step at a time while there is room");
        assert_eq!(budget.in_use(), 5 * STEP);
        let refused = b.grow(6 * STEP).unwrap_err();
        assert_eq!(
            refused,
            OverBudget {
                wanted: 6 * STEP,
                in_use: 5 * STEP,
                limit: 10 * STEP
            }
        );
        assert_eq!(budget.in_use(), 5 * STEP, "a refusal holds nothing");
        // Near the limit, cover takes exactly what it needs.
        b.cover(6 * STEP - 10).unwrap();
        assert_eq!(budget.in_use(), 10 * STEP - 10);
        b.shrink_to(100);
        assert_eq!(budget.in_use(), 4 * STEP + 100);
        drop(a);
        assert_eq!(budget.in_use(), 100);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn concurrent_reservations_never_hold_more_than_the_limit() {
        let budget = SpillBudget::new(1000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..2000u64 {
                        let mut reservation = budget.reserve();
                        if reservation.grow(1 + i % 7).is_ok() {
                            held.push(reservation);
                        }
                        assert!(budget.in_use() <= 1000);
                        if i % 3 == 0 {
                            held.clear();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(budget.in_use(), 0);
    }
}
