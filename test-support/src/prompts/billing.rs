//! A simulator of the prompt cache as the providers bill it, counting tokens through the
//! [`TokenEstimator`] seam.
//!
//! Anthropic (documented rules used: the prompt caching guide, as mirrored at
//! <https://platform.minimaxi.com/docs/api-reference/anthropic-api-compatible-cache> and
//! <https://portkey.ai/docs/integrations/llms/anthropic/prompt-caching>):
//! - the cache order is tools, system, messages; an entry is the prefix up to and including
//!   a block carrying `cache_control`, and entries are written only at those blocks;
//! - each breakpoint looks for an existing entry at its own block and at most 20 block
//!   positions back ("20-block lookback window"), then the next breakpoint is tried;
//! - a prefix shorter than the model's minimum cacheable length (1,024 tokens for
//!   Sonnet-class models, 2,048 or 4,096 for others) is not cached;
//! - cache writes are billed at 1.25× base input, cache reads at 0.1×; what follows the
//!   last breakpoint is billed at 1×.
//!
//! The documentation does not say whether the text blocks nested in a `tool_result` are
//! block positions of their own: [`Reading`] covers both.
//!
//! OpenAI (the prompt caching cookbook,
//! <https://raw.githubusercontent.com/openai/openai-cookbook/main/examples/Prompt_Caching_201.ipynb>):
//! automatic, no breakpoints; the longest prefix of an earlier prompt is reused when the
//! prompt has at least 1,024 tokens, in increments of 128 tokens; no write premium. The
//! read price is a parameter (the cookbook says "up to 90%" off; it is per model).
//!
//! Tokens: each block of the cache stream (and the tail after the last block) is estimated
//! on its own and summed, so a prefix ending at a block has an exact, additive count.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use psych_prompt_assembly::RenderedRequest;
use psych_types::TokenEstimator;

/// How Anthropic's lookback counts block positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Only top-level blocks count: each tool, system block and message content block.
    TopLevel,
    /// The blocks nested in a `tool_result`'s `content` count too, each one position.
    Nested,
}

/// Billing parameters of an Anthropic model.
#[derive(Debug, Clone, Copy)]
pub struct AnthropicModel {
    /// Minimum cacheable prefix, in tokens.
    pub min_tokens: u64,
    /// Block positions the lookback checks, the breakpoint's own included.
    pub window: usize,
    /// How positions are counted.
    pub reading: Reading,
}

impl AnthropicModel {
    /// A model caching prefixes of at least `min_tokens`, its lookback counted as `reading`
    /// says, over Anthropic's documented window.
    pub fn new(min_tokens: u64, reading: Reading) -> Self {
        Self {
            min_tokens,
            window: 20,
            reading,
        }
    }
}

/// Token totals of a sequence of requests, as billed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bill {
    /// All input tokens, as if nothing were cached.
    pub input: u64,
    /// Tokens read from the cache.
    pub read: u64,
    /// Tokens written to the cache (billed at the write price).
    pub written: u64,
    /// Price of a read token, relative to base input.
    pub read_price: f64,
    /// Price of a written token, relative to base input.
    pub write_price: f64,
}

impl Bill {
    fn add(&mut self, other: Self) {
        self.input += other.input;
        self.read += other.read;
        self.written += other.written;
    }

    /// Share of the input tokens read from the cache.
    pub fn read_share(&self) -> f64 {
        if self.input == 0 {
            0.0
        } else {
            self.read as f64 / self.input as f64
        }
    }

    /// Cost relative to sending everything uncached.
    pub fn cost(&self) -> f64 {
        if self.input == 0 {
            return 0.0;
        }
        let plain = self.input - self.read - self.written;
        (self.read as f64 * self.read_price + self.written as f64 * self.write_price + plain as f64)
            / self.input as f64
    }
}

