//! The bounds of one reader: page sizes, the long-line cap, the read chunk.

/// The longest `grep` string accepted, in bytes.
pub const MAX_GREP_BYTES: usize = 256;

/// The bounds a [`Reader`](crate::Reader) works within, built and checked by
/// [`LimitsBuilder::build`] (a `Limits` is always consistent).
///
/// The defaults suit a model's context: 200 lines a page by default, at most 1,000, lines cut
/// at 2,000 bytes, a page closed once it shows 64 KiB, and line counts completed for results
/// up to 1 MiB. The source is read 256 KiB at a time, so that a chunk stays in a core's L2
/// cache while it is searched and its lines counted (measured a few percent faster than
/// 1 MiB on the grep benchmark).
///
/// ```
/// use psych_reader_tool::Limits;
///
/// let limits = Limits::builder().default_limit(50).max_limit(500).build()?;
/// assert_eq!((limits.default_limit(), limits.max_limit()), (50, 500));
/// assert_eq!(limits.max_line_bytes(), Limits::default().max_line_bytes());
/// assert!(Limits::builder().default_limit(0).build().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub(crate) default_limit: u32,
    pub(crate) max_limit: u32,
    pub(crate) max_line_bytes: usize,
    pub(crate) max_page_bytes: usize,
    pub(crate) chunk_bytes: usize,
    pub(crate) count_all_bytes: u64,
    pub(crate) max_passed_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            default_limit: 200,
            max_limit: 1000,
            max_line_bytes: 2000,
            max_page_bytes: 64 * 1024,
            chunk_bytes: 256 << 10,
            count_all_bytes: 1 << 20,
            max_passed_bytes: DEFAULT_MAX_PASSED_BYTES,
        }
    }
}

impl Limits {
    /// A builder starting from the defaults.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::default()
    }

    /// Lines returned when the model gives no `limit`.
    pub fn default_limit(&self) -> u32 {
        self.default_limit
    }

    /// The largest `limit` accepted; a larger one is a validation error.
    pub fn max_limit(&self) -> u32 {
        self.max_limit
    }

    /// Bytes of one line shown at most; the rest of a longer line is cut and the cut marked
    /// with the number of bytes left out.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }

    /// A page is closed (with "more follows") once the bytes it shows reach this; it always
    /// holds at least one line, so a page shows at most this plus one line.
    pub fn max_page_bytes(&self) -> usize {
        self.max_page_bytes
    }

    /// Bytes asked of the source per read while scanning. The scan buffer holds at most
    /// twice this (a chunk plus the carried-over partial last line).
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// A result of at most this many bytes has its total line count computed even when the
    /// page stops early; a larger one reports its line count only once a read reaches its
    /// end, so a small read of a huge result never scans the whole result.
    pub fn count_all_bytes(&self) -> u64 {
        self.count_all_bytes
    }

    /// The stored text one tool call's result references (`{"$psych_result": ...}` in its
    /// arguments, [`crate::passing`]) may read together, in bytes: the substituted
    /// arguments are held in memory and sent upstream, so this bounds both. Default
    /// [`DEFAULT_MAX_PASSED_BYTES`].
    pub fn max_passed_bytes(&self) -> u64 {
        self.max_passed_bytes
    }
}

/// Builds [`Limits`], starting from the defaults; [`build`](LimitsBuilder::build) checks the
/// bounds against each other. Each setter's meaning is that of the [`Limits`] getter of the
/// same name.
#[derive(Debug, Clone, Default)]
pub struct LimitsBuilder {
    limits: Limits,
}

impl LimitsBuilder {
    /// See [`Limits::default_limit`] (from 1 to `max_limit`).
    pub fn default_limit(mut self, lines: u32) -> Self {
        self.limits.default_limit = lines;
        self
    }

    /// See [`Limits::max_limit`].
    pub fn max_limit(mut self, lines: u32) -> Self {
        self.limits.max_limit = lines;
        self
    }

