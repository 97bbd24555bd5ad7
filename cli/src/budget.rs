//! `psych budget`: what an MCP setup costs in the prompt, per server and in total, with
//! every schema injected and with Psych. The JSON report and the human table are written
//! from the same structs.

use psych_disclosure::{
    CALL_TOOL, Cost, DESCRIBE_TOOL, LIST_TOOLS, Live, OrientationContext, Why, orientation,
};
use psych_elision::Estimator;
use psych_types::{TokenEstimator, ToolDefinition};
use serde::Serialize;

use crate::setup::Setup;

/// What `psych budget --json` prints. Field names are stable.
#[derive(Debug, Serialize)]
pub(crate) struct BudgetReport {
    /// Where the servers came from: the `--config` path or `embedded default`.
    pub(crate) config: String,
    /// The redb catalogue the listings were synced into.
    pub(crate) store: String,
    /// What the decision was made as: `window_share` (a Run's: 5% of `context_window`,
    /// counting what a model is sent of each tool) or `serve` (`psych serve`'s: its auto
    /// budget, counting whole tool definitions).
    pub(crate) decided_as: &'static str,
    /// The context window the auto budget is a share of, in tokens (absent with `serve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) context_window: Option<u64>,
    /// The tokens the servers with `preload` unset share: smallest first, each is kept
    /// while the kept ones' `cost_tokens_est` sum to at most this.
    pub(crate) auto_budget_tokens: u64,
    /// Of `auto_budget_tokens`, what the kept `auto` servers cost together.
    pub(crate) auto_kept_tokens_est: u64,
    /// How every `*_tokens_est` field is counted: an estimate, never a provider's count.
    pub(crate) estimates: &'static str,
    /// One entry per configured server, by name.
    pub(crate) servers: Vec<ServerReport>,
    /// The names of the tools on the Surface, in its order: with `serve`, what `psych
    /// serve` lists for the same file, `read_tool_output` aside.
    pub(crate) surface_tools: Vec<String>,
    /// The whole prompt prefix.
    pub(crate) totals: Totals,
    /// With `--lazy`: what starting servers on demand saves for this file, measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lazy: Option<crate::setup::LazyFigures>,
    /// With `--pin-budget`: what learned pinning would keep direct, from the sessions
    /// logged under `--dir` (or kept in a `postgres://` `--store`): `runs` (the sessions read), `budget`, and `choices`, every
    /// used tool of the servers in rank order with `tool`, `used` (`runs`: sessions that
    /// called it, `calls`), `tokens` (its definition's estimate) and `why` (`pinned`,
    /// `rare`, `over_budget`, `not_deferred`, `already_eager`, `not_permitted`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pins: Option<psych_disclosure::pinning::Pins>,
}

/// One server of the report.
#[derive(Debug, Serialize)]
pub(crate) struct ServerReport {
    /// Its name in the configuration.
    pub(crate) server: String,
    /// `ok`, or `failed` with `error` saying why.
    pub(crate) status: &'static str,
    /// Why it could not be connected or listed, in full: every stderr line psych-mcp kept
    /// (absent when `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// `error` in one line of at most 160 characters, with the most telling stderr line
    /// as `(stderr: …)`: what the table and the deferred line show (absent when `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_line: Option<String>,
    /// Tools in its live catalogue.
    pub(crate) tools: usize,
    /// Of `tools`, those the grant permits (the file's `allowTools`, else every one).
    pub(crate) permitted: usize,
    /// Tools it declared that were refused (name and reason).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) malformed: Vec<String>,
    /// Bytes of its tool definitions as JSON (name, description, schemas): what injecting
    /// every schema costs.
    pub(crate) schema_bytes: usize,
    /// The same, in estimated tokens.
    pub(crate) schema_tokens_est: u64,
    /// What its permitted tools cost as direct tools, as disclosure counted it to decide
    /// (`decided_as` says how): the figure compared with the auto budget.
    pub(crate) cost_tokens_est: u64,
    /// Whether `cost_tokens_est` counted every permitted tool; `false` when counting
    /// stopped above every limit it was compared with (it is then a lower bound).
    pub(crate) cost_exact: bool,
    /// How `psych serve` on this catalogue would start it: `on demand (listed 3 h ago)`
    /// (known from the kept listing, started by its first call), or `at once (…)` with why
    /// (no kept listing, one past its `listingTtlSecs`, or `"lazy": false`).
    pub(crate) start: String,
    /// The configured preload flag: `auto`, `eager` or `deferred`.
    pub(crate) preload: String,
    /// How Psych shows it: `direct`, `facade`, `search_pair` or `deferred`.
    pub(crate) shown_as: String,
    /// Why: `size`, `over_budget`, `pinned`, `no_tools` or `tool_cap`.
    pub(crate) why: String,
    /// Its line in the system prompt when deferred.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) deferred_line: Option<String>,
}

