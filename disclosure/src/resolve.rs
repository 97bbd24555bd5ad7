//! Per-turn resolution: connections, live catalogues and the grant in, a [`Surface`] out.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, OnceLock};

use psych_types::{
    ConnectionSpec, PermissionGrant, Preload, ServerCatalog, ServerHealth, ServerId,
    TokenEstimator, ToolDefinition, ToolName, ToolRef, ToolScope,
};
use serde::Serialize;

use crate::names::{self, Exposed, MetaTool};
use crate::search::Part;
use crate::settings::{CostBasis, META_TOOL_COUNT};
use crate::text::{TRUNCATION_MARKER, cap_chars, first_line};
use crate::{ResolveError, Settings, shapes, state};

/// The most characters of one deferred server's line.
pub const DEFERRED_LINE_CHARS: usize = 200;

/// What resolution reads: plain data, as the runtime has it at the start of a turn.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The connections (preload flag, eager tools, description). Only connected servers
    /// appear on a Surface.
    pub connections: &'a [ConnectionSpec],
    /// Each server's live catalogue and health. A connection without one is a server not
    /// listed yet.
    pub catalogs: &'a [ServerCatalog],
    /// The permission grant: the outermost narrowing.
    pub grant: &'a PermissionGrant,
}

/// How one server is shown to the model this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Shape {
    /// One tool per permitted remote tool, schemas included.
    Direct,
    /// One tool for the server, its description indexing every permitted name.
    Facade,
    /// A search tool and a call-by-name tool.
    SearchPair,
    /// No schema in the prompt: one line, reached through the meta tools.
    Deferred,
}

/// Why a server has its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Why {
    /// No permitted tool: it is listed as deferred with its state.
    NoTools,
    /// The connection pins the preload flag ([`Preload::Deferred`]), or ([`Preload::Eager`])
    /// the size tier followed.
    Pinned,
    /// [`Preload::Auto`]: its permitted tools did not fit in the auto budget, which the
    /// Auto servers share smallest first (ties by server id): they cost more than the
    /// budget left after the servers kept before it, or more than the whole budget.
    OverBudget,
    /// Not deferred; the tier follows from its permitted count and cost.
    Size,
    /// Stepped down so the Surface stays within its tool cap.
    ToolCap,
}

/// A server's estimated cost as direct tools (name, description, input schema of each
/// permitted tool, or each one's whole definition: [`Settings::cost_basis`]), through the
/// caller's estimator.
///
/// Counting stops once the sum passes every limit it is compared against (the whole auto
/// budget for an `Auto` server, which a server costing more than it alone can never be
/// kept in; the direct-tier limit when the server is small enough to be direct), so
/// resolution of a large catalogue does not serialize every schema each turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Cost {
    /// Every permitted tool was counted.
    Exact(u64),
    /// Counting stopped here, above every limit that mattered.
    AtLeast(u64),
}

impl Cost {
    /// The counted tokens (a lower bound for [`Cost::AtLeast`]).
    pub fn tokens(self) -> u64 {
        match self {
            Cost::Exact(tokens) | Cost::AtLeast(tokens) => tokens,
        }
    }
}

/// One server as this turn's Surface shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerView {
    /// The server.
    pub server: ServerId,
    /// How it is shown.
    pub shape: Shape,
    /// Why.
    pub why: Why,
    /// How many of its tools are permitted (live catalogue ∩ grant).
    pub permitted: usize,
    /// Estimated tokens of its permitted tools as direct tools, counted as
    /// [`Settings::cost_basis`](crate::Settings::cost_basis) says.
    pub cost: Cost,
    /// Tools injected as direct tools although the server is deferred.
    pub eager: Vec<ToolName>,
    /// The one-line description from its connection.
    pub description: Option<String>,
    /// Its health as the catalogue reported it at resolution.
    pub health: ServerHealth,
}

/// The permitted set at resolution: live catalogue ∩ grant, per server.
///
/// Each server's set is shared with the part it was prepared in, so a Surface composed
/// again from unchanged servers does not copy their names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermittedSet {
    servers: BTreeMap<ServerId, Arc<BTreeSet<ToolName>>>,
}

impl Serialize for PermittedSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.servers.len()))?;
        for (server, tools) in &self.servers {
            map.serialize_entry(server, &**tools)?;
        }
        map.end()
    }
}

impl PermittedSet {
    /// Whether the pair is permitted.
    pub fn contains(&self, pair: &ToolRef) -> bool {
        self.servers
            .get(&pair.server)
            .is_some_and(|tools| tools.contains(&pair.tool))
    }

    /// The permitted tools of one server, sorted.
    pub fn tools(&self, server: &ServerId) -> Option<&BTreeSet<ToolName>> {
        self.servers.get(server).map(|tools| &**tools)
    }

    /// Every permitted pair, sorted by server then tool.
    pub fn pairs(&self) -> impl Iterator<Item = ToolRef> + '_ {
        self.servers.iter().flat_map(|(server, tools)| {
            tools
                .iter()
                .map(move |tool| ToolRef::new(server.clone(), tool.clone()))
        })
    }

    /// How many pairs are permitted.
    pub fn len(&self) -> usize {
        self.servers.values().map(|tools| tools.len()).sum()
    }

    /// Whether nothing is permitted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One turn's tool surface: the tool definitions to expose, one line per deferred server,
