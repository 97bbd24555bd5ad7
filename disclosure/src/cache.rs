//! [`SurfaceCache`]: resolution that remembers what it resolved from, so an unchanged setup
//! resolves in microseconds and a changed one prepares and names only the servers that
//! changed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, ServerCatalog, ServerHealth, ServerId,
    TokenEstimator, ToolDefinition,
};

use crate::resolve::{Naming, Prepared, compose, index_inputs, prepare};
use crate::{Inputs, ResolveError, Settings, Surface};

/// Resolution with memory: [`SurfaceCache::resolve`] gives exactly the [`Surface`] that
/// [`resolve`](crate::resolve) gives for the same inputs (the same tools, lines, names and
/// bytes), reusing what an earlier call computed from the same inputs.
///
/// What it keys on, and why that is sound:
///
/// - **The whole Surface** by everything it is made of: the settings, the connections, the
///   grant, and each catalogue's server, version, health and tools. Tools are compared by
///   identity: the cache holds the catalogue's `Arc<[ToolDefinition]>` and a later read is
///   the same only when it is the very same allocation (psych-catalog hands every reader of
///   one server at one version the same one), so equal keys mean equal tools whatever
///   versions a caller assigns. An unchanged setup answers the same `Arc<Surface>`.
/// - **Each server's prepared part** (its permitted tools sorted, their cost through the
///   estimator, its facade index and size tier: the work that grows with its catalogue) by
///   its connection, its catalogue's tools (by identity and version) and its scope in the
///   grant, under the same settings. A change to one server prepares that server again;
///   the others' parts are reused, and the Surface is composed from them (budget, cap)
///   in work that grows with the servers, not their tools.
/// - **Each server's names** (its direct tools, facade or search pair, its deferred tools'
///   qualified names, and its deferred line) by its part, its shape and its eager tools:
///   they are assigned over the server's own entries, and reused while those three are the
///   same. Names depend on other servers only through collisions (`a` + `b__c` and
///   `a__b` + `c` both ask for `a__b__c`), which only servers whose sanitised ids are
///   prefixes of one another can have; when two such servers do claim a name, the Surface
///   is named in one pass over every entry, as [`resolve`](crate::resolve) always is. So a
///   change to one server that moves no other server's shape costs about what resolving
///   that server alone costs (the `one_server_changed` bench).
///
/// Health is part of the Surface's key but not of a server's part: a server going
/// unreachable rewrites only its line and view.
///
/// The estimator is the cache's own ([`SurfaceCache::new`]), so a cached cost is always the
/// one the estimator would give.
///
/// # Memory
///
/// One prepared part per server of the last call (servers gone since are dropped), each a
/// few words per permitted tool, its permitted names and its facade index, plus the last
/// Surface, which keeps each server's names (its qualified names are about one name and
/// one pair per permitted tool of a deferred server); the catalogues' tools are shared with
/// the caller, not copied, but the cache keeps the last ones alive until the next call.
///
/// # What blocks
///
/// A call whose inputs are unchanged does no more than compare them: microseconds. Any
/// other call is CPU work that grows with the changed servers' tools, the servers' count
/// and the tools on the Surface (at most the tool cap), plus every permitted tool when
/// names collide across servers (milliseconds at thousands of tools): call it where
/// [`resolve`](crate::resolve) would be called, off an async worker.
pub struct SurfaceCache<E> {
    estimator: E,
    settings: Option<Settings>,
    servers: HashMap<ServerId, Slot>,
    last: Option<Last>,
}

/// One server's prepared part and what it was prepared from.
struct Slot {
    connection: ConnectionSpec,
    /// The catalogue's version; its tools and the grant scope are the part's own.
    version: Option<CatalogVersion>,
    part: Arc<Prepared>,
}

/// The last Surface and everything it was resolved from.
struct Last {
    connections: Vec<ConnectionSpec>,
    catalogs: Vec<CatalogKey>,
    grant: PermissionGrant,
    surface: Arc<Surface>,
}

/// A catalogue as a key: its tools by identity.
struct CatalogKey {
    server: ServerId,
    version: CatalogVersion,
    tools: Arc<[ToolDefinition]>,
    health: ServerHealth,
}

impl CatalogKey {
    fn new(catalog: &ServerCatalog) -> Self {
        Self {
            server: catalog.server.clone(),
            version: catalog.version,
            tools: Arc::clone(&catalog.tools),
            health: catalog.health.clone(),
        }
    }

    fn matches(&self, catalog: &ServerCatalog) -> bool {
        self.server == catalog.server
            && self.version == catalog.version
            && Arc::ptr_eq(&self.tools, &catalog.tools)
            && self.health == catalog.health
    }
}

