//! The cache report: for a sequence of requests, how many input tokens of each one the
//! provider's prompt cache reads and writes under its documented rules, estimated through
//! the [`TokenEstimator`] seam.

use std::collections::HashSet;
use std::fmt;

use psych_types::TokenEstimator;

use crate::render::fnv1a;
use crate::{Part, RenderedRequest};

/// How many block positions Anthropic's cache lookup checks from each breakpoint, the
/// breakpoint's own included ("about 20 blocks" in the prompt caching guide).
pub const ANTHROPIC_LOOKBACK: usize = 20;

/// The smallest prefix OpenAI caches, in tokens; longer prefixes are cached in steps of
/// [`OPENAI_CACHE_INCREMENT`] (OpenAI's prompt caching guide).
pub const OPENAI_MIN_CACHED: u64 = 1024;

/// The step, in tokens, in which OpenAI caches prefixes longer than [`OPENAI_MIN_CACHED`].
pub const OPENAI_CACHE_INCREMENT: u64 = 128;

/// How Anthropic's lookback counts block positions. The documentation does not say whether
/// the blocks nested in a `tool_result` (its text and image blocks) are positions of their
/// own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockReading {
    /// Only top-level blocks count: each tool, system block and message content block.
    TopLevel,
    /// The blocks nested in a `tool_result` count too, one position each (see
    /// [`RenderedRequest::nested_blocks`]). The stricter reading: fewer entries in reach.
    Nested,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Entries only at `cache_control` blocks, found by a lookback.
    Breakpoints {
        window: usize,
        reading: BlockReading,
    },
    /// The longest prefix shared with an earlier request, in token steps.
    Automatic { increment: u64 },
}

/// A provider's prompt cache rules, as documented: what it writes, what it reads, and at
/// what price relative to base input tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheRules {
    kind: Kind,
    min_tokens: u64,
    read_price: f64,
    write_price: f64,
}

impl CacheRules {
    /// Anthropic's prompt cache for a model whose minimum cacheable prompt is `min_tokens`
    /// (1,024 for Sonnet-class models, 2,048 or 4,096 for others, per model in the prompt
    /// caching guide): an entry is the prefix up to and including a block carrying
    /// `cache_control`, written only there and only when at least `min_tokens` long; each
    /// breakpoint looks for an entry at its block and [`ANTHROPIC_LOOKBACK`] positions back,
    /// counted under [`BlockReading::Nested`] unless [`CacheRules::reading`] says otherwise;
    /// writes cost 1.25× base input (5-minute entries), reads 0.1×. Entries do not expire
    /// within the report (requests are taken to come within the 5-minute lifetime).
    pub fn anthropic(min_tokens: u64) -> Self {
        Self {
            kind: Kind::Breakpoints {
                window: ANTHROPIC_LOOKBACK,
                reading: BlockReading::Nested,
            },
            min_tokens,
            read_price: 0.1,
            write_price: 1.25,
        }
    }

    /// OpenAI's automatic prefix caching: each request reads the longest prefix of its
    /// cache stream that an earlier request had, when that is at least
    /// [`OPENAI_MIN_CACHED`] tokens, rounded down to it plus a multiple of
    /// [`OPENAI_CACHE_INCREMENT`]; nothing is charged for writing. `read_price` is the
    /// model's cached-input price relative to its input price (it differs per model: 0.25
    /// for gpt-4.1, 0.1 for the gpt-5 family, per OpenAI's price list).
    pub fn openai(read_price: f64) -> Self {
        Self {
            kind: Kind::Automatic {
                increment: OPENAI_CACHE_INCREMENT,
            },
            min_tokens: OPENAI_MIN_CACHED,
            read_price,
            write_price: 1.0,
        }
    }

    /// The same rules counting Anthropic's lookback positions under `reading` (no effect on
    /// OpenAI's rules, which have no breakpoints).
    #[must_use]
    pub fn reading(mut self, reading: BlockReading) -> Self {
        if let Kind::Breakpoints { reading: r, .. } = &mut self.kind {
            *r = reading;
        }
        self
    }

    /// The minimum cacheable prefix, in tokens.
    pub fn min_tokens(&self) -> u64 {
        self.min_tokens
    }
}

/// One request's line of a [`CacheReport`]. Token counts are estimates (the estimator
/// given to [`CacheReport::new`]), never billed numbers: the bill comes from the usage the
/// provider reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRow {
    /// Length of the request's cache stream, in bytes.
    pub bytes: usize,
    /// Estimated input tokens of the request.
    pub tokens: u64,
    /// Estimated tokens read from the cache.
    pub read: u64,
    /// Estimated tokens written to the cache (billed at the write price; 0 for OpenAI).
    pub written: u64,
    /// The part of this request where the first byte differing from the previous request's
    /// cacheable prefix falls, if any.
    pub first_change: Option<Part>,
}

