//! The estimator's accuracy against o200k_base (tiktoken-rs), per content type.
//!
//! - On the held-out half of `tests/corpus/text` (sources the weights were never fitted
//!   on; see the README there), at least 40 content types and 10 scripts: the mean error
//!   of estimate/o200k over the types is at most 8%, no type is off by more than 25%, no
//!   type is underestimated by more than 15%, and 95% of the 4 KiB slices are within 30%.
//! - On the original corpus (fitted on: the content tool results carry most, JSON, prose,
//!   code, CJK, base64), beside `bytes / 4` and cl100k_base: mean error at most 10%, no
//!   type worse than 35%.
//!
//! Run `cargo test -p psych-elision --test it accuracy -- --nocapture` to see the tables;
//! `cargo run --release -p psych-elision --example fit_estimator` prints the fitting
//! half's too, and re-fits.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::corpus;

use psych_elision::Estimator;
use psych_types::TokenEstimator;

struct Row {
    kind: String,
    bytes: u64,
    o200k: u64,
    cl100k: u64,
    estimate: u64,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.estimate as f64 / self.o200k as f64
    }
    fn quarter_ratio(&self) -> f64 {
        self.bytes as f64 / 4.0 / self.o200k as f64
    }
}

fn measure() -> Vec<Row> {
    let o200k = tiktoken_rs::o200k_base().expect("o200k_base ranks ship inside tiktoken-rs");
    let cl100k = tiktoken_rs::cl100k_base().expect("cl100k_base ranks ship inside tiktoken-rs");
    let estimator = Estimator::new();
    corpus::corpora()
        .into_iter()
        .map(|corpus| {
            let mut row = Row {
                kind: corpus.kind,
                bytes: 0,
                o200k: 0,
                cl100k: 0,
                estimate: 0,
            };
            for doc in &corpus.docs {
                row.bytes += doc.len() as u64;
                row.o200k += o200k.encode_ordinary(doc).len() as u64;
                row.cl100k += cl100k.encode_ordinary(doc).len() as u64;
                row.estimate += estimator.estimate_text(doc);
            }
            assert!(row.o200k > 100, "{}: corpus too small to measure", row.kind);
            row
        })
        .collect()
}

#[test]
fn estimator_is_within_target_of_o200k_on_every_content_type() {
    let rows = measure();
    println!(
        "| content type | bytes | o200k | cl100k | estimate / o200k | bytes/4 / o200k | estimate / cl100k |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} |",
            row.kind,
            row.bytes,
            row.o200k,
            row.cl100k,
            row.ratio(),
            row.quarter_ratio(),
            row.estimate as f64 / row.cl100k as f64,
        );
    }
    let error = |ratio: f64| (ratio - 1.0).abs();
    let mean = rows.iter().map(|r| error(r.ratio())).sum::<f64>() / rows.len() as f64;
    let worst = rows.iter().map(|r| error(r.ratio())).fold(0.0, f64::max);
    let quarter_mean =
        rows.iter().map(|r| error(r.quarter_ratio())).sum::<f64>() / rows.len() as f64;
    let quarter_worst = rows
        .iter()
        .map(|r| error(r.quarter_ratio()))
        .fold(0.0, f64::max);
    println!(
        "mean error {:.1}% (bytes/4: {:.1}%), worst {:.1}% (bytes/4: {:.1}%)",
        mean * 100.0,
        quarter_mean * 100.0,
        worst * 100.0,
        quarter_worst * 100.0
    );
    assert!(mean <= 0.10, "mean error {mean:.3} over 10%");
    assert!(worst <= 0.35, "worst error {worst:.3} over 35%");
    assert!(mean < quarter_mean, "no better than bytes/4");
}

/// A held-out content type, measured.
struct HeldRow {
    kind: String,
    bytes: u64,
    o200k: u64,
    estimate: u64,
    /// estimate/o200k of each 4 KiB slice.
    slices: Vec<f64>,
}

