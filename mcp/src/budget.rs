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
//! record log has stored it). So an answer needs about **twice its size** of the budget while
//! its texts are split off (its file and its texts at once), then its texts' size until they
//! are logged: the largest answer kept is about half the budget. An answer whose next bytes
//! would pass the budget is not kept (a stdio line is read past, an HTTP body or event is
//! not read further; one refused while its texts are split off is dropped), and its call
//! fails with [`McpError::SpillBudget`](crate::McpError) saying what the answer held and what
//! other answers held; the connection, and every other call, goes on.
//!
//! Over stdio, any line over [`SPILL_AT`](crate::SPILL_AT) is spilled as it arrives, before
//! it is known to answer a call: a `tools/list` page of that size is refused like an
//! answer when the budget has no room for it. A notification or a server's request is
//! never kept that long: once its top-level `method` is read (senders write it first),
//! the line is read past without a file, and what it had written so far, and held of the
//! budget, is given back; it is then refused whatever the budget.

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
    /// limits (a stdio line over [`SPILL_AT`](crate::SPILL_AT), an HTTP body or event over
    /// 16 MiB) fails its call.
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
            exact: false,
        }
    }

    /// Takes `bytes` if the budget has them; the refusal says what `own` bytes the asker
    /// held already.
    fn take(&self, bytes: u64, own: u64) -> Result<(), OverBudget> {
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
                own,
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
    "{wanted} more bytes would pass the spill budget of {limit} bytes ({own} held for this \
     answer already, {} by other answers)",
    self.others()
)]
pub(crate) struct OverBudget {
    /// The bytes asked for.
    pub(crate) wanted: u64,
    /// The bytes held in all when they were asked for.
    pub(crate) in_use: u64,
    /// Of those, the bytes the refused answer held itself (its file, its texts so far).
    pub(crate) own: u64,
    /// The budget.
    pub(crate) limit: u64,
}

impl OverBudget {
    /// The bytes other answers held.
    pub(crate) fn others(&self) -> u64 {
        self.in_use.saturating_sub(self.own)
    }

    /// The same refusal, counting `more` bytes the answer held elsewhere (its file, while
    /// a text of it was refused) as its own.
    pub(crate) fn holding(mut self, more: u64) -> Self {
        self.own = self.own.saturating_add(more);
        self
    }
}

/// Bytes of a [`SpillBudget`] held by one file, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: SpillBudget,
    bytes: u64,
    /// A step was refused: [`Reservation::cover`] takes exactly what it needs from now on.
    exact: bool,
}

impl Reservation {
    /// Holds `more` bytes more, if the budget has them; else holds what it held.
    pub(crate) fn grow(&mut self, more: u64) -> Result<(), OverBudget> {
        self.budget.take(more, self.bytes)?;
        self.bytes += more;
        Ok(())
    }

    /// Holds at least `bytes` in all: a [`STEP`] or more at a time (one atomic per step
    /// rather than per write) while the budget has room for a step, then exactly what is
    /// needed, each time.
    pub(crate) fn cover(&mut self, bytes: u64) -> Result<(), OverBudget> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let short = bytes - self.bytes;
        if !self.exact && short < STEP {
            if self.grow(STEP).is_ok() {
                return Ok(());
            }
            self.exact = true;
        }
        self.grow(short)
    }

    /// Moves everything held into a new reservation, leaving this one empty: to give the
    /// bytes back only when a file still being written is closed.
    pub(crate) fn take_all(&mut self) -> Self {
        let bytes = std::mem::take(&mut self.bytes);
        Self {
            budget: self.budget.clone(),
            bytes,
            exact: self.exact,
        }
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
                own: STEP,
                limit: 10 * STEP
            }
        );
        assert_eq!(refused.others(), 4 * STEP);
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
        let budget = SpillBudget::new(40);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    let (mut held, mut refused) = (Vec::new(), 0u32);
                    for i in 0..5000u64 {
                        let mut reservation = budget.reserve();
                        match reservation.grow(1 + i % 7) {
                            Ok(()) => held.push(reservation),
                            Err(_) => refused += 1,
                        }
                        assert!(budget.in_use() <= 40);
                        if i % 20 == 0 {
                            held.clear();
                        }
                    }
                    refused
                })
            })
            .collect();
        let refused: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(refused > 0, "the limit was reached");
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn near_the_limit_cover_takes_exactly_what_it_needs() {
        let budget = SpillBudget::new(STEP + 10);
        let mut a = budget.reserve();
        a.cover(5).unwrap();
        assert_eq!(a.bytes(), STEP, "a step while there is room");
        let mut b = budget.reserve();
        b.cover(4).unwrap();
        assert_eq!(b.bytes(), 4, "exactly, once a step does not fit");
        b.cover(10).unwrap();
        assert_eq!(b.bytes(), 10);
        let refused = b.cover(11).unwrap_err();
        assert_eq!((refused.own, refused.others()), (10, STEP));
        let moved = b.take_all();
        assert_eq!(
            (b.bytes(), moved.bytes(), budget.in_use()),
            (0, 10, STEP + 10)
        );
        drop(moved);
        assert_eq!(budget.in_use(), STEP);
    }
}
