//! [`PassingBudget`]: how much passed result text the executors of one process hold at once.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most bytes of passed result text ([`psych_reader_tool::passing`]: result references
/// replaced in calls' arguments, and `psych serve`'s `resources/read` answers) that the
/// executors sharing this budget hold at once, counted in KiB.
///
/// Each execution that passes results reserves its whole bound
/// ([`Limits::max_passed_bytes`](psych_reader_tool::Limits::max_passed_bytes), at most the
/// budget) at once before it reads any reference, waiting while the budget cannot give it,
/// then gives back what it did not read; the rest is held until its calls end, and until
/// every read it started has ended (a read on the blocking pool goes on when the execution
/// is dropped: it holds the reservation with it). One reservation per execution, never a
/// second one while holding the first, so executions waiting on each other cannot
/// deadlock; a wait is bounded by the executor's call deadline. Cheap to clone (a shared
/// count).
///
/// A [`share`](Self::share) of a budget reserves from its own count and then from the
/// budget's, so the executors given one share (a gateway's identity) never hold more than
/// the share at once: with shares of half, one identity leaves the others at least half.
#[derive(Debug, Clone)]
pub struct PassingBudget {
    permits: Arc<Semaphore>,
    kib: u32,
    /// The budget this one is a share of, reserved from after this one's own count.
    whole: Option<Box<PassingBudget>>,
}

impl PassingBudget {
    /// A budget of `bytes` (rounded up to whole KiB; at most `u32::MAX` KiB, about 4 TiB,
    /// or what the semaphore counts, if less).
    pub fn new(bytes: u64) -> Self {
        let most = u32::try_from(Semaphore::MAX_PERMITS).unwrap_or(u32::MAX);
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(most);
        Self {
            permits: Arc::new(Semaphore::new(kib as usize)),
            kib,
            whole: None,
        }
    }

    /// A share of this budget of `bytes`: what is reserved through it is counted in both,
    /// so the holders of the share hold at most `bytes` of this budget at once. A
    /// reservation takes the share's bytes first, then the whole's: it never holds the
    /// whole's while waiting for the share's. A share of the whole or more is the budget
    /// itself (a clone).
    ///
    /// ```
    /// let process = psych_runtime::PassingBudget::new(64 << 20);
    /// let identity = process.share(32 << 20);
    /// assert_eq!(identity.bytes(), 32 << 20);
    /// assert_eq!(process.share(1 << 40).bytes(), 64 << 20);
    /// ```
    pub fn share(&self, bytes: u64) -> Self {
        if bytes >= self.bytes() {
            return self.clone();
        }
        let mut share = Self::new(bytes);
        share.whole = Some(Box::new(self.clone()));
        share
    }

    /// The whole budget, in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// The bytes not held now.
    pub fn available(&self) -> u64 {
        self.permits.available_permits() as u64 * 1024
    }

    /// Reserves `bytes` (at most the whole budget), waiting until they are free.
    /// Cancel-safe: dropped while it waits, it holds nothing.
    pub async fn reserve(&self, bytes: u64) -> Reserved {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.kib);
        let mut held = Vec::new();
        let mut budget = Some(self);
        while let Some(level) = budget {
            // A share is never larger than its whole, so `kib` fits every level. The
            // semaphores are never closed; were one, nothing would be held.
            let Ok(permit) = Arc::clone(&level.permits).acquire_many_owned(kib).await else {
                return Reserved(None);
            };
            held.push(permit);
            budget = level.whole.as_deref();
        }
        Reserved(Some(Arc::new(Mutex::new(held))))
    }
}

/// Bytes reserved in a [`PassingBudget`]. Its clones share the one reservation: the bytes
/// go back when the last clone is dropped (so a read on the blocking pool holding a clone
/// keeps them while it runs, whoever stopped waiting for it).
#[derive(Debug, Clone)]
pub struct Reserved(Option<Arc<Mutex<Vec<OwnedSemaphorePermit>>>>);

