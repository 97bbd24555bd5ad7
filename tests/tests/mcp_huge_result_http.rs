//! Issue 27 over streamable HTTP: a 200 MiB tool result sent as one `application/json`
//! body reaches `call_tool` with its text kept in a file (spilled), not refused, and costs
//! psych-mcp memory far below its size. A test binary of its own, so that the process's
//! peak memory is this test's alone (the test server, another process, holds the result in
//! memory to serve it: rmcp's server side makes the body whole).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod mcp_common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mib_json_body_arrives_in_a_file_with_bounded_memory() {
    mcp_common::a_huge_result_over_http(&["--json-response"], "JSON body").await;
}
