//! [`SurfaceCache`]: resolution that remembers what it resolved from, so an unchanged setup
//! resolves in microseconds and a changed one prepares only the servers that changed.

use std::collections::HashMap;
use std::sync::Arc;

use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, ServerCatalog, ServerHealth, ServerId,
    TokenEstimator, ToolDefinition,
};

use crate::resolve::{Prepared, compose, index_inputs, prepare};
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
///   the others' parts are reused, and the Surface is composed from them (budget, cap,
///   names), which still visits every permitted tool once.
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
/// few words per permitted tool and its facade index, plus the last Surface; the catalogues'
/// tools are shared with the caller, not copied, but the cache keeps the last ones alive
/// until the next call.
///
/// # What blocks
///
/// A call whose inputs are unchanged does no more than compare them: microseconds. Any
/// other call is CPU work that grows with the changed servers' tools and the permitted
/// tools' count (milliseconds at thousands of tools): call it where [`resolve`](crate::resolve)
/// would be called, off an async worker.
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
            && self.part.scope.as_ref() == grant.servers.get(&connection.server)
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
    /// only for the servers whose connection, catalogue tools or grant scope changed.
    ///
    /// # Errors
    ///
    /// As [`resolve`](crate::resolve); an error leaves the cache as it was.
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
        for &(connection, catalog) in &servers {
            let part = match self.servers.get(&connection.server) {
                Some(slot) if slot.matches(connection, catalog, inputs.grant) => {
                    Arc::clone(&slot.part)
                }
                _ => Arc::new(prepare(
                    connection,
                    catalog,
                    inputs.grant,
                    settings,
                    &self.estimator,
                )?),
            };
            parts.push(part);
        }
        let surface = Arc::new(compose(
            servers
                .iter()
                .zip(&parts)
                .map(|(&(connection, catalog), part)| (connection, catalog, part)),
            settings,
        ));
        self.servers = servers
            .iter()
            .zip(parts)
            .map(|(&(connection, catalog), part)| {
                let slot = Slot {
                    connection: connection.clone(),
                    version: catalog.map(|c| c.version),
                    part,
                };
                (connection.server.clone(), slot)
            })
            .collect();
        self.last = Some(Last {
            connections: inputs.connections.to_vec(),
            catalogs: inputs.catalogs.iter().map(CatalogKey::new).collect(),
            grant: inputs.grant.clone(),
            surface: Arc::clone(&surface),
        });
        Ok(surface)
    }
}
