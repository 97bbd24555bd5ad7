//! The store's errors, each with its source kept.

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL was refused.
    #[error(transparent)]
    Url(#[from] crate::UrlError),
    /// The runtime of the blocking store ([`PgBlocking`](crate::PgBlocking)) could not
    /// start.
    #[error("cannot start the store's runtime")]
    Runtime(#[source] std::io::Error),
    /// The connection pool could not be made.
    #[error("cannot make the PostgreSQL connection pool")]
    Pool(#[source] deadpool_postgres::BuildError),
    /// No connection could be had (the server is down, refuses the user, or did not answer
    /// within the connect timeout).
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] deadpool_postgres::PoolError),
    /// Creating or migrating the schema failed (nothing of it was committed).
    #[error("cannot create or migrate the schema {schema}")]
    Migrate {
        /// The schema.
        schema: String,
        /// What PostgreSQL said.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The schema was migrated by a later build of this crate, past what this build may
    /// read and write; it is refused rather than misread or written.
    #[error(
        "the schema {schema} has version {found} and opens only for builds that know version \
         {opens_from} or later; this build knows {supported}: upgrade psych-store-postgres"
    )]
    NewerSchema {
        /// The schema.
        schema: String,
        /// The version it holds.
        found: i64,
        /// The lowest version a build must know to open it (its version, when it predates
        /// the mark).
        opens_from: i64,
        /// The newest version this build knows.
        supported: i64,
    },
}