/// Totals of the report.
#[derive(Debug, Serialize)]
pub(crate) struct Totals {
    /// Servers connected and listed.
    pub(crate) servers_ok: usize,
    /// Servers that failed.
    pub(crate) servers_failed: usize,
    /// Tools across every live catalogue.
    pub(crate) tools: usize,
    /// The tool part of the prompt prefix with every schema injected.
    pub(crate) all_schemas_bytes: usize,
    /// The same, in estimated tokens.
    pub(crate) all_schemas_tokens_est: u64,
    /// The tool part of the prompt prefix with Psych: the Surface's tools as JSON plus the
    /// deferred lines.
    pub(crate) with_psych_bytes: usize,
    /// The same, in estimated tokens.
    pub(crate) with_psych_tokens_est: u64,
    /// Tools on the Surface.
    pub(crate) with_psych_tools: usize,
    /// Of `with_psych_bytes`, the three meta tools (list, describe, call): paid once when
    /// any server is deferred, 0 otherwise.
    pub(crate) meta_tools_bytes: usize,
    /// The same, in estimated tokens.
    pub(crate) meta_tools_tokens_est: u64,
    /// The orientation payload as the model gets it (default, not verbose).
    pub(crate) orientation_bytes: usize,
    /// The same, in estimated tokens.
    pub(crate) orientation_tokens_est: u64,
}

fn label<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

fn tools_json(tools: &[ToolDefinition]) -> String {
    serde_json::to_string(tools).unwrap_or_default()
}

/// How a report's Surface was decided.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Basis {
    /// As a Run: 5% of this context window.
    Window(u64),
    /// As `psych serve`.
    Serve,
}

/// Builds the report of a loaded setup (with the lazy start's figures when `lazy`).
pub(crate) fn report(setup: &Setup, config: String, basis: Basis, lazy: bool) -> BudgetReport {
    let estimator = Estimator::new();
    let mut servers = Vec::new();
    let mut totals = Totals {
        servers_ok: 0,
        servers_failed: 0,
        tools: 0,
        all_schemas_bytes: 0,
        all_schemas_tokens_est: 0,
        with_psych_bytes: 0,
        with_psych_tokens_est: 0,
        with_psych_tools: setup.surface.tools().len(),
        meta_tools_bytes: 0,
        meta_tools_tokens_est: 0,
        orientation_bytes: 0,
        orientation_tokens_est: 0,
    };
    let mut auto_kept = 0;
    for outcome in &setup.outcomes {
        let server = &outcome.server;
        let tools: &[ToolDefinition] = setup
            .catalogs
            .iter()
            .find(|c| &c.server == server)
            .map_or(&[], |c| &c.tools);
        let json = if tools.is_empty() {
            String::new()
        } else {
            tools_json(tools)
        };
        let view = setup.surface.server(server.as_str());
        let cost = view.map_or(Cost::Exact(0), |v| v.cost);
        if view.is_some_and(|v| v.why == Why::Size) {
            auto_kept += cost.tokens();
        }
        let prefix = format!("{server}: ");
        let deferred_line = setup
            .surface
            .deferred_lines()
            .iter()
            .find(|l| l.starts_with(&prefix))
            .cloned();
        let preload = setup
            .config
            .servers
            .get(server)
            .map_or_else(String::new, |s| {
                format!("{:?}", s.connection.preload).to_lowercase()
            });
        if outcome.error.is_some() {
            totals.servers_failed += 1;
        } else {
            totals.servers_ok += 1;
        }
        totals.tools += tools.len();
        totals.all_schemas_bytes += json.len();
        let tokens = estimator.estimate_text(&json);
        totals.all_schemas_tokens_est += tokens;
        servers.push(ServerReport {
            server: server.to_string(),
            status: if outcome.error.is_some() {
                "failed"
            } else {
                "ok"
            },
            error: outcome.error.clone(),
            error_line: outcome
                .error
                .as_deref()
                .map(|e| crate::reason::one_line(server.as_str(), e)),
            tools: tools.len(),
            permitted: view.map_or(0, |v| v.permitted),
            malformed: outcome.malformed.clone(),
            schema_bytes: json.len(),
            schema_tokens_est: tokens,
            cost_tokens_est: cost.tokens(),
            cost_exact: matches!(cost, Cost::Exact(_)),
            start: setup.starts.get(server).map_or_else(
                || {
                    if setup.shared {
                        "unknown (each replica decides from its own folder)".to_owned()
                    } else {
                        "unknown (another process holds the catalogue)".to_owned()
                    }
                },
                ToString::to_string,
            ),
            preload,
            shown_as: view.map_or_else(|| "absent".to_owned(), |v| label(&v.shape)),
            why: view.map_or_else(String::new, |v| label(&v.why)),
            deferred_line,
        });
    }
    let surface_json = tools_json(setup.surface.tools());
    let lines = setup.surface.deferred_lines().join("\n");
    totals.with_psych_bytes = surface_json.len() + lines.len();
    totals.with_psych_tokens_est =
        estimator.estimate_text(&surface_json) + estimator.estimate_text(&lines);
    let meta: Vec<ToolDefinition> = setup
        .surface
        .tools()
        .iter()
        .filter(|t| [LIST_TOOLS, DESCRIBE_TOOL, CALL_TOOL].contains(&t.name.as_str()))
        .cloned()
        .collect();
    if !meta.is_empty() {
        let meta = tools_json(&meta);
        totals.meta_tools_bytes = meta.len();
        totals.meta_tools_tokens_est = estimator.estimate_text(&meta);
    }
    // With every server started (as this command started them): the same bytes however
    // long ago a listing was kept.
    let payload = orientation_text(setup, false, false);
    totals.orientation_bytes = payload.len();
    totals.orientation_tokens_est = estimator.estimate_text(&payload);
    BudgetReport {
        config,
        store: setup.store.display().to_string(),
        decided_as: match basis {
            Basis::Window(_) => "window_share",
            Basis::Serve => "serve",
        },
        context_window: match basis {
            Basis::Window(window) => Some(window),
            Basis::Serve => None,
        },
        auto_budget_tokens: setup.settings.auto_budget().tokens(),
        auto_kept_tokens_est: auto_kept,
        estimates: "token counts are estimates (psych-elision's estimator), not a provider's count",
        servers,
        surface_tools: setup
            .surface
            .tools()
            .iter()
            .map(|t| t.name.as_str().to_owned())
            .collect(),
        totals,
        lazy: setup.lazy.clone().filter(|_| lazy),
        pins: None,
    }
}

