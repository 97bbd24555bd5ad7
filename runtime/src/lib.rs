//! The Psych runtime: a [`Run`] that resolves every turn against the servers as they are
//! now, and the [`Executor`] that routes each tool call.
//!
//! The principal type is [`Run`]. An agent runtime drives it and keeps the model call: a
//! turn logs the user's message, resolves the tool Surface from the catalogue at that moment
//! (psych-disclosure over psych-catalog's live tools, the connections and the grant),
//! assembles the request (psych-prompt-assembly, with psych-elision as the projector of
//! earlier turns' results) and renders it for the provider the caller chose ([`Target`]).
//! The caller sends it and hands back the model's reply ([`ModelReply`]: text, tool calls,
//! provider-reported usage); the runtime logs it, runs the calls through the [`Executor`],
//! logs every result whole (psych-record-log) and returns the next request, until the model
//! answers without calls.
//!
//! - **Nothing cached across turns but the catalogue.** A server connected mid-Run is on the
//!   next turn's Surface ([`Run::add_connection`]); a `list_changed` reaches the catalogue
//!   through `CatalogSync` (psych-mcp's events into the catalogue's freshener; feature
//!   `mcp`); a grant change holds at the next call, since the guard re-checks every call.
//! - **The executor is glue.** Each route hands off to the crate that owns the policy: the
//!   guard (direct tools, facades, search pairs, the meta tools), the orientation payload,
//!   psych-reader-tool for `read_tool_output`, the [`ToolHost`](psych_types::ToolHost) for
//!   what is forwarded (under a per-call deadline), with the call's
//!   [`ProgressSink`](psych_types::ProgressSink) when the caller gave one
//!   ([`Executor::execute_with_progress`]). Parallel calls run concurrently; their
//!   results are logged in call order, whole, in one batch, before anything is elided.
//!   At most [`DEFAULT_MAX_CALLS_PER_STEP`] (64) of a step run: the step's answers are
//!   held until it is logged, so the rest are answered with a failed result saying so
//!   ([`Executor::max_calls_per_step`]).
//!   One call can also go as one round of an MCP 2026-07-28 multi-round-trip call
//!   ([`Executor::execute_round`]): a server's `input_required` answer comes back
//!   ([`Executed::InputRequired`]) without being logged, and only the final result is.
//! - **Resume.** Opening a Run whose log exists resumes it; every call without a result gets
//!   a logged failed result ([`INTERRUPTED`]) before anything is assembled.
//! - **A call may be dropped.** [`Run::user`], [`Run::request`] and [`Run::reply`] may be
//!   dropped at any await (a caller's timeout or `select!`): what was logged stays logged,
//!   and the next call waits for the appends the dropped one left on the blocking pool
//!   ([`Executor::settled`]) and reads the Run back from its log. Log I/O, catalogue reads
//!   and rendering run on the blocking pool, never on the caller's async worker.
//! - **Spent tokens come from the provider.** [`Run::spent`] sums the logged usage records
//!   and nothing else ([`spent`]).
//! - **Native deferral where the provider has it.** With
//!   [`RunBuilder::deferral`]`(`[`DeferralMode::Native`](psych_prompt_assembly::DeferralMode::Native)`)`,
//!   a turn sends the deferred servers' permitted tools with `defer_loading` and Psych's
//!   search tool instead of the meta tools (Anthropic Messages and OpenAI Responses; Chat
//!   Completions, and more than
//!   [`MAX_DEFERRED_TOOLS`](psych_prompt_assembly::MAX_DEFERRED_TOOLS) deferred tools, fall
//!   back to the meta tools). The executor answers the search from disclosure's ranking of
//!   the tools permitted now; a loaded tool's call goes through the guard like a direct one.
//! - [`ScriptedModel`] answers from a script, to drive a Run deterministically.
//!
//! # Features
//!
//! - `mcp` (off by default): `CatalogSync`, which keeps a catalogue fresh from psych-mcp's
//!   live connections (a sync on connect, `list_changed`, reachability), and servers
//!   started when they are needed: `start_at` decides which servers a kept listing serves
//!   until their first call, `LazyStarts` starts them for the executor. Without it the
//!   runtime depends on no MCP client at all (no rmcp, hyper or reqwest): it forwards calls
//!   to any [`ToolHost`](psych_types::ToolHost), and a caller with its own MCP client
//!   refreshes the catalogue through psych-catalog's `Freshener` itself.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//!
//! use psych_catalog::Catalog;
//! use psych_prompt_assembly::AnthropicOptions;
//! use psych_runtime::{Next, Run, ScriptedModel, Step, Target};
//! use psych_types::{
//!     ConnectionSpec, JsonObject, PermissionGrant, ServerId, ToolDefinition, ToolHost,
//!     ToolLister, ToolName, ToolOutput, ToolRef,
//! };
//! use serde_json::json;
//!
//! /// An in-process server with one tool that echoes its `text`.
//! struct Echo;
//! impl ToolLister for Echo {
//!     type Error = std::io::Error;
//!     async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
//!         let name = ToolName::new("echo").map_err(std::io::Error::other)?;
//!         Ok(vec![ToolDefinition::new(name, "Echo the text", Default::default())])
//!     }
//! }
//! impl ToolHost for Echo {
//!     async fn call_tool(&self, _: &ToolRef, args: JsonObject) -> Result<ToolOutput, Self::Error> {
//!         Ok(ToolOutput::text(args["text"].as_str().unwrap_or_default()))
//!     }
//! }
//!
//! let dir = tempfile::tempdir()?;
//! let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! tokio.block_on(async {
//!     let server = ServerId::new("echo")?;
//!     let catalog = Catalog::in_memory()?;
//!     catalog.refresh(&server, &Echo.list_tools(&server).await?)?;
//!
//!     // The provider and model requests are rendered for, and the system prompt: the
//!     // caller's to choose.
//!     let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
//!     let run = Run::builder(dir.path(), "run-1".parse()?, catalog, Arc::new(Echo), target);
//!     let mut run = run
//!         .instructions("You answer through the tools you are given.")
//!         .connections([ConnectionSpec::new(server.clone())])
//!         .grant(PermissionGrant::none().allow_server(server))
//!         .clock(|| 1_796_041_497)
//!         .open()
//!         .await?;
//!
//!     // The caller's model: here a script. It calls the tool, then answers.
//!     let mut model = ScriptedModel::new([
//!         Step::call("echo__echo", json!({"text": "hello"})),
//!         Step::say("It said hello."),
//!     ]);
//!     let request = run.user("Say hello through the tool.").await?;
//!     assert!(request.body().contains(r#""name":"echo__echo""#));
//!     let Next::Request(second) = run.reply(model.reply(&request)).await? else {
//!         return Err("the model called a tool".into());
//!     };
//!     assert!(second.body().contains("hello"));
//!     let done = run.reply(model.reply(&second)).await?;
//!     assert_eq!(done, Next::Done { text: "It said hello.".into() });
//!
//!     // Spent tokens are the usage the "provider" reported, summed.
//!     assert_eq!(run.spent().calls, 2);
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod budget;
mod error;
#[cfg(feature = "mcp")]
mod events;
mod executor;
mod files;
#[cfg(feature = "mcp")]
mod lazy;
mod native;
mod pinning;
mod run;
mod scripted;
mod usage;

pub use budget::{PassingBudget, Reserved};
pub use error::{ExecuteError, RunError, TurnState};
#[cfg(feature = "mcp")]
pub use events::{CatalogSync, Connected, Connecting, FirstSyncError, Started};
pub use executor::{
    Archive, Archived, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_CALLS_PER_STEP, EXECUTOR_TOOLS, Executed,
    Executor, OnDemand, StartFuture, Unreadable, off_the_worker, reserve_executor_tools,
};
#[cfg(feature = "mcp")]
pub use lazy::{
    AtOnce, LazyStarts, ListingSources, STARTED_ON_DEMAND, StartAt, lazy_state, start_at,
};
pub use pinning::{choose_pins, usage_in_logs};
pub use run::{INTERRUPTED, ModelReply, Next, Run, RunBuilder, Target};
pub use scripted::{ScriptedModel, Step, Transcript};
pub use usage::{Spent, spent};
