//! psych-mcp against real server processes: the workspace's `psych-test-server` over stdio
//! and streamable HTTP (loopback), plus shells that misbehave. Every fault the manager must
//! survive is here, with short deadlines so the suite takes seconds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use psych_mcp::{
    Backoff, ChangeCause, McpConfig, McpError, McpEvent, McpEvents, McpManager, ServerConfig,
    Timeouts, Transport,
};
use psych_types::{
    ConnectionSpec, JsonObject, ProgressSink, Reachability, ServerId, ToolHost, ToolLister, ToolRef,
};
use serde_json::{Value, json};

use crate::mcp_common::{HttpServer, SERVER};

/// How many control tools the test server lists before its generated ones.
const CONTROL_TOOLS: usize = 17;

fn id(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

fn stdio_config(name: &str, command: &str, args: &[&str]) -> ServerConfig {
    ServerConfig {
        transport: Transport::Stdio {
            command: command.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        },
        connection: ConnectionSpec::new(id(name)),
        extra: JsonObject::new(),
    }
}

fn test_server(name: &str, args: &[&str]) -> ServerConfig {
    stdio_config(name, SERVER, args)
}

fn fast() -> Timeouts {
    Timeouts::uniform(Duration::from_secs(5))
        .with_call(Duration::from_secs(3))
        .with_shutdown_grace(Duration::from_millis(500))
}

fn manager(timeouts: Timeouts) -> McpManager {
    manager_with(timeouts, Duration::from_millis(50))
}

fn manager_with(timeouts: Timeouts, first_backoff: Duration) -> McpManager {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    McpManager::builder(config)
        .timeouts(timeouts)
        .backoff(Backoff::new(first_backoff, first_backoff * 4))
        .build()
        .unwrap()
}

/// A manager with one connected server.
async fn one(name: &str, config: ServerConfig, timeouts: Timeouts) -> (McpManager, Reachability) {
    let manager = manager(timeouts);
    let reachability = manager.add_server(id(name), config).await.unwrap();
    (manager, reachability)
}

/// A manager with one connected server, and a subscriber to its events from before it was
/// added (so the first connection's events are in it).
async fn subscribed(
    name: &str,
    config: ServerConfig,
    timeouts: Timeouts,
) -> (McpManager, McpEvents, Reachability) {
    let manager = manager(timeouts);
    let events = manager.events();
    let reachability = manager.add_server(id(name), config).await.unwrap();
    (manager, events, reachability)
}

fn tool(server: &str, name: &str) -> ToolRef {
    ToolRef::parse(server, name).unwrap()
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => panic!("not an object"),
    }
}

fn texts(result: &psych_mcp::rmcp::model::CallToolResult) -> Vec<String> {
    serde_json::to_value(&result.content)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|block| block["text"].as_str().map(str::to_owned))
        .collect()
}

/// Waits for an event matching `want`, skipping others (generously: the deadline only
/// decides how long a failing test takes, and a loaded machine is slow to start servers).
async fn expect_event(events: &McpEvents, want: impl Fn(&McpEvent) -> bool) -> McpEvent {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let event = events.next().await;
            if want(&event) {
                return event;
            }
        }
    })
    .await
    .expect("the event did not come")
}

/// Processes of a process group that are still alive (not zombies), from /proc.
fn live_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command name in parentheses: state, ppid, pgrp, …
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            members.push(pid);
        }
    }
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_follows_every_page_to_the_end_in_order() {
    let (manager, reachability) = one(
        "pages",
        test_server("pages", &["--tools", "95", "--page-size", "10"]),
        fast(),
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    let tools = manager.list_tools(&id("pages")).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), CONTROL_TOOLS + 95);
    assert_eq!(&names[..3], ["echo", "add_tool", "remove_tool"]);
    let generated: Vec<_> = psych_test_server::synthetic_tools(95);
    assert_eq!(
        &tools[CONTROL_TOOLS..],
        &generated[..],
        "every generated tool, whole and in order"
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_tool_does_not_fail_the_listing() {
    let (manager, reachability) = one(
        "bad",
        test_server("bad", &["--malformed", "--page-size", "5"]),
        fast(),
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    let listing = manager.list(&id("bad")).await.unwrap();
    assert_eq!(
        listing.tools.len(),
        CONTROL_TOOLS,
        "every good tool is kept"
    );
    let refused: Vec<(&str, usize)> = listing
        .malformed
        .iter()
        .map(|m| (m.name.as_str(), m.page))
        .collect();
    assert_eq!(refused, [("malformed_no_schema", 4), ("malformed name", 4)]);
    assert!(
        listing.malformed[0].reason.contains("inputSchema"),
        "{:?}",
        listing.malformed
    );
    assert_eq!(manager.malformed_tools(&id("bad")), listing.malformed);
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_arrives_after_a_tool_is_added_and_removed() {
    let (manager, events, _) = subscribed("live", test_server("live", &[]), fast()).await;
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Connected,
                ..
            }
        )
    })
    .await;
    manager
        .call_tool_raw(
            &tool("live", "add_tool"),
            args(json!({"name": "fresh_tool"})),
        )
        .await
        .unwrap();
    let event = expect_event(&events, |e| matches!(e, McpEvent::ToolsChanged { .. })).await;
    assert_eq!(
        event,
        McpEvent::ToolsChanged {
            server: id("live"),
            cause: ChangeCause::Notified
        }
    );
    let tools = manager.list_tools(&id("live")).await.unwrap();
    assert!(tools.iter().any(|t| t.name.as_str() == "fresh_tool"));
    let result = manager
        .call_tool_raw(&tool("live", "fresh_tool"), args(json!({"x": 1})))
        .await
        .unwrap();
    assert_eq!(texts(&result), ["fresh_tool called with {\"x\":1}"]);

    manager
        .call_tool_raw(
            &tool("live", "remove_tool"),
            args(json!({"name": "fresh_tool"})),
        )
        .await
        .unwrap();
    expect_event(&events, |e| matches!(e, McpEvent::ToolsChanged { .. })).await;
    let tools = manager.list_tools(&id("live")).await.unwrap();
    assert!(!tools.iter().any(|t| t.name.as_str() == "fresh_tool"));
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_changed_before_the_initialize_response_is_covered_by_the_first_listing() {
    // rmcp drops this notification (it arrives before initialization completes), so the
    // manager always lists once after connecting and announces it as `Connected`.
    let (manager, events, reachability) = subscribed(
        "early",
        test_server("early", &["--early-list-changed", "--tools", "3"]),
        fast(),
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Connected,
                ..
            }
        )
    })
    .await;
    let tools = manager.list_tools(&id("early")).await.unwrap();
    assert_eq!(tools.len(), CONTROL_TOOLS + 3);
    assert_eq!(tools[CONTROL_TOOLS].name.as_str(), "list_customers");
    manager.shutdown().await;
}

/// Eight calls at once, each held by the server until all eight have arrived (the `sleep`
/// tool's `barrier`): calls sent one after another would never be answered, so every
/// answer shows that they were all in flight together, however slow the machine. The call
/// deadline only bounds how long a failing test takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_all_answered_each_with_its_own_result() {
    let timeouts = fast().with_call(Duration::from_secs(20));
    let (manager, _) = one("many", test_server("many", &[]), timeouts).await;
    let calls: Vec<_> = (0..8u64)
        .map(|i| {
            let manager = manager.clone();
            tokio::spawn(async move {
                // Later calls finish first: answers come back out of order.
                let arguments = args(json!({
                    "ms": 400 - i * 40,
                    "tag": format!("call {i}"),
                    "barrier": 8,
                }));
                manager
                    .call_tool_raw(&tool("many", "sleep"), arguments)
                    .await
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let result = call.await.unwrap().unwrap();
        assert_eq!(texts(&result), [format!("call {i}")]);
    }
    manager.shutdown().await;
}

/// Issue 27's limit on deadlines: the call deadline covered the whole transfer, so a large
/// answer over a slow link timed out while it arrived. Once an answer is arriving the call
/// deadline is one for silence, up to `Timeouts::transfer` from the call's start: 10 MiB
/// written a MiB every 300 ms (about 3 s) arrives whole under a 2 s call deadline; an answer
/// with pauses longer than the deadline times out (silence), and so does a steady one that
/// would outlast the transfer ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_still_arriving_is_waited_for_but_silence_and_the_ceiling_are_not() {
    use psych_test_server::{huge_end, huge_lines};
    let call = Duration::from_secs(2);
    let timeouts = fast()
        .with_call(call)
        .with_transfer(Duration::from_secs(60));
    let (manager, reachability) = one("slow", test_server("slow", &[]), timeouts).await;
    assert_eq!(reachability, Reachability::Reachable);
    let huge = tool("slow", "raw_huge");
    let started = std::time::Instant::now();
    let result = manager
        .call_tool_raw(&huge, args(json!({"mib": 10, "pause_ms": 300})))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took > call,
        "not slower than the deadline, so it tests nothing: {took:?}"
    );
    let text = texts(&result).concat();
    let end = huge_end(huge_lines(10));
    assert_eq!(text.len() as u64, huge_lines(10) * 64 + end.len() as u64);
    assert!(text.ends_with(&end));

    // Silence longer than the deadline after the first MiB: the call ends at the deadline
    // counted from the last bytes read.
    let error = manager
        .call_tool_raw(&huge, args(json!({"mib": 3, "pause_ms": 6_000})))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Timeout { call: name, after, .. }
            if name == "tools/call raw_huge" && *after >= call
                && *after < Duration::from_secs(6)),
        "{error}"
    );
    manager.shutdown().await;

    // A steady answer that would take longer than the transfer ceiling ends at it.
    let timeouts = fast()
        .with_call(call)
        .with_transfer(Duration::from_millis(3_500));
    let (manager, _) = one("slow", test_server("slow", &[]), timeouts).await;
    let error = manager
        .call_tool_raw(&huge, args(json!({"mib": 30, "pause_ms": 300})))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Timeout { after, .. } if *after == Duration::from_millis(3_500)),
        "{error}"
    );
    manager.shutdown().await;
}

