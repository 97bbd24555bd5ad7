//! The store's tables, created and migrated by the store itself: numbered migrations
//! applied in order in one transaction, under an advisory lock keyed by the schema (so
//! replicas starting together migrate once), the version kept in `psych_meta`.
//!
//! Beside the version, `psych_meta` keeps `opens_from`: the lowest version a build must
//! know to read and write the schema, the highest [`Migration::opens_from`] of those run on
//! it. A migration that only adds what older builds never touch (a table, a column with a
//! default) leaves it where it was, so replicas of the older build keep opening the schema
//! while the newer ones roll out; one that changes what they read raises it. A schema
//! newer than this build is opened when its `opens_from` is at most this build's version,
//! and refused otherwise (nothing written to it either way); a schema without the mark
//! (migrated before it existed) opens only for builds that know its version.
//!
//! Waits. The connection's `lock_timeout` (30 s unless the URL says otherwise) and any
//! `statement_timeout` the URL sets are for requests, not migrations. A process opening
//! the schema waits up to [`MIGRATION_WAIT`] for another's migration (the advisory lock),
//! however long that takes, so replicas starting together migrate once rather than fail.
//! No statement of the migration is cut by the URL's `statement_timeout`: its waits for
//! locks are bounded here, and its work (a table rewritten) cut short would fail every
//! open the same way. The migration's own statements wait at most [`DDL_LOCK_WAIT`] for a
//! table lock: an `ALTER TABLE` queued behind an older replica's long append stalls every
//! request to that table while it waits, so it gives way instead, the migration is rolled
//! back whole and tried again after [`RETRY_PAUSE`] (in which the requests queued behind
//! it go through), until [`MIGRATION_RETRIES_FOR`] has passed, before the open fails. A
//! deadlock with a request (40P01) is tried again the same way. The advisory lock is the
//! session's, held across the tries (released when the migration commits; a failed or
//! cancelled open drops its pool, which ends the session once its statement under way
//! ends), so no other replica's
//! migration takes the pauses: requests to a table being migrated wait at most about
//! [`DDL_LOCK_WAIT`] at a time behind it, and then for the migration's own work once it
//! has its lock. A process killed mid-migration leaves no statement running on: the
//! server checks every second ([`CHECK_CLIENT`]) that the client is still there, and
//! ends the session when it is not (a rewrite of `runs` would otherwise run on to its
//! end, unbounded, holding `runs` and the migration lock).
//!
//! A migration that alters `runs` also waits for a retention sweep under way
//! ([`PgBlocking::sweep`](crate::PgBlocking::sweep)): the sweep reads the doomed Runs
//! through a cursor whose transaction holds `runs` (`ACCESS SHARE`) for the whole sweep,
//! its deletions included, which on a large store may outlast the migration's tries; the
//! open then fails, and an open after the sweep succeeds. Such a migration is best run
//! while no sweep is under way.

use std::time::Duration;

use tokio_postgres::{Client, Transaction};

use crate::OpenError;

/// How long an open waits for another process's migration of the schema to end (the
/// advisory lock), as PostgreSQL's `lock_timeout`: replicas queued behind one migrating
/// wait rather than fail.
const MIGRATION_WAIT: &str = "10min";

/// How long one of the migration's statements waits for a table lock, as PostgreSQL's
/// `lock_timeout`: requests to the table queue behind a waiting `ALTER TABLE`, so it waits
/// briefly and the migration is tried again.
const DDL_LOCK_WAIT: &str = "500ms";

/// How long a migration whose statement could not lock its table (or deadlocked) is tried
/// again, from its first try, before the open fails.
const MIGRATION_RETRIES_FOR: Duration = Duration::from_secs(120);

