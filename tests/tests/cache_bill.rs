//! The prompt cache as the providers bill it, on the scripted sessions of prompt-assembly's
//! tests, with tokens counted by the real estimator (psych-elision's): read share and cost
//! relative to no caching, for Psych, the naive assemblies and a searched placement of four
//! breakpoints, under both readings of Anthropic's block counting and minimum lengths of
//! 1,024 and 4,096 tokens; and OpenAI's automatic prefix caching. The table is a snapshot,
//! so the figures are pinned; the goal (Psych's read share within 3 points of the searched
//! placement's, on both scripts, both readings, both minimums) is asserted.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as pa;

use pa::billing::*;
use pa::*;
use psych_elision::Estimator;
use psych_prompt_assembly::{BlockReading, CacheReport, CacheRules, RenderedRequest};

/// OpenAI's cached input price relative to base input for the model the tests name
/// (gpt-4.1: $0.50 against $2.00 per million tokens, the published price list).
const OPENAI_READ_PRICE: f64 = 0.25;

struct Figures {
    table: String,
    /// ("script minimum reading", psych read share, searched read share).
    gaps: Vec<(String, f64, f64)>,
}

fn anthropic_of(rendered: &[Rendered]) -> Vec<&RenderedRequest> {
    rendered.iter().map(|r| &r.anthropic).collect()
}

fn openai_of(rendered: &[Rendered]) -> Vec<&RenderedRequest> {
    rendered.iter().map(|r| &r.openai).collect()
}

fn line(name: &str, bill: &Bill) -> String {
    format!(
        "    {name:<22} read {:>5.1}%  cost {:.3}x\n",
        bill.read_share() * 100.0,
        bill.cost()
    )
}

fn figures(script: &str, turns: &[Turn]) -> Figures {
    let estimator = Estimator::new();
    let session = play(turns);
    let variants = [
        ("psych", render_session(&session, &zone1())),
        ("naive", render_naive(&session, true, true)),
        ("naive: clock only", render_naive(&session, true, false)),
        ("naive: per-step only", render_naive(&session, false, true)),
    ];
    let mut table = format!("{script}: {} requests\n", session.calls.len());
    let mut gaps = Vec::new();
    let psych_layouts: Vec<Layout> = variants[0]
        .1
        .iter()
        .map(|r| Layout::new(&r.anthropic, &estimator))
        .collect();
    for min in [1024, 4096] {
        for reading in [Reading::TopLevel, Reading::Nested] {
            let model = AnthropicModel::new(min, reading);
            table.push_str(&format!("  anthropic, minimum {min}, {reading:?} blocks\n"));
            let mut psych = 0.0;
            for (name, rendered) in &variants {
                let bill = anthropic_bill(&anthropic_of(rendered), &estimator, model);
                if *name == "psych" {
                    psych = bill.read_share();
                }
                table.push_str(&line(name, &bill));
            }
            let sized = render_session_sized(&session, &zone1(), min, &estimator);
            let bill = anthropic_bill(&sized.iter().collect::<Vec<_>>(), &estimator, model);
            table.push_str(&line("psych, sized", &bill));
            // The library's report agrees with the simulator on the real estimator.
            let lib_reading = match reading {
                Reading::TopLevel => BlockReading::TopLevel,
                Reading::Nested => BlockReading::Nested,
            };
            let report = CacheReport::new(
                &sized,
                &estimator,
                CacheRules::anthropic(min).reading(lib_reading),
            );
            assert_eq!(
                (
                    report.total_tokens(),
                    report.read_tokens(),
                    report.written_tokens()
                ),
                (bill.input, bill.read, bill.written)
            );
            let best = searched_bill(&psych_layouts, model);
            table.push_str(&line("searched placement", &best));
            gaps.push((
                format!("{script} {min} {reading:?}"),
                psych,
                best.read_share(),
            ));
        }
    }
    table.push_str("  openai, minimum 1024, 128-token increments\n");
    for (name, rendered) in &variants {
        let bill = openai_bill(
            &openai_of(rendered),
            &estimator,
            1024,
            128,
            OPENAI_READ_PRICE,
        );
        table.push_str(&line(name, &bill));
    }
    Figures { table, gaps }
}

#[test]
fn billed_cache_figures() {
    let mut table = String::new();
    let mut gaps = Vec::new();
    for (script, turns) in [("20-turn", twenty_turns()), ("wide", wide_turns())] {
        let f = figures(script, &turns);
        table.push_str(&f.table);
        gaps.extend(f.gaps);
    }
    println!("{table}");
    insta::assert_snapshot!("billed_cache_figures", table);
    for (case, psych, best) in &gaps {
        assert!(
            psych + 0.03 >= *best,
            "{case}: psych reads {:.1}%, a searched placement {:.1}%",
            psych * 100.0,
            best * 100.0
        );
    }
}