/// One request laid out for the simulator: where its blocks end, cumulative tokens at each
/// block end, the total, each block's nested position and a key for each prefix.
pub struct Layout {
    /// The byte offset where each block ends.
    pub ends: Vec<usize>,
    /// Tokens of the prefix ending at each block.
    pub tokens: Vec<u64>,
    /// Tokens of the whole request.
    pub total: u64,
    /// Position of each top-level block under [`Reading::Nested`] (nested blocks of earlier
    /// `tool_result`s counted in).
    pub nested_pos: Vec<usize>,
    /// Blocks of the history (before the transient message).
    pub history_blocks: usize,
    /// A key for the prefix ending at each block: its length and a chained hash.
    keys: Vec<Key>,
}

/// A prefix's identity: its length in bytes and a hash chained block by block.
type Key = (usize, u64);

impl Layout {
    /// `request` laid out, its tokens counted by `estimator`.
    pub fn new(request: &RenderedRequest, estimator: &dyn TokenEstimator) -> Self {
        let history_blocks = request
            .block_ends()
            .iter()
            .take_while(|&&end| end <= request.cacheable_len())
            .count();
        Self::from_parts(
            request.cache_stream().into_owned(),
            request.block_ends().to_vec(),
            &nested_counts(request.body()),
            history_blocks,
            estimator,
        )
    }

    /// A layout from its parts: the stream, where each block ends, how many blocks each
    /// one nests, and how many blocks are history.
    pub fn from_parts(
        stream: String,
        ends: Vec<usize>,
        nested: &[usize],
        history_blocks: usize,
        estimator: &dyn TokenEstimator,
    ) -> Self {
        assert_eq!(nested.len(), ends.len(), "one count per block");
        let mut tokens = Vec::with_capacity(ends.len());
        let mut at = 0;
        let mut sum = 0u64;
        for &end in &ends {
            sum += estimator.estimate_text(&stream[at..end]);
            tokens.push(sum);
            at = end;
        }
        let total = sum + estimator.estimate_text(&stream[at..]);
        let mut nested_pos = Vec::with_capacity(ends.len());
        let mut pos = 0;
        for n in nested {
            nested_pos.push(pos);
            pos += 1 + n;
        }
        let mut keys = Vec::with_capacity(ends.len());
        let mut at = 0;
        let mut chained = 0u64;
        for &end in &ends {
            let mut hasher = DefaultHasher::new();
            chained.hash(&mut hasher);
            stream[at..end].hash(&mut hasher);
            chained = hasher.finish();
            keys.push((end, chained));
            at = end;
        }
        Self {
            ends,
            tokens,
            total,
            nested_pos,
            history_blocks,
            keys,
        }
    }

    fn position(&self, block: usize, reading: Reading) -> usize {
        match reading {
            Reading::TopLevel => block,
            Reading::Nested => self.nested_pos[block],
        }
    }

    fn prefix(&self, block: usize) -> Key {
        self.keys[block]
    }
}

/// For each top-level block of an Anthropic body, in order, how many blocks are nested in
/// it (the `content` of a `tool_result`; 0 for every other block).
pub fn nested_counts(body: &str) -> Vec<usize> {
    let value: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    let mut counts = Vec::new();
    for key in ["tools", "system"] {
        if let Some(items) = value.get(key).and_then(|v| v.as_array()) {
            counts.extend(std::iter::repeat_n(0, items.len()));
        }
    }
    for message in value["messages"].as_array().expect("messages") {
        for block in message["content"].as_array().expect("content blocks") {
            counts.push(
                block
                    .get("content")
                    .and_then(|c| c.as_array())
                    .map_or(0, Vec::len),
            );
        }
    }
    counts
}

/// Anthropic's cache, replayed over requests in order.
pub struct AnthropicCache {
    model: AnthropicModel,
    entries: HashSet<Key>,
}

impl AnthropicCache {
    /// An empty cache of `model`.
    pub fn new(model: AnthropicModel) -> Self {
        Self {
            model,
            entries: HashSet::new(),
        }
    }

