//! The storage bound, measured: the catalogue file's size after the first refresh of a
//! 500-tool server (rows built from the real fixture catalogues) and after 10,000 unchanged
//! refreshes of it, each committed with redb's default `Durability::Immediate`. Prints the
//! sizes every 1,000 refreshes and the time per refresh; fails if the file grew by more than
//! four pages. Its two summary lines start with `figure: `, so `cargo xtask bench` puts them
//! in its report.
//!
//! `cargo bench -p psych-catalog --bench file_size` (a few minutes: one fsync per refresh).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use psych_catalog::Catalog;
use psych_types::ServerId;

const REFRESHES: u32 = 10_000;

/// Whether the command line names a benchmark filter this bench does not match (as in
/// `cargo bench -p psych-catalog -- live_read`), skipping criterion's option values.
fn filtered_out() -> bool {
    const WITH_VALUE: [&str; 8] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--save-baseline",
        "--baseline",
        "--profile-time",
        "--output-format",
        "--color",
    ];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if WITH_VALUE.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') && !"file_size".contains(arg.as_str()) {
            return true;
        }
    }
    false
}

fn main() {
    if filtered_out() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.redb");
    let catalog = Catalog::open(&path).unwrap();
    let server = ServerId::new("five-hundred").unwrap();
    let tools = common::tools(500);
    catalog.refresh(&server, &tools).unwrap();
    let size = || std::fs::metadata(&path).unwrap().len();
    let first = size();
    println!("figure: catalogue file_size after the first refresh of 500 tools: {first} bytes");
    let started = Instant::now();
    for i in 1..=REFRESHES {
        assert!(catalog.refresh(&server, &tools).unwrap().diff.is_empty());
        if i % 1_000 == 0 {
            println!("file_size: after {i} unchanged refreshes: {} bytes", size());
        }
    }
    let elapsed = started.elapsed();
    let last = size();
    println!(
        "figure: catalogue file_size after {REFRESHES} unchanged refreshes in {elapsed:.1?} ({:.2?} each): {last} bytes, grew {} bytes ({} pages of 4 KiB)",
        elapsed / REFRESHES,
        last.saturating_sub(first),
        last.saturating_sub(first).div_ceil(4096)
    );
    assert!(last <= first + 4 * 4096, "the file grew: {first} -> {last}");
}
