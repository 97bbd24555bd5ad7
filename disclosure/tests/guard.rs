//! The call-time guard on the real catalogues: every route resolves to a `(server, tool)`
//! pair checked against the grant and catalogues as they are now, and arguments are
//! validated against the real schemas (notion's `$defs`/`$ref`/`oneOf`, draft 2020-12).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use crate::common::{FIXTURES, Setup, catalog, fixture_setup, fixture_tools, named_setup};
use psych_disclosure::{
    Answer, CALL_TOOL, DESCRIBE_TOOL, LIST_TOOLS, ORIENTATION, Refusal, Settings, Validation,
    Validators, Verdict,
};
use psych_types::{
    ConnectionSpec, PermissionGrant, Preload, Reachability, ServerId, ToolName, ToolRef,
};
use serde_json::{Value, json};

fn guard(setup: &Setup, settings: &Settings, name: &str, args: Value) -> Verdict {
    let surface = setup.resolve(settings);
    surface.guard(name, &args, &setup.live(), &Validators::new())
}

fn refusal(verdict: Verdict) -> Refusal {
    match verdict {
        Verdict::Refused(refusal) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn forwarded(verdict: Verdict) -> (ToolRef, Validation) {
    match verdict {
        Verdict::Forward(call) => (call.target, call.validation),
        other => panic!("expected a forward, got {other:?}"),
    }
}

#[test]
fn every_fixture_schema_compiles_offline() {
    let setup = fixture_setup(Preload::Deferred);
    let surface = setup.resolve(&Settings::default());
    let validators = Validators::new();
    for (server, file) in FIXTURES {
        for tool in fixture_tools(file) {
            let args = json!({"server": server, "tool": tool.name.as_str(), "arguments": {}});
            match surface.guard(CALL_TOOL, &args, &setup.live(), &validators) {
                Verdict::Forward(call) => assert_eq!(call.validation, Validation::Checked),
                Verdict::Refused(Refusal::InvalidArguments { .. }) => {}
                other => panic!("{server}/{}: {other:?}", tool.name),
            }
        }
    }
    assert_eq!(validators.len(), 189);
}

#[test]
fn notion_refs_and_one_of_are_validated_with_the_failing_path() {
    let setup = fixture_setup(Preload::Auto);
    let settings = Settings::default();
    let good = json!({"server": "notion", "tool": "API-post-page", "arguments": {
        "parent": {"page_id": "59833787-2cf9-4fdf-8782-e53db20768a5"},
        "properties": {"title": "Minutes"}
    }});
    let (target, validation) = forwarded(guard(&setup, &settings, CALL_TOOL, good));
    assert_eq!(target, ToolRef::parse("notion", "API-post-page").unwrap());
    assert_eq!(validation, Validation::Checked);

    let bad = json!({"server": "notion", "tool": "API-post-page", "arguments": {
        "parent": 5, "properties": {}
    }});
    let refusal = refusal(guard(&setup, &settings, CALL_TOOL, bad));
    let text = refusal.to_string();
    assert!(
        text.starts_with("invalid arguments for notion/API-post-page: /parent"),
        "{text}"
    );
    assert!(refusal.to_output().is_error);

    let missing =
        json!({"server": "notion", "tool": "API-post-page", "arguments": {"parent": "x"}});
    let text = refusal_text(guard(&setup, &settings, CALL_TOOL, missing));
    assert!(text.contains("properties"), "{text}");
}

fn refusal_text(verdict: Verdict) -> String {
    refusal(verdict).to_string()
}

#[test]
fn direct_tools_validate_against_draft_07_and_2020_12_schemas() {
    let setup = fixture_setup(Preload::Auto);
    let settings = Settings::default();
    let (target, _) = forwarded(guard(
        &setup,
        &settings,
        "filesystem__read_text_file",
        json!({"path": "README.md", "head": 3}),
    ));
    assert_eq!(target.tool.as_str(), "read_text_file");
    let text = refusal_text(guard(
        &setup,
        &settings,
        "filesystem__read_text_file",
        json!({"path": 3}),
    ));
    assert!(text.contains("/path"), "{text}");
    let text = refusal_text(guard(
        &setup,
        &settings,
        "playwright__browser_navigate",
        json!({}),
    ));
    assert!(text.contains("url"), "{text}");
    let text = refusal_text(guard(
        &setup,
        &settings,
        "playwright__browser_navigate",
        json!("https://example.com"),
    ));
    assert!(text.contains("must be a JSON object"), "{text}");
}

#[test]
fn listing_pages_with_a_more_marker_and_an_empty_page_past_the_end() {
    let setup = fixture_setup(Preload::Auto);
    let settings = Settings::default();
    let page = |n: u64| match guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"server": "github", "page": n}),
    ) {
        Verdict::Answer(Answer::Listing(listing)) => listing,
        other => panic!("{other:?}"),
    };
    let first = page(1);
    assert_eq!((first.page, first.pages, first.total), (1, 3, 117));
    assert_eq!(first.tools.len(), 50);
    assert_eq!(first.more.as_deref(), Some("more: ask for page 2 of 3"));
    let last = page(3);
    assert_eq!(last.tools.len(), 17);
    assert_eq!(last.more, None);
    assert!(page(4).tools.is_empty());
    let mut names: Vec<_> = (1..=3)
        .flat_map(|n| page(n).tools)
        .map(|t| t.name)
        .collect();
    names.dedup();
    assert_eq!(names.len(), 117);

    let text = refusal_text(guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"server": "github", "page": 0}),
    ));
    assert!(text.contains("/page"), "{text}");
    // What the tool's schema admits, it takes: `2.0` is an integer to JSON Schema.
    let Verdict::Answer(Answer::Listing(second)) = guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"server": "github", "page": 2.0}),
    ) else {
        panic!("page 2.0 refused")
    };
    assert_eq!(second, page(2));
    let text = refusal_text(guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"server": "github", "page": 1.5}),
    ));
    assert!(
        text.contains("/page: must be an integer of at least 1"),
        "{text}"
    );
    let text = refusal_text(guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"page": 1, "extra": true}),
    ));
    assert!(
        text.contains("/server: is required") && text.contains("/extra"),
        "{text}"
    );
}

