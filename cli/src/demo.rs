//! `psych demo`: a scripted multi-turn Run against the embedded servers (the five real MCP
//! server processes `psych budget` starts with no `--config`), printed turn by turn and
//! step by step.
//!
//! The same script drives two Runs side by side, one rendered for Anthropic and one for
//! OpenAI Chat Completions, so each step shows both requests' sizes and the bytes each
//! shares with the request before it (prompt-assembly's `CacheReport`). A third Run, for the
//! OpenAI Responses API, plays the same script unprinted: `--dump` writes its requests
//! beside the others. The model is
//! psych-runtime's `ScriptedModel`; the clock is fixed; the catalogue is in memory and the
//! Runs' logs live in a temporary folder, so the output is the same on every machine and
//! nothing is left behind. What the demo prints is the crates' own work: the Surface,
//! the elision of earlier turns' results, the reader's answer, the spent-token sum.

use std::path::Path;
use std::sync::Arc;

use psych_catalog::Catalog;
use psych_elision::Estimator;
use psych_mcp::{McpConfig, McpManager};
use psych_prompt_assembly::{
    AnthropicOptions, CacheReport, CacheRow, CacheRules, OpenAiOptions, RenderedRequest,
};
use psych_runtime::{CatalogSync, ModelReply, Next, Run, ScriptedModel, Spent, Step, Target};
use psych_types::{
    ConnectionSpec, History, HistoryItem, LoggedRecord, PermissionGrant, Record, RunId, ToolResult,
};
use serde_json::json;

use crate::budget::thousands;

/// The transient message's clock: a fixed instant, so every byte is the same on every run.
const NOW: i64 = 1_796_041_497;

/// The Runs' id (one log per provider, each in its own folder).
const RUN: &str = "demo";

/// Zone 1's instructions.
const INSTRUCTIONS: &str = "You are the psych demo's assistant. Use the tools to answer; \
read an elided result back with read_tool_output rather than guessing.";

/// Where the results the reader answers with are cut for printing.
const SHOWN_LINES: usize = 12;

/// Runs the demo; writes every request body under `dump` when given.
pub(crate) fn run(dump: Option<&Path>) -> Result<u8, crate::Failure> {
    if let Some(dir) = dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let config = crate::setup::embedded_config()?;
    let logs = tempfile::tempdir().map_err(|e| format!("cannot create a temporary folder: {e}"))?;
    // A signal stops the Run, and every server with it.
    crate::signals::until_signal(async || {
        let manager = McpManager::builder(config.clone())
            .build()
            .map_err(|e| e.to_string())?;
        let outcome = demo(&config, &manager, logs.path(), dump).await;
        manager.shutdown().await;
        outcome
    })
    .map_err(crate::Failure::Stopped)??;
    Ok(0)
}

/// The minimum cacheable prompt of the demo's Anthropic model (Sonnet-class models: 1,024
/// tokens, per Anthropic's prompt caching guide).
const ANTHROPIC_MIN_TOKENS: u64 = 1024;

/// What a cached input token costs on the demo's OpenAI model, relative to an uncached one
/// (gpt-4.1: $0.50 against $2.00 per million).
const OPENAI_READ_PRICE: f64 = 0.25;

/// One provider's Run and the script answering it.
struct Side {
    run: Run<McpManager>,
    model: ScriptedModel,
    /// Every request of the session, in order (the cache report's input).
    requests: Vec<RenderedRequest>,
    /// `anthropic`, `openai` or `responses`: the dump files' suffix.
    name: &'static str,
    /// Whether its sizes, cache report and spent tokens are printed (the Responses Run is
    /// only dumped, so the printed demo reads as two providers side by side).
    shown: bool,
    /// The provider's prompt cache rules, for the cache report.
    rules: CacheRules,
}

impl Side {
    /// The cache report's row of the last request (against the one before it).
    fn last_row(&self) -> Option<CacheRow> {
        let from = self.requests.len().saturating_sub(2);
        CacheReport::new(&self.requests[from..], &Estimator::new(), self.rules)
            .rows()
            .last()
            .cloned()
    }
}