    /// The longest cached prefix (block index) the lookback from `breakpoints` finds.
    pub fn lookup(&self, layout: &Layout, breakpoints: &[usize]) -> Option<usize> {
        self.lookup_with(layout, breakpoints, &[])
    }

    /// [`AnthropicCache::lookup`] as if the entries `extra` were written too.
    fn lookup_with(&self, layout: &Layout, breakpoints: &[usize], extra: &[Key]) -> Option<usize> {
        let reading = self.model.reading;
        breakpoints
            .iter()
            .filter_map(|&q| {
                let top = layout.position(q, reading);
                (0..=q)
                    .rev()
                    .take_while(|&j| top - layout.position(j, reading) < self.model.window)
                    .find(|&j| {
                        let prefix = layout.prefix(j);
                        self.entries.contains(&prefix) || extra.contains(&prefix)
                    })
            })
            .max()
    }

    /// Bills one request with breakpoints on `breakpoints` (block indices) and writes its
    /// entries.
    pub fn send(&mut self, layout: &Layout, breakpoints: &[usize]) -> Bill {
        let read = self
            .lookup(layout, breakpoints)
            .map_or(0, |j| layout.tokens[j]);
        let mut written_to = read;
        for &q in breakpoints {
            if layout.tokens[q] >= self.model.min_tokens {
                written_to = written_to.max(layout.tokens[q]);
                self.entries.insert(layout.prefix(q));
            }
        }
        Bill {
            input: layout.total,
            read,
            written: written_to - read,
            read_price: 0.1,
            write_price: 1.25,
        }
    }
}

/// Bills `requests` under Anthropic's rules with the breakpoints each carries.
pub fn anthropic_bill(
    requests: &[&RenderedRequest],
    estimator: &dyn TokenEstimator,
    model: AnthropicModel,
) -> Bill {
    let layouts: Vec<Layout> = requests.iter().map(|r| Layout::new(r, estimator)).collect();
    let placements: Vec<Vec<usize>> = requests
        .iter()
        .map(|r| r.breakpoint_blocks().to_vec())
        .collect();
    bill_placements(&layouts, &placements, model)
}

/// Bills laid-out requests with the given breakpoints.
pub fn bill_placements(
    layouts: &[Layout],
    placements: &[Vec<usize>],
    model: AnthropicModel,
) -> Bill {
    let mut cache = AnthropicCache::new(model);
    let mut bill = Bill {
        read_price: 0.1,
        write_price: 1.25,
        ..Bill::default()
    };
    for (layout, breakpoints) in layouts.iter().zip(placements) {
        bill.add(cache.send(layout, breakpoints));
    }
    bill
}

/// A search for a good placement of at most four breakpoints per request, request by
/// request: every set of up to four among the candidate blocks (the last block whose prefix
/// an earlier request had, the last block the next request shares, the last history block,
/// the first block over the minimum) is tried, and the set that saves most on this request
/// plus the next one's best reply is kept. Greedy with one request of lookahead, so it is a
/// strong placement, not a proof of the optimum.
pub fn searched_bill(layouts: &[Layout], model: AnthropicModel) -> Bill {
    let mut cache = AnthropicCache::new(model);
    let mut bill = Bill {
        read_price: 0.1,
        write_price: 1.25,
        ..Bill::default()
    };
    let mut seen: HashSet<Key> = HashSet::new();
    for (k, layout) in layouts.iter().enumerate() {
        let mine = candidates(layout, &seen, layouts.get(k + 1), model);
        let mut best: Option<(f64, Vec<usize>)> = None;
        let next_candidates = layouts
            .get(k + 1)
            .map(|next| candidates(next, &seen, Some(layout), model));
        for set in subsets(&mine, 4) {
            let read = cache.lookup(layout, &set).map_or(0, |j| layout.tokens[j]);
            let new: Vec<Key> = set
                .iter()
                .filter(|&&q| layout.tokens[q] >= model.min_tokens)
                .map(|&q| layout.prefix(q))
                .collect();
            let written_to = set
                .iter()
                .map(|&q| layout.tokens[q])
                .filter(|&t| t >= model.min_tokens)
                .fold(read, u64::max);
            // Saving against no caching, this request and the next one's best reply.
            let mut saving = read as f64 * 0.9 - (written_to - read) as f64 * 0.25;
            if let (Some(next), Some(next_candidates)) = (layouts.get(k + 1), &next_candidates) {
                saving += subsets(next_candidates, 4)
                    .map(|s| {
                        cache
                            .lookup_with(next, &s, &new)
                            .map_or(0, |j| next.tokens[j]) as f64
                            * 0.9
                    })
                    .fold(0.0, f64::max);
            }
            if best.as_ref().is_none_or(|(c, _)| saving > *c) {
                best = Some((saving, set));
            }
        }
        let set = best.map(|(_, s)| s).unwrap_or_default();
        bill.add(cache.send(layout, &set));
        for j in 0..layout.history_blocks {
            seen.insert(layout.prefix(j));
        }
    }
    bill
}

