//! Pinning that learns from use: the tools of deferred servers that recent Runs called
//! most, kept direct (as eager tools) within a token budget.
//!
//! A deferred tool costs the model a round trip (list or describe, then call) the first
//! time a Run needs it; a tool most Runs need is cheaper kept in the prompt. [`ToolUsage`]
//! counts, per remote tool, the Runs that reached it and the calls (from the `target` each
//! logged result keeps, [`ToolResult::target`](psych_types::ToolResult::target)); [`choose`]
//! ranks the tools of the servers a Surface defers by Runs, then calls, then name, and keeps
//! those used in at least [`PinSettings::min_runs`] Runs and
//! [`PinSettings::min_share_percent`] of them while their definitions fit
//! [`PinSettings::budget`]; [`Pins::apply`] adds them to their connections' eager tools.
//!
//! The choice is a function of its inputs only (the same usage, Surface and catalogues give
//! the same pins), and it is made **between** Runs: a caller chooses once when a Run or
//! session opens and keeps the pins for its whole life, so the tool prefix never changes
//! inside one (the provider's prompt cache holds).

use std::collections::BTreeMap;

use psych_types::{
    ConnectionSpec, History, HistoryItem, Record, ServerCatalog, TokenEstimator, ToolRef,
};
use serde::{Deserialize, Serialize};

use crate::Surface;
use crate::resolve::{Shape, tool_cost};

/// The tokens pinned tools may cost by default: about what five mid-size tool definitions
/// take.
pub const DEFAULT_PIN_BUDGET: u64 = 2_000;

/// The fewest Runs a tool must have been used in to be pinned, by default: one Run's use is
/// not yet a habit.
pub const DEFAULT_MIN_RUNS: u64 = 2;

/// The smallest share of the recent Runs (in percent) a tool must have been used in to be
/// pinned, by default.
pub const DEFAULT_MIN_SHARE_PERCENT: u64 = 25;

/// How many recent Runs (or `psych serve` sessions) usage is read from, by default.
pub const DEFAULT_RECENT_RUNS: usize = 20;

/// How often one remote tool was used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolUse {
    /// The Runs that called it at least once.
    pub runs: u64,
    /// The calls that reached it, in all those Runs.
    pub calls: u64,
}

/// Which remote tools recent Runs called, and how often.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolUsage {
    runs: u64,
    tools: BTreeMap<ToolRef, ToolUse>,
}

impl ToolUsage {
    /// No Run counted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one Run whose calls reached `targets` (one entry per call, repeats counted as
    /// calls). A Run that called nothing still counts: it lowers every tool's share.
    pub fn add_run<'a>(&mut self, targets: impl IntoIterator<Item = &'a ToolRef>) {
        let mut calls: BTreeMap<&ToolRef, u64> = BTreeMap::new();
        for target in targets {
            *calls.entry(target).or_default() += 1;
        }
        self.add_counted_run(calls.into_iter().map(|(target, n)| (target.clone(), n)));
    }

    /// Counts one Run whose calls reached each tool of `calls` that many times (each tool
    /// once: a caller counting a long log keeps one count per tool, not one entry per
    /// call). A Run that called nothing still counts.
    pub fn add_counted_run(&mut self, calls: impl IntoIterator<Item = (ToolRef, u64)>) {
        self.runs += 1;
        for (target, n) in calls.into_iter().filter(|&(_, n)| n > 0) {
            let used = self.tools.entry(target).or_default();
            used.runs += 1;
            used.calls += n;
        }
    }

    /// Counts one Run from its history: each tool result that records the remote tool its
    /// call reached. Results of records written before targets were stored count nothing.
    pub fn add_history(&mut self, history: &History) {
        self.add_run(
            history
                .entries
                .iter()
                .filter_map(|entry| match &entry.item {
                    HistoryItem::Result(stored) => stored.target.as_ref(),
                    HistoryItem::Record(Record::ToolResult(result)) => result.target.as_ref(),
                    HistoryItem::Record(_) => None,
                }),
        );
    }

    /// The Runs counted.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// How often `tool` was used (zero when never).
    pub fn of(&self, tool: &ToolRef) -> ToolUse {
        self.tools.get(tool).copied().unwrap_or_default()
    }

    /// Every tool used at least once, in `(server, tool)` order.
    pub fn tools(&self) -> impl Iterator<Item = (&ToolRef, ToolUse)> {
        self.tools.iter().map(|(tool, used)| (tool, *used))
    }
}

