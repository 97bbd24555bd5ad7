//! Benchmarks of the estimator and the plan.
//!
//! - `estimator`, one group, every function with byte throughput, so the bytes/s figures
//!   compare directly:
//!   - `u64_word_sum_16MiB`: summing the 16 MiB of mixed content (the accuracy corpus
//!     repeated) as u64 words. It mostly fits in cache, so it is a compute bound;
//!   - `u64_word_sum_256MiB`: the same over 256 MiB, larger than the last-level cache: the
//!     memory-bandwidth bound the "≥ 0.2×" target refers to;
//!   - `estimator_16MiB`: the estimator over the 16 MiB (on a processor with AVX2, its
//!     wide loop, compiled for AVX2);
//!   - `estimator_16MiB_narrow`: its narrow loop, compiled for the baseline (SSE2 on
//!     x86-64), over the same 16 MiB: what a processor without AVX2 runs;
//!   - `estimator_short_texts` and `estimator_short_texts_narrow`: both loops over 1,000
//!     pieces of the mixed content, 40, 100, 300 and 1,000 bytes long in turn, each
//!     estimated alone, as tool names, descriptions and small results are: where the
//!     bytes after the last whole block weigh most;
//!   - `estimator_256KiB` and `tiktoken_o200k_256KiB`: the estimator and tiktoken-rs
//!     o200k_base on the same 256 KiB slice (tiktoken is too slow for 16 MiB);
//!   - `estimator_multilingual`: the estimator over the committed corpus of
//!     `tests/corpus/text` (both halves, 3 MB: 40 languages in 24 scripts and tool
//!     output), where most blocks hold non-ASCII bytes and so pay for the script terms.
//! - `plan`: the batch plan over 1,000 results of mixed sizes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

#[path = "../src/estimate.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the benchmark times the narrow loop alone"
)]
mod estimate;

#[path = "../tests/corpus/mod.rs"]
#[allow(dead_code, reason = "the benchmark uses part of the corpus module")]
mod corpus;

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use psych_elision::{Estimator, Thresholds, plan};

const MIXED_BYTES: usize = 16 << 20;
const LARGE_BYTES: usize = 256 << 20;
const TIKTOKEN_BYTES: usize = 256 << 10;

/// 16 MiB of the corpus's documents, interleaved and repeated, cut on a char boundary.
fn mixed() -> String {
    let docs: Vec<String> = corpus::corpora().into_iter().flat_map(|c| c.docs).collect();
    let mut text = String::with_capacity(MIXED_BYTES + (1 << 20));
    while text.len() < MIXED_BYTES {
        for doc in &docs {
            text.push_str(doc);
            text.push('\n');
        }
    }
    let mut end = MIXED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// 1,000 consecutive pieces of `bytes`, 40, 100, 300 and 1,000 bytes long in turn.
fn short_texts(bytes: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::with_capacity(1_000);
    let mut at = 0;
    for len in [40, 100, 300, 1_000].into_iter().cycle().take(1_000) {
        pieces.push(&bytes[at..at + len]);
        at += len;
    }
    pieces
}

fn sum_words(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for chunk in &mut chunks {
        sum = sum.wrapping_add(u64::from_le_bytes(chunk.try_into().unwrap()));
    }
    chunks
        .remainder()
        .iter()
        .fold(sum, |s, &b| s.wrapping_add(u64::from(b)))
}

fn estimator(c: &mut Criterion) {
    let text = mixed();
    let mut slice_end = TIKTOKEN_BYTES;
    while !text.is_char_boundary(slice_end) {
        slice_end -= 1;
    }
    let slice = &text[..slice_end];
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let estimator = Estimator::new();

    let multilingual: String = [corpus::Half::Fit, corpus::Half::Held]
        .into_iter()
        .flat_map(corpus::texts)
        .flat_map(|c| c.docs)
        .collect();

    // 16 copies of the mixed content: every page touched, the same bytes as the 16 MiB.
    let large = text.as_bytes().repeat(LARGE_BYTES / text.len());

    let mut group = c.benchmark_group("estimator");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("u64_word_sum_16MiB", |b| {
        b.iter(|| sum_words(black_box(text.as_bytes())))
    });
    group.throughput(Throughput::Bytes(large.len() as u64));
    group.bench_function("u64_word_sum_256MiB", |b| {
        b.iter(|| sum_words(black_box(&large)))
    });
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("estimator_16MiB", |b| {
        b.iter(|| estimator.estimate_bytes(black_box(text.as_bytes())))
    });
    group.bench_function("estimator_16MiB_narrow", |b| {
        b.iter(|| estimate::weight_narrow(black_box(text.as_bytes())))
    });
    let shorts = short_texts(text.as_bytes());
    group.throughput(Throughput::Bytes(
        shorts.iter().map(|s| s.len() as u64).sum(),
    ));
    group.bench_function("estimator_short_texts", |b| {
        b.iter(|| {
            shorts
                .iter()
                .map(|s| estimator.estimate_bytes(black_box(s)))
                .sum::<u64>()
        })
    });
    group.bench_function("estimator_short_texts_narrow", |b| {
        b.iter(|| {
            shorts
                .iter()
                .map(|s| estimate::weight_narrow(black_box(s)))
                .sum::<u64>()
        })
    });
    group.throughput(Throughput::Bytes(slice.len() as u64));
    group.bench_function("estimator_256KiB", |b| {
        b.iter(|| estimator.estimate_bytes(black_box(slice.as_bytes())))
    });
    group.bench_function("tiktoken_o200k_256KiB", |b| {
        b.iter(|| bpe.encode_ordinary(black_box(slice)).len())
    });
    group.throughput(Throughput::Bytes(multilingual.len() as u64));
    group.bench_function("estimator_multilingual", |b| {
        b.iter(|| estimator.estimate_bytes(black_box(multilingual.as_bytes())))
    });
    group.finish();
}

fn plan_1000(c: &mut Criterion) {
    let mut rng = corpus::Rng(7);
    // Mostly small results, some middling, a few large: the step 3 sort has work to do.
    let sizes: Vec<u64> = (0..1000)
        .map(|_| match rng.below(10) {
            0 => 5_000 + rng.below(50_000),
            1..=3 => 500 + rng.below(4_000),
            _ => rng.below(500),
        })
        .collect();
    let thresholds = Thresholds::builder()
        .per_result(10_000)
        .per_batch(30_000)
        .build()
        .unwrap();
    let mut group = c.benchmark_group("plan");
    group.bench_function("plan_1000_results", |b| {
        b.iter(|| plan(black_box(&sizes), black_box(&thresholds)))
    });
    group.finish();
}

criterion_group!(benches, estimator, plan_1000);
criterion_main!(benches);
