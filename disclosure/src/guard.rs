//! The call-time guard: every call the model makes resolves to a `(server, tool)` pair
//! and is checked against the permitted set as it is now.

use psych_types::{
    CatalogVersion, JsonObject, PermissionGrant, Reachability, ServerCatalog, ServerId,
    ToolAnnotations, ToolDefinition, ToolName, ToolOutput, ToolRef,
};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

use crate::Surface;
use crate::names::{Exposed, MetaTool};
use crate::search::{Part, SearchIndex, weak_note};
use crate::shapes::SEARCH_HITS;
use crate::state::{self, ServerState};
use crate::text::{TRUNCATION_MARKER, cap_chars, tool_summary};
use crate::validate::{ArgumentError, Validation, Validators};

/// The most characters of one tool's summary in a listing or search answer.
pub const SUMMARY_CHARS: usize = 100;

/// The state at call time: the grant and the live catalogues as they are now, which may
/// differ from those the Surface was resolved from.
#[derive(Debug, Clone, Copy)]
pub struct Live<'a> {
    /// The grant now: a permission revoked since resolution is refused.
    pub grant: &'a PermissionGrant,
    /// Each server's live catalogue and health now.
    pub catalogs: &'a [ServerCatalog],
}

/// What to do with one call the model made.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Verdict {
    /// Forward this call to the MCP server (the runtime does; this crate makes no calls).
    Forward(Forward),
    /// Answer the call with this (a meta tool, a facade's description, a search).
    Answer(Answer),
    /// Answer the call with the orientation payload ([`orientation`](crate::orientation)).
    Orientation {
        /// Whether the full tool map was asked for.
        verbose: bool,
    },
    /// Answer the call with this refusal, as a failed tool result.
    Refused(Refusal),
}

/// A call to forward: permitted now, arguments validated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forward {
    /// The remote tool.
    pub target: ToolRef,
    /// The arguments to send.
    pub arguments: JsonObject,
    /// What validation checked.
    pub validation: Validation,
}

/// A call refused, with the reason the model reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "refused", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// The called name is not exposed this turn (a case variant, a look-alike, a name from
    /// an older turn).
    #[error("no tool named {name:?} is available")]
    UnknownName {
        /// The name the model called.
        name: String,
    },
    /// The server is not on this Surface or not permitted now.
    #[error("unknown server {server:?}")]
    UnknownServer {
        /// The server the model named.
        server: String,
    },
    /// The tool is not in the server's live catalogue, or not permitted now. Both read the
    /// same, so a refusal says nothing of tools outside the grant.
    #[error("tool {tool:?} is not available on server {server}")]
    NotAvailable {
        /// The server.
        server: ServerId,
        /// The tool the model named.
        tool: String,
    },
    /// The server is on the Surface but has no permitted tool because it could not be
    /// listed (it failed, is unreachable, or was not listed yet): a listing of it, and a
    /// call of any tool of it, say so with the reason instead of an empty list or "not
    /// available". Every tool name reads the same, so nothing is said of a tool's
    /// existence; only the server's state.
    #[error("server {server} has no tools: {state}")]
    NoTools {
        /// The server.
        server: ServerId,
        /// Why, from its catalogue health now.
        state: ServerState,
    },
    /// The server is permitted and known but its connection is down.
    #[error("unreachable: {reason}")]
    Unreachable {
        /// The server.
        server: ServerId,
        /// Why, as its connection reported (its lines joined, the clauses naming the server
        /// again dropped, at most [`STATE_REASON_CHARS`](crate::STATE_REASON_CHARS)).
        reason: String,
    },
    /// The arguments do not match the schema (of the remote tool, or of the meta tool).
    #[error("invalid arguments for {call}: {}", render_errors(errors))]
    InvalidArguments {
        /// What was called: the exposed name, or `server/tool` for a forwarded pair.
        call: String,
        /// What is wrong, by path.
        errors: Vec<ArgumentError>,
    },
}