/// The orientation payload's text exactly as the model gets it as a tool result: with
/// `at_serve_start`, as `psych serve` on this catalogue answers it before any call (a
/// server known from its kept listing shows as not started), else with every server
/// started.
pub(crate) fn orientation_text(setup: &Setup, verbose: bool, at_serve_start: bool) -> String {
    let live = Live {
        grant: &setup.grant,
        catalogs: &setup.catalogs,
    };
    let mut payload = orientation(
        &setup.surface,
        &live,
        &OrientationContext::default(),
        verbose,
    );
    // A server `psych serve` would know from its kept listing shows as its orientation
    // would show it there, before its first call.
    if at_serve_start {
        for summary in &mut payload.servers {
            let listed_ago = setup
                .starts
                .get(&summary.server)
                .and_then(|s| s.listed_ago());
            if let Some(listed_ago) = listed_ago {
                let millis = listed_ago.as_millis().try_into().unwrap_or(u64::MAX);
                summary.state = psych_runtime::lazy_state(Some(millis));
            }
        }
    }
    payload.to_output().readable_text().into_owned()
}

/// `12345` as `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Wraps `text` to `width` columns, continuation lines indented by `indent`.
pub(crate) fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut column = 0;
    for word in text.split(' ') {
        let len = word.chars().count();
        if column > 0 && column + 1 + len > width {
            out.push('\n');
            out.push_str(indent);
            column = indent.chars().count();
        } else if column > 0 {
            out.push(' ');
            column += 1;
        }
        out.push_str(word);
        column += len;
    }
    out
}

