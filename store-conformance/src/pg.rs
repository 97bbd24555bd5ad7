//! The machine's PostgreSQL for tests, benches and figures (`.ci/run` checks it answers):
//! its URL, `psql` (PostgreSQL's client, which `.ci/run` checks for too), and a schema of a
//! test's own, dropped when its guard goes.

/// The database tests use: `$PSYCH_TEST_PG`, by default
/// `postgres://postgres@127.0.0.1:5432/test` (trust authentication).
pub fn database() -> String {
    std::env::var("PSYCH_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `sql` on [`database`] through `psql`.
///
/// # Panics
///
/// When `psql` cannot run or the statement fails: a test fails loudly.
pub fn psql(sql: &str) {
    let status = std::process::Command::new("psql")
        .args([database().as_str(), "-qAtc", sql])
        .status()
        .unwrap_or_else(|e| panic!("psql runs: {e}"));
    assert!(status.success(), "psql {sql}");
}

/// A schema of a test's own: emptied when made, dropped when the guard goes.
#[derive(Debug)]
pub struct Schema(String);

impl Schema {
    /// The schema `t_{name}_{pid}` (the `t_` prefix `.ci/run` sweeps), dropped first if an
    /// earlier run left it.
    pub fn fresh(name: &str) -> Self {
        let schema = format!("t_{name}_{}", std::process::id());
        psql(&format!("drop schema if exists {schema} cascade"));
        Self(schema)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The store URL of the schema: [`database`] with `?schema=NAME`.
    pub fn url(&self) -> String {
        format!("{}?schema={}", database(), self.0)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        psql(&format!("drop schema if exists {} cascade", self.0));
    }
}
