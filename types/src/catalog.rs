//! What a catalogue knows of each server besides its tools: the catalogue version, when the
//! server was last listed successfully, its last error, and whether it is reachable now.
//!
//! The catalogue crate produces these and disclosure reads them, so a server that is
//! unreachable, or empty because of errors, is listed with its state instead of vanishing.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{ServerId, ToolDefinition, ToolName};

/// A catalogue version. Versions only grow, across the whole life of a catalogue (reopening
/// included), so a larger version is always a later state.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct CatalogVersion(pub u64);

impl fmt::Display for CatalogVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A point in time as milliseconds since the Unix epoch (UTC). Plain data so that stored
/// and serialized states compare and print the same on every machine.
pub type UnixMillis = u64;

/// The last successful listing of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SyncStamp {
    /// The catalogue version the listing was stored at (unchanged listings keep the version
    /// of the last change but still move `at`).
    pub version: CatalogVersion,
    /// When the listing finished.
    pub at: UnixMillis,
}

/// The last failed attempt to list a server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SyncFailure {
    /// When the attempt failed.
    pub at: UnixMillis,
    /// Why, as a person can act on it (which call, what the server or transport said).
    pub message: String,
}

/// Whether a server can be reached now, as its connection last reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Reachability {
    /// Nothing is known yet (never connected, or not reported).
    #[default]
    Unknown,
    /// The connection is up.
    Reachable,
    /// The connection is down; calls to the server fail until it comes back.
    Unreachable {
        /// Why, as a person can act on it.
        reason: String,
    },
}

/// What a catalogue knows of one server's health.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServerHealth {
    /// The last successful listing, if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<SyncStamp>,
    /// The last failed listing, if it is more recent than the last successful one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<SyncFailure>,
    /// Whether the server can be reached now.
    #[serde(default)]
    pub reachability: Reachability,
}

/// One server's live tools as a catalogue holds them, with the version they were read at and
/// the server's health: the plain data disclosure resolves a turn from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerCatalog {
    /// The server.
    pub server: ServerId,
    /// The catalogue version of this read. Equal versions of one server mean equal tools,
    /// so anything derived from the tools (compiled schemas) can be cached per version.
    pub version: CatalogVersion,
    /// The live tools, ordered by name. Shared and immutable: a catalogue may hand every
    /// reader of one server at one version the same allocation, so cloning a
    /// `ServerCatalog` copies a pointer, not the definitions. Build one from a `Vec` with
    /// `.into()`; read it as a slice (`&*tools`, `.iter()`).
    pub tools: Arc<[ToolDefinition]>,
    /// The server's health.
    pub health: ServerHealth,
}

/// What changed between two states of one server's tools, each list ordered by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    /// Tools present after and not before.
    pub added: Vec<ToolName>,
    /// Tools present in both whose definitions differ.
    pub changed: Vec<ToolName>,
    /// Tools present before and not after.
    pub removed: Vec<ToolName>,
    /// Tools present in both with identical definitions.
    pub unchanged: Vec<ToolName>,
}

impl Diff {
    /// Whether anything was added, changed or removed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }

    /// What changed between one server's rows live at two versions, for a catalogue store:
    /// `before` and `after` map each tool name to the version its row was written at and
    /// its stored definition. A row of the same version, or an identical definition
    /// written again (a tool removed and listed again the same), is unchanged. `name` makes
    /// a [`ToolName`] of a stored one (a store's error when it does not).
    ///
    /// # Errors
    ///
    /// `name`'s.
    pub fn between<V: PartialEq, E>(
        before: &std::collections::BTreeMap<String, (V, Vec<u8>)>,
        after: &std::collections::BTreeMap<String, (V, Vec<u8>)>,
        name: impl Fn(&str) -> Result<ToolName, E>,
    ) -> Result<Self, E> {
        let mut diff = Self::default();
        for (stored, (since, json)) in after {
            let tool = name(stored)?;
            match before.get(stored) {
                None => diff.added.push(tool),
                Some((old_since, _)) if old_since == since => diff.unchanged.push(tool),
                Some((_, old)) if old == json => diff.unchanged.push(tool),
                Some(_) => diff.changed.push(tool),
            }
        }
        for stored in before.keys() {
            if !after.contains_key(stored) {
                diff.removed.push(name(stored)?);
            }
        }
        Ok(diff)
    }
}

/// The result of one refresh of one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refresh {
    /// The server's set version after the refresh: a new catalogue version when anything
    /// changed, the version of its last change otherwise.
    pub version: CatalogVersion,
    /// What the refresh changed.
    pub diff: Diff,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_serializes_compactly_and_round_trips() {
        let health = ServerHealth {
            last_sync: Some(SyncStamp {
                version: CatalogVersion(7),
                at: 1_700_000_000_000,
            }),
            last_error: None,
            reachability: Reachability::Unreachable {
                reason: "exited with status 1".into(),
            },
        };
        let text = serde_json::to_string(&health).unwrap();
        assert_eq!(
            text,
            r#"{"last_sync":{"version":7,"at":1700000000000},"reachability":{"state":"unreachable","reason":"exited with status 1"}}"#
        );
        assert_eq!(serde_json::from_str::<ServerHealth>(&text).unwrap(), health);
        assert_eq!(
            serde_json::from_str::<ServerHealth>("{}").unwrap(),
            ServerHealth::default()
        );
    }

    #[test]
    fn server_catalog_shares_its_tools_and_round_trips() {
        let tool = |name: &str| {
            ToolDefinition::new(crate::ToolName::new(name).unwrap(), "", Default::default())
        };
        let catalog = ServerCatalog {
            server: ServerId::new("fs").unwrap(),
            version: CatalogVersion(3),
            tools: vec![tool("read_file"), tool("write_file")].into(),
            health: ServerHealth::default(),
        };
        let copy = catalog.clone();
        assert!(
            Arc::ptr_eq(&copy.tools, &catalog.tools),
            "a clone shares the tools"
        );
        let text = serde_json::to_string(&catalog).unwrap();
        let back: ServerCatalog = serde_json::from_str(&text).unwrap();
        assert_eq!(back, catalog);
        assert_eq!(back.tools.len(), 2);
    }

    #[test]
    fn versions_order_and_print() {
        assert!(CatalogVersion(2) > CatalogVersion(1));
        assert_eq!(CatalogVersion(3).to_string(), "v3");
    }
}
