//! One conformance suite for every store behind Psych's seams, written once and run against
//! each store: the redb catalogue (psych-catalog's tests) and, as it lands, the PostgreSQL
//! store (issue 31; `docs/design/31-postgres-store.md`, section 8). A store passes when it
//! keeps the catalogue's guarantees: a refresh makes exactly the listing the live set, an
//! unchanged listing takes no version, nothing is ever hard-deleted (every past version
//! reads as it was), a refused listing changes nothing, a failure keeps the tools.
//!
//! Each property is a function over a fresh, empty store; [`catalog_conformance!`] makes one
//! `#[test]` of each, so a failure names the property. The record stores (the file log and
//! PostgreSQL) pass [`records_conformance!`]'s properties ([`records`]): dense handles, every
//! kind of record read back as it was, reads from any offset, Runs kept apart, records kept
//! across a reopen, a failed batch acknowledging nothing, spilled and large results.
//!
//! # Example
//!
//! ```ignore
//! // In a store's tests: one #[test] per property, each over a fresh store.
//! psych_store_conformance::catalog_conformance!(|| psych_catalog::Catalog::in_memory().unwrap());
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a conformance suite fails loudly, naming what the store got wrong"
)]

pub mod large;
pub mod pg;
pub mod records;

use psych_types::{
    CatalogFailure, CatalogStore, CatalogVersion, ServerId, ToolDefinition, ToolName,
};
use serde_json::json;

/// One `#[test]` per catalogue property, each over a fresh store made by `$fresh` (an
/// expression of a closure `|| -> S` where `S:` [`CatalogStore`]).
#[macro_export]
macro_rules! catalog_conformance {
    ($fresh:expr) => {
        $crate::catalog_conformance!(@tests $fresh;
            a_refresh_makes_the_listing_the_live_set,
            an_unchanged_listing_takes_no_version,
            every_past_version_reads_as_it_was,
            a_tool_listed_twice_is_refused_and_nothing_changes,
            a_failure_keeps_the_tools_until_the_next_refresh,
            a_server_never_listed_reads_empty,
            versions_are_catalogue_wide_and_only_grow,
            a_version_not_reached_is_refused,
            an_unchanged_refresh_keeps_its_servers_version,
            a_failure_of_a_server_never_listed_takes_no_version,
            a_refused_listing_of_a_new_server_leaves_it_unknown,
            an_empty_first_listing_makes_the_server_known_at_no_version,
            names_are_ordered_by_their_bytes,
            a_large_listing_reads_back_whole,
        );
    };
    (@tests $fresh:expr; $($property:ident),* $(,)?) => {
        $(
            #[test]
            fn $property() {
                $crate::$property(&$fresh);
            }
        )*
    };
}

/// A store with what must live as long as it (a temporary folder, a test schema's guard):
/// a store of its own that the suite's `fresh` closure can return whole.
#[derive(Debug)]
pub struct Kept<S, G>(pub S, pub G);

impl<S: CatalogStore, G: Send + Sync + std::fmt::Debug> CatalogStore for Kept<S, G> {
    type Error = S::Error;

    fn failure(&self, error: &S::Error) -> CatalogFailure {
        self.0.failure(error)
    }

    fn now(&self) -> psych_types::UnixMillis {
        self.0.now()
    }

    fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<psych_types::Refresh, S::Error> {
        self.0.refresh(server, tools)
    }

    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), S::Error> {
        self.0.record_failure(server, message)
    }

    fn version(&self) -> Result<CatalogVersion, S::Error> {
        self.0.version()
    }

    fn live(&self, server: &ServerId) -> Result<psych_types::ServerCatalog, S::Error> {
        self.0.live(server)
    }

    fn servers(&self) -> Result<Vec<ServerId>, S::Error> {
        self.0.servers()
    }

    fn health(&self, server: &ServerId) -> Result<psych_types::ServerHealth, S::Error> {
        self.0.health(server)
    }

    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, S::Error> {
        self.0.tools_at(server, version)
    }

    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<psych_types::Diff, S::Error> {
        self.0.diff(server, from, to)
    }

    fn is_shared(&self) -> bool {
        self.0.is_shared()
    }

    fn lease(
        &self,
        server: &ServerId,
        since: psych_types::UnixMillis,
    ) -> Result<psych_types::Lease, S::Error> {
        self.0.lease(server, since)
    }

    fn watch(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        self.0.watch(wake);
    }
}

fn server(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

/// A tool named `name` with `description` and a one-property schema.
fn tool(name: &str, description: &str) -> ToolDefinition {
    let schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {"path": {"type": "string", "description": description}},
    }))
    .unwrap();
    ToolDefinition::new(ToolName::new(name).unwrap(), description, schema)
}

