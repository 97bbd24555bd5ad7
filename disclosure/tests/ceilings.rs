//! Size ceilings asserted on realistic data, and the figures the issue asks for.
//!
//! The 1,000+ tool setup is the six fixture catalogues (GitHub twice: plain and `.full`)
//! replicated under four server names each: 24 servers, 1,224 tools. Token figures use the
//! bytes/4 stand-in estimator, not a provider tokenizer.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common::{
    Bytes4, FIXTURES, fixture_setup, large_setup, named_setup, surface_bytes, tool_bytes,
};
use psych_disclosure::{
    Answer, Budget, Cost, DEFERRED_LINE_CHARS, LIST_TOOLS, OrientationContext, Settings,
    Validators, Verdict, orientation, resolve,
};
use psych_types::{ConnectionSpec, Preload, ServerId, TokenEstimator};
use serde_json::json;

fn context() -> OrientationContext {
    OrientationContext {
        tenant: json!({"id": "t-1", "business_name": "Acme", "timezone": "UTC"}),
        user: json!({"persona": "operator"}),
        conventions: json!({"prose": "Be careful. ".repeat(400)}),
        operational_state: json!({"open_incidents": 3}),
    }
}

#[test]
fn default_orientation_stays_small_on_a_1000_tool_setup() {
    let setup = large_setup(4, Preload::Auto);
    let surface = setup.resolve(&Settings::default());
    assert!(
        surface.permitted().len() >= 1_000,
        "{}",
        surface.permitted().len()
    );
    let payload = orientation(&surface, &setup.live(), &context(), false);
    let text = payload.to_output().readable_text().into_owned();
    let value = serde_json::to_value(&payload).unwrap();
    println!(
        "default orientation over {} tools: {} chars",
        surface.permitted().len(),
        text.chars().count()
    );
    assert!(
        text.chars().count() < 20_000,
        "{} chars",
        text.chars().count()
    );
    assert!(value.get("tool_map").is_none());
    assert!(
        value["tool_categories"]
            .as_object()
            .is_some_and(|c| !c.is_empty())
    );
    let counted: u64 = value["tool_categories"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted as usize, surface.permitted().len());

    let verbose =
        serde_json::to_value(orientation(&surface, &setup.live(), &context(), true)).unwrap();
    let map = verbose["tool_map"].as_object().unwrap();
    let listed: usize = map.values().map(|v| v.as_array().unwrap().len()).sum();
    assert_eq!(listed, surface.permitted().len());
    println!(
        "verbose orientation: {} chars",
        verbose.to_string().chars().count()
    );
}

#[test]
fn deferred_lines_are_capped_at_200_characters() {
    let mut setup = large_setup(4, Preload::Deferred);
    let long = "Ünïcode description that goes on and on. ".repeat(20);
    setup.connections[0] = setup.connections[0].clone().with_description(long);
    let long_id = "s".repeat(64);
    setup.connections.push(
        ConnectionSpec::new(ServerId::new(long_id.as_str()).unwrap())
            .with_description("x".repeat(500)),
    );
    setup.grant = std::mem::take(&mut setup.grant).allow_server(ServerId::new(long_id).unwrap());
    let surface = setup.resolve(&Settings::default());
    assert_eq!(surface.deferred_lines().len(), 25);
    for line in surface.deferred_lines() {
        assert!(line.chars().count() <= DEFERRED_LINE_CHARS, "{line}");
    }
    let capped: Vec<_> = surface
        .deferred_lines()
        .iter()
        .filter(|l| l.ends_with("…[truncated]"))
        .collect();
    assert_eq!(capped.len(), 2, "{capped:#?}");
}

#[test]
fn the_surface_never_exceeds_its_cap_on_the_large_setup() {
    for preload in [Preload::Auto, Preload::Eager, Preload::Deferred] {
        let setup = large_setup(4, preload);
        for cap in [4, 10, 64, 128] {
            let settings = Settings::builder().tool_cap(cap).build().unwrap();
            let surface = setup.resolve(&settings);
            assert!(
                surface.tools().len() <= cap,
                "{preload:?} cap {cap}: {}",
                surface.tools().len()
            );
        }
    }
}

