//! Peak resident memory of one step's assembly over the 1,000-record log whose ten earlier
//! results are 256 MiB each (written by the `lazy_step` bench, or here if missing).
//!
//! The peak is reset (`/proc/self/clear_refs`, 5) after the log is opened, so it counts
//! the step alone, and read from `VmHWM` in `/proc/self/status` after it. Linux only.
//! `cargo run --release -p psych-tests --example lazy_step_rss`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    dead_code,
    reason = "a measurement fails loudly on bad data; its support module is shared"
)]

use std::time::Instant;

#[path = "../benches/support/lazy_data.rs"]
mod lazy_data;

fn status(field: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or("")
        .to_owned()
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "large".into());
    let log = if which == "small" {
        lazy_data::log("lazy-small", lazy_data::SMALL)
    } else {
        lazy_data::log("lazy-large", lazy_data::LARGE)
    };
    let fixed = lazy_data::Fixed::new();
    println!("log: {} records, {} bytes", log.len(), log.size_bytes());
    println!("before reset: {}", status("VmHWM"));
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    println!("after reset:  {}  {}", status("VmHWM"), status("VmRSS"));
    let start = Instant::now();
    let body = fixed.step(&log);
    let elapsed = start.elapsed();
    println!("step: {elapsed:?}, request body {body} bytes");
    println!("peak during the step: {}", status("VmHWM"));
}
