//! `psych demo` run as a process: its output snapshotted (temporary paths redacted), and
//! every request body `--dump` writes (Anthropic, Chat Completions and Responses) parsed as
//! JSON and passed through the prompt-assembly rule checker.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::process::Command;

use psych_test_support::rules;

#[test]
fn demo_plays_the_script_and_dumps_valid_requests() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("requests");
    let out = Command::new(env!("CARGO_BIN_EXE_psych"))
        .args(["demo", "--dump"])
        .arg(&dump)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.is_empty(), "no progress off a terminal: {stderr}");
    let stdout = stdout.replace(&dump.display().to_string(), "[dump]");
    for line in stdout.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }
    // What the script is there to show.
    assert!(stdout.contains("2 in parallel"), "{stdout}");
    assert!(stdout.contains("psych_list_tools"), "{stdout}");
    assert!(stdout.contains("psych_describe_tool"), "{stdout}");
    assert!(stdout.contains("psych_call_tool"), "{stdout}");
    assert!(stdout.contains("elided    demo:"), "{stdout}");
    assert!(stdout.contains("crm_export_invoice"), "{stdout}");
    assert!(stdout.contains("not a provider's"), "{stdout}");
    insta::assert_snapshot!("demo_output", stdout);

    let mut files: Vec<_> = std::fs::read_dir(&dump)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let (mut anthropic, mut openai, mut responses) = (0, 0, 0);
    for file in &files {
        let body = std::fs::read_to_string(file).unwrap();
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let _: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        let verdict = if name.ends_with(".anthropic.json") {
            anthropic += 1;
            rules::check_anthropic_body(&body, true)
        } else if name.ends_with(".openai.json") {
            openai += 1;
            rules::check_openai_body(&body)
        } else if name.ends_with(".responses.json") {
            responses += 1;
            rules::check_responses_body(&body)
        } else {
            panic!("an unexpected file in the dump: {name}");
        };
        assert_eq!(verdict, Ok(()), "{name} breaks the provider's rules");
    }
    assert!(anthropic > 2, "{files:?}");
    assert_eq!(anthropic, openai, "{files:?}");
    assert_eq!(anthropic, responses, "{files:?}");
    assert!(
        stdout.contains(&format!("{} request bodies written to [dump]", files.len())),
        "{stdout}"
    );
}

#[test]
fn demo_help_says_what_it_is_for() {
    let out = Command::new(env!("CARGO_BIN_EXE_psych"))
        .args(["demo", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("scripted multi-turn Run"), "{help}");
    assert!(help.contains("Example: `psych demo --dump"), "{help}");
    assert!(help.contains("Exit codes"), "{help}");
}
