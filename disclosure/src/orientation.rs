//! The orientation payload: the "call this first" answer, shape by default and the full
//! tool map behind `verbose: true`.
//!
//! Categories: a tool's `_meta.category` when it is a string; else the first noun of its
//! title (`title`, else `annotations.title`); else the first noun of its name. "Noun" is the
//! first word left after dropping common verbs (get, list, create, …), function words and
//! the words of the server's own name, with a plural folded to its singular; a tool with
//! none is `general`. A `_meta.category` is cut at [`CATEGORY_CHARS`], and past
//! [`MAX_CATEGORIES`] the least used are counted together as [`OTHER_CATEGORY`], so that
//! no catalogue grows the default payload past its ceiling.

use std::borrow::Cow;
use std::collections::BTreeMap;

use psych_types::{ServerCatalog, ServerId, ToolDefinition, ToolName, ToolOutput, ToolRef};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::names::{CALL_TOOL, DESCRIBE_TOOL, Exposed, LIST_TOOLS, ORIENTATION};
use crate::text::{cap_chars, tool_summary};
use crate::{Live, Shape, Surface};

/// The most characters of a free-text field in the default payload.
pub const FREE_TEXT_CHARS: usize = 500;

/// What a capped free-text field ends with.
pub const VERBOSE_MARKER: &str = "…[truncated; ask with verbose: true]";

/// The longest category named, in characters: one longer than this (a tool's own
/// `_meta.category`, or a word of its title or name) is cut, so that a catalogue cannot
/// grow the payload past its ceiling.
pub const CATEGORY_CHARS: usize = 40;

/// The most categories the payload counts: past this many, the least used (ties by name)
/// are counted together under [`OTHER_CATEGORY`].
pub const MAX_CATEGORIES: usize = 100;

/// The category the least used are counted under past [`MAX_CATEGORIES`].
pub const OTHER_CATEGORY: &str = "other";

/// What the caller knows that the Surface does not: opaque JSON, shown as given (free text
/// capped in the default payload). `Null` fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OrientationContext {
    /// Who the agent works for (id, name, timezone…).
    #[serde(default)]
    pub tenant: Value,
    /// Who the user is (persona…).
    #[serde(default)]
    pub user: Value,
    /// The handful of rules that prevent mistakes.
    #[serde(default)]
    pub conventions: Value,
    /// A live snapshot of the state the agent acts on.
    #[serde(default)]
    pub operational_state: Value,
}

/// One server in the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerSummary {
    /// The server.
    pub server: ServerId,
    /// How its tools are shown this turn.
    pub shown_as: Shape,
    /// How many of its tools are permitted now.
    pub tools: usize,
    /// The exposed tool to start from: the facade, or the search tool. Direct tools are
    /// `server__tool`; deferred servers go through the meta tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// `reachable`, `unreachable: …` or `unknown`, as the catalogue reports now; for a
    /// server with no tools because it could not be listed, why (as
    /// [`ServerState`](crate::ServerState) reads).
    pub state: String,
    /// The connection's description (capped unless verbose).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One tool in the verbose tool map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapEntry {
    /// The tool's name on its server.
    pub name: ToolName,
    /// Its exposed name when it is a direct tool this turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exposed_as: Option<String>,
    /// Its category.
    pub category: String,
    /// Its description's first line, uncut.
    pub summary: String,
}

/// The orientation payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Orientation {
    /// The caller's tenant.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub tenant: Value,
    /// The caller's user.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub user: Value,
    /// The caller's conventions.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub conventions: Value,
    /// The caller's operational state.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub operational_state: Value,
    /// Category to count, over every permitted tool.
    pub tool_categories: BTreeMap<String, usize>,
    /// Every server on the Surface, in server order.
    pub servers: Vec<ServerSummary>,
    /// How to reach what is not shown.
    pub deep_dives: Vec<String>,
    /// Server to its permitted tools: only with `verbose: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_map: Option<BTreeMap<ServerId, Vec<MapEntry>>>,
}

