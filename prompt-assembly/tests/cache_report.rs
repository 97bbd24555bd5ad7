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