fn names(tools: &[ToolDefinition]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

fn list(names: &[&str]) -> Vec<ToolName> {
    names.iter().map(|n| ToolName::new(*n).unwrap()).collect()
}

/// A refresh makes exactly the listing the server's live set, ordered by name, and says
/// what it added, changed, removed and left.
pub fn a_refresh_makes_the_listing_the_live_set<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    let first = store
        .refresh(&fs, &[tool("write", "Write"), tool("read", "Read")])
        .unwrap();
    assert_eq!(first.diff.added, list(&["read", "write"]));
    let live = store.live(&fs).unwrap();
    assert_eq!(names(&live.tools), ["read", "write"]);
    assert_eq!(live.version, first.version);
    assert_eq!(
        live.tools[0],
        tool("read", "Read"),
        "a tool reads back as it was listed"
    );
    let second = store
        .refresh(&fs, &[tool("read", "Read a file"), tool("stat", "Stat")])
        .unwrap();
    assert_eq!(second.diff.added, list(&["stat"]));
    assert_eq!(second.diff.changed, list(&["read"]));
    assert_eq!(second.diff.removed, list(&["write"]));
    assert!(second.diff.unchanged.is_empty());
    assert!(second.version > first.version);
    let live = store.live(&fs).unwrap();
    assert_eq!(names(&live.tools), ["read", "stat"]);
    assert_eq!(live.tools[0].description.as_deref(), Some("Read a file"));
    assert_eq!(store.servers().unwrap(), std::slice::from_ref(&fs));
    let health = store.health(&fs).unwrap();
    assert_eq!(health.last_sync.map(|s| s.version), Some(second.version));
    // Emptied, the server is known with no live tool.
    let emptied = store.refresh(&fs, &[]).unwrap();
    assert_eq!(emptied.diff.removed, list(&["read", "stat"]));
    assert!(store.live(&fs).unwrap().tools.is_empty());
}

/// The same listing again, in any order, writes nothing and takes no version; only the
/// sync stamp moves.
pub fn an_unchanged_listing_takes_no_version<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    let first = store
        .refresh(&fs, &[tool("read", "Read"), tool("write", "Write")])
        .unwrap();
    let version = store.version().unwrap();
    let same = store
        .refresh(&fs, &[tool("write", "Write"), tool("read", "Read")])
        .unwrap();
    assert_eq!(same.version, first.version);
    assert!(same.diff.is_empty());
    assert_eq!(same.diff.unchanged, list(&["read", "write"]));
    assert_eq!(store.version().unwrap(), version);
    assert!(store.health(&fs).unwrap().last_sync.is_some());
}

/// Nothing is hard-deleted: every version the catalogue went through reads as it was, and
/// the diff between any two says what changed.
pub fn every_past_version_reads_as_it_was<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    let listings: [&[ToolDefinition]; 4] = [
        &[tool("a", "A"), tool("b", "B")],
        &[tool("a", "A2"), tool("c", "C")],
        &[],
        &[tool("b", "B"), tool("c", "C")],
    ];
    let mut versions = Vec::new();
    let mut refreshes = Vec::new();
    for listing in listings {
        let refresh = store.refresh(&fs, listing).unwrap();
        versions.push(refresh.version);
        refreshes.push(refresh);
    }
    // A tool removed and listed again is, for the refresh, added.
    assert_eq!(refreshes[3].diff.added, list(&["b", "c"]));
    for (listing, version) in listings.iter().zip(&versions) {
        let at = store.tools_at(&fs, *version).unwrap();
        let mut want: Vec<ToolDefinition> = listing.to_vec();
        want.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(at, want, "the tools at version {}", version.0);
    }
    assert!(store.tools_at(&fs, CatalogVersion(0)).unwrap().is_empty());
    let diff = store.diff(&fs, versions[0], versions[1]).unwrap();
    assert_eq!(
        (diff.added, diff.changed, diff.removed, diff.unchanged),
        (list(&["c"]), list(&["a"]), list(&["b"]), list(&[]))
    );
    // Removed and listed again the same: unchanged across the gap.
    let diff = store.diff(&fs, versions[0], versions[3]).unwrap();
    assert_eq!(
        (diff.added, diff.removed, diff.unchanged),
        (list(&["c"]), list(&["a"]), list(&["b"]))
    );
    // Backwards describes undoing.
    let undo = store.diff(&fs, versions[1], versions[0]).unwrap();
    assert_eq!((undo.added, undo.removed), (list(&["b"]), list(&["c"])));
}

