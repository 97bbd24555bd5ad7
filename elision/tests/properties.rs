//! Properties of the estimator, the plan, previews and failure truncation (proptest).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::borrow::Cow;

use proptest::prelude::*;
use psych_elision::{Elider, Estimator, LINE_SLACK, PreviewConfig, Thresholds, plan};
use psych_types::{
    ContentBlock, History, HistoryItem, MemoryRecords, Projection, Record, RecordHandle,
    ResultProjector, ResultRef, RunId, StoredRef, TokenEstimator, ToolCallId, ToolOutput,
    ToolResult,
};

fn est(text: &str) -> u64 {
    Estimator::new().estimate_text(text)
}

/// Text from a small alphabet that hits every class, run rule and cluster rule often:
/// base64 and hex characters, spaces, newlines, JSON punctuation, a character of every
/// script the estimator weighs, combining marks, ZWJ emoji, flags, control bytes.
fn adversarial() -> impl Strategy<Value = String> {
    prop::collection::vec(atom(), 0..80).prop_map(|parts| parts.concat())
}

/// Long runs of one atom, a few of them: long lowercase, digit, space or base64-like runs
/// are where a run rule could go wrong.
fn runs() -> impl Strategy<Value = String> {
    prop::collection::vec((atom(), 1usize..400), 1..4)
        .prop_map(|runs| runs.into_iter().map(|(atom, n)| atom.repeat(n)).collect())
}

fn atom() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "z",
        "A",
        "Q",
        "0",
        "9",
        "+",
        "/",
        "=",
        "-",
        "_",
        ".",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "\"",
        ":",
        ",",
        "{",
        "}",
        "[",
        "]",
        "!",
        "é",
        "e\u{301}",
        "中",
        "語",
        "😀",
        "👩\u{200D}👧",
        "\u{200D}",
        "\u{FE0F}",
        "\u{1}",
        "\u{7f}",
        "ß",
        "aB1",
        "x9",
        // One character of each script class the estimator weighs (see `term` in
        // src/estimate.rs), so every step of the script weights is crossed and cut.
        "ł",
        "ư",
        "λ",
        "ж",
        "ա",
        "ש",
        "ب",
        "क",
        "ক",
        "ਕ",
        "ଓ",
        "త",
        "ක",
        "ก",
        "ཀ",
        "ა",
        "ệ",
        "—",
        "あ",
        "한",
        "（",
        "\u{1F1E9}\u{1F1EA}",
    ])
}