fn render_errors(errors: &[ArgumentError]) -> String {
    errors
        .iter()
        .map(|e| {
            if e.path.is_empty() {
                e.message.clone()
            } else {
                format!("{}: {}", e.path, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl Refusal {
    /// The refusal as a failed tool result.
    pub fn to_output(&self) -> ToolOutput {
        ToolOutput::error(self.to_string())
    }
}

/// One tool in a listing or a search answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolEntry {
    /// The tool's name on its server.
    pub name: ToolName,
    /// Its description's first line, at most [`SUMMARY_CHARS`] characters.
    pub summary: String,
}

/// A page of one server's permitted tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// The server.
    pub server: ServerId,
    /// This page, from 1.
    pub page: usize,
    /// How many pages there are (at least 1).
    pub pages: usize,
    /// How many tools are permitted on the server.
    pub total: usize,
    /// The tools of this page, by name. Empty past the last page.
    pub tools: Vec<ToolEntry>,
    /// `"more: ask for page N"` when there is a next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<String>,
}

/// One tool's description and schemas.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Description {
    /// The server.
    pub server: ServerId,
    /// The tool's name on it.
    pub tool: ToolName,
    /// Its title, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its description, whole.
    pub description: String,
    /// Its input schema.
    pub input_schema: JsonObject,
    /// Its output schema, when it declares one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<JsonObject>,
    /// Its behaviour hints, when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
}

/// A search answer: the best matches, best first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SearchAnswer {
    /// The server searched.
    pub server: ServerId,
    /// The query, as given.
    pub query: String,
    /// At most [`SEARCH_HITS`](crate::SEARCH_HITS) tools, best first.
    pub hits: Vec<ToolEntry>,
    /// When nothing matched or only weakly ([`Ranking::is_weak`](crate::Ranking::is_weak)):
    /// says so and names the servers of the Surface whose tools come closest to the query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A call the guard answers itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum Answer {
    /// [`LIST_TOOLS`](crate::LIST_TOOLS).
    Listing(Listing),
    /// [`DESCRIBE_TOOL`](crate::DESCRIBE_TOOL), or a facade or search-pair call without
    /// `input`.
    Description(Description),
    /// A search pair's search tool.
    Search(SearchAnswer),
}

impl Answer {
    /// The answer as a successful JSON tool result.
    pub fn to_output(&self) -> ToolOutput {
        ToolOutput::json(serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

/// Reads a call's arguments by key, collecting what is wrong by path.
struct Args<'a> {
    object: Option<&'a JsonObject>,
    errors: Vec<ArgumentError>,
}

impl<'a> Args<'a> {
    fn new(arguments: &'a Value, allowed: &[&str]) -> Self {
        let mut errors = Vec::new();
        let object = arguments.as_object();
        match object {
            None => errors.push(ArgumentError {
                path: String::new(),
                message: "the arguments must be a JSON object".into(),
            }),
            Some(object) => {
                for key in object.keys().filter(|k| !allowed.contains(&k.as_str())) {
                    errors.push(ArgumentError {
                        path: pointer(key),
                        message: format!("unknown property; expected one of {allowed:?}"),
                    });
                }
            }
        }
        Self { object, errors }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.and_then(|o| o.get(key))
    }

    fn fail(&mut self, key: &str, message: &str) {
        self.errors.push(ArgumentError {
            path: pointer(key),
            message: message.into(),
        });
    }

    fn string(&mut self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(Value::String(s)) => Some(s),
            Some(_) => {
                self.fail(key, "must be a string");
                None
            }
            None => {
                if self.object.is_some() {
                    self.fail(key, "is required");
                }
                None
            }
        }
    }

    fn optional_object(&mut self, key: &str) -> Option<&'a Value> {
        let value = self.get(key)?;
        if !value.is_object() {
            self.fail(key, "must be an object");
        }
        Some(value)
    }

    fn done(self, call: &str) -> Result<(), Refusal> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(Refusal::InvalidArguments {
                call: call.to_owned(),
                errors: self.errors,
            })
        }
    }
}