/// The pause before a migration is tried again, which lets the requests queued behind its
/// statement through. Not jittered: the session's advisory lock lets one migration of the
/// schema try at a time, so there is no herd of replicas trying in step to spread.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Has the server check, every second while one of the migration's statements runs
/// (waits for locks included), that the client is still connected, and end the session
/// if not (`client_connection_check_interval`, for the transaction): with the default, 0,
/// it notices a lost client only when it next reads or writes, so a killed process's
/// migration would run on, past any timeout (its statements have none). A server that
/// refuses the setting (before PostgreSQL 14, or a platform without the check) goes
/// without it.
const CHECK_CLIENT: &str = "do $$ begin
        perform set_config('client_connection_check_interval', '1s', true);
    exception when undefined_object or invalid_parameter_value then null;
    end $$";

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// One migration: its statements, and the lowest schema version a build must know to read
/// and write a schema it has run on.
struct Migration {
    /// The statements, run with the schema first on the search path.
    sql: &'static str,
    /// The lowest version a build must know to use a schema this migration has run on: its
    /// own number when older builds would misread or miswrite what it changes, lower when
    /// it only adds what they never touch. Migrations 1 to 4 came before builds read the
    /// mark, so each says its own number (builds before the mark refuse any newer schema
    /// whatever it says).
    opens_from: i64,
}

/// Migration `n` (from 1) brings a schema from version `n - 1` to `n`. Never edited once
/// released: a change is a new migration.
const MIGRATIONS: [Migration; 4] = [
    // 1: the catalogue. Tool rows are never hard-deleted (the spec's catalogue history):
    // triggers refuse a DELETE or TRUNCATE of `tools`, and an UPDATE other than setting a
    // live row's `removed_at` once. Names compare by bytes (`collate "C"`), the order
    // redb's keys give.
    Migration {
        sql: r#"
    insert into psych_meta (key, value) values ('catalog_version', 0);
    create table servers (
        server          text collate "C" primary key,
        set_version     bigint not null default 0,
        sync_version    bigint,
        sync_at         bigint,
        sync_started_at bigint,
        error_at        bigint,
        error_message   text
    );
    create table tools (
        server     text collate "C" not null references servers,
        name       text collate "C" not null,
        since      bigint not null,
        removed_at bigint not null default 0,
        def        bytea not null,
        primary key (server, name, since)
    );
    create index tools_live on tools (server, name) where removed_at = 0;
    create function psych_never_delete() returns trigger language plpgsql as $$
    begin
        raise exception 'psych: catalogue rows are never deleted (% on %)', tg_op, tg_table_name;
    end $$;
    create trigger tools_no_delete before delete on tools
        for each row execute function psych_never_delete();
    create trigger tools_no_truncate before truncate on tools
        for each statement execute function psych_never_delete();
    create function psych_soft_delete_only() returns trigger language plpgsql as $$
    begin
        if (new.server, new.name, new.since, new.def)
               is distinct from (old.server, old.name, old.since, old.def)
           or old.removed_at <> 0 or new.removed_at = 0 then
            raise exception 'psych: a catalogue row changes only by its removed_at, set once';
        end if;
        return new;
    end $$;
    create trigger tools_soft_delete_only before update on tools
        for each row execute function psych_soft_delete_only();
    "#,
        opens_from: 1,
    },
    // 2: records. Every row names its Run's identity, and every read names it too. A
    // tool result's readable text is in `chunks` (128 KiB each, uncompressed and out of
    // line, so a slice reads only its pages), each with the line breaks before it; its
    // record row holds the result with its texts left empty and each text's span.
    Migration {
        sql: r#"
    create table runs (
        identity   text collate "C" not null,
        run        text collate "C" not null,
        records    bigint not null default 0,
        bytes      bigint not null default 0,
        created_at bigint not null,
        primary key (identity, run)
    );
    create table records (
        identity     text collate "C" not null,
        run          text collate "C" not null,
        seq          bigint not null,
        body         bytea not null,
        result       boolean not null,
        readable_len bigint,
        line_breaks  bigint,
        estimate     bigint,
        text_only    boolean,
        spans        bytea,
        primary key (identity, run, seq),
        foreign key (identity, run) references runs
    );
    create table chunks (
        identity      text collate "C" not null,
        run           text collate "C" not null,
        seq           bigint not null,
        idx           integer not null,
        breaks_before bigint not null,
        data          bytea not null,
        primary key (identity, run, seq, idx)
    );
    alter table chunks alter column data set storage external;
    -- A line mark: the last chunk with fewer line breaks before it than the line.
    create index chunks_lines on chunks (identity, run, seq, breaks_before, idx);
    "#,
        opens_from: 2,
    },
    // 3: retention. A Run's last write and its writer's lease (the database's clock, in
    // milliseconds), and the Runs retention deleted, so their handles answer that they
    // expired and their names are not used again while remembered (pruned to the newest
    // `EXPIRED_KEPT` per identity by the sweep).
    Migration {
        sql: r#"
    -- A Run made by a build without retention gets a last write and a lease at its
    -- creation (the defaults), so it is kept for the age at least; Runs made before this
    -- migration count from it.
    alter table runs add column last_write_at bigint not null
        default (extract(epoch from clock_timestamp()) * 1000)::bigint;
    alter table runs add column lease_until bigint not null
        default (extract(epoch from clock_timestamp()) * 1000)::bigint + 300000;
    create index runs_by_age on runs (identity, last_write_at);
    create table expired_runs (
        identity   text collate "C" not null,
        run        text collate "C" not null,
        expired_at bigint not null,
        why        text not null,
        primary key (identity, run)
    );
    "#,
        opens_from: 3,
    },
    // 4: keys every process using the store shares (a gateway's replicas seal the state of
    // a multi-round call with one, so that any of them opens it), each made once, by the
    // first process to ask, from the database's strong random source.
    Migration {
        sql: r#"
    create table shared_keys (
        name  text collate "C" primary key,
        value bytea not null check (octet_length(value) = 32)
    );
    "#,
        opens_from: 4,
    },
];

