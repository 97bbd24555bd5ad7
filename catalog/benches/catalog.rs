//! Catalogue benchmarks on rows built from the real fixture catalogues (all six files' 306
//! tools in turn, the k-th renamed `<name>.<k>`), each comparison in one criterion group so
//! the ratios come from one run. Every database is a file in a temporary directory on the
//! checkout's disk, committed with redb's default `Durability::Immediate`.
//!
//! - `refresh_10k`: 10,000 tools (about 12 MB of JSON)
//!   - `bare_redb_insert`: the baseline, the same rows written the plainest way: each tool
//!     serialized and inserted under `(server, tool, version)` in one write transaction of
//!     a fresh database, then committed, in listing order (`bare_redb_insert`) and given the
//!     rows already sorted by name (`bare_redb_insert_sorted`, the stricter baseline: redb
//!     takes sorted inserts faster, and a refresh sorts);
//!   - `refresh_new`: [`Catalog::refresh`] of the same list into a fresh catalogue (sort,
//!     duplicate check, scan of the server's rows, the rows, the version, the sync row);
//!   - `refresh_unchanged`: the same list again into a catalogue that holds it: every tool
//!     serialized and compared, nothing written but the sync row;
//!   - `serialize_only`: serializing the 10,000 definitions and nothing else, the floor of
//!     any change detection that compares definitions.
//! - `live_read_500`: [`Catalog::live`] of a 500-tool server (after 20 refreshes that
//!   changed 10 tools each, so it scans history too):
//!   - `catalog_live_warm`: the read when the server's set is unchanged since the last read
//!     (the catalogue's cached decoded set: a read transaction, the server's row, an `Arc`);
//!   - `catalog_live_cold`: the first read after a change (each iteration's untimed setup
//!     is a refresh that rewords one tool, so the read decodes the 500 rows afresh; the
//!     history grows by a row per iteration);
//!   - `serde_json_500`: parsing the same 500 definitions from bytes already in memory (the
//!     floor of any read that decodes stored JSON: what a cold read cannot beat);
//!   - `clone_500`: cloning them (what returning them owned would cost on top;
//!     `ServerCatalog::tools` is a shared `Arc<[ToolDefinition]>`, so no read pays it).
//!
//! The file size after 10,000 unchanged refreshes is the `file_size` bench (it takes minutes:
//! each refresh commits with an fsync).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use psych_catalog::Catalog;
use psych_types::{ServerId, ToolDefinition};
use redb::{Database, TableDefinition};

const ROWS: TableDefinition<'_, (&str, &str, u64), &[u8]> = TableDefinition::new("tools");

/// A fresh database in a fresh directory (set up outside the timing, as the catalogue is).
fn fresh_db() -> (Database, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("bare.redb")).unwrap();
    (db, dir)
}

fn bare_insert(db: &Database, server: &ServerId, tools: &[ToolDefinition]) {
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(ROWS).unwrap();
        for tool in tools {
            let mut value = 0u64.to_le_bytes().to_vec();
            serde_json::to_writer(&mut value, tool).unwrap();
            table
                .insert((server.as_str(), tool.name.as_str(), 1), value.as_slice())
                .unwrap();
        }
    }
    txn.commit().unwrap();
}

fn refresh_10k(c: &mut Criterion) {
    let tools = common::tools(10_000);
    let server = ServerId::new("big").unwrap();
    let mut group = c.benchmark_group("refresh_10k");
    group.sample_size(10);
    group.bench_function("bare_redb_insert", |b| {
        b.iter_batched(
            fresh_db,
            |(db, dir)| {
                bare_insert(&db, &server, black_box(&tools));
                (db, dir)
            },
            BatchSize::PerIteration,
        );
    });
    // The same, given the rows already sorted by name (sorting not timed): redb's B-tree
    // takes sorted inserts faster, and `refresh` sorts, so this is the stricter baseline.
    let mut sorted = tools.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    group.bench_function("bare_redb_insert_sorted", |b| {
        b.iter_batched(
            fresh_db,
            |(db, dir)| {
                bare_insert(&db, &server, black_box(&sorted));
                (db, dir)
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("refresh_new", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let catalog = Catalog::open(dir.path().join("catalog.redb")).unwrap();
                (catalog, dir)
            },
            |(catalog, dir)| {
                let refresh = catalog.refresh(&server, black_box(&tools)).unwrap();
                assert_eq!(refresh.diff.added.len(), 10_000);
                (catalog, dir)
            },
            BatchSize::PerIteration,
        );
    });
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::open(dir.path().join("catalog.redb")).unwrap();
    catalog.refresh(&server, &tools).unwrap();
    group.bench_function("refresh_unchanged", |b| {
        b.iter(|| {
            let refresh = catalog.refresh(&server, black_box(&tools)).unwrap();
            assert!(refresh.diff.is_empty());
        });
    });
    // The floor of any change detection that compares definitions: serializing them.
    group.bench_function("serialize_only", |b| {
        b.iter(|| {
            black_box(&tools)
                .iter()
                .map(|tool| serde_json::to_vec(tool).unwrap().len())
                .sum::<usize>()
        });
    });
    group.finish();
}

fn live_read_500(c: &mut Criterion) {
    let mut tools = common::tools(500);
    let server = ServerId::new("five-hundred").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::open(dir.path().join("catalog.redb")).unwrap();
    // A server with some history: 20 refreshes, each changing 10 tools.
    for round in 0..20 {
        for tool in &mut tools[round * 10..round * 10 + 10] {
            tool.description = Some(format!("{} (v{round})", tool.description_or_empty()));
        }
        catalog.refresh(&server, &tools).unwrap();
    }
    let stats = catalog.stats().unwrap();
    println!(
        "live_read_500: {} rows, {} live, {}",
        stats.rows, stats.live_rows, stats.version
    );
    let mut sorted = tools.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let encoded: Vec<Vec<u8>> = sorted
        .iter()
        .map(|t| serde_json::to_vec(t).unwrap())
        .collect();

    let mut group = c.benchmark_group("live_read_500");
    group.bench_function("catalog_live_warm", |b| {
        b.iter(|| {
            let live = catalog.live(black_box(&server)).unwrap();
            assert_eq!(live.tools.len(), 500);
            live
        });
    });
    let mut round = 0u64;
    group.bench_function("catalog_live_cold", |b| {
        b.iter_batched(
            || {
                // Untimed: a change, so the next read cannot be served from the cache.
                round += 1;
                tools[0].description = Some(format!("reworded {round}"));
                assert!(!catalog.refresh(&server, &tools).unwrap().diff.is_empty());
            },
            |()| {
                let live = catalog.live(black_box(&server)).unwrap();
                assert_eq!(live.tools.len(), 500);
                live
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("serde_json_500", |b| {
        b.iter(|| {
            black_box(&encoded)
                .iter()
                .map(|bytes| serde_json::from_slice::<ToolDefinition>(bytes).unwrap())
                .collect::<Vec<_>>()
        });
    });
    group.bench_function("clone_500", |b| b.iter(|| black_box(&sorted).clone()));
    group.finish();
}

criterion_group!(benches, refresh_10k, live_read_500);
criterion_main!(benches);