/// A base64 string of random bytes, optionally a data URI.
fn base64_text() -> impl Strategy<Value = String> {
    (prop::collection::vec(any::<u8>(), 0..300), any::<bool>()).prop_map(|(bytes, uri)| {
        let coded = psych_types::encode_base64(&bytes);
        if uri {
            format!("data:image/png;base64,{coded}")
        } else {
            coded
        }
    })
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        adversarial(),
        runs(),
        (runs(), adversarial(), runs()).prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        base64_text(),
        any::<String>(),
        "[ -~]{0,200}",
        "[a-f0-9]{0,80}",
        "[A-Za-z0-9+/]{0,120}",
        " {0,40}[a-z\"]{0,5}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn estimate_is_monotone_under_concatenation(a in any_text(), b in any_text()) {
        let ab = format!("{a}{b}");
        prop_assert!(est(&ab) >= est(&a), "appending lowered {:?}+{:?}", a, b);
        prop_assert!(est(&ab) >= est(&b), "prepending lowered {:?}+{:?}", a, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn estimate_never_drops_at_any_split_point(text in any_text()) {
        // Every char-boundary prefix and suffix estimates at most the whole, including a
        // base64 run split anywhere across the boundary.
        let whole = est(&text);
        for (at, _) in text.char_indices() {
            prop_assert!(est(&text[..at]) <= whole, "prefix {:?} of {:?}", &text[..at], text);
            prop_assert!(est(&text[at..]) <= whole, "suffix {:?} of {:?}", &text[at..], text);
        }
    }

    #[test]
    fn estimate_grows_with_each_appended_byte(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        // Also over raw bytes (not only UTF-8): the weight of a prefix never exceeds the whole.
        let e = Estimator::new();
        let mut last = 0;
        for end in 0..=bytes.len() {
            let now = e.estimate_bytes(&bytes[..end]);
            prop_assert!(now >= last, "dropped at {end} of {:?}", bytes);
            last = now;
        }
    }

    #[test]
    fn estimate_is_monotone_when_a_character_is_cut(
        text in adversarial(),
        cut in any::<prop::sample::Index>(),
    ) {
        // Cut anywhere, inside a multi-byte character too: the two halves are not UTF-8,
        // and neither estimates above the whole.
        let e = Estimator::new();
        let bytes = text.as_bytes();
        let at = cut.index(bytes.len() + 1);
        let whole = e.estimate_bytes(bytes);
        prop_assert!(e.estimate_bytes(&bytes[..at]) <= whole, "{:?} cut at {at}", text);
        prop_assert!(e.estimate_bytes(&bytes[at..]) <= whole, "{:?} cut at {at}", text);
    }

    #[test]
    fn base64_runs_split_across_a_boundary_stay_monotone(
        text in base64_text(),
        prefix in adversarial(),
        suffix in adversarial(),
        cut in any::<prop::sample::Index>(),
    ) {
        let at = cut.index(text.len() + 1);
        let (left, right) = text.split_at(at);
        let a = format!("{prefix}{left}");
        let b = format!("{right}{suffix}");
        let ab = format!("{a}{b}");
        prop_assert!(est(&ab) >= est(&a).max(est(&b)));
    }

    #[test]
    fn binary_estimate_is_monotone_in_size(a in any::<u64>(), b in any::<u64>()) {
        let e = Estimator::new();
        let (small, large) = (a.min(b), a.max(b));
        let (low, high) = (e.estimate_binary("image/png", small), e.estimate_binary("image/png", large));
        prop_assert!(low <= high);
    }
}

fn thresholds() -> impl Strategy<Value = Thresholds> {
    (1u64..2_000, 0u64..4_000).prop_map(|(per_result, extra)| {
        Thresholds::builder()
            .per_result(per_result)
            .per_batch(per_result + extra)
            .build()
            .unwrap()
    })
}

fn sizes() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![0u64..50, 0u64..600, 0u64..3_000, Just(100u64), Just(500u64)],
        0..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn plan_follows_the_spec(sizes in sizes(), t in thresholds()) {
        let p = plan(&sizes, &t);
        let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
        let kept: u128 = sizes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !p.is_elided(i))
            .map(|(_, &s)| u128::from(s))
            .sum();
        prop_assert_eq!(p.len(), sizes.len());
        prop_assert_eq!(p.total(), total);
        prop_assert_eq!(p.kept(), kept);

        if total < u128::from(t.per_result()) {
            // Never elides when the sum is under the per-result threshold.
            prop_assert_eq!(p.elided().count(), 0);
            return Ok(());
        }
        // Always elides every result at or over the per-result threshold.
        for (i, &s) in sizes.iter().enumerate() {
            if s >= t.per_result() {
                prop_assert!(p.is_elided(i), "large result {i} kept");
            }
        }
        // The kept total ends under the batch threshold (always reachable: eliding
        // everything keeps zero).
        prop_assert!(kept < u128::from(t.per_batch()), "kept {kept} of {total}");

        // A middling result is elided only if the batch was over budget after step 2 and
        // it was among the largest remaining (no kept middling result ranks above it).
        let after_large: u128 =
            sizes.iter().filter(|&&s| s < t.per_result()).map(|&s| u128::from(s)).sum();
        for (i, &s) in sizes.iter().enumerate() {
            if s < t.per_result() && p.is_elided(i) {
                prop_assert!(
                    after_large >= u128::from(t.per_batch()),
                    "middling {i} elided under budget"
                );
                for (j, &other) in sizes.iter().enumerate() {
                    if !p.is_elided(j) {
                        prop_assert!(
                            other < s || (other == s && j > i),
                            "kept {j} ({other}) ranks above elided {i} ({s})"
                        );
                    }
                }
            }
        }
        // Minimal: un-eliding the last (smallest-ranked) middling elision would go over.
        let middling: Vec<usize> = p.elided().filter(|&i| sizes[i] < t.per_result()).collect();
        if let Some(&last) = middling.iter().min_by(|&&x, &&y| sizes[x].cmp(&sizes[y]).then(y.cmp(&x))) {
            prop_assert!(kept + u128::from(sizes[last]) >= u128::from(t.per_batch()));
        }
        // Deterministic.
        prop_assert_eq!(plan(&sizes, &t), p);
    }
}

/// The omitted bytes `a..b` and the offset `K` a preview's marker line names.
fn marker(preview: &str) -> (usize, usize, u64) {
    let at = preview.find("[… line").unwrap();
    let line = &preview[at..at + preview[at..].find('\n').unwrap()];
    let bytes = &line[line.find("(bytes ").unwrap() + 7..];
    let (a, rest) = bytes.split_once("..").unwrap();
    let b = rest.split_once(' ').unwrap().0;
    let k = &line[line.find("offset=").unwrap() + 7..];
    let k = k.split_once(' ').unwrap().0;
    (a.parse().unwrap(), b.parse().unwrap(), k.parse().unwrap())
}

fn handle() -> RecordHandle {
    RecordHandle::new(RunId::new("run-9").unwrap(), 12)
}

