//! The two elision thresholds, validated when they are built ("publish"), never when used.

use serde::{Deserialize, Serialize};

/// Why a [`ThresholdsBuilder`] refused to build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThresholdsError {
    /// The per-result threshold was set to zero, which would elide every result.
    #[error("the per-result threshold must be at least 1 token")]
    ZeroPerResult,
    /// The per-batch threshold was set to zero, which no batch could stay under.
    #[error("the per-batch threshold must be at least 1 token")]
    ZeroPerBatch,
    /// The per-result threshold exceeds the per-batch threshold (the spec forbids it: a
    /// single result the batch cannot hold would never be elided on its own).
    #[error(
        "the per-result threshold ({per_result} tokens) exceeds the per-batch threshold ({per_batch} tokens)"
    )]
    PerResultOverPerBatch {
        /// The per-result threshold asked for.
        per_result: u64,
        /// The per-batch threshold asked for.
        per_batch: u64,
    },
}

/// The per-result and per-batch thresholds of the elision plan, in estimated tokens.
///
/// A value of this type always satisfies `0 < per_result <= per_batch`: it can only be
/// made through [`ThresholdsBuilder::build`] (or deserialized, which runs the same
/// checks), so the plan never meets bad thresholds at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawThresholds", into = "RawThresholds")]
pub struct Thresholds {
    per_result: u64,
    per_batch: u64,
}

impl Thresholds {
    /// Default per-result threshold: a result of 10,000 estimated tokens or more is elided.
    pub const DEFAULT_PER_RESULT: u64 = 10_000;
    /// Default per-batch threshold: one turn's successes the plan keeps whole stay under
    /// 30,000 tokens (failures, a few hundred characters each, are not counted). A
    /// success it elides that is too short for a preview (head and tail would meet) is
    /// sent unshortened all the same (one with binary data as its readable text), as the
    /// spec says a preview never truncates something already small, so many such results
    /// together can pass it.
    pub const DEFAULT_PER_BATCH: u64 = 30_000;

    /// A builder starting from the defaults.
    pub fn builder() -> ThresholdsBuilder {
        ThresholdsBuilder::default()
    }

    /// A result at or over this many estimated tokens is always elided.
    pub fn per_result(&self) -> u64 {
        self.per_result
    }

    /// The kept results of one batch are brought under this many estimated tokens.
    pub fn per_batch(&self) -> u64 {
        self.per_batch
    }
}

impl Default for Thresholds {
    /// [`Thresholds::DEFAULT_PER_RESULT`] and [`Thresholds::DEFAULT_PER_BATCH`].
    fn default() -> Self {
        Self {
            per_result: Self::DEFAULT_PER_RESULT,
            per_batch: Self::DEFAULT_PER_BATCH,
        }
    }
}

/// Builds [`Thresholds`], refusing zero values and `per_result > per_batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThresholdsBuilder {
    per_result: u64,
    per_batch: u64,
}

impl Default for ThresholdsBuilder {
    fn default() -> Self {
        let defaults = Thresholds::default();
        Self {
            per_result: defaults.per_result,
            per_batch: defaults.per_batch,
        }
    }
}

impl ThresholdsBuilder {
    /// Sets the per-result threshold, in estimated tokens.
    pub fn per_result(mut self, tokens: u64) -> Self {
        self.per_result = tokens;
        self
    }

    /// Sets the per-batch threshold, in estimated tokens.
    pub fn per_batch(mut self, tokens: u64) -> Self {
        self.per_batch = tokens;
        self
    }

    /// The thresholds, if they are valid.
    ///
    /// # Errors
    ///
    /// [`ThresholdsError::ZeroPerResult`] or [`ThresholdsError::ZeroPerBatch`] for a zero
    /// value, [`ThresholdsError::PerResultOverPerBatch`] when `per_result > per_batch`.
    pub fn build(self) -> Result<Thresholds, ThresholdsError> {
        let Self {
            per_result,
            per_batch,
        } = self;
        if per_result == 0 {
            return Err(ThresholdsError::ZeroPerResult);
        }
        if per_batch == 0 {
            return Err(ThresholdsError::ZeroPerBatch);
        }
        if per_result > per_batch {
            return Err(ThresholdsError::PerResultOverPerBatch {
                per_result,
                per_batch,
            });
        }
        Ok(Thresholds {
            per_result,
            per_batch,
        })
    }
}

/// The serde form, checked on the way in.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawThresholds {
    per_result: u64,
    per_batch: u64,
}

impl TryFrom<RawThresholds> for Thresholds {
    type Error = ThresholdsError;

    fn try_from(raw: RawThresholds) -> Result<Self, ThresholdsError> {
        Thresholds::builder()
            .per_result(raw.per_result)
            .per_batch(raw.per_batch)
            .build()
    }
}

impl From<Thresholds> for RawThresholds {
    fn from(thresholds: Thresholds) -> Self {
        Self {
            per_result: thresholds.per_result,
            per_batch: thresholds.per_batch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_refuses_bad_thresholds_with_typed_errors() {
        let b = Thresholds::builder();
        assert_eq!(b.per_result(0).build(), Err(ThresholdsError::ZeroPerResult));
        assert_eq!(b.per_batch(0).build(), Err(ThresholdsError::ZeroPerBatch));
        assert_eq!(
            b.per_result(11).per_batch(10).build(),
            Err(ThresholdsError::PerResultOverPerBatch {
                per_result: 11,
                per_batch: 10
            })
        );
        let equal = b.per_result(10).per_batch(10).build().unwrap();
        assert_eq!((equal.per_result(), equal.per_batch()), (10, 10));
        assert_eq!(b.build().unwrap(), Thresholds::default());
    }

    #[test]
    fn deserializing_runs_the_same_checks() {
        let ok: Thresholds = serde_json::from_str(r#"{"per_result":5,"per_batch":9}"#).unwrap();
        assert_eq!((ok.per_result(), ok.per_batch()), (5, 9));
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"per_result":5,"per_batch":9}"#
        );
        let err = serde_json::from_str::<Thresholds>(r#"{"per_result":9,"per_batch":5}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds the per-batch threshold"), "{err}");
        assert!(serde_json::from_str::<Thresholds>(r#"{"per_result":0,"per_batch":5}"#).is_err());
    }
}
