//! The cache of decoded live sets behind `Catalog::live`: a cached read is always what a
//! fresh decode of the stored rows gives, through refreshes that add, change and remove,
//! identical and empty listings, and failed refreshes; and it hands out one shared
//! allocation until the server's set changes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::sync::Arc;

use psych_catalog::{Catalog, CatalogError};
use psych_types::{CatalogVersion, Reachability, ServerId, ToolDefinition};

fn server(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

fn sorted(mut tools: Vec<ToolDefinition>) -> Vec<ToolDefinition> {
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

fn reworded(tool: &ToolDefinition, how: &str) -> ToolDefinition {
    let mut tool = tool.clone();
    tool.description = Some(format!("{} ({how})", tool.description_or_empty()));
    tool
}

/// Reads `server` live twice (the first read after a change decodes, the second is
/// cached) and checks both against `expected` and against `tools_at`, which decodes the
/// stored rows afresh and never goes through the cache.
fn check(catalog: &Catalog, server: &ServerId, expected: &[ToolDefinition], step: &str) {
    let first = catalog.live(server).unwrap();
    let second = catalog.live(server).unwrap();
    assert!(
        Arc::ptr_eq(&first.tools, &second.tools),
        "{step}: the second read is the cached set"
    );
    assert_eq!(first.version, second.version, "{step}");
    assert_eq!(
        *second.tools,
        sorted(expected.to_vec()),
        "{step}: live is the list"
    );
    assert_eq!(
        *second.tools,
        catalog.tools_at(server, second.version).unwrap(),
        "{step}: the cached set is a fresh decode of its version"
    );
    assert_eq!(
        *second.tools,
        catalog
            .tools_at(server, catalog.version().unwrap())
            .unwrap(),
        "{step}: and of the current version"
    );
}

#[test]
fn cached_reads_equal_a_fresh_decode_through_every_kind_of_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.redb");
    let catalog = Catalog::open(&path).unwrap();
    let (pw, fs) = (server("playwright"), server("fs"));
    let full = common::catalogue("playwright.tools.json");
    let files = common::catalogue("server-filesystem.tools.json");
    catalog.refresh(&fs, &files).unwrap();
    check(&catalog, &fs, &files, "other server");

    let mut list: Vec<ToolDefinition> = full[..10].to_vec();
    let mut steps: Vec<(&str, Vec<ToolDefinition>)> = vec![("first", list.clone())];
    list.extend_from_slice(&full[10..15]);
    steps.push(("add", list.clone()));
    list[3] = reworded(&list[3], "changed");
    list[7] = reworded(&list[7], "changed");
    steps.push(("change", list.clone()));
    list.drain(0..4);
    steps.push(("remove", list.clone()));
    let mut mixed = list.clone();
    mixed[0] = reworded(&mixed[0], "again");
    mixed.pop();
    mixed.push(full[20].clone());
    steps.push(("add, change and remove", mixed.clone()));
    steps.push(("identical", mixed.clone()));
    steps.push(("empty", Vec::new()));
    steps.push(("back", full.clone()));

    for (step, tools) in &steps {
        catalog.refresh(&pw, tools).unwrap();
        check(&catalog, &pw, tools, step);
        check(&catalog, &fs, &files, &format!("{step}: the other server"));
    }

    // A failed refresh (a duplicate tool is refused before anything is written) and a
    // recorded lister failure keep the set and the cached allocation; health moves.
    let before = catalog.live(&pw).unwrap();
    let duplicate = [full[0].clone(), full[0].clone()];
    assert!(matches!(
        catalog.refresh(&pw, &duplicate),
        Err(CatalogError::DuplicateTool { .. })
    ));
    check(&catalog, &pw, &full, "after a refused refresh");
    catalog.record_failure(&pw, "connection reset").unwrap();
    check(&catalog, &pw, &full, "after a failure");
    let after = catalog.live(&pw).unwrap();
    assert!(Arc::ptr_eq(&before.tools, &after.tools));
    assert_eq!(after.version, before.version);
    assert_eq!(
        after.health.last_error.as_ref().map(|e| e.message.as_str()),
        Some("connection reset"),
        "health is read each time, not cached with the tools"
    );

    // A later change after the failure, then a new instance (an empty cache) reads the same.
    catalog.refresh(&pw, &full[..3]).unwrap();
    check(&catalog, &pw, &full[..3], "after the failure, a change");
    let cached = catalog.live(&pw).unwrap();
    drop(catalog);
    let reopened = Catalog::open(&path).unwrap();
    let fresh = reopened.live(&pw).unwrap();
    assert_eq!(fresh.version, cached.version);
    assert_eq!(fresh.tools, cached.tools);
    assert_eq!(fresh.health.last_sync, cached.health.last_sync);
    check(&reopened, &pw, &full[..3], "reopened");
}

#[test]
fn a_cached_read_is_the_same_allocation_until_the_set_changes() {
    let catalog = Catalog::in_memory().unwrap();
    let s = server("memory");
    let tools = common::catalogue("server-memory.tools.json");
    catalog.refresh(&s, &tools).unwrap();

    let first = catalog.live(&s).unwrap();
    let second = catalog.live(&s).unwrap();
    assert!(Arc::ptr_eq(&first.tools, &second.tools), "nothing changed");
    assert!(
        Arc::ptr_eq(&catalog.clone().live(&s).unwrap().tools, &first.tools),
        "clones of a catalogue share its cache"
    );
    assert!(
        Arc::ptr_eq(&catalog.live_all().unwrap()[0].tools, &first.tools),
        "live_all reads through the same cache"
    );

    // Neither an identical listing, nor a failure, nor a reachability report changes the set.
    assert!(catalog.refresh(&s, &tools).unwrap().diff.is_empty());
    catalog.record_failure(&s, "timed out").unwrap();
    catalog.set_reachability(
        &s,
        Reachability::Unreachable {
            reason: "exited".into(),
        },
    );
    let unchanged = catalog.live(&s).unwrap();
    assert!(Arc::ptr_eq(&unchanged.tools, &first.tools));
    assert!(matches!(
        unchanged.health.reachability,
        Reachability::Unreachable { .. }
    ));

    // A change gives a new set, cached in turn; the older version still reads as it was.
    let mut changed = tools.clone();
    changed[0] = reworded(&changed[0], "v2");
    let refresh = catalog.refresh(&s, &changed).unwrap();
    let third = catalog.live(&s).unwrap();
    assert_eq!(third.version, refresh.version);
    assert!(
        !Arc::ptr_eq(&third.tools, &first.tools),
        "a new set after a change"
    );
    assert_ne!(*third.tools, *first.tools);
    assert_eq!(*third.tools, sorted(changed));
    assert!(Arc::ptr_eq(&catalog.live(&s).unwrap().tools, &third.tools));
    assert_eq!(
        catalog.tools_at(&s, first.version).unwrap(),
        *first.tools,
        "history is read from the rows, as it was"
    );
    // What a reader already holds stays as it was: the sets are immutable.
    assert_eq!(*first.tools, sorted(tools));

    // Another catalogue has its own cache.
    let other = Catalog::in_memory().unwrap();
    other.refresh(&s, &third.tools).unwrap();
    assert!(!Arc::ptr_eq(&other.live(&s).unwrap().tools, &third.tools));
    assert_eq!(other.live(&s).unwrap().version, CatalogVersion(1));
}

#[test]
fn a_server_never_listed_reads_empty_until_it_is() {
    let catalog = Catalog::in_memory().unwrap();
    let nobody = server("nobody");
    let live = catalog.live(&nobody).unwrap();
    assert!(live.tools.is_empty());
    assert_eq!(live.version, CatalogVersion(0));
    // An empty listing of a new server changes nothing and still reads empty.
    catalog.refresh(&nobody, &[]).unwrap();
    assert!(catalog.live(&nobody).unwrap().tools.is_empty());
    let tools = common::catalogue("server-memory.tools.json");
    catalog.refresh(&nobody, &tools).unwrap();
    assert_eq!(*catalog.live(&nobody).unwrap().tools, sorted(tools));
}