impl Orientation {
    /// The payload as a successful JSON tool result.
    pub fn to_output(&self) -> ToolOutput {
        ToolOutput::json(serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

const VERBS: &[&str] = &[
    "add",
    "assign",
    "change",
    "click",
    "close",
    "create",
    "delete",
    "dismiss",
    "drag",
    "drop",
    "edit",
    "emulate",
    "evaluate",
    "fetch",
    "fill",
    "find",
    "fork",
    "get",
    "go",
    "handle",
    "hover",
    "list",
    "manage",
    "mark",
    "merge",
    "move",
    "navigate",
    "open",
    "patch",
    "post",
    "press",
    "push",
    "put",
    "query",
    "read",
    "remove",
    "reprioritize",
    "request",
    "resize",
    "resolve",
    "retrieve",
    "run",
    "search",
    "select",
    "set",
    "show",
    "star",
    "submit",
    "take",
    "trigger",
    "type",
    "unresolve",
    "unstar",
    "update",
    "upload",
    "wait",
    "write",
];

/// Function words and adjectives that name no category.
const FILLERS: &[&str] = &[
    "a",
    "all",
    "allowed",
    "an",
    "and",
    "api",
    "available",
    "by",
    "current",
    "details",
    "existing",
    "for",
    "from",
    "global",
    "in",
    "info",
    "information",
    "latest",
    "multiple",
    "my",
    "new",
    "of",
    "on",
    "one",
    "or",
    "pending",
    "single",
    "specific",
    "starred",
    "sub",
    "the",
    "to",
    "with",
];

/// Lowercase words of an identifier (split at lowerCamel boundaries too) or of a title
/// (split at non-alphanumeric characters only, so `GitHub` stays one word).
fn words(text: &str, camel: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if camel && c.is_uppercase() && prev_lower && !word.is_empty() {
                out.push(std::mem::take(&mut word).to_lowercase());
            }
            prev_lower = c.is_lowercase() || c.is_numeric();
            word.push(c);
        } else {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word).to_lowercase());
            }
            prev_lower = false;
        }
    }
    if !word.is_empty() {
        out.push(word.to_lowercase());
    }
    out
}

fn singular(word: &str) -> String {
    if let Some(base) = word.strip_suffix("ies")
        && base.len() > 1
    {
        return format!("{base}y");
    }
    for suffix in ["ches", "shes", "sses", "xes"] {
        if word.ends_with(suffix) {
            return word[..word.len() - 2].to_owned();
        }
    }
    if word.len() > 3 && word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") {
        return word[..word.len() - 1].to_owned();
    }
    word.to_owned()
}

fn noun(text: &str, camel: bool, server_words: &[String]) -> Option<String> {
    words(text, camel)
        .into_iter()
        .find(|w| {
            !VERBS.contains(&w.as_str())
                && !FILLERS.contains(&w.as_str())
                && !server_words.contains(w)
                && !w.chars().all(|c| c.is_numeric())
        })
        .map(|w| singular(&w))
}

/// `counts` with at most `max` categories: the most used kept, the rest counted under
/// [`OTHER_CATEGORY`] (which then counts as one of them).
fn at_most(counts: BTreeMap<String, usize>, max: usize) -> BTreeMap<String, usize> {
    if counts.len() <= max {
        return counts;
    }
    let mut ranked: Vec<(String, usize)> = counts.into_iter().collect();
    // Most used first; ties by name (the map's order, kept by a stable sort).
    ranked.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let rest: usize = ranked
        .iter()
        .skip(max.saturating_sub(1))
        .map(|(_, n)| n)
        .sum();
    let mut kept: BTreeMap<String, usize> =
        ranked.into_iter().take(max.saturating_sub(1)).collect();
    *kept.entry(OTHER_CATEGORY.to_owned()).or_default() += rest;
    kept
}

/// A tool's category (see the module documentation), at most [`CATEGORY_CHARS`] long
/// whichever way it was found.
pub(crate) fn category(server: &ServerId, tool: &ToolDefinition) -> String {
    cap_chars(&uncapped_category(server, tool), CATEGORY_CHARS, "…")
}