#[test]
fn unknown_and_unpermitted_read_the_same_and_unknown_servers_are_tool_errors() {
    let mut setup = fixture_setup(Preload::Deferred);
    let github = ServerId::new("github").unwrap();
    setup.grant = PermissionGrant::none()
        .allow_tool(ToolRef::parse("github", "list_issues").unwrap())
        .allow_server(ServerId::new("memory").unwrap());
    let settings = Settings::default();
    let unpermitted = refusal_text(guard(
        &setup,
        &settings,
        DESCRIBE_TOOL,
        json!({"server": "github", "tool": "delete_repository"}),
    ));
    let unknown = refusal_text(guard(
        &setup,
        &settings,
        DESCRIBE_TOOL,
        json!({"server": "github", "tool": "delete_everything"}),
    ));
    assert_eq!(
        unpermitted,
        "tool \"delete_repository\" is not available on server github"
    );
    assert_eq!(
        unknown,
        "tool \"delete_everything\" is not available on server github"
    );
    // Notion is connected but not granted: it is as unknown as a server that does not exist.
    for server in ["notion", "nope", ""] {
        let verdict = guard(&setup, &settings, LIST_TOOLS, json!({"server": server}));
        assert_eq!(
            refusal(verdict),
            Refusal::UnknownServer {
                server: server.into()
            }
        );
    }
    let surface = setup.resolve(&settings);
    assert_eq!(surface.permitted().tools(&github).map(|t| t.len()), Some(1));
    assert!(surface.server("notion").is_none());
}

