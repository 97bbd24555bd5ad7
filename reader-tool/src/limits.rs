//! The bounds of one reader: page sizes, the long-line cap, the read chunk.

/// The longest `grep` string accepted, in bytes.
pub const MAX_GREP_BYTES: usize = 256;

/// The bounds a [`Reader`](crate::Reader) works within.
///
/// The defaults suit a model's context: 200 lines a page by default, at most 1,000, lines cut
/// at 2,000 bytes, a page closed once it shows 64 KiB, and line counts completed for results
/// up to 1 MiB. The source is read 256 KiB at a time, so that a chunk stays in a core's L2
/// cache while it is searched and its lines counted (measured a few percent faster than
/// 1 MiB on the grep benchmark). Checked by [`Limits::validate`] when a reader is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Lines returned when the model gives no `limit`.
    pub default_limit: u32,
    /// The largest `limit` accepted; a larger one is a validation error.
    pub max_limit: u32,
    /// Bytes of one line shown at most; the rest of a longer line is cut and the cut marked
    /// with the number of bytes left out.
    pub max_line_bytes: usize,
    /// A page is closed (with "more follows") once the bytes it shows reach this; it always
    /// holds at least one line, so a page shows at most this plus one line.
    pub max_page_bytes: usize,
    /// Bytes asked of the source per read while scanning. The scan buffer holds at most
    /// twice this (a chunk plus the carried-over partial last line).
    pub chunk_bytes: usize,
    /// A result of at most this many bytes has its total line count computed even when the
    /// page stops early; a larger one reports its line count only once a read reaches its end,
    /// so a small read of a huge result never scans the whole result.
    pub count_all_bytes: u64,
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
        }
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

/// The smallest `max_line_bytes`: twice the longest `grep` string.
pub(crate) const MIN_LINE_BYTES: usize = 2 * MAX_GREP_BYTES;

impl Limits {
    /// Checks the bounds against each other.
    ///
    /// # Errors
    ///
    /// [`LimitsError`] naming the first bound that does not hold.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.default_limit == 0 || self.default_limit > self.max_limit {
            return Err(LimitsError::DefaultLimit {
                default_limit: self.default_limit,
                max_limit: self.max_limit,
            });
        }
        if self.max_line_bytes < MIN_LINE_BYTES {
            return Err(LimitsError::LineBytes(self.max_line_bytes));
        }
        if self.max_page_bytes == 0 {
            return Err(LimitsError::Zero("max_page_bytes"));
        }
        if self.chunk_bytes == 0 {
            return Err(LimitsError::Zero("chunk_bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn inconsistent_limits_are_refused() {
        let zero_default = Limits {
            default_limit: 0,
            ..Limits::default()
        };
        assert!(matches!(
            zero_default.validate(),
            Err(LimitsError::DefaultLimit { .. })
        ));
        let over = Limits {
            default_limit: 5,
            max_limit: 4,
            ..Limits::default()
        };
        assert!(over.validate().is_err());
        let short_lines = Limits {
            max_line_bytes: 100,
            ..Limits::default()
        };
        assert_eq!(short_lines.validate(), Err(LimitsError::LineBytes(100)));
        let no_chunk = Limits {
            chunk_bytes: 0,
            ..Limits::default()
        };
        assert_eq!(
            no_chunk.validate().unwrap_err().to_string(),
            "chunk_bytes must be at least 1"
        );
    }
}
