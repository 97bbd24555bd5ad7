//! Result passing (`{"$psych_result": ...}`): what a reference is replaced by, read from a
//! source as a read would, and what is refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::sources::{Indexed, text_log};
use proptest::prelude::*;
use psych_reader_tool::passing::{PassError, ReferenceError, Referenced, substitute};
use psych_reader_tool::{CallError, Limits, Reader, ResultReference};
use serde_json::{Value, json};

fn reference(value: Value) -> ResultReference {
    match value {
        Value::Object(object) => ResultReference::from_object(&object).unwrap().unwrap(),
        _ => unreachable!(),
    }
}

/// The lines `offset..offset + limit` of `text`, each with its break, as the reference
/// should pass them (`None`: the offset is past the end).
fn expected(text: &str, offset: u64, limit: Option<u64>) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    if offset > 0 && offset as usize >= lines.len() {
        return None;
    }
    let end = limit.map_or(lines.len(), |l| {
        (offset + l).min(lines.len() as u64) as usize
    });
    Some(lines[offset as usize..end].concat())
}

#[test]
fn whole_text_lines_and_json_values_replace_the_reference() {
    let text = "{\"items\": [{\"id\": 7, \"name\": \"a\\nb\"}], \"n\": 1}\n";
    let (log, handle) = text_log("run-1", "alpha\nbeta\ngamma\ndelta");
    let reader = Reader::new(&log);
    let h = handle.to_string();
    let got = |v: Value| {
        let r = reader.referenced(&reference(v), 1 << 20).unwrap();
        (r.value, r.bytes, r.more)
    };
    assert_eq!(
        got(json!({"$psych_result": h})),
        (json!("alpha\nbeta\ngamma\ndelta"), 22, false)
    );
    assert_eq!(
        got(json!({"$psych_result": h, "offset": 1, "limit": 2})),
        (json!("beta\ngamma\n"), 11, true)
    );
    assert_eq!(
        got(json!({"$psych_result": h, "offset": 3})),
        (json!("delta"), 5, false)
    );

    let (json_log, json_handle) = text_log("run-2", text);
    let reader = Reader::new(&json_log);
    let j = json_handle.to_string();
    let value = |pointer: &str| {
        reader
            .referenced(
                &reference(json!({"$psych_result": j, "pointer": pointer})),
                1 << 20,
            )
            .map(|r| r.value)
    };
    assert_eq!(value("/items/0/id").unwrap(), json!(7));
    assert_eq!(value("/items/0").unwrap(), json!({"id": 7, "name": "a\nb"}));
    assert_eq!(value("").unwrap()["n"], json!(1));
    assert!(matches!(
        value("/items/3"),
        Err(PassError::Reference(ReferenceError::NoSuchValue(_)))
    ));
    let not_json = Reader::new(&log)
        .referenced(
            &reference(json!({"$psych_result": h, "pointer": ""})),
            1 << 20,
        )
        .unwrap_err();
    assert!(
        matches!(not_json, PassError::Reference(ReferenceError::NotJson(_))),
        "{not_json}"
    );
}

#[test]
fn past_the_end_too_large_and_foreign_handles_are_refused() {
    let (log, handle) = text_log("run-1", "one\ntwo\n");
    let reader = Reader::new(&log);
    let h = handle.to_string();
    let refused = |v: Value, room| reader.referenced(&reference(v), room).unwrap_err();
    let past = refused(json!({"$psych_result": h, "offset": 2}), 100);
    assert!(
        matches!(
            past,
            PassError::Reference(ReferenceError::OffsetPastEnd {
                offset: 2,
                lines: 2
            })
        ),
        "{past}"
    );
    let large = refused(json!({"$psych_result": h}), 7);
    assert!(
        matches!(
            large,
            PassError::Reference(ReferenceError::TooLarge { needed: 8, .. })
        ),
        "{large}"
    );
    // A slice within the bound passes from a result larger than it.
    assert_eq!(
        reader
            .referenced(&reference(json!({"$psych_result": h, "limit": 1})), 4)
            .unwrap(),
        Referenced {
            value: json!("one\n"),
            bytes: 4,
            more: true
        }
    );
    for foreign in ["other-run:1", "run-1:0", "run-1:9", "not a handle"] {
        let error = refused(json!({"$psych_result": foreign}), 100);
        assert!(
            matches!(error, PassError::Call(CallError::InvalidDeferredHandle(_))),
            "{foreign}: {error}"
        );
    }
}

#[test]
fn one_calls_references_share_the_bound() {
    let (log, handle) = text_log("run-1", "0123456789");
    let reader = Reader::new(&log);
    let h = handle.to_string();
    let mut args = json!({"a": {"$psych_result": h}, "b": [{"$psych_result": h}]});
    let mut twice = args.clone();
    let passed = substitute(&mut args, 20, |r, room| reader.referenced(r, room)).unwrap();
    assert_eq!((passed.references, passed.bytes), (2, 20));
    assert_eq!(args, json!({"a": "0123456789", "b": ["0123456789"]}));
    let failed = substitute(&mut twice, 19, |r, room| reader.referenced(r, room)).unwrap_err();
    assert_eq!(failed.at, "/b/0");
    assert_eq!(
        failed.error.to_string(),
        "the reference needs at least 10 bytes, over what may still be passed here (19 bytes \
         allowed here, 10 already passed by this call's earlier references); pass a part \
         with offset and limit"
    );
}

proptest! {
    /// Any slice of any text is the text's own lines, whatever the chunk size and the
    /// source's line index.
    #[test]
    fn a_slice_is_the_texts_own_lines(
        lines in proptest::collection::vec("[a-zé]{0,7}", 0..40),
        trailing in any::<bool>(),
        offset in 0u64..45,
        limit in proptest::option::of(1u64..12),
        chunk in 1usize..16,
        stride in 1u64..20,
        room in proptest::option::of(0u64..300),
    ) {
        let mut text = lines.join("\n");
        if trailing {
            text.push('\n');
        }
        let (log, handle) = text_log("run-p", &text);
        let indexed = Indexed::new(log, 2, stride);
        let limits = Limits::builder().chunk_bytes(chunk).build().unwrap();
        let reader = Reader::with_limits(&indexed, limits);
        let asked = ResultReference { handle: handle.to_string(), offset, limit, pointer: None };
        let room = room.unwrap_or(u64::MAX);
        match (reader.referenced(&asked, room), expected(&text, offset, limit)) {
            (Ok(Referenced { value: Value::String(got), bytes, more }), Some(want)) => {
                prop_assert!(want.len() as u64 <= room);
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(bytes, want.len() as u64);
                let rest = expected(&text, offset + limit.unwrap_or(0), None);
                prop_assert_eq!(more, limit.is_some() && rest.is_some_and(|r| !r.is_empty()));
            }
            (Err(PassError::Reference(ReferenceError::TooLarge { needed, .. })), Some(want)) => {
                prop_assert!(want.len() as u64 > room);
                prop_assert!(needed > room);
            }
            (Err(PassError::Reference(ReferenceError::OffsetPastEnd { .. })), None) => {}
            (got, want) => prop_assert!(false, "got {:?}, want {:?}", got.map(|g| g.value), want),
        }
    }
}