/// Issue 27: what answers too large for memory hold on disk is bounded across calls. With a
/// budget of 70 MiB and a 30 MiB result held (not yet logged), a 45 MiB answer is refused
/// while it arrives (its line), and another 30 MiB one when its text is split off (file and
/// text together): each fails at once with the typed error, and the connection goes on.
/// Once the held result is dropped, its bytes are back and the next one arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_past_the_spill_budget_fail_their_calls_and_the_connection_goes_on() {
    const MIB: u64 = 1024 * 1024;
    let budget = psych_mcp::SpillBudget::new(70 * MIB);
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .timeouts(fast().with_transfer(Duration::from_secs(60)))
        .spill_budget(budget.clone())
        .build()
        .unwrap();
    let reachability = manager
        .add_server(id("big"), test_server("big", &[]))
        .await
        .unwrap();
    assert_eq!(reachability, Reachability::Reachable);
    let huge = tool("big", "raw_huge");
    let held = manager
        .call_tool(&huge, args(json!({"mib": 30})))
        .await
        .unwrap();
    assert_eq!(held.spilled.len(), 1);
    let text = held.spilled[0].text.len();
    assert_eq!(budget.in_use(), text, "the held result's text, exactly");

    for (mib, when) in [(45, "while it arrives"), (30, "when its text is split off")] {
        let started = std::time::Instant::now();
        let error = manager
            .call_tool(&huge, args(json!({"mib": mib})))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, McpError::SpillBudget { call, bytes, held, others, limit, .. }
                if call == "tools/call raw_huge" && *bytes >= mib * MIB && *held > 0
                    && *others == text && *limit == 70 * MIB),
            "{mib} MiB, refused {when}: {error:?}"
        );
        assert!(
            error.to_string().contains("spill budget of 73400320 bytes"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "at once");
        assert_eq!(
            budget.in_use(),
            text,
            "{mib} MiB: the refused answer holds nothing"
        );
        let echoed = manager
            .call_tool_raw(&tool("big", "echo"), args(json!({"text": "still here"})))
            .await
            .unwrap();
        assert_eq!(texts(&echoed), ["still here"]);
    }

    drop(held);
    assert_eq!(budget.in_use(), 0);
    let again = manager
        .call_tool(&huge, args(json!({"mib": 30})))
        .await
        .unwrap();
    assert_eq!(again.spilled[0].text.len(), text);
    drop(again);
    assert_eq!(budget.in_use(), 0);
    manager.shutdown().await;
}

