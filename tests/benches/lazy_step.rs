//! One step's assembly from the record log's lazy history, for a 1,000-record history
//! whose ten earlier results are 2 KB each against the same history with ten 256 MiB
//! results (2.5 GiB in the log), side by side in one group. Goal: at most 1.2x.
//!
//! The two logs are written once under `target/bench-data/lazy-history/` (the large one
//! takes a while the first time) and reused. Run with
//! `cargo bench -p psych-tests --bench lazy_step -- --warm-up-time 1 --measurement-time 3`.
//! Peak memory of the step: `cargo run --release -p psych-tests --example lazy_step_rss`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    reason = "a benchmark fails loudly on bad data; its support module is shared"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

#[path = "support/lazy_data.rs"]
mod lazy_data;

fn one_step(c: &mut Criterion) {
    let small = lazy_data::log("lazy-small", lazy_data::SMALL);
    let large = lazy_data::log("lazy-large", lazy_data::LARGE);
    let fixed = lazy_data::Fixed::new();
    assert!(large.size_bytes() > 10 * lazy_data::LARGE as u64);
    let mut group = c.benchmark_group("one_step_1000_records");
    group.bench_function("ten_results_of_2KB", |b| {
        b.iter(|| black_box(fixed.step(black_box(&small))))
    });
    group.bench_function("ten_results_of_256MiB", |b| {
        b.iter(|| black_box(fixed.step(black_box(&large))))
    });
    group.finish();
}

criterion_group!(benches, one_step);
criterion_main!(benches);
