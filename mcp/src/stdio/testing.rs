//! What the stdio transport's tests share: a seeded generator and a single poll, to drop
//! reads at random points.

use std::future::Future;
use std::task::Poll;

/// xorshift64*: a seeded generator, so a failure names the seed that reproduces it.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Log-uniform in `1..max` (`max` at least 2): as many tiny sizes as huge ones, per
    /// order of size.
    pub(crate) fn size(&mut self, max: u64) -> u64 {
        let bits = self.below(u64::from(max.ilog2()));
        (1u64 << bits) + self.below(1u64 << bits)
    }
}

/// Polls `future` once.
pub(crate) async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx))).await
}

/// Polls `future` up to `polls + 1` times, yielding between polls: its output if it was
/// ready by then, else `None` (the caller then drops it, mid-way, as a `select!` would).
pub(crate) async fn poll_up_to<F: Future + Unpin>(future: &mut F, polls: u64) -> Option<F::Output> {
    for _ in 0..=polls {
        if let Poll::Ready(output) = poll_once(future).await {
            return Some(output);
        }
        tokio::task::yield_now().await;
    }
    None
}