impl Last {
    fn matches(&self, inputs: &Inputs<'_>) -> bool {
        self.connections.as_slice() == inputs.connections
            && self.catalogs.len() == inputs.catalogs.len()
            && self
                .catalogs
                .iter()
                .zip(inputs.catalogs)
                .all(|(key, catalog)| key.matches(catalog))
            && &self.grant == inputs.grant
    }
}

impl Slot {
    fn matches(
        &self,
        connection: &ConnectionSpec,
        catalog: Option<&ServerCatalog>,
        grant: &PermissionGrant,
    ) -> bool {
        let same_tools = match (self.part.tools(), catalog) {
            (None, None) => true,
            (Some(tools), Some(catalog)) => {
                self.version == Some(catalog.version) && Arc::ptr_eq(tools, &catalog.tools)
            }
            _ => false,
        };
        same_tools
            && &self.connection == connection
            && self.part.scope.as_ref() == grant.scope(&connection.server)
    }
}

impl<E> std::fmt::Debug for SurfaceCache<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SurfaceCache")
            .field("servers", &self.servers.len())
            .field("surface", &self.last.is_some())
            .finish()
    }
}

impl<E: TokenEstimator> SurfaceCache<E> {
    /// An empty cache whose costs come from `estimator`.
    pub fn new(estimator: E) -> Self {
        Self {
            estimator,
            settings: None,
            servers: HashMap::new(),
            last: None,
        }
    }

    /// The cache's estimator.
    pub fn estimator(&self) -> &E {
        &self.estimator
    }

    /// Resolves the Surface of `inputs` under `settings`: the same Surface
    /// [`resolve`](crate::resolve) gives, shared with the last call's when nothing it
    /// depends on changed, else composed from each server's prepared part, prepared again
    /// only for the servers whose connection, catalogue tools or grant scope changed, and
    /// from each server's names, named again only for the servers whose part, shape or
    /// eager tools changed.
    ///
    /// # Errors
    ///
    /// As [`resolve`](crate::resolve); an error keeps the last Surface and parts (unless
    /// the settings changed, which drops them first).
    pub fn resolve(
        &mut self,
        inputs: &Inputs<'_>,
        settings: &Settings,
    ) -> Result<Arc<Surface>, ResolveError> {
        if self.settings.as_ref() != Some(settings) {
            self.settings = Some(settings.clone());
            self.servers.clear();
            self.last = None;
        }
        if let Some(last) = &self.last
            && last.matches(inputs)
        {
            return Ok(Arc::clone(&last.surface));
        }
        let servers = index_inputs(inputs)?;
        let mut parts = Vec::with_capacity(servers.len());
        // The servers prepared again, by index: their slots change once all is well.
        let mut fresh = Vec::new();
        for (i, &(connection, catalog)) in servers.iter().enumerate() {
            let part = match self.servers.get(&connection.server) {
                Some(slot) if slot.matches(connection, catalog, inputs.grant) => {
                    Arc::clone(&slot.part)
                }
                _ => {
                    fresh.push(i);
                    Arc::new(prepare(
                        connection,
                        catalog,
                        inputs.grant,
                        settings,
                        &self.estimator,
                    )?)
                }
            };
            parts.push(part);
        }
        let surface = Arc::new(compose(
            servers
                .iter()
                .zip(&parts)
                .map(|(&(connection, catalog), part)| (connection, catalog, part)),
            settings,
            Naming::Pieces {
                previous: self.last.as_ref().map(|last| &*last.surface),
            },
        ));
        for i in fresh {
            let (connection, catalog) = servers[i];
            let slot = Slot {
                connection: connection.clone(),
                version: catalog.map(|c| c.version),
                part: Arc::clone(&parts[i]),
            };
            self.servers.insert(connection.server.clone(), slot);
        }
        // Every server of this call has its slot now; any other is gone since.
        if self.servers.len() != servers.len() {
            let current: HashSet<&ServerId> = servers.iter().map(|(c, _)| &c.server).collect();
            self.servers.retain(|server, _| current.contains(server));
        }
        self.last = Some(Last {
            connections: inputs.connections.to_vec(),
            catalogs: inputs.catalogs.iter().map(CatalogKey::new).collect(),
            grant: inputs.grant.clone(),
            surface: Arc::clone(&surface),
        });
        Ok(surface)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{ServerHealth, ToolName};

    struct Bytes4;

    impl TokenEstimator for Bytes4 {
        fn estimate_text(&self, text: &str) -> u64 {
            text.len().div_ceil(4) as u64
        }

        fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
            len.div_ceil(4)
        }
    }

