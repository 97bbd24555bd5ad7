//! psych-store-postgres against a real PostgreSQL (`$PSYCH_TEST_PG`, by default the
//! machine's `postgres://postgres@127.0.0.1:5432/test`; `.ci/run` checks it answers), each
//! test in a schema of its own, dropped at its end: the schema created once by concurrent
//! opens, a newer schema refused and left as it is, catalogue rows the database refuses to
//! delete, and an unreachable database a typed error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_store_postgres::{OpenError, PgStore, SCHEMA_VERSION};

/// The database the tests use.
fn database() -> String {
    std::env::var("PSYCH_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of the test's own, emptied now and dropped when the guard goes.
struct Schema {
    name: String,
}

impl Schema {
    async fn fresh(test: &str) -> Self {
        let name = format!("t_{test}_{}", std::process::id());
        raw(&format!("drop schema if exists {name} cascade")).await;
        Self { name }
    }

    fn url(&self) -> String {
        format!("{}?schema={}", database(), self.name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let name = self.name.clone();
        // A runtime of its own: the test's may be shutting down.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(raw(&format!("drop schema if exists {name} cascade")));
        })
        .join();
    }
}

/// A plain connection to the database, outside the store.
async fn client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL answers (see .ci/run)");
    tokio::spawn(connection);
    client
}