#[test]
fn a_permission_revoked_after_resolution_holds_at_the_next_call() {
    let setup = fixture_setup(Preload::Auto);
    let surface = setup.resolve(&Settings::default());
    let revoked =
        PermissionGrant::none().allow_tool(ToolRef::parse("memory", "read_graph").unwrap());
    let live = psych_disclosure::Live {
        grant: &revoked,
        catalogs: &setup.catalogs,
    };
    let validators = Validators::new();
    let verdict = surface.guard(
        "memory__delete_entities",
        &json!({"entityNames": ["Bob"]}),
        &live,
        &validators,
    );
    assert!(
        matches!(verdict, Verdict::Refused(Refusal::NotAvailable { .. })),
        "{verdict:?}"
    );
    let verdict = surface.guard("memory__read_graph", &json!({}), &live, &validators);
    assert!(matches!(verdict, Verdict::Forward(_)), "{verdict:?}");
    let verdict = surface.guard(
        CALL_TOOL,
        &json!({"server": "github", "tool": "get_me"}),
        &live,
        &validators,
    );
    assert!(
        matches!(verdict, Verdict::Refused(Refusal::UnknownServer { .. })),
        "{verdict:?}"
    );
}

#[test]
fn a_disconnect_keeps_the_bytes_and_calls_answer_unreachable() {
    let setup = fixture_setup(Preload::Auto);
    let settings = Settings::default();
    let before = setup.resolve(&settings);
    let mut down = fixture_setup(Preload::Auto);
    for catalog in &mut down.catalogs {
        catalog.health.reachability = Reachability::Unreachable {
            reason: "exited with status 1".into(),
        };
    }
    let after = down.resolve(&settings);
    assert_eq!(before.tools(), after.tools());
    assert_eq!(before.deferred_lines(), after.deferred_lines());
    let text = refusal_text(after.guard(
        "memory__read_graph",
        &json!({}),
        &down.live(),
        &Validators::new(),
    ));
    assert_eq!(text, "unreachable: exited with status 1");
    // Discovery still answers from the catalogue.
    let verdict = after.guard(
        LIST_TOOLS,
        &json!({"server": "github"}),
        &down.live(),
        &Validators::new(),
    );
    assert!(matches!(verdict, Verdict::Answer(Answer::Listing(_))));
}

#[test]
fn a_server_with_no_tools_is_listed_with_its_state() {
    let mut setup = named_setup(
        [("memory".to_string(), "server-memory.tools.json")],
        Preload::Auto,
    );
    let broken = ServerId::new("broken").unwrap();
    let mut empty = catalog("broken", Vec::new());
    empty.health.last_sync = None;
    empty.health.last_error = Some(psych_types::SyncFailure {
        at: 1,
        message: "tools/list: connection refused\nstack…".into(),
    });
    setup.catalogs.push(empty);
    setup
        .connections
        .push(ConnectionSpec::new(broken.clone()).with_preload(Preload::Eager));
    setup
        .connections
        .push(ConnectionSpec::new(ServerId::new("fresh").unwrap()));
    setup.grant = std::mem::take(&mut setup.grant)
        .allow_server(broken)
        .allow_server(ServerId::new("fresh").unwrap());
    let surface = setup.resolve(&Settings::default());
    assert_eq!(
        surface.deferred_lines(),
        [
            "broken: deferred MCP server, no tools (listing failed: tools/list: connection refused)",
            "fresh: deferred MCP server, no tools (not listed yet)",
        ]
    );
    // Listing it says why it has no tools, instead of an empty list that looks healthy.
    let listing = refusal_text(guard(
        &setup,
        &Settings::default(),
        LIST_TOOLS,
        json!({"server": "broken"}),
    ));
    assert_eq!(
        listing,
        "server broken has no tools: listing failed: tools/list: connection refused | stack…"
    );
    let fresh = refusal_text(guard(
        &setup,
        &Settings::default(),
        LIST_TOOLS,
        json!({"server": "fresh"}),
    ));
    assert_eq!(fresh, "server fresh has no tools: not listed yet");
}

/// What psych-mcp reports, through the catalogue's freshener, for a Python server that
/// cannot start: the server named twice, then the call, then its stderr, line by line.
const PYTHON_FAILURE: &str = "MCP server \"py\" is unreachable: MCP server \"py\": initialize \
    failed: the server process exited with status 1; its last stderr lines:\n  \
    Traceback (most recent call last):\n  File \"/srv/py/server.py\", line 3, in <module>\n    \
    from mcp.server.fastmcp import FastMCP\n  ModuleNotFoundError: No module named 'mcp'";

