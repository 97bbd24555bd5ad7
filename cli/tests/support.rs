//! What the `psych serve` tests share: the binary, a gateway process that stops when it is
//! dropped, its HTTP start-up (the address it prints), and bearer tokens.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// The `psych` binary under test.
pub(crate) const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// A running gateway: stopped as Ctrl-C would stop it (it then stops its upstream
/// servers) when dropped.
pub(crate) struct Gateway(pub(crate) tokio::process::Child);

impl Gateway {
    /// Stops it with SIGTERM and waits for its exit, which must be a success.
    pub(crate) async fn stop(mut self) {
        let pid = self.0.id().unwrap();
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.0.wait())
            .await
            .expect("the gateway exits")
            .unwrap();
        assert!(status.success(), "{status}");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }
}

/// Starts `command` (a `psych serve --http` with its flags), waits for the line that says
/// where it listens, and returns the gateway and its URL.
pub(crate) async fn listening(command: tokio::process::Command) -> (Gateway, String) {
    let (child, url) = spawn_listening(command).await;
    (Gateway(child), url)
}

/// [`listening`] with the bare process (killed when dropped), for a test that signals it
/// itself.
pub(crate) async fn spawn_listening(
    mut command: tokio::process::Command,
) -> (tokio::process::Child, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the gateway says where it listens")
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (child, url)
}

/// A token and its digest, made by `psych serve-token`.
pub(crate) fn token(name: &str) -> (String, String) {
    let output = std::process::Command::new(PSYCH)
        .args(["serve-token", name])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let stderr = String::from_utf8(output.stderr).unwrap();
    let digest = stderr
        .split('"')
        .find(|part| part.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("a digest in {stderr}"))
        .to_owned();
    (token, digest)
}

/// `psych serve` over stdio on the `mcpServers` file `config`, logging under `dir`, with
/// `flags`: the transport for an rmcp client (stderr discarded).
pub(crate) fn stdio_gateway(
    config: &std::path::Path,
    dir: &std::path::Path,
    flags: &[&str],
) -> rmcp::transport::TokioChildProcess {
    use rmcp::transport::ConfigureCommandExt as _;
    rmcp::transport::TokioChildProcess::new(tokio::process::Command::new(PSYCH).configure(|c| {
        c.arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--dir")
            .arg(dir)
            .args(flags)
            .stderr(Stdio::null());
    }))
    .expect("psych serve starts")
}

/// The handle an elided result's preview names (`… handle "run-1:7" …`), if it names one.
pub(crate) fn handle_in(shown: &str) -> Option<&str> {
    shown
        .split("handle \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
}

/// The handle `shown` (an elided preview) names, or a panic saying it names none.
pub(crate) fn expect_handle(shown: &str) -> String {
    handle_in(shown)
        .unwrap_or_else(|| panic!("a handle in {shown}"))
        .to_owned()
}

/// What `psych serve` on `config`, logging under `dir`, with `flags`, printed and how it
/// ended, its standard input closed: for a gateway refused at start.
pub(crate) fn serve_output(
    config: &std::path::Path,
    dir: &std::path::Path,
    flags: &[&str],
) -> std::process::Output {
    std::process::Command::new(PSYCH)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--dir")
        .arg(dir)
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .expect("psych serve runs")
}

/// Calls `tool`, an upstream's `hang` under `--announce-hang`, through `peer` and returns
/// the request once the upstream said it arrived: the next progress report `progress`
/// receives (progress 0 under the request's token), which is returned too.
pub(crate) async fn announced_hang(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    progress: &mut tokio::sync::mpsc::UnboundedReceiver<rmcp::model::ProgressNotificationParam>,
    tool: &str,
) -> (
    rmcp::service::RequestHandle<rmcp::RoleClient>,
    rmcp::model::ProgressNotificationParam,
) {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
    let call = peer
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new(
                tool.to_owned(),
            ))),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .expect("the call is sent");
    let note = tokio::time::timeout(Duration::from_secs(60), progress.recv())
        .await
        .expect("the call reaches the upstream")
        .expect("the client still hears progress");
    (call, note)
}

/// A result's text blocks, joined.
pub(crate) fn text(result: &rmcp::model::CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect()
}

/// A client session (rmcp's, no handler) on a new `psych serve` over stdio, once every
/// upstream is listed (known from the kept catalogue, or listed after it started).
pub(crate) async fn listed_session(
    config: &std::path::Path,
    dir: &std::path::Path,
    flags: &[&str],
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    use rmcp::ServiceExt as _;
    let session = ().serve(stdio_gateway(config, dir, flags)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = session.list_all_tools().await.unwrap();
            if !serde_json::to_string(&tools)
                .unwrap()
                .contains("not listed yet")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("every upstream is listed");
    session
}

/// Calls `name` with `arguments` (an object) through `session`; its text, the call having
/// succeeded (a failed result fails the test, saying which and why).
pub(crate) async fn call_ok(
    session: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    name: &str,
    arguments: serde_json::Value,
) -> String {
    let serde_json::Value::Object(arguments) = arguments else {
        panic!("{name}: arguments are an object");
    };
    let result = session
        .call_tool(
            rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(arguments),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_ne!(result.is_error, Some(true), "{name}: {}", text(&result));
    text(&result)
}

/// The `Mcp-Session-Id` of a raw HTTP answer (its headers, as text).
pub(crate) fn session_id(answer: &str) -> String {
    answer
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("a session id in {answer}"))
}

/// The tool results of every log in `folder` (an identity's folder under `<dir>/serve/`),
/// each log opened (and so checked whole) by psych-record-log: (tool name, readable text).
pub(crate) fn logged_in(folder: &std::path::Path) -> Vec<(String, String)> {
    let mut results = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "plog") {
            continue;
        }
        let run = path.file_stem().unwrap().to_str().unwrap();
        let run = psych_types::RunId::new(run).unwrap();
        let (log, _) = psych_record_log::RecordLog::open_read_only(folder, &run)
            .unwrap_or_else(|e| panic!("{} opens intact: {e}", path.display()));
        for logged in log.iter() {
            if let psych_types::Record::ToolResult(result) = logged.unwrap().record {
                results.push((result.name, result.output.readable_text().into_owned()));
            }
        }
    }
    results
}