/// The advisory lock of `schema`'s migrations: FNV-1a (64 bits) of a name that says what
/// it locks, as PostgreSQL's signed key.
fn migration_lock(schema: &str) -> i64 {
    let name = format!("psych-store-postgres migrate {schema}");
    i64::from_le_bytes(psych_types::fnv1a(name.as_bytes(), 0).to_le_bytes())
}

/// The settings of a migration's transaction: its locks waited for `lock_wait` (a
/// PostgreSQL interval), its statements not cut by the connection's `statement_timeout`,
/// and a vanished opener noticed within a second ([`CHECK_CLIENT`]).
fn migration_settings(lock_wait: &str) -> String {
    format!(
        "set local lock_timeout = '{lock_wait}'; set local statement_timeout = 0;
         {CHECK_CLIENT}"
    )
}

/// Brings `schema` to [`SCHEMA_VERSION`] on `client`, in one transaction under the
/// schema's migration lock (the session's, released at the end), tried again when one of
/// its statements could not lock its table within [`DDL_LOCK_WAIT`] or deadlocked (see the
/// module's doc): whether the lock was released. A newer schema this build may open (its
/// `opens_from` at most [`SCHEMA_VERSION`]) is left as it is, and one it may not is
/// [`OpenError::NewerSchema`]. On an error the lock may still be held: the caller drops
/// the connection (and its pool), which releases it. An unlock that fails after the
/// migration committed is not an error (the open has succeeded): `Ok(false)`, and the
/// caller closes the connection rather than pool it, which releases the lock.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<bool, OpenError> {
    let migrate = |source| OpenError::Migrate {
        schema: schema.to_owned(),
        source,
    };
    let lock = migration_lock(schema);
    // Taken in a transaction for its settings, held by the session past its commit.
    let transaction = client.transaction().await.map_err(migrate)?;
    transaction
        .batch_execute(&migration_settings(MIGRATION_WAIT))
        .await
        .map_err(migrate)?;
    transaction
        .execute("select pg_advisory_lock($1)", &[&lock])
        .await
        .map_err(migrate)?;
    transaction.commit().await.map_err(migrate)?;
    let until = tokio::time::Instant::now() + MIGRATION_RETRIES_FOR;
    loop {
        let transaction = client.transaction().await.map_err(migrate)?;
        transaction
            .batch_execute(&migration_settings(DDL_LOCK_WAIT))
            .await
            .map_err(migrate)?;
        match migrate_locked(&transaction, schema).await {
            Ok(_) => {
                transaction.commit().await.map_err(migrate)?;
                // A failed unlock does not fail the open: the migration is committed, and
                // the lock goes with the session, which the caller ends.
                let unlocked = client
                    .execute("select pg_advisory_unlock($1)", &[&lock])
                    .await;
                return Ok(unlocked.is_ok());
            }
            Err(OpenError::Migrate { source, .. })
                if tokio::time::Instant::now() < until && gives_way(&source) =>
            {
                transaction.rollback().await.map_err(migrate)?;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether a migration's statement failed for want of a table lock a request holds: it
/// waited [`DDL_LOCK_WAIT`] (55P03) or deadlocked with the request (40P01).
fn gives_way(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;

    error.code().is_some_and(|code| {
        *code == SqlState::LOCK_NOT_AVAILABLE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// [`migrate`]'s work in `transaction`, under the schema's migration lock: creates the
/// schema and its `psych_meta`, then runs the migrations it lacks.
async fn migrate_locked(transaction: &Transaction<'_>, schema: &str) -> Result<i64, OpenError> {
    let migrate = |source| OpenError::Migrate {
        schema: schema.to_owned(),
        source,
    };
    // `schema` is a checked identifier (`url::valid_schema`): no quoting is needed.
    transaction
        .batch_execute(&format!(
            "create schema if not exists {schema};
             create table if not exists {schema}.psych_meta (
                 key text collate \"C\" primary key, value bigint not null)"
        ))
        .await
        .map_err(migrate)?;
    let meta = |key: &'static str| async move {
        transaction
            .query_opt(
                &format!("select value from {schema}.psych_meta where key = $1"),
                &[&key],
            )
            .await
            .map(|row| row.map(|row| row.get::<_, i64>(0)))
    };
    let found = meta("schema_version").await.map_err(migrate)?.unwrap_or(0);
    if found > SCHEMA_VERSION {
        // A schema without the mark was migrated before builds read it: only a build that
        // knows its version may open it.
        let opens_from = meta("opens_from").await.map_err(migrate)?.unwrap_or(found);
        if opens_from > SCHEMA_VERSION {
            return Err(OpenError::NewerSchema {
                schema: schema.to_owned(),
                found,
                opens_from,
                supported: SCHEMA_VERSION,
            });
        }
        return Ok(found);
    }
    let set = |key: &'static str, value: i64| async move {
        transaction
            .execute(
                &format!(
                    "insert into {schema}.psych_meta (key, value) values ($1, $2)
                     on conflict (key) do update set value = excluded.value"
                ),
                &[&key, &value],
            )
            .await
    };
    let mut opens_from = meta("opens_from").await.map_err(migrate)?.unwrap_or(found);
    for (done, migration) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(found).unwrap_or(0))
    {
        transaction
            .batch_execute(&format!(
                "set local search_path = {schema}; {}",
                migration.sql
            ))
            .await
            .map_err(migrate)?;
        let version = i64::try_from(done + 1).unwrap_or(i64::MAX);
        opens_from = opens_from.max(migration.opens_from);
        set("schema_version", version).await.map_err(migrate)?;
        set("opens_from", opens_from).await.map_err(migrate)?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_migration_asks_for_a_version_after_its_own() {
        for (at, migration) in MIGRATIONS.iter().enumerate() {
            let number = i64::try_from(at + 1).unwrap_or(i64::MAX);
            assert!(
                (1..=number).contains(&migration.opens_from),
                "migration {number} opens from {}",
                migration.opens_from
            );
        }
    }
}