/// the permitted set, and the resolver from an exposed name back to what it means.
#[derive(Debug, Clone, PartialEq)]
pub struct Surface {
    tools: Vec<ToolDefinition>,
    deferred_lines: Vec<String>,
    servers: Vec<ServerView>,
    names: BTreeMap<String, Exposed>,
    /// Per deferred server, each of its deferred tools' qualified name and its
    /// [`Exposed::Deferred`] meaning: one map per server, shared with the composed piece it
    /// came from when the names did not depend on other servers.
    pub(crate) deferred: BTreeMap<ServerId, Arc<BTreeMap<String, Exposed>>>,
    /// The catalogue each deferred server was resolved from (shared, not copied): where
    /// [`Surface::deferred_tools`] reads the deferred tools' definitions.
    pub(crate) deferred_catalogs: BTreeMap<ServerId, SharedTools>,
    permitted: PermittedSet,
    pub(crate) settings: Settings,
    /// Each server's prepared part, for its search index (shared across Surfaces).
    pub(crate) parts: BTreeMap<ServerId, SharedPart>,
    /// Each server's composed piece, when the Surface was composed from pieces (through a
    /// [`SurfaceCache`](crate::SurfaceCache)): what the next composition reuses.
    pieces: Pieces,
}

/// The composed pieces a Surface keeps for the next composition. Derived data: they never
/// make two Surfaces differ.
#[derive(Clone, Default)]
struct Pieces(BTreeMap<ServerId, Arc<Piece>>);

impl PartialEq for Pieces {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pieces")
    }
}

/// A server's prepared part as a Surface holds it. Derived data: it never makes two
/// Surfaces differ.
#[derive(Clone)]
pub(crate) struct SharedPart(pub(crate) Arc<Prepared>);

impl PartialEq for SharedPart {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for SharedPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedPart")
    }
}

impl Surface {
    /// The tool definitions, sorted by (provider-safe, unique) name: hand them to prompt
    /// assembly as the tool surface.
    pub fn tools(&self) -> &[ToolDefinition] {
        &self.tools
    }

    /// One line per deferred server, in server order, each at most
    /// [`DEFERRED_LINE_CHARS`] characters: hand each to prompt assembly as a capability note.
    pub fn deferred_lines(&self) -> &[String] {
        &self.deferred_lines
    }

    /// The Surface as one MCP client's `tools/list` shows it: [`tools`](Self::tools), with
    /// the [`deferred_lines`](Self::deferred_lines) appended to the [`LIST_TOOLS`] meta
    /// tool's description under "Deferred servers:". A client that hides the server's
    /// `instructions` from its model (many do) still shows it every tool's description, so
    /// the deferred servers stay visible. A gateway adds its own tools (the reader) after.
    ///
    /// [`LIST_TOOLS`]: crate::LIST_TOOLS
    pub fn client_tools(&self) -> Vec<ToolDefinition> {
        let mut tools = self.tools.clone();
        if !self.deferred_lines.is_empty()
            && let Some(list) = tools
                .iter_mut()
                .find(|t| t.name.as_str() == names::LIST_TOOLS)
        {
            let mut description = list.description.take().unwrap_or_default();
            description.push_str("\n\nDeferred servers:");
            for line in &self.deferred_lines {
                description.push_str("\n- ");
                description.push_str(line);
            }
            list.description = Some(description);
        }
        tools
    }

    /// What an MCP server serving this Surface says in its initialize result's
    /// `instructions`: call the orientation tool first, and, when servers are deferred, that
    /// their tools are reached through the meta tools, one line per deferred server.
    pub fn client_instructions(&self) -> String {
        if self.deferred_lines.is_empty() {
            return format!(
                "Psych gateway: call {} first for the shape of the toolkit.",
                names::ORIENTATION
            );
        }
        let mut text = format!(
            "Psych gateway. Call {} first. These MCP servers are deferred: \
             their tools are reached through the meta tools (list, describe, call).",
            names::ORIENTATION
        );
        for line in &self.deferred_lines {
            text.push_str("\n- ");
            text.push_str(line);
        }
        text
    }

    /// Every server on the Surface, in server order.
    pub fn servers(&self) -> &[ServerView] {
        &self.servers
    }

    /// One server's view.
    pub fn server(&self, server: &str) -> Option<&ServerView> {
        self.servers
            .binary_search_by(|view| view.server.as_str().cmp(server))
            .ok()
            .map(|i| &self.servers[i])
    }

    /// The permitted set at resolution. The guard checks calls against the permitted set
    /// as it is at call time; this one is for showing and counting.
    pub fn permitted(&self) -> &PermittedSet {
        &self.permitted
    }

    /// What an exposed name means, or `None` for a name this Surface does not expose. The
    /// lookup is exact: a case variant or look-alike is `None`. A deferred tool's qualified
    /// name is [`Exposed::Deferred`] (see [`Surface::deferred_tools`]).
    pub fn exposed(&self, name: &str) -> Option<&Exposed> {
        self.names
            .get(name)
            .or_else(|| self.deferred.values().find_map(|names| names.get(name)))
    }

    /// The exposed name of a direct pair, if it is exposed directly.
    pub fn direct_name(&self, pair: &ToolRef) -> Option<&str> {
        self.names.iter().find_map(|(name, exposed)| match exposed {
            Exposed::Direct { target } if target == pair => Some(name.as_str()),
            _ => None,
        })
    }

    /// The name and meaning of every tool of [`Surface::tools`], sorted by name (the
    /// deferred tools' names are [`Surface::deferred_names`]).
    pub fn names(&self) -> impl Iterator<Item = (&str, &Exposed)> {
        self.names.iter().map(|(name, e)| (name.as_str(), e))
    }

