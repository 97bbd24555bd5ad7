//! Learned pinning's usage over a shared store: how many results of each of the most
//! recently written Runs reached each remote tool, whichever process wrote them.
//!
//! Read in one read-only snapshot (repeatable read), so a Run a sweep deletes meanwhile is
//! read as it was, whole. At most [`LOOKED_AT`] times `recent` Runs are looked at (one
//! query, newest first), a Run with a record that does not decode passed over for the next.
//! A Run's results are read a page at a time: their sizes first, then their bodies in
//! groups of at most [`GROUP_BYTES`] (a larger body alone), so memory is one group and the
//! tools counted, never a Run's history.

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;
use psych_types::{Identities, ToolRef};

use crate::records::{RecordError, db, rows};

/// Results whose sizes are read per round trip.
const PAGE: i64 = 512;
/// The most bytes of result bodies (texts left out: images, structured content) read at
/// once, but for one body larger than it.
const GROUP_BYTES: i64 = 8 << 20;
/// How many Runs are looked at, at most, for each Run asked for.
const LOOKED_AT: usize = 4;

/// For the `recent` most recently written Runs of the identities `whose` accepts (newest
/// first, ties by identity and Run), how many of each one's results reached each remote
/// tool.
pub(crate) async fn recent_targets(
    client: &mut deadpool_postgres::Object,
    whose: &Identities,
    recent: usize,
) -> Result<Vec<BTreeMap<ToolRef, u64>>, RecordError> {
    let mut counted = Vec::new();
    let (named, all_but) = match whose {
        Identities::Only(named) => (named, false),
        Identities::AllBut(named) => (named, true),
    };
    if recent == 0 || (named.is_empty() && !all_but) {
        return Ok(counted);
    }
    let snapshot = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    let most = i64::try_from(recent.saturating_mul(LOOKED_AT)).unwrap_or(i64::MAX);
    // `(identity = any(named)) <> all_but`: in the list, or out of it for "all but".
    let runs = rows(
        &snapshot,
        "select identity, run from runs where (identity = any($1)) <> $2
         order by last_write_at desc, identity, run limit $3",
        &[named, &all_but, &most],
    )
    .await?;
    for row in &runs {
        if counted.len() >= recent {
            break;
        }
        let (identity, run): (&str, &str) = (row.get(0), row.get(1));
        if let Some(calls) = targets_of(&snapshot, identity, run).await? {
            counted.push(calls);
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
        let sizes = rows(
            client,
            "select seq, octet_length(body)::bigint from records
             where identity = $1 and run = $2 and result and seq > $3
             order by seq limit $4",
            &[&identity, &run, &after, &PAGE],
        )
        .await?;
        // Groups of consecutive results, each read in one round trip.
        let mut from = after;
        let mut bytes = 0i64;
        for (i, row) in sizes.iter().enumerate() {
            let (seq, size): (i64, i64) = (row.get(0), row.get(1));
            bytes = bytes.saturating_add(size);
            let last = i + 1 == sizes.len();
            let next_over = sizes
                .get(i + 1)
                .is_some_and(|next| bytes.saturating_add(next.get::<_, i64>(1)) > GROUP_BYTES);
            if last || next_over {
                if !count(client, identity, run, (from, seq), &mut calls).await? {
                    return Ok(None);
                }
                (from, bytes) = (seq, 0);
            }
        }
        match sizes.last() {
            Some(last) if sizes.len() == usize::try_from(PAGE).unwrap_or(usize::MAX) => {
                after = last.get(0);
            }
            _ => return Ok(Some(calls)),
        }
    }
}

/// Counts the targets of `run`'s results numbered in `(after, through]` into `calls`;
/// `false` when one does not decode.
async fn count(
    client: &impl GenericClient,
    identity: &str,
    run: &str,
    (after, through): (i64, i64),
    calls: &mut BTreeMap<ToolRef, u64>,
) -> Result<bool, RecordError> {
    let bodies = rows(
        client,
        "select body from records
         where identity = $1 and run = $2 and result and seq > $3 and seq <= $4
         order by seq",
        &[&identity, &run, &after, &through],
    )
    .await?;
    for row in &bodies {
        let body: &[u8] = row.get(0);
        // The tag and target alone: the body's images and structured content are not built.
        match serde_json::from_slice::<Reached>(body) {
            Ok(reached) if reached.kind == "tool_result" => {
                if let Some(target) = reached.target {
                    *calls.entry(target).or_default() += 1;
                }
            }
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// What a tool result's body says of the remote tool its call reached; the fields every
/// result has are required (a body without them does not decode), their values passed
/// over.
#[derive(serde::Deserialize)]
#[allow(dead_code, reason = "required to decode, never read")]
struct Reached {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    target: Option<ToolRef>,
    call_id: serde::de::IgnoredAny,
    name: serde::de::IgnoredAny,
    output: serde::de::IgnoredAny,
}
