//! Issue 31's catalogue figure: a refresh of 10,000 tools on the redb catalogue (a file,
//! every commit synced) and on PostgreSQL (`$PSYCH_TEST_PG`, durable commits), side by side
//! in one group per case: the first listing, the same listing again (no version taken), and
//! a listing with one description changed. Both stores through the same seam
//! (psych-types' `CatalogStore`). Run with
//! `cargo bench -p psych-tests --bench catalog_stores -- --warm-up-time 1 --measurement-time 5`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "a benchmark fails loudly on bad data"
)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use psych_catalog::Catalog;
use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::PgCatalog;
use psych_types::{CatalogStore, ServerId, ToolDefinition};
use serde_json::json;

const TOOLS: usize = 10_000;

/// 10,000 tools shaped like a large server's (a description, a small schema), the
/// description of tool 0 carrying `mark`.
fn listing(mark: usize) -> Vec<ToolDefinition> {
    (0..TOOLS)
        .map(|i| {
            let description = if i == 0 {
                format!("Lists the items of a project, revision {mark}.")
            } else {
                format!("Reads, filters and pages the records of kind {i} for a workspace.")
            };
            serde_json::from_value(json!({
                "name": format!("tool_{i:05}"),
                "description": description,
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The record's id."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    "required": ["id"],
                },
            }))
            .unwrap()
        })
        .collect()
}

/// A PostgreSQL catalogue in schema `name`, emptied first.
fn postgres(name: &str) -> PgCatalog {
    psql(&format!("drop schema if exists {name} cascade"));
    PgCatalog::open(&format!("{}?schema={name}", database())).unwrap()
}

fn redb(dir: &tempfile::TempDir, name: &str) -> Catalog {
    let path = dir.path().join(format!("{name}.redb"));
    let _ = std::fs::remove_file(&path);
    Catalog::open(path).unwrap()
}

fn refresh_10000(c: &mut Criterion) {
    let server = ServerId::new("big").unwrap();
    let (first, second) = (listing(0), listing(1));
    let dir = tempfile::tempdir().unwrap();

    let mut group = c.benchmark_group("catalog_refresh_10000_tools/first_listing");
    group.sample_size(10);
    let mut n = 0;
    group.bench_function("redb", |b| {
        b.iter_batched(
            || {
                n += 1;
                redb(&dir, &format!("first_{n}"))
            },
            |store| black_box(store.refresh(&server, &first).unwrap()),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("postgres", |b| {
        b.iter_batched(
            || postgres("bench_catalog_first"),
            |store| black_box(store.refresh(&server, &first).unwrap()),
            BatchSize::PerIteration,
        )
    });
    group.finish();

    let stores: [(&str, Box<dyn Bench>); 2] = [
        ("redb", Box::new(redb(&dir, "kept"))),
        ("postgres", Box::new(postgres("bench_catalog_kept"))),
    ];
    let mut unchanged = c.benchmark_group("catalog_refresh_10000_tools/unchanged");
    unchanged.sample_size(20);
    for (name, store) in &stores {
        store.listed(&server, &first);
        unchanged.bench_function(*name, |b| b.iter(|| store.listed(&server, &first)));
    }
    unchanged.finish();
    let mut changed = c.benchmark_group("catalog_refresh_10000_tools/one_description_changed");
    changed.sample_size(20);
    for (name, store) in &stores {
        let mut flip = false;
        changed.bench_function(*name, |b| {
            b.iter(|| {
                flip = !flip;
                store.listed(&server, if flip { &second } else { &first })
            })
        });
    }
    changed.finish();
}

/// Either store, refreshed through the seam (its error unwrapped).
trait Bench {
    fn listed(&self, server: &ServerId, tools: &[ToolDefinition]);
}

impl<S: CatalogStore> Bench for S {
    fn listed(&self, server: &ServerId, tools: &[ToolDefinition]) {
        black_box(CatalogStore::refresh(self, server, tools).unwrap());
    }
}

criterion_group!(benches, refresh_10000);
criterion_main!(benches);