/// How many calls the test server `server` counted as cancelled, once it counted `want`
/// (up to 10 s: a loaded machine's server may take a while to count one), or what it
/// counted by then.
async fn cancellations(manager: &McpManager, server: &str, want: u64) -> u64 {
    let mut seen = 0;
    for _ in 0..200 {
        let result = manager
            .call_tool_raw(&tool(server, "cancellations"), JsonObject::new())
            .await
            .unwrap();
        seen = texts(&result).concat().parse().unwrap();
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_cancelled_and_the_connection_stays_usable() {
    let timeouts = fast().with_call(Duration::from_millis(300));
    // `--announce-hang`: a `hang` call given a progress token first reports progress 0, so
    // the test knows it arrived.
    let (manager, _) = one("slow", test_server("slow", &["--announce-hang"]), timeouts).await;
    let error = manager
        .call_tool_raw(&tool("slow", "hang"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Timeout { call, after, .. }
            if call == "tools/call hang" && *after == Duration::from_millis(300)),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "MCP server \"slow\": tools/call hang got no answer within 300ms"
    );
    // The server saw the cancellation (it counts them), and still answers.
    assert_eq!(
        cancellations(&manager, "slow", 1).await,
        1,
        "the server never saw notifications/cancelled"
    );

    // A caller that gives up (drops the call) cancels it too: dropped once the server said
    // the call arrived, so it is the server's call that is cancelled, however slowly the
    // call got there.
    let (arrived, mut announced) = tokio::sync::mpsc::unbounded_channel();
    let sink = ProgressSink::new(move |_| {
        let _ = arrived.send(());
    });
    let hang = tool("slow", "hang");
    let call = ToolHost::call_tool_with_progress(&manager, &hang, JsonObject::new(), sink);
    tokio::select! {
        answer = call => panic!("hang never answers, yet: {answer:?}"),
        heard = tokio::time::timeout(Duration::from_secs(30), announced.recv()) => {
            heard.expect("the server announces the hanging call");
        }
    }
    assert_eq!(
        cancellations(&manager, "slow", 2).await,
        2,
        "dropping the call did not cancel it"
    );
    assert_eq!(
        manager.reachability(&id("slow")),
        Some(Reachability::Reachable)
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_every_kind_come_back_whole() {
    let (manager, _) = one("kinds", test_server("kinds", &[]), fast()).await;
    let call = |name: &'static str, arguments: Value| {
        let manager = manager.clone();
        async move {
            let result = manager
                .call_tool_raw(&tool("kinds", name), args(arguments))
                .await
                .unwrap();
            serde_json::to_value(result).unwrap()
        }
    };
    let large = call("large", json!({"bytes": 3_000_000})).await;
    assert_eq!(
        large["content"][0]["text"].as_str().unwrap(),
        psych_test_server::large_text(3_000_000)
    );

    let mixed = call("mixed", json!({})).await;
    let kinds: Vec<&str> = mixed["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["text", "image", "text"]);
    assert_eq!(mixed["content"][1]["mimeType"], "image/png");
    let png = binary_data(&mixed["content"][1]);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));

    let structured = call("structured", json!({})).await;
    assert_eq!(structured["structuredContent"]["unit"], "celsius");

    let binary = call("binary", json!({})).await;
    let resource = &binary["content"][0]["resource"];
    assert_eq!(resource["mimeType"], "application/octet-stream");
    let bytes = binary_data(&binary["content"][0]);
    assert_eq!(bytes.len(), 259);
    assert_eq!(&bytes[..3], [0, 1, 2]);

    let failed = call("fail", json!({"message": "disk full"})).await;
    assert_eq!(failed["isError"], true);
    assert_eq!(failed["content"][0]["text"], "disk full");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_host_maps_every_block_and_field_of_a_result() {
    let (manager, _) = one("host", test_server("host", &[]), fast()).await;
    let host = |name: &'static str, arguments: Value| {
        let manager = manager.clone();
        async move {
            manager
                .call_tool(&tool("host", name), args(arguments))
                .await
                .unwrap()
        }
    };

    // What rmcp would drop (an unknown block type, unknown fields) comes back whole.
    let exotic = host("exotic", json!({})).await;
    assert_eq!(
        serde_json::to_value(&exotic).unwrap(),
        psych_test_server::exotic_result()
    );
    assert!(matches!(
        &exotic.content[1],
        psych_types::ContentBlock::Unknown(block) if block["type"] == "widget"
    ));
    assert_eq!(exotic.content.len(), 5);
    let known = host("exotic", json!({"known_only": true})).await;
    assert_eq!(
        serde_json::to_value(&known).unwrap(),
        psych_test_server::exotic_known_result()
    );
    let typed = manager
        .call_tool_raw(&tool("host", "exotic"), JsonObject::new())
        .await;
    assert!(
        typed.is_err_and(|e| e.to_string().contains("not a tools/call result")),
        "rmcp's typed result cannot read an unknown block type"
    );

    // The test server's kinds, each equal to the same call as rmcp's typed result.
    for (name, arguments) in [
        ("mixed", json!({})),
        ("structured", json!({})),
        ("binary", json!({})),
        ("fail", json!({"message": "disk full"})),
        ("large", json!({"bytes": 200_000})),
    ] {
        let output = host(name, arguments.clone()).await;
        let typed = manager
            .call_tool_raw(&tool("host", name), args(arguments))
            .await
            .unwrap();
        let mut typed = serde_json::to_value(&typed).unwrap();
        // `isError: false` is MCP's default; `ToolOutput` leaves it out, as the server may.
        if typed["isError"] == false {
            typed.as_object_mut().unwrap().remove("isError");
        }
        assert_eq!(serde_json::to_value(&output).unwrap(), typed, "{name}");
        assert_eq!(output.is_error, name == "fail", "{name}");
    }
    let mixed = host("mixed", json!({})).await;
    assert_eq!(mixed.content.len(), 3);
    assert!(
        matches!(&mixed.content[1], psych_types::ContentBlock::Image(image)
        if image.mime_type == "image/png")
    );

    // A connection failure is `Err`, not a failed result.
    let crashed = manager
        .call_tool(&tool("host", "crash"), JsonObject::new())
        .await;
    assert!(
        matches!(crashed, Err(McpError::Exited { .. })),
        "{crashed:?}"
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_at_once_is_reported_with_its_status_and_stderr() {
    let config = test_server(
        "quits",
        &[
            "--stderr-banner",
            "fatal: no API key in QUITS_TOKEN",
            "--exit-at-once",
            "3",
        ],
    );
    let (manager, reachability) = one("quits", config, fast()).await;
    let Reachability::Unreachable { reason } = reachability else {
        panic!("{reachability:?}");
    };
    assert!(
        reason.starts_with("MCP server \"quits\": initialize failed: the server process exited with status 3; its last stderr lines:"),
        "{reason}"
    );
    assert!(
        reason.contains("\n  fatal: no API key in QUITS_TOKEN"),
        "{reason}"
    );
    let error = manager
        .call_tool_raw(&tool("quits", "echo"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(matches!(error, McpError::Unreachable { .. }), "{error}");
    assert!(error.to_string().contains("fatal: no API key"), "{error}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_command_is_reported_and_other_servers_keep_working() {
    let manager = manager(fast());
    let missing = manager
        .add_server(
            id("missing"),
            stdio_config("missing", "/nonexistent/psych-no-such-server", &[]),
        )
        .await
        .unwrap();
    let good = manager
        .add_server(id("good"), test_server("good", &[]))
        .await
        .unwrap();
    let Reachability::Unreachable { reason } = missing else {
        panic!("{missing:?}");
    };
    assert!(
        reason.starts_with(
            "MCP server \"missing\": cannot start \"/nonexistent/psych-no-such-server\": No such file"
        ),
        "{reason}"
    );
    assert_eq!(good, Reachability::Reachable);
    let result = manager
        .call_tool_raw(&tool("good", "echo"), args(json!({"text": "still here"})))
        .await
        .unwrap();
    assert_eq!(texts(&result), ["still here"]);
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_call_is_reported_then_the_server_is_reconnected() {
    // Subscribed before the server is added, so every event of it is seen; the queue
    // keeps an outage even when the reconnect comes before the test reads it. The backoff
    // only has to outlast the few steps between the Unreachable event and the call below
    // that must find the server down.
    let manager = manager_with(fast(), Duration::from_secs(2));
    let events = manager.events();
    let reachability = manager
        .add_server(id("crashy"), test_server("crashy", &[]))
        .await
        .unwrap();
    assert_eq!(reachability, Reachability::Reachable);
    expect_event(&events, |e| matches!(e, McpEvent::ToolsChanged { .. })).await;
    let error = manager
        .call_tool_raw(&tool("crashy", "crash"), JsonObject::new())
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "MCP server \"crashy\": tools/call crash failed: the server process exited with status 70; \
         its last stderr lines:\n  psych-test-server: crashing on request"
    );
    expect_event(&events, |e| {
        matches!(e, McpEvent::Reachability { reachability: Reachability::Unreachable { reason }, .. }
            if reason.contains("exited with status 70"))
    })
    .await;
    let error = manager
        .call_tool_raw(&tool("crashy", "echo"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with(
            "MCP server \"crashy\" is unreachable: the server process exited with status 70"
        ),
        "{error}"
    );
    // Reconnected after the backoff, and announced so the catalogue resyncs.
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Connected,
                ..
            }
        )
    })
    .await;
    let result = manager
        .call_tool_raw(&tool("crashy", "echo"), args(json!({"text": "back"})))
        .await
        .unwrap();
    assert_eq!(texts(&result), ["back"]);
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_initialize_times_out() {
    let timeouts = fast().with_connect(Duration::from_millis(400));
    let config = test_server(
        "mute",
        &[
            "--hang-initialize",
            "--stderr-banner",
            "waiting for a license server",
        ],
    );
    let (manager, reachability) = one("mute", config, timeouts).await;
    let Reachability::Unreachable { reason } = reachability else {
        panic!("{reachability:?}");
    };
    // The connect deadline covers the process's start, and the reason quotes the stderr
    // lines read when it fell (whole lines only): on a loaded machine the server may not
    // have written its banner by then, or the manager not read it. Either way the reason
    // names the server, the call and the deadline, and quotes no more than the banner.
    let timed_out = "MCP server \"mute\": initialize got no answer within 400ms";
    let with_banner =
        format!("{timed_out}; its last stderr lines:\n  waiting for a license server");
    assert!(reason == timed_out || reason == with_banner, "{reason}");
    manager.shutdown().await;
}

/// Waits until the manager has a slot for `server` (its first attempt may be under way).
async fn until_added(manager: &McpManager, server: &str) {
    while !manager.servers().contains(&id(server)) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A call or listing made while a server's first connection attempt is under way (psych
/// serve connects in the background and answers from a kept listing meanwhile) waits for
/// that attempt: it reaches a server slow to start, and gets the reason of one that never
/// answers, never "not connected yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_during_the_first_connection_attempt_waits_for_it() {
    let manager = manager(fast().with_connect(Duration::from_secs(3)));
    let adding = |name: &'static str, args: &'static [&'static str]| {
        let manager = manager.clone();
        tokio::spawn(async move { manager.add_server(id(name), test_server(name, args)).await })
    };
    let slow = adding("slow", &["--initialize-delay-ms", "700"]);
    let mute = adding("mute", &["--hang-initialize"]);
    until_added(&manager, "slow").await;
    until_added(&manager, "mute").await;
    // The attempts are under way (the slow one answers after 700 ms, the mute one never).
    assert_eq!(manager.is_running(&id("slow")), Some(false));
    let (echo, never, slow_id) = (tool("slow", "echo"), tool("mute", "echo"), id("slow"));
    let (called, listed, refused) = tokio::join!(
        manager.call_tool_raw(&echo, args(json!({"text": "waited"}))),
        manager.list(&slow_id),
        manager.call_tool_raw(&never, args(json!({"text": "never"}))),
    );
    assert_eq!(texts(&called.unwrap()), ["waited"]);
    assert!(
        listed
            .unwrap()
            .tools
            .iter()
            .any(|t| t.name.as_str() == "echo")
    );
    let McpError::Unreachable { server, reason } = refused.unwrap_err() else {
        panic!("not unreachable");
    };
    assert_eq!(server, id("mute"));
    assert!(
        reason.starts_with("MCP server \"mute\": initialize got no answer within 3s"),
        "{reason}"
    );
    assert_eq!(slow.await.unwrap().unwrap(), Reachability::Reachable);
    assert!(matches!(
        mute.await.unwrap().unwrap(),
        Reachability::Unreachable { .. }
    ));
    // Later, between reconnection attempts, a call to the unreachable one fails at once:
    // within 2 s, where waiting for an attempt would take its 3 s connect deadline (the
    // slack is for a loaded machine, not for the code).
    let started = std::time::Instant::now();
    let again = manager
        .call_tool_raw(&tool("mute", "echo"), JsonObject::new())
        .await;
    assert!(
        matches!(again, Err(McpError::Unreachable { .. })),
        "{again:?}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    manager.shutdown().await;
}

/// A first attempt whose adder was dropped (an `add_server` under a timeout) still releases
/// the requests that come after it: the attempt is marked made with no one waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_nobody_waited_for_still_releases_later_requests() {
    let manager = manager(fast());
    let events = manager.events();
    let config = test_server("slow", &["--initialize-delay-ms", "300"]);
    let added = tokio::time::timeout(
        Duration::from_millis(50),
        manager.add_server(id("slow"), config),
    )
    .await;
    assert!(added.is_err(), "the adder was not dropped mid-attempt");
    expect_event(&events, |event| {
        matches!(
            event,
            McpEvent::Reachability {
                reachability: Reachability::Reachable,
                ..
            }
        )
    })
    .await;
    let called = tokio::time::timeout(
        Duration::from_secs(5),
        manager.call_tool_raw(&tool("slow", "echo"), args(json!({"text": "released"}))),
    )
    .await
    .expect("the call waits for an attempt already made");
    assert_eq!(texts(&called.unwrap()), ["released"]);
    manager.shutdown().await;
}

/// A request waiting for a first connection attempt is released when its server is
/// removed (unknown now) or replaced (the new one answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_first_attempt_follows_a_removal_or_replacement() {
    let manager = manager(Timeouts::uniform(Duration::from_secs(30)));
    let add = |name: &'static str, args: &'static [&'static str]| {
        let manager = manager.clone();
        tokio::spawn(async move { manager.add_server(id(name), test_server(name, args)).await })
    };
    // Each call is polled once before it is left to run: the way from a call to its wait
    // for the first attempt does not await, so a call still pending after its first poll
    // is waiting, and the removal and replacement below find both waiting.
    let call = |name: &'static str| {
        let manager = manager.clone();
        let (polled, first) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let echo = tool(name, "echo");
            let mut call =
                std::pin::pin!(manager.call_tool_raw(&echo, args(json!({"text": name}))));
            let pending = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
            })
            .await;
            let _ = polled.send(pending);
            call.await
        });
        (task, first)
    };
    let _gone = add("gone", &["--hang-initialize"]);
    let _stuck = add("swapped", &["--hang-initialize"]);
    until_added(&manager, "gone").await;
    until_added(&manager, "swapped").await;
    let ((to_gone, gone_waits), (to_swapped, swapped_waits)) = (call("gone"), call("swapped"));
    assert!(
        gone_waits.await.unwrap() && swapped_waits.await.unwrap(),
        "a call did not wait"
    );
    manager.remove_server(&id("gone")).await;
    let replaced = add("swapped", &[]).await.unwrap().unwrap();
    assert_eq!(replaced, Reachability::Reachable);
    let within = |task| tokio::time::timeout(Duration::from_secs(10), task);
    let gone = within(to_gone).await.expect("released").unwrap();
    assert!(
        matches!(&gone, Err(McpError::UnknownServer { server }) if *server == id("gone")),
        "{gone:?}"
    );
    let swapped = within(to_swapped).await.expect("released").unwrap();
    assert_eq!(texts(&swapped.unwrap()), ["swapped"]);
    manager.shutdown().await;
}