/// The category before its cut: borrowed from `_meta`, which may be long, so that only
/// what is kept of it is copied.
fn uncapped_category<'t>(server: &ServerId, tool: &'t ToolDefinition) -> Cow<'t, str> {
    if let Some(Value::String(category)) = tool.meta.as_ref().and_then(|m| m.get("category")) {
        return Cow::Borrowed(category);
    }
    let server_words = words(server.as_str(), true);
    let title = tool
        .title
        .as_deref()
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.as_deref()));
    title
        .and_then(|t| noun(t, false, &server_words))
        .or_else(|| noun(tool.name.as_str(), true, &server_words))
        .map_or(Cow::Borrowed("general"), Cow::Owned)
}

/// Caps every string inside `value`.
fn cap_strings(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(cap_chars(s, FREE_TEXT_CHARS, VERBOSE_MARKER)),
        Value::Array(items) => Value::Array(items.iter().map(cap_strings).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), cap_strings(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Builds the orientation payload from the Surface, the state now, and the caller's
/// context.
///
/// By default: the context (free text capped at [`FREE_TEXT_CHARS`] with
/// [`VERBOSE_MARKER`]), tool categories with counts, every server with its count, shape and
/// state, and how to reach the rest; no tool map. With `verbose`, the context uncut and the
/// full tool map. Only tools permitted now are counted or listed.
pub fn orientation(
    surface: &Surface,
    live: &Live<'_>,
    context: &OrientationContext,
    verbose: bool,
) -> Orientation {
    let text = |value: &Value| {
        if verbose {
            value.clone()
        } else {
            cap_strings(value)
        }
    };
    let mut tool_categories: BTreeMap<String, usize> = BTreeMap::new();
    let mut tool_map = BTreeMap::new();
    let mut servers = Vec::new();
    for view in surface.servers() {
        if !live.grant.permits_server(&view.server) {
            continue;
        }
        let catalog: Option<&ServerCatalog> =
            live.catalogs.iter().find(|c| c.server == view.server);
        let mut tools: Vec<&ToolDefinition> = catalog
            .map(|c| c.tools.iter())
            .into_iter()
            .flatten()
            .filter(|t| crate::guard::in_permitted_set(live.grant, &view.server, t))
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut entries = Vec::new();
        for tool in &tools {
            let category = category(&view.server, tool);
            *tool_categories.entry(category.clone()).or_default() += 1;
            if verbose {
                entries.push(MapEntry {
                    name: tool.name.clone(),
                    exposed_as: surface
                        .direct_name(&ToolRef::new(view.server.clone(), tool.name.clone()))
                        .map(str::to_owned),
                    category,
                    summary: tool_summary(tool),
                });
            }
        }
        if verbose {
            tool_map.insert(view.server.clone(), entries);
        }
        let via = surface.names().find_map(|(name, exposed)| match exposed {
            Exposed::Facade { server } | Exposed::Search { server } if *server == view.server => {
                Some(name.to_owned())
            }
            _ => None,
        });
        // A failed server's reason reads as on its deferred line: the clauses naming the
        // server again dropped; cut, the telling stderr line is kept.
        let health = catalog.map(|c| &c.health);
        let mut state = crate::state::summary(&view.server, health, tools.is_empty(), None);
        if !verbose && state.chars().count() > FREE_TEXT_CHARS {
            let room = FREE_TEXT_CHARS - VERBOSE_MARKER.chars().count();
            state = crate::state::summary(&view.server, health, tools.is_empty(), Some(room));
            state.push_str(VERBOSE_MARKER);
        }
        servers.push(ServerSummary {
            server: view.server.clone(),
            shown_as: view.shape,
            tools: tools.len(),
            via,
            state,
            description: view.description.as_ref().map(|d| {
                if verbose {
                    d.clone()
                } else {
                    cap_chars(d, FREE_TEXT_CHARS, VERBOSE_MARKER)
                }
            }),
        });
    }
    let shapes: Vec<Shape> = servers.iter().map(|s| s.shown_as).collect();
    let mut deep_dives = Vec::new();
    if shapes.contains(&Shape::Deferred) {
        deep_dives.push(format!(
            "{LIST_TOOLS}(server, page) lists a server's tools; {DESCRIBE_TOOL}(server, tool) \
             reads one; {CALL_TOOL}(server, tool, arguments) calls it"
        ));
    }
    if shapes.contains(&Shape::Facade) {
        deep_dives.push(
            "a facade (a tool named after its server) indexes the server's tools in its \
             description: {tool} reads one, {tool, input} runs it"
                .to_owned(),
        );
    }
    if shapes.contains(&Shape::SearchPair) {
        deep_dives.push(
            "server__search_tools(query) finds a tool of a large server by intent; \
             server__call_tool(tool, input) runs it"
                .to_owned(),
        );
    }
    if !verbose && surface.exposed(ORIENTATION).is_some() {
        deep_dives.push(format!(
            "{ORIENTATION}(verbose: true) adds the full tool map"
        ));
    }
    let tool_categories = at_most(tool_categories, MAX_CATEGORIES);
    Orientation {
        tenant: text(&context.tenant),
        user: text(&context.user),
        conventions: text(&context.conventions),
        operational_state: text(&context.operational_state),
        tool_categories,
        servers,
        deep_dives,
        tool_map: verbose.then_some(tool_map),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::JsonObject;

    fn tool(name: &str, title: Option<&str>) -> ToolDefinition {
        let mut t = ToolDefinition::new(ToolName::new(name).unwrap(), "d", JsonObject::new());
        t.title = title.map(str::to_owned);
        t
    }

    #[test]
    fn categories_are_bounded_in_length_and_number() {
        let server = ServerId::new("s").unwrap();
        let mut long = tool("t", None);
        let mut meta = JsonObject::new();
        meta.insert("category".into(), "c".repeat(100_000).into());
        long.meta = Some(meta);
        assert_eq!(category(&server, &long).chars().count(), CATEGORY_CHARS);
        let titled = tool("t", Some(&"w".repeat(50_000)));
        assert_eq!(category(&server, &titled).chars().count(), CATEGORY_CHARS);
        let counts: BTreeMap<String, usize> =
            (0..300).map(|n| (format!("c{n:03}"), 1 + n % 7)).collect();
        let kept = at_most(counts, MAX_CATEGORIES);
        assert_eq!(kept.len(), MAX_CATEGORIES);
        assert_eq!(
            kept.values().sum::<usize>(),
            (0..300usize).map(|n| 1 + n % 7).sum::<usize>()
        );
        // The most used are kept whole: every count of 7 (n % 7 == 6) is there.
        assert_eq!(kept["c006"], 7);
        let few: BTreeMap<String, usize> = [("a".to_owned(), 1)].into();
        assert_eq!(at_most(few.clone(), MAX_CATEGORIES), few);
    }

    #[test]
    fn categories_come_from_meta_then_title_then_name() {
        let server = ServerId::new("github").unwrap();
        assert_eq!(category(&server, &tool("list_issues", None)), "issue");
        assert_eq!(
            category(&server, &tool("x", Some("List GitHub Actions workflows"))),
            "action"
        );
        assert_eq!(category(&server, &tool("get_me", Some("Get"))), "me");
        assert_eq!(category(&server, &tool("list", None)), "general");
        let mut meta = tool("list_issues", None);
        meta.meta = Some(serde_json::from_str(r#"{"category":"tickets"}"#).unwrap());
        assert_eq!(category(&server, &meta), "tickets");
        let notion = ServerId::new("notion").unwrap();
        assert_eq!(
            category(&notion, &tool("API-retrieve-a-page", None)),
            "page"
        );
    }

    #[test]
    fn free_text_is_capped_with_the_verbose_marker() {
        let long = Value::String("x".repeat(FREE_TEXT_CHARS + 10));
        let capped = cap_strings(&serde_json::json!({"a": [long]}));
        let s = capped["a"][0].as_str().unwrap();
        assert_eq!(s.chars().count(), FREE_TEXT_CHARS);
        assert!(s.ends_with(VERBOSE_MARKER));
    }
}