/// Connects and syncs the servers, then plays the script on both providers.
async fn demo(
    config: &McpConfig,
    manager: &McpManager,
    logs: &Path,
    dump: Option<&Path>,
) -> Result<(), String> {
    // Creating it commits a redb transaction: off the async workers.
    let catalog = tokio::task::spawn_blocking(Catalog::in_memory)
        .await
        .map_err(|e| format!("the catalogue: {e}"))?
        .map_err(|e| format!("the catalogue: {e}"))?;
    // The one connect path (the gateway's and a Run's): every server connected and listed
    // into the catalogue, which stays fresh from the servers' events while the script plays.
    let fresh = crate::setup::listing_freshener()?;
    let connected = CatalogSync::connect(manager, catalog.clone(), fresh)
        .await
        .map_err(|e| format!("the catalogue's freshener: {e}"))?;
    let played = match connected.failures.first() {
        Some((server, error)) => Err(format!(
            "the embedded server {server} did not start: {error}"
        )),
        None => script(config, manager, &catalog, logs, dump).await,
    };
    // Stopped and awaited on every path, so no catalogue write outlives the demo.
    connected.sync.stop().await;
    connected.freshener.shutdown().await;
    played
}

/// Plays the script on every provider over the synced `catalog`.
async fn script(
    config: &McpConfig,
    manager: &McpManager,
    catalog: &Catalog,
    logs: &Path,
    dump: Option<&Path>,
) -> Result<(), String> {
    let targets = [
        (
            "anthropic",
            Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096)),
        ),
        ("openai", Target::OpenAi(OpenAiOptions::new("gpt-4.1"))),
        (
            "responses",
            Target::Responses(OpenAiOptions::new("gpt-4.1")),
        ),
    ];
    let mut sides = Vec::with_capacity(targets.len());
    for (name, target) in targets {
        let run = open_run(config, manager, catalog, &logs.join(name), target).await?;
        sides.push(Side {
            run,
            model: ScriptedModel::default(),
            requests: Vec::new(),
            name,
            shown: name != "responses",
            rules: if name == "anthropic" {
                CacheRules::anthropic(ANTHROPIC_MIN_TOKENS)
            } else {
                CacheRules::openai(OPENAI_READ_PRICE)
            },
        });
    }

    outln!(
        "psych demo: a scripted Run against the {} embedded MCP servers (real processes).",
        config.servers.len()
    );
    outln!("The model is a script and the clock is fixed; every byte below is reproducible.");
    outln!("Each request is rendered for Anthropic Messages and OpenAI Chat Completions.");
    outln!("\"tok\" and \"cache read\": estimated input tokens, and those the provider's");
    outln!("documented prompt cache would read after the request before (an estimate).");

    // Turn 1: a direct call and the orientation in parallel, then a deferred server reached
    // through list → describe → call.
    let acme_reminders = json!({
        "reminders": [{"name": "ACME invoices", "kind": "follow-up", "contents": ["open"]}]
    });
    let turn1 = vec![
        Step::call("psych_orientation", json!({"verbose": true}))
            .and_call("notes__search_reminders", acme_reminders)
            .saying("I will look at the whole toolkit and search my reminders at once."),
        Step::call("psych_list_tools", json!({"server": "suite"})),
        Step::call(
            "psych_describe_tool",
            json!({"server": "suite", "tool": "list_invoice"}),
        ),
        Step::call(
            "psych_call_tool",
            json!({"server": "suite", "tool": "list_invoice", "arguments": {"workspace_id": "acme"}}),
        ),
        Step::say("Here are ACME's open invoices, from the suite server."),
    ];
    let mut calls = 1;
    play(
        &mut sides,
        1,
        "What can you reach? Then find ACME's open invoices.",
        &turn1,
        &mut calls,
        dump,
    )
    .await?;

    // Turn 2: the orientation's full tool map is elided now; read it back by handle.
    let handle = sides
        .first()
        .and_then(|side| result_handle(side.run.history(), "call_1"))
        .ok_or("the orientation's result is not in the log")?;
    let turn2 = vec![
        Step::call(
            "read_tool_output",
            json!({"handle": handle, "grep": "export_invoice"}),
        )
        .saying("The tool map I read earlier is elided now; I will grep it."),
        Step::say(
            "The suite exports invoices with export_invoice; the CRM with crm_export_invoice.",
        ),
    ];
    play(
        &mut sides,
        2,
        "Which tools can export invoices?",
        &turn2,
        &mut calls,
        dump,
    )
    .await?;

    outln!();
    for side in sides.iter().filter(|side| side.shown) {
        outln!(
            "Cache report, {} (its documented cache rules over estimated tokens):",
            side.name
        );
        let report = CacheReport::new(&side.requests, &Estimator::new(), side.rules);
        outln!("{}", indent(&report.to_string(), "  "));
    }
    outln!();
    outln!("Spent, summed from the usage the script reported (request bytes / 4, reply");
    outln!("bytes / 4): the script's figures, not a provider's.");
    for side in sides.iter().filter(|side| side.shown) {
        outln!("  {:<10} {}", side.name, spent_line(&side.run.spent()));
    }
    if let Some(dir) = dump {
        let files: usize = sides.iter().map(|s| s.requests.len()).sum();
        outln!();
        outln!("{files} request bodies written to {}", dir.display());
    }
    Ok(())
}