async fn raw(sql: &str) {
    client().await.batch_execute(sql).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_opening_together_create_the_schema_once() {
    let schema = Schema::fresh("together").await;
    let url = schema.url();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::open(&url).await })
        })
        .collect();
    for open in opens {
        let store = open.await.unwrap().unwrap();
        assert_eq!(store.schema(), schema.name);
        assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    }
    let rows = client()
        .await
        .query(
            &format!(
                "select key, value from {}.psych_meta order by key",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    let meta: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        meta,
        [
            ("catalog_version".to_owned(), 0),
            ("schema_version".to_owned(), SCHEMA_VERSION)
        ]
    );
    // Opened again, nothing is applied twice.
    let again = PgStore::open(&url).await.unwrap();
    assert_eq!(again.schema_version().await.unwrap(), SCHEMA_VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_this_build_is_refused_and_left_as_it_is() {
    let schema = Schema::fresh("newer").await;
    PgStore::open(&schema.url()).await.unwrap();
    raw(&format!(
        "update {}.psych_meta set value = 99 where key = 'schema_version'",
        schema.name
    ))
    .await;
    let refused = PgStore::open(&schema.url()).await.unwrap_err();
    match &refused {
        OpenError::NewerSchema {
            schema: name,
            found: 99,
            supported,
        } => assert_eq!(
            (name.as_str(), *supported),
            (schema.name.as_str(), SCHEMA_VERSION)
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        refused.to_string().contains("upgrade psych-store-postgres"),
        "{refused}"
    );
    let row = client()
        .await
        .query_one(
            &format!(
                "select value from {}.psych_meta where key = 'schema_version'",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 99);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_to_delete_a_catalogue_row() {
    let schema = Schema::fresh("never_deleted").await;
    PgStore::open(&schema.url()).await.unwrap();
    let db = client().await;
    let s = &schema.name;
    db.batch_execute(&format!(
        "insert into {s}.servers (server) values ('fs');
         insert into {s}.tools (server, name, since, def) values ('fs', 'read', 1, '\\x7b7d')"
    ))
    .await
    .unwrap();
    let refused = |result: Result<u64, tokio_postgres::Error>| {
        let error = result.unwrap_err();
        error
            .as_db_error()
            .map(|e| e.message().to_owned())
            .unwrap_or_else(|| error.to_string())
    };
    let deleted = refused(db.execute(&format!("delete from {s}.tools"), &[]).await);
    assert!(deleted.contains("never deleted"), "{deleted}");
    let truncated = refused(db.execute(&format!("truncate {s}.tools"), &[]).await);
    assert!(truncated.contains("never deleted"), "{truncated}");
    let rewritten = refused(
        db.execute(&format!("update {s}.tools set def = '\\x5b5d'"), &[])
            .await,
    );
    assert!(rewritten.contains("only by its removed_at"), "{rewritten}");
    // Marking it removed, once, is what a refresh does.
    assert_eq!(
        db.execute(&format!("update {s}.tools set removed_at = 2"), &[])
            .await
            .unwrap(),
        1
    );
    let twice = refused(
        db.execute(&format!("update {s}.tools set removed_at = 3"), &[])
            .await,
    );
    assert!(twice.contains("set once"), "{twice}");
    let count = db
        .query_one(&format!("select count(*) from {s}.tools"), &[])
        .await
        .unwrap();
    assert_eq!(count.get::<_, i64>(0), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_a_typed_connect_error() {
    let started = std::time::Instant::now();
    let refused = PgStore::open("postgres://postgres@127.0.0.1:1/test?connect_timeout=5")
        .await
        .unwrap_err();
    assert!(matches!(refused, OpenError::Connect(_)), "{refused:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(refused.to_string(), "cannot connect to PostgreSQL");
    assert!(std::error::Error::source(&refused).is_some());
}

/// Runs `sql` on a plain connection, from a thread with a runtime of its own (so it works
/// from a plain test thread or a guard's drop).
fn raw_blocking(sql: String) {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(raw(&sql));
    })
    .join()
    .unwrap();
}

/// A test schema dropped when the store holding it goes.
#[derive(Debug)]
struct DropSchema(String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        raw_blocking(format!("drop schema if exists {} cascade", self.0));
    }
}

/// The stores' conformance suite (psych-store-conformance), the one the redb catalogue
/// passes, each property over a fresh schema of its own.
mod conformance {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use psych_store_conformance::Kept;
    use psych_store_postgres::PgCatalog;

    use super::{DropSchema, database, raw_blocking};

    fn fresh() -> Kept<PgCatalog, DropSchema> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "t_conformance_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        raw_blocking(format!("drop schema if exists {name} cascade"));
        let catalog = PgCatalog::open(&format!("{}?schema={name}", database())).unwrap();
        Kept(catalog, DropSchema(name))
    }

    psych_store_conformance::catalog_conformance!(fresh);
}

/// Two replicas' catalogues on one schema refreshing at once, each server from both: every
/// change takes a version of its own, each server's live set is a listing one of them made
/// whole, and every version reads back as one whole listing.
#[test]
fn replicas_refreshing_together_take_distinct_versions_and_store_whole_listings() {
    use psych_store_postgres::PgCatalog;
    use psych_types::{CatalogStore, ServerId, ToolDefinition, ToolName};

    let name = format!("t_replicas_{}", std::process::id());
    raw_blocking(format!("drop schema if exists {name} cascade"));
    let _drop = DropSchema(name.clone());
    let url = format!("{}?schema={name}", database());
    let replicas = [
        PgCatalog::open(&url).unwrap(),
        PgCatalog::open(&url).unwrap(),
    ];
    // Listing `n` of a server: tools t0..t(n % 5 + 1), each described with `n`.
    let listing = |n: usize| -> Vec<ToolDefinition> {
        (0..=n % 5)
            .map(|t| {
                let tool = ToolName::new(format!("t{t}")).unwrap();
                ToolDefinition::new(tool, format!("listing {n}"), Default::default())
            })
            .collect()
    };
    let servers = [ServerId::new("a").unwrap(), ServerId::new("b").unwrap()];
    let changes: usize = std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for (i, replica) in replicas.iter().enumerate() {
            for server in &servers {
                let listing = &listing;
                workers.push(scope.spawn(move || {
                    (0..15)
                        .map(|round| {
                            let refreshed =
                                replica.refresh(server, &listing(round * 2 + i)).unwrap();
                            usize::from(!refreshed.diff.is_empty())
                        })
                        .sum::<usize>()
                }));
            }
        }
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let catalog = &replicas[0];
    let version = catalog.version().unwrap();
    assert_eq!(version.0, changes as u64, "one version per change");
    for v in 1..=version.0 {
        for server in &servers {
            let tools = catalog
                .tools_at(server, psych_types::CatalogVersion(v))
                .unwrap();
            // Whole: every tool of one listing (one description), t0..tk with no gap.
            let descriptions: std::collections::BTreeSet<_> =
                tools.iter().map(|t| t.description.clone()).collect();
            assert!(
                descriptions.len() <= 1,
                "version {v} of {server}: {descriptions:?}"
            );
            for (k, tool) in tools.iter().enumerate() {
                assert_eq!(tool.name.as_str(), format!("t{k}"));
            }
        }
    }
    assert_eq!(
        replicas[1].live(&servers[0]).unwrap(),
        replicas[0].live(&servers[0]).unwrap()
    );
}

/// Called from async code by mistake, the blocking catalogue does not panic: on a
/// multi-threaded runtime's worker it blocks in place; on a single-threaded runtime's thread
/// it answers that it must be called from `spawn_blocking`.
#[test]
fn called_on_an_async_thread_the_catalogue_blocks_in_place_or_says_why() {
    use psych_store_postgres::{CatalogError, PgCatalog};
    use psych_types::{CatalogFailure, CatalogStore, ServerId};

    let name = format!("t_async_{}", std::process::id());
    raw_blocking(format!("drop schema if exists {name} cascade"));
    let _drop = DropSchema(name.clone());
    let catalog = PgCatalog::open(&format!("{}?schema={name}", database())).unwrap();
    let fs = ServerId::new("fs").unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let in_place = multi.block_on(async {
        let catalog = catalog.clone();
        let fs = fs.clone();
        tokio::spawn(async move { catalog.refresh(&fs, &[]) })
            .await
            .unwrap()
    });
    assert!(in_place.is_ok(), "{in_place:?}");
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = single.block_on(async { catalog.live(&fs) }).unwrap_err();
    assert!(
        matches!(refused, CatalogError::OnAsyncThread),
        "{refused:?}"
    );
    assert_eq!(catalog.failure(&refused), CatalogFailure::Unavailable);
    // Off any runtime, it answers.
    assert!(catalog.live(&fs).unwrap().tools.is_empty());
}

/// A live read at a set version already read hands out the same allocation (nothing is
/// fetched or decoded again); a change gives a new one, read through any clone.
#[test]
fn a_live_set_is_decoded_once_per_set_version() {
    use psych_store_postgres::PgCatalog;
    use psych_types::{CatalogStore, ServerId, ToolDefinition, ToolName};

    let name = format!("t_live_cache_{}", std::process::id());
    raw_blocking(format!("drop schema if exists {name} cascade"));
    let _drop = DropSchema(name.clone());
    let catalog = PgCatalog::open(&format!("{}?schema={name}", database())).unwrap();
    let other = PgCatalog::open(&format!("{}?schema={name}", database())).unwrap();
    let fs = ServerId::new("fs").unwrap();
    let tool = |d: &str| ToolDefinition::new(ToolName::new("read").unwrap(), d, Default::default());
    catalog.refresh(&fs, &[tool("Read")]).unwrap();
    let first = catalog.live(&fs).unwrap();
    let again = catalog.clone().live(&fs).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first.tools, &again.tools));
    // Another replica changes it: the next read sees the change.
    other.refresh(&fs, &[tool("Read a file")]).unwrap();
    let changed = catalog.live(&fs).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&first.tools, &changed.tools));
    assert_eq!(changed.tools[0].description.as_deref(), Some("Read a file"));
    assert!(changed.version > first.version);
}
