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
