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