#[test]
fn a_1000_tool_server_lists_in_bounded_pages() {
    // One server holding every tool of the large setup, each renamed to stay unique.
    let large = large_setup(4, Preload::Deferred);
    let mut tools = Vec::new();
    for catalog in &large.catalogs {
        for tool in catalog.tools.iter() {
            let mut tool = tool.clone();
            tool.name = format!("{}_{}", catalog.server, tool.name).parse().unwrap();
            tools.push(tool);
        }
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let mut setup = named_setup(
        [("big".to_string(), "server-memory.tools.json")],
        Preload::Auto,
    );
    setup.catalogs[0].tools = tools.into();
    let surface = setup.resolve(&Settings::default());
    assert_eq!(surface.permitted().len(), 1_224);
    let validators = Validators::new();
    let mut largest = 0;
    let mut seen = 0;
    let mut page = 1;
    loop {
        let verdict = surface.guard(
            LIST_TOOLS,
            &json!({"server": "big", "page": page}),
            &setup.live(),
            &validators,
        );
        let Verdict::Answer(answer @ Answer::Listing(_)) = verdict else {
            panic!("{verdict:?}")
        };
        let bytes = serde_json::to_string(&answer).unwrap().len();
        largest = largest.max(bytes);
        let Answer::Listing(listing) = answer else {
            unreachable!()
        };
        seen += listing.tools.len();
        match listing.more {
            Some(more) => assert_eq!(more, format!("more: ask for page {} of 25", page + 1)),
            None => break,
        }
        page += 1;
    }
    assert_eq!(seen, 1_224);
    println!("largest listing page of a 1,224-tool server: {largest} bytes");
    assert!(largest < 12_000, "{largest} bytes");
}

#[test]
fn the_meta_tools_fixed_cost() {
    let setup = fixture_setup(Preload::Deferred);
    let settings = Settings::builder().orientation_tool(false).build().unwrap();
    let surface = setup.resolve(&settings);
    let bytes: usize = surface
        .tools()
        .iter()
        .filter(|t| t.name.as_str().starts_with("psych_"))
        .map(tool_bytes)
        .sum();
    let names: Vec<_> = surface.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["psych_call_tool", "psych_describe_tool", "psych_list_tools"]
    );
    println!(
        "meta tools: {bytes} bytes, ~{} tokens (bytes/4)",
        bytes.div_ceil(4)
    );
    assert!(bytes <= 1_600, "{bytes}");
}

#[test]
fn github_eager_vs_deferred_vs_facade_vs_search_pair() {
    let github = || named_setup([("github".to_string(), FIXTURES[0].1)], Preload::Eager);
    let no_orientation = Settings::builder().orientation_tool(false);
    let direct = github().resolve(
        &no_orientation
            .clone()
            .direct_max_tools(1_000)
            .direct_max_tokens(u64::MAX)
            .build()
            .unwrap(),
    );
    let facade = github().resolve(&no_orientation.clone().direct_max_tools(0).build().unwrap());
    let search = github().resolve(
        &no_orientation
            .clone()
            .direct_max_tools(0)
            .facade_max_index_tokens(0)
            .build()
            .unwrap(),
    );
    let deferred_setup = named_setup([("github".to_string(), FIXTURES[0].1)], Preload::Deferred);
    let deferred = deferred_setup.resolve(&no_orientation.clone().build().unwrap());
    let line = deferred.deferred_lines()[0].len();
    let rows = [
        ("eager (117 direct tools)", surface_bytes(&direct)),
        ("facade (1 tool)", surface_bytes(&facade)),
        ("search pair (2 tools)", surface_bytes(&search)),
        (
            "deferred: its line + the 3 meta tools",
            surface_bytes(&deferred),
        ),
        ("deferred: its line alone", line + 1),
    ];
    println!("| GitHub fixture as | prompt bytes | est. tokens (bytes/4) | eager / this |");
    for (what, bytes) in rows {
        println!(
            "| {what} | {bytes} | {} | {:.1}x |",
            Bytes4.estimate_text(&" ".repeat(bytes)),
            rows[0].1 as f64 / bytes as f64
        );
    }
    assert_eq!(direct.tools().len(), 117);
    assert!(
        rows[0].1 >= 30 * rows[3].1,
        "deferred must be at least 30x smaller than eager"
    );
    assert!(rows[2].1 < rows[1].1 && rows[1].1 < rows[0].1);

    // The per-server costs behind the Auto default, on a 200,000-token window: counted
    // whole with a budget nothing passes, then the default's decision.
    let setup = fixture_setup(Preload::Auto);
    let whole = Settings::builder()
        .auto_budget(Budget::Tokens(u64::MAX))
        .build()
        .unwrap();
    let counted = resolve(&setup.inputs(), &whole, &Bytes4).unwrap();
    let default = resolve(&setup.inputs(), &Settings::default(), &Bytes4).unwrap();
    for (view, decided) in counted.servers().iter().zip(default.servers()) {
        let Cost::Exact(tokens) = view.cost else {
            panic!("{view:?}")
        };
        println!(
            "{}: {} tools, ~{tokens} tokens = {:.1}% of 200k -> {:?} ({:?})",
            view.server,
            view.permitted,
            tokens as f64 / 2_000.0,
            decided.shape,
            decided.cost
        );
    }
}