/// The memory fixture plus `py`, a server that failed as [`PYTHON_FAILURE`] says and has no
/// tools, with a long description.
fn failed_python_setup() -> common::Setup {
    let mut setup = named_setup(
        [("memory".to_string(), "server-memory.tools.json")],
        Preload::Auto,
    );
    let py = ServerId::new("py").unwrap();
    let mut empty = catalog("py", Vec::new());
    empty.health.last_sync = None;
    empty.health.last_error = Some(psych_types::SyncFailure {
        at: 1,
        message: PYTHON_FAILURE.into(),
    });
    empty.health.reachability = Reachability::Unreachable {
        reason: PYTHON_FAILURE
            .strip_prefix("MCP server \"py\" is unreachable: ")
            .unwrap()
            .into(),
    };
    setup.catalogs.push(empty);
    setup.connections.push(
        ConnectionSpec::new(py.clone()).with_description(
            "Reports from the data warehouse, refreshed nightly by the ETL jobs.",
        ),
    );
    setup.grant = std::mem::take(&mut setup.grant).allow_server(py);
    setup
}

#[test]
fn a_failed_servers_line_keeps_its_reason_not_its_repeated_prefixes() {
    let setup = failed_python_setup();
    let surface = setup.resolve(&Settings::default());
    let line = &surface.deferred_lines()[0];
    assert_eq!(
        line,
        "py: deferred MCP server, no tools (listing failed: initialize failed: the server \
         process exited with status 1; its last stderr lines: ModuleNotFoundError: No module \
         named 'mcp'). Reports f…[truncated]"
    );
    assert!(line.chars().count() <= psych_disclosure::DEFERRED_LINE_CHARS);
}

#[test]
fn listing_or_calling_a_failed_server_says_why_and_leaks_no_tool() {
    let setup = failed_python_setup();
    let settings = Settings::default();
    let listing = refusal(guard(
        &setup,
        &settings,
        LIST_TOOLS,
        json!({"server": "py"}),
    ));
    let Refusal::NoTools {
        ref server,
        ref state,
    } = listing
    else {
        panic!("{listing:?}")
    };
    assert_eq!(server.as_str(), "py");
    let text = listing.to_string();
    assert!(
        text.starts_with(
            "server py has no tools: listing failed: initialize failed: the server process \
             exited with status 1; its last stderr lines: | Traceback (most recent call last):"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("ModuleNotFoundError: No module named 'mcp'"),
        "{text}"
    );
    assert!(listing.to_output().is_error);
    // Typed, for a caller that shows it otherwise.
    assert_eq!(
        serde_json::to_value(state).unwrap()["state"],
        "listing_failed"
    );
    // Any tool name reads the same: the server's state is said, never whether a tool exists.
    let call = |tool: &str| {
        refusal_text(guard(
            &setup,
            &settings,
            CALL_TOOL,
            json!({"server": "py", "tool": tool, "arguments": {}}),
        ))
    };
    assert_eq!(call("run_report"), text);
    assert_eq!(call("no_such_tool"), text);
    let describe = refusal_text(guard(
        &setup,
        &settings,
        DESCRIBE_TOOL,
        json!({"server": "py", "tool": "run_report"}),
    ));
    assert_eq!(describe, text);
}

#[test]
fn a_tool_with_a_schema_no_provider_takes_is_neither_exposed_nor_called() {
    let schema = |value: Value| match value {
        Value::Object(map) => map,
        _ => panic!("an object"),
    };
    let tool = |name: &str, input: Value| {
        psych_types::ToolDefinition::new(ToolName::new(name).unwrap(), "A tool.", schema(input))
    };
    let mut setup = common::Setup::empty();
    setup.add(
        ConnectionSpec::new(ServerId::new("odd").unwrap()),
        vec![
            tool(
                "good",
                json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            ),
            tool("string_schema", json!({"type": "string"})),
            tool(
                "listed_properties",
                json!({"type": "object", "properties": ["path", "mode"]}),
            ),
        ],
    );
    let settings = Settings::default();
    let surface = setup.resolve(&settings);
    let names: Vec<&str> = surface.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["odd__good", "psych_orientation"]);
    assert_eq!(surface.server("odd").unwrap().permitted, 1);
    // Deferred, its listing and the guard agree with the direct tools.
    let deferred = common::Setup {
        connections: vec![
            ConnectionSpec::new(ServerId::new("odd").unwrap()).with_preload(Preload::Deferred),
        ],
        ..setup
    };
    let Verdict::Answer(Answer::Listing(listing)) =
        guard(&deferred, &settings, LIST_TOOLS, json!({"server": "odd"}))
    else {
        panic!("a listing")
    };
    let listed: Vec<&str> = listing.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(listed, ["good"]);
    let unknown = refusal_text(guard(
        &deferred,
        &settings,
        CALL_TOOL,
        json!({"server": "odd", "tool": "no_such_tool", "arguments": {}}),
    ));
    for bad in ["string_schema", "listed_properties"] {
        let text = refusal_text(guard(
            &deferred,
            &settings,
            CALL_TOOL,
            json!({"server": "odd", "tool": bad, "arguments": {}}),
        ));
        assert_eq!(text, unknown.replace("no_such_tool", bad));
    }
}

