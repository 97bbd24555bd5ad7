//! The runtime's own overhead per step, the server excluded (an in-process host that answers
//! at once), for 20 servers / 2,000 tools and a 500-record history.
//!
//! Group `step_20_servers_2000_tools_500_records`:
//! - `step`: what a Run does per step besides waiting for the model and the server: read
//!   every connected server's live catalogue, resolve the Surface, assemble the 500-record
//!   history as the Run does (its lazy `History` read from the log's metadata, earlier
//!   turns' views from its `ProjectionCache`, results sent whole read from the log) with
//!   the elider and render it for Anthropic, route one forwarded call through the executor
//!   (guard with argument validation, the host, the log append);
//! - `step_whole_records`: the same with the whole-record assembly the Run used before
//!   (every record in memory, every earlier result projected again at every step);
//! - `resolve`: the catalogue reads and disclosure's `resolve` alone;
//! - `assemble_render`: the Run's assembly and the Anthropic render alone (its cache warm,
//!   as at every step but the first of a turn);
//! - `assemble_render_cold`: the same from nothing (the history read from the log and
//!   every earlier turn projected: a Run's first step after it is reopened);
//! - `assemble_render_whole_records`: the whole-record assembly and the render;
//! - `route`: the executor alone on one forwarded call (log opened `OsBuffered`, so the
//!   figure is the runtime's work, not the disk's `fdatasync`);
//! - `baseline_serialize_history`: `serde_json::to_string` of the 500 records, the least
//!   work that reads the history once.
//!
//! Catalogues are psych-test-server's `synthetic_tools` (realistic names, descriptions, schemas):
//! five servers of 10 tools (direct) and fifteen of 130 (deferred or a search pair).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use psych_catalog::Catalog;
use psych_disclosure::{Inputs, Live, Settings, Surface, Validators, Verdict, resolve};
use psych_elision::{Elider, Estimator};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, ProjectionCache, StaticSections,
    StepHistory, Transient,
};
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_runtime::Executor;
use psych_test_server::synthetic_tools;
use psych_types::{
    AssistantMessage, ConnectionSpec, History, JsonObject, LoggedRecord, PermissionGrant, Record,
    RecordHandle, RunId, ServerCatalog, ServerId, ToolCall, ToolCallId, ToolDefinition, ToolHost,
    ToolLister, ToolOutput, ToolRef, ToolResult, UserMessage,
};
use serde_json::json;

/// Answers every call at once with a short text.
struct Instant;

impl ToolLister for Instant {
    type Error = std::io::Error;

    async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        Ok(Vec::new())
    }
}

impl ToolHost for Instant {
    async fn call_tool(&self, tool: &ToolRef, _: JsonObject) -> Result<ToolOutput, Self::Error> {
        Ok(ToolOutput::text(format!("{} done", tool.tool)))
    }
}

struct Setup {
    catalog: Catalog,
    connections: Vec<ConnectionSpec>,
    grant: PermissionGrant,
    history: Vec<LoggedRecord>,
    call: ToolCall,
}