    fn catalog(server: &str, tools: usize) -> ServerCatalog {
        let schema: psych_types::JsonObject =
            serde_json::from_str(r#"{"type":"object"}"#).unwrap_or_default();
        ServerCatalog {
            server: ServerId::new(server).unwrap_or_else(|e| panic!("{e}")),
            version: CatalogVersion(1),
            tools: (0..tools)
                .map(|i| {
                    let name = ToolName::new(format!("t{i:03}")).unwrap_or_else(|e| panic!("{e}"));
                    ToolDefinition::new(name, "a tool", schema.clone())
                })
                .collect::<Vec<_>>()
                .into(),
            health: ServerHealth::default(),
        }
    }

    fn setup(servers: &[(&str, &[&str])]) -> (Vec<ConnectionSpec>, Vec<ServerCatalog>) {
        let schema: psych_types::JsonObject =
            serde_json::from_str(r#"{"type":"object"}"#).unwrap_or_default();
        let connections = servers
            .iter()
            .map(|(server, _)| {
                ConnectionSpec::new(ServerId::new(*server).unwrap_or_else(|e| panic!("{e}")))
                    .with_preload(psych_types::Preload::Deferred)
            })
            .collect();
        let catalogs = servers
            .iter()
            .map(|(server, tools)| {
                let mut catalog = catalog(server, 0);
                catalog.tools = tools
                    .iter()
                    .map(|t| {
                        let name = ToolName::new(*t).unwrap_or_else(|e| panic!("{e}"));
                        ToolDefinition::new(name, "a tool", schema.clone())
                    })
                    .collect::<Vec<_>>()
                    .into();
                catalog
            })
            .collect();
        (connections, catalogs)
    }

    fn inputs<'a>(
        connections: &'a [ConnectionSpec],
        catalogs: &'a [ServerCatalog],
        grant: &'a PermissionGrant,
    ) -> Inputs<'a> {
        Inputs {
            connections,
            catalogs,
            grant,
        }
    }

    fn everyone(connections: &[ConnectionSpec]) -> PermissionGrant {
        connections.iter().fold(PermissionGrant::none(), |g, c| {
            g.allow_server(c.server.clone())
        })
    }

