//! `psych-test-server`: the workspace's MCP test server (see `psych_test_server`).
//! Flags set its scenario; it serves stdio by default, or streamable HTTP on a loopback
//! address with `--http 127.0.0.1:0`.

use psych_test_server::Scenario;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let (scenario, mode) = match Scenario::from_args(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("psych-test-server: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    match scenario.serve(mode).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("psych-test-server: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