fn setup() -> Setup {
    let catalog = Catalog::in_memory().unwrap();
    let mut connections = Vec::new();
    let mut grant = PermissionGrant::none();
    let mut total = 0;
    for i in 0..20 {
        let server = ServerId::new(format!("s{i:02}")).unwrap();
        let tools = synthetic_tools(if i < 5 { 10 } else { 130 });
        total += tools.len();
        catalog.refresh(&server, &tools).unwrap();
        connections.push(ConnectionSpec::new(server.clone()));
        grant = grant.allow_server(server);
    }
    assert_eq!(total, 2_000);
    let run = RunId::new("bench").unwrap();
    let mut history = Vec::new();
    let push = |history: &mut Vec<LoggedRecord>, record| {
        let handle = RecordHandle::new(run.clone(), history.len() as u64);
        history.push(LoggedRecord { handle, record });
    };
    let log_text: String = (0..300)
        .map(|i| {
            format!(
                "2026-11-30T12:{:02}:00Z GET /api/items/{i} 200 12ms\n",
                i % 60
            )
        })
        .collect();
    let mut turn = 0;
    while history.len() < 500 {
        turn += 1;
        push(
            &mut history,
            Record::User(UserMessage {
                text: format!("Turn {turn}: look at the items and the log."),
            }),
        );
        let calls: Vec<ToolCall> = (0..2)
            .map(|k| ToolCall {
                id: ToolCallId::new(format!("call_{turn}_{k}")).unwrap(),
                name: "s00__list_items".into(),
                arguments: json!({"page": k, "query": "open"}),
            })
            .collect();
        push(
            &mut history,
            Record::Assistant(AssistantMessage {
                text: "Checking.".into(),
                tool_calls: calls.clone(),
            }),
        );
        push(
            &mut history,
            Record::ToolResult(ToolResult {
                target: None,
                call_id: calls[0].id.clone(),
                name: calls[0].name.clone(),
                output: ToolOutput::json(
                    json!({"items": (0..20).map(|i| json!({"id": i, "title": format!("Item {i}"), "state": "open"})).collect::<Vec<_>>()}),
                ),
            }),
        );
        push(
            &mut history,
            Record::ToolResult(ToolResult {
                target: None,
                call_id: calls[1].id.clone(),
                name: calls[1].name.clone(),
                output: ToolOutput::text(log_text.clone()),
            }),
        );
        push(
            &mut history,
            Record::Assistant(AssistantMessage {
                text: format!("Turn {turn} looks fine."),
                tool_calls: Vec::new(),
            }),
        );
    }
    push(
        &mut history,
        Record::User(UserMessage {
            text: "One more thing.".into(),
        }),
    );
    // A call the guard forwards to a server, whatever tier its server got: a direct tool
    // given `{}`, or a catalogue tool through its facade, search pair or the meta tools.
    let catalogs = live(&catalog, &connections);
    let surface = resolve_now(&catalogs, &connections, &grant);
    let validators = Validators::new();
    let mut candidates: Vec<(String, serde_json::Value)> = surface
        .tools()
        .iter()
        .map(|t| (t.name.as_str().to_owned(), json!({})))
        .collect();
    for server in &catalogs {
        let s = server.server.as_str();
        for tool in server.tools.iter() {
            let t = tool.name.as_str();
            candidates.push((s.to_owned(), json!({"tool": t, "input": {}})));
            candidates.push((format!("{s}__call_tool"), json!({"tool": t, "input": {}})));
            candidates.push((
                "psych_call_tool".to_owned(),
                json!({"server": s, "tool": t, "arguments": {}}),
            ));
        }
    }
    let (name, arguments) = candidates
        .into_iter()
        .find(|(name, arguments)| {
            matches!(
                surface.guard(
                    name,
                    arguments,
                    &Live {
                        grant: &grant,
                        catalogs: &catalogs
                    },
                    &validators
                ),
                Verdict::Forward(_)
            )
        })
        .expect("a tool the guard forwards");
    let call = ToolCall {
        id: ToolCallId::new("call_bench").unwrap(),
        name,
        arguments,
    };
    Setup {
        catalog,
        connections,
        grant,
        history,
        call,
    }
}

fn live(catalog: &Catalog, connections: &[ConnectionSpec]) -> Vec<ServerCatalog> {
    connections
        .iter()
        .map(|c| catalog.live(&c.server).unwrap())
        .collect()
}

fn resolve_now(
    catalogs: &[ServerCatalog],
    connections: &[ConnectionSpec],
    grant: &PermissionGrant,
) -> Surface {
    let inputs = Inputs {
        connections,
        catalogs,
        grant,
    };
    resolve(&inputs, &Settings::default(), &Estimator::new()).unwrap()
}

/// Where the history comes from: whole records in memory (the Run before), or the Run's
/// lazy history over its log with its projection cache.
enum Source<'a> {
    Whole(&'a [LoggedRecord]),
    Lazy {
        history: &'a History,
        log: &'a SharedRecordLog,
        cache: &'a mut ProjectionCache,
    },
}

fn assemble(surface: &Surface, from: Source<'_>, elider: &Elider) -> usize {
    let zone1 = surface.deferred_lines().iter().fold(
        StaticSections::new("You are a careful assistant."),
        |z, l| z.capability_note(l.clone()),
    );
    let zone2 = DynamicTail::new();
    let tools = surface.tools().to_vec();
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let assembler = Assembler::new(&zone1, &zone2, &tools);
    let options = AnthropicOptions::new("claude-sonnet-4-5", 4096);
    match from {
        Source::Whole(records) => assembler
            .assemble(records, elider, &transient)
            .unwrap()
            .render_anthropic(&options)
            .unwrap()
            .body()
            .len(),
        Source::Lazy {
            history,
            log,
            cache,
        } => {
            let step = StepHistory::load(history, log, elider, cache).unwrap();
            assembler
                .assemble_history(&step, &transient)
                .unwrap()
                .render_anthropic(&options)
                .unwrap()
                .body()
                .len()
        }
    }
}

