//! Learned pinning for `psych serve`: chosen once when the gateway starts, per grant, from
//! the sessions its logs hold of the identities with that grant (or, on a shared store, the
//! Runs every replica kept there), and kept for the process's whole life.
//!
//! A stdio client starts its own `psych serve` for each of its sessions, so "between
//! sessions" is "between processes" there; an HTTP gateway keeps one choice until it
//! restarts. Either way pinning never changes the listing while a client uses it. Each
//! grant (the file's, and each narrowed one of `--tokens`) learns from its own identities
//! only: the identities of one grant learn together (the file's grant from every identity
//! without `allowTools` of its own, and from the stdio and loopback folders; identities
//! narrowed to the same tools share one grant), so one identity's habits shape what the
//! others of its grant are listed (and so show which deferred tools it calls often), never
//! what an identity of another grant is listed.

use std::path::{Path, PathBuf};

use psych_disclosure::pinning::{DEFAULT_RECENT_RUNS, PinWhy, Pins, ToolUsage};
use psych_disclosure::{Surface, pinning::PinSettings};
use psych_types::{ServerCatalog, TokenEstimator};

/// The usage in a gateway's logs (`logs` is [`GatewaySettings::logs`](crate::GatewaySettings::logs),
/// `<dir>/serve/`) of the identities `whose` accepts: the [`DEFAULT_RECENT_RUNS`] most
/// recently written log segments of their folders together. A segment holds one process's
/// calls for one identity (until it rotates, at an eighth of the retention size): over
/// stdio one client session; over HTTP every session of that identity while the process
/// ran.
///
/// Blocking (directory listings and log reads): call it off the async workers.
pub fn serve_usage(logs: &Path, whose: impl Fn(&str) -> bool) -> ToolUsage {
    let identities: Vec<PathBuf> = std::fs::read_dir(logs)
        .map(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .filter(|entry| entry.file_name().to_str().is_some_and(&whose))
                .map(|entry| entry.path())
                .collect()
        })
        .unwrap_or_default();
    psych_runtime::usage_in_logs(&identities, DEFAULT_RECENT_RUNS, &[])
}

/// The usage in a shared store's Runs (`psych serve --store`, every replica's) of the
/// identities `whose` accepts: the [`DEFAULT_RECENT_RUNS`] most recently written Runs
/// together ([`RecordStores::recent_targets`](psych_types::RecordStores::recent_targets)).
/// A Run is what a segment is on files: one process's calls for one identity until it
/// rotates.
///
/// Blocking (database round trips): call it off the async workers.
///
/// # Errors
///
/// The store's failure.
pub fn store_usage(
    stores: &dyn psych_types::RecordStores,
    whose: &psych_types::Identities,
) -> Result<ToolUsage, psych_types::StoreError> {
    let mut usage = ToolUsage::new();
    for calls in stores.recent_targets(whose, DEFAULT_RECENT_RUNS)? {
        usage.add_counted_run(calls);
    }
    Ok(usage)
}

/// What learned pinning keeps on `surface` (resolved without learned pins, from
/// `catalogs`) from every identity's sessions under `logs`: what `psych budget --serve
/// --pin-budget` shows (for the file's grant; `psych serve --tokens` counts each narrowed
/// grant's identities apart).
///
/// Blocking, as [`serve_usage`].
pub fn learned_pins(
    logs: &Path,
    surface: &Surface,
    catalogs: &[ServerCatalog],
    estimator: &dyn TokenEstimator,
    settings: &PinSettings,
) -> Pins {
    psych_disclosure::pinning::choose(
        &serve_usage(logs, |_| true),
        surface,
        catalogs,
        estimator,
        settings,
    )
}

/// One line saying what was pinned for `whom` (the identities of one grant), for the
/// gateway's report.
pub(crate) fn summary(whom: &str, pins: &Pins) -> String {
    let pinned: Vec<String> = pins
        .choices
        .iter()
        .filter(|choice| choice.why == PinWhy::Pinned)
        .map(|choice| {
            format!(
                "{}/{} ({} sessions, {} calls)",
                choice.tool.server, choice.tool.tool, choice.used.runs, choice.used.calls
            )
        })
        .collect();
    if pinned.is_empty() {
        let unknown = pins
            .choices
            .iter()
            .filter(|choice| choice.why == PinWhy::NotPermitted)
            .count();
        return format!(
            "learned pinning for {whom}: nothing pinned ({} tools used in the {} most recent \
             sessions, {unknown} of them not in the catalogue or the grant now; none used \
             often enough within {} tokens)",
            pins.choices.len(),
            pins.runs,
            pins.budget
        );
    }
    format!(
        "learned pinning for {whom}: {} tools of deferred servers listed directly (~{} of {} \
         tokens), from the {} most recent sessions: {}",
        pinned.len(),
        pins.tokens(),
        pins.budget,
        pins.runs,
        pinned.join(", ")
    )
}