/// Opens one provider's Run over the embedded servers, all of them granted, with the auto
/// budget `psych budget` reports (5% of a 200,000-token window).
async fn open_run(
    config: &McpConfig,
    manager: &McpManager,
    catalog: &Catalog,
    dir: &Path,
    target: Target,
) -> Result<Run<McpManager>, String> {
    let connections: Vec<ConnectionSpec> = config
        .servers
        .values()
        .map(|s| s.connection.clone())
        .collect();
    let grant = config
        .servers
        .keys()
        .fold(PermissionGrant::none(), |g, s| g.allow_server(s.clone()));
    let settings = crate::setup::run_settings(crate::setup::WINDOW)?;
    let run = RunId::new(RUN).map_err(|e| e.to_string())?;
    Run::builder(dir, run, catalog.clone(), Arc::new(manager.clone()), target)
        .connections(connections)
        .grant(grant)
        .settings(settings)
        .instructions(INSTRUCTIONS)
        .clock(|| NOW)
        .open()
        .await
        .map_err(|e| format!("opening the Run: {}", crate::reason::chain(&e)))
}

/// Plays one turn on every side in step, printing the first side's steps and every side's
/// request sizes.
async fn play(
    sides: &mut [Side],
    turn: usize,
    user: &str,
    steps: &[Step],
    calls: &mut u64,
    dump: Option<&Path>,
) -> Result<(), String> {
    outln!();
    outln!("Turn {turn}. User: {user}");
    let mut requests = Vec::with_capacity(sides.len());
    for side in sides.iter_mut() {
        side.model = ScriptedModel::new(steps.to_vec()).first_call(*calls);
        let request = side
            .run
            .user(user)
            .await
            .map_err(|e| format!("turn {turn}: {}", crate::reason::chain(&e)))?;
        requests.push(request);
    }
    if let Some(surface) = sides.first().and_then(|s| s.run.surface()) {
        outln!(
            "  Surface: {} tools; deferred: {}",
            surface.tools().len() + 1,
            deferred_servers(surface.deferred_lines())
        );
    }
    for step in 1.. {
        outln!("  step {step}");
        let mut replies = Vec::with_capacity(sides.len());
        for (side, request) in sides.iter_mut().zip(requests.drain(..)) {
            side.requests.push(request);
            let Some(request) = side.requests.last() else {
                continue;
            };
            if side.shown {
                let (tokens, read, read_share) = side
                    .last_row()
                    .map_or((0, 0, 0.0), |row| (row.tokens, row.read, row.read_share()));
                outln!(
                    "    {:<9} {:>9} B  ~{:>7} tok, cache read ~{:>7} ({:>5.1}%)",
                    side.name,
                    thousands(request.body().len() as u64),
                    thousands(tokens),
                    thousands(read),
                    read_share * 100.0,
                );
            }
            if let Some(dir) = dump {
                let file = dir.join(format!(
                    "{:02}-turn{turn}-step{step}.{}.json",
                    side.requests.len(),
                    side.name
                ));
                // A file write blocks: off the async workers, with its own copy of the body.
                let body = request.body().to_owned();
                let written = tokio::task::spawn_blocking(move || {
                    std::fs::write(&file, body)
                        .map_err(|e| format!("writing {}: {e}", file.display()))
                });
                written
                    .await
                    .map_err(|e| format!("writing a request body: {e}"))??;
            }
            replies.push(side.model.reply(request));
        }
        let Some(first) = sides.first() else {
            return Ok(());
        };
        let elided = elided(first.run.history(), first.requests.last());
        if !elided.is_empty() {
            outln!("    elided    {}", elided.join(", "));
        }
        if let Some(reply) = replies.first() {
            print_reply(reply);
            *calls += reply.tool_calls.len() as u64;
        }
        let mut done = 0;
        for (side, reply) in sides.iter_mut().zip(replies) {
            let before = side.run.history().len() as u64;
            let next =
                side.run.reply(reply).await.map_err(|e| {
                    format!("turn {turn}, step {step}: {}", crate::reason::chain(&e))
                })?;
            if side.name == "anthropic" {
                let logged = side.run.records(before).map_err(|e| {
                    format!("turn {turn}, step {step}: {}", crate::reason::chain(&e))
                })?;
                print_results(&logged);
            }
            match next {
                Next::Request(request) => requests.push(request),
                _ => done += 1,
            }
        }
        if done == sides.len() {
            return Ok(());
        }
        if done > 0 {
            return Err(format!(
                "turn {turn}: the providers' Runs went different ways"
            ));
        }
    }
    Ok(())
}

