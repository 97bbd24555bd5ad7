//! What the live tests and the benchmarks share: `psych-test-server` over HTTP as a child
//! process. (The benchmarks include this file by path.)

#![allow(dead_code, reason = "each test binary uses a part of what is shared")]

use std::io::BufRead;

/// The test server binary.
pub(crate) const SERVER: &str = env!("CARGO_BIN_EXE_psych-test-server");

/// An HTTP test server as a child process; killed when dropped.
pub(crate) struct HttpServer {
    /// The server process (a test may kill it early).
    pub(crate) child: std::process::Child,
    /// Where it listens (`http://127.0.0.1:PORT/mcp`).
    pub(crate) url: String,
}

impl HttpServer {
    /// Starts `psych-test-server --http 127.0.0.1:0` with `args` and waits for its address.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut child = std::process::Command::new(SERVER)
            .args(["--http", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap()
            .to_owned();
        Self { child, url }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The process's peak resident memory (`VmHWM`), in bytes: what the memory tests bound
/// (each runs in a test binary of its own, so the figure is its test's).
pub(crate) fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

// Issue 27 over streamable HTTP, as a JSON body (`huge_result_http.rs`) and as a server-sent
// event (`huge_result_sse.rs`), each a test binary of its own.

/// The result's size.
pub(crate) const BYTES: usize = 200 * 1024 * 1024;
/// What the result may add to the process's peak memory: a JSON body's 16 MiB read into
/// memory before it goes to a file (up to 32 MiB of capacity as it grows), or an event's
/// 16 MiB before its data does; two 1 MiB chunks, the split's buffers, a runtime's and an
/// HTTP client's noise.
pub(crate) const ALLOWED_GROWTH: u64 = 64 * 1024 * 1024;

/// The last `len` bytes of `large_text(bytes)`, made line by line without holding it.
fn large_tail(bytes: usize, len: usize) -> String {
    let mut lines = std::collections::VecDeque::new();
    let (mut total, mut kept, mut n) = (0usize, 0usize, 0u64);
    while total < bytes {
        n += 1;
        let line = format!("line {n:06}: the quick brown fox jumps over the lazy dog\n");
        total += line.len();
        kept += line.len();
        lines.push_back(line);
        while kept - lines.front().map_or(0, String::len) >= len + 64 {
            kept -= lines.pop_front().map_or(0, |l| l.len());
        }
    }
    let mut tail: String = lines.into_iter().collect();
    tail.truncate(tail.len() - (total - bytes));
    tail[tail.len() - len..].to_owned()
}

/// A 200 MiB result from the HTTP test server started with `args`, sent as `what`: it
/// reaches `call_tool` with its text in a file, whole, and the process's peak memory grows
/// by less than [`ALLOWED_GROWTH`].
pub(crate) async fn a_huge_result_over_http(args: &[&str], what: &str) {
    use psych_types::ToolHost as _;
    let tail = large_tail(BYTES, 4096);
    let server = HttpServer::start(args);
    let before = peak_memory();
    let name = psych_types::ServerId::new("web").unwrap();
    let config = psych_mcp::ServerConfig {
        transport: psych_mcp::Transport::Http {
            url: server.url.clone(),
            headers: std::collections::BTreeMap::new(),
        },
        connection: psych_types::ConnectionSpec::new(name.clone()),
        extra: psych_types::JsonObject::new(),
    };
    let manager = psych_mcp::McpManager::builder(
        psych_mcp::McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap(),
    )
    .timeouts(psych_mcp::Timeouts::uniform(
        std::time::Duration::from_secs(600),
    ))
    .backoff(psych_mcp::Backoff::new(
        std::time::Duration::from_secs(600),
        std::time::Duration::from_secs(600),
    ))
    .build()
    .unwrap();
    let reachability = manager.add_server(name, config).await.unwrap();
    assert_eq!(reachability, psych_types::Reachability::Reachable);
    let mut arguments = psych_types::JsonObject::new();
    arguments.insert("bytes".into(), BYTES.into());
    let started = std::time::Instant::now();
    let output = manager
        .call_tool(
            &psych_types::ToolRef::parse("web", "large").unwrap(),
            arguments,
        )
        .await
        .unwrap();
    let took = started.elapsed();
    let peak = peak_memory();
    assert_eq!(output.spilled.len(), 1, "{output:?}");
    let text = &output.spilled[0].text;
    assert_eq!(text.len(), BYTES as u64);
    let mut end = vec![0; 4096];
    assert_eq!(text.read_at(BYTES as u64 - 4096, &mut end).unwrap(), 4096);
    assert!(end == tail.as_bytes(), "the text's end differs");
    let mut start = vec![0; 12];
    text.read_at(0, &mut start).unwrap();
    assert_eq!(start, b"line 000001:");
    manager.shutdown().await;
    let growth = peak.saturating_sub(before);
    println!(
        "a {} MiB {what}: spilled in {took:?}; peak RSS {} MiB (from {} MiB before, \
         growth {} MiB)",
        BYTES >> 20,
        peak >> 20,
        before >> 20,
        growth >> 20
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "peak memory grew by {growth} bytes for a {BYTES} byte {what}"
    );
}
