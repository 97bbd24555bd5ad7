//! A handle this Run never emitted is the typed `invalid_deferred_handle` error in every
//! shape: forged, another Run's valid handle, truncated, with its Run altered, or naming a
//! record that is not a tool result. Never a tool result, never another Run's data.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::convert::Infallible;

use crate::sources::{Counting, text_log};
use proptest::prelude::*;
use psych_reader_tool::{Answer, CallError, HandleProblem, ReadArgs, Reader};
use psych_types::MemoryRecords;
use serde_json::json;

/// Two Runs with the same layout: record 0 a user message, record 1 a tool result.
fn two_runs() -> (MemoryRecords, MemoryRecords) {
    let (a, _) = text_log("run-a", "tenant A's secret\n");
    let (b, _) = text_log("run-b", "tenant B's secret\n");
    (a, b)
}

/// Reads `handle` through `source` both ways (JSON call and parsed args) and returns the
/// handle problem; fails the test on any other outcome.
fn problem(source: &MemoryRecords, handle: &str) -> HandleProblem {
    let reader = Reader::new(source);
    let by_call = reader.call(&json!({"handle": handle})).unwrap_err();
    let by_args = reader.read(&ReadArgs::new(handle)).unwrap_err();
    for err in [&by_call, &by_args] {
        assert_eq!(err.code(), "invalid_deferred_handle", "{handle:?}");
        assert!(
            err.to_string().starts_with("invalid_deferred_handle: "),
            "{err}"
        );
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    let problem = by_call.handle_problem().unwrap().clone();
    assert_eq!(Some(&problem), by_args.handle_problem());
    problem
}

#[test]
fn the_valid_handle_reads() {
    let (a, _) = two_runs();
    let answer = Reader::new(&a).call(&json!({"handle": "run-a:1"})).unwrap();
    assert!(answer.render().ends_with("tenant A's secret"));
}

#[test]
fn a_forged_handle_is_invalid() {
    let (a, _) = two_runs();
    assert_eq!(problem(&a, "run-a:2"), HandleProblem::Unresolved);
    assert_eq!(
        problem(&a, "run-a:18446744073709551615"),
        HandleProblem::Unresolved
    );
    for forged in [
        "../../etc/passwd",
        "run-a:1; rm -rf /",
        "run-a:0x1",
        "run-a:01",
        "run-a:+1",
    ] {
        assert!(
            matches!(problem(&a, forged), HandleProblem::Malformed(_)),
            "{forged}"
        );
    }
}

#[test]
fn a_valid_handle_of_another_run_is_invalid_and_never_reaches_the_source() {
    let (a, b) = two_runs();
    let handle_of_b = "run-b:1";
    assert!(
        Reader::new(&b)
            .call(&json!({"handle": handle_of_b}))
            .is_ok()
    );
    let counted = Counting::new(a);
    let err = Reader::new(&counted)
        .call(&json!({"handle": handle_of_b, "grep": "secret"}))
        .unwrap_err();
    let Some(HandleProblem::OtherRun { named, serving }) = err.handle_problem() else {
        panic!("{err:?}");
    };
    assert_eq!((named.as_str(), serving.as_str()), ("run-b", "run-a"));
    assert_eq!(
        counted.reads.get(),
        0,
        "no byte of run-a is read for run-b's handle"
    );
    assert_eq!(
        err.to_string(),
        "invalid_deferred_handle: \"run-b:1\" names run \"run-b\"; this reader serves run \
         \"run-a\" only"
    );
}

#[test]
fn a_truncated_handle_is_invalid() {
    let (a, _) = two_runs();
    for truncated in ["run-a:", "run-a", "run-", "run-a1", ":1", "1", ""] {
        assert!(
            matches!(problem(&a, truncated), HandleProblem::Malformed(_)),
            "{truncated:?}"
        );
    }
    // Cut inside the Run name, the rest still parses: it names another Run.
    assert!(matches!(
        problem(&a, "run-:1"),
        HandleProblem::OtherRun { .. }
    ));
}

#[test]
fn a_handle_with_its_run_altered_is_invalid() {
    let (a, _) = two_runs();
    for altered in [
        "run-b:1", "RUN-A:1", "run-a-:1", "run-aa:1", "xrun-a:1", "run_a:1",
    ] {
        assert!(
            matches!(problem(&a, altered), HandleProblem::OtherRun { .. }),
            "{altered}"
        );
    }
    for mangled in ["run a:1", " run-a:1", "run-a:1 ", "run-ä:1", "run-a:1:1"] {
        assert!(
            matches!(problem(&a, mangled), HandleProblem::Malformed(_)),
            "{mangled:?}"
        );
    }
}

#[test]
fn a_handle_of_a_record_that_is_not_a_tool_result_is_invalid() {
    let (a, _) = two_runs();
    assert_eq!(problem(&a, "run-a:0"), HandleProblem::NotToolResult);
    assert_eq!(
        Reader::new(&a)
            .call(&json!({"handle": "run-a:0"}))
            .unwrap_err()
            .to_string(),
        "invalid_deferred_handle: \"run-a:0\" names a record of this run that is not a tool \
         result"
    );
}

#[test]
fn the_error_is_a_value_of_the_crate_not_a_tool_result() {
    let (a, _) = two_runs();
    let result: Result<Answer, CallError<Infallible>> =
        Reader::new(&a).call(&json!({"handle": "run-b:1"}));
    let err = result.unwrap_err();
    assert!(matches!(err, CallError::InvalidDeferredHandle(_)));
    let source: &dyn std::error::Error = &err;
    assert!(source.to_string().contains("invalid_deferred_handle"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any handle string but the one tool result's is the corruption error, never a page.
    #[test]
    fn every_other_handle_string_is_invalid(handle in "([a-z:-]{0,8}|run-[ab]:[0-9]{1,3}|.{0,20})") {
        prop_assume!(handle != "run-a:1");
        let (a, _) = two_runs();
        let err = Reader::new(&a).call(&json!({"handle": handle})).unwrap_err();
        prop_assert_eq!(err.code(), "invalid_deferred_handle");
    }

    /// Changing any one byte of a valid handle (to any other printable ASCII) either gives
    /// the corruption error or, when it lands on another digit, a handle of the same Run.
    #[test]
    fn one_byte_mutations_never_cross_runs(at in 0usize..7, byte in 0x20u8..0x7f) {
        let (a, _) = two_runs();
        let mut handle = b"run-a:1".to_vec();
        prop_assume!(handle[at] != byte);
        handle[at] = byte;
        let handle = String::from_utf8(handle).unwrap();
        match Reader::new(&a).call(&json!({"handle": handle})) {
            Err(err) => prop_assert_eq!(err.code(), "invalid_deferred_handle"),
            Ok(answer) => {
                // Only `run-a:0`..`run-a:9` parse into this Run; 1 is the only tool result.
                prop_assert!(false, "{handle} read {answer:?}");
            }
        }
    }
}
