//! The billing cache simulator (`common::billing`) checked against cases computed by hand,
//! and shown to report a bad figure for an assembly that puts the clock in the system
//! prompt. The figures on the real estimator are in the workspace's `psych-tests` crate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use common::billing::*;
use common::*;
use psych_prompt_assembly::RenderedRequest;
use psych_types::TokenEstimator;

/// One token per byte, so hand computation is byte counting.
struct PerByte;

impl TokenEstimator for PerByte {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len() as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len
    }
}

/// About four bytes a token.
struct Bytes4;

impl TokenEstimator for Bytes4 {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len.div_ceil(3) * 4 / 4
    }
}

/// A request of `blocks` blocks of `size` bytes each (block `i` filled with the letter for
/// `fill[i]`), all history, `nested[i]` blocks nested in block `i`.
fn layout(fill: &[u8], size: usize, nested: &[usize]) -> Layout {
    let mut stream = String::new();
    let mut ends = Vec::new();
    for &c in fill {
        stream.extend(std::iter::repeat_n(c as char, size));
        ends.push(stream.len());
    }
    let nested = if nested.is_empty() {
        vec![0; fill.len()]
    } else {
        nested.to_vec()
    };
    Layout::from_parts(stream, ends, &nested, fill.len(), &PerByte)
}

fn model(min: u64) -> AnthropicModel {
    AnthropicModel::new(min, Reading::TopLevel)
}

#[test]
fn a_repeated_prefix_is_written_once_and_read_after() {
    let a = layout(b"abc", 1000, &[]);
    let b = layout(b"abcd", 1000, &[]);
    let bill = bill_placements(&[a, b], &[vec![2], vec![3]], model(1024));
    // Request 1: 3,000 written. Request 2: 3,000 read, 1,000 more written.
    assert_eq!((bill.input, bill.read, bill.written), (7000, 3000, 4000));
    // (3,000 × 0.1 + 4,000 × 1.25) / 7,000
    assert!((bill.cost() - 5300.0 / 7000.0).abs() < 1e-12);
    assert!((bill.read_share() - 3.0 / 7.0).abs() < 1e-12);
}

#[test]
fn a_prefix_below_the_minimum_is_neither_written_nor_read() {
    let a = layout(b"abc", 300, &[]);
    let b = layout(b"abcd", 300, &[]);
    let bill = bill_placements(&[a, b], &[vec![2], vec![2, 3]], model(1024));
    // 900 tokens < 1,024: nothing is cached; request 2's 1,200 are written.
    assert_eq!((bill.input, bill.read, bill.written), (2100, 0, 1200));
    // The same with a minimum of 4,096: nothing at all, cost 1.
    let a = layout(b"abc", 300, &[]);
    let b = layout(b"abcd", 300, &[]);
    let bill = bill_placements(&[a, b], &[vec![2], vec![2, 3]], model(4096));
    assert_eq!((bill.read, bill.written), (0, 0));
    assert_eq!(bill.cost(), 1.0);
}

#[test]
fn the_lookback_reaches_twenty_positions_and_no_further() {
    // The previous entry ends at block 0; request 2 has its breakpoint 19 blocks later
    // (20 positions counting its own): hit. At 20 blocks later: miss.
    let fill: Vec<u8> = (0..30).map(|i| b'a' + (i % 26) as u8).collect();
    for (last, hit) in [(19, true), (20, false)] {
        let a = layout(&fill[..1], 2000, &[]);
        let b = layout(&fill[..=last], 2000, &[]);
        let bill = bill_placements(&[a, b], &[vec![0], vec![last]], model(1024));
        assert_eq!(bill.read, if hit { 2000 } else { 0 }, "last = {last}");
        // An anchor on block 0 finds it at any distance.
        let a = layout(&fill[..1], 2000, &[]);
        let b = layout(&fill[..=last], 2000, &[]);
        let bill = bill_placements(&[a, b], &[vec![0], vec![0, last]], model(1024));
        assert_eq!(bill.read, 2000);
    }
}

#[test]
fn nested_blocks_count_only_under_the_nested_reading() {
    // Five blocks after the entry, each nesting four: 5 top-level positions, 25 nested.
    let a = layout(b"a", 2000, &[0]);
    let b = layout(b"abcdef", 2000, &[0, 4, 4, 4, 4, 4]);
    let placements = [vec![0], vec![5]];
    let a2 = layout(b"a", 2000, &[0]);
    let b2 = layout(b"abcdef", 2000, &[0, 4, 4, 4, 4, 4]);
    let top = bill_placements(&[a, b], &placements, model(1024));
    let nested = bill_placements(
        &[a2, b2],
        &placements,
        AnthropicModel::new(1024, Reading::Nested),
    );
    assert_eq!(top.read, 2000);
    assert_eq!(nested.read, 0);
}

#[test]
fn the_longest_hit_of_all_breakpoints_is_read() {
    let a = layout(b"abcd", 1000, &[]);
    let b = layout(b"abcdxy", 1000, &[]);
    let bill = bill_placements(&[a, b], &[vec![1, 3], vec![1, 5]], model(1024));
    // Request 1 writes 2,000 and 4,000 (billed once: 4,000). Request 2: its breakpoint on
    // block 5 looks back and finds the 4,000 entry; writes 2,000 more.
    assert_eq!((bill.input, bill.read, bill.written), (10_000, 4000, 6000));
}

#[test]
fn openai_reads_from_the_minimum_in_increments() {
    let streams = vec![
        "a".repeat(3000),
        format!("{}{}", "a".repeat(2000), "b".repeat(1000)),
    ];
    let bill = openai_bill_streams(&streams, &PerByte, 1024, 128, 0.25);
    // 2,000 shared: 1,024 + 7 × 128 = 1,920 read.
    assert_eq!((bill.input, bill.read, bill.written), (6000, 1920, 0));
    assert!((bill.cost() - (6000.0 - 1920.0 * 0.75) / 6000.0).abs() < 1e-12);
    let short = vec!["a".repeat(1000), "a".repeat(1100)];
    assert_eq!(
        openai_bill_streams(&short, &PerByte, 1024, 128, 0.25).read,
        0
    );
}

fn anthropic_of(rendered: &[Rendered]) -> Vec<&RenderedRequest> {
    rendered.iter().map(|r| &r.anthropic).collect()
}

/// The simulator fails a renderer that puts the clock in the system prompt: every request
/// writes its whole prefix and reads nothing but what comes before the clock, so it costs
/// more than not caching at all.
#[test]
fn the_clock_in_the_system_prompt_is_billed_as_a_loss() {
    let session = play(&twenty_turns());
    let ours = render_session(&session, &zone1());
    let clocked = render_naive(&session, true, false);
    for reading in [Reading::TopLevel, Reading::Nested] {
        let model = AnthropicModel::new(1024, reading);
        let good = anthropic_bill(&anthropic_of(&ours), &Bytes4, model);
        let bad = anthropic_bill(&anthropic_of(&clocked), &Bytes4, model);
        assert!(good.read_share() > 0.7, "{reading:?}: {good:?}");
        assert!(good.cost() < 0.4, "{reading:?}: {good:?}");
        assert!(bad.read_share() < 0.05, "{reading:?}: {bad:?}");
        assert!(bad.cost() > 1.0, "{reading:?}: {bad:?}");
    }
}