    /// See [`Limits::max_line_bytes`] (at least twice [`MAX_GREP_BYTES`]).
    pub fn max_line_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_line_bytes = bytes;
        self
    }

    /// See [`Limits::max_page_bytes`] (at least 1).
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_page_bytes = bytes;
        self
    }

    /// See [`Limits::chunk_bytes`] (at least 1).
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.limits.chunk_bytes = bytes;
        self
    }

    /// See [`Limits::count_all_bytes`].
    pub fn count_all_bytes(mut self, bytes: u64) -> Self {
        self.limits.count_all_bytes = bytes;
        self
    }

    /// See [`Limits::max_passed_bytes`] (0 refuses every reference).
    pub fn max_passed_bytes(mut self, bytes: u64) -> Self {
        self.limits.max_passed_bytes = bytes;
        self
    }

    /// The limits, once their bounds hold together.
    ///
    /// # Errors
    ///
    /// [`LimitsError`] naming the first bound that does not hold.
    pub fn build(self) -> Result<Limits, LimitsError> {
        let limits = self.limits;
        if limits.default_limit == 0 || limits.default_limit > limits.max_limit {
            return Err(LimitsError::DefaultLimit {
                default_limit: limits.default_limit,
                max_limit: limits.max_limit,
            });
        }
        if limits.max_line_bytes < MIN_LINE_BYTES {
            return Err(LimitsError::LineBytes(limits.max_line_bytes));
        }
        if limits.max_page_bytes == 0 {
            return Err(LimitsError::Zero("max_page_bytes"));
        }
        if limits.chunk_bytes == 0 {
            return Err(LimitsError::Zero("chunk_bytes"));
        }
        Ok(limits)
    }
}

/// Why a [`Limits`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// `default_limit` is 0 or larger than `max_limit`.
    #[error("default_limit {default_limit} must be from 1 to max_limit ({max_limit})")]
    DefaultLimit {
        /// The refused default.
        default_limit: u32,
        /// The maximum it must not exceed.
        max_limit: u32,
    },
    /// `max_line_bytes` is under the minimum, which leaves room for a whole `grep` match and
    /// the text around it.
    #[error("max_line_bytes {0} is under the minimum {MIN_LINE_BYTES}")]
    LineBytes(usize),
    /// `max_page_bytes` or `chunk_bytes` is 0.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

/// The default of [`Limits::max_passed_bytes`]: 16 MiB.
pub const DEFAULT_MAX_PASSED_BYTES: u64 = 16 << 20;

/// The smallest `max_line_bytes`: twice the longest `grep` string.
pub(crate) const MIN_LINE_BYTES: usize = 2 * MAX_GREP_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::builder().build(), Ok(Limits::default()));
    }

    #[test]
    fn inconsistent_limits_are_refused() {
        assert!(matches!(
            Limits::builder().default_limit(0).build(),
            Err(LimitsError::DefaultLimit { .. })
        ));
        assert!(
            Limits::builder()
                .default_limit(5)
                .max_limit(4)
                .build()
                .is_err()
        );
        assert_eq!(
            Limits::builder().max_line_bytes(100).build(),
            Err(LimitsError::LineBytes(100))
        );
        assert_eq!(
            Limits::builder().max_page_bytes(0).build(),
            Err(LimitsError::Zero("max_page_bytes"))
        );
        assert_eq!(
            Limits::builder()
                .chunk_bytes(0)
                .build()
                .unwrap_err()
                .to_string(),
            "chunk_bytes must be at least 1"
        );
    }

    #[test]
    fn every_setter_reaches_its_getter() {
        let limits = Limits::builder()
            .default_limit(3)
            .max_limit(7)
            .max_line_bytes(MIN_LINE_BYTES)
            .max_page_bytes(11)
            .chunk_bytes(13)
            .count_all_bytes(17)
            .max_passed_bytes(19)
            .build()
            .unwrap();
        assert_eq!(
            (
                limits.default_limit(),
                limits.max_limit(),
                limits.max_line_bytes(),
                limits.max_page_bytes(),
                limits.chunk_bytes(),
                limits.count_all_bytes(),
                limits.max_passed_bytes()
            ),
            (3, 7, MIN_LINE_BYTES, 11, 13, 17, 19)
        );
    }
}
