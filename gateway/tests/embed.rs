//! The gateway embedded in a program of its own: served on a listener the program bound,
//! reached by a real MCP client (psych-mcp's, over streamable HTTP), stopped by the
//! program's own signal.

use std::time::Duration;

use psych_gateway::{GatewaySettings, Listener, ServeError, serve};
use psych_mcp::{McpConfig, McpManager};
use psych_types::ServerId;

fn config(text: &str) -> McpConfig {
    McpConfig::parse(text, |_| None).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_gateway_serves_a_client_and_stops_on_its_callers_signal() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let gateway = tokio::spawn(serve(
        config(r#"{"mcpServers": {}}"#),
        Listener::Http(listener),
        GatewaySettings::new(dir.path()).unwrap_or_else(|e| panic!("{e}")),
        async move {
            let _ = stopped.await;
        },
    ));

    let client = McpManager::builder(config(&format!(
        r#"{{"mcpServers": {{"psych": {{"type": "http", "url": "http://{addr}/mcp"}}}}}}"#
    )))
    .build()
    .unwrap_or_else(|e| panic!("{e}"));
    for (server, attempt) in client.connect_all().await {
        attempt.unwrap_or_else(|e| panic!("{server}: {e}"));
    }
    let psych = ServerId::new("psych").unwrap_or_else(|e| panic!("{e}"));
    let listing = client.list(&psych).await.unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = listing.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["psych_orientation", "read_tool_output"],
        "{names:?}"
    );
    client.shutdown().await;

    let _ = stop.send(());
    let served = tokio::time::timeout(Duration::from_secs(15), gateway)
        .await
        .unwrap_or_else(|_| panic!("the gateway did not stop on its caller's signal"))
        .unwrap_or_else(|e| panic!("{e}"));
    served.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn a_listener_off_loopback_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let served = serve(
        config(r#"{"mcpServers": {}}"#),
        Listener::Http(listener),
        GatewaySettings::new(dir.path()).unwrap_or_else(|e| panic!("{e}")),
        std::future::pending(),
    )
    .await;
    assert!(
        matches!(served, Err(ServeError::NotLoopback(_))),
        "{served:?}"
    );
    assert!(
        !dir.path().join("spill").exists(),
        "nothing is created for a refused listener"
    );
}

/// Counts every byte as this many tokens: an estimator that disagrees with psych-elision's.
struct Heavy(u64);

impl psych_types::TokenEstimator for Heavy {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len() as u64 * self.0
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len * self.0
    }
}

/// The tool names `gateway` lists to a client once its upstream `up` is listed (until then
/// `up` is a deferred line saying "not listed yet"; its listing reaches the client through
/// `list_changed`).
async fn listed_once_up(gateway: &str) -> Vec<String> {
    let client = McpManager::builder(config(&format!(
        r#"{{"mcpServers": {{"psych": {{"type": "http", "url": "{gateway}"}}}}}}"#
    )))
    .build()
    .unwrap_or_else(|e| panic!("{e}"));
    let events = client.events();
    for (server, attempt) in client.connect_all().await {
        attempt.unwrap_or_else(|e| panic!("{server}: {e}"));
    }
    let psych = ServerId::new("psych").unwrap_or_else(|e| panic!("{e}"));
    let names = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let listing = client.list(&psych).await.unwrap_or_else(|e| panic!("{e}"));
            let text = serde_json::to_string(&listing.tools).unwrap_or_default();
            if !text.contains("not listed yet") {
                break listing
                    .tools
                    .iter()
                    .map(|t| t.name.as_str().to_owned())
                    .collect::<Vec<_>>();
            }
            events.next().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the upstream never reached the listing"));
    client.shutdown().await;
    names
}

/// One estimator set on the gateway is the one disclosure decides with: under a budget the
/// test server's tools fit by psych-elision's count, they are listed directly; counted at
/// 1,000 tokens a byte, the same server is deferred behind the meta tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_estimator_is_the_one_disclosure_decides_with() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let up = upstream.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let serving = tokio::spawn(psych_test_server::Scenario::default().serve_on(upstream));
    let file =
        format!(r#"{{"mcpServers": {{"up": {{"type": "http", "url": "http://{up}/mcp"}}}}}}"#);
    for heavy in [None, Some(1_000)] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut settings = GatewaySettings::new(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .disclosure(
                psych_gateway::disclosure_settings(100_000).unwrap_or_else(|e| panic!("{e}")),
            );
        if let Some(tokens) = heavy {
            settings = settings.estimator(Heavy(tokens));
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let gateway = tokio::spawn(serve(
            config(&file),
            Listener::Http(listener),
            settings,
            async move {
                let _ = stopped.await;
            },
        ));
        let names = listed_once_up(&format!("http://{addr}/mcp")).await;
        let direct = names.iter().any(|n| n == "up__echo");
        let meta = names.iter().any(|n| n == "psych_list_tools");
        assert_eq!(
            (direct, meta),
            (heavy.is_none(), heavy.is_some()),
            "{heavy:?}: {names:?}"
        );
        let _ = stop.send(());
        gateway
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    serving.abort();
}
