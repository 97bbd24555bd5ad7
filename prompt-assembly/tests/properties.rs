//! The properties of the issue over random conversations (turns of several steps, parallel
//! calls, large, failing and binary results, memories changing between turns, a clock
//! advancing on every call, invented call names, unparsable arguments, calls left without a
//! result by a crash, whitespace-only texts), for both providers, and proof that the checks would catch the
//! two classic mistakes (a clock in zone 1, an elision boundary that moves per step).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use common::*;
use proptest::prelude::*;
use psych_prompt_assembly::{
    Assembler, CurrentTime, DynamicTail, Part, RenderedRequest, StaticSections, Transient,
};

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Small),
        3 => (300usize..1500).prop_map(Outcome::Large),
        2 => (50usize..600).prop_map(Outcome::Fail),
        1 => Just(Outcome::Json),
        1 => Just(Outcome::Image),
        1 => Just(Outcome::Pdf),
        1 => Just(Outcome::Missing),
        1 => (0usize..4).prop_map(Outcome::BadName),
        1 => Just(Outcome::RawArguments),
    ]
}

/// The outcomes of adversarial logs: everything above plus many and huge images and ids
/// too long for OpenAI.
fn adversarial_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => outcome(),
        1 => (1usize..30, prop_oneof![Just(100u32), Just(2500), Just(9000)])
            .prop_map(|(count, side)| Outcome::Images { count, side }),
        1 => Just(Outcome::HugeImage),
        2 => Just(Outcome::LongId),
    ]
}

fn adversarial_turns() -> impl Strategy<Value = Vec<Turn>> {
    let step = prop::collection::vec(adversarial_outcome(), 1..6).prop_map(|calls| Step { calls });
    let turn = (
        any::<bool>(),
        prop::collection::vec(step, 0..3),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(new_memory, steps, blank_texts)| Turn {
            new_memory,
            steps,
            blank_texts,
        });
    prop::collection::vec(turn, 1..4)
}

fn turns() -> impl Strategy<Value = Vec<Turn>> {
    // Mostly a few parallel calls; sometimes a dozen, which adds more blocks than the
    // Anthropic lookback window covers.
    let width = prop_oneof![4 => 1usize..5, 1 => 9usize..14];
    let step = width
        .prop_flat_map(|n| prop::collection::vec(outcome(), n))
        .prop_map(|calls| Step { calls });
    let turn = (
        any::<bool>(),
        prop::collection::vec(step, 0..4),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(new_memory, steps, blank_texts)| Turn {
            new_memory,
            steps,
            blank_texts,
        });
    prop::collection::vec(turn, 1..5)
}

/// Picks one provider's request out of a call's renderings.
type Pick = fn(&Rendered) -> &RenderedRequest;