fn config() -> impl Strategy<Value = PreviewConfig> {
    (0usize..60, 0usize..60, 0usize..80).prop_map(|(head, tail, failure)| {
        PreviewConfig::builder()
            .head_chars(head)
            .tail_chars(tail)
            .failure_chars(failure)
            .build()
    })
}

fn preview_text() -> impl Strategy<Value = String> {
    prop_oneof![
        adversarial(),
        any::<String>(),
        prop::collection::vec(adversarial(), 0..8).prop_map(|parts| parts.concat()),
        "[ -~\n]{0,2000}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_500))]

    #[test]
    fn previews_are_valid_never_longer_and_identity_on_overlap(text in preview_text(), c in config()) {
        let out = c.preview(&text, &handle());
        // A `str` is valid UTF-8 by construction; check it also round-trips as bytes.
        prop_assert!(std::str::from_utf8(out.as_bytes()).is_ok());
        prop_assert!(out.len() <= text.len());
        let chars = text.chars().count();
        if c.head_chars() + c.tail_chars() >= chars {
            prop_assert!(matches!(out, Cow::Borrowed(_)));
            prop_assert_eq!(out.as_ref(), text.as_str());
        }
        if let Cow::Owned(preview) = &out {
            // Strictly shorter, shows the original's head and tail (each cut moved at most
            // its slack to a line break), names the handle.
            prop_assert!(preview.len() < text.len());
            let head_min = c.head_chars() - LINE_SLACK.min(c.head_chars() / 2);
            let tail_min = c.tail_chars() - LINE_SLACK.min(c.tail_chars() / 2);
            let head: String = text.chars().take(head_min).collect();
            let tail: String = text.chars().rev().take(tail_min).collect::<Vec<_>>().into_iter().rev().collect();
            prop_assert!(preview.starts_with(&head));
            let guidance_at = preview.rfind("\n\n[Elided tool result").unwrap();
            let body = &preview[..guidance_at];
            prop_assert!(body.trim_end_matches('\n').ends_with(tail.trim_end_matches('\n')) || tail.is_empty());
            let ending = "{\"handle\": \"run-9:12\", \"grep\": \"error\"}.]";
            prop_assert!(preview.ends_with(ending), "{}", preview);
            // The marker: bytes a..b are what is omitted (the head is text[..a], the tail
            // text[b..]) and offset=K is the reader's offset of the line holding byte a.
            let (a, b, k) = marker(preview);
            prop_assert!(a < b && b <= text.len());
            prop_assert!(preview.starts_with(&text[..a]));
            prop_assert!(body.trim_end_matches('\n').ends_with(text[b..].trim_end_matches('\n')));
            prop_assert_eq!(k, text[..a].bytes().filter(|&x| x == b'\n').count() as u64);
        }
        // Deterministic.
        prop_assert_eq!(c.preview(&text, &handle()), out);
    }

    #[test]
    fn failures_are_a_prefix_of_at_least_the_asked_characters(text in preview_text(), c in config()) {
        let kept = c.truncate_failure(&text);
        prop_assert!(text.starts_with(kept));
        let kept_chars = kept.chars().count();
        let chars = text.chars().count();
        prop_assert!(kept_chars >= c.failure_chars().min(chars));
        if chars <= c.failure_chars() {
            prop_assert_eq!(kept, text.as_str());
        }
    }

    #[test]
    fn the_elider_is_deterministic_and_gives_one_view_per_result(
        texts in prop::collection::vec((preview_text(), any::<bool>()), 0..12),
        t in thresholds(),
        c in config(),
    ) {
        let elider = Elider::builder().thresholds(t).preview(c).build();
        let outputs: Vec<ToolOutput> = texts
            .iter()
            .map(|(text, failed)| if *failed { ToolOutput::error(text.clone()) } else { ToolOutput::text(text.clone()) })
            .collect();
        let run = RunId::new("r").unwrap();
        let handles: Vec<RecordHandle> = (0..outputs.len() as u64).map(|i| RecordHandle::new(run.clone(), i)).collect();
        let batch: Vec<ResultRef<'_>> = handles.iter().zip(&outputs).map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            }).collect();
        let first = elider.project(&batch);
        let second = elider.project(&batch);
        prop_assert_eq!(first.len(), batch.len());
        prop_assert_eq!(&first, &second);
        for (out, (text, failed)) in first.iter().zip(&texts) {
            if let Projection::Replaced(view) = out {
                prop_assert!(view.len() < text.len());
                if *failed {
                    prop_assert!(text.starts_with(view.as_str()));
                }
            }
        }
    }
}

/// A block from MCP JSON.
fn block(value: serde_json::Value) -> ContentBlock {
    let serde_json::Value::Object(map) = value else {
        unreachable!("a block is an object")
    };
    ContentBlock::from_object(map)
}

/// A block other than text, of every kind a preview lists.
fn other_block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        (1usize..3000).prop_map(|n| ContentBlock::image("image/png", vec![7; n])),
        (1usize..500).prop_map(|n| ContentBlock::audio("audio/wav", vec![3; n])),
        preview_text().prop_map(|text| block(serde_json::json!({
            "type": "resource",
            "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": text},
        }))),
        Just(block(serde_json::json!({
            "type": "resource",
            "resource": {"uri": "file:///b.bin", "mimeType": "application/octet-stream", "blob": "AAECAwQF"},
        }))),
        Just(block(serde_json::json!({"type": "resource_link", "uri": "file:///c.txt", "name": "c"}))),
        (0u64..1_000_000).prop_map(|size| block(serde_json::json!({
            "type": "resource_link", "uri": "file:///d.txt", "name": "d", "mimeType": "text/plain", "size": size,
        }))),
        Just(block(serde_json::json!({"type": "chart", "points": [1, 2, 3]}))),
    ]
}

