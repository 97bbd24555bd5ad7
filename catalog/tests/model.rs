//! A proptest state machine: random refreshes (adds, changes, removals, empty lists,
//! identical lists), failures and reopens, against a `BTreeMap` model. After every step the
//! live set of every server is its last successful list, every older version reads as it
//! was, the version only moves when a set changes, and no row is ever deleted (the row count
//! is exactly the number of rows the model says were written).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use psych_catalog::Catalog;
use psych_types::{CatalogVersion, ServerId, ToolDefinition};

const SERVERS: [&str; 2] = ["alpha", "beta"];
const NAMES: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    /// A listing: for each of the tool names, absent or one of three definitions.
    Refresh(usize, Vec<Option<u8>>),
    /// The server's last list again.
    Identical(usize),
    /// The lister failed.
    Fail(usize),
    /// Close the file and open it again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SERVERS.len(), prop::collection::vec(prop::option::of(0u8..3), NAMES))
            .prop_map(|(s, tools)| Op::Refresh(s, tools)),
        1 => (0..SERVERS.len()).prop_map(|s| Op::Refresh(s, vec![None; NAMES])),
        2 => (0..SERVERS.len()).prop_map(Op::Identical),
        2 => (0..SERVERS.len()).prop_map(Op::Fail),
        1 => Just(Op::Reopen),
    ]
}

type Set = BTreeMap<String, ToolDefinition>;

struct Model {
    live: Vec<Set>,
    last_list: Vec<Vec<ToolDefinition>>,
    /// Every version and every server's set at it; index = version.
    history: Vec<Vec<Set>>,
    rows: u64,
    failed: Vec<bool>,
}

/// The tool of name `i` in variant `v`: a real fixture tool whose description differs by
/// variant.
fn tool(base: &[ToolDefinition], i: usize, v: u8) -> ToolDefinition {
    let mut tool = base[i].clone();
    tool.description = Some(format!("{} (variant {v})", tool.description_or_empty()));
    tool
}

fn check(catalog: &Catalog, model: &Model) {
    for (s, name) in SERVERS.iter().enumerate() {
        let server = ServerId::new(*name).unwrap();
        let live = catalog.live(&server).unwrap();
        assert_eq!(
            *live.tools,
            model.live[s].values().cloned().collect::<Vec<_>>(),
            "live set of {name}"
        );
        assert_eq!(live.health.last_error.is_some(), model.failed[s], "{name}");
        for (version, sets) in model.history.iter().enumerate() {
            assert_eq!(
                catalog
                    .tools_at(&server, CatalogVersion(version as u64))
                    .unwrap(),
                sets[s].values().cloned().collect::<Vec<_>>(),
                "{name} at v{version}"
            );
        }
    }
    let stats = catalog.stats().unwrap();
    assert_eq!(stats.rows, model.rows, "every row written is still there");
    assert_eq!(
        stats.live_rows,
        model.live.iter().map(|s| s.len() as u64).sum::<u64>()
    );
    assert_eq!(
        stats.version,
        CatalogVersion(model.history.len() as u64 - 1)
    );
}

fn run(dir: &Path, base: &[ToolDefinition], ops: &[Op]) {
    let path = dir.join("catalog.redb");
    let mut catalog = Some(Catalog::open(&path).unwrap());
    let mut model = Model {
        live: vec![Set::new(); SERVERS.len()],
        last_list: vec![Vec::new(); SERVERS.len()],
        history: vec![vec![Set::new(); SERVERS.len()]],
        rows: 0,
        failed: vec![false; SERVERS.len()],
    };
    for op in ops {
        let current = catalog.as_ref().unwrap();
        match op {
            Op::Refresh(..) | Op::Identical(_) => {
                let (s, list) = match op {
                    Op::Refresh(s, variants) => (
                        *s,
                        variants
                            .iter()
                            .enumerate()
                            .filter_map(|(i, v)| v.map(|v| tool(base, i, v)))
                            .rev() // the catalogue must not depend on the order
                            .collect::<Vec<_>>(),
                    ),
                    Op::Identical(s) => (*s, model.last_list[*s].clone()),
                    _ => unreachable!(),
                };
                let server = ServerId::new(SERVERS[s]).unwrap();
                let refresh = current.refresh(&server, &list).unwrap();
                let next: Set = list
                    .iter()
                    .map(|t| (t.name.to_string(), t.clone()))
                    .collect();
                let written = next
                    .iter()
                    .filter(|(name, t)| model.live[s].get(*name) != Some(t))
                    .count() as u64;
                let removed = model.live[s]
                    .keys()
                    .filter(|name| !next.contains_key(*name))
                    .count();
                assert_eq!(
                    refresh.diff.added.len() + refresh.diff.changed.len(),
                    written as usize
                );
                assert_eq!(refresh.diff.removed.len(), removed);
                if next != model.live[s] {
                    let mut sets = model.history.last().unwrap().clone();
                    sets[s] = next.clone();
                    model.history.push(sets);
                    model.rows += written;
                }
                assert_eq!(
                    refresh.diff.is_empty(),
                    next == model.live[s] && written == 0
                );
                model.live[s] = next;
                model.last_list[s] = list;
                model.failed[s] = false;
            }
            Op::Fail(s) => {
                let server = ServerId::new(SERVERS[*s]).unwrap();
                current
                    .record_failure(&server, "tools/list failed")
                    .unwrap();
                model.failed[*s] = true;
            }
            Op::Reopen => {
                drop(catalog.take());
                catalog = Some(Catalog::open(&path).unwrap());
            }
        }
        check(catalog.as_ref().unwrap(), &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_catalogue_matches_a_btreemap_model(ops in prop::collection::vec(op(), 1..40)) {
        let base = common::catalogue("server-memory.tools.json");
        let dir = tempfile::tempdir().unwrap();
        run(dir.path(), &base, &ops);
    }
}