impl CacheRow {
    /// `read / tokens`, 0 for an empty request.
    pub fn read_share(&self) -> f64 {
        ratio(self.read, self.tokens)
    }
}

/// What a sequence of requests costs in cache terms, in estimated tokens, as the provider
/// bills it under [`CacheRules`].
///
/// Tokens are estimated block by block over each request's cache stream (each block of
/// [`RenderedRequest::block_ends`], then the rest), so a prefix ending at a block has an
/// additive count; OpenAI's rules estimate the whole stream and the shared prefix. A cache
/// entry is identified by its length and a hash chained block by block (FNV-1a, 64 bits).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheReport {
    rules: CacheRules,
    rows: Vec<CacheRow>,
}

/// A prefix's identity: its length in bytes and a hash chained block by block.
type Key = (usize, u64);

impl CacheReport {
    /// The report for `requests`, in the order they were sent, under `rules`, with tokens
    /// counted by `estimator`.
    pub fn new(
        requests: &[RenderedRequest],
        estimator: &dyn TokenEstimator,
        rules: CacheRules,
    ) -> Self {
        let mut rows = Vec::with_capacity(requests.len());
        let mut previous: Option<String> = None;
        let mut entries: HashSet<Key> = HashSet::new();
        let mut streams: Vec<String> = Vec::new();
        for request in requests {
            let stream = request.cache_stream().into_owned();
            let reused = previous
                .as_deref()
                .map_or(0, |prev| common_prefix(prev, &stream));
            let first_change = (reused < stream.len())
                .then(|| request.part_at(reused).map(|span| span.part.clone()))
                .flatten();
            let (tokens, read, written) = match rules.kind {
                Kind::Breakpoints { window, reading } => {
                    let layout = Layout::new(request, &stream, estimator);
                    let read = layout
                        .lookup(&entries, request.breakpoint_blocks(), window, reading)
                        .map_or(0, |j| layout.tokens[j]);
                    let mut written_to = read;
                    for &q in request.breakpoint_blocks() {
                        if let (Some(&t), Some(&key)) = (layout.tokens.get(q), layout.keys.get(q))
                            && t >= rules.min_tokens
                        {
                            written_to = written_to.max(t);
                            entries.insert(key);
                        }
                    }
                    (layout.total, read, written_to - read)
                }
                Kind::Automatic { increment } => {
                    let total = estimator.estimate_text(&stream);
                    let shared = streams
                        .iter()
                        .map(|prev| common_prefix(prev, &stream))
                        .max()
                        .unwrap_or(0);
                    let shared_tokens = estimator.estimate_text(&stream[..shared]);
                    let read = if shared_tokens >= rules.min_tokens && increment > 0 {
                        rules.min_tokens
                            + (shared_tokens - rules.min_tokens) / increment * increment
                    } else {
                        0
                    };
                    (total, read.min(total), 0)
                }
            };
            rows.push(CacheRow {
                bytes: stream.len(),
                tokens,
                read,
                written,
                first_change,
            });
            let mut cacheable = stream.clone();
            cacheable.truncate(request.cacheable_len());
            previous = Some(cacheable);
            if matches!(rules.kind, Kind::Automatic { .. }) {
                streams.push(stream);
            }
        }
        Self { rules, rows }
    }

    /// One row per request.
    pub fn rows(&self) -> &[CacheRow] {
        &self.rows
    }

    /// The rules the report applies.
    pub fn rules(&self) -> &CacheRules {
        &self.rules
    }

    /// Estimated input tokens of all requests.
    pub fn total_tokens(&self) -> u64 {
        self.rows.iter().map(|row| row.tokens).sum()
    }

    /// Estimated tokens read from the cache.
    pub fn read_tokens(&self) -> u64 {
        self.rows.iter().map(|row| row.read).sum()
    }

    /// Estimated tokens written to the cache.
    pub fn written_tokens(&self) -> u64 {
        self.rows.iter().map(|row| row.written).sum()
    }

    /// Share of all input tokens read from the cache.
    pub fn read_share(&self) -> f64 {
        ratio(self.read_tokens(), self.total_tokens())
    }

    /// The estimated input cost relative to sending every request uncached: reads at the
    /// read price, writes at the write price, the rest at 1×.
    pub fn cost(&self) -> f64 {
        let input = self.total_tokens();
        if input == 0 {
            return 0.0;
        }
        let (read, written) = (self.read_tokens(), self.written_tokens());
        let plain = input.saturating_sub(read).saturating_sub(written);
        (read as f64 * self.rules.read_price
            + written as f64 * self.rules.write_price
            + plain as f64)
            / input as f64
    }
}

/// One request's blocks: cumulative estimated tokens and prefix keys at each block end.
struct Layout {
    tokens: Vec<u64>,
    keys: Vec<Key>,
    /// Position of each block under [`BlockReading::Nested`].
    nested_pos: Vec<usize>,
    total: u64,
}