/// A JSON pointer to a top-level key.
fn pointer(key: &str) -> String {
    format!("/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// The live catalogue of a server, and the server's id, if the server is on the Surface
/// and permitted now.
pub(crate) struct LiveServer<'a> {
    pub(crate) server: &'a ServerId,
    catalog: Option<&'a ServerCatalog>,
    grant: &'a PermissionGrant,
}

impl<'a> LiveServer<'a> {
    fn permitted(&self) -> impl Iterator<Item = &'a ToolDefinition> + '_ {
        self.catalog
            .map(|c| c.tools.iter())
            .into_iter()
            .flatten()
            .filter(|t| in_permitted_set(self.grant, self.server, t))
    }

    fn sorted_permitted(&self) -> Vec<&'a ToolDefinition> {
        let mut tools: Vec<_> = self.permitted().collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    pub(crate) fn tool(&self, name: &str) -> Result<&'a ToolDefinition, Refusal> {
        let tools = self.catalog.map(|c| &*c.tools).unwrap_or_default();
        tool_named(tools, name)
            .filter(|t| in_permitted_set(self.grant, self.server, t))
            .ok_or_else(|| {
                self.no_tools().unwrap_or_else(|| Refusal::NotAvailable {
                    server: self.server.clone(),
                    tool: name.to_owned(),
                })
            })
    }

    /// [`Refusal::NoTools`] when the server has no permitted tool because it could not be
    /// listed; `None` when it has some, or was listed and permits none.
    fn no_tools(&self) -> Option<Refusal> {
        if self.permitted().next().is_some() {
            return None;
        }
        let state = state::state(self.server, self.catalog.map(|c| &c.health))?;
        Some(Refusal::NoTools {
            server: self.server.clone(),
            state,
        })
    }

    fn version(&self) -> CatalogVersion {
        self.catalog.map(|c| c.version).unwrap_or_default()
    }
}

/// Whether `tool` of `server` is in the permitted set: the grant permits it and its input
/// schema is usable (psych-types' [`check_input_schema`](psych_types::check_input_schema),
/// the rule psych-mcp's listing sets tools aside by). A tool no provider takes, or whose
/// arguments nothing could match, is never exposed, listed or forwarded, so what a model is
/// shown and what the guard lets through agree; it reads as any tool outside the set.
pub(crate) fn in_permitted_set(
    grant: &PermissionGrant,
    server: &ServerId,
    tool: &ToolDefinition,
) -> bool {
    grant.permits(server, &tool.name) && tool.check_input_schema().is_ok()
}

/// The tool of a catalogue's `tools` named `name`. Catalogues list tools by name; fall
/// back to a scan for one that does not. The name is compared as given: no case folding,
/// no normalising.
pub(crate) fn tool_named<'a>(
    tools: &'a [ToolDefinition],
    name: &str,
) -> Option<&'a ToolDefinition> {
    match tools.binary_search_by(|t| t.name.as_str().cmp(name)) {
        Ok(i) => tools.get(i),
        Err(_) => tools.iter().find(|t| t.name.as_str() == name),
    }
}

fn summary(tool: &ToolDefinition) -> ToolEntry {
    ToolEntry {
        name: tool.name.clone(),
        summary: cap_chars(&tool_summary(tool), SUMMARY_CHARS, TRUNCATION_MARKER),
    }
}

fn describe(server: &LiveServer<'_>, tool: &ToolDefinition) -> Answer {
    Answer::Description(Description {
        server: server.server.clone(),
        tool: tool.name.clone(),
        title: tool.title.clone(),
        description: tool.description_or_empty().to_owned(),
        input_schema: tool.input_schema.clone(),
        output_schema: tool.output_schema.clone(),
        annotations: tool.annotations.clone(),
    })
}

impl Surface {
    /// Guards one call the model made: resolves the called name through this Surface,
    /// checks the `(server, tool)` pair against `live` (the grant and catalogues now), and
    /// validates the arguments. Every route (direct, facade, search pair, meta tool) goes
    /// through the same narrowing.
    ///
    /// `validators` is the caller's cache of compiled schemas, kept across turns and
    /// shared by reference between callers guarding at once.
    pub fn guard(
        &self,
        name: &str,
        arguments: &Value,
        live: &Live<'_>,
        validators: &Validators,
    ) -> Verdict {
        match self.route(name, arguments, live, validators) {
            Ok(verdict) => verdict,
            Err(refusal) => Verdict::Refused(refusal),
        }
    }

    /// The server a call would be forwarded to, when it is a call of a tool (a direct or
    /// natively loaded tool, a facade or search pair's call with `input`, the meta tools'
    /// call) of a server on this Surface that is one of `live`'s (a connection now), a tool
    /// that `live`'s grant permits: `None` for what the guard answers itself (listings,
    /// descriptions, searches, orientation), for names it refuses, and for a server whose
    /// connection was removed since the Surface was resolved. Whether the tool exists or
    /// the arguments are valid is not looked at:
    /// for a caller that must bring the server up to date before [`guard`](Self::guard)
    /// checks the call against it (a server started only when a call needs it, whose kept
    /// listing may be stale).
    pub fn call_server(&self, name: &str, arguments: &Value, live: &Live<'_>) -> Option<ServerId> {
        let (server, tool) = match self.exposed(name)? {
            Exposed::Direct { target } | Exposed::Deferred { target } => {
                (&target.server, target.tool.clone())
            }
            Exposed::Facade { server } | Exposed::SearchCall { server } => {
                arguments.get("input")?;
                (
                    server,
                    ToolName::new(arguments.get("tool")?.as_str()?).ok()?,
                )
            }
            Exposed::Meta {
                tool: MetaTool::CallTool,
            } => (
                &self.server(arguments.get("server")?.as_str()?)?.server,
                ToolName::new(arguments.get("tool")?.as_str()?).ok()?,
            ),
            Exposed::Meta { .. } | Exposed::Search { .. } | Exposed::Orientation => return None,
        };
        let connected = live
            .catalogs
            .iter()
            .any(|catalog| &catalog.server == server);
        (connected && live.grant.permits(server, &tool)).then(|| server.clone())
    }