/// A listing that names a tool twice is refused whole, with the failure saying so, and the
/// server keeps what it had.
pub fn a_tool_listed_twice_is_refused_and_nothing_changes<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    let kept = store.refresh(&fs, &[tool("read", "Read")]).unwrap();
    let version = store.version().unwrap();
    let error = store
        .refresh(&fs, &[tool("stat", "Stat"), tool("stat", "Stat again")])
        .unwrap_err();
    assert_eq!(
        store.failure(&error),
        CatalogFailure::DuplicateTool,
        "{error}"
    );
    assert_eq!(store.version().unwrap(), version);
    let live = store.live(&fs).unwrap();
    assert_eq!(
        (names(&live.tools), live.version),
        (vec!["read"], kept.version)
    );
}

/// A failed listing keeps the server's tools and shows in its health until the next
/// successful refresh clears it.
pub fn a_failure_keeps_the_tools_until_the_next_refresh<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    store.refresh(&fs, &[tool("read", "Read")]).unwrap();
    store.record_failure(&fs, "connection reset").unwrap();
    let health = store.health(&fs).unwrap();
    let failure = health.last_error.expect("the failure is in the health");
    assert_eq!(failure.message, "connection reset");
    assert_eq!(names(&store.live(&fs).unwrap().tools), ["read"]);
    store.refresh(&fs, &[tool("read", "Read")]).unwrap();
    assert!(store.health(&fs).unwrap().last_error.is_none());
    // A server's error may carry a NUL (PostgreSQL's text holds none): kept as U+FFFD.
    store.record_failure(&fs, "reset\0by peer").unwrap();
    let failure = store.health(&fs).unwrap().last_error.expect("recorded");
    assert_eq!(failure.message, "reset\u{FFFD}by peer");
    store.refresh(&fs, &[tool("read", "Read")]).unwrap();
    // A server that only ever failed is known, with no tools.
    let down = server("down");
    store.record_failure(&down, "exited with status 3").unwrap();
    assert!(store.servers().unwrap().contains(&down));
    assert!(store.live(&down).unwrap().tools.is_empty());
}

/// A server the store never listed reads as version 0 with no tools and no sync.
pub fn a_server_never_listed_reads_empty<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let none = server("none");
    let live = store.live(&none).unwrap();
    assert_eq!((live.version, live.tools.len()), (CatalogVersion(0), 0));
    assert!(store.health(&none).unwrap().last_sync.is_none());
    assert_eq!(store.version().unwrap(), CatalogVersion(0));
    assert!(store.servers().unwrap().is_empty());
}

/// One version counter for the whole catalogue: each change of any server takes the next,
/// and servers are listed in name order.
pub fn versions_are_catalogue_wide_and_only_grow<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let (b, a) = (server("b"), server("a"));
    let one = store.refresh(&b, &[tool("x", "X")]).unwrap().version;
    let two = store.refresh(&a, &[tool("x", "X")]).unwrap().version;
    let three = store.refresh(&b, &[tool("x", "X2")]).unwrap().version;
    assert!(one < two && two < three, "{one:?} {two:?} {three:?}");
    assert_eq!(store.version().unwrap(), three);
    assert_eq!(store.live(&a).unwrap().version, two);
    assert_eq!(store.servers().unwrap(), [a, b]);
}

/// Reading at a version the catalogue has not reached is refused, saying so.
pub fn a_version_not_reached_is_refused<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let fs = server("fs");
    let now = store.refresh(&fs, &[tool("read", "Read")]).unwrap().version;
    let ahead = CatalogVersion(now.0 + 1);
    let error = store.tools_at(&fs, ahead).unwrap_err();
    assert_eq!(
        store.failure(&error),
        CatalogFailure::VersionAhead,
        "{error}"
    );
    let error = store.diff(&fs, now, ahead).unwrap_err();
    assert_eq!(
        store.failure(&error),
        CatalogFailure::VersionAhead,
        "{error}"
    );
    let error = store.diff(&fs, ahead, now).unwrap_err();
    assert_eq!(
        store.failure(&error),
        CatalogFailure::VersionAhead,
        "{error}"
    );
    let same = store.diff(&fs, now, now).unwrap();
    assert!(
        same.is_empty() && same.unchanged == list(&["read"]),
        "{same:?}"
    );
}

/// An unchanged refresh after other servers moved the catalogue on keeps the server's own
/// set version, in its live set and in its sync stamp.
pub fn an_unchanged_refresh_keeps_its_servers_version<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let (a, b) = (server("a"), server("b"));
    let first = store.refresh(&a, &[tool("x", "X")]).unwrap().version;
    store.refresh(&b, &[tool("y", "Y")]).unwrap();
    let again = store.refresh(&a, &[tool("x", "X")]).unwrap();
    assert_eq!(again.version, first);
    assert_eq!(store.live(&a).unwrap().version, first);
    let stamp = store.health(&a).unwrap().last_sync.unwrap();
    assert_eq!(stamp.version, first);
}