impl Layout {
    fn new(request: &RenderedRequest, stream: &str, estimator: &dyn TokenEstimator) -> Self {
        let ends = request.block_ends();
        let tokens = prefix_tokens(request, stream, estimator);
        let mut keys = Vec::with_capacity(ends.len());
        let mut nested_pos = Vec::with_capacity(ends.len());
        let (mut at, mut chained, mut pos) = (0, 0u64, 0usize);
        for (i, &end) in ends.iter().enumerate() {
            let block = stream.get(at..end).unwrap_or_default();
            chained = fnv1a(block.as_bytes(), chained);
            keys.push((end, chained));
            nested_pos.push(pos);
            pos += 1 + request.nested_blocks().get(i).copied().unwrap_or(0);
            at = end;
        }
        let total = tokens.last().copied().unwrap_or(0)
            + estimator.estimate_text(stream.get(at..).unwrap_or_default());
        Self {
            tokens,
            keys,
            nested_pos,
            total,
        }
    }

    fn position(&self, block: usize, reading: BlockReading) -> usize {
        match reading {
            BlockReading::TopLevel => block,
            BlockReading::Nested => self.nested_pos[block],
        }
    }

    /// The longest cached prefix (a block index) the lookback from `breakpoints` finds.
    fn lookup(
        &self,
        entries: &HashSet<Key>,
        breakpoints: &[usize],
        window: usize,
        reading: BlockReading,
    ) -> Option<usize> {
        breakpoints
            .iter()
            .filter(|&&q| q < self.keys.len())
            .filter_map(|&q| {
                let top = self.position(q, reading);
                (0..=q)
                    .rev()
                    .take_while(|&j| top - self.position(j, reading) < window)
                    .find(|&j| entries.contains(&self.keys[j]))
            })
            .max()
    }
}

/// The estimated tokens of `stream` (`request`'s cache stream) up to each block end, as
/// the cache report and [`Prompt::render_anthropic_sized`](crate::Prompt::render_anthropic_sized)
/// count them: block by block.
pub(crate) fn prefix_tokens(
    request: &RenderedRequest,
    stream: &str,
    estimator: &dyn TokenEstimator,
) -> Vec<u64> {
    let (mut at, mut sum) = (0, 0u64);
    request
        .block_ends()
        .iter()
        .map(|&end| {
            sum += estimator.estimate_text(stream.get(at..end).unwrap_or_default());
            at = end;
            sum
        })
        .collect()
}

/// The longest common prefix of `a` and `b`, in bytes, on a char boundary of `b`.
fn common_prefix(a: &str, b: &str) -> usize {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let len = x.len().min(y.len());
    // Whole chunks first (slice equality is a memcmp), then byte by byte.
    let mut n = 0;
    while n + 256 <= len && x[n..n + 256] == y[n..n + 256] {
        n += 256;
    }
    while n < len && x[n] == y[n] {
        n += 1;
    }
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

fn ratio(part: u64, whole: u64) -> f64 {
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
            "estimated tokens (not a bill: cost comes from provider usage)"
        )?;
        writeln!(
            f,
            "request     tokens       read    written   read  first new byte in"
        )?;
        for (i, row) in self.rows.iter().enumerate() {
            writeln!(
                f,
                "{:>7} {:>10} {:>10} {:>10} {:>5.1}%  {}",
                i + 1,
                row.tokens,
                row.read,
                row.written,
                row.read_share() * 100.0,
                row.first_change.as_ref().map_or("-", part_name)
            )?;
        }
        write!(
            f,
            "  total {:>10} {:>10} {:>10} {:>5.1}%  cost {:.3}x of no caching",
            self.total_tokens(),
            self.read_tokens(),
            self.written_tokens(),
            self.read_share() * 100.0,
            self.cost()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_stops_on_a_char_boundary() {
        assert_eq!(common_prefix("abcé", "abcè"), 3);
        assert_eq!(common_prefix("abc", "abc"), 3);
        assert_eq!(common_prefix("", "x"), 0);
    }

    #[test]
    fn rules_keep_their_documented_numbers() {
        let a = CacheRules::anthropic(4096);
        assert_eq!(a.min_tokens(), 4096);
        assert_eq!(
            a.kind,
            Kind::Breakpoints {
                window: 20,
                reading: BlockReading::Nested
            }
        );
        let top = a.reading(BlockReading::TopLevel);
        assert_eq!(
            top.kind,
            Kind::Breakpoints {
                window: 20,
                reading: BlockReading::TopLevel
            }
        );
        let o = CacheRules::openai(0.25).reading(BlockReading::TopLevel);
        assert_eq!(o.kind, Kind::Automatic { increment: 128 });
        assert_eq!(o.min_tokens(), 1024);
    }
}