/// What learned pinning keeps, and how much it may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PinSettings {
    /// Estimated tokens the pinned tools' definitions may cost together (as direct tools,
    /// counted as the Surface's [`Settings::cost_basis`](crate::Settings::cost_basis)
    /// says); 0 pins nothing.
    pub budget: u64,
    /// The fewest Runs a tool must have been used in.
    pub min_runs: u64,
    /// The smallest share of the counted Runs, in percent, a tool must have been used in.
    pub min_share_percent: u64,
}

impl Default for PinSettings {
    fn default() -> Self {
        Self {
            budget: DEFAULT_PIN_BUDGET,
            min_runs: DEFAULT_MIN_RUNS,
            min_share_percent: DEFAULT_MIN_SHARE_PERCENT,
        }
    }
}

impl PinSettings {
    /// The defaults with a budget of `tokens`.
    pub fn with_budget(tokens: u64) -> Self {
        Self {
            budget: tokens,
            ..Self::default()
        }
    }
}

/// Why a used tool is pinned or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PinWhy {
    /// Pinned: used often enough, and its definition fit what was left of the budget.
    Pinned,
    /// Used in fewer Runs than [`PinSettings::min_runs`] or than
    /// [`PinSettings::min_share_percent`] of them.
    Rare,
    /// Used often enough, but its definition did not fit what was left of the budget.
    OverBudget,
    /// Used often enough and within the budget, but the Surface had no tool slot left
    /// ([`Settings::surface_cap`](crate::Settings::surface_cap)): pinning it would have made
    /// resolution step another server down.
    OverCap,
    /// Its server is not deferred: its tools reach the model without a round trip already.
    NotDeferred,
    /// Its connection injects it as an eager tool already.
    AlreadyEager,
    /// Not permitted now: gone from its server's catalogue, not granted, or its server is
    /// not connected.
    NotPermitted,
}

/// One used tool and what pinning decided for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinChoice {
    /// The remote tool.
    pub tool: ToolRef,
    /// How often recent Runs used it.
    pub used: ToolUse,
    /// Its estimated tokens as a direct tool, when its definition is known.
    pub tokens: Option<u64>,
    /// The decision.
    pub why: PinWhy,
}

/// What learned pinning decided: every used tool, in rank order (Runs, then calls, both
/// descending, then `(server, tool)`), with why it is pinned or not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pins {
    /// The Runs the usage was read from.
    pub runs: u64,
    /// The budget the pinned tools shared.
    pub budget: u64,
    /// Every used tool, ranked.
    pub choices: Vec<PinChoice>,
}

impl Pins {
    /// The pinned tools, in rank order.
    pub fn pinned(&self) -> impl Iterator<Item = &ToolRef> {
        self.choices
            .iter()
            .filter(|choice| choice.why == PinWhy::Pinned)
            .map(|choice| &choice.tool)
    }

    /// The estimated tokens of the pinned tools' definitions together.
    pub fn tokens(&self) -> u64 {
        self.choices
            .iter()
            .filter(|choice| choice.why == PinWhy::Pinned)
            .filter_map(|choice| choice.tokens)
            .sum()
    }

    /// Adds each pinned tool to its connection's eager tools (a tool whose server has no
    /// connection in `connections` is skipped). Resolution then exposes it as a direct
    /// tool while its server stays deferred.
    pub fn apply(&self, connections: &mut [ConnectionSpec]) {
        for tool in self.pinned() {
            if let Some(connection) = connections.iter_mut().find(|c| c.server == tool.server) {
                connection.eager_tools.insert(tool.tool.clone());
            }
        }
    }
}