#[test]
fn estimator_meets_the_targets_on_content_it_was_not_fitted_to() {
    let o200k = tiktoken_rs::o200k_base().expect("o200k_base ranks ship inside tiktoken-rs");
    let estimator = Estimator::new();
    let rows: Vec<HeldRow> = corpus::texts(corpus::Half::Held)
        .into_iter()
        .map(|corpus| {
            let mut row = HeldRow {
                kind: corpus.kind,
                bytes: 0,
                o200k: 0,
                estimate: 0,
                slices: Vec::new(),
            };
            for doc in &corpus.docs {
                row.bytes += doc.len() as u64;
                row.o200k += o200k.encode_ordinary(doc).len() as u64;
                row.estimate += estimator.estimate_text(doc);
                for slice in corpus::slices(doc, 4096) {
                    let tokens = o200k.encode_ordinary(slice).len() as f64;
                    row.slices
                        .push(estimator.estimate_text(slice) as f64 / tokens);
                }
            }
            assert!(row.o200k > 500, "{}: too small to measure", row.kind);
            row
        })
        .collect();

    println!(
        "| content type (held out) | bytes | o200k | estimate / o200k | bytes/4 / o200k | slices within 30% |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let error = |ratio: f64| (ratio - 1.0).abs();
    for row in &rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {}/{} |",
            row.kind,
            row.bytes,
            row.o200k,
            row.estimate as f64 / row.o200k as f64,
            row.bytes as f64 / 4.0 / row.o200k as f64,
            row.slices.iter().filter(|&&r| error(r) <= 0.30).count(),
            row.slices.len(),
        );
    }
    let ratios: Vec<f64> = rows
        .iter()
        .map(|r| r.estimate as f64 / r.o200k as f64)
        .collect();
    let mean = ratios.iter().map(|&r| error(r)).sum::<f64>() / ratios.len() as f64;
    let quarter_mean = rows
        .iter()
        .map(|r| error(r.bytes as f64 / 4.0 / r.o200k as f64))
        .sum::<f64>()
        / rows.len() as f64;
    let (worst, worst_kind) = rows
        .iter()
        .zip(&ratios)
        .map(|(row, &r)| (error(r), row.kind.as_str()))
        .fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a });
    let (lowest, lowest_kind) = rows
        .iter()
        .zip(&ratios)
        .map(|(row, &r)| (r, row.kind.as_str()))
        .fold((f64::MAX, ""), |a, b| if b.0 < a.0 { b } else { a });
    let slices: Vec<f64> = rows.iter().flat_map(|r| r.slices.iter().copied()).collect();
    let within = slices.iter().filter(|&&r| error(r) <= 0.30).count();
    let share = within as f64 / slices.len() as f64;
    println!(
        "{} types: mean error {:.1}% (bytes/4: {:.1}%), worst {:.1}% ({worst_kind}), lowest ratio {:.3} ({lowest_kind}); 4 KiB slices within 30%: {within}/{} ({:.1}%)",
        rows.len(),
        mean * 100.0,
        quarter_mean * 100.0,
        worst * 100.0,
        lowest,
        slices.len(),
        share * 100.0,
    );

    // The corpus is what the issue asks for: at least 40 types and 10 scripts.
    assert!(rows.len() >= 40, "only {} content types", rows.len());
    let scripts: std::collections::BTreeSet<&str> = corpus::texts(corpus::Half::Held)
        .iter()
        .filter_map(|corpus| main_script(&corpus.docs.concat()))
        .collect();
    println!("scripts: {scripts:?}");
    assert!(
        scripts.len() >= 10,
        "only {} scripts: {scripts:?}",
        scripts.len()
    );
    assert!(slices.len() >= 200, "only {} slices", slices.len());

    assert!(mean <= 0.08, "mean error {mean:.3} over 8%");
    assert!(worst <= 0.25, "{worst_kind}: error {worst:.3} over 25%");
    assert!(
        lowest >= 0.85,
        "{lowest_kind}: underestimated by {:.3}, over 15%",
        1.0 - lowest
    );
    assert!(share >= 0.95, "only {share:.3} of slices within 30%");
    assert!(mean < quarter_mean, "no better than bytes/4");
}

/// The script most of a text's letters are in (ASCII letters are Latin), by Unicode block.
fn main_script(text: &str) -> Option<&'static str> {
    const BLOCKS: [(u32, u32, &str); 27] = [
        (0x41, 0x24f, "Latin"),
        (0x370, 0x3ff, "Greek"),
        (0x400, 0x52f, "Cyrillic"),
        (0x530, 0x58f, "Armenian"),
        (0x590, 0x5ff, "Hebrew"),
        (0x600, 0x6ff, "Arabic"),
        (0x900, 0x97f, "Devanagari"),
        (0x980, 0x9ff, "Bengali"),
        (0xa00, 0xa7f, "Gurmukhi"),
        (0xa80, 0xaff, "Gujarati"),
        (0xb00, 0xb7f, "Oriya"),
        (0xb80, 0xbff, "Tamil"),
        (0xc00, 0xc7f, "Telugu"),
        (0xc80, 0xcff, "Kannada"),
        (0xd00, 0xd7f, "Malayalam"),
        (0xd80, 0xdff, "Sinhala"),
        (0xe00, 0xe7f, "Thai"),
        (0xf00, 0xfff, "Tibetan"),
        (0x1000, 0x109f, "Myanmar"),
        (0x10a0, 0x10ff, "Georgian"),
        (0x1780, 0x17ff, "Khmer"),
        (0x1e00, 0x1eff, "Latin"),
        (0x3040, 0x30ff, "Kana"),
        (0x3400, 0x4dbf, "Han"),
        (0x4e00, 0x9fff, "Han"),
        (0xac00, 0xd7af, "Hangul"),
        (0x1f300, 0x1faff, "Emoji"),
    ];
    let mut counts = std::collections::BTreeMap::new();
    for ch in text
        .chars()
        .filter(|ch| ch.is_alphabetic() || u32::from(*ch) >= 0x1f300)
    {
        let code = u32::from(ch);
        if let Some(&(_, _, name)) = BLOCKS
            .iter()
            .find(|&&(lo, hi, _)| (lo..=hi).contains(&code))
        {
            *counts.entry(name).or_insert(0u64) += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map(|(name, _)| name)
}
