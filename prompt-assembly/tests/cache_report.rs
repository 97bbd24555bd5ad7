//! The cache report of a scripted 20-turn session, this crate's assembly against a naive one
//! (the date at the top of the system prompt, tool results elided per step), for both
//! providers. The reports are snapshots, so the figures quoted in the issue are pinned.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use common::*;
use psych_prompt_assembly::{CacheReport, Part, RenderedRequest};

/// Twenty turns of zero to three steps, one to three parallel calls each, with large
/// results, failures, a JSON and a binary result, and memories changing at turns 5 and 12.
fn twenty_turns() -> Vec<Turn> {
    let mut state: u64 = 0x5eed;
    let mut next = move |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    (0..20)
        .map(|t| Turn {
            new_memory: t == 5 || t == 12,
            blank_texts: false,
            steps: (0..next(4))
                .map(|_| Step {
                    calls: (0..1 + next(3))
                        .map(|_| match next(10) {
                            0..=3 => Outcome::Small,
                            4..=6 => Outcome::Large(1000 + 500 * next(8) as usize),
                            7 => Outcome::Fail(700),
                            8 => Outcome::Json,
                            _ => Outcome::Pdf,
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

fn report(rendered: &[Rendered], pick: fn(&Rendered) -> &RenderedRequest) -> CacheReport {
    let requests: Vec<RenderedRequest> = rendered.iter().map(|r| pick(r).clone()).collect();
    CacheReport::new(&requests)
}

#[test]
fn twenty_turn_session_reuses_far_more_than_a_naive_assembly() {
    let session = play(&twenty_turns());
    let ours = render_session(&session, &zone1());
    let naive = render_naive(&session, true, true);
    let mut summary = String::new();
    for (name, pick) in [
        (
            "anthropic",
            pick_anthropic as fn(&Rendered) -> &RenderedRequest,
        ),
        ("openai", pick_openai),
    ] {
        let good = report(&ours, pick);
        let bad = report(&naive, pick);
        assert!(
            good.reused_share() > bad.reused_share() + 0.3,
            "{name}: {} vs {}",
            good.reused_share(),
            bad.reused_share()
        );
        // The naive assembly loses the cache at zone 1 on every call after the first.
        assert!(
            bad.rows()[1..]
                .iter()
                .all(|row| row.first_change == Some(Part::StaticSystem))
        );
        summary.push_str(&format!(
            "{name}: {} requests, psych {:.1}% of {} bytes reused ({} fresh), naive {:.1}% of {} bytes ({} fresh)\n",
            good.rows().len(),
            good.reused_share() * 100.0,
            good.total_bytes(),
            good.total_bytes() - good.reused_bytes(),
            bad.reused_share() * 100.0,
            bad.total_bytes(),
            bad.total_bytes() - bad.reused_bytes(),
        ));
        insta::assert_snapshot!(format!("{name}_psych"), good.to_string());
        insta::assert_snapshot!(format!("{name}_naive"), bad.to_string());
    }
    // Each mistake on its own.
    for (label, clock, per_step) in [
        ("clock in zone 1 only", true, false),
        ("per-step elision only", false, true),
    ] {
        let partial = render_naive(&session, clock, per_step);
        let a = report(&partial, pick_anthropic);
        let o = report(&partial, pick_openai);
        summary.push_str(&format!(
            "{label}: anthropic {:.1}% reused ({} fresh), openai {:.1}% reused ({} fresh)\n",
            a.reused_share() * 100.0,
            a.total_bytes() - a.reused_bytes(),
            o.reused_share() * 100.0,
            o.total_bytes() - o.reused_bytes(),
        ));
    }
    println!("{summary}");
    insta::assert_snapshot!("summary", summary);
}