    /// The settings this Surface was resolved with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

#[cfg(test)]
impl Surface {
    /// Whether `server`'s deferred names are its piece's own (named alone and shared),
    /// not split out of the one pass over every server.
    pub(crate) fn deferred_names_from_piece(&self, server: &ServerId) -> bool {
        match (self.deferred.get(server), self.pieces.0.get(server)) {
            (Some(names), Some(piece)) => Arc::ptr_eq(names, &piece.deferred),
            _ => false,
        }
    }

    /// `server`'s deferred names as shared (to compare allocations across Surfaces).
    pub(crate) fn deferred_names_arc(
        &self,
        server: &ServerId,
    ) -> Option<&Arc<BTreeMap<String, Exposed>>> {
        self.deferred.get(server)
    }
}

/// A catalogue's tools, shared with the catalogue rather than copied. Two are equal when
/// they hold the same tools whatever their order, so a Surface does not depend on the
/// order a catalogue lists its tools in.
#[derive(Clone)]
pub(crate) struct SharedTools(pub(crate) Arc<[ToolDefinition]>);

impl SharedTools {
    fn sorted(&self) -> Vec<&ToolDefinition> {
        let mut tools: Vec<&ToolDefinition> = self.0.iter().collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }
}

impl PartialEq for SharedTools {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.sorted() == other.sorted()
    }
}

impl std::fmt::Debug for SharedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.sorted()).finish()
    }
}

/// The plan for one server while its shape is decided.
struct Plan<'a> {
    connection: &'a ConnectionSpec,
    part: &'a Arc<Prepared>,
    catalog: Option<&'a ServerCatalog>,
    /// How many tools are permitted (the part's `permitted`).
    permitted: usize,
    cost: Cost,
    index_fits: bool,
    shape: Shape,
    why: Why,
    eager: Vec<&'a ToolDefinition>,
}

impl<'a> Plan<'a> {
    /// The server's eager tools that are permitted, in name order (both sorted by name).
    fn eager_tools(&self) -> Vec<&'a ToolDefinition> {
        let part: &'a Arc<Prepared> = self.part;
        let connection: &'a ConnectionSpec = self.connection;
        connection
            .eager_tools
            .iter()
            .filter_map(|name| part.permitted_tool(name))
            .collect()
    }

    fn tool_count(&self) -> usize {
        match self.shape {
            Shape::Direct => self.permitted,
            Shape::Facade => 1,
            Shape::SearchPair => 2,
            Shape::Deferred => self.eager.len(),
        }
    }

    fn step_down_shape(&self) -> Shape {
        if self.index_fits {
            Shape::Facade
        } else {
            Shape::SearchPair
        }
    }

    /// The entries its shape exposes, to be named: its direct tools, its facade or search
    /// pair, or (deferred) its eager tools and the qualified names of the others.
    fn entries(&self) -> Vec<Exposed> {
        let server = &self.connection.server;
        let direct = |tool: &ToolDefinition| Exposed::Direct {
            target: ToolRef::new(server.clone(), tool.name.clone()),
        };
        match self.shape {
            Shape::Direct => self.part.permitted().map(direct).collect(),
            Shape::Facade => vec![Exposed::Facade {
                server: server.clone(),
            }],
            Shape::SearchPair => vec![
                Exposed::Search {
                    server: server.clone(),
                },
                Exposed::SearchCall {
                    server: server.clone(),
                },
            ],
            Shape::Deferred => {
                let mut entries: Vec<Exposed> = self.eager.iter().map(|t| direct(t)).collect();
                // Named with everything else, so a qualified name is unique across the
                // whole Surface; the eagerly injected tools are direct already (both lists
                // are sorted by name).
                let mut eager = self.eager.iter().peekable();
                for tool in self.part.permitted() {
                    if eager.next_if(|e| e.name == tool.name).is_none() {
                        entries.push(Exposed::Deferred {
                            target: ToolRef::new(server.clone(), tool.name.clone()),
                        });
                    }
                }
                entries
            }
        }
    }

    /// Whether `piece` was composed for this plan: the same part, shape and eager tools.
    fn fits(&self, piece: &Piece) -> bool {
        Arc::ptr_eq(&piece.part, self.part)
            && piece.shape == self.shape
            && piece.eager.len() == self.eager.len()
            && piece
                .eager
                .iter()
                .zip(&self.eager)
                .all(|(a, b)| *a == b.name)
    }
}

/// One server's share of a Surface's names, assigned over its own entries alone
/// ([`Plan::entries`]), with what it needs to tell whether that is what the one pass over
/// every server's entries would give ([`names::claims`]). Kept by a Surface composed
/// through a [`SurfaceCache`](crate::SurfaceCache), and reused by the next composition
/// while the server's part, shape and eager tools are the same.
pub(crate) struct Piece {
    part: Arc<Prepared>,
    shape: Shape,
    eager: Vec<ToolName>,
    /// [`names::zone`] of the server.
    zone: String,
    /// The names of its entries that are among the Surface's tools, sorted by name.
    exposed: Vec<(String, Exposed)>,
    /// The names of its deferred tools.
    deferred: Arc<BTreeMap<String, Exposed>>,
    /// [`names::claims`] of its names, computed when another server's zone overlaps its
    /// own (rare: an id that is a prefix of another).
    claims: OnceLock<HashSet<u64>>,
    /// Its deferred line and the description it was written with, once written (only for
    /// a server with permitted tools: another's line shows its health).
    line: OnceLock<(Option<String>, String)>,
}

