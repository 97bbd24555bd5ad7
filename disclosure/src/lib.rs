//! Tool disclosure: which tools a turn exposes to the model, in what shape, and the
//! call-time guard every call goes through.
//!
//! The main type is [`Surface`], made by [`resolve`] at the start of every turn from plain
//! data: the connections ([`ConnectionSpec`](psych_types::ConnectionSpec)), each server's
//! live catalogue ([`ServerCatalog`](psych_types::ServerCatalog)) and the grant
//! ([`PermissionGrant`](psych_types::PermissionGrant)). It holds the tool definitions to
//! expose ([`Surface::tools`], for prompt assembly's tool surface), one line per deferred
//! server ([`Surface::deferred_lines`], for zone 1's capability notes), the permitted set,
//! and a resolver from an exposed name back to what it means ([`Surface::exposed`]).
//! [`Surface::guard`] checks one call against the grant and catalogues as they are *now*
//! and answers with a [`Verdict`]: forward `(server, tool, validated arguments)` to the
//! server (the runtime does), an [`Answer`] (a listing, a description, a search), the
//! [`orientation`] payload, or a [`Refusal`]. Every answer becomes a
//! [`ToolOutput`](psych_types::ToolOutput) through `to_output()`.
//!
//! A caller that resolves turn after turn keeps a [`SurfaceCache`]: the same Surface as
//! [`resolve`], shared while nothing it depends on changed, and prepared again only for the
//! servers that changed.
//!
//! The crate is pure: no I/O, no clock, no globals. Token costs go through the caller's
//! [`TokenEstimator`](psych_types::TokenEstimator).
//!
//! # What a Surface guarantees
//!
//! - **Narrowing.** Permitted = live catalogue ∩ grant; every shape, every meta tool and
//!   every call works on it alone. A server the grant does not mention is not shown. An
//!   unknown and an unpermitted tool are refused with the same words. A tool whose input
//!   schema is not usable (psych-types' [`check_input_schema`](psych_types::check_input_schema):
//!   `{"type":"string"}`, `properties` as a list) is outside the permitted set: no provider
//!   would take it and no call could match it.
//! - **Preload.** `Eager` and `Deferred` pin it; the `Auto` servers share
//!   [`Settings::auto_budget`] over the whole Surface: smallest first (by their permitted
//!   tools' cost as direct tools, ties by server id), each is kept while the kept ones'
//!   costs sum to at most the budget, and the rest are deferred ([`Why::OverBudget`]), so
//!   a dozen mid-size servers cost the budget, not a dozen times it. Pinned servers take no
//!   share of the budget. A server with no permitted tool is
//!   listed as deferred with its state (not listed yet, listing failed, unreachable), the
//!   clauses of its reason that name the server again dropped and the telling detail line
//!   (a stderr line with an error word) kept within the line's cap; listing it, or calling
//!   any tool of it, answers [`Refusal::NoTools`] with the reason, never an empty list. A
//!   deferred server's eager tools are exposed as direct tools and it stays deferred.
//! - **Shapes** for servers that are not deferred ([`Shape`]): direct tools when the server
//!   has at most [`Settings::direct_max_tools`] permitted tools costing at most
//!   [`Settings::direct_max_tokens`]; else a facade when its index line costs at most
//!   [`Settings::facade_max_index_tokens`]; else a search pair. The Surface never has more
//!   than [`Settings::surface_cap`] tools (the [`Settings::tool_cap`] less the slots the
//!   caller reserves for tools it adds, [`SettingsBuilder::reserved_tools`]): the largest
//!   direct server steps down first, then the largest non-deferred server is deferred
//!   (keeping as many of its eager tools as the cap has room for), then eager tools are
//!   dropped.
//! - **Stability.** Bytes depend on the catalogues' tools, the connections, the grant and
//!   the settings; health shows only on the line of a server with no tools, so a server
//!   that disconnects keeps its place and bytes (its calls answer `unreachable: reason`).
//!   Input order does not matter.
//! - **Native deferral.** A deferred server's permitted tools (less its eager ones) also
//!   get qualified names, assigned with every other name ([`Exposed::Deferred`]), and the
//!   Surface keeps their definitions ([`Surface::deferred_tools`]), for a provider that
//!   defers natively (`defer_loading`) beside [`Surface::native_tools`]; the model's search
//!   is answered from [`Surface::search_deferred`]; a loaded tool's call goes through the
//!   guard like a direct one.
//! - **Names** are provider-safe (`^[a-zA-Z0-9_-]{1,64}$`), unique ignoring ASCII case, and
//!   reversed through the Surface's own table, never by parsing: `server__tool`; a facade is
//!   `server`; a search pair is `server__search_tools` + `server__call_tool`; dotted, long
//!   or colliding names (the meta tools' and `read_tool_output` included) are sanitised,
//!   cut to 55 bytes and suffixed `_` + 8 hex digits of an FNV-1a hash of the pair.
//!
//! # What blocks
//!
//! No I/O: the crate's calls are safe on an async worker. A guard may wait, briefly, for
//! [`Validators`]' lock (held to look a compiled schema up or store one), and a first
//! search of a server for its index while another caller builds it.
//! What costs CPU: [`resolve`] prices every permitted tool of every server through the
//! estimator each time it runs (about 12 ms for 20 servers and 2,000 tools, the runtime's
//! step bench), and [`Validators`] compiles a tool's input schema at its first call (then
//! at the first call after each change of its server's catalogue; a call guarded against an
//! older catalogue than the cached one compiles its own, not kept). [`SurfaceCache::resolve`] costs microseconds when nothing
//! changed, and after a change about what the changed servers would cost resolved alone. A search indexes its server's tools
//! at the first search of a catalogue version unless [`Surface::prepare_search`] did it
//! ahead (call it where resolution is called, off an async worker).
//!
//! # Errors
//!
//! A model's bad call is not an error: [`Surface::guard`] answers it with a [`Refusal`]
//! (an unexposed name, an unknown or unpermitted server or tool, which read the same, an
//! unreachable server, a server with no tools because it could not be listed, with the
//! reason ([`ServerState`]), arguments that do not match the schema, by path), which
//! `to_output()` turns into a failed tool result for the model. Errors are the caller's
//! mistakes: [`ResolveError`] when the inputs would make the Surface depend on their order
//! (a server with two connections or two catalogues, a catalogue naming a tool twice), and
//! [`SettingsError`] when the settings cannot hold (a tool cap below the fixed tools, a page
//! size outside `1..=`[`MAX_PAGE_SIZE`], a budget that is not a share of a window).
//!
//! # Configuration
//!
//! [`Settings::builder`] sets the auto budget ([`Budget`]: tokens or a share of a window),
//! the tiers' limits, the tool cap, the listing page size, whether the orientation tool is
//! on, and what a direct tool's cost counts ([`CostBasis`]: the fields a model is sent, or
//! the whole MCP definition an MCP gateway's client receives), checked in
//! [`build`](SettingsBuilder::build); [`Settings::default`] holds the
//! defaults below. Per server, the preload and the eager tools come from its
//! [`ConnectionSpec`](psych_types::ConnectionSpec), and what may be called from the
//! [`PermissionGrant`](psych_types::PermissionGrant).
//!
//! # Decisions and defaults (measured on `shared/fixtures/catalogs`, bytes/4 estimate)
//!
//! - **Auto budget: 5% of a 200,000-token window (10,000 tokens), shared by every `Auto`
//!   server.** As direct tools (name, description, input schema) the GitHub catalogue
//!   costs about 27,600 tokens (13.8% of the window), notion 18,500 (9.2%), playwright
//!   4,250 (2.1%), filesystem 1,900, memory 1,000. A peer defers all MCP tools together
//!   once they pass 10% of the window; 10% would still inject notion's 24 tools at 18,500
//!   tokens every turn. 5% defers the two large catalogues and keeps the three small ones
//!   (about 7,200 tokens together, smallest first: memory, filesystem, playwright). The
//!   budget spans the Surface rather than each server because a budget per server lets a
//!   dozen mid-size servers, each under it, take twelve times it every turn: exactly the
//!   setup deferral exists for. Smallest first keeps the most servers direct (no extra
//!   round trip) for the tokens spent. Express it in tokens or as a window share
//!   ([`Budget`]); a gateway whose listing rides on every request of a client it does not
//!   know may want far less (`psych serve` gives 1,000 tokens to whole definitions:
//!   [`CostBasis::Definition`]).
//! - **Tiers:** direct up to 32 tools and 10,000 tokens; a facade while its index line is
//!   at most 1,000 tokens (GitHub's 117 names take about 700); a search pair beyond.
//! - **Tool cap:** 128 (OpenAI's limit), configurable.
//! - **Meta tools** ([`LIST_TOOLS`], [`DESCRIBE_TOOL`], [`CALL_TOOL`]), present whenever a
//!   server is deferred, fixed bytes:
//!   `psych_list_tools {server: string, page?: integer ≥ 1}`,
//!   `psych_describe_tool {server: string, tool: string}`,
//!   `psych_call_tool {server: string, tool: string, arguments?: object}`, each with
//!   `additionalProperties: false`. They serve any server on the Surface (discovery is a
//!   door, not a bypass: the same narrowing applies). A facade and a search pair's call tool
//!   take `{tool: string, input?: object}`: without `input` they answer the tool's
//!   description and schema, with it they call it. The search tool takes
//!   `{query: string}` and answers the best [`SEARCH_HITS`].
//! - **Fixed cost of the meta tools:** 1,506 bytes (about 380 tokens), paid once however
//!   many servers are deferred. GitHub deferred costs its line plus these, 1,633 bytes,
//!   against 114,468 bytes as 117 direct tools (70×).
//! - **Search** ([`SearchIndex`]): BM25F over stemmed words of names, titles, parameter
//!   names and descriptions, each query word widened by a reviewed table of the domain's
//!   verb families and abbreviations and by word forms, a server named in the query
//!   weighted, a tool's name covered rewarded; a query naming a tool exactly (`tool`,
//!   `server/tool`, `server__tool`) ranks it first. A weak answer ([`Ranking::note`]) says so
//!   and names the closest servers. Measured in `tests/search_eval.rs` (281 paraphrased
//!   queries over 3,101 tools of 17 real catalogues, beside a plain BM25) and
//!   `tests/search_quality.rs`.
//! - **Listings:** [`Settings::page_size`] (default 50) names per page with a one-line
//!   summary of at most [`SUMMARY_CHARS`], and `more: ask for page N of M` when there is
//!   more. A page past the end is empty, not an error.
//! - **Deferred lines:** `server: deferred MCP server, N tools[, M of them also direct].
//!   description`, at most [`DEFERRED_LINE_CHARS`] characters, ending `…[truncated]` when
//!   cut.
//! - **Orientation tool** ([`ORIENTATION`], `{verbose?: boolean}`) on by default: the
//!   documented first call.
//! - **Schemas** are compiled by [`Validators`], once per `(server, catalogue version)`,
//!   lazily at a tool's first call, kept by the runtime across turns. `$defs`, `$ref` inside
//!   the schema, `oneOf` and `$schema` draft 2020-12 work; nothing is fetched. A schema that
//!   does not compile leaves its tool usable: calls are forwarded with
//!   [`Validation::Unchecked`] and its reason, the arguments only checked to be an object.
//!
//! # Example
//!
//! ```
//! use psych_disclosure::{Inputs, Live, Settings, Validators, Verdict, resolve};
//! use psych_types::{
//!     CatalogVersion, ConnectionSpec, PermissionGrant, ServerCatalog, ServerHealth, ServerId,
//!     TokenEstimator, ToolDefinition, ToolName,
//! };
//!
//! /// Four bytes a token (the runtime plugs psych-elision's estimator in).
//! struct Bytes4;
//! impl TokenEstimator for Bytes4 {
//!     fn estimate_text(&self, text: &str) -> u64 { text.len().div_ceil(4) as u64 }
//!     fn estimate_binary(&self, _mime: &str, len: u64) -> u64 { len.div_ceil(4) }
//! }
//!
//! let fs = ServerId::new("fs")?;
//! let read = ToolDefinition::new(
//!     ToolName::new("read_file")?,
//!     "Read a file",
//!     serde_json::from_str(
//!         r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
//!     )?,
//! );
//! let catalogs = [ServerCatalog {
//!     server: fs.clone(),
//!     version: CatalogVersion(1),
//!     tools: vec![read].into(),
//!     health: ServerHealth::default(),
//! }];
//! let connections = [ConnectionSpec::new(fs.clone())];
//! let grant = PermissionGrant::none().allow_server(fs);
//! let inputs = Inputs { connections: &connections, catalogs: &catalogs, grant: &grant };
//!
//! let surface = resolve(&inputs, &Settings::default(), &Bytes4)?;
//! let names: Vec<&str> = surface.tools().iter().map(|t| t.name.as_str()).collect();
//! assert_eq!(names, ["fs__read_file", "psych_orientation"]);
//!
//! let live = Live { grant: &grant, catalogs: &catalogs };
//! let validators = Validators::new();
//! let args = serde_json::json!({"path": "notes.txt"});
//! let verdict = surface.guard("fs__read_file", &args, &live, &validators);
//! assert!(matches!(verdict, Verdict::Forward(ref call) if call.target.tool.as_str() == "read_file"));
//!
//! // Wrong arguments come back as a failed tool result naming the path.
//! let bad = serde_json::json!({"path": 7});
//! let Verdict::Refused(refusal) = surface.guard("fs__read_file", &bad, &live, &validators)
//! else { panic!("refused") };
//! assert!(refusal.to_output().is_error);
//! assert!(refusal.to_string().contains("/path"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cache;
mod error;
mod guard;
mod names;
mod native;
mod orientation;
pub mod pinning;
mod resolve;
mod search;
mod settings;
mod shapes;
mod state;
mod text;
mod validate;

pub use cache::SurfaceCache;
pub use error::{ResolveError, SettingsError};
pub use guard::{
    Answer, Description, Forward, Listing, Live, Refusal, SUMMARY_CHARS, SearchAnswer, ToolEntry,
    Verdict,
};
pub use names::{CALL_TOOL, DESCRIBE_TOOL, Exposed, LIST_TOOLS, MetaTool, ORIENTATION};
pub use orientation::{
    CATEGORY_CHARS, FREE_TEXT_CHARS, MAX_CATEGORIES, MapEntry, OTHER_CATEGORY, Orientation,
    OrientationContext, ServerSummary, VERBOSE_MARKER, orientation,
};
pub use resolve::{
    Cost, DEFERRED_LINE_CHARS, Inputs, PermittedSet, ServerView, Shape, Surface, Why, resolve,
};
pub use search::{Ranking, SearchIndex};
pub use settings::{Budget, CostBasis, MAX_PAGE_SIZE, Settings, SettingsBuilder};
pub use shapes::SEARCH_HITS;
pub use state::{STATE_REASON_CHARS, ServerState, is_telling};
pub use validate::{ArgumentError, Validation, Validators};
