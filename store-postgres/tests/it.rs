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