#[test]
fn facades_and_search_pairs_describe_without_input_and_call_with_it() {
    let setup = fixture_setup(Preload::Eager);
    let facade = Settings::builder().direct_max_tools(0).build().unwrap();
    let verdict = guard(&setup, &facade, "memory", json!({"tool": "read_graph"}));
    assert!(
        matches!(verdict, Verdict::Answer(Answer::Description(ref d)) if d.tool.as_str() == "read_graph")
    );
    let (target, _) = forwarded(guard(
        &setup,
        &facade,
        "memory",
        json!({"tool": "read_graph", "input": {}}),
    ));
    assert_eq!(target, ToolRef::parse("memory", "read_graph").unwrap());
    let text = refusal_text(guard(
        &setup,
        &facade,
        "memory",
        json!({"tool": "get_me", "input": {}}),
    ));
    assert_eq!(text, "tool \"get_me\" is not available on server memory");
    let text = refusal_text(guard(&setup, &facade, "memory", json!({"input": []})));
    assert!(
        text.contains("/tool: is required") && text.contains("/input: must be an object"),
        "{text}"
    );

    let search = Settings::builder()
        .direct_max_tools(0)
        .facade_max_index_tokens(0)
        .build()
        .unwrap();
    let verdict = guard(
        &setup,
        &search,
        "github__search_tools",
        json!({"query": "merge a pull request"}),
    );
    let Verdict::Answer(Answer::Search(answer)) = verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(answer.hits[0].name.as_str(), "merge_pull_request");
    assert!(answer.hits.len() <= psych_disclosure::SEARCH_HITS);
    let (target, _) = forwarded(guard(
        &setup,
        &search,
        "github__call_tool",
        json!({"tool": "get_me", "input": {}}),
    ));
    assert_eq!(target, ToolRef::parse("github", "get_me").unwrap());
}

#[test]
fn a_weak_search_answer_says_so_and_names_the_closest_servers() {
    let setup = fixture_setup(Preload::Eager);
    let search = Settings::builder()
        .direct_max_tools(0)
        .facade_max_index_tokens(0)
        .build()
        .unwrap();
    let answer = |query: &str| {
        let verdict = guard(
            &setup,
            &search,
            "github__search_tools",
            json!({ "query": query }),
        );
        let Verdict::Answer(Answer::Search(answer)) = verdict else {
            panic!("{verdict:?}")
        };
        answer
    };
    assert_eq!(answer("merge a pull request").note, None);
    // An empty query is refused, as the tool's schema says (`minLength: 1`).
    let text = refusal_text(guard(
        &setup,
        &search,
        "github__search_tools",
        json!({"query": ""}),
    ));
    assert!(text.contains("/query: must not be empty"), "{text}");
    let none = answer("bake a chocolate cake");
    assert!(none.hits.is_empty());
    assert_eq!(
        none.note.as_deref(),
        Some("No tool matches \"bake a chocolate cake\". Try other words.")
    );
    let weak = answer("bake a chocolate cake and navigate to grandma's page");
    let note = weak.note.unwrap();
    assert!(
        note.starts_with("No tool matches") && note.contains("weak matches"),
        "{note}"
    );
    assert!(note.contains("The servers closest to it: "), "{note}");
}

