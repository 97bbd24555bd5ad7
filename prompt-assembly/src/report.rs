//! The cache report: for a sequence of requests, how many bytes of each one are a prefix it
//! shares with the one before, which is what a provider's prompt cache can reuse.

use std::fmt;

use crate::{Part, RenderedRequest};

/// One request's line of a [`CacheReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRow {
    /// Length of the request's cache stream.
    pub bytes: usize,
    /// Length of the byte prefix it shares with the previous request's cacheable prefix
    /// (0 for the first request).
    pub reused: usize,
    /// The part of this request where the first new byte falls, if any.
    pub first_change: Option<Part>,
}

impl CacheRow {
    /// `reused / bytes`, 0 for an empty request.
    pub fn reused_share(&self) -> f64 {
        ratio(self.reused, self.bytes)
    }
}

/// What a sequence of requests costs in cache terms.
///
/// Each request is compared with the one before: the reused bytes are the longest common
/// prefix of the previous request's cacheable prefix (its cache stream without the
/// transient message, which is never cached) and this request's cache stream. Bytes are a
/// proxy: providers cache whole blocks (Anthropic) or token runs (OpenAI), and only above a
/// minimum length, so this is what an assembly makes reusable, not a bill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheReport {
    rows: Vec<CacheRow>,
}

impl CacheReport {
    /// The report for `requests`, in the order they were sent.
    pub fn new(requests: &[RenderedRequest]) -> Self {
        let mut rows = Vec::with_capacity(requests.len());
        let mut previous: Option<String> = None;
        for request in requests {
            let stream = request.cache_stream();
            let reused = previous.as_deref().map_or(0, |prev| {
                prev.bytes()
                    .zip(stream.bytes())
                    .take_while(|(a, b)| a == b)
                    .count()
            });
            let first_change = (reused < stream.len())
                .then(|| request.part_at(reused).map(|span| span.part.clone()))
                .flatten();
            rows.push(CacheRow {
                bytes: stream.len(),
                reused,
                first_change,
            });
            let mut cacheable = stream.into_owned();
            cacheable.truncate(request.cacheable_len());
            previous = Some(cacheable);
        }
        Self { rows }
    }

    /// One row per request.
    pub fn rows(&self) -> &[CacheRow] {
        &self.rows
    }

    /// Total bytes of all requests.
    pub fn total_bytes(&self) -> usize {
        self.rows.iter().map(|row| row.bytes).sum()
    }

    /// Total reused bytes.
    pub fn reused_bytes(&self) -> usize {
        self.rows.iter().map(|row| row.reused).sum()
    }

    /// Share of all request bytes that are a reused prefix.
    pub fn reused_share(&self) -> f64 {
        ratio(self.reused_bytes(), self.total_bytes())
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn part_name(part: &Part) -> &'static str {
    match part {
        Part::Preamble => "preamble",
        Part::Tools => "tools",
        Part::StaticSystem => "zone 1",
        Part::DynamicSystem => "zone 2",
        Part::Message { .. } => "history",
        Part::Transient => "transient",
    }
}

impl fmt::Display for CacheReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "request      bytes     reused   share  first new byte in"
        )?;
        for (i, row) in self.rows.iter().enumerate() {
            writeln!(
                f,
                "{:>7} {:>10} {:>10} {:>6.1}%  {}",
                i + 1,
                row.bytes,
                row.reused,
                row.reused_share() * 100.0,
                row.first_change.as_ref().map_or("-", part_name)
            )?;
        }
        write!(
            f,
            "  total {:>10} {:>10} {:>6.1}%",
            self.total_bytes(),
            self.reused_bytes(),
            self.reused_share() * 100.0
        )
    }
}