impl Piece {
    fn new(plan: &Plan<'_>) -> Self {
        let mut deferred = BTreeMap::new();
        let mut exposed = Vec::new();
        for (name, entry) in names::assign(plan.entries()) {
            if matches!(entry, Exposed::Deferred { .. }) {
                deferred.insert(name, entry);
            } else {
                exposed.push((name, entry));
            }
        }
        Self {
            part: Arc::clone(plan.part),
            shape: plan.shape,
            eager: plan.eager.iter().map(|t| t.name.clone()).collect(),
            zone: names::zone(&plan.connection.server),
            exposed,
            deferred: Arc::new(deferred),
            claims: OnceLock::new(),
            line: OnceLock::new(),
        }
    }

    /// The deferred line of `plan`, which this piece fits: written once per piece. A
    /// line shows the server, its permitted and eager counts (the piece's) and its
    /// description; the health shows only on a server with no permitted tool, whose line
    /// is written each time.
    fn line(&self, plan: &Plan<'_>) -> String {
        if plan.permitted == 0 {
            return deferred_line(plan);
        }
        let description = &plan.connection.description;
        let (written_with, line) = self
            .line
            .get_or_init(|| (description.clone(), deferred_line(plan)));
        if written_with == description {
            line.clone()
        } else {
            deferred_line(plan)
        }
    }

    fn claims(&self) -> &HashSet<u64> {
        self.claims.get_or_init(|| {
            let mut table: BTreeMap<String, Exposed> = self.exposed.iter().cloned().collect();
            table.extend(self.deferred.iter().map(|(n, e)| (n.clone(), e.clone())));
            names::claims(&table)
        })
    }
}

/// Whether no two pieces claim a name ([`names::claims`]): then the union of their names
/// is what naming every entry at once gives. Only servers whose zones overlap (one a
/// prefix of the other) can share a claim, so only their claims are compared.
fn pieces_are_disjoint(pieces: &[Arc<Piece>]) -> bool {
    let mut zones: Vec<(&str, usize)> = pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| (piece.zone.as_str(), i))
        .collect();
    zones.sort_unstable();
    for (k, &(zone, i)) in zones.iter().enumerate() {
        // Sorted: the zones that start with this one follow it.
        for &(_, j) in zones[k + 1..]
            .iter()
            .take_while(|(other, _)| other.starts_with(zone))
        {
            let (a, b) = (pieces[i].claims(), pieces[j].claims());
            let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
            if small.iter().any(|claim| large.contains(claim)) {
                return false;
            }
        }
    }
    true
}

/// Estimated tokens of one tool as a direct tool: its name, description and input schema,
/// or its whole definition ([`CostBasis`]).
pub(crate) fn tool_cost(
    estimator: &dyn TokenEstimator,
    server: &ServerId,
    tool: &ToolDefinition,
    basis: CostBasis,
) -> u64 {
    // The exposed name is `server__tool` in the common case.
    let prefix = estimator.estimate_text(server.as_str()) + 1;
    match basis {
        CostBasis::Definition => {
            let definition = serde_json::to_string(tool).unwrap_or_default();
            prefix + estimator.estimate_text(&definition)
        }
        CostBasis::ModelFields => {
            let schema = serde_json::to_string(&tool.input_schema).unwrap_or_default();
            prefix
                + estimator.estimate_text(tool.name.as_str())
                + estimator.estimate_text(tool.description_or_empty())
                + estimator.estimate_text(&schema)
        }
    }
}

/// The cost of `tools`, counted until it passes `limit`.
fn counted_cost(
    estimator: &dyn TokenEstimator,
    server: &ServerId,
    tools: &[&ToolDefinition],
    limit: u64,
    basis: CostBasis,
) -> Cost {
    let mut sum = 0u64;
    for tool in tools {
        if sum > limit {
            return Cost::AtLeast(sum);
        }
        sum = sum.saturating_add(tool_cost(estimator, server, tool, basis));
    }
    Cost::Exact(sum)
}

/// Resolves one turn's [`Surface`].
///
/// Narrowing first (permitted = live catalogue ∩ grant); then each connected server the
/// grant mentions gets a shape from its preload flag, its permitted count and cost; then the
/// [`Auto`](Preload::Auto) servers share the auto budget, smallest first (see
/// [`Why::OverBudget`]); then the tool cap is enforced by stepping shapes down; then names
/// are assigned. Input order does not matter: servers are taken in id order and tools in
/// name order.
///
/// # Errors
///
/// [`ResolveError`] when a server has two connections or two catalogues, or a catalogue
/// lists a tool twice.
pub fn resolve(
    inputs: &Inputs<'_>,
    settings: &Settings,
    estimator: &dyn TokenEstimator,
) -> Result<Surface, ResolveError> {
    let servers = index_inputs(inputs)?;
    let mut prepared = Vec::with_capacity(servers.len());
    for (connection, catalog) in servers {
        let part = prepare(connection, catalog, inputs.grant, settings, estimator)?;
        prepared.push((connection, catalog, Arc::new(part)));
    }
    Ok(compose(
        prepared
            .iter()
            .map(|(c, catalog, part)| (*c, *catalog, part)),
        settings,
        Naming::Global,
    ))
}

