//! Properties over random catalogues, grants, preload flags and settings: every shape and
//! every meta tool exposes exactly the permitted set; discovery never bypasses the grant; a
//! tool revoked between resolution and call is refused; names are unique, provider-safe
//! and round-trip; the cap holds; the `Auto` servers share the auto budget greedily by
//! size; input order does not change a byte.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::{BTreeMap, BTreeSet};

use crate::common::{Bytes4, catalog};
use proptest::prelude::*;
use psych_disclosure::{
    Answer, Budget, Cost, CostBasis, DESCRIBE_TOOL, Exposed, Inputs, LIST_TOOLS, Refusal,
    ServerView, Settings, Shape, Surface, Validators, Verdict, Why, resolve,
};
use psych_types::{
    ConnectionSpec, PermissionGrant, Preload, ServerCatalog, ServerId, ToolDefinition, ToolName,
    ToolRef, ToolScope,
};
use serde_json::json;

#[derive(Debug, Clone)]
struct Case {
    connections: Vec<ConnectionSpec>,
    catalogs: Vec<ServerCatalog>,
    grant: PermissionGrant,
    settings: Settings,
}

const SERVERS: [&str; 6] = ["a", "b", "a__b", "gh", "psych_list_tools", "s-1"];

fn tool_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "get_me",
            "Get_Me",
            "search_code",
            "create_branch",
            "b__c",
            "a.b",
            "a_b",
            "list",
            "search_tools",
            "call_tool",
        ])
        .prop_map(str::to_owned),
        "[a-zA-Z0-9_.-]{1,100}",
    ]
}

fn server_case() -> impl Strategy<Value = (Vec<String>, String, u8, u8, Vec<bool>, Vec<bool>)> {
    (
        prop::collection::btree_set(tool_name(), 0..24),
        "[a-z ]{0,200}",
        0u8..3,
        0u8..3,
        prop::collection::vec(any::<bool>(), 24),
        prop::collection::vec(any::<bool>(), 24),
    )
        .prop_map(|(names, desc, grant, preload, only, eager)| {
            (
                names.into_iter().collect(),
                desc,
                grant,
                preload,
                only,
                eager,
            )
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::subsequence(SERVERS.to_vec(), 1..=SERVERS.len()),
        prop::collection::vec(server_case(), SERVERS.len()),
        (
            0usize..30,
            0u64..6_000,
            0u64..300,
            4usize..40,
            0u64..6_000,
            1usize..10,
            prop::sample::select(vec![CostBasis::ModelFields, CostBasis::Definition]),
        ),
    )
        .prop_map(
            |(servers, details, (dmax, dtok, ftok, cap, budget, page, basis))| {
                let mut case = Case {
                    connections: Vec::new(),
                    catalogs: Vec::new(),
                    grant: PermissionGrant::none(),
                    settings: Settings::builder()
                        .direct_max_tools(dmax)
                        .direct_max_tokens(dtok)
                        .facade_max_index_tokens(ftok)
                        .tool_cap(cap)
                        .auto_budget(Budget::Tokens(budget))
                        .page_size(page)
                        .cost_basis(basis)
                        .build()
                        .unwrap(),
                };
                for (server, (names, desc, grant, preload, only, eager)) in
                    servers.iter().zip(details)
                {
                    let id = ServerId::new(*server).unwrap();
                    let mut tools: Vec<ToolDefinition> = names
                        .iter()
                        .map(|n| {
                            ToolDefinition::new(
                                ToolName::new(n.as_str()).unwrap(),
                                format!("{n} {desc}"),
                                serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
                            )
                        })
                        .collect();
                    tools.sort_by(|a, b| a.name.cmp(&b.name));
                    let mut connection = ConnectionSpec::new(id.clone()).with_preload(
                        [Preload::Auto, Preload::Eager, Preload::Deferred][usize::from(preload)],
                    );
                    for (tool, on) in tools.iter().zip(&eager) {
                        if *on {
                            connection = connection.with_eager_tool(tool.name.clone());
                        }
                    }
                    match grant {
                        0 => {}
                        1 => {
                            case.grant = std::mem::take(&mut case.grant)
                                .allow_scope(id.clone(), ToolScope::All);
                        }
                        _ => {
                            // Some catalogue tools and a name that is not in the catalogue.
                            let mut set: BTreeSet<ToolName> = tools
                                .iter()
                                .zip(&only)
                                .filter(|(_, on)| **on)
                                .map(|(t, _)| t.name.clone())
                                .collect();
                            set.insert(ToolName::new("granted_but_absent").unwrap());
                            case.grant = std::mem::take(&mut case.grant)
                                .allow_scope(id.clone(), ToolScope::Only(set));
                        }
                    }
                    case.connections.push(connection);
                    case.catalogs.push(catalog(server, tools));
                }
                case
            },
        )
}

impl Case {
    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            connections: &self.connections,
            catalogs: &self.catalogs,
            grant: &self.grant,
        }
    }

    fn surface(&self) -> Surface {
        resolve(&self.inputs(), &self.settings, &Bytes4).unwrap()
    }

    /// Narrowing computed independently: catalogue ∩ grant.
    fn permitted(&self, grant: &PermissionGrant) -> BTreeMap<ServerId, BTreeSet<ToolName>> {
        self.catalogs
            .iter()
            .filter(|c| grant.permits_server(&c.server))
            .map(|c| {
                (
                    c.server.clone(),
                    c.tools
                        .iter()
                        .filter(|t| grant.permits(&c.server, &t.name))
                        .map(|t| t.name.clone())
                        .collect(),
                )
            })
            .collect()
    }
}