impl Reserved {
    /// Nothing reserved (no budget): allocates nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Keeps `bytes` of the reservation (rounded up to whole KiB) and gives the rest back.
    pub fn keep(&self, bytes: u64) {
        let Some(held) = &self.0 else {
            return;
        };
        let mut permits = held.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = usize::try_from(bytes.div_ceil(1024)).unwrap_or(usize::MAX);
        for permit in permits.iter_mut() {
            let excess = permit.num_permits().saturating_sub(keep);
            drop(permit.split(excess));
        }
    }

    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |held| {
            held.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .first()
                .map_or(0, |permit| permit.num_permits() as u64 * 1024)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_reservation_waits_for_the_bytes_and_gives_back_what_it_does_not_keep() {
        let budget = PassingBudget::new(10 << 10);
        let first = budget.reserve(8 << 10).await;
        assert_eq!(budget.available(), 2 << 10);
        // The second cannot have 8 KiB until the first gives some back.
        let second = budget.reserve(8 << 10);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut second)
                .await
                .is_err()
        );
        first.keep(1_000);
        assert_eq!(first.bytes(), 1 << 10);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the bytes given back let it through");
        assert_eq!(second.bytes(), 8 << 10);
        assert_eq!(budget.available(), 1 << 10);
        // A clone (a read still running) keeps the bytes after the first is dropped.
        let reading = second.clone();
        drop((first, second));
        assert_eq!(budget.available(), 2 << 10);
        drop(reading);
        assert_eq!(budget.available(), 10 << 10);
        // More than the whole budget is the whole budget; dropped while waiting, nothing is
        // held.
        let all = budget.reserve(1 << 40).await;
        assert_eq!(all.bytes(), budget.bytes());
        let waiting = budget.reserve(1);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), waiting)
                .await
                .is_err()
        );
        drop(all);
        assert_eq!(budget.available(), budget.bytes());
    }

    /// Holders of a share hold at most the share, and the rest of the whole stays for the
    /// others; what a reservation gives back goes back to both; dropped while it waits for
    /// the whole, it holds nothing of the share.
    #[tokio::test]
    async fn a_share_holds_at_most_its_bytes_of_the_whole() {
        let whole = PassingBudget::new(64 << 10);
        let bob = whole.share(32 << 10);
        let alice = whole.share(32 << 10);
        let first = bob.reserve(16 << 10).await;
        let second = bob.reserve(16 << 10).await;
        assert_eq!((bob.available(), whole.available()), (0, 32 << 10));
        // Bob's third waits for his own share, though the whole has room.
        let third = bob.reserve(16 << 10);
        tokio::pin!(third);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut third)
                .await
                .is_err()
        );
        // Alice still has hers.
        let hers = tokio::time::timeout(Duration::from_secs(5), alice.reserve(32 << 10))
            .await
            .expect("the rest of the whole is the other share's");
        assert_eq!(whole.available(), 0);
        // Bob gives back all but 1 KiB of his first: they go to his waiting third (the
        // semaphore is fair), which then waits for the rest of his share.
        first.keep(1_000);
        assert_eq!((bob.available(), whole.available()), (0, 15 << 10));
        drop(second);
        let third = tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("room in both");
        assert_eq!(third.bytes(), 16 << 10);
        assert_eq!((bob.available(), whole.available()), (15 << 10, 15 << 10));
        drop(third);
        // The whole full: a reservation of bob's takes his share's bytes and waits for the
        // whole's; dropped, it gives his share's back.
        let big = whole.reserve(31 << 10).await;
        assert_eq!(whole.available(), 0);
        let mut waiting = Box::pin(bob.reserve(8 << 10));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut waiting)
                .await
                .is_err()
        );
        assert_eq!(bob.available(), 23 << 10);
        drop(waiting);
        assert_eq!(bob.available(), 31 << 10);
        drop((first, hers, big));
        assert_eq!(bob.available(), 32 << 10);
        assert_eq!(whole.available(), 64 << 10);
    }
}