/// The servers a resolution shows, in id order: each connection the grant mentions, with
/// its catalogue when it has one.
///
/// # Errors
///
/// [`ResolveError`] when a server has two connections or two catalogues.
pub(crate) fn index_inputs<'a>(
    inputs: &Inputs<'a>,
) -> Result<Vec<(&'a ConnectionSpec, Option<&'a ServerCatalog>)>, ResolveError> {
    let mut connections: BTreeMap<&ServerId, &ConnectionSpec> = BTreeMap::new();
    for connection in inputs.connections {
        if connections.insert(&connection.server, connection).is_some() {
            return Err(ResolveError::DuplicateConnection(connection.server.clone()));
        }
    }
    let mut catalogs: BTreeMap<&ServerId, &ServerCatalog> = BTreeMap::new();
    for catalog in inputs.catalogs {
        if catalogs.insert(&catalog.server, catalog).is_some() {
            return Err(ResolveError::DuplicateCatalog(catalog.server.clone()));
        }
    }
    Ok(connections
        .into_iter()
        .filter(|(server, _)| inputs.grant.permits_server(server))
        .map(|(server, connection)| (connection, catalogs.get(server).copied()))
        .collect())
}

/// One server's part of a resolution that depends on nothing but its connection, its
/// catalogue's tools, its scope in the grant, the settings and the estimator: its
/// permitted tools, their cost, its facade index and its size tier. The most expensive
/// part of a resolution, and what [`SurfaceCache`](crate::SurfaceCache) keeps per server.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The catalogue's tools, shared: `permitted` indexes them.
    tools: Option<Arc<[ToolDefinition]>>,
    /// The permitted tools, as indices into `tools`, sorted by name.
    permitted: Vec<usize>,
    /// The permitted tools' names: this server's share of a Surface's [`PermittedSet`].
    names: Arc<BTreeSet<ToolName>>,
    cost: Cost,
    index: String,
    index_fits: bool,
    /// The shape its size gives it, before preload, budget and cap.
    tier: Shape,
    /// Its scope in the grant it was prepared under.
    pub(crate) scope: Option<ToolScope>,
    /// The keyword index over its permitted tools, built at the first search that needs
    /// it ([`Surface::prepare_search`]) and shared by every Surface composed from this part.
    search: OnceLock<Arc<Part>>,
}

impl Prepared {
    /// The catalogue's tools it was prepared from.
    pub(crate) fn tools(&self) -> Option<&Arc<[ToolDefinition]>> {
        self.tools.as_ref()
    }

    /// The permitted tools, sorted by name.
    fn permitted(&self) -> impl Iterator<Item = &ToolDefinition> {
        let all: &[ToolDefinition] = self.tools.as_deref().unwrap_or_default();
        self.permitted.iter().map(move |&i| &all[i])
    }

    /// The permitted tool named `name`.
    fn permitted_tool(&self, name: &ToolName) -> Option<&ToolDefinition> {
        let all: &[ToolDefinition] = self.tools.as_deref().unwrap_or_default();
        let i = self
            .permitted
            .binary_search_by(|&i| all[i].name.cmp(name))
            .ok()?;
        Some(&all[self.permitted[i]])
    }

    /// Whether the keyword index over the permitted tools is built.
    #[cfg(test)]
    pub(crate) fn search_built(&self) -> bool {
        self.search.get().is_some()
    }

    /// The keyword index over the permitted tools, built now if no search built it yet.
    /// Blocks for the indexing: about a millisecond per few hundred tools.
    pub(crate) fn search_part(&self, server: &ServerId) -> Arc<Part> {
        let part = self.search.get_or_init(|| {
            let all: &[ToolDefinition] = self.tools.as_deref().unwrap_or_default();
            Arc::new(Part::new(self.permitted.iter().map(|&i| (server, &all[i]))))
        });
        Arc::clone(part)
    }
}

/// Prepares one server (see [`Prepared`]).
///
/// # Errors
///
/// [`ResolveError::DuplicateTool`] when its catalogue lists a tool twice (permitted or not).
pub(crate) fn prepare(
    connection: &ConnectionSpec,
    catalog: Option<&ServerCatalog>,
    grant: &PermissionGrant,
    settings: &Settings,
    estimator: &dyn TokenEstimator,
) -> Result<Prepared, ResolveError> {
    let server = &connection.server;
    let tools = catalog.map(|c| Arc::clone(&c.tools));
    let all: &[ToolDefinition] = tools.as_deref().unwrap_or_default();
    // Over every tool, permitted or not: a copy left out of the permitted set (say, for a
    // schema no provider takes) would otherwise be the one a call by name finds.
    if let Some(tool) = duplicate_name(all) {
        return Err(ResolveError::DuplicateTool {
            server: server.clone(),
            tool: tool.clone(),
        });
    }
    let mut permitted: Vec<usize> = (0..all.len())
        .filter(|&i| crate::guard::in_permitted_set(grant, server, &all[i]))
        .collect();
    permitted.sort_by(|&a, &b| all[a].name.cmp(&all[b].name));
    let budget = settings.auto_budget.tokens();
    let may_be_direct = permitted.len() <= settings.direct_max_tools;
    let limit = match (connection.preload == Preload::Auto, may_be_direct) {
        (true, true) => budget.max(settings.direct_max_tokens),
        (true, false) => budget,
        (false, true) => settings.direct_max_tokens,
        (false, false) => 0,
    };
    let refs: Vec<&ToolDefinition> = permitted.iter().map(|&i| &all[i]).collect();
    let cost = counted_cost(estimator, server, &refs, limit, settings.cost_basis);
    let names: Vec<&ToolName> = refs.iter().map(|t| &t.name).collect();
    let index = shapes::facade_index(server, &names);
    let index_fits = estimator.estimate_text(&index) <= settings.facade_max_index_tokens;
    let tier = if may_be_direct && cost.tokens() <= settings.direct_max_tokens {
        Shape::Direct
    } else if index_fits {
        Shape::Facade
    } else {
        Shape::SearchPair
    };
    let names = Arc::new(refs.iter().map(|t| t.name.clone()).collect());
    Ok(Prepared {
        tools,
        permitted,
        names,
        cost,
        index,
        index_fits,
        tier,
        scope: grant.scope(server).cloned(),
        search: OnceLock::new(),
    })
}