    fn route(
        &self,
        name: &str,
        arguments: &Value,
        live: &Live<'_>,
        validators: &Validators,
    ) -> Result<Verdict, Refusal> {
        let Some(exposed) = self.exposed(name) else {
            return Err(Refusal::UnknownName {
                name: name.to_owned(),
            });
        };
        match exposed {
            // A deferred tool loaded by a provider's native search is called by its
            // qualified name: the same narrowing and validation as a direct tool.
            Exposed::Direct { target } | Exposed::Deferred { target } => {
                let server = self.live_server(target.server.as_str(), live)?;
                let tool = server.tool(target.tool.as_str())?;
                forward(&server, tool, arguments, validators)
            }
            Exposed::Facade { server } | Exposed::SearchCall { server } => {
                let mut args = Args::new(arguments, &["tool", "input"]);
                let tool = args.string("tool");
                let input = args.optional_object("input");
                args.done(name)?;
                let server = self.live_server(server.as_str(), live)?;
                let tool = server.tool(tool.unwrap_or_default())?;
                match input {
                    None => Ok(Verdict::Answer(describe(&server, tool))),
                    Some(input) => forward(&server, tool, input, validators),
                }
            }
            Exposed::Search { server } => {
                let mut args = Args::new(arguments, &["query"]);
                let query = args.string("query").unwrap_or_default();
                // As the tool's schema says (`minLength: 1`).
                if args.get("query").is_some_and(|q| q.as_str() == Some("")) {
                    args.fail("query", "must not be empty");
                }
                args.done(name)?;
                let server = self.live_server(server.as_str(), live)?;
                if let Some(refusal) = server.no_tools() {
                    return Err(refusal);
                }
                let index = match self.cached_part(&server) {
                    Some(part) => SearchIndex::combine(vec![part]),
                    None => SearchIndex::new(server.permitted().map(|t| (server.server, t))),
                };
                let ranking = index.rank(query, SEARCH_HITS);
                let note = ranking.is_weak().then(|| {
                    let servers = self.closest_servers(query, live);
                    weak_note(query, ranking.hits.is_empty(), &servers)
                });
                let hits = ranking
                    .hits
                    .into_iter()
                    .filter_map(|(hit, _)| server.tool(hit.tool.as_str()).ok().map(summary))
                    .collect();
                Ok(Verdict::Answer(Answer::Search(SearchAnswer {
                    server: server.server.clone(),
                    query: query.to_owned(),
                    hits,
                    note,
                })))
            }
            Exposed::Meta { tool } => self.meta(*tool, name, arguments, live, validators),
            Exposed::Orientation => {
                let mut args = Args::new(arguments, &["verbose"]);
                let verbose = match args.get("verbose") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        args.fail("verbose", "must be a boolean");
                        false
                    }
                };
                args.done(name)?;
                Ok(Verdict::Orientation { verbose })
            }
        }
    }

    fn meta(
        &self,
        meta: MetaTool,
        name: &str,
        arguments: &Value,
        live: &Live<'_>,
        validators: &Validators,
    ) -> Result<Verdict, Refusal> {
        match meta {
            MetaTool::ListTools => {
                let mut args = Args::new(arguments, &["server", "page"]);
                let server = args.string("server");
                let page = match args.get("page") {
                    None => 1,
                    Some(value) => match psych_types::json_whole(value) {
                        Some(page) if page >= 1 => usize::try_from(page).unwrap_or(usize::MAX),
                        _ => {
                            args.fail("page", "must be an integer of at least 1");
                            1
                        }
                    },
                };
                args.done(name)?;
                let server = self.live_server(server.unwrap_or_default(), live)?;
                if let Some(refusal) = server.no_tools() {
                    return Err(refusal);
                }
                Ok(Verdict::Answer(Answer::Listing(
                    self.listing(&server, page),
                )))
            }
            MetaTool::DescribeTool => {
                let mut args = Args::new(arguments, &["server", "tool"]);
                let (server, tool) = (args.string("server"), args.string("tool"));
                args.done(name)?;
                let server = self.live_server(server.unwrap_or_default(), live)?;
                let tool = server.tool(tool.unwrap_or_default())?;
                Ok(Verdict::Answer(describe(&server, tool)))
            }
            MetaTool::CallTool => {
                let mut args = Args::new(arguments, &["server", "tool", "arguments"]);
                let (server, tool) = (args.string("server"), args.string("tool"));
                let input = args.optional_object("arguments");
                args.done(name)?;
                let server = self.live_server(server.unwrap_or_default(), live)?;
                let tool = server.tool(tool.unwrap_or_default())?;
                let empty = Value::Object(JsonObject::new());
                forward(&server, tool, input.unwrap_or(&empty), validators)
            }
        }
    }

    /// The server, if it is on this Surface and permitted now.
    pub(crate) fn live_server<'a>(
        &'a self,
        server: &str,
        live: &Live<'a>,
    ) -> Result<LiveServer<'a>, Refusal> {
        let unknown = || Refusal::UnknownServer {
            server: server.to_owned(),
        };
        let view = self.server(server).ok_or_else(unknown)?;
        if !live.grant.permits_server(&view.server) {
            return Err(unknown());
        }
        Ok(LiveServer {
            server: &view.server,
            catalog: live.catalogs.iter().find(|c| c.server == view.server),
            grant: live.grant,
        })
    }

    /// The servers whose tools come closest to `query`, for a weak answer's note: searched
    /// together over every live server's search index the Surface keeps (each built once
    /// per catalogue version).
    fn closest_servers(&self, query: &str, live: &Live<'_>) -> Vec<ServerId> {
        let parts = self
            .servers()
            .iter()
            .filter(|view| view.permitted > 0)
            .filter_map(|view| self.live_server(view.server.as_str(), live).ok())
            .filter_map(|server| self.cached_part(&server))
            .collect();
        SearchIndex::combine(parts).rank(query, 0).servers
    }

    /// The server's keyword index as resolution prepared it (built now if no search did
    /// yet), when what it permits now is what it was prepared from: the same catalogue
    /// tools (the same allocation) and the same scope in the grant. `None` otherwise; the
    /// caller then indexes what is permitted now.
    pub(crate) fn cached_part(&self, server: &LiveServer<'_>) -> Option<Arc<Part>> {
        let part = &self.parts.get(server.server)?.0;
        let same = Arc::ptr_eq(part.tools()?, &server.catalog?.tools)
            && part.scope.as_ref() == server.grant.scope(server.server);
        same.then(|| part.search_part(server.server))
    }

    fn listing(&self, server: &LiveServer<'_>, page: usize) -> Listing {
        let tools = server.sorted_permitted();
        let size = self.settings.page_size();
        let pages = tools.len().div_ceil(size).max(1);
        let start = (page - 1).saturating_mul(size).min(tools.len());
        let end = start.saturating_add(size).min(tools.len());
        Listing {
            server: server.server.clone(),
            page,
            pages,
            total: tools.len(),
            tools: tools[start..end].iter().map(|t| summary(t)).collect(),
            more: (page < pages).then(|| format!("more: ask for page {} of {pages}", page + 1)),
        }
    }
}

/// Validates and forwards a call to a permitted, live tool.
fn forward(
    server: &LiveServer<'_>,
    tool: &ToolDefinition,
    arguments: &Value,
    validators: &Validators,
) -> Result<Verdict, Refusal> {
    if let Some(Reachability::Unreachable { reason }) =
        server.catalog.map(|c| &c.health.reachability)
    {
        return Err(Refusal::Unreachable {
            server: server.server.clone(),
            reason: state::whole_reason(server.server, reason),
        });
    }
    let target = ToolRef::new(server.server.clone(), tool.name.clone());
    let validation = validators
        .check(server.server, server.version(), tool, arguments)
        .map_err(|errors| Refusal::InvalidArguments {
            call: target.to_string(),
            errors,
        })?;
    let arguments = arguments.as_object().cloned().unwrap_or_default();
    Ok(Verdict::Forward(Forward {
        target,
        arguments,
        validation,
    }))
}
