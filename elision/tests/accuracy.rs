//! The estimator's accuracy against real tokenizers, per content type: prints the table
//! (ratio of estimate to o200k_base tokens, beside `bytes / 4` and cl100k_base) and asserts
//! the targets: mean error at most 10% across the types, no type worse than 35%.
//!
//! Run `cargo test -p psych-elision --test accuracy -- --nocapture` to see the table.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod corpus;

use psych_elision::Estimator;
use psych_types::TokenEstimator;

struct Row {
    kind: &'static str,
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