/// The model's side of one step.
fn print_reply(reply: &ModelReply) {
    if !reply.text.is_empty() {
        outln!(
            "    model     {}",
            crate::truncate(&format!("{:?}", reply.text), 66)
        );
    }
    if reply.tool_calls.len() > 1 {
        outln!("    calls     {} in parallel", reply.tool_calls.len());
    }
    for call in &reply.tool_calls {
        outln!("    call      {} {}", call.id, call.name);
        for chunk in chunks(&call.arguments.to_string(), 62) {
            outln!("                {chunk}");
        }
    }
}

/// The results a step logged: each with its size and handle; the reader's answer in full
/// (up to [`SHOWN_LINES`] lines).
fn print_results(records: &[LoggedRecord]) {
    for logged in records {
        let Record::ToolResult(ToolResult {
            call_id,
            name,
            output,
            ..
        }) = &logged.record
        else {
            continue;
        };
        let text = output.readable_text();
        let state = if output.is_error() { " (error)" } else { "" };
        outln!(
            "    result    {call_id} {name}: {} B logged whole as {}{state}",
            thousands(text.len() as u64),
            logged.handle
        );
        if name == psych_types::READ_TOOL_OUTPUT {
            for line in text.lines().take(SHOWN_LINES) {
                outln!("      | {}", crate::truncate(line, 70));
            }
            let more = text.lines().count().saturating_sub(SHOWN_LINES);
            if more > 0 {
                outln!("      | … {more} more lines");
            }
        }
    }
}

/// The handle of the result of call `id`.
fn result_handle(history: &History, id: &str) -> Option<String> {
    history.entries.iter().find_map(|entry| match &entry.item {
        HistoryItem::Result(result) if result.info.call_id.as_str() == id => {
            Some(entry.handle.to_string())
        }
        _ => None,
    })
}

/// The results `request` sends as an elided preview: those whose guidance (elision's
/// preview names the handle to read it back with) is in the body, with the bytes the log
/// holds.
fn elided(history: &History, request: Option<&RenderedRequest>) -> Vec<String> {
    let Some(request) = request else {
        return Vec::new();
    };
    history
        .entries
        .iter()
        .filter_map(|entry| match &entry.item {
            HistoryItem::Result(result) => {
                let marker = format!(r#"handle \"{}\""#, entry.handle);
                request.body().contains(&marker).then(|| {
                    format!(
                        "{} ({} {} B, sent as a preview)",
                        entry.handle,
                        result.info.name,
                        thousands(result.info.len)
                    )
                })
            }
            _ => None,
        })
        .collect()
}

/// The deferred servers' names, from their lines (`name: deferred MCP server, …`).
fn deferred_servers(lines: &[String]) -> String {
    let names: Vec<&str> = lines
        .iter()
        .filter_map(|line| line.split(':').next())
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The spent tokens, one line.
fn spent_line(spent: &Spent) -> String {
    let usage = &spent.usage;
    format!(
        "{} calls: input {}, output {}, cache r/w {}/{}; total {}",
        spent.calls,
        thousands(usage.input),
        thousands(usage.output),
        thousands(usage.cache_read),
        thousands(usage.cache_write),
        thousands(spent.total())
    )
}

/// `text` cut into pieces of at most `width` characters (arguments are printed whole).
fn chunks(text: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(width.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

/// Every line of `text` prefixed with `prefix`.
fn indent(text: &str, prefix: &str) -> String {
    text.lines()
        .map(|line| format!("{prefix}{line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_servers_are_named_from_their_lines() {
        let lines = [
            "forge: deferred MCP server, 117 tools.".to_owned(),
            "suite: deferred MCP server, 480 tools.".to_owned(),
        ];
        assert_eq!(deferred_servers(&lines), "forge, suite");
        assert_eq!(deferred_servers(&[]), "none");
    }

    #[test]
    fn chunks_keep_every_character() {
        assert_eq!(chunks("abcdé", 2), ["ab", "cd", "é"]);
        assert!(chunks("", 2).is_empty());
    }
}
