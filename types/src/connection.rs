//! Connections (what an author says about one MCP server) and permission grants (which
//! `(server, tool)` pairs a Run may reach).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{ServerId, ToolName, ToolRef};

/// Whether a connection's tool schemas are put in the prompt.
///
/// Three-valued on purpose: an author rarely knows how many tools a server has (it is
/// discovered, and it changes), so the default decides from the catalogue size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preload {
    /// Decide from the permitted catalogue size at resolution time.
    #[default]
    Auto,
    /// Always inject the server's tools (pinned by an author who knows the count).
    Eager,
    /// Never inject the server's schemas; the model reaches its tools through the meta tools.
    Deferred,
}

/// What an author says about one MCP server connection.
///
/// How to reach the server (command line, URL) is the MCP crate's business; this is what
/// disclosure needs.
///
/// Plain data, built one way: [`ConnectionSpec::new`] and the `with_*` methods (or set a
/// field); the fields are public to read and change. Non-exhaustive, so a field added later
/// breaks no caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ConnectionSpec {
    /// The connection's name.
    pub server: ServerId,
    /// One short line on what the server is for; shown on its deferred-server line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The preload flag.
    #[serde(default)]
    pub preload: Preload,
    /// Tools injected as ordinary tools even when the server is deferred. The server stays
    /// listed as deferred: the model still has to discover the rest.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub eager_tools: BTreeSet<ToolName>,
}

impl ConnectionSpec {
    /// A connection with no description, [`Preload::Auto`] and no eager tools.
    pub fn new(server: ServerId) -> Self {
        Self {
            server,
            description: None,
            preload: Preload::Auto,
            eager_tools: BTreeSet::new(),
        }
    }

    /// Sets the short description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Sets the preload flag.
    #[must_use]
    pub fn with_preload(mut self, preload: Preload) -> Self {
        self.preload = preload;
        self
    }

    /// Adds a tool to inject eagerly even when the server is deferred.
    #[must_use]
    pub fn with_eager_tool(mut self, tool: ToolName) -> Self {
        self.eager_tools.insert(tool);
        self
    }
}

/// Which tools of one server a grant permits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolScope {
    /// Every tool the server has now or later.
    All,
    /// Exactly these tools.
    Only(BTreeSet<ToolName>),
}

/// The `(server, tool)` pairs a Run may reach. Anything not granted is denied: a server
/// absent from the grant has no permitted tools.
///
/// A grant is the outermost narrowing every disclosure tier and every call goes through.
///
/// Built from [`none`](Self::none) with the `allow_*` and [`revoke_server`](Self::revoke_server)
/// methods, read with [`scope`](Self::scope), [`scopes`](Self::scopes) and the `permits*`
/// methods. Its serde form is `{"servers": {server: scope}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionGrant {
    /// The scope per server.
    servers: BTreeMap<ServerId, ToolScope>,
}

impl PermissionGrant {
    /// A grant that permits nothing.
    pub fn none() -> Self {
        Self::default()
    }

    /// Permits every tool of `server`.
    #[must_use]
    pub fn allow_server(mut self, server: ServerId) -> Self {
        self.servers.insert(server, ToolScope::All);
        self
    }

    /// Sets `server`'s scope, replacing whatever the grant held for it.
    #[must_use]
    pub fn allow_scope(mut self, server: ServerId, scope: ToolScope) -> Self {
        self.servers.insert(server, scope);
        self
    }

    /// Permits nothing on `server` any more.
    #[must_use]
    pub fn revoke_server(mut self, server: &ServerId) -> Self {
        self.servers.remove(server);
        self
    }

    /// Permits one tool. Has no effect if the whole server is already permitted.
    #[must_use]
    pub fn allow_tool(mut self, tool: ToolRef) -> Self {
        match self
            .servers
            .entry(tool.server)
            .or_insert_with(|| ToolScope::Only(BTreeSet::new()))
        {
            ToolScope::All => {}
            ToolScope::Only(set) => {
                set.insert(tool.tool);
            }
        }
        self
    }

    /// The scope the grant gives `server`, if it names it.
    pub fn scope(&self, server: &ServerId) -> Option<&ToolScope> {
        self.servers.get(server)
    }

    /// Every server the grant names with its scope, in server order.
    pub fn scopes(&self) -> impl Iterator<Item = (&ServerId, &ToolScope)> {
        self.servers.iter()
    }

    /// Whether the grant permits anything on `server`.
    pub fn permits_server(&self, server: &ServerId) -> bool {
        match self.servers.get(server) {
            None => false,
            Some(ToolScope::All) => true,
            Some(ToolScope::Only(set)) => !set.is_empty(),
        }
    }

    /// Whether the grant permits the pair.
    pub fn permits(&self, server: &ServerId, tool: &ToolName) -> bool {
        match self.servers.get(server) {
            None => false,
            Some(ToolScope::All) => true,
            Some(ToolScope::Only(set)) => set.contains(tool),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(s: &str) -> ServerId {
        ServerId::new(s).unwrap()
    }

    fn tool(s: &str) -> ToolName {
        ToolName::new(s).unwrap()
    }

    #[test]
    fn grants_deny_by_default() {
        let grant = PermissionGrant::none()
            .allow_server(server("fs"))
            .allow_tool(ToolRef::parse("github", "list_issues").unwrap());
        assert!(grant.permits(&server("fs"), &tool("anything")));
        assert!(grant.permits(&server("github"), &tool("list_issues")));
        assert!(!grant.permits(&server("github"), &tool("delete_repo")));
        assert!(!grant.permits(&server("notion"), &tool("search")));
        assert!(!grant.permits_server(&server("notion")));
    }

    #[test]
    fn allowing_a_tool_keeps_a_whole_server_grant() {
        let grant = PermissionGrant::none()
            .allow_server(server("fs"))
            .allow_tool(ToolRef::parse("fs", "read_file").unwrap());
        assert_eq!(grant.scope(&server("fs")), Some(&ToolScope::All));
        let grant = grant
            .allow_scope(server("fs"), ToolScope::Only(BTreeSet::new()))
            .allow_server(server("git"))
            .revoke_server(&server("git"));
        assert_eq!(
            grant.scopes().collect::<Vec<_>>(),
            [(&server("fs"), &ToolScope::Only(BTreeSet::new()))]
        );
        assert!(!grant.permits_server(&server("fs")));
    }

    #[test]
    fn an_empty_only_scope_permits_nothing() {
        let mut grant = PermissionGrant::none();
        grant
            .servers
            .insert(server("fs"), ToolScope::Only(BTreeSet::new()));
        assert!(!grant.permits_server(&server("fs")));
    }
}