fn candidates(
    layout: &Layout,
    seen: &HashSet<Key>,
    next: Option<&Layout>,
    model: AnthropicModel,
) -> Vec<usize> {
    let n = layout.history_blocks;
    let mut out: Vec<usize> = Vec::new();
    // The last block already seen (a prefix an earlier request had).
    if let Some(j) = (0..n).rev().find(|&j| seen.contains(&layout.prefix(j))) {
        out.push(j);
    }
    // The last block the next request shares.
    if let Some(next) = next
        && let Some(j) = (0..n)
            .rev()
            .find(|&j| next.keys.get(j) == Some(&layout.prefix(j)))
    {
        out.push(j);
    }
    if n > 0 {
        out.push(n - 1);
    }
    // The first block at or over the minimum: the shortest prefix worth an entry.
    if let Some(j) = (0..n).find(|&j| layout.tokens[j] >= model.min_tokens) {
        out.push(j);
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn subsets(items: &[usize], most: usize) -> impl Iterator<Item = Vec<usize>> + '_ {
    (0u32..(1 << items.len()))
        .filter(move |m| m.count_ones() as usize <= most)
        .map(move |m| {
            items
                .iter()
                .enumerate()
                .filter(|(i, _)| m & (1 << i) != 0)
                .map(|(_, &b)| b)
                .collect()
        })
}

/// Bills `requests` under OpenAI's automatic prefix caching (see [`openai_bill_streams`]).
pub fn openai_bill(
    requests: &[&RenderedRequest],
    estimator: &dyn TokenEstimator,
    minimum: u64,
    increment: u64,
    read_price: f64,
) -> Bill {
    let streams: Vec<String> = requests
        .iter()
        .map(|r| r.cache_stream().into_owned())
        .collect();
    openai_bill_streams(&streams, estimator, minimum, increment, read_price)
}

/// Bills prompts under OpenAI's automatic prefix caching: each reads the longest prefix it
/// shares with any earlier prompt, when that is at least `minimum` tokens, rounded down to
/// `minimum` plus a multiple of `increment`.
pub fn openai_bill_streams(
    streams: &[String],
    estimator: &dyn TokenEstimator,
    minimum: u64,
    increment: u64,
    read_price: f64,
) -> Bill {
    let mut bill = Bill {
        read_price,
        write_price: 1.0,
        ..Bill::default()
    };
    for (k, stream) in streams.iter().enumerate() {
        let total = estimator.estimate_text(stream);
        let shared = streams[..k]
            .iter()
            .map(|prev| common_prefix(prev, stream))
            .max()
            .unwrap_or(0);
        let shared_tokens = estimator.estimate_text(&stream[..shared]);
        let read = if shared_tokens >= minimum {
            minimum + (shared_tokens - minimum) / increment * increment
        } else {
            0
        };
        bill.add(Bill {
            input: total,
            read,
            written: 0,
            read_price,
            write_price: 1.0,
        });
    }
    bill
}

/// The longest common prefix of `a` and `b`, in bytes, on a char boundary.
pub fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}