/// A request waiting for a first connection attempt is released by shutdown, with
/// [`McpError::ShutDown`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_a_request_waiting_for_a_first_attempt() {
    let manager = manager(Timeouts::uniform(Duration::from_secs(30)));
    let adding = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let config = test_server("stuck", &["--hang-initialize"]);
            manager.add_server(id("stuck"), config).await
        })
    };
    until_added(&manager, "stuck").await;
    let calling = {
        let manager = manager.clone();
        tokio::spawn(async move {
            manager
                .call_tool_raw(&tool("stuck", "echo"), JsonObject::new())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!calling.is_finished(), "the call did not wait");
    manager.shutdown().await;
    let called = tokio::time::timeout(Duration::from_secs(3), calling)
        .await
        .expect("the call still waits after shutdown")
        .unwrap();
    assert!(matches!(called, Err(McpError::ShutDown)), "{called:?}");
    let _ = adding.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_hangs_or_loops_on_its_cursor_fails_with_the_reason() {
    let timeouts = fast().with_listing(Duration::from_millis(300), Duration::from_secs(1));
    let (manager, reachability) =
        one("hangs", test_server("hangs", &["--hang-listing"]), timeouts).await;
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"hangs\": tools/list page 1 got no answer within 300ms".into()
        }
    );
    let (loops, reachability) = one(
        "loops",
        test_server("loops", &["--repeat-cursor", "--page-size", "5"]),
        fast(),
    )
    .await;
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"loops\": tools/list page 2 repeats the cursor \"1\"".into()
        }
    );
    manager.shutdown().await;
    loops.shutdown().await;
}

/// A listing its caller drops while a page is unanswered (a freshener's own deadline, a
/// shutdown) tells the server, as a dropped call does, rather than leaving it working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_dropped_while_it_waits_is_cancelled_on_the_server() {
    // The first listing (the connect's) is answered; the next is not.
    let (manager, reachability) = one(
        "slow",
        test_server("slow", &["--hang-listing-after", "1"]),
        fast(),
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    let dropped = tokio::time::timeout(Duration::from_millis(300), manager.list(&id("slow"))).await;
    assert!(dropped.is_err(), "the listing was answered: {dropped:?}");
    assert_eq!(
        cancellations(&manager, "slow", 1).await,
        1,
        "the server never saw the listing cancelled"
    );
    manager.shutdown().await;
}