/// What learned pinning needs of the gateway's settings, taken before anything awaits
/// (the settings are not `Sync`).
pub(crate) struct Learning {
    pinning: PinSettings,
    logs: PathBuf,
    /// The shared store the Runs are kept in, if not the files under `logs`.
    stores: Option<std::sync::Arc<dyn psych_types::RecordStores>>,
    estimator: crate::SharedEstimator,
    report: std::sync::Arc<dyn Fn(&str) + Send + Sync>,
}

impl Learning {
    /// The settings' learned pinning, if it is on.
    pub(crate) fn of(settings: &crate::GatewaySettings) -> Option<Self> {
        Some(Self {
            pinning: settings.pinning?,
            logs: settings.logs(),
            stores: settings.stores.clone(),
            estimator: settings.estimator.clone(),
            report: std::sync::Arc::clone(&settings.report),
        })
    }
}

/// The connections of each lane at start, learned pins applied
/// ([`GatewaySettings::learned_pinning`](crate::GatewaySettings::learned_pinning)): one
/// entry per grant of `narrowed` (its identities' usage), then the file's grant's (the
/// usage of every other identity); `connections` unchanged for each without pinning, or
/// when the kept catalogue is not this process's (`held`: no definition to cost, said in
/// the report). `disclosure` is the listing's settings.
///
/// Off the async workers (log and catalogue reads, resolution).
pub(crate) async fn lane_connections(
    learning: Option<Learning>,
    catalog: &psych_catalog::Catalog,
    held: bool,
    connections: &[psych_types::ConnectionSpec],
    narrowed: &[(psych_types::PermissionGrant, Vec<String>)],
    file_grant: &psych_types::PermissionGrant,
    disclosure: &psych_disclosure::Settings,
) -> Result<Vec<Vec<psych_types::ConnectionSpec>>, tokio::task::JoinError> {
    let unchanged = vec![connections.to_vec(); narrowed.len() + 1];
    let Some(Learning {
        pinning,
        logs,
        stores,
        estimator,
        report,
    }) = learning
    else {
        return Ok(unchanged);
    };
    if held {
        report(
            "learned pinning: nothing pinned: the kept catalogue is held by another psych \
             serve on the same --dir, so no tool definition is known to cost",
        );
        return Ok(unchanged);
    }
    let (catalog, connections, disclosure) =
        (catalog.clone(), connections.to_vec(), disclosure.clone());
    let mut lanes: Vec<(psych_types::PermissionGrant, Vec<String>)> = narrowed.to_vec();
    // The file's grant last: every identity no narrowing names.
    let named: Vec<String> = narrowed.iter().flat_map(|(_, ids)| ids.clone()).collect();
    lanes.push((file_grant.clone(), Vec::new()));
    tokio::task::spawn_blocking(move || {
        let catalogs = match connections
            .iter()
            .map(|c| catalog.live(&c.server))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(catalogs) => catalogs,
            Err(error) => {
                report(&format!(
                    "learned pinning: nothing pinned: reading the catalogue: {}",
                    psych_types::error_chain(&error)
                ));
                return lanes.iter().map(|_| connections.clone()).collect();
            }
        };
        let last = lanes.len() - 1;
        lanes
            .iter()
            .enumerate()
            .map(|(i, (grant, identities))| {
                let whose = if i == last {
                    psych_types::Identities::AllBut(named.clone())
                } else {
                    psych_types::Identities::Only(identities.clone())
                };
                let whom = match (i == last, named.is_empty()) {
                    (false, _) => identities.join(", "),
                    (true, true) => "every identity".to_owned(),
                    (true, false) => "the identities of the file's grant".to_owned(),
                };
                let usage = match &stores {
                    None => serve_usage(&logs, |id| whose.accepts(id)),
                    Some(stores) => match store_usage(stores.as_ref(), &whose) {
                        Ok(usage) => usage,
                        Err(error) => {
                            report(&format!(
                                "learned pinning for {whom}: nothing pinned: reading the \
                                 store's sessions: {}",
                                psych_types::error_chain(&error)
                            ));
                            return connections.clone();
                        }
                    },
                };
                let mut pinned = connections.clone();
                match psych_runtime::choose_pins(
                    &catalogs,
                    &connections,
                    grant,
                    &disclosure,
                    estimator.as_ref(),
                    &usage,
                    &pinning,
                ) {
                    Ok(pins) => {
                        report(&summary(&whom, &pins));
                        pins.apply(&mut pinned);
                    }
                    Err(error) => report(&format!(
                        "learned pinning for {whom}: nothing pinned: {}",
                        psych_types::error_chain(&error)
                    )),
                }
                pinned
            })
            .collect()
    })
    .await
}