    /// After one server's change, every other server's deferred names are the very
    /// allocation the last Surface had: composing them again copied nothing.
    #[test]
    fn a_change_reuses_every_other_servers_names() {
        let (connections, mut catalogs) = setup(&[
            ("github", &["search_code", "create_branch"]),
            ("notion", &["get_page", "post_page"]),
            ("memory", &["read_graph"]),
        ]);
        let grant = everyone(&connections);
        let settings = Settings::default();
        let mut cache = SurfaceCache::new(Bytes4);
        let first = cache
            .resolve(&inputs(&connections, &catalogs, &grant), &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut tools = catalogs[1].tools.to_vec();
        tools.pop();
        catalogs[1].tools = tools.into();
        catalogs[1].version = CatalogVersion(2);
        let second = cache
            .resolve(&inputs(&connections, &catalogs, &grant), &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        let plain = crate::resolve(&inputs(&connections, &catalogs, &grant), &settings, &Bytes4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*second, plain);
        for connection in &connections {
            let server = &connection.server;
            assert!(second.deferred_names_from_piece(server), "{server}");
            let shared = match (
                first.deferred_names_arc(server),
                second.deferred_names_arc(server),
            ) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            assert_eq!(shared, server.as_str() != "notion", "{server}");
        }
    }

    /// `a` with `b__c` and `a__b` with `c` both ask for `a__b__c`: named apart, each
    /// would keep it, so the cache names every entry in one pass, as `resolve` does; once
    /// the collision is gone, it names each server alone again.
    #[test]
    fn competing_names_are_named_in_one_pass() {
        let (connections, mut catalogs) =
            setup(&[("a", &["b__c", "x"]), ("a__b", &["c", "y"]), ("gh", &["z"])]);
        let grant = everyone(&connections);
        let settings = Settings::default();
        let mut cache = SurfaceCache::new(Bytes4);
        let surface = cache
            .resolve(&inputs(&connections, &catalogs, &grant), &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        let plain = crate::resolve(&inputs(&connections, &catalogs, &grant), &settings, &Bytes4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*surface, plain);
        assert!(surface.exposed("a__b__c").is_none(), "both hashed");
        for connection in &connections {
            assert!(!surface.deferred_names_from_piece(&connection.server));
        }

        catalogs[0] = catalog("a", 0);
        let surface = cache
            .resolve(&inputs(&connections, &catalogs, &grant), &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        let plain = crate::resolve(&inputs(&connections, &catalogs, &grant), &settings, &Bytes4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*surface, plain);
        assert!(surface.exposed("a__b__c").is_some());
        assert!(surface.deferred_names_from_piece(&connections[1].server));
    }

    /// A catalogue listing a tool twice is refused, even when one copy is left out of the
    /// permitted set (its schema no provider takes), and whether or not its tools are
    /// sorted by name.
    #[test]
    fn a_tool_listed_twice_is_refused_whichever_copy_is_permitted() {
        let object: psych_types::JsonObject =
            serde_json::from_str(r#"{"type":"object"}"#).unwrap_or_default();
        let string: psych_types::JsonObject =
            serde_json::from_str(r#"{"type":"string"}"#).unwrap_or_default();
        let tool = |name: &str, schema: &psych_types::JsonObject| {
            let name = ToolName::new(name).unwrap_or_else(|e| panic!("{e}"));
            ToolDefinition::new(name, "a tool", schema.clone())
        };
        for tools in [
            vec![tool("x", &object), tool("x", &string)],
            vec![tool("x", &object), tool("y", &object), tool("x", &string)],
        ] {
            let (connections, mut catalogs) = setup(&[("s", &[])]);
            catalogs[0].tools = tools.into();
            let grant = everyone(&connections);
            let resolved = crate::resolve(
                &inputs(&connections, &catalogs, &grant),
                &Settings::default(),
                &Bytes4,
            );
            assert!(
                matches!(&resolved, Err(ResolveError::DuplicateTool { tool, .. })
                    if tool.as_str() == "x"),
                "{resolved:?}"
            );
        }
    }

    /// `prepare_search` builds every index a search may read, so that no search indexes
    /// inline: a deferred server's for the native search, and with a search pair every
    /// server with permitted tools (a weak answer's note searches them all), a direct one's
    /// too; without a pair, no other.
    #[test]
    fn prepare_search_builds_every_index_a_search_reads() {
        use crate::Shape;
        let (mut connections, catalogs) = setup(&[
            ("github", &["search_code", "create_branch"]),
            ("memory", &["read_graph"]),
            ("pair", &["get_page", "post_page"]),
            ("empty", &[]),
        ]);
        for at in [1, 2] {
            let server = connections[at].server.clone();
            connections[at] = ConnectionSpec::new(server).with_preload(psych_types::Preload::Eager);
        }
        let grant = everyone(&connections);
        let built = |settings: &Settings| {
            let surface =
                crate::resolve(&inputs(&connections, &catalogs, &grant), settings, &Bytes4)
                    .unwrap_or_else(|e| panic!("{e}"));
            assert!(connections.iter().all(|c| !surface.search_built(&c.server)));
            surface.prepare_search();
            let shapes: Vec<Option<Shape>> = connections
                .iter()
                .map(|c| {
                    let view = surface.servers().iter().find(|v| v.server == c.server);
                    view.map(|v| v.shape)
                })
                .collect();
            let built: Vec<bool> = connections
                .iter()
                .map(|c| surface.search_built(&c.server))
                .collect();
            (shapes, built)
        };
        // No search pair: the deferred server's only.
        let (shapes, without) = built(&Settings::default());
        assert!(!shapes.contains(&Some(Shape::SearchPair)), "{shapes:?}");
        assert_eq!(without, [true, false, false, false]);
        // `pair` a search pair beside the direct `memory`: every server with tools.
        let settings = Settings::builder()
            .direct_max_tools(1)
            .facade_max_index_tokens(0)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let (shapes, with) = built(&settings);
        assert_eq!(shapes[1..3], [Some(Shape::Direct), Some(Shape::SearchPair)]);
        assert_eq!(with, [true, true, true, false]);
    }

    /// The cache holds one part per server of the last call: a server gone is dropped, so
    /// its memory is bounded by the current setup, not by every server ever seen.
    #[test]
    fn holds_the_servers_of_the_last_call_only() {
        let names: Vec<String> = (0..50).map(|i| format!("s{i:02}")).collect();
        let connections: Vec<ConnectionSpec> = names
            .iter()
            .map(|n| {
                ConnectionSpec::new(ServerId::new(n.as_str()).unwrap_or_else(|e| panic!("{e}")))
            })
            .collect();
        let catalogs: Vec<ServerCatalog> = names.iter().map(|n| catalog(n, 40)).collect();
        let grant = connections.iter().fold(PermissionGrant::none(), |g, c| {
            g.allow_server(c.server.clone())
        });
        let settings = Settings::default();
        let mut cache = SurfaceCache::new(Bytes4);
        let inputs = Inputs {
            connections: &connections,
            catalogs: &catalogs,
            grant: &grant,
        };
        let first = cache
            .resolve(&inputs, &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.servers.len(), 50);
        let again = cache
            .resolve(&inputs, &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(Arc::ptr_eq(&first, &again), "unchanged: the same Surface");

        let fewer = Inputs {
            connections: &connections[..3],
            catalogs: &catalogs[..3],
            grant: &grant,
        };
        cache
            .resolve(&fewer, &settings)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.servers.len(), 3);

        // Other settings: nothing prepared under the old ones is reused.
        let other = Settings::builder()
            .tool_cap(64)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let surface = cache
            .resolve(&fewer, &other)
            .unwrap_or_else(|e| panic!("{e}"));
        let plain = crate::resolve(&fewer, &other, &Bytes4).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*surface, plain);
    }
}