#[test]
fn search_never_shows_a_tool_outside_the_grant() {
    let mut setup = fixture_setup(Preload::Eager);
    setup.grant = PermissionGrant::none()
        .allow_tool(ToolRef::parse("github", "list_issues").unwrap())
        .allow_tool(ToolRef::parse("github", "get_me").unwrap());
    let search = Settings::builder()
        .direct_max_tools(0)
        .facade_max_index_tokens(0)
        .build()
        .unwrap();
    let verdict = guard(
        &setup,
        &search,
        "github__search_tools",
        json!({"query": "merge a pull request issue"}),
    );
    let Verdict::Answer(Answer::Search(answer)) = verdict else {
        panic!("{verdict:?}")
    };
    let names: Vec<_> = answer.hits.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["list_issues", "get_me"]);
}

#[test]
fn orientation_calls_are_routed_with_their_flag() {
    let setup = fixture_setup(Preload::Auto);
    let settings = Settings::default();
    assert_eq!(
        guard(&setup, &settings, ORIENTATION, json!({})),
        Verdict::Orientation { verbose: false }
    );
    assert_eq!(
        guard(&setup, &settings, ORIENTATION, json!({"verbose": true})),
        Verdict::Orientation { verbose: true }
    );
    let text = refusal_text(guard(
        &setup,
        &settings,
        ORIENTATION,
        json!({"verbose": "yes"}),
    ));
    assert!(text.contains("/verbose: must be a boolean"), "{text}");
    let off = Settings::builder().orientation_tool(false).build().unwrap();
    assert_eq!(
        refusal(guard(&setup, &off, ORIENTATION, json!({}))),
        Refusal::UnknownName {
            name: ORIENTATION.into()
        }
    );
}

#[test]
fn eager_tools_of_a_deferred_server_are_direct_and_narrowed() {
    let mut setup = fixture_setup(Preload::Deferred);
    setup.connections[0] = setup.connections[0]
        .clone()
        .with_eager_tool(ToolName::new("get_me").unwrap())
        .with_eager_tool(ToolName::new("delete_repository").unwrap());
    let mut only = PermissionGrant::none();
    for (server, _) in FIXTURES.iter().filter(|(s, _)| *s != "github") {
        only = only.allow_server(ServerId::new(*server).unwrap());
    }
    setup.grant = only.allow_tool(ToolRef::parse("github", "get_me").unwrap());
    let surface = setup.resolve(&Settings::default());
    let github = surface.server("github").unwrap();
    assert_eq!(github.eager, [ToolName::new("get_me").unwrap()]);
    assert!(surface.exposed("github__get_me").is_some());
    assert!(surface.exposed("github__delete_repository").is_none());
    assert!(
        surface.deferred_lines()[1]
            .starts_with("github: deferred MCP server, 1 tool, 1 of them also direct")
    );
}

#[test]
fn a_call_to_an_unreachable_server_says_why_in_one_bounded_line() {
    let mut setup = named_setup(
        [("memory".to_string(), "server-memory.tools.json")],
        Preload::Auto,
    );
    let stderr = "x".repeat(5_000);
    setup.catalogs[0].health.reachability = Reachability::Unreachable {
        reason: format!(
            "MCP server \"memory\": tools/call read_graph failed: the server process was \
             killed by signal 9; its last stderr lines:\n  {stderr}\n  fatal: out of memory"
        ),
    };
    let text = refusal_text(guard(
        &setup,
        &Settings::default(),
        "memory__read_graph",
        json!({}),
    ));
    assert!(
        text.starts_with(
            "unreachable: tools/call read_graph failed: the server process was killed by \
             signal 9; its last stderr lines: | …xxx"
        ),
        "{text}"
    );
    assert!(text.ends_with("xxx | fatal: out of memory"), "{text}");
    assert!(!text.contains('\n'));
    assert_eq!(
        text.chars().count(),
        "unreachable: ".len() + psych_disclosure::STATE_REASON_CHARS
    );
}