/// A listing that never ends, or whose cursor is huge, fails at the page that passed its
/// bound, naming it, rather than growing until the listing deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_past_its_bounds_fails_at_the_page_that_passed_them() {
    // Pages are followed long enough to pass a bound, never up to the deadline.
    let timeouts = fast().with_listing(Duration::from_secs(5), Duration::from_secs(120));
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let small = McpManager::builder(config)
        .timeouts(timeouts)
        .max_listing_bytes(200_000)
        .build()
        .unwrap();
    let reachability = small
        .add_server(
            id("endless"),
            test_server("endless", &["--endless-listing"]),
        )
        .await
        .unwrap();
    let Reachability::Unreachable { reason } = reachability else {
        panic!("an endless listing was taken: {reachability:?}");
    };
    // Counted to the tool that passed the limit: at most one page past it.
    let bytes: u64 = reason
        .strip_prefix("MCP server \"endless\": tools/list stopped at page ")
        .and_then(|rest| rest.split_once(": the listing holds about "))
        .and_then(|(_, rest)| rest.strip_suffix(" bytes, over its limit of 200000"))
        .and_then(|bytes| bytes.parse().ok())
        .unwrap_or_else(|| panic!("{reason}"));
    assert!((200_001..300_000).contains(&bytes), "{reason}");
    small.shutdown().await;

    let (long, reachability) = one(
        "long",
        test_server("long", &["--cursor-bytes", "5000", "--page-size", "3"]),
        timeouts,
    )
    .await;
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"long\": tools/list stopped at page 1: its nextCursor is \
                     5000 bytes long, over the limit of 4096"
                .into()
        }
    );
    long.shutdown().await;
    // A cursor at the limit is followed.
    let (fits, reachability) = one(
        "fits",
        test_server("fits", &["--cursor-bytes", "4096", "--page-size", "3"]),
        timeouts,
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    assert!(fits.list_tools(&id("fits")).await.unwrap().len() > 3);
    fits.shutdown().await;

    // Small pages forever: the page bound ends it (10,000 pages of one tool, each well
    // within the byte limit).
    let (pages, reachability) = one(
        "pages",
        test_server("pages", &["--endless-listing", "--page-size", "1"]),
        timeouts,
    )
    .await;
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"pages\": tools/list stopped at page 10000: the listing \
                     goes on past 10000 pages"
                .into()
        }
    );
    pages.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_stdout_is_skipped_and_quoted_when_nothing_else_comes() {
    let (manager, reachability) = one(
        "noisy",
        test_server("noisy", &["--garbage-at-start", "3"]),
        fast(),
    )
    .await;
    assert_eq!(reachability, Reachability::Reachable);
    manager
        .call_tool_raw(&tool("noisy", "garbage"), args(json!({"lines": 5})))
        .await
        .unwrap();
    let result = manager
        .call_tool_raw(&tool("noisy", "echo"), args(json!({"text": "fine"})))
        .await
        .unwrap();
    assert_eq!(texts(&result), ["fine"]);
    manager.shutdown().await;

    // A program that is not an MCP server at all.
    let timeouts = fast().with_connect(Duration::from_millis(500));
    let shell = stdio_config(
        "shell",
        "sh",
        &["-c", "echo 'Welcome to my tool v1.2'; sleep 30"],
    );
    let (manager, reachability) = one("shell", shell, timeouts).await;
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"shell\": initialize got no answer within 500ms; its last stderr \
                     lines:\n  (1 line(s) on stdout were not JSON-RPC; the last: \"Welcome to my tool v1.2\")"
                .into()
        }
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_process_of_the_group_behind() {
    let (manager, _) = one("tree", test_server("tree", &["--grandchild"]), fast()).await;
    let pgid = manager.process_group(&id("tree")).unwrap();
    // The server and its `sleep 600` grandchild.
    let mut members = live_members(pgid);
    for _ in 0..50 {
        if members.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        members = live_members(pgid);
    }
    assert!(members.len() >= 2, "{members:?}");
    manager.shutdown().await;
    let mut left = live_members(pgid);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = live_members(pgid);
    }
    assert_eq!(left, Vec::<i32>::new(), "orphans of group {pgid}");
    let error = manager
        .call_tool_raw(&tool("tree", "echo"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(matches!(error, McpError::ShutDown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_dropped_without_shutdown_still_kills_its_groups() {
    let (manager, _) = one("dropped", test_server("dropped", &["--grandchild"]), fast()).await;
    let pgid = manager.process_group(&id("dropped")).unwrap();
    drop(manager);
    let mut left = live_members(pgid);
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = live_members(pgid);
    }
    assert_eq!(left, Vec::<i32>::new(), "orphans of group {pgid}");
}

fn http_config(name: &str, url: &str) -> ServerConfig {
    ServerConfig {
        transport: Transport::Http {
            url: url.to_owned(),
            headers: BTreeMap::from([("Authorization".to_owned(), "Bearer test".to_owned())]),
        },
        connection: ConnectionSpec::new(id(name)),
        extra: JsonObject::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_listing_calls_and_list_changed_work_and_a_gone_server_is_reported() {
    let mut server = HttpServer::start(&["--tools", "30", "--page-size", "7"]);
    let (manager, events, reachability) =
        subscribed("web", http_config("web", &server.url), fast()).await;
    assert_eq!(reachability, Reachability::Reachable);
    let tools = manager.list_tools(&id("web")).await.unwrap();
    assert_eq!(tools.len(), CONTROL_TOOLS + 30);
    assert_eq!(
        &tools[CONTROL_TOOLS..],
        &psych_test_server::synthetic_tools(30)[..]
    );

    let result = manager
        .call_tool_raw(&tool("web", "mixed"), JsonObject::new())
        .await
        .unwrap();
    assert_eq!(result.content.len(), 3);
    // The host maps the raw answer block by block: the same as rmcp's typed result here.
    let output = manager
        .call_tool(&tool("web", "mixed"), JsonObject::new())
        .await
        .unwrap();
    let mut typed = serde_json::to_value(&result).unwrap();
    typed.as_object_mut().unwrap().remove("isError");
    assert_eq!(serde_json::to_value(&output).unwrap(), typed);
    let failed = manager
        .call_tool(&tool("web", "fail"), JsonObject::new())
        .await
        .unwrap();
    assert!(
        failed.is_error,
        "a tool that ran and failed is Ok with is_error"
    );
    // The configured headers are sent, and the pinned protocol version was asked for.
    let result = manager
        .call_tool_raw(&tool("web", "client_info"), JsonObject::new())
        .await
        .unwrap();
    assert_eq!(
        texts(&result),
        [r#"{"authorization":"Bearer test","protocolVersion":"2025-11-25"}"#]
    );

    // The connect announcement first.
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Connected,
                ..
            }
        )
    })
    .await;
    manager
        .call_tool_raw(&tool("web", "add_tool"), args(json!({"name": "web_fresh"})))
        .await
        .unwrap();
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Notified,
                ..
            }
        )
    })
    .await;
    assert!(
        manager
            .list_tools(&id("web"))
            .await
            .unwrap()
            .iter()
            .any(|t| t.name.as_str() == "web_fresh")
    );

    // The server goes away.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let error = manager
        .call_tool_raw(&tool("web", "echo"), args(json!({"text": "anyone?"})))
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with(
            "MCP server \"web\": tools/call echo failed: the connection closed: Client error: \
             error sending request for url (http://127.0.0.1:"
        ),
        "{error}"
    );
    expect_event(&events, |e| {
        matches!(
            e,
            McpEvent::Reachability {
                reachability: Reachability::Unreachable { .. },
                ..
            }
        )
    })
    .await;
    // Reconnect attempts (with backoff) fail while it is gone, each with the reason.
    let mut reason = String::new();
    for _ in 0..50 {
        if let Some(Reachability::Unreachable { reason: now }) = manager.reachability(&id("web")) {
            reason = now;
        }
        if reason.starts_with("MCP server \"web\": initialize failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        reason.starts_with(
            "MCP server \"web\": initialize failed: the connection closed: Client error: \
             error sending request for url"
        ),
        "{reason}"
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_first_connection_attempt_ends_the_wait() {
    let manager = manager(Timeouts::uniform(Duration::from_secs(30)));
    let adding = tokio::spawn({
        let manager = manager.clone();
        async move {
            let config = test_server("stuck", &["--hang-initialize"]);
            manager.add_server(id("stuck"), config).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    manager.shutdown().await;
    let reachability = tokio::time::timeout(Duration::from_secs(3), adding)
        .await
        .expect("add_server still waits after shutdown")
        .unwrap()
        .unwrap();
    assert_eq!(reachability, Reachability::Unknown);
}

/// The bytes of a binary content block as the server sent it, decoded by psych-types'
/// serde form of `ContentBlock`.
fn binary_data(block: &serde_json::Value) -> Vec<u8> {
    let block: psych_types::ContentBlock = serde_json::from_value(block.clone()).unwrap();
    block.binary().expect("a binary block").data.to_vec()
}

/// Two concurrent `sleep` calls through [`ToolHost`] (the raw path), answered in the
/// reverse of the order they were sent, each to its own caller. The first ("slow") waits at
/// the server's barrier of two (the `sleep` tool's `barrier`) and says so (progress 0);
/// only then is the second ("fast") sent, and it is answered while the first is still held;
/// a third call to the barrier then releases the first.
async fn reverse_order_answers_reach_their_callers(manager: &McpManager, server: &str) {
    let sleep = tool(server, "sleep");
    let (arrived, mut waiting) = tokio::sync::mpsc::unbounded_channel();
    let sink = ProgressSink::new(move |_| {
        let _ = arrived.send(());
    });
    let slow = {
        let manager = manager.clone();
        let sleep = sleep.clone();
        tokio::spawn(async move {
            let arguments = args(json!({"ms": 0, "tag": "slow", "barrier": 2}));
            let output = ToolHost::call_tool_with_progress(&manager, &sleep, arguments, sink)
                .await
                .unwrap();
            serde_json::to_value(&output).unwrap()
        })
    };
    tokio::time::timeout(Duration::from_secs(30), waiting.recv())
        .await
        .expect("the server announces the call waiting at its barrier")
        .expect("the call reports progress before it ends");
    let fast = manager
        .call_tool(&sleep, args(json!({"ms": 0, "tag": "fast"})))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&fast).unwrap(),
        json!({"content": [{"type": "text", "text": "fast"}]})
    );
    assert!(
        !slow.is_finished(),
        "the slow call was answered before the barrier let it go"
    );
    let release = manager
        .call_tool(
            &sleep,
            args(json!({"ms": 0, "tag": "release", "barrier": 2})),
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&release).unwrap(),
        json!({"content": [{"type": "text", "text": "release"}]})
    );
    assert_eq!(
        slow.await.unwrap(),
        json!({"content": [{"type": "text", "text": "slow"}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_out_of_order_reach_their_callers_over_stdio_and_http() {
    let server = HttpServer::start(&[]);
    // The slow call is held until the test releases it: its deadline only bounds how long a
    // failing test takes.
    let manager = manager(fast().with_call(Duration::from_secs(20)));
    manager
        .add_server(id("local"), test_server("local", &[]))
        .await
        .unwrap();
    manager
        .add_server(id("web"), http_config("web", &server.url))
        .await
        .unwrap();
    reverse_order_answers_reach_their_callers(&manager, "local").await;
    reverse_order_answers_reach_their_callers(&manager, "web").await;
    manager.shutdown().await;
}

/// Over HTTP, what rmcp's typed result would drop comes back whole from `server`: the
/// `exotic` result (a block type rmcp does not know, unknown fields), its `known_only`
/// variant (which rmcp would type, dropping `futureField`), and a 3 MB result.
async fn raw_results_come_back_whole(manager: &McpManager, server: &str) {
    // What rmcp's typed result drops (a block type it does not know, unknown fields on a
    // known block and on the result) comes back whole, as over stdio.
    let exotic = manager
        .call_tool(&tool(server, "exotic"), JsonObject::new())
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&exotic).unwrap(),
        psych_test_server::exotic_result()
    );
    assert_eq!(exotic.content.len(), 5);
    assert!(matches!(
        &exotic.content[1],
        psych_types::ContentBlock::Unknown(block) if block["type"] == "widget"
    ));
    let typed = manager
        .call_tool_raw(&tool(server, "exotic"), JsonObject::new())
        .await;
    assert!(
        typed.is_err_and(|e| e.to_string().contains("not a tools/call result")),
        "rmcp's typed result cannot read an unknown block type"
    );
    // Without the unknown block type rmcp types the result and drops the unknown fields
    // (`futureField` on the text block); the raw path keeps them.
    let known = manager
        .call_tool(&tool(server, "exotic"), args(json!({"known_only": true})))
        .await
        .unwrap();
    let known_raw = psych_test_server::exotic_known_result();
    assert_eq!(serde_json::to_value(&known).unwrap(), known_raw);
    assert_eq!(
        known_raw["content"][0]["futureField"],
        json!({"kept": true})
    );
    let typed = manager
        .call_tool_raw(&tool(server, "exotic"), args(json!({"known_only": true})))
        .await
        .unwrap();
    assert_ne!(
        serde_json::to_value(&typed).unwrap(),
        known_raw,
        "rmcp's typed result keeps everything: the assertion above shows nothing"
    );

    // A large result comes back whole.
    let large = manager
        .call_tool(&tool(server, "large"), args(json!({"bytes": 3_000_000})))
        .await
        .unwrap();
    let large = serde_json::to_value(&large).unwrap();
    assert_eq!(
        large["content"][0]["text"].as_str().unwrap(),
        psych_test_server::large_text(3_000_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_result_keeps_every_block_and_field_the_server_sent() {
    let server = HttpServer::start(&[]);
    let (manager, _) = one("web", http_config("web", &server.url), fast()).await;
    raw_results_come_back_whole(&manager, "web").await;
    // The connection keeps working after a large result.
    let echo = manager
        .call_tool(&tool("web", "echo"), args(json!({"text": "still here"})))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&echo).unwrap(),
        json!({"content": [{"type": "text", "text": "still here"}]})
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_server_is_reached_over_tls_and_a_failed_handshake_names_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Not a TLS server: it reads what the client opens with and answers in plain HTTP.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let opening = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut record = [0u8; 3];
        stream.read_exact(&mut record).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let _ = stream.read_to_end(&mut Vec::new()).await;
        record
    });
    let manager = manager(fast());
    let url = format!("https://localhost:{port}/mcp");
    let secure = manager
        .add_server(id("secure"), http_config("secure", &url))
        .await
        .unwrap();
    // A TLS handshake record (content type 22, version 3.x): the https URL is spoken TLS.
    let record = opening.await.unwrap();
    assert_eq!(record[..2], [0x16, 0x03], "{record:?}");
    let Reachability::Unreachable { reason } = secure else {
        panic!("{secure:?}");
    };
    assert!(
        reason.starts_with(
            "MCP server \"secure\": initialize failed: the connection closed: Client error: \
             error sending request for url (https://localhost:"
        ),
        "{reason}"
    );
    // Why, from reqwest's causes: rustls read a plain HTTP answer as a TLS record. (The
    // first request is `server/discover`, asking for MCP 2026-07-28.)
    assert!(
        reason.ends_with(
            "when send discover request (client error (Connect): received corrupt message \
             of type InvalidContentType)"
        ),
        "{reason}"
    );

    // Nothing listening at all: the same, with the reason. The port is held by a socket
    // bound but never listening (a connection to it is refused), so no other test can take
    // it meanwhile, as one could a port bound and let go.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = held.local_addr().unwrap().port();
    let url = format!("https://127.0.0.1:{closed}/mcp");
    let nobody = manager
        .add_server(id("nobody"), http_config("nobody", &url))
        .await
        .unwrap();
    let Reachability::Unreachable { reason } = nobody else {
        panic!("{nobody:?}");
    };
    assert!(
        reason.starts_with("MCP server \"nobody\": initialize failed: the connection closed:"),
        "{reason}"
    );
    assert!(
        reason.ends_with(
            "(client error (Connect): tcp connect error: Connection refused (os error 111))"
        ),
        "{reason}"
    );
    drop(held);
    manager.shutdown().await;
}

/// POSTs one JSON-RPC message to `url` as an MCP client would and returns the answer's
/// `Content-Type` and body.
async fn post_raw(url: &str, message: Value) -> (String, String) {
    let response = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(message.to_string())
        .send()
        .await
        .unwrap();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (content_type, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_json_bodies_keep_every_field_and_everything_else_still_works() {
    let server = HttpServer::start(&["--json-response"]);

    // The server really answers with one JSON body, `futureField` on its wire.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "exotic", "arguments": {"known_only": true}}});
    let (content_type, body) = post_raw(&server.url, call).await;
    assert_eq!(content_type, "application/json");
    let wire: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(wire["result"], psych_test_server::exotic_known_result());

    // The slow call of the out-of-order check below is held until the test releases it: its
    // deadline only bounds how long a failing test takes.
    let timeouts = fast().with_call(Duration::from_secs(20));
    let (manager, reachability) = one("json", http_config("json", &server.url), timeouts).await;
    assert_eq!(reachability, Reachability::Reachable);
    let listing = manager.list_tools(&id("json")).await.unwrap();
    assert_eq!(listing.len(), CONTROL_TOOLS);

    // rmcp types a JSON body itself, dropping the unknown fields of known blocks
    // (`futureField`); the raw path keeps them, a block type rmcp does not know, and a
    // 3 MB result.
    raw_results_come_back_whole(&manager, "json").await;

    // A tool error, a JSON-RPC error, answers out of order.
    let failed = manager
        .call_tool(&tool("json", "fail"), args(json!({"message": "disk full"})))
        .await
        .unwrap();
    assert!(failed.is_error);
    assert_eq!(
        serde_json::to_value(&failed).unwrap()["content"][0]["text"],
        "disk full"
    );
    let unknown = manager
        .call_tool(&tool("json", "nothing_here"), JsonObject::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("MCP server \"json\"") && unknown.contains("no tool \"nothing_here\""),
        "{unknown}"
    );
    reverse_order_answers_reach_their_callers(&manager, "json").await;
    manager.shutdown().await;
}

/// A `progress` call of `steps` steps through [`ToolHost::call_tool_with_progress`], with
/// a sink sending into a channel: by the time the call returns, every notification is in
/// the channel, in order, and the channel is closed (the sink was dropped with the call).
async fn progress_arrives_before_the_result(manager: &McpManager, server: &str, steps: u32) {
    let (tx, mut progress) = tokio::sync::mpsc::unbounded_channel();
    let sink = ProgressSink::new(move |note| {
        let _ = tx.send(note);
    });
    let output = manager
        .call_tool_with_progress(
            &tool(server, "progress"),
            args(json!({"steps": steps})),
            sink,
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&output).unwrap()["content"][0]["text"],
        format!("{steps} steps reported")
    );
    let mut seen = Vec::new();
    let end = loop {
        match progress.try_recv() {
            Ok(note) => seen.push((note.progress, note.total, note.message)),
            Err(end) => break end,
        }
    };
    let expected: Vec<_> = (1..=steps)
        .map(|n| {
            let message = Some(format!("step {n} of {steps}"));
            (f64::from(n), Some(f64::from(steps)), message)
        })
        .collect();
    assert_eq!(
        seen, expected,
        "{server}: progress delivered by the call's return"
    );
    assert_eq!(
        end,
        tokio::sync::mpsc::error::TryRecvError::Disconnected,
        "{server}: the channel closes with the call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_progress_notification_arrives_before_the_call_returns_over_stdio_and_http() {
    let events = HttpServer::start(&[]);
    let bodies = HttpServer::start(&["--json-response"]);
    let manager = manager(fast());
    for (name, config) in [
        ("local", test_server("local", &[])),
        ("web", http_config("web", &events.url)),
        ("json", http_config("json", &bodies.url)),
    ] {
        manager.add_server(id(name), config).await.unwrap();
    }
    for _ in 0..5 {
        for server in ["local", "web", "json"] {
            progress_arrives_before_the_result(&manager, server, 20).await;
        }
    }
    manager.shutdown().await;
}

// Events and connect_all (issue 27, finding 7): every subscriber sees every event, a late
// reader still sees an outage, and connect_all reports every server.

/// Every event of `events` waiting now.
fn drain(events: &McpEvents) -> Vec<McpEvent> {
    std::iter::from_fn(|| events.try_next()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscriber_sees_every_event_and_a_late_one_still_sees_the_outage() {
    // Before, subscribers shared one queue (the eager one took the lazy one's events), and
    // the queue kept only a server's latest reachability (an outage read after the
    // reconnect was gone).
    let manager = manager(fast());
    let lazy = manager.events();
    let eager = manager.events();
    manager
        .add_server(id("crashy"), test_server("crashy", &[]))
        .await
        .unwrap();
    manager
        .call_tool_raw(&tool("crashy", "crash"), JsonObject::new())
        .await
        .unwrap_err();
    let outage = expect_event(&eager, |e| {
        matches!(
            e,
            McpEvent::Reachability {
                reachability: Reachability::Unreachable { .. },
                ..
            }
        )
    })
    .await;
    // The reconnect's announcement is pushed after its Reachable: when the eager
    // subscriber has it, every event of the reconnect is in the lazy one's queue too.
    expect_event(&eager, |e| {
        matches!(
            e,
            McpEvent::ToolsChanged {
                cause: ChangeCause::Connected,
                ..
            }
        )
    })
    .await;
    let McpEvent::Reachability {
        reachability: Reachability::Unreachable { reason },
        ..
    } = &outage
    else {
        unreachable!()
    };
    assert!(reason.contains("exited with status 70"), "{reason}");
    assert_eq!(
        drain(&lazy),
        [
            outage,
            McpEvent::Reachability {
                server: id("crashy"),
                reachability: Reachability::Reachable,
            },
            McpEvent::ToolsChanged {
                server: id("crashy"),
                cause: ChangeCause::Connected,
            },
        ]
    );
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_added_is_announced_before_add_server_returns() {
    let manager = manager(fast());
    let events = manager.events();
    manager
        .add_server(id("prompt"), test_server("prompt", &[]))
        .await
        .unwrap();
    assert_eq!(
        drain(&events),
        [
            McpEvent::Reachability {
                server: id("prompt"),
                reachability: Reachability::Reachable,
            },
            McpEvent::ToolsChanged {
                server: id("prompt"),
                cause: ChangeCause::Connected,
            },
        ]
    );
    manager
        .add_server(
            id("missing"),
            stdio_config("missing", "/nonexistent/psych-no-such-server", &[]),
        )
        .await
        .unwrap();
    assert!(matches!(
        drain(&events)[..],
        [McpEvent::Reachability {
            reachability: Reachability::Unreachable { .. },
            ..
        }]
    ));
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_all_reports_every_server_including_those_it_could_not_add() {
    let text = json!({"mcpServers": {
        "good": {"command": SERVER, "args": []},
        "missing": {"command": "/nonexistent/psych-no-such-server"},
    }})
    .to_string();
    let build = || {
        McpManager::builder(McpConfig::parse(&text, |_| None).unwrap())
            .timeouts(fast())
            .build()
            .unwrap()
    };
    let manager = build();
    let reached = manager.connect_all().await;
    assert_eq!(reached.len(), 2, "{reached:?}");
    assert_eq!(
        reached[&id("good")].as_ref().unwrap(),
        &Reachability::Reachable
    );
    assert!(matches!(
        reached[&id("missing")],
        Ok(Reachability::Unreachable { .. })
    ));
    manager.shutdown().await;
    // Before, a server the manager refused was left out of the answer.
    let reached = manager.connect_all().await;
    assert_eq!(reached.len(), 2, "{reached:?}");
    for outcome in reached.values() {
        assert!(
            matches!(
                outcome,
                Err(psych_mcp::ConnectError::Manager(McpError::ShutDown))
            ),
            "{outcome:?}"
        );
    }
}

/// Live processes (not zombies) whose command line holds `marker`.
fn live_with_marker(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                Some(rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie && memchr::memmem::find(&cmdline, marker.as_bytes()).is_some() {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_racing_add_server_leaves_no_server_running() {
    // `add_server` checked the shutdown flag, then awaited the removal of the server of the
    // same name it replaces, then inserted its slot: a shutdown during that removal took
    // the map without it, and the new supervisor and server process ran on after shutdown.
    // (It now inserts its slot at once, and the new supervisor stops the old slot first; a
    // shutdown while it does must still leave nothing running.)
    let marker = format!("shutdown-race-{}", std::process::id());
    let config = || test_server("racer", &["--stderr-banner", &marker]);
    let manager = manager(fast());
    let first = manager.add_server(id("racer"), config()).await.unwrap();
    assert_eq!(first, Reachability::Reachable);
    let replacing = tokio::spawn({
        let manager = manager.clone();
        let config = config();
        async move { manager.add_server(id("racer"), config).await }
    });
    // The replacement's slot is in the map and the old server is being stopped (the slot
    // in the map has no session yet). (Bounded: on a machine loaded enough to miss that
    // window, the replacement is added first and shutdown must stop it like the others.)
    let waited = std::time::Instant::now();
    while manager.process_group(&id("racer")).is_some()
        && !replacing.is_finished()
        && waited.elapsed() < Duration::from_secs(30)
    {
        tokio::task::yield_now().await;
    }
    manager.shutdown().await;
    let replaced = replacing.await.unwrap();
    // Added (the usual outcome now: its slot is in the map before the old server has
    // stopped, and shutdown stops it with the others), or refused when shutdown came first.
    assert!(
        matches!(replaced, Err(McpError::ShutDown) | Ok(_)),
        "{replaced:?}"
    );
    assert_eq!(
        manager.servers(),
        Vec::<ServerId>::new(),
        "no server is left after shutdown"
    );
    // Every server was stopped (SIGTERM then SIGKILL to its group); give the last signals
    // time to land.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !live_with_marker(&marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live_with_marker(&marker), Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_soon_after_each_connection_is_restarted_ever_less_often() {
    // Connects (answers `initialize` and the listing), then exits: each connection
    // succeeded, and each used to start the backoff over, so it was restarted every
    // `initial` (here 50 ms) forever.
    let script = r#"
        answer() { read -r line; id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/'); }
        answer
        printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}\n' "$id"
        answer
        printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"flap","version":"1"}}}\n' "$id"
        read -r initialized
        answer
        printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[]}}\n' "$id"
        exit 3
    "#;
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .timeouts(fast())
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(60),
        ))
        .build()
        .unwrap();
    let events = manager.events();
    // Reachable, or already lost again by the time it returns: the events say which.
    manager
        .add_server(id("flap"), stdio_config("flap", "sh", &["-c", script]))
        .await
        .unwrap();
    // Delays of 50, 100, 200, 400, 800 and 1,600 ms: at most 7 connections in 3 s (at
    // the first delay, some 30).
    let window = tokio::time::Instant::now() + Duration::from_secs(3);
    // The first connection's events are queued already: it counts among them.
    let mut connections = 0;
    while let Ok(event) = tokio::time::timeout_at(window, events.next()).await {
        if let McpEvent::Reachability {
            reachability: Reachability::Reachable,
            ..
        } = event
        {
            connections += 1;
        }
    }
    assert!(connections <= 7, "{connections} connections in 3 s");
    assert!(connections >= 2, "it was reconnected: {connections}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_adds_of_one_name_at_once_leave_one_server_and_shutdown_stops_it() {
    // Each `add_server` removed the server of its name (none yet), then inserted its
    // slot: when both removals came before either insert, the second replaced the first
    // in the map unseen, and the first's supervisor and process ran on after shutdown.
    // (Now each inserts at once and the second's supervisor stops the first's slot.)
    // (The window is narrow: rounds of two adds on two threads may or may not hit it;
    // whichever way they go, one server is left and shutdown stops every one.)
    let marker = format!("twin-add-{}", std::process::id());
    let banner = marker.clone();
    let config = move || test_server("twin", &["--stderr-banner", &banner]);
    let manager = manager(fast());
    for _ in 0..4 {
        let adds: Vec<_> = (0..2)
            .map(|_| {
                let manager = manager.clone();
                let config = config();
                tokio::spawn(async move { manager.add_server(id("twin"), config).await })
            })
            .collect();
        for add in adds {
            add.await.unwrap().unwrap();
        }
    }
    assert_eq!(manager.servers(), [id("twin")]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while live_with_marker(&marker).len() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live_with_marker(&marker).len(), 1, "one server runs");
    manager.shutdown().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !live_with_marker(&marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live_with_marker(&marker), Vec::<i32>::new());
}

// Issue 27: the stdio transport under faults (findings 1, 2, 4 and the stdio part of 4's
// orphans). A helper per test server scenario is kept beside its test.

/// Waits until `done` holds, polling (generously: the deadline only decides how long a
/// failing test takes).
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: still not so after 20s");
}

/// Finding 1: answers of several MiB to concurrent calls arrive whole while progress,
/// `list_changed` (and the re-lists it causes) and small calls keep rmcp's loop busy:
/// each event rmcp handles first drops our transport's `receive` in the middle of a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_arrive_whole_while_notifications_keep_rmcps_loop_busy() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    // Generous deadlines: a lost line shows as a failed call long before they pass.
    let timeouts =
        Timeouts::uniform(Duration::from_secs(60)).with_shutdown_grace(Duration::from_millis(500));
    let (manager, reachability) = one("busy", test_server("busy", &[]), timeouts).await;
    assert_eq!(reachability, Reachability::Reachable);
    let done = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..3)
        .map(|kind| {
            let manager = manager.clone();
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut rounds = 0u64;
                while !done.load(Ordering::Relaxed) {
                    match kind {
                        0 => {
                            let sink = ProgressSink::new(|_| {});
                            manager
                                .call_tool_with_progress(
                                    &tool("busy", "progress"),
                                    args(json!({"steps": 40})),
                                    sink,
                                )
                                .await
                                .unwrap();
                        }
                        1 => {
                            let verb = if rounds.is_multiple_of(2) {
                                "add_tool"
                            } else {
                                "remove_tool"
                            };
                            manager
                                .call_tool_raw(&tool("busy", verb), args(json!({"name": "noise"})))
                                .await
                                .unwrap();
                        }
                        _ => {
                            let text = format!("echo {rounds}");
                            let result = manager
                                .call_tool_raw(&tool("busy", "echo"), args(json!({"text": text})))
                                .await
                                .unwrap();
                            assert_eq!(texts(&result), [text]);
                        }
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    const MIB: u64 = 1024 * 1024;
    for round in 0..2u64 {
        let sizes = [
            3 * MIB,
            5 * MIB + 7,
            4 * MIB,
            6 * MIB + round,
            2 * MIB + 1,
            7 * MIB / 2,
        ];
        let calls: Vec<_> = sizes
            .into_iter()
            .map(|bytes| {
                let manager = manager.clone();
                tokio::spawn(async move {
                    let result = manager
                        .call_tool_raw(&tool("busy", "large"), args(json!({"bytes": bytes})))
                        .await;
                    (bytes, result)
                })
            })
            .collect();
        for call in calls {
            let (bytes, result) = call.await.unwrap();
            let result = result.unwrap_or_else(|e| panic!("{bytes} B: {e}"));
            let text = texts(&result).concat();
            assert_eq!(text.len() as u64, bytes);
            assert!(
                text == psych_test_server::large_text(bytes as usize),
                "{bytes} B came back changed"
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    for task in noise {
        assert!(task.await.unwrap() > 0, "a noise task never ran");
    }
    manager.shutdown().await;
}

/// The text blocks and `_meta` of a result through the `ToolHost` (the raw result).
async fn host_call(manager: &McpManager, server: &str, name: &str, arguments: Value) -> Value {
    let output = manager
        .call_tool(&tool(server, name), args(arguments))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::to_value(&output).unwrap()
}

/// Finding 2: invalid UTF-8 and a lone surrogate escape in an answer are read lossily, at
/// once, and the result says so in its `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_invalid_utf8_or_a_lone_surrogate_is_kept_lossily_and_says_so() {
    let timeouts = fast().with_call(Duration::from_secs(60));
    let (manager, _) = one("lossy", test_server("lossy", &[]), timeouts).await;
    let utf8 = host_call(&manager, "lossy", "raw_bad_utf8", json!({})).await;
    assert_eq!(
        utf8["content"][0]["text"],
        "caf\u{FFFD} and \u{FFFD}\u{FFFD}, then fine\n"
    );
    assert_eq!(
        utf8["_meta"]["psych/lossy"],
        "invalid UTF-8 replaced by U+FFFD at 3 places"
    );
    let surrogate = host_call(&manager, "lossy", "raw_lone_surrogate", json!({})).await;
    assert_eq!(
        surrogate["content"][0]["text"],
        "cut inside an emoji: \u{FFFD}"
    );
    assert_eq!(
        surrogate["_meta"]["psych/lossy"],
        "lone surrogate escapes replaced by U+FFFD at 1 place"
    );
    let fine = host_call(&manager, "lossy", "echo", json!({"text": "fine"})).await;
    assert_eq!(fine, json!({"content": [{"type": "text", "text": "fine"}]}));
    manager.shutdown().await;
}

/// Finding 2: an answer whose part held in memory is over the 64 MiB cap (an image block's
/// data: only long texts are kept in files) and an answer cut short fail their call at
/// once with a typed error, not at the deadline, and the connection stays usable. A text
/// that long is kept in a file (its `id` first, as rmcp and Python write it, or last, as
/// the TypeScript SDK does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_or_unreadable_answer_fails_its_call_at_once_and_the_connection_stays() {
    // A deadline the test would notice: the old behaviour was to wait it out.
    let timeouts = fast().with_call(Duration::from_secs(120));
    let (manager, _) = one("bad", test_server("bad", &[]), timeouts).await;
    let over = 64 * 1024 * 1024 + 1;
    for id_last in [false, true] {
        let text = manager
            .call_tool(
                &tool("bad", "raw_oversize"),
                args(json!({"bytes": over, "id_last": id_last})),
            )
            .await
            .unwrap();
        assert_eq!(text.spilled.len(), 1, "id last: {id_last}");
        assert_eq!(text.spilled[0].text.len(), over as u64);
        let error = manager
            .call_tool_raw(
                &tool("bad", "raw_oversize"),
                args(json!({"bytes": over, "image": true})),
            )
            .await
            .unwrap_err();
        let McpError::AnswerTooLarge {
            call, bytes, limit, ..
        } = &error
        else {
            panic!("id last: {id_last}: {error}");
        };
        assert_eq!(call, "tools/call raw_oversize");
        assert_eq!(*limit, 64 * 1024 * 1024);
        assert!(
            *bytes > over as u64 && *bytes < over as u64 + 200,
            "{bytes}"
        );
        assert!(!error.is_connection_lost());
        let echo = manager
            .call_tool_raw(&tool("bad", "echo"), args(json!({"text": "still here"})))
            .await
            .unwrap();
        assert_eq!(texts(&echo), ["still here"]);
    }
    let error = manager
        .call_tool_raw(&tool("bad", "raw_unparseable"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::MalformedAnswer { reason, .. }
            if reason.contains("EOF while parsing") && reason.contains("cut he")),
        "{error}"
    );
    assert!(
        error.to_string().starts_with(
            "MCP server \"bad\": tools/call raw_unparseable failed: the answer could not be read: "
        ),
        "{error}"
    );
    let echo = manager
        .call_tool_raw(&tool("bad", "echo"), args(json!({"text": "and here"})))
        .await
        .unwrap();
    assert_eq!(texts(&echo), ["and here"]);
    manager.shutdown().await;
}

/// An answer holding more JSON values than psych-mcp parses (zeros, two bytes each: 64 MiB of
/// them would parse to 1 GiB) fails its call at once with a typed error, read whole in
/// memory or kept in a file for its size, and the connection stays usable; one within the
/// bound is parsed as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_too_many_values_fails_its_call_unparsed_and_the_connection_stays() {
    let timeouts = fast().with_call(Duration::from_secs(120));
    let (manager, _) = one("dense", test_server("dense", &[]), timeouts).await;
    let max = psych_mcp::MAX_JSON_STRUCTURAL_BYTES;
    let within = manager
        .call_tool_raw(
            &tool("dense", "raw_many_values"),
            args(json!({"count": max - 64})),
        )
        .await
        .unwrap();
    let values = &within.structured_content.as_ref().unwrap()["values"];
    assert_eq!(values.as_array().map(Vec::len), Some(max as usize - 64));
    // 4 MiB, read in memory; 20 MiB, kept in a file first (over `SPILL_AT`).
    for count in [max, 10 * 1024 * 1024] {
        // Not `unwrap_err`: millions of values wrongly read are megabytes to print.
        let Err(error) = manager
            .call_tool_raw(
                &tool("dense", "raw_many_values"),
                args(json!({"count": count})),
            )
            .await
        else {
            panic!("{count} values were read");
        };
        let McpError::AnswerTooComplex {
            call, bytes, limit, ..
        } = &error
        else {
            panic!("{count} values: {error}");
        };
        assert_eq!(call, "tools/call raw_many_values");
        assert_eq!(*limit, max);
        // The whole line (spilled or not): two bytes a value and the message around them.
        assert!(*bytes > 2 * count && *bytes < 2 * count + 200, "{bytes}");
        assert!(!error.is_connection_lost());
        assert!(
            error.to_string().contains("more than psych-mcp parses"),
            "{error}"
        );
        let echo = manager
            .call_tool_raw(&tool("dense", "echo"), args(json!({"text": "still here"})))
            .await
            .unwrap();
        assert_eq!(texts(&echo), ["still here"]);
    }
    manager.shutdown().await;
}

/// Whether process `pid` is gone (or a zombie).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Finding 6 (stdio): a server that exits mid-call while a grandchild in a session of its
/// own (out of reach of the process group's signals) keeps its stdout open fails the call
/// at once with its exit status and stderr, not as "no answer" at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_while_a_grandchild_holds_its_stdout_is_reported_as_exited() {
    let dir = std::env::temp_dir().join(format!("psych-held-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("grandchild");
    let pidfile_arg = pidfile.display().to_string();
    let timeouts = fast().with_call(Duration::from_secs(120));
    let config = test_server("held", &["--setsid-grandchild", &pidfile_arg]);
    let (manager, _) = one("held", config, timeouts).await;
    let error = manager
        .call_tool_raw(&tool("held", "crash"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Exited { status, stderr, .. }
            if status == "exited with status 70" && stderr.contains("crashing on request")),
        "{error}"
    );
    manager.shutdown().await;
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until(&format!("grandchild {pid} gone"), || gone(pid)).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Finding 4 (second part): a grandchild that called `setsid` (a session and group of its
/// own) does not outlive a failed start: the server exiting at once, or never answering
/// `initialize`. And finding 6: the exit, though the grandchild holds stdout open, is
/// reported as the exit, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_grandchild_does_not_outlive_a_failed_start() {
    let dir = std::env::temp_dir().join(format!("psych-setsid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, fault) in [("quits", "--exit-at-once"), ("mute", "--hang-initialize")] {
        let pidfile = dir.join(name);
        let pidfile_arg = pidfile.display().to_string();
        let mut flags = vec!["--setsid-grandchild", pidfile_arg.as_str(), fault];
        if fault == "--exit-at-once" {
            flags.push("3");
        }
        // No second attempt during the test: each would start a grandchild of its own.
        let manager = manager_with(
            fast().with_connect(Duration::from_secs(2)),
            Duration::from_secs(600),
        );
        let reachability = manager
            .add_server(id(name), test_server(name, &flags))
            .await
            .unwrap();
        let Reachability::Unreachable { reason } = &reachability else {
            panic!("{name}: {reachability:?}");
        };
        if name == "quits" {
            // Finding 6: the grandchild holds stdout open, but the exit is what is
            // reported, at once (it used to be "initialize got no answer within 2s").
            assert!(
                reason.starts_with(
                    "MCP server \"quits\": initialize failed: the server process exited \
                     with status 3"
                ),
                "{reason}"
            );
        }
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Stopped by the failed start itself, before any shutdown.
        wait_until(&format!("{name}: setsid grandchild {pid} gone"), || {
            gone(pid)
        })
        .await;
        manager.shutdown().await;
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Finding 4 (second part): a manager dropped without shutdown stops a grandchild that
/// called `setsid` too, not only the server's process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_dropped_without_shutdown_stops_a_setsid_grandchild_too() {
    let dir = std::env::temp_dir().join(format!("psych-dropped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("grandchild");
    let pidfile_arg = pidfile.display().to_string();
    let config = test_server("orphan", &["--setsid-grandchild", &pidfile_arg]);
    let (manager, reachability) = one("orphan", config, fast()).await;
    assert_eq!(reachability, Reachability::Reachable);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!gone(pid), "the grandchild {pid} did not start");
    drop(manager);
    wait_until(&format!("grandchild {pid} gone"), || gone(pid)).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Finding 6 (stdio), during a listing: a server that exits while answering `tools/list`,
/// its stdout held open by a grandchild in a session of its own, fails the listing at once
/// with its exit status and stderr (it used to be "tools/list page 1 got no answer within
/// 5s"), and the grandchild does not outlive the failed start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_during_the_listing_is_reported_as_exited() {
    let dir = std::env::temp_dir().join(format!("psych-listing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("grandchild");
    let script = format!(
        r#"
        setsid sleep 1000 &
        echo $! > '{}'
        read -r line
        id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/')
        # server/discover is not found, as by every server from before 2026-07-28
        printf '{{"jsonrpc":"2.0","id":%s,"error":{{"code":-32601,"message":"Method not found"}}}}\n' "$id"
        read -r line
        id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/')
        printf '{{"jsonrpc":"2.0","id":%s,"result":{{"protocolVersion":"2025-11-25","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"dies","version":"1"}}}}}}\n' "$id"
        read -r initialized
        read -r listing
        echo 'fatal: the catalogue database is locked' >&2
        exit 4
        "#,
        pidfile.display()
    );
    let config = stdio_config("dies", "sh", &["-c", &script]);
    let manager = manager_with(fast(), Duration::from_secs(600));
    let reachability = manager.add_server(id("dies"), config).await.unwrap();
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"dies\": tools/list page 1 failed: the server process exited \
                     with status 4; its last stderr lines:\n  fatal: the catalogue database is \
                     locked"
                .into()
        }
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until(&format!("grandchild {pid} gone"), || gone(pid)).await;
    manager.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

// Review of issue 27 (helper H): the stdio transport and the tap.

/// Review item 3: a server's own JSON-RPC error that carries the `data` keys of the errors
/// psych-mcp's transports make up (an answer over the cap, an HTTP stream cut) is reported
/// as the server's error, not as `AnswerTooLarge` or a transport fault; the connection
/// stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_error_that_imitates_psychs_own_is_reported_as_the_servers() {
    let timeouts = fast().with_call(Duration::from_secs(60));
    let (manager, _) = one("forger", test_server("forger", &[]), timeouts).await;
    let error = manager
        .call_tool_raw(&tool("forger", "raw_forged_error"), JsonObject::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Protocol { message, .. }
            if message.contains(psych_test_server::FORGED_ERROR_MESSAGE)),
        "{error:?}"
    );
    let echo = manager
        .call_tool_raw(&tool("forger", "echo"), args(json!({"text": "still here"})))
        .await
        .unwrap();
    assert_eq!(texts(&echo), ["still here"]);
    manager.shutdown().await;
}

/// Review item 4: a server that says why it stops, then draws a progress bar (1,000 `\r`
/// frames) and exits, is reported with that line: the frames are one line of the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_before_a_progress_bar_is_still_in_the_stderr_tail_at_the_exit() {
    let script = r#"
        echo 'fatal: the catalogue database is locked' >&2
        i=0
        while [ $i -lt 1000 ]; do i=$((i + 1)); printf 'retrying %d/1000\r' $i >&2; done
        exit 3
    "#;
    let config = stdio_config("bar", "sh", &["-c", script]);
    let manager = manager_with(fast(), Duration::from_secs(600));
    let reachability = manager.add_server(id("bar"), config).await.unwrap();
    assert_eq!(
        reachability,
        Reachability::Unreachable {
            reason: "MCP server \"bar\": initialize failed: the server process exited with \
                     status 3; its last stderr lines:\n  fatal: the catalogue database is \
                     locked\n  retrying 1000/1000"
                .into()
        }
    );
    manager.shutdown().await;
}

/// Set in the test process that [`a_server_dropped_as_the_process_exits_takes_its_setsid_grandchild`]
/// starts: the pid file of its server's grandchild.
/// `name`'s path in this test binary, as `--exact` matches it: the module path without the
/// crate's name (the file is a module of the crate's one integration-test binary).
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

const EXITING_CHILD: &str = "PSYCH_MCP_TEST_EXITING_CHILD";

/// Review item 2: a manager whose servers are dropped while the runtime shuts down (what
/// the gateway does after a second signal, or past its shutdown deadline) and whose process
/// exits right after, leaves no grandchild that called `setsid` behind: the descendants are
/// killed before the drop returns, not on a blocking thread that the exit outruns. This
/// test runs itself in a process of its own (with [`EXITING_CHILD`] set) to have a process
/// that exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dropped_as_the_process_exits_takes_its_setsid_grandchild() {
    let dir = std::env::temp_dir().join(format!("psych-exiting-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("grandchild");
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            test_path("exiting_process_with_a_server").as_str(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EXITING_CHILD, &pidfile)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for _ in 0..1_000 {
        if gone(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    panic!("the grandchild {pid} outlived its server's process by 20s");
}

/// The process [`a_server_dropped_as_the_process_exits_takes_its_setsid_grandchild`]
/// starts (without [`EXITING_CHILD`], as in a plain test run, it does nothing): a server
/// with a `setsid` grandchild, its manager held by a task, the runtime shut down with the
/// gateway's 100 ms for stragglers, and the process exiting at once.
#[test]
fn exiting_process_with_a_server() {
    let Some(pidfile) = std::env::var_os(EXITING_CHILD) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pidfile_arg = std::path::PathBuf::from(pidfile).display().to_string();
    runtime.block_on(async {
        let config = test_server("exiting", &["--setsid-grandchild", &pidfile_arg]);
        let (manager, reachability) = one("exiting", config, fast()).await;
        assert_eq!(reachability, Reachability::Reachable);
        tokio::spawn(async move {
            let _held = manager;
            std::future::pending::<()>().await;
        });
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(0);
}
