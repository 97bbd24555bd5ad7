//! The library's cache report ([`CacheReport`]): estimated tokens read and written as the
//! providers bill them, checked against the billing simulator of the tests
//! (`common::billing`, the oracle) on both scripted sessions, both providers, both block
//! readings and minimums of 1,024 and 4,096 tokens; the report of the 20-turn session for
//! this crate's assembly and a naive one is a snapshot, so its figures are pinned. Also
//! `render_anthropic_sized`: no breakpoint on a prefix below the minimum, and never less
//! read than the plain placement.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use common::billing::{self, AnthropicModel, Reading};
use common::*;
use psych_prompt_assembly::{BlockReading, CacheReport, CacheRules, Part, RenderedRequest};
use psych_types::TokenEstimator;

/// About four bytes a token (the real estimator is used in the `psych-tests` crate).
struct Bytes4;

impl TokenEstimator for Bytes4 {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len.div_ceil(3)
    }
}

const OPENAI_READ_PRICE: f64 = 0.25;

fn report(
    rendered: &[Rendered],
    pick: fn(&Rendered) -> &RenderedRequest,
    rules: CacheRules,
) -> CacheReport {
    let requests: Vec<RenderedRequest> = rendered.iter().map(|r| pick(r).clone()).collect();
    CacheReport::new(&requests, &Bytes4, rules)
}

fn readings() -> [(Reading, BlockReading); 2] {
    [
        (Reading::TopLevel, BlockReading::TopLevel),
        (Reading::Nested, BlockReading::Nested),
    ]
}

#[test]
fn the_report_agrees_with_the_billing_simulator() {
    for (script, turns) in [("20-turn", twenty_turns()), ("wide", wide_turns())] {
        let session = play(&turns);
        for (variant, rendered) in [
            ("psych", render_session(&session, &zone1())),
            ("per-step", render_naive(&session, false, true)),
        ] {
            let anthropic: Vec<&RenderedRequest> = rendered.iter().map(pick_anthropic).collect();
            // The renderer's nested counts are what the simulator reads from the body.
            for request in &anthropic {
                assert_eq!(
                    request.nested_blocks(),
                    billing::nested_counts(request.body()).as_slice()
                );
            }
            for min in [1024, 4096] {
                for (sim, lib) in readings() {
                    let oracle =
                        billing::anthropic_bill(&anthropic, &Bytes4, AnthropicModel::new(min, sim));
                    let ours = report(
                        &rendered,
                        pick_anthropic,
                        CacheRules::anthropic(min).reading(lib),
                    );
                    let case = format!("{script} {variant} {min} {sim:?}");
                    assert_eq!(ours.total_tokens(), oracle.input, "{case}");
                    assert_eq!(ours.read_tokens(), oracle.read, "{case}");
                    assert_eq!(ours.written_tokens(), oracle.written, "{case}");
                    assert!((ours.cost() - oracle.cost()).abs() < 1e-12, "{case}");
                }
            }
            if variant != "psych" {
                continue;
            }
            let openai: Vec<&RenderedRequest> = rendered.iter().map(pick_openai).collect();
            let oracle = billing::openai_bill(&openai, &Bytes4, 1024, 128, OPENAI_READ_PRICE);
            let ours = report(
                &rendered,
                pick_openai,
                CacheRules::openai(OPENAI_READ_PRICE),
            );
            assert_eq!(
                (
                    ours.total_tokens(),
                    ours.read_tokens(),
                    ours.written_tokens()
                ),
                (oracle.input, oracle.read, 0),
                "{script} {variant} openai"
            );
            assert!((ours.cost() - oracle.cost()).abs() < 1e-12);
        }
    }
}

#[test]
fn twenty_turn_session_reads_far_more_than_a_naive_assembly() {
    let session = play(&twenty_turns());
    let ours = render_session(&session, &zone1());
    let naive = render_naive(&session, true, true);
    let mut summary = String::new();
    for (name, pick, rules) in [
        (
            "anthropic",
            pick_anthropic as fn(&Rendered) -> &RenderedRequest,
            CacheRules::anthropic(1024),
        ),
        ("openai", pick_openai, CacheRules::openai(OPENAI_READ_PRICE)),
    ] {
        let good = report(&ours, pick, rules);
        let bad = report(&naive, pick, rules);
        assert!(
            good.read_share() > bad.read_share() + 0.5,
            "{name}: {} vs {}",
            good.read_share(),
            bad.read_share()
        );
        assert!(good.cost() < 0.5 && bad.cost() >= 1.0, "{name}");
        // The naive assembly loses the cache at zone 1 on every call after the first.
        assert!(
            bad.rows()[1..]
                .iter()
                .all(|row| row.first_change == Some(Part::StaticSystem))
        );
        summary.push_str(&format!(
            "{name}: {} requests, psych reads {:.1}% of {} estimated tokens (cost {:.3}x), \
             naive {:.1}% of {} (cost {:.3}x)\n",
            good.rows().len(),
            good.read_share() * 100.0,
            good.total_tokens(),
            good.cost(),
            bad.read_share() * 100.0,
            bad.total_tokens(),
            bad.cost(),
        ));
        insta::assert_snapshot!(format!("{name}_psych"), good.to_string());
        insta::assert_snapshot!(format!("{name}_naive"), bad.to_string());
    }
    println!("{summary}");
    insta::assert_snapshot!("summary", summary);
}

#[test]
fn sized_rendering_spends_no_breakpoint_below_the_minimum() {
    for turns in [twenty_turns(), wide_turns()] {
        let session = play(&turns);
        let plain = render_session(&session, &zone1());
        for min in [1024, 4096] {
            let sized = render_session_sized(&session, &zone1(), min, &Bytes4);
            for (a, b) in plain.iter().zip(&sized) {
                // Breakpoints never change what is cached.
                assert_eq!(a.anthropic.cache_stream(), b.cache_stream());
                assert!(b.breakpoint_blocks().len() <= 4);
                let stream = b.cache_stream();
                let mut prefix = Vec::new();
                let (mut at, mut sum) = (0, 0);
                for &end in b.block_ends() {
                    sum += Bytes4.estimate_text(&stream[at..end]);
                    prefix.push(sum);
                    at = end;
                }
                let last = *b.breakpoint_blocks().iter().max().unwrap();
                let zone_last = zone_last_block(b);
                for &q in b.breakpoint_blocks() {
                    assert!(
                        q == last || q > zone_last || prefix[q] >= min,
                        "breakpoint on block {q} ({} tokens) under {min}",
                        prefix[q]
                    );
                }
            }
            for (sim, lib) in readings() {
                let rules = CacheRules::anthropic(min).reading(lib);
                let before = report(&plain, pick_anthropic, rules);
                let after = CacheReport::new(&sized, &Bytes4, rules);
                assert!(
                    after.read_tokens() >= before.read_tokens(),
                    "{min} {sim:?}: {} < {}",
                    after.read_tokens(),
                    before.read_tokens()
                );
            }
        }
    }
}

/// The last block of the tools and the system prompt (zones 1 and 2) of an Anthropic
/// request.
fn zone_last_block(request: &RenderedRequest) -> usize {
    let body: serde_json::Value = serde_json::from_str(request.body()).unwrap();
    ["tools", "system"]
        .iter()
        .filter_map(|key| body.get(key).and_then(|v| v.as_array()).map(Vec::len))
        .sum::<usize>()
        - 1
}