fn lazy<'a>(
    history: &'a History,
    log: &'a SharedRecordLog,
    cache: &'a mut ProjectionCache,
) -> Source<'a> {
    Source::Lazy {
        history,
        log,
        cache,
    }
}

/// The history written to a log as a Run writes it (the elider's estimate stored with each
/// result), shared as a Run shares it.
fn logged(dir: &std::path::Path, records: &[LoggedRecord], elider: &Elider) -> SharedRecordLog {
    let (mut log, _) =
        RecordLog::open(dir, &RunId::new("bench").unwrap(), SyncPolicy::OsBuffered).unwrap();
    log.set_estimator(Arc::new(*elider.estimator()));
    let batch: Vec<Record> = records.iter().map(|l| l.record.clone()).collect();
    log.append_batch(&batch).unwrap();
    log.sync().unwrap();
    SharedRecordLog::new(log)
}

fn bench_step(c: &mut Criterion) {
    let setup = setup();
    let elider = Elider::default();
    let history_dir = tempfile::tempdir().unwrap();
    let history_log = logged(history_dir.path(), &setup.history, &elider);
    let history = history_log.history().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = SharedRecordLog::open(
        dir.path(),
        &RunId::new("bench").unwrap(),
        SyncPolicy::OsBuffered,
    )
    .unwrap();
    let executor = Executor::new(Arc::new(Instant), Arc::new(log));
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let calls = [setup.call.clone()];
    let step = |from: Source<'_>| {
        let catalogs = live(&setup.catalog, &setup.connections);
        let surface = resolve_now(&catalogs, &setup.connections, &setup.grant);
        let bytes = assemble(&surface, from, &elider);
        let live = Live {
            grant: &setup.grant,
            catalogs: &catalogs,
        };
        let logged = tokio
            .block_on(executor.execute(&surface, &live, &calls))
            .unwrap();
        bytes + logged.len()
    };
    let mut cache = ProjectionCache::new();
    let lazy_bytes = step(lazy(&history, &history_log, &mut cache));
    assert_eq!(
        lazy_bytes,
        step(Source::Whole(&setup.history)),
        "both paths send the same request"
    );
    eprintln!("request bytes per step: {lazy_bytes}");

    let mut group = c.benchmark_group("step_20_servers_2000_tools_500_records");
    group.bench_function("step", |b| {
        b.iter(|| black_box(step(lazy(&history, &history_log, &mut cache))))
    });
    group.bench_function("step_whole_records", |b| {
        b.iter(|| black_box(step(Source::Whole(&setup.history))))
    });
    group.bench_function("resolve", |b| {
        b.iter(|| {
            let catalogs = live(&setup.catalog, &setup.connections);
            black_box(resolve_now(&catalogs, &setup.connections, &setup.grant))
        })
    });
    let catalogs = live(&setup.catalog, &setup.connections);
    let surface = resolve_now(&catalogs, &setup.connections, &setup.grant);
    group.bench_function("assemble_render", |b| {
        b.iter(|| {
            black_box(assemble(
                &surface,
                lazy(&history, &history_log, &mut cache),
                &elider,
            ))
        })
    });
    group.bench_function("assemble_render_cold", |b| {
        b.iter(|| {
            let history = history_log.history().unwrap();
            let mut cache = ProjectionCache::new();
            black_box(assemble(
                &surface,
                lazy(&history, &history_log, &mut cache),
                &elider,
            ))
        })
    });
    group.bench_function("assemble_render_whole_records", |b| {
        b.iter(|| black_box(assemble(&surface, Source::Whole(&setup.history), &elider)))
    });
    group.bench_function("route", |b| {
        b.iter(|| {
            let live = Live {
                grant: &setup.grant,
                catalogs: &catalogs,
            };
            black_box(
                tokio
                    .block_on(executor.execute(&surface, &live, &calls))
                    .unwrap(),
            )
        })
    });
    group.bench_function("baseline_serialize_history", |b| {
        b.iter(|| black_box(serde_json::to_string(&setup.history).unwrap().len()))
    });
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