#[test]
fn orientation_says_why_a_failed_server_has_no_tools() {
    let setup = failed_python_setup();
    let surface = setup.resolve(&Settings::default());
    let context = psych_disclosure::OrientationContext::default();
    let state = |verbose: bool| {
        let payload = psych_disclosure::orientation(&surface, &setup.live(), &context, verbose);
        let py = payload.servers.iter().find(|s| s.server.as_str() == "py");
        py.unwrap().state.clone()
    };
    let short = state(false);
    assert!(
        short.starts_with(
            "unreachable: initialize failed: the server process exited with status 1; its \
             last stderr lines: | Traceback (most recent call last):"
        ),
        "{short}"
    );
    assert!(short.ends_with("No module named 'mcp'"), "{short}");
    assert_eq!(state(true), short, "short enough to be whole");
    assert!(!short.contains("MCP server"), "{short}");
    // Listed with no error but never reachable: why it has no tools, not "unknown".
    let mut quiet = failed_python_setup();
    quiet.catalogs[1].health.reachability = Reachability::Unknown;
    let surface = quiet.resolve(&Settings::default());
    let payload = psych_disclosure::orientation(&surface, &quiet.live(), &context, false);
    let py = payload
        .servers
        .iter()
        .find(|s| s.server.as_str() == "py")
        .unwrap();
    assert!(
        py.state.starts_with("listing failed: initialize failed"),
        "{}",
        py.state
    );
}

/// Issue 30: the server a call would be forwarded to, named before the guard checks the
/// tool or the arguments (a lazy server's kept listing may be stale), and only for a call of
/// a tool of a permitted server of the Surface.
#[test]
fn call_server_names_where_a_call_goes_whatever_its_tool_and_arguments() {
    let setup = fixture_setup(Preload::Auto);
    let surface = setup.resolve(&Settings::default());
    let live = setup.live();
    let server = |name: &str, args: Value| {
        surface
            .call_server(name, &args, &live)
            .map(|s| s.as_str().to_owned())
    };
    let direct = surface
        .tools()
        .iter()
        .find(|t| t.name.as_str().starts_with("filesystem__"))
        .map(|t| t.name.as_str().to_owned())
        .expect("filesystem's tools are direct");
    assert_eq!(
        server(&direct, json!({"anything": 1})).as_deref(),
        Some("filesystem")
    );
    let call = json!({"server": "github", "tool": "no_such_tool", "arguments": {"x": 1}});
    assert_eq!(server(CALL_TOOL, call).as_deref(), Some("github"));
    // What the guard answers itself, names it refuses, servers not on the Surface.
    assert_eq!(server(LIST_TOOLS, json!({"server": "github"})), None);
    assert_eq!(
        server(DESCRIBE_TOOL, json!({"server": "github", "tool": "x"})),
        None
    );
    assert_eq!(server(ORIENTATION, json!({})), None);
    assert_eq!(server("no_such_name", json!({})), None);
    assert_eq!(
        server(CALL_TOOL, json!({"server": "nowhere", "tool": "x"})),
        None
    );
    assert_eq!(server(CALL_TOOL, json!({"tool": "x"})), None);
    // A server the grant no longer permits.
    let narrowed = PermissionGrant::none().allow_server(ServerId::new("notion").unwrap());
    let live = psych_disclosure::Live {
        grant: &narrowed,
        catalogs: &setup.catalogs,
    };
    let call = json!({"server": "github", "tool": "get_issue", "arguments": {}});
    assert_eq!(surface.call_server(CALL_TOOL, &call, &live), None);
    // A tool outside a narrowed grant starts nothing; one inside it does.
    let one_tool =
        PermissionGrant::none().allow_tool(ToolRef::parse("github", "get_issue").unwrap());
    let live = psych_disclosure::Live {
        grant: &one_tool,
        catalogs: &setup.catalogs,
    };
    assert_eq!(
        surface
            .call_server(CALL_TOOL, &call, &live)
            .map(|s| s.as_str().to_owned()),
        Some("github".to_owned())
    );
    let other = json!({"server": "github", "tool": "create_issue", "arguments": {}});
    assert_eq!(surface.call_server(CALL_TOOL, &other, &live), None);
}