/// A failure of a server never listed makes it known, with no tools, no sync and no
/// version taken.
pub fn a_failure_of_a_server_never_listed_takes_no_version<S: CatalogStore>(
    fresh: &impl Fn() -> S,
) {
    let store = fresh();
    let down = server("down");
    store.record_failure(&down, "exited with status 3").unwrap();
    assert_eq!(store.version().unwrap(), CatalogVersion(0));
    let live = store.live(&down).unwrap();
    assert_eq!((live.version, live.tools.len()), (CatalogVersion(0), 0));
    let health = store.health(&down).unwrap();
    assert!(health.last_sync.is_none());
    assert_eq!(health.last_error.unwrap().message, "exited with status 3");
}

/// A listing refused whole (a tool named twice) of a server never seen leaves it unknown.
pub fn a_refused_listing_of_a_new_server_leaves_it_unknown<S: CatalogStore>(
    fresh: &impl Fn() -> S,
) {
    let store = fresh();
    let new = server("new");
    let error = store
        .refresh(&new, &[tool("a", "A"), tool("a", "A")])
        .unwrap_err();
    assert_eq!(store.failure(&error), CatalogFailure::DuplicateTool);
    assert!(store.servers().unwrap().is_empty());
    assert!(store.health(&new).unwrap().last_sync.is_none());
}

/// An empty first listing takes no version, and makes the server known, synced at
/// version 0.
pub fn an_empty_first_listing_makes_the_server_known_at_no_version<S: CatalogStore>(
    fresh: &impl Fn() -> S,
) {
    let store = fresh();
    let empty = server("empty");
    let refresh = store.refresh(&empty, &[]).unwrap();
    assert_eq!(refresh.version, CatalogVersion(0));
    assert!(refresh.diff.is_empty() && refresh.diff.unchanged.is_empty());
    assert_eq!(store.version().unwrap(), CatalogVersion(0));
    assert_eq!(store.servers().unwrap(), std::slice::from_ref(&empty));
    let stamp = store.health(&empty).unwrap().last_sync.unwrap();
    assert_eq!(stamp.version, CatalogVersion(0));
}

/// Servers and tools are ordered by the bytes of their names (upper case before lower,
/// `-` and `.` before `_`), whatever the store's locale.
pub fn names_are_ordered_by_their_bytes<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    // Server ids take `[A-Za-z0-9_-]`; tool names also `.`.
    let servers_in = ["a_b", "Z", "a", "B", "a-b", "ab"];
    let tools_in = ["a_b", "Z", "a.b", "a", "B", "a-b", "ab"];
    let sorted = |names: &[&'static str]| {
        let mut names = names.to_vec();
        names.sort_unstable();
        names
    };
    let tools: Vec<ToolDefinition> = tools_in.iter().map(|n| tool(n, n)).collect();
    for name in servers_in {
        store.refresh(&server(name), &tools).unwrap();
    }
    let servers: Vec<String> = store
        .servers()
        .unwrap()
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(servers, sorted(&servers_in));
    let sorted = sorted(&tools_in);
    assert_eq!(names(&store.live(&server("a")).unwrap().tools), sorted);
    let at = store.version().unwrap();
    assert_eq!(names(&store.tools_at(&server("a"), at).unwrap()), sorted);
}

/// A listing of thousands of tools, each with every field a definition has, reads back
/// whole and equal, and listed again takes no version.
pub fn a_large_listing_reads_back_whole<S: CatalogStore>(fresh: &impl Fn() -> S) {
    let store = fresh();
    let big = server("big");
    let tools: Vec<ToolDefinition> = (0..3000)
        .map(|i| {
            let value = json!({
                "name": format!("tool_{i:04}"),
                "title": format!("Tool {i}"),
                "description": format!("Does thing {i}: \u{fc}nicode, \"quotes\", and\nlines."),
                "inputSchema": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": i}},
                    "required": ["n"],
                },
                "outputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": i % 2 == 0},
                "_meta": {"k": i},
            });
            serde_json::from_value(value).unwrap()
        })
        .collect();
    let first = store.refresh(&big, &tools).unwrap();
    assert_eq!(first.diff.added.len(), 3000);
    let live = store.live(&big).unwrap();
    assert_eq!(&*live.tools, tools.as_slice());
    let again = store.refresh(&big, &tools).unwrap();
    assert!(again.diff.is_empty());
    assert_eq!(again.version, first.version);
}