/// The exposed name that reaches a server's tools one by one, and how to address a tool
/// through it.
fn describe_route(
    surface: &Surface,
    server: &ServerId,
    tool: &str,
) -> Option<(String, serde_json::Value)> {
    for (name, exposed) in surface.names() {
        match exposed {
            Exposed::Facade { server: s } | Exposed::SearchCall { server: s } if s == server => {
                return Some((name.to_owned(), json!({"tool": tool})));
            }
            _ => {}
        }
    }
    surface.exposed(DESCRIBE_TOOL).map(|_| {
        (
            DESCRIBE_TOOL.to_owned(),
            json!({"server": server.as_str(), "tool": tool}),
        )
    })
}

fn listed(surface: &Surface, case: &Case, server: &ServerId) -> BTreeSet<ToolName> {
    let live = psych_disclosure::Live {
        grant: &case.grant,
        catalogs: &case.catalogs,
    };
    let mut names = BTreeSet::new();
    let mut page = 1;
    loop {
        let verdict = surface.guard(
            LIST_TOOLS,
            &json!({"server": server.as_str(), "page": page}),
            &live,
            &Validators::new(),
        );
        let Verdict::Answer(Answer::Listing(listing)) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(listing.tools.len() <= case.settings.page_size());
        for tool in listing.tools {
            assert!(names.insert(tool.name), "listed twice");
        }
        if listing.more.is_none() {
            return names;
        }
        page += 1;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_shape_exposes_exactly_the_permitted_set(case in case()) {
        let surface = case.surface();
        let permitted = case.permitted(&case.grant);
        let live = psych_disclosure::Live { grant: &case.grant, catalogs: &case.catalogs };
        let validators = Validators::new();

        // The cap, and names that are safe, unique ignoring case, and resolve.
        prop_assert!(surface.tools().len() <= case.settings.tool_cap());
        let mut lower = BTreeSet::new();
        for tool in surface.tools() {
            let name = tool.name.as_str();
            prop_assert!(name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{}", name);
            prop_assert!(lower.insert(name.to_ascii_lowercase()), "{}", name);
            prop_assert!(surface.exposed(name).is_some());
        }
        prop_assert_eq!(surface.names().count(), surface.tools().len());
        // Deferred tools' qualified names: safe, unique with the tools' ignoring case, each
        // a permitted tool of a deferred server that is not direct already; together, with
        // the eager ones, exactly the deferred servers' permitted sets.
        let mut deferred: BTreeMap<ServerId, BTreeSet<ToolName>> = BTreeMap::new();
        for (name, target) in surface.deferred_names() {
            prop_assert!(name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{}", name);
            prop_assert!(lower.insert(name.to_ascii_lowercase()), "{}", name);
            prop_assert!(permitted[&target.server].contains(&target.tool));
            prop_assert!(surface.direct_name(target).is_none());
            deferred.entry(target.server.clone()).or_default().insert(target.tool.clone());
        }
        prop_assert_eq!(surface.deferred_tools().len(), surface.deferred_names().count());
        for view in surface.servers().iter().filter(|v| v.shape == Shape::Deferred) {
            let mut all = deferred.remove(&view.server).unwrap_or_default();
            all.extend(view.eager.iter().cloned());
            prop_assert_eq!(&all, &permitted[&view.server]);
        }
        prop_assert!(deferred.is_empty());

        // The Surface's permitted set is narrowing, computed independently.
        for view in surface.servers() {
            prop_assert_eq!(surface.permitted().tools(&view.server), permitted.get(&view.server));
        }
        prop_assert_eq!(surface.servers().len(), permitted.len());

        // Direct tools: each is permitted and round-trips; a Direct server shows all of them.
        let mut direct: BTreeMap<ServerId, BTreeSet<ToolName>> = BTreeMap::new();
        for (name, exposed) in surface.names() {
            if let Exposed::Direct { target } = exposed {
                prop_assert!(permitted[&target.server].contains(&target.tool));
                prop_assert_eq!(surface.direct_name(target), Some(name));
                direct.entry(target.server.clone()).or_default().insert(target.tool.clone());
            }
        }
        let any_deferred = surface.servers().iter().any(|v| v.shape == Shape::Deferred);
        prop_assert_eq!(surface.exposed(LIST_TOOLS).is_some(), any_deferred);
        for view in surface.servers() {
            let expected = &permitted[&view.server];
            if view.shape == Shape::Direct {
                prop_assert_eq!(direct.get(&view.server), Some(expected));
            }
            // Discovery lists exactly the permitted set.
            if any_deferred {
                prop_assert_eq!(&listed(&surface, &case, &view.server), expected);
            }
            // Every permitted tool is reachable by its route; every other catalogue tool is
            // refused the same way an unknown one is.
            let catalogue = &case.catalogs.iter().find(|c| c.server == view.server).unwrap().tools;
            for tool in catalogue.iter() {
                let Some((route, args)) = describe_route(&surface, &view.server, tool.name.as_str()) else {
                    continue;
                };
                let verdict = surface.guard(&route, &args, &live, &validators);
                if expected.contains(&tool.name) {
                    let described = matches!(verdict, Verdict::Answer(Answer::Description(ref d)) if d.tool == tool.name);
                    prop_assert!(described, "{:?}", verdict);
                } else {
                    let refused = matches!(verdict, Verdict::Refused(Refusal::NotAvailable { .. }));
                    prop_assert!(refused, "{:?}", verdict);
                }
            }
            // A facade's index line names exactly the permitted set.
            if view.shape == Shape::Facade {
                let facade = surface.tools().iter().find(|t| matches!(surface.exposed(t.name.as_str()), Some(Exposed::Facade { server }) if *server == view.server)).unwrap();
                let first = facade.description_or_empty().lines().next().unwrap();
                let (_, index) = first.split_once("): ").unwrap();
                let names: BTreeSet<&str> = index.split(", ").filter(|s| !s.is_empty()).collect();
                prop_assert_eq!(names, expected.iter().map(ToolName::as_str).collect::<BTreeSet<_>>());
            }
            // Search answers only permitted tools.
            if view.shape == Shape::SearchPair {
                let search = surface.names().find(|(_, e)| matches!(e, Exposed::Search { server } if *server == view.server)).unwrap().0.to_owned();
                for tool in catalogue.iter() {
                    let verdict = surface.guard(&search, &json!({"query": tool.name.as_str()}), &live, &validators);
                    let Verdict::Answer(Answer::Search(answer)) = verdict else { panic!("{verdict:?}") };
                    prop_assert!(answer.hits.iter().all(|h| expected.contains(&h.name)));
                }
            }
        }
    }

    #[test]
    fn a_tool_revoked_after_resolution_is_refused_by_every_route(case in case()) {
        let surface = case.surface();
        let permitted = case.permitted(&case.grant);
        let Some((server, tool)) = permitted.iter().find_map(|(s, t)| t.iter().next().map(|t| (s.clone(), t.clone()))) else {
            return Ok(());
        };
        let mut revoked = case.grant.clone();
        let rest: BTreeSet<ToolName> = permitted[&server].iter().filter(|t| **t != tool).cloned().collect();
        revoked = std::mem::take(&mut revoked).allow_scope(server.clone(), ToolScope::Only(rest));
        let live = psych_disclosure::Live { grant: &revoked, catalogs: &case.catalogs };
        let validators = Validators::new();
        let pair = ToolRef::new(server.clone(), tool.clone());
        let mut routes = Vec::new();
        if let Some(name) = surface.direct_name(&pair) {
            routes.push((name.to_owned(), json!({})));
        }
        if let Some(route) = describe_route(&surface, &server, tool.as_str()) {
            routes.push(route);
        }
        if surface.exposed(psych_disclosure::CALL_TOOL).is_some() {
            routes.push((psych_disclosure::CALL_TOOL.to_owned(), json!({"server": server.as_str(), "tool": tool.as_str()})));
        }
        for (name, args) in routes {
            let verdict = surface.guard(&name, &args, &live, &validators);
            let refused = matches!(
                verdict,
                Verdict::Refused(Refusal::NotAvailable { .. } | Refusal::UnknownServer { .. })
            );
            prop_assert!(refused, "{} {:?}", name, verdict);
        }
    }

    #[test]
    fn the_auto_servers_share_the_budget_greedily_by_size(case in case()) {
        let surface = case.surface();
        let budget = case.settings.auto_budget().tokens();
        let auto = |view: &ServerView| {
            case.connections
                .iter()
                .any(|c| c.server == view.server && c.preload == Preload::Auto)
        };
        // Kept: at their size tier, or stepped down by the cap afterwards (the cap only
        // touches servers that were not deferred).
        let kept: Vec<&ServerView> = surface
            .servers()
            .iter()
            .filter(|v| auto(v) && matches!(v.why, Why::Size | Why::ToolCap))
            .collect();
        let over: Vec<&ServerView> = surface
            .servers()
            .iter()
            .filter(|v| v.why == Why::OverBudget)
            .collect();
        let sum: u64 = kept.iter().map(|v| v.cost.tokens()).sum();
        prop_assert!(sum <= budget, "kept {} > budget {}", sum, budget);
        for view in &kept {
            prop_assert!(matches!(view.cost, Cost::Exact(_)), "{:?}", view);
        }
        for view in &over {
            prop_assert!(auto(view) && view.shape == Shape::Deferred, "{:?}", view);
            // It would not have fitted after the kept ones...
            prop_assert!(sum + view.cost.tokens() > budget, "{:?} fits in {}", view, budget - sum);
            // ...and every kept server came before it: smaller cost, ties by id.
            for k in &kept {
                prop_assert!(
                    (k.cost.tokens(), &k.server) < (view.cost.tokens(), &view.server),
                    "{:?} kept before {:?}", k, view
                );
            }
        }
    }

    #[test]
    fn input_order_does_not_change_a_byte(case in case(), rotate in 0usize..6) {
        let surface = case.surface();
        let mut shuffled = case.clone();
        shuffled.connections.reverse();
        shuffled.catalogs.reverse();
        let n = shuffled.catalogs.len();
        shuffled.catalogs.rotate_left(rotate % n);
        for catalog in &mut shuffled.catalogs {
            let mut tools = catalog.tools.to_vec();
            tools.reverse();
            catalog.tools = tools.into();
        }
        let other = shuffled.surface();
        prop_assert_eq!(surface.tools(), other.tools());
        prop_assert_eq!(surface.deferred_lines(), other.deferred_lines());
        prop_assert_eq!(surface.servers(), other.servers());
        prop_assert_eq!(surface, other);
    }
}

/// One change between two resolutions, as a Run sees them from turn to turn.
#[derive(Debug, Clone)]
enum Change {
    /// Nothing changed: the same catalogue reads.
    Nothing,
    /// A server's catalogue changed: its `k`-th tool dropped, or a new tool added, at a new
    /// version (a new allocation).
    Catalogue { server: usize, k: usize, add: bool },
    /// The same tools read again into a new allocation at the same version.
    Reread { server: usize },
    /// A server went unreachable, or came back.
    Reachability { server: usize, down: bool },
    /// The grant of a server: removed, all of it, or one tool fewer.
    Grant { server: usize, how: u8 },
    /// A connection's description or eager tools changed.
    Connection { server: usize, k: usize },
    /// A connection's preload flag changed: its server moves across the budget and the cap.
    Preload { server: usize, how: u8 },
    /// `n` tools added at once: a server crosses the direct tier, the auto budget or the
    /// tool cap.
    Bulk { server: usize, n: usize },
    /// A tool added to `a` that makes one of its names compete with one of `a__b`'s
    /// (`a` with `b__x` and `a__b` with `x` both ask for `a__b__x`; `a` with `b` asks for
    /// `a__b`'s facade name), both servers granted whole; either one connected first when
    /// it was not.
    Collide { k: usize, how: u8 },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        Just(Change::Nothing),
        (0usize..8, 0usize..30, any::<bool>()).prop_map(|(server, k, add)| Change::Catalogue {
            server,
            k,
            add
        }),
        (0usize..8).prop_map(|server| Change::Reread { server }),
        (0usize..8, any::<bool>()).prop_map(|(server, down)| Change::Reachability { server, down }),
        (0usize..8, 0u8..3).prop_map(|(server, how)| Change::Grant { server, how }),
        (0usize..8, 0usize..30).prop_map(|(server, k)| Change::Connection { server, k }),
        (0usize..8, 0u8..3).prop_map(|(server, how)| Change::Preload { server, how }),
        (0usize..8, 1usize..60).prop_map(|(server, n)| Change::Bulk { server, n }),
        (0usize..30, 0u8..5).prop_map(|(k, how)| Change::Collide { k, how }),
    ]
}

impl Case {
    fn live(&self) -> psych_disclosure::Live<'_> {
        psych_disclosure::Live {
            grant: &self.grant,
            catalogs: &self.catalogs,
        }
    }

    fn apply(&mut self, change: &Change) {
        let n = self.catalogs.len();
        match *change {
            Change::Nothing => {}
            Change::Catalogue { server, k, add } => {
                let catalog = &mut self.catalogs[server % n];
                let mut tools = catalog.tools.to_vec();
                if add {
                    let name = format!("added_{k}_{}", catalog.version.0);
                    tools.push(ToolDefinition::new(
                        ToolName::new(name).unwrap(),
                        "an added tool to list things",
                        serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
                    ));
                    tools.sort_by(|a, b| a.name.cmp(&b.name));
                } else if !tools.is_empty() {
                    tools.remove(k % tools.len());
                }
                catalog.tools = tools.into();
                catalog.version.0 += 1;
            }
            Change::Reread { server } => {
                let catalog = &mut self.catalogs[server % n];
                catalog.tools = catalog.tools.to_vec().into();
            }
            Change::Reachability { server, down } => {
                self.catalogs[server % n].health.reachability = if down {
                    psych_types::Reachability::Unreachable {
                        reason: "exited with status 1".into(),
                    }
                } else {
                    psych_types::Reachability::Reachable
                };
            }
            Change::Grant { server, how } => {
                let catalog = &self.catalogs[server % n];
                let id = catalog.server.clone();
                match how {
                    0 => {
                        self.grant = std::mem::take(&mut self.grant).revoke_server(&id);
                    }
                    1 => {
                        self.grant =
                            std::mem::take(&mut self.grant).allow_scope(id, ToolScope::All);
                    }
                    _ => {
                        let set = catalog
                            .tools
                            .iter()
                            .skip(1)
                            .map(|t| t.name.clone())
                            .collect();
                        self.grant =
                            std::mem::take(&mut self.grant).allow_scope(id, ToolScope::Only(set));
                    }
                }
            }
            Change::Connection { server, k } => {
                let tools = self.catalogs[server % n].tools.clone();
                let connection = &mut self.connections[server % n];
                connection.description = Some(format!("changed {k}"));
                if let Some(tool) = tools.get(k % tools.len().max(1)) {
                    connection.eager_tools.insert(tool.name.clone());
                }
            }
            Change::Preload { server, how } => {
                self.connections[server % n].preload =
                    [Preload::Auto, Preload::Eager, Preload::Deferred][usize::from(how)];
            }
            Change::Bulk { server, n: count } => {
                let catalog = &mut self.catalogs[server % n];
                let version = catalog.version.0;
                let added = (0..count).map(|i| {
                    ToolDefinition::new(
                        ToolName::new(format!("bulk_{version}_{i:02}")).unwrap(),
                        "one of many tools added at once",
                        serde_json::from_str(
                            r#"{"type":"object","properties":{"q":{"type":"string"}}}"#,
                        )
                        .unwrap(),
                    )
                });
                self.add_tools(server % n, added);
            }
            Change::Collide { k, how } => {
                let a = self.server("a");
                let ab = self.server("a__b");
                let theirs = &self.catalogs[ab].tools;
                let name = match how {
                    0 => "b".to_owned(),
                    1 => "b__search_tools".to_owned(),
                    2 => "B__call_tool".to_owned(),
                    _ if theirs.is_empty() => "b__get_me".to_owned(),
                    // Sometimes a case variant: still the same name to a provider.
                    3 => format!("b__{}", theirs[k % theirs.len()].name),
                    _ => format!(
                        "B__{}",
                        theirs[k % theirs.len()].name.as_str().to_uppercase()
                    ),
                };
                let Ok(name) = ToolName::new(name) else {
                    return;
                };
                let tool = ToolDefinition::new(
                    name,
                    "a tool whose name another server wants too",
                    serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
                );
                self.add_tools(a, [tool]);
            }
        }
    }

    /// The index of `id`'s connection and catalogue, granted whole: connected now (with
    /// an empty catalogue) when it was not.
    fn server(&mut self, id: &str) -> usize {
        let server = ServerId::new(id).unwrap();
        self.grant = std::mem::take(&mut self.grant).allow_scope(server.clone(), ToolScope::All);
        if let Some(i) = self.catalogs.iter().position(|c| c.server == server) {
            return i;
        }
        self.connections.push(ConnectionSpec::new(server));
        self.catalogs.push(catalog(id, Vec::new()));
        self.catalogs.len() - 1
    }

    /// Adds tools to the `i`-th catalogue (a name it lists already is not added again) at
    /// a new version.
    fn add_tools(&mut self, i: usize, added: impl IntoIterator<Item = ToolDefinition>) {
        let catalog = &mut self.catalogs[i];
        let mut tools = catalog.tools.to_vec();
        for tool in added {
            if !tools.iter().any(|t| t.name == tool.name) {
                tools.push(tool);
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        catalog.tools = tools.into();
        catalog.version.0 += 1;
    }
}

/// Everything a model or client is sent from a Surface, as bytes.
fn sent(surface: &Surface, live: &psych_disclosure::Live<'_>) -> String {
    let names: Vec<(&str, &Exposed)> = surface
        .names()
        .chain(surface.deferred_names().map(|(name, target)| {
            (
                name,
                surface.exposed(name).unwrap_or_else(|| panic!("{target}")),
            )
        }))
        .collect();
    let searches: Vec<Vec<&str>> = ["list get", "search code branch", "create"]
        .iter()
        .map(|q| surface.search_deferred(q, live, 10))
        .collect();
    serde_json::to_string(&json!({
        "tools": surface.tools(),
        "native": surface.native_tools(),
        "deferred": surface.deferred_tools(),
        "lines": surface.deferred_lines(),
        "servers": surface.servers(),
        "names": names,
        "permitted": surface.permitted(),
        "searches": searches,
    }))
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Resolving through a cache gives exactly the Surface resolving without it gives, over
    /// random sequences of catalogue, reachability, grant and connection changes; an
    /// unchanged setup gives the very same Surface.
    #[test]
    fn the_cache_resolves_what_resolve_does(
        mut case in case(),
        changes in prop::collection::vec(change(), 1..12),
    ) {
        let mut cache = psych_disclosure::SurfaceCache::new(Bytes4);
        let mut previous = cache.resolve(&case.inputs(), &case.settings).unwrap();
        prop_assert_eq!(&*previous, &case.surface());
        for change in &changes {
            case.apply(change);
            let cached = cache.resolve(&case.inputs(), &case.settings).unwrap();
            let plain = case.surface();
            prop_assert_eq!(&*cached, &plain, "after {:?}", change);
            let live = case.live();
            prop_assert_eq!(sent(&cached, &live), sent(&plain, &live), "after {:?}", change);
            // Search pairs answer the same through the cached index.
            for (name, exposed) in plain.names() {
                if matches!(exposed, Exposed::Search { .. }) {
                    let args = json!({"query": "list get create"});
                    let validators = Validators::new();
                    let a = cached.guard(name, &args, &live, &validators);
                    let b = plain.guard(name, &args, &live, &validators);
                    prop_assert_eq!(a, b);
                }
            }
            if matches!(change, Change::Nothing) {
                prop_assert!(std::sync::Arc::ptr_eq(&previous, &cached), "unchanged: shared");
            }
            previous = cached;
        }
    }
}
