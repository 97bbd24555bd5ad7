//! Learned pinning for `psych serve`: chosen once when the gateway starts, from the sessions
//! its logs hold, and kept for the process's whole life.
//!
//! A stdio client starts its own `psych serve` for each of its sessions, so "between
//! sessions" is "between processes" there; an HTTP gateway serving many sessions keeps one
//! choice until it restarts. Either way the listing's tool prefix never changes because of
//! pinning while a client uses it.

use std::path::{Path, PathBuf};

use psych_catalog::Catalog;
use psych_disclosure::pinning::{DEFAULT_RECENT_RUNS, PinSettings, PinWhy, Pins, ToolUsage};
use psych_disclosure::{Inputs, Settings, Surface};
use psych_types::{ConnectionSpec, PermissionGrant, ServerCatalog, TokenEstimator};

/// The usage in a gateway's logs (`logs` is [`GatewaySettings::logs`](crate::GatewaySettings::logs),
/// `<dir>/serve/`): the [`DEFAULT_RECENT_RUNS`] most recently written segments of every
/// identity's folder together, each segment one session (a process's calls for one
/// identity, or a part of them when its segment rotated).
///
/// Blocking (directory listings and log reads): call it off the async workers.
pub fn serve_usage(logs: &Path) -> ToolUsage {
    let identities: Vec<PathBuf> = std::fs::read_dir(logs)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.is_dir())
                .collect()
        })
        .unwrap_or_default();
    psych_runtime::usage_in_logs(&identities, DEFAULT_RECENT_RUNS, &[])
}

/// What learned pinning keeps for a gateway whose logs are under `logs`, on `surface` (the
/// listing resolved without learned pins, from `catalogs`): what [`serve`](crate::serve)
/// applies at start with [`GatewaySettings::learned_pinning`](crate::GatewaySettings::learned_pinning),
/// and `psych budget --serve --pin-budget` shows.
///
/// Blocking, as [`serve_usage`].
pub fn learned_pins(
    logs: &Path,
    surface: &Surface,
    catalogs: &[ServerCatalog],
    estimator: &dyn TokenEstimator,
    settings: &PinSettings,
) -> Pins {
    psych_disclosure::pinning::choose(&serve_usage(logs), surface, catalogs, estimator, settings)
}

/// The pins for the gateway's connections at start: the Surface they resolve to with the
/// kept catalogue and the file's grant, without pins, then [`learned_pins`].
///
/// Blocking (redb reads, log reads, resolution): off the async workers.
pub(crate) fn at_start(
    logs: &Path,
    catalog: &Catalog,
    connections: &[ConnectionSpec],
    grant: &PermissionGrant,
    settings: &Settings,
    estimator: &dyn TokenEstimator,
    pinning: &PinSettings,
) -> Result<Pins, String> {
    let catalogs = connections
        .iter()
        .map(|c| catalog.live(&c.server))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("reading the catalogue: {e}"))?;
    let inputs = Inputs {
        connections,
        catalogs: &catalogs,
        grant,
    };
    let surface = psych_disclosure::resolve(&inputs, settings, estimator)
        .map_err(|e| format!("resolving the tool surface: {e}"))?;
    Ok(learned_pins(logs, &surface, &catalogs, estimator, pinning))
}

/// One line saying what was pinned, for the gateway's report.
pub(crate) fn summary(pins: &Pins) -> String {
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
        return format!(
            "learned pinning: nothing pinned ({} tools used in the {} most recent sessions, \
             none used often enough within {} tokens)",
            pins.choices.len(),
            pins.runs,
            pins.budget
        );
    }
    format!(
        "learned pinning: {} tools of deferred servers listed directly (~{} of {} tokens), \
         from the {} most recent sessions: {}",
        pinned.len(),
        pins.tokens(),
        pins.budget,
        pins.runs,
        pinned.join(", ")
    )
}