/// The human table, at most 80 columns wide (deferred lines and errors are wrapped).
pub(crate) fn table(report: &BudgetReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let t = &report.totals;
    let _ = writeln!(
        out,
        "Prompt budget of {} MCP servers ({}), {} tools",
        report.servers.len(),
        report.config,
        thousands(t.tools as u64)
    );
    match report.context_window {
        Some(window) => {
            let _ = writeln!(
                out,
                "~tok are estimates. Auto budget: {} tokens, 5% of a {}-token window.",
                thousands(report.auto_budget_tokens),
                thousands(window)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "~tok are estimates. Auto budget: {} tokens, as psych serve decides.",
                thousands(report.auto_budget_tokens),
            );
        }
    }
    let _ = writeln!(
        out,
        "cost: the permitted tools as direct tools, the figure the decision used; the"
    );
    let _ = writeln!(
        out,
        "auto servers kept cost {} ~tok together.",
        thousands(report.auto_kept_tokens_est)
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<14} {:>5} {:>11} {:>9}  {:<8} {:<11} why",
        "server", "tools", "schema B", "cost ~tok", "preload", "shown as"
    );
    for s in &report.servers {
        let name: String = s.server.chars().take(14).collect();
        let cost = if s.cost_exact {
            thousands(s.cost_tokens_est)
        } else {
            format!(">{}", thousands(s.cost_tokens_est))
        };
        let _ = writeln!(
            out,
            "{:<14} {:>5} {:>11} {:>9}  {:<8} {:<11} {}",
            name,
            s.tools,
            thousands(s.schema_bytes as u64),
            cost,
            s.preload,
            s.shown_as,
            s.why
        );
    }
    let on_demand: Vec<&str> = report
        .servers
        .iter()
        .filter(|s| s.start.starts_with("on demand"))
        .map(|s| s.server.as_str())
        .collect();
    if !on_demand.is_empty() {
        let text = format!(
            "psych serve starts these on demand, known from their kept listings: {}.",
            on_demand.join(", ")
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "{}", wrap(&text, 78, "    "));
    }
    if let Some(lazy) = &report.lazy {
        let text = format!(
            "Lazy start (measured in this run): {} of {} servers not started ({} MiB \
             resident while they ran here); a complete first listing after {} ms instead of \
             {} ms with every server started.",
            lazy.not_started,
            lazy.servers,
            thousands(lazy.not_started_rss_kib / 1024),
            thousands(lazy.lazy_first_answer_ms),
            thousands(lazy.eager_first_answer_ms)
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "{}", wrap(&text, 78, "    "));
    }
    if let Some(pins) = &report.pins {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Learned pinning ({} of {} ~tok, from {} recent sessions):",
            thousands(pins.tokens()),
            thousands(pins.budget),
            pins.runs
        );
        if pins.choices.is_empty() {
            let _ = writeln!(out, "    no tool of these servers was called in them");
        }
        for choice in &pins.choices {
            let why = serde_json::to_value(choice.why)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let plural = |n: u64| if n == 1 { "" } else { "s" };
            let _ = writeln!(
                out,
                "    {:<14} {}/{}: {} session{}, {} call{}, {} ~tok",
                why.replace('_', " "),
                choice.tool.server,
                choice.tool.tool,
                choice.used.runs,
                plural(choice.used.runs),
                choice.used.calls,
                plural(choice.used.calls),
                choice.tokens.map_or_else(|| "?".to_owned(), thousands)
            );
        }
    }
    let failed: Vec<&ServerReport> = report
        .servers
        .iter()
        .filter(|s| s.error.is_some())
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(out);
        for s in failed {
            let text = format!(
                "FAILED {}: {}",
                s.server,
                s.error_line.as_deref().unwrap_or_default()
            );
            let _ = writeln!(out, "{}", wrap(&text, 78, "    "));
        }
    }
    let deferred: Vec<&str> = report
        .servers
        .iter()
        .filter_map(|s| s.deferred_line.as_deref())
        .collect();
    if !deferred.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Deferred lines in the system prompt:");
        for line in deferred {
            let _ = writeln!(out, "  {}", wrap(line, 76, "    "));
        }
    }
    let _ = writeln!(out);
    let row = |out: &mut String, what: &str, bytes: usize, tokens: u64| {
        let _ = writeln!(
            out,
            "{:<40} {:>13} B {:>10} ~tok",
            what,
            thousands(bytes as u64),
            thousands(tokens)
        );
    };
    row(
        &mut out,
        "Tool prefix, every schema injected",
        t.all_schemas_bytes,
        t.all_schemas_tokens_est,
    );
    row(
        &mut out,
        &format!("Tool prefix with Psych ({} tools)", t.with_psych_tools),
        t.with_psych_bytes,
        t.with_psych_tokens_est,
    );
    row(
        &mut out,
        "  of which the meta tools (fixed)",
        t.meta_tools_bytes,
        t.meta_tools_tokens_est,
    );
    row(
        &mut out,
        "Orientation payload (first call)",
        t.orientation_bytes,
        t.orientation_tokens_est,
    );
    if t.with_psych_bytes > 0 {
        #[allow(clippy::cast_precision_loss, reason = "a ratio for people to read")]
        let ratio = t.all_schemas_bytes as f64 / t.with_psych_bytes as f64;
        if ratio >= 1.0 {
            let _ = writeln!(out, "With Psych the tool prefix is {ratio:.1}x smaller.");
        } else {
            let _ = writeln!(
                out,
                "With Psych the tool prefix is {:.2}x larger (meta and orientation tools).",
                1.0 / ratio
            );
        }
    }
    let _ = writeln!(out, "Catalogue synced into {}", report.store);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