/// Text blocks (often long) and blocks of other kinds, mixed in any order.
fn mixed_output() -> impl Strategy<Value = ToolOutput> {
    prop::collection::vec(
        prop_oneof![
            3 => (preview_text(), 1usize..20).prop_map(|(t, n)| ContentBlock::text(t.repeat(n))),
            2 => other_block(),
        ],
        1..6,
    )
    .prop_map(ToolOutput::from_blocks)
}

/// One random output: text (often past both preview windows), a failure, JSON, text with
/// an image, or text mixed with blocks of every other kind, as a success or a failure.
fn stored_output() -> impl Strategy<Value = ToolOutput> {
    prop_oneof![
        4 => preview_text().prop_map(ToolOutput::text),
        2 => (preview_text(), 1usize..40).prop_map(|(t, n)| ToolOutput::text(t.repeat(n))),
        2 => preview_text().prop_map(ToolOutput::error),
        1 => prop::collection::vec(0u32..500, 0..200)
            .prop_map(|v| ToolOutput::json(serde_json::json!({ "items": v }))),
        1 => (preview_text(), 1usize..3000).prop_map(|(t, n)| ToolOutput::from_blocks(vec![
            ContentBlock::text(t),
            ContentBlock::image("image/png", vec![7; n]),
        ])),
        2 => mixed_output(),
        1 => mixed_output().prop_map(|mut output| {
            output.is_error = true;
            output
        }),
        1 => (preview_text(), 1usize..3000).prop_map(|(t, n)| {
            let mut output = ToolOutput::from_blocks(vec![
                ContentBlock::text(t),
                ContentBlock::image("image/png", vec![7; n]),
            ]);
            output.is_error = true;
            output
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The lazy projection (stored summaries, windows read through the source) gives the
    /// bytes the whole-output projection gives, with estimates stored or not.
    #[test]
    fn projecting_stored_results_equals_projecting_whole_ones(
        outputs in prop::collection::vec(stored_output(), 0..8),
        t in thresholds(),
        c in config(),
        stored_estimates in any::<bool>(),
    ) {
        let elider = Elider::builder().thresholds(t).preview(c).build();
        let mut log = MemoryRecords::new(RunId::new("r").unwrap());
        let handles: Vec<RecordHandle> = outputs.iter().enumerate().map(|(i, output)| {
            log.push(Record::ToolResult(ToolResult {
                target: None,
                call_id: ToolCallId::new(format!("c{i}")).unwrap(),
                name: "t".into(),
                output: output.clone(),
            }))
        }).collect();
        let estimator = Estimator::new();
        let history = History::from_records(
            &log.records(),
            stored_estimates.then_some(&estimator as &dyn TokenEstimator),
        );
        let batch: Vec<ResultRef<'_>> = handles.iter().zip(&outputs).map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            }).collect();
        let whole = elider.project(&batch);
        let stored: Vec<StoredRef<'_>> = history.entries.iter().filter_map(|entry| match &entry.item {
            HistoryItem::Result(stored) => Some(StoredRef { handle: &entry.handle, stored }),
            HistoryItem::Record(_) => None,
        }).collect();
        let lazy = elider.project_stored(&stored, &log).unwrap();
        prop_assert_eq!(lazy.len(), stored.len());
        prop_assert_eq!(lazy, whole);
    }
}

#[test]
fn thresholds_refuse_zero_and_inversion_at_build_time() {
    assert!(Thresholds::builder().per_result(0).build().is_err());
    assert!(Thresholds::builder().per_batch(0).build().is_err());
    assert!(
        Thresholds::builder()
            .per_result(2)
            .per_batch(1)
            .build()
            .is_err()
    );
}
