//! The elision plan over one turn's tool results: the spec's algorithm, over sizes.

use crate::Thresholds;

/// Which results of a batch to elide, and the totals behind the decision.
///
/// Made by [`plan`]; the same sizes and thresholds always give the same plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    elide: Vec<bool>,
    total: u128,
    kept: u128,
}

impl Plan {
    /// Whether result `index` is elided (`false` for an index out of range).
    pub fn is_elided(&self, index: usize) -> bool {
        self.elide.get(index).copied().unwrap_or(false)
    }

    /// The indices of the elided results, in increasing order.
    pub fn elided(&self) -> impl Iterator<Item = usize> + '_ {
        self.elide
            .iter()
            .enumerate()
            .filter_map(|(i, &elide)| elide.then_some(i))
    }

    /// One flag per result, `true` where it is elided.
    pub fn as_slice(&self) -> &[bool] {
        &self.elide
    }

    /// Number of results planned over.
    pub fn len(&self) -> usize {
        self.elide.len()
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.elide.is_empty()
    }

    /// Estimated tokens of the whole batch.
    pub fn total(&self) -> u128 {
        self.total
    }

    /// Estimated tokens of the results kept whole (elided ones count zero).
    pub fn kept(&self) -> u128 {
        self.kept
    }
}

/// Plans the elision of one batch, given each result's estimated tokens.
///
/// Exactly the spec's algorithm:
///
/// 1. Sum the batch. If the sum is under the per-result threshold, elide nothing (the
///    short-circuit is on the sum, so many small results that add up are still planned).
/// 2. Elide every result at or over the per-result threshold.
/// 3. Sort the rest largest first and elide until the kept total is under the per-batch
///    threshold. Equal sizes go in index order (the earlier result is elided first), so the
///    plan is the same on every machine.
///
/// The kept total always ends under the per-batch threshold (eliding everything reaches
/// zero, and the threshold is at least 1), and a result under the per-result threshold is
/// elided only when the batch was still over budget after step 2 and no larger kept result
/// remained.
pub fn plan(sizes: &[u64], thresholds: &Thresholds) -> Plan {
    plan_with(sizes, |_| thresholds.per_result(), thresholds.per_batch())
}

/// [`plan`] with a per-result threshold of its own for each result (`per_result[i]` for
/// `sizes[i]`; a result without one gets the smallest given, or none is elided alone when
/// none is), one per-batch threshold: what output limits set per tool make of it. Step 1's
/// short-circuit is on the smallest per-result threshold, so it changes nothing steps 2
/// and 3 would do. With every threshold equal it is [`plan`]. Each threshold is clamped to
/// `1..=per_batch` (`per_batch` at least 1), so the kept total always ends under the
/// per-batch threshold, as [`plan`]'s does.
pub fn plan_each(sizes: &[u64], per_result: &[u64], per_batch: u64) -> Plan {
    let per_batch = per_batch.max(1);
    let fallback = per_result.iter().copied().min().unwrap_or(per_batch);
    plan_with(
        sizes,
        |i| {
            per_result
                .get(i)
                .copied()
                .unwrap_or(fallback)
                .clamp(1, per_batch)
        },
        per_batch,
    )
}

/// The one body of [`plan`] and [`plan_each`]: `threshold(i)` is result `i`'s per-result
/// threshold.
fn plan_with(sizes: &[u64], threshold: impl Fn(usize) -> u64, per_batch: u64) -> Plan {
    let total: u128 = sizes.iter().map(|&size| u128::from(size)).sum();
    let mut elide = vec![false; sizes.len()];
    let smallest = (0..sizes.len()).map(&threshold).min().unwrap_or(u64::MAX);
    if total < u128::from(smallest) {
        return Plan {
            elide,
            total,
            kept: total,
        };
    }
    let mut kept = total;
    for (i, (flag, &size)) in elide.iter_mut().zip(sizes).enumerate() {
        if size >= threshold(i) {
            *flag = true;
            kept -= u128::from(size);
        }
    }
    let per_batch = u128::from(per_batch);
    if kept >= per_batch {
        let mut rest: Vec<(u64, usize)> = sizes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !elide[i])
            .map(|(i, &size)| (size, i))
            .collect();
        // Largest first; among equals, lowest index first. Keys are unique (the index), so
        // an unstable sort is deterministic.
        rest.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (size, i) in rest {
            if kept < per_batch {
                break;
            }
            elide[i] = true;
            kept -= u128::from(size);
        }
    }
    Plan { elide, total, kept }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds(per_result: u64, per_batch: u64) -> Thresholds {
        Thresholds::builder()
            .per_result(per_result)
            .per_batch(per_batch)
            .build()
            .unwrap()
    }

    fn elided(sizes: &[u64], t: &Thresholds) -> Vec<usize> {
        plan(sizes, t).elided().collect()
    }

    #[test]
    fn follows_the_spec_step_by_step() {
        let t = thresholds(100, 250);
        // Step 1: the sum is under the per-result threshold.
        assert_eq!(elided(&[30, 30, 39], &t), Vec::<usize>::new());
        // The sum is over, nothing is large, the batch fits: nothing elided.
        assert_eq!(elided(&[90, 90, 60], &t), Vec::<usize>::new());
        // Step 2: at or over the per-result threshold.
        assert_eq!(elided(&[100, 5, 400], &t), vec![0, 2]);
        // Step 3: largest first until under the batch threshold.
        assert_eq!(elided(&[60, 99, 80, 70], &t), vec![1]);
        assert_eq!(elided(&[99, 99, 99, 99], &t), vec![0, 1]);
        let p = plan(&[99, 99, 99, 99], &t);
        assert_eq!((p.total(), p.kept()), (396, 198));
    }

    #[test]
    fn empty_and_extreme_batches() {
        let t = thresholds(1, 1);
        assert!(plan(&[], &t).is_empty());
        assert_eq!(elided(&[0, 0], &t), Vec::<usize>::new());
        assert_eq!(elided(&[u64::MAX, u64::MAX, 0], &t), vec![0, 1]);
        assert!(!plan(&[5], &t).is_elided(7));
    }
}
