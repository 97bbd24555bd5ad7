//! The store's address: a `postgres://` URL, with Psych's own query parameters (`schema`,
//! `pool_size`) taken out before the rest goes to tokio-postgres (which refuses parameters
//! it does not know).

use std::str::FromStr;

/// The schema the store's tables live in unless the URL names one.
pub const DEFAULT_SCHEMA: &str = "psych";

/// Connections the pool holds at most unless the URL says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The URL is not a `postgres://` or `postgresql://` URL.
    #[error("a PostgreSQL store URL begins with postgres:// or postgresql://")]
    NotPostgres,
    /// The `schema` parameter is not a plain lower-case SQL identifier.
    #[error(
        "the store URL's schema {name:?} is not usable: a lower-case letter or '_', then up \
         to 62 lower-case letters, digits or '_'"
    )]
    Schema {
        /// The schema as written.
        name: String,
    },
    /// The `pool_size` parameter is not a whole number from 1 to 1024.
    #[error("the store URL's pool_size {value:?} is not a whole number from 1 to 1024")]
    PoolSize {
        /// The value as written.
        value: String,
    },
    /// `sslmode=require` (or `verify-*`): TLS is not supported yet.
    #[error(
        "the store URL asks for TLS (sslmode={mode}); this build connects without TLS only: \
         reach PostgreSQL on a private network or through a local TLS tunnel"
    )]
    Tls {
        /// The mode asked for.
        mode: String,
    },
    /// tokio-postgres refused the rest of the URL.
    #[error("the store URL is not a PostgreSQL connection URL")]
    Config(#[source] tokio_postgres::Error),
}

/// A parsed store URL: the connection settings, the schema and the pool size.
#[derive(Debug, Clone)]
pub struct StoreUrl {
    /// What tokio-postgres connects with.
    pub config: tokio_postgres::Config,
    /// The schema the store's tables live in.
    pub schema: String,
    /// Connections the pool holds at most.
    pub pool_size: usize,
}

impl StoreUrl {
    /// Parses `url`: `postgres://user@host:port/database?schema=NAME&pool_size=N`, any
    /// other parameter being tokio-postgres's (`connect_timeout`, `application_name`, …).
    /// Its `options` are kept, after the store's lock timeouts (30 s waiting on a lock, 60 s
    /// idle in a transaction), which they may change, and before its `search_path` and
    /// `synchronous_commit=on`, which they may not.
    ///
    /// # Errors
    ///
    /// A [`UrlError`] saying what is wrong.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(UrlError::NotPostgres);
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = DEFAULT_SCHEMA.to_owned();
        let mut pool_size = DEFAULT_POOL_SIZE;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "schema" => {
                    if !valid_schema(value) {
                        return Err(UrlError::Schema {
                            name: value.to_owned(),
                        });
                    }
                    value.clone_into(&mut schema);
                }
                "pool_size" => {
                    pool_size = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1024).contains(n))
                        .ok_or_else(|| UrlError::PoolSize {
                            value: value.to_owned(),
                        })?;
                }
                "sslmode" if !matches!(value, "disable" | "prefer" | "allow") => {
                    return Err(UrlError::Tls {
                        mode: value.to_owned(),
                    });
                }
                _ => rest.push(pair),
            }
        }
        let url = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        let mut config = tokio_postgres::Config::from_str(&url).map_err(UrlError::Config)?;
        // A stalled peer (a replica paused mid-transaction) holds a row lock for at most a
        // minute, and no request waits on a lock longer than 30 s, unless the URL's own
        // `options` (kept, after these) say otherwise. Durable commits whatever the
        // server's default, and the store's schema first, whatever they say (last: the
        // last setting of a name wins).
        let own = config
            .get_options()
            .map(|own| format!("{own} "))
            .unwrap_or_default();
        config.options(format!(
            "-c lock_timeout=30s -c idle_in_transaction_session_timeout=60s {own}\
             -c search_path={schema} -c synchronous_commit=on"
        ));
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(std::time::Duration::from_secs(10));
        }
        Ok(Self {
            config,
            schema,
            pool_size,
        })
    }
}

/// A lower-case letter or `_`, then up to 62 lower-case letters, digits or `_`: an SQL
/// identifier that needs no quoting anywhere.
pub(crate) fn valid_schema(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && name.len() <= 63
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psychs_parameters_are_taken_out_and_the_rest_kept() {
        let url = StoreUrl::parse(
            "postgres://postgres@127.0.0.1:5432/test?schema=fleet_a&application_name=psych&pool_size=4",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((url.schema.as_str(), url.pool_size), ("fleet_a", 4));
        assert_eq!(url.config.get_application_name(), Some("psych"));
        assert_eq!(url.config.get_dbname(), Some("test"));
        assert_eq!(
            url.config.get_options(),
            Some(
                "-c lock_timeout=30s -c idle_in_transaction_session_timeout=60s \
                 -c search_path=fleet_a -c synchronous_commit=on"
            )
        );
        // The URL's own options are kept (review: they were replaced), before the two
        // settings the store needs.
        let own = StoreUrl::parse(
            "postgres://u@h/db?options=-c%20statement_timeout%3D5s%20-c%20lock_timeout%3D2min",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            own.config.get_options(),
            Some(
                "-c lock_timeout=30s -c idle_in_transaction_session_timeout=60s \
                 -c statement_timeout=5s -c lock_timeout=2min \
                 -c search_path=psych -c synchronous_commit=on"
            )
        );
        let plain = StoreUrl::parse("postgresql://u@h/db").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (plain.schema.as_str(), plain.pool_size),
            (DEFAULT_SCHEMA, DEFAULT_POOL_SIZE)
        );
    }

    #[test]
    fn bad_urls_are_refused_with_what_is_wrong() {
        let refused = |url: &str| StoreUrl::parse(url).err().map(|e| e.to_string());
        assert!(matches!(
            StoreUrl::parse("mysql://x/y"),
            Err(UrlError::NotPostgres)
        ));
        for schema in ["Fleet", "1a", "a-b", "a;drop", "", &"a".repeat(64)] {
            let url = format!("postgres://u@h/db?schema={schema}");
            assert!(
                matches!(StoreUrl::parse(&url), Err(UrlError::Schema { .. })),
                "{schema}"
            );
        }
        for size in ["0", "x", "1025"] {
            let url = format!("postgres://u@h/db?pool_size={size}");
            assert!(matches!(
                StoreUrl::parse(&url),
                Err(UrlError::PoolSize { .. })
            ));
        }
        assert!(
            refused("postgres://u@h/db?sslmode=require")
                .is_some_and(|e| e.contains("sslmode=require"))
        );
        assert!(matches!(
            StoreUrl::parse("postgres://u@h/db?no_such_option=1"),
            Err(UrlError::Config(_))
        ));
    }
}