/// Chooses the tools to pin from `usage`, for a Surface resolved **without** learned pins
/// (`surface`: which servers are deferred, what is permitted, what is eager already) and
/// the catalogues it was resolved from (`catalogs`: the definitions to cost, through
/// `estimator`).
///
/// Used tools are ranked by Runs, then calls (both descending), then `(server, tool)`;
/// walking that order, a tool of a deferred server, permitted and not eager already, used
/// in at least `min_runs` Runs and `min_share_percent` of them, is pinned when its
/// definition fits what is left of the budget (a larger one is passed over for smaller
/// ones after it) and the Surface has a free slot under its tool cap (so pinning never
/// makes resolution step a server down or drop eager tools a connection names).
/// Every call that reached a tool counts, failed ones too (the model needed the tool).
/// Deterministic: the same inputs give the same pins.
pub fn choose(
    usage: &ToolUsage,
    surface: &Surface,
    catalogs: &[ServerCatalog],
    estimator: &dyn TokenEstimator,
    settings: &PinSettings,
) -> Pins {
    let mut ranked: Vec<(&ToolRef, ToolUse)> = usage.tools().collect();
    ranked.sort_by(|(a, used_a), (b, used_b)| {
        (used_b.runs, used_b.calls)
            .cmp(&(used_a.runs, used_a.calls))
            .then_with(|| a.cmp(b))
    });
    let basis = surface.settings().cost_basis();
    let mut left = settings.budget;
    // Pins are extra tools on the Surface: only its free slots take them.
    let mut slots = surface
        .settings()
        .surface_cap()
        .saturating_sub(surface.tools().len());
    let choices = ranked
        .into_iter()
        .map(|(tool, used)| {
            let definition = catalogs
                .iter()
                .find(|catalog| catalog.server == tool.server)
                // By name, whatever the catalogue's order (sorted as stored, or not).
                .and_then(|catalog| crate::guard::tool_named(&catalog.tools, tool.tool.as_str()));
            let tokens =
                definition.map(|definition| tool_cost(estimator, &tool.server, definition, basis));
            let view = surface.server(tool.server.as_str());
            let share_ok = used.runs.saturating_mul(100)
                >= settings.min_share_percent.saturating_mul(usage.runs());
            let why = match (view, tokens) {
                (None, _) | (_, None) => PinWhy::NotPermitted,
                _ if !surface.permitted().contains(tool) => PinWhy::NotPermitted,
                (Some(view), _) if view.shape != Shape::Deferred => PinWhy::NotDeferred,
                (Some(view), _) if view.eager.contains(&tool.tool) => PinWhy::AlreadyEager,
                _ if used.runs < settings.min_runs || !share_ok => PinWhy::Rare,
                (_, Some(tokens)) if tokens > left => PinWhy::OverBudget,
                _ if slots == 0 => PinWhy::OverCap,
                (_, Some(tokens)) => {
                    left -= tokens;
                    slots -= 1;
                    PinWhy::Pinned
                }
            };
            PinChoice {
                tool: tool.clone(),
                used,
                tokens,
                why,
            }
        })
        .collect();
    Pins {
        runs: usage.runs(),
        budget: settings.budget,
        choices,
    }
}

#[cfg(test)]
mod tests {
    use psych_types::{
        CatalogVersion, PermissionGrant, Preload, ServerHealth, ServerId, ToolDefinition, ToolName,
    };
    use serde_json::json;

    use super::*;
    use crate::{Inputs, Settings, resolve};

    /// A chars/4 estimator.
    struct Quarter;

    impl TokenEstimator for Quarter {
        fn estimate_text(&self, text: &str) -> u64 {
            (text.len() as u64).div_ceil(4)
        }

        fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
            len
        }
    }

    fn tool(server: &str, name: &str) -> ToolRef {
        ToolRef::new(ServerId::new(server).unwrap(), ToolName::new(name).unwrap())
    }

    fn catalog(server: &str, tools: &[(&str, usize)]) -> ServerCatalog {
        let mut tools: Vec<ToolDefinition> = tools
            .iter()
            .map(|(name, description)| {
                let schema = json!({"type": "object"}).as_object().cloned().unwrap();
                ToolDefinition::new(
                    ToolName::new(*name).unwrap(),
                    "d".repeat(*description),
                    schema,
                )
            })
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        ServerCatalog {
            server: ServerId::new(server).unwrap(),
            version: CatalogVersion(1),
            tools: tools.into(),
            health: ServerHealth::default(),
        }
    }

    fn surface(connections: &[ConnectionSpec], catalogs: &[ServerCatalog]) -> Surface {
        let grant = connections
            .iter()
            .fold(PermissionGrant::none(), |grant, c| {
                grant.allow_server(c.server.clone())
            });
        resolve(
            &Inputs {
                connections,
                catalogs,
                grant: &grant,
            },
            &Settings::default(),
            &Quarter,
        )
        .unwrap()
    }

    /// A deferred `big` (40 tools), a direct `small`, and usage over 4 Runs.
    fn setup() -> (Vec<ConnectionSpec>, Vec<ServerCatalog>, ToolUsage) {
        let mut big: Vec<(String, usize)> = (0..40).map(|i| (format!("t{i:02}"), 40)).collect();
        big.push(("huge".into(), 20_000));
        let big: Vec<(&str, usize)> = big.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        let catalogs = vec![catalog("big", &big), catalog("small", &[("only", 10)])];
        let connections = vec![
            ConnectionSpec::new(ServerId::new("big").unwrap()).with_preload(Preload::Deferred),
            ConnectionSpec::new(ServerId::new("small").unwrap()),
        ];
        let mut usage = ToolUsage::new();
        let (a, b, c, huge, only) = (
            tool("big", "t01"),
            tool("big", "t02"),
            tool("big", "t03"),
            tool("big", "huge"),
            tool("small", "only"),
        );
        usage.add_run([&a, &a, &b, &huge, &only]);
        usage.add_run([&a, &b, &huge, &only]);
        usage.add_run([&a, &c]);
        usage.add_run([]);
        (connections, catalogs, usage)
    }

    #[test]
    fn the_most_used_tools_of_deferred_servers_are_pinned_within_the_budget() {
        let (mut connections, catalogs, usage) = setup();
        let unpinned = surface(&connections, &catalogs);
        let pins = choose(
            &usage,
            &unpinned,
            &catalogs,
            &Quarter,
            &PinSettings::default(),
        );
        let decided: Vec<(String, PinWhy)> = pins
            .choices
            .iter()
            .map(|c| (format!("{}/{}", c.tool.server, c.tool.tool), c.why))
            .collect();
        assert_eq!(
            decided,
            [
                ("big/t01".to_owned(), PinWhy::Pinned),
                ("big/huge".to_owned(), PinWhy::OverBudget),
                ("big/t02".to_owned(), PinWhy::Pinned),
                ("small/only".to_owned(), PinWhy::NotDeferred),
                ("big/t03".to_owned(), PinWhy::Rare),
            ]
        );
        assert_eq!(pins.runs, 4);
        assert_eq!(pins.choices[0].used, ToolUse { runs: 3, calls: 4 });
        assert!(pins.tokens() > 0 && pins.tokens() <= DEFAULT_PIN_BUDGET);

        pins.apply(&mut connections);
        let pinned = surface(&connections, &catalogs);
        let names: Vec<&str> = pinned.tools().iter().map(|t| t.name.as_str()).collect();
        assert!(
            names.contains(&"big__t01") && names.contains(&"big__t02"),
            "{names:?}"
        );
        assert!(!names.contains(&"big__t03"), "{names:?}");
        assert_eq!(pinned.server("big").map(|v| v.shape), Some(Shape::Deferred));
        // Chosen again on the pinned Surface, the pinned tools are eager already: the
        // choice does not feed on itself.
        let again = choose(
            &usage,
            &pinned,
            &catalogs,
            &Quarter,
            &PinSettings::default(),
        );
        assert_eq!(again.pinned().count(), 0);
    }

    #[test]
    fn no_budget_no_use_or_a_tool_gone_pins_nothing() {
        let (connections, mut catalogs, usage) = setup();
        let unpinned = surface(&connections, &catalogs);
        let none = choose(
            &usage,
            &unpinned,
            &catalogs,
            &Quarter,
            &PinSettings::with_budget(0),
        );
        assert_eq!(none.pinned().count(), 0);
        assert_eq!(none.choices[0].why, PinWhy::OverBudget);
        let unused = choose(
            &ToolUsage::new(),
            &unpinned,
            &catalogs,
            &Quarter,
            &PinSettings::default(),
        );
        assert!(unused.choices.is_empty());

        catalogs[0] = catalog("big", &[("t02", 40), ("t03", 40)]);
        let shrunk = surface(&connections, &catalogs);
        let pins = choose(
            &usage,
            &shrunk,
            &catalogs,
            &Quarter,
            &PinSettings::default(),
        );
        assert_eq!(pins.choices[0].why, PinWhy::NotPermitted);
        assert_eq!(pins.pinned().collect::<Vec<_>>(), [&tool("big", "t02")]);
    }

    #[test]
    fn pins_take_only_the_free_slots_under_the_tool_cap() {
        let (mut connections, catalogs, usage) = setup();
        let unpinned = surface(&connections, &catalogs);
        // One slot left: the first pin takes it, the next is over the cap.
        let cap = unpinned.tools().len() + 1;
        let settings = Settings::builder().tool_cap(cap).build().unwrap();
        let grant = connections
            .iter()
            .fold(PermissionGrant::none(), |grant, c| {
                grant.allow_server(c.server.clone())
            });
        let resolve_with = |connections: &[ConnectionSpec]| {
            resolve(
                &Inputs {
                    connections,
                    catalogs: &catalogs,
                    grant: &grant,
                },
                &settings,
                &Quarter,
            )
            .unwrap()
        };
        let capped = resolve_with(&connections);
        assert_eq!(capped.tools().len(), unpinned.tools().len());
        let pins = choose(
            &usage,
            &capped,
            &catalogs,
            &Quarter,
            &PinSettings::default(),
        );
        let whys: Vec<PinWhy> = pins.choices.iter().map(|c| c.why).collect();
        assert_eq!(
            whys,
            [
                PinWhy::Pinned,
                PinWhy::OverBudget,
                PinWhy::OverCap,
                PinWhy::NotDeferred,
                PinWhy::Rare
            ]
        );
        pins.apply(&mut connections);
        let pinned = resolve_with(&connections);
        assert_eq!(pinned.tools().len(), cap);
        // Nothing stepped down: every server keeps its shape.
        for view in capped.servers() {
            assert_eq!(
                pinned.server(view.server.as_str()).unwrap().shape,
                view.shape
            );
        }
    }

    #[test]
    fn the_choice_is_the_same_whatever_order_the_runs_were_counted_in() {
        let runs = [
            vec![tool("big", "t05"), tool("big", "t01")],
            vec![tool("big", "t01"), tool("big", "t05")],
            vec![tool("big", "t07")],
            vec![tool("big", "t07"), tool("big", "t09")],
        ];
        let (connections, catalogs, _) = setup();
        let unpinned = surface(&connections, &catalogs);
        let mut forward = ToolUsage::new();
        for run in &runs {
            forward.add_run(run);
        }
        let mut backward = ToolUsage::new();
        for run in runs.iter().rev() {
            backward.add_run(run);
        }
        let settings = PinSettings::default();
        assert_eq!(
            choose(&forward, &unpinned, &catalogs, &Quarter, &settings),
            choose(&backward, &unpinned, &catalogs, &Quarter, &settings)
        );
        let pins = choose(&forward, &unpinned, &catalogs, &Quarter, &settings);
        let pinned: Vec<&ToolRef> = pins.pinned().collect();
        // Ties in Runs and calls go to the name.
        assert_eq!(
            pinned,
            [
                &tool("big", "t01"),
                &tool("big", "t05"),
                &tool("big", "t07")
            ]
        );
    }
}