const PROVIDERS: [(&str, Pick); 2] = [("anthropic", pick_anthropic), ("openai", pick_openai)];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Within a turn, the bytes of step k less the transient message are a prefix of step
    /// k+1's, and no result's view changes.
    #[test]
    fn within_a_turn_each_request_extends_the_previous_one(turns in turns()) {
        let session = play(&turns);
        let rendered = render_session(&session, &zone1());
        for (name, pick) in PROVIDERS {
            if let Err(violation) = check_turn_prefixes(&session.calls, &rendered, pick) {
                return Err(TestCaseError::fail(format!("{name}: {violation}")));
            }
        }
        for k in 1..session.calls.len() {
            if session.calls[k].turn == session.calls[k - 1].turn {
                let before = &rendered[k - 1].views;
                prop_assert_eq!(before.as_slice(), &rendered[k].views[..before.len()]);
            }
        }
    }

    /// Across a new user message, the first byte that changes is at or after the first
    /// message whose elision status changed (or in zone 2 when the memories changed), and a
    /// status changes only when its turn stops being the current one.
    #[test]
    fn across_turns_the_first_change_is_no_earlier_than_the_first_changed_status(
        turns in turns()
    ) {
        let session = play(&turns);
        let rendered = render_session(&session, &zone1());
        for k in 1..session.calls.len() {
            if session.calls[k].turn == session.calls[k - 1].turn {
                continue;
            }
            let (prev, next) = (&rendered[k - 1], &rendered[k]);
            let boundary = prev.boundary.unwrap();
            let mut first_changed = None;
            for (before, after) in prev.views.iter().zip(&next.views) {
                prop_assert_eq!(before.0, after.0);
                if before.1 != after.1 {
                    prop_assert!(
                        before.0 > boundary,
                        "result {} of an earlier turn changed its view", before.0
                    );
                    first_changed.get_or_insert(before.0);
                }
            }
            let memories_changed = session.calls[k].tail != session.calls[k - 1].tail;
            for (name, pick) in PROVIDERS {
                let (a, b) = (pick(prev), pick(next));
                let prefix = cacheable(a);
                let stream = b.cache_stream();
                let first_diff = prefix.bytes().zip(stream.bytes()).take_while(|(x, y)| x == y).count();
                let mut allowed = prefix.len();
                if let Some(index) = first_changed {
                    allowed = allowed.min(message_start(a, index).unwrap());
                }
                if memories_changed {
                    allowed = allowed.min(zone2_start(a).unwrap());
                }
                prop_assert!(
                    first_diff >= allowed,
                    "{name}: first change at byte {first_diff}, before byte {allowed} ({:?})",
                    a.part_at(first_diff)
                );
            }
        }
    }

    /// Zone 1 bytes (with the preamble and tools before them) never change unless zone 1's
    /// inputs do: not with the history, the memories, the clock or the order tools come in.
    #[test]
    fn zone_one_bytes_change_only_with_zone_one_inputs(turns in turns(), seed in 0usize..1000) {
        let session = play(&turns);
        let rendered = render_session(&session, &zone1());
        // Rendered on its own: no history, other memories, no clock, tools in another order.
        let mut tools = tools();
        let n = tools.len();
        tools.rotate_left(seed % n);
        let static_sections = zone1();
        let tail = DynamicTail::new().memory(format!("unrelated {seed}"));
        let transient = Transient::new().note("no clock here");
        let alone = Assembler::new(&static_sections, &tail, &tools)
            .assemble(&[], &Whole, &transient)
            .unwrap();
        let changed_sections = zone1().skill("zz-new", "a new skill");
        let changed = Assembler::new(&changed_sections, &tail, &tools)
            .assemble(&[], &Whole, &transient)
            .unwrap();
        for (name, pick) in PROVIDERS {
            let reference = match name {
                "anthropic" => alone.render_anthropic(&anthropic()).unwrap(),
                _ => alone.render_openai(&openai()).unwrap(),
            };
            let zone1_bytes = |r: &RenderedRequest| {
                let stream = r.cache_stream();
                stream[..zone2_start(r).unwrap()].to_owned()
            };
            let expected = zone1_bytes(&reference);
            for r in &rendered {
                prop_assert_eq!(&zone1_bytes(pick(r)), &expected, "{}", name);
            }
            let other = match name {
                "anthropic" => changed.render_anthropic(&anthropic()).unwrap(),
                _ => changed.render_openai(&openai()).unwrap(),
            };
            prop_assert_ne!(zone1_bytes(&other), expected, "{}: a new skill must show", name);
        }
    }

    /// Anthropic breakpoints: at most four, never on the transient message, and (replaying
    /// the cache's 20-block lookback) every request of a turn after the first finds the entry
    /// the previous request wrote at its last history block.
    #[test]
    fn anthropic_breakpoints_always_find_the_previous_entry(turns in turns()) {
        let session = play(&turns);
        let rendered = render_session(&session, &zone1());
        let requests: Vec<&RenderedRequest> = rendered.iter().map(|r| &r.anthropic).collect();
        for request in &requests {
            prop_assert!(request.breakpoint_blocks().len() <= 4);
            let transient = request.spans().iter().find(|s| s.part == Part::Transient).unwrap();
            for &block in request.breakpoint_blocks() {
                prop_assert!(request.block_ends()[block] <= transient.range.start);
            }
        }
        prop_assert_eq!(check_lookback(&session.calls, &requests), Ok(()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every request is JSON the provider accepts as far as pairing, names, empty blocks
    /// and breakpoints go, and rendering is deterministic.
    #[test]
    fn every_request_is_well_formed(turns in turns()) {
        let session = play(&turns);
        let rendered = render_session(&session, &zone1());
        for r in &rendered {
            prop_assert_eq!(check_anthropic_body(r.anthropic.body(), true), Ok(()));
            prop_assert_eq!(check_openai_body(r.openai.body()), Ok(()));
        }
        let again = render_session(&session, &zone1());
        for (a, b) in rendered.iter().zip(&again) {
            prop_assert_eq!(a.anthropic.body(), b.anthropic.body());
            prop_assert_eq!(a.openai.body(), b.openai.body());
        }
    }
}

/// A tool surface of `n` tools.
fn surface(n: usize) -> Vec<psych_types::ToolDefinition> {
    (0..n)
        .map(|i| {
            psych_types::ToolDefinition::new(
                psych_types::ToolName::new(format!("tool_{i:03}")).unwrap(),
                "A tool.",
                serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Adversarial logs (model mistakes, calls left without a result, whitespace-only texts,
    /// many and huge images, ids too long for OpenAI, a log starting with an assistant
    /// record) over an empty surface, the scripts' surface, or 200 tools, with and without a
    /// transient message: every body either passes the rule checker or is a typed
    /// `RenderError` for a surface the provider refuses (OpenAI over 128 tools), never a
    /// body the provider would refuse.
    #[test]
    fn every_adversarial_request_passes_the_rule_checker(
        turns in adversarial_turns(),
        tools in prop_oneof![Just(0usize), Just(4), Just(200)],
        starts_with_assistant in any::<bool>(),
        with_transient in any::<bool>(),
    ) {
        let mut session = play(&turns);
        if starts_with_assistant {
            // Drop the first user message: the log starts with the assistant.
            session.history.remove(0);
            for (i, logged) in session.history.iter_mut().enumerate() {
                logged.handle.seq = i as u64;
            }
            for call in &mut session.calls {
                call.history_len = call.history_len.saturating_sub(1);
            }
        }
        let tools = if tools == 4 { common::tools() } else { surface(tools) };
        let projector = TestProjector::default();
        let zone1 = zone1();
        let mut lengths: Vec<usize> = session.calls.iter().map(|c| c.history_len).collect();
        lengths.push(session.history.len());
        for len in lengths {
            let call = &session.calls[0];
            let transient = if with_transient { Transient::at(call.time) } else { Transient::new() };
            let prompt = Assembler::new(&zone1, &call.tail, &tools)
                .assemble(&session.history[..len], &projector, &transient)
                .unwrap();
            match prompt.render_anthropic(&anthropic()) {
                Ok(request) => prop_assert_eq!(check_anthropic_body(request.body(), with_transient), Ok(())),
                // Nothing to send at all (no transient message, and no record that renders
                // to a block, such as a log of one blank assistant reply): typed.
                Err(psych_prompt_assembly::RenderError::NoMessages) => prop_assert!(!with_transient),
                Err(err) => prop_assert!(false, "anthropic: {}", err),
            }
            match prompt.render_openai(&openai()) {
                Ok(request) => {
                    prop_assert!(tools.len() <= 128);
                    prop_assert_eq!(check_openai_body(request.body()), Ok(()));
                }
                Err(psych_prompt_assembly::RenderError::TooManyTools { count, max }) => {
                    prop_assert_eq!((count, max), (200, 128));
                }
                Err(err) => prop_assert!(false, "openai: {}", err),
            }
        }
    }
}

/// A script with a large result in the first step of a multi-step turn and memories that
/// change: the case where both naive mistakes show.
fn telling_script() -> Vec<Turn> {
    vec![
        Turn {
            new_memory: false,
            blank_texts: false,
            steps: vec![
                Step {
                    calls: vec![Outcome::Large(2000), Outcome::Small],
                },
                Step {
                    calls: vec![Outcome::Fail(900)],
                },
            ],
        },
        Turn {
            new_memory: true,
            blank_texts: false,
            steps: vec![Step {
                calls: vec![Outcome::Small],
            }],
        },
    ]
}

#[test]
fn the_prefix_check_catches_a_clock_in_zone_one() {
    let session = play(&telling_script());
    let rendered = render_session(&session, &zone1());
    assert_eq!(
        check_turn_prefixes(&session.calls, &rendered, pick_anthropic),
        Ok(())
    );
    let naive = render_naive(&session, true, false);
    for pick in [pick_anthropic, pick_openai] {
        let violation = check_turn_prefixes(&session.calls, &naive, pick).unwrap_err();
        assert!(violation.contains("turn 0 step 1"), "{violation}");
    }
}

#[test]
fn the_prefix_check_catches_a_boundary_that_moves_per_step() {
    let session = play(&telling_script());
    let naive = render_naive(&session, false, true);
    for pick in [pick_anthropic, pick_openai] {
        let violation = check_turn_prefixes(&session.calls, &naive, pick).unwrap_err();
        // Step 1 still sees step 0's large result whole; step 2 sees it elided.
        assert!(violation.contains("turn 0 step 2"), "{violation}");
    }
}

#[test]
fn a_clock_value_appears_only_in_the_transient_message() {
    let session = play(&telling_script());
    let tools = tools();
    let static_sections: StaticSections = zone1();
    let call = &session.calls[3];
    // A year no other input mentions.
    let now = CurrentTime::from_unix(3_713_367_825, 90).unwrap();
    let text = now.to_string();
    assert_eq!(text, "2087-09-02T20:33:45+01:30 (Tuesday)");
    let transient = Transient::at(now);
    let prompt = Assembler::new(&static_sections, &call.tail, &tools)
        .assemble(
            &session.history[..call.history_len],
            &TestProjector::default(),
            &transient,
        )
        .unwrap();
    for request in [
        prompt.render_anthropic(&anthropic()).unwrap(),
        prompt.render_openai(&openai()).unwrap(),
    ] {
        let stream = request.cache_stream();
        let transient = request
            .spans()
            .iter()
            .find(|s| s.part == Part::Transient)
            .unwrap()
            .range
            .clone();
        let hits: Vec<usize> = stream.match_indices("2087").map(|(i, _)| i).collect();
        assert_eq!(hits.len(), 1, "{stream}");
        assert!(transient.contains(&hits[0]));
        assert!(stream[transient.clone()].contains(&text));
        assert!(request.body().contains(&text));
        assert!(request.cacheable_len() <= transient.start);
        // The transient message is the last message, after the whole history.
        assert_eq!(&stream[transient.end..], "]}");
    }
}

#[test]
fn a_wide_step_gets_a_lookback_anchor_on_the_previous_request_end() {
    let script = vec![Turn {
        new_memory: false,
        blank_texts: false,
        steps: vec![
            Step {
                calls: vec![Outcome::Small],
            },
            Step {
                calls: vec![Outcome::Small; 12],
            },
        ],
    }];
    let session = play(&script);
    let rendered = render_session(&session, &zone1());
    let requests: Vec<&RenderedRequest> = rendered.iter().map(|r| &r.anthropic).collect();
    // Step 1 added one block per call and per result: 24 blocks past the previous end.
    let (prev, wide) = (requests[1], requests[2]);
    let prev_last = prev.breakpoint_blocks().iter().copied().max().unwrap();
    let bps = wide.breakpoint_blocks();
    assert_eq!(bps.len(), 4, "zone 1, zone 2, last history block, anchor");
    let last = bps.iter().copied().max().unwrap();
    assert!(
        last - prev_last > 19,
        "breakpoint 3 alone cannot reach back"
    );
    assert!(
        bps.contains(&prev_last),
        "the anchor sits on the previous request's end"
    );
    assert_eq!(
        wide.block_ends()[prev_last],
        prev.block_ends()[prev_last],
        "and that block ends at the same byte in both"
    );
    let found = simulate_anthropic_cache(&requests, 20);
    assert_eq!(found[2], prev.block_ends()[prev_last]);
    // The narrow step before it needed no anchor.
    assert_eq!(prev.breakpoint_blocks().len(), 3);
    assert_eq!(
        found[1],
        requests[0].block_ends()[*requests[0].breakpoint_blocks().iter().max().unwrap()]
    );
}

/// The shapes models and crashes leave in a log, scripted so they surely occur together:
/// every request renders, passes the body checks, keeps the prefix property within a turn,
/// and the Anthropic lookback still finds the previous entry.
#[test]
fn model_mistakes_and_interrupted_calls_keep_the_properties() {
    let script = vec![
        Turn {
            new_memory: false,
            blank_texts: false,
            steps: vec![
                Step {
                    calls: vec![
                        Outcome::BadName(0),
                        Outcome::RawArguments,
                        Outcome::Missing,
                        Outcome::Large(900),
                    ],
                },
                Step {
                    calls: vec![Outcome::Missing],
                },
                Step {
                    calls: vec![Outcome::BadName(3), Outcome::BadName(2)],
                },
            ],
        },
        Turn {
            new_memory: true,
            blank_texts: true,
            steps: vec![
                Step {
                    calls: vec![Outcome::Large(1200), Outcome::Missing, Outcome::Small],
                },
                Step {
                    calls: vec![Outcome::Missing; 12],
                },
            ],
        },
    ];
    let session = play(&script);
    let rendered = render_session(&session, &zone1());
    for (name, pick) in PROVIDERS {
        assert_eq!(
            check_turn_prefixes(&session.calls, &rendered, pick),
            Ok(()),
            "{name}"
        );
    }
    for r in &rendered {
        assert_eq!(check_anthropic_body(r.anthropic.body(), true), Ok(()));
        assert_eq!(check_openai_body(r.openai.body()), Ok(()));
    }
    let last = rendered.last().unwrap();
    for body in [last.anthropic.body(), last.openai.body()] {
        assert_eq!(
            body.matches(psych_prompt_assembly::MISSING_RESULT).count(),
            15,
            "one substitute per unanswered call"
        );
        assert!(body.contains("github_list_issues"));
        assert!(body.contains(psych_prompt_assembly::EMPTY_USER_MESSAGE));
    }
    let requests: Vec<&RenderedRequest> = rendered.iter().map(|r| &r.anthropic).collect();
    assert_eq!(check_lookback(&session.calls, &requests), Ok(()));
}
