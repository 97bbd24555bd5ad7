//! Learned pinning's usage over a shared store: how many results of each of the most
//! recently written Runs reached each remote tool, whichever process wrote them.

use std::collections::{BTreeMap, BTreeSet};

use deadpool_postgres::GenericClient;
use psych_types::{Record, ToolRef};

use crate::records::{RecordError, db};

/// Results read per round trip: a Run's results are counted a page at a time, so memory is
/// a page and the tools counted, never a Run's history.
const PAGE: i64 = 512;

/// Every identity with a Run in the store, in order.
pub(crate) async fn identities(client: &impl GenericClient) -> Result<Vec<String>, RecordError> {
    let rows = client
        .query("select distinct identity from runs order by identity", &[])
        .await
        .map_err(db)?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// For the `recent` most recently written Runs of `identities` (newest first, ties by
/// identity and Run), how many of each one's results reached each remote tool. A Run with
/// a record that does not decode is passed over for the next one.
pub(crate) async fn recent_targets(
    client: &impl GenericClient,
    identities: &[String],
    recent: usize,
) -> Result<Vec<BTreeMap<ToolRef, u64>>, RecordError> {
    let mut counted = Vec::new();
    if identities.is_empty() || recent == 0 {
        return Ok(counted);
    }
    let page = i64::try_from(recent).unwrap_or(i64::MAX).clamp(1, PAGE);
    // Runs move up as they are written meanwhile: one seen on an earlier page is not
    // counted twice.
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut offset = 0i64;
    while counted.len() < recent {
        let runs = client
            .query(
                "select identity, run from runs where identity = any($1)
                 order by last_write_at desc, identity, run limit $2 offset $3",
                &[&identities, &page, &offset],
            )
            .await
            .map_err(db)?;
        if runs.is_empty() {
            break;
        }
        offset += i64::try_from(runs.len()).unwrap_or(i64::MAX);
        for row in &runs {
            let (identity, run): (String, String) = (row.get(0), row.get(1));
            if counted.len() >= recent || !seen.insert((identity.clone(), run.clone())) {
                continue;
            }
            if let Some(calls) = targets_of(client, &identity, &run).await? {
                counted.push(calls);
            }
        }
    }
    Ok(counted)
}

/// How many results of `identity`'s Run `run` reached each remote tool, `None` when one of
/// its results does not decode.
async fn targets_of(
    client: &impl GenericClient,
    identity: &str,
    run: &str,
) -> Result<Option<BTreeMap<ToolRef, u64>>, RecordError> {
    let mut calls: BTreeMap<ToolRef, u64> = BTreeMap::new();
    let mut after = -1i64;
    loop {
        let statement = client
            .prepare_cached(
                "select seq, body from records
                 where identity = $1 and run = $2 and result and seq > $3
                 order by seq limit $4",
            )
            .await
            .map_err(db)?;
        let rows = client
            .query(&statement, &[&identity, &run, &after, &PAGE])
            .await
            .map_err(db)?;
        for row in &rows {
            let body: &[u8] = row.get(1);
            match serde_json::from_slice::<Record>(body) {
                Ok(Record::ToolResult(result)) => {
                    if let Some(target) = result.target {
                        *calls.entry(target).or_default() += 1;
                    }
                }
                _ => return Ok(None),
            }
        }
        match rows.last() {
            Some(last) if rows.len() as i64 == PAGE => after = last.get(0),
            _ => return Ok(Some(calls)),
        }
    }
}