/// A name `tools` lists twice, if any: next to each other in a catalogue sorted by name
/// (as the catalogue crate keeps them), else found by a set.
fn duplicate_name(tools: &[ToolDefinition]) -> Option<&ToolName> {
    if tools.windows(2).all(|w| w[0].name <= w[1].name) {
        return tools
            .windows(2)
            .find(|w| w[0].name == w[1].name)
            .map(|w| &w[0].name);
    }
    let mut seen = HashSet::with_capacity(tools.len());
    tools
        .iter()
        .map(|t| &t.name)
        .find(|name| !seen.insert(*name))
}

/// How a composition names the Surface's entries.
#[derive(Clone, Copy)]
pub(crate) enum Naming<'a> {
    /// One pass over every server's entries ([`resolve`]).
    Global,
    /// Each server's entries named alone, reusing the pieces of `previous` whose server
    /// is unchanged; the one pass only when two servers compete for a name
    /// ([`SurfaceCache`](crate::SurfaceCache)).
    Pieces {
        /// The last Surface composed from pieces.
        previous: Option<&'a Surface>,
    },
}

/// Decides every server's shape from its prepared part, shares the budget, enforces the
/// cap and builds the Surface. `servers` are in server order.
///
/// Work per unchanged server is constant with [`Naming::Pieces`]: shapes come from each
/// part's cost and counts, names from its reused piece.
pub(crate) fn compose<'a>(
    servers: impl IntoIterator<
        Item = (
            &'a ConnectionSpec,
            Option<&'a ServerCatalog>,
            &'a Arc<Prepared>,
        ),
    >,
    settings: &Settings,
    naming: Naming<'_>,
) -> Surface {
    let budget = settings.auto_budget.tokens();
    let mut plans = Vec::new();
    for (connection, catalog, part) in servers {
        let mut plan = Plan {
            connection,
            catalog,
            part,
            permitted: part.permitted.len(),
            cost: part.cost,
            index_fits: part.index_fits,
            shape: Shape::Deferred,
            why: Why::NoTools,
            eager: Vec::new(),
        };
        (plan.shape, plan.why) = match connection.preload {
            _ if plan.permitted == 0 => (Shape::Deferred, Why::NoTools),
            Preload::Deferred => (Shape::Deferred, Why::Pinned),
            Preload::Eager => (part.tier, Why::Pinned),
            // Alone over the budget: it can never be kept, whatever the others cost.
            Preload::Auto if plan.cost.tokens() > budget => (Shape::Deferred, Why::OverBudget),
            // Kept for now; `share_budget` decides with the other Auto servers.
            Preload::Auto => (part.tier, Why::Size),
        };
        plans.push(plan);
    }

    share_budget(&mut plans, budget);
    for plan in plans.iter_mut().filter(|p| p.shape == Shape::Deferred) {
        plan.eager = plan.eager_tools();
    }
    enforce_cap(&mut plans, settings);
    build(plans, settings, naming)
}

/// Shares the auto budget among the [`Auto`](Preload::Auto) servers still kept (each costs
/// at most the budget alone, so its cost is [`Cost::Exact`]): in ascending order of cost,
/// ties to the smaller server id, each stays at its size tier while the kept ones' costs
/// sum to at most `budget`; the first that does not fit, and every one after it (none
/// costs less), is deferred with [`Why::OverBudget`]. Greedy by size keeps the most servers
/// out of deferral (no extra round trip to reach them) within the budget. Pinned servers
/// ([`Preload::Eager`], [`Preload::Deferred`]) take no share: their author decided.
fn share_budget(plans: &mut [Plan<'_>], budget: u64) {
    let mut auto: Vec<usize> = (0..plans.len())
        // Only Auto servers are kept for their size (`Why::Size`).
        .filter(|&i| plans[i].why == Why::Size)
        .collect();
    // Plans are in server order, and the sort is stable: equal costs stay in server order.
    auto.sort_by_key(|&i| plans[i].cost.tokens());
    let mut kept = 0u64;
    for i in auto {
        let cost = plans[i].cost.tokens();
        if kept.saturating_add(cost) <= budget {
            kept += cost;
        } else {
            plans[i].shape = Shape::Deferred;
            plans[i].why = Why::OverBudget;
        }
    }
}

/// Steps shapes down, deterministically, until the Surface has at most
/// [`Settings::surface_cap`] tools (the tool cap less the caller's reserved tools):
/// first the direct server with the most permitted tools becomes a facade (or a search
/// pair when that is fewer tools); then the largest remaining non-deferred server is
/// deferred; then the largest set of eagerly injected tools is dropped. Last, the room left
/// goes to deferred servers' eager tools not direct (a server the cap deferred, one whose
/// set was dropped), in server order, as many as fit. Ties go to the
/// smaller server id. Settings guarantee the cap holds the fixed tools, so this ends with
/// every server deferred at worst.
fn enforce_cap(plans: &mut [Plan<'_>], settings: &Settings) {
    let total = |plans: &[Plan<'_>]| {
        let deferred = plans.iter().any(|p| p.shape == Shape::Deferred);
        let fixed =
            usize::from(settings.orientation_tool) + if deferred { META_TOOL_COUNT } else { 0 };
        fixed + plans.iter().map(Plan::tool_count).sum::<usize>()
    };
    // Largest first; among equals, the first in server order (plans are sorted by server).
    let pick = |plans: &[Plan<'_>],
                eligible: &dyn Fn(&Plan<'_>) -> bool,
                size: &dyn Fn(&Plan<'_>) -> usize| {
        let mut best: Option<usize> = None;
        for (i, plan) in plans.iter().enumerate() {
            if eligible(plan) && best.is_none_or(|b| size(plan) > size(&plans[b])) {
                best = Some(i);
            }
        }
        best
    };
    while total(plans) > settings.surface_cap() {
        let shrinks = |p: &Plan<'_>| {
            p.shape == Shape::Direct
                && match p.step_down_shape() {
                    Shape::Facade => 1,
                    _ => 2,
                } < p.permitted
        };
        if let Some(i) = pick(plans, &shrinks, &|p| p.permitted) {
            plans[i].shape = plans[i].step_down_shape();
            plans[i].why = Why::ToolCap;
            continue;
        }
        if let Some(i) = pick(plans, &|p| p.shape != Shape::Deferred, &|p| p.permitted) {
            plans[i].shape = Shape::Deferred;
            plans[i].why = Why::ToolCap;
            continue;
        }
        if let Some(i) = pick(plans, &|p| !p.eager.is_empty(), &|p| p.eager.len()) {
            plans[i].eager.clear();
            continue;
        }
        break;
    }
    // Once every step is taken, the room left goes to deferred servers' eager tools that
    // are not direct: those of servers the cap deferred (none yet) and of those whose set
    // was dropped whole, in server order, each in name order, as many as fit.
    for i in 0..plans.len() {
        if plans[i].shape == Shape::Deferred {
            let room = settings.surface_cap().saturating_sub(total(plans));
            let mut eager = plans[i].eager_tools();
            eager.truncate(plans[i].eager.len() + room);
            if eager.len() > plans[i].eager.len() {
                plans[i].eager = eager;
            }
        }
    }
}

/// One deferred server's line.
fn deferred_line(plan: &Plan<'_>) -> String {
    let server = &plan.connection.server;
    let mut line = if plan.permitted == 0 {
        let head = format!("{server}: deferred MCP server, no tools (");
        // The state's reason gets what the line has left, so its telling part is not cut.
        let room = DEFERRED_LINE_CHARS.saturating_sub(head.chars().count() + 1);
        let state = state::line_state(server, plan.catalog.map(|c| &c.health), room);
        format!("{head}{state})")
    } else {
        let n = plan.permitted;
        let mut head = format!(
            "{server}: deferred MCP server, {n} tool{}",
            if n == 1 { "" } else { "s" }
        );
        if !plan.eager.is_empty() {
            head.push_str(&format!(", {} of them also direct", plan.eager.len()));
        }
        head
    };
    if let Some(description) = plan.connection.description.as_deref() {
        let description = first_line(description);
        if !description.is_empty() {
            line.push_str(". ");
            line.push_str(&description);
        }
    }
    cap_chars(&line, DEFERRED_LINE_CHARS, TRUNCATION_MARKER)
}

/// The Surface's names: those of its tools, and per deferred server its deferred tools'.
struct Named {
    names: BTreeMap<String, Exposed>,
    deferred: BTreeMap<ServerId, Arc<BTreeMap<String, Exposed>>>,
    /// Each plan's piece, in plan order, when named by pieces.
    pieces: Option<Vec<Arc<Piece>>>,
}

/// Names every entry of the plans (and the fixed ones: the meta tools when a server is
/// deferred, the orientation tool when it is on).
fn name(plans: &[Plan<'_>], fixed: Vec<Exposed>, naming: Naming<'_>) -> Named {
    let pieces = match naming {
        Naming::Global => None,
        Naming::Pieces { previous } => Some(
            plans
                .iter()
                .map(|plan| {
                    previous
                        .and_then(|surface| surface.pieces.0.get(&plan.connection.server))
                        .filter(|piece| plan.fits(piece))
                        .map_or_else(|| Arc::new(Piece::new(plan)), Arc::clone)
                })
                .collect::<Vec<_>>(),
        ),
    };
    if let Some(each) = pieces.as_deref().filter(|each| pieces_are_disjoint(each)) {
        // Each piece named alone is what the one pass would give.
        let mut names: BTreeMap<String, Exposed> = fixed
            .into_iter()
            .map(|entry| (entry.fixed_name().unwrap_or_default().to_owned(), entry))
            .collect();
        let mut deferred = BTreeMap::new();
        for (plan, piece) in plans.iter().zip(each) {
            names.extend(piece.exposed.iter().cloned());
            if plan.shape == Shape::Deferred {
                deferred.insert(plan.connection.server.clone(), Arc::clone(&piece.deferred));
            }
        }
        return Named {
            names,
            deferred,
            pieces,
        };
    }
    let mut entries = fixed;
    for plan in plans {
        entries.extend(plan.entries());
    }
    let mut deferred: BTreeMap<ServerId, BTreeMap<String, Exposed>> = plans
        .iter()
        .filter(|p| p.shape == Shape::Deferred)
        .map(|p| (p.connection.server.clone(), BTreeMap::new()))
        .collect();
    let mut names = BTreeMap::new();
    for (name, exposed) in names::assign(entries) {
        match &exposed {
            // Every deferred entry is of a deferred plan, whose map is there.
            Exposed::Deferred { target } => {
                if let Some(names) = deferred.get_mut(&target.server) {
                    names.insert(name, exposed);
                }
            }
            _ => {
                names.insert(name, exposed);
            }
        }
    }
    Named {
        names,
        deferred: deferred
            .into_iter()
            .map(|(server, names)| (server, Arc::new(names)))
            .collect(),
        pieces,
    }
}

fn build(plans: Vec<Plan<'_>>, settings: &Settings, naming: Naming<'_>) -> Surface {
    let any_deferred = plans.iter().any(|p| p.shape == Shape::Deferred);
    let mut fixed: Vec<Exposed> = Vec::new();
    if any_deferred {
        for tool in [
            MetaTool::ListTools,
            MetaTool::DescribeTool,
            MetaTool::CallTool,
        ] {
            fixed.push(Exposed::Meta { tool });
        }
    }
    if settings.orientation_tool {
        fixed.push(Exposed::Orientation);
    }
    let Named {
        mut names,
        deferred,
        pieces,
    } = name(&plans, fixed, naming);
    let deferred_catalogs = plans
        .iter()
        .filter(|p| p.shape == Shape::Deferred)
        .filter_map(|p| {
            let tools = SharedTools(Arc::clone(&p.catalog?.tools));
            Some((p.connection.server.clone(), tools))
        })
        .collect();

    let by_server: BTreeMap<&ServerId, &Plan<'_>> =
        plans.iter().map(|p| (&p.connection.server, p)).collect();
    let name_of = |wanted: &Exposed| {
        names
            .iter()
            .find(|(_, e)| *e == wanted)
            .map(|(n, _)| n.as_str())
            .unwrap_or_default()
    };
    let meta = if any_deferred {
        shapes::meta_tools()
    } else {
        Vec::new()
    };
    let mut tools = Vec::with_capacity(names.len());
    for (name, exposed) in &names {
        let definition = match exposed {
            Exposed::Direct { target } => by_server.get(&target.server).and_then(|plan| {
                let mut tool = plan.part.permitted_tool(&target.tool)?.clone();
                tool.name = ToolName::new(name.as_str()).ok()?;
                Some(tool)
            }),
            Exposed::Facade { server } => by_server.get(server).and_then(|plan| {
                shapes::facade(
                    name,
                    server,
                    plan.connection.description.as_deref(),
                    &plan.part.index,
                )
            }),
            Exposed::Search { server } => by_server.get(server).and_then(|plan| {
                let call = name_of(&Exposed::SearchCall {
                    server: server.clone(),
                });
                shapes::search(
                    name,
                    server,
                    plan.connection.description.as_deref(),
                    plan.permitted,
                    call,
                )
            }),
            Exposed::SearchCall { server } => {
                let search = name_of(&Exposed::Search {
                    server: server.clone(),
                });
                shapes::search_call(name, server, search)
            }
            Exposed::Meta { tool } => meta
                .iter()
                .find(|t| t.name.as_str() == tool.name())
                .cloned(),
            Exposed::Orientation => shapes::orientation_tool(),
            // Kept apart by `name`: a deferred tool is not among the tools.
            Exposed::Deferred { .. } => None,
        };
        // Every entry was made from a plan above and every name is a valid MCP name, so a
        // definition always exists; an entry without one would simply not be exposed.
        if let Some(definition) = definition {
            tools.push(definition);
        }
    }
    let built: HashSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    names.retain(|name, _| built.contains(name.as_str()));

    let deferred_lines = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| p.shape == Shape::Deferred)
        .map(
            |(i, p)| match pieces.as_ref().and_then(|pieces| pieces.get(i)) {
                Some(piece) => piece.line(p),
                None => deferred_line(p),
            },
        )
        .collect();
    let permitted = PermittedSet {
        servers: plans
            .iter()
            .map(|p| (p.connection.server.clone(), Arc::clone(&p.part.names)))
            .collect(),
    };
    let parts = plans
        .iter()
        .map(|p| (p.connection.server.clone(), SharedPart(Arc::clone(p.part))))
        .collect();
    let pieces = Pieces(
        pieces
            .into_iter()
            .flatten()
            .zip(&plans)
            .map(|(piece, plan)| (plan.connection.server.clone(), piece))
            .collect(),
    );
    let servers = plans
        .into_iter()
        .map(|p| ServerView {
            server: p.connection.server.clone(),
            shape: p.shape,
            why: p.why,
            permitted: p.permitted,
            cost: p.cost,
            eager: p.eager.iter().map(|t| t.name.clone()).collect(),
            description: p.connection.description.clone(),
            health: p.catalog.map(|c| c.health.clone()).unwrap_or_default(),
        })
        .collect();
    Surface {
        tools,
        deferred_lines,
        servers,
        names,
        deferred,
        deferred_catalogs,
        permitted,
        settings: settings.clone(),
        parts,
        pieces,
    }
}
