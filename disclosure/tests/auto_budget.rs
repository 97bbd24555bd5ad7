//! The auto budget spans the whole Surface: the `Auto` servers share it smallest first
//! (ties by server id), so a dozen mid-size servers each under the budget are not all kept;
//! a server's count stops once it alone passes the budget; pinned servers take no share.
//!
//! Each server here has tools of an exact cost under the bytes/4 estimator, so the
//! expected decisions can be read off the numbers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common::Setup;
use psych_disclosure::{Budget, Cost, CostBasis, Settings, Shape, Surface, Why};
use psych_types::{ConnectionSpec, Preload, ServerId, ToolDefinition, ToolName};

/// The fixed part of a tool's cost as a direct tool under [`Bytes4`]: a server id of at
/// most 4 bytes (1), a tool name of at most 4 bytes (1), the separator (1) and the schema
/// `{"type":"object"}` (17 bytes: 5).
const FIXED: u64 = 8;

/// `tools` tools for `server`, each costing exactly `each` tokens as a direct tool.
fn tools(tools: usize, each: u64) -> Vec<ToolDefinition> {
    assert!(each >= FIXED);
    let description = "x".repeat(usize::try_from(4 * (each - FIXED)).unwrap());
    (0..tools)
        .map(|i| {
            ToolDefinition::new(
                ToolName::new(format!("t{i}")).unwrap(),
                description.as_str(),
                serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
            )
        })
        .collect()
}

/// Servers `(id, preload, tool count, tokens per tool)`, every tool granted.
fn setup(servers: &[(&str, Preload, usize, u64)]) -> Setup {
    let mut setup = Setup::empty();
    for &(server, preload, count, each) in servers {
        assert!(
            server.len() <= 4,
            "{server}: the cost arithmetic assumes a short id"
        );
        let id = ServerId::new(server).unwrap();
        setup.add(
            ConnectionSpec::new(id).with_preload(preload),
            tools(count, each),
        );
    }
    setup
}

fn budget(tokens: u64) -> Settings {
    Settings::builder()
        .auto_budget(Budget::Tokens(tokens))
        .build()
        .unwrap()
}

/// Each server as `id: shape (why) cost`, in server order.
fn decisions(surface: &Surface) -> Vec<String> {
    surface
        .servers()
        .iter()
        .map(|v| format!("{}: {:?} ({:?}) {:?}", v.server, v.shape, v.why, v.cost))
        .collect()
}

#[test]
fn a_dozen_mid_size_servers_share_the_budget_smallest_first() {
    // Twelve servers of 900 to 1,010 tokens, each well under a 10,000-token budget: a
    // budget per server would keep all twelve (11,460 tokens). Shared, the ten smallest
    // fit (9,450), the eleventh would make 10,450.
    let servers: Vec<(String, u64)> = (0..12u64)
        .map(|i| (format!("s{i:02}"), 900 + 10 * ((i * 7) % 12)))
        .collect();
    let specs: Vec<(&str, Preload, usize, u64)> = servers
        .iter()
        .map(|(id, cost)| (id.as_str(), Preload::Auto, 10, cost / 10))
        .collect();
    let surface = setup(&specs).resolve(&budget(10_000));
    let mut by_cost: Vec<(u64, &str)> = servers.iter().map(|(s, c)| (*c, s.as_str())).collect();
    by_cost.sort();
    let kept: Vec<&str> = by_cost[..10].iter().map(|(_, s)| *s).collect();
    let mut sum = 0;
    for view in surface.servers() {
        let cost = servers
            .iter()
            .find(|(s, _)| s == view.server.as_str())
            .unwrap()
            .1;
        assert_eq!(view.cost, Cost::Exact(cost), "{view:?}");
        if kept.contains(&view.server.as_str()) {
            assert_eq!(
                (view.shape, view.why),
                (Shape::Direct, Why::Size),
                "{view:?}"
            );
            sum += cost;
        } else {
            assert_eq!(
                (view.shape, view.why),
                (Shape::Deferred, Why::OverBudget),
                "{view:?}"
            );
        }
    }
    assert_eq!(sum, 9_450);
    assert_eq!(surface.deferred_lines().len(), 2);
    // The per-server reading of the same budget would have kept every one of them.
    assert!(servers.iter().all(|(_, cost)| *cost <= 10_000));
}

#[test]
fn kept_servers_keep_their_size_tier_and_the_rest_are_deferred() {
    // a (300) and b (400) fit in 1,000 tokens together; c (500) does not fit after them,
    // though it would alone; d (40 tools: a facade by size) is counted as direct tools,
    // 400, and does not fit after a and b either (ties go to b). e alone passes the
    // budget (counted on to the direct tier's 10,000, since it has few enough tools).
    let surface = setup(&[
        ("a", Preload::Auto, 3, 100),
        ("b", Preload::Auto, 4, 100),
        ("c", Preload::Auto, 5, 100),
        ("d", Preload::Auto, 40, 10),
        ("e", Preload::Auto, 30, 100),
    ])
    .resolve(&budget(1_000));
    assert_eq!(
        decisions(&surface),
        [
            "a: Direct (Size) Exact(300)",
            "b: Direct (Size) Exact(400)",
            "c: Deferred (OverBudget) Exact(500)",
            "d: Deferred (OverBudget) Exact(400)",
            "e: Deferred (OverBudget) Exact(3000)",
        ]
    );
    // With room for d too, it is kept at its size tier: a facade (more than 32 tools).
    let surface = setup(&[
        ("a", Preload::Auto, 3, 100),
        ("b", Preload::Auto, 4, 100),
        ("d", Preload::Auto, 40, 10),
    ])
    .resolve(&budget(1_100));
    assert_eq!(
        decisions(&surface),
        [
            "a: Direct (Size) Exact(300)",
            "b: Direct (Size) Exact(400)",
            "d: Facade (Size) Exact(400)",
        ]
    );
}

#[test]
fn equal_costs_go_to_the_smaller_server_id_whatever_the_input_order() {
    // Three servers of 400 tokens, room for two: the two smallest ids are kept.
    let servers = [
        ("zz", Preload::Auto, 4, 100),
        ("aa", Preload::Auto, 4, 100),
        ("mm", Preload::Auto, 4, 100),
    ];
    let expected = [
        "aa: Direct (Size) Exact(400)",
        "mm: Direct (Size) Exact(400)",
        "zz: Deferred (OverBudget) Exact(400)",
    ];
    let forward = setup(&servers).resolve(&budget(999));
    assert_eq!(decisions(&forward), expected);
    let mut reversed = servers;
    reversed.reverse();
    assert_eq!(decisions(&setup(&reversed).resolve(&budget(999))), expected);
    // A cheaper server comes first whatever its id: zz at 300 is kept before aa and mm.
    let surface = setup(&[
        ("zz", Preload::Auto, 3, 100),
        ("aa", Preload::Auto, 4, 100),
        ("mm", Preload::Auto, 4, 100),
    ])
    .resolve(&budget(999));
    assert_eq!(
        decisions(&surface),
        [
            "aa: Direct (Size) Exact(400)",
            "mm: Deferred (OverBudget) Exact(400)",
            "zz: Direct (Size) Exact(300)",
        ]
    );
}

#[test]
fn counting_stops_only_once_a_server_alone_passes_the_budget() {
    // Direct tier limit below the budget, so the budget is the limit that matters.
    let settings = Settings::builder()
        .auto_budget(Budget::Tokens(1_000))
        .direct_max_tokens(500)
        .build()
        .unwrap();
    let surface = setup(&[
        ("a", Preload::Auto, 9, 100),
        ("b", Preload::Auto, 9, 100),
        ("big", Preload::Auto, 100, 100),
    ])
    .resolve(&settings);
    // a is kept (a facade: over the direct tier's 500 tokens); b does not fit after it
    // but is counted whole, since it alone fits the budget; big stops just past 1,000.
    assert_eq!(
        decisions(&surface),
        [
            "a: Facade (Size) Exact(900)",
            "b: Deferred (OverBudget) Exact(900)",
            "big: Deferred (OverBudget) AtLeast(1100)",
        ]
    );
    // A budget of 0 defers every Auto server: no tool costs nothing. (Both may be direct,
    // so both are counted on to the direct tier's limit.)
    let surface =
        setup(&[("a", Preload::Auto, 1, 8), ("b", Preload::Auto, 9, 100)]).resolve(&budget(0));
    assert_eq!(
        decisions(&surface),
        [
            "a: Deferred (OverBudget) Exact(8)",
            "b: Deferred (OverBudget) Exact(900)",
        ]
    );
}

#[test]
fn pinned_servers_take_no_share_of_the_budget() {
    // An eager 2,000-token server and a deferred one beside two Auto servers that fit the
    // 1,000-token budget together: both Auto servers are kept, the pinned ones as pinned.
    let surface = setup(&[
        ("a", Preload::Auto, 4, 100),
        ("b", Preload::Auto, 5, 100),
        ("big", Preload::Eager, 20, 100),
        ("off", Preload::Deferred, 2, 100),
    ])
    .resolve(&budget(1_000));
    assert_eq!(
        decisions(&surface),
        [
            "a: Direct (Size) Exact(400)",
            "b: Direct (Size) Exact(500)",
            "big: Direct (Pinned) Exact(2000)",
            "off: Deferred (Pinned) Exact(200)",
        ]
    );
    // A server with no permitted tool takes none either.
    let mut empty = setup(&[("a", Preload::Auto, 4, 100), ("b", Preload::Auto, 6, 100)]);
    empty.add(
        ConnectionSpec::new(ServerId::new("none").unwrap()),
        Vec::new(),
    );
    assert_eq!(
        decisions(&empty.resolve(&budget(1_000))),
        [
            "a: Direct (Size) Exact(400)",
            "b: Direct (Size) Exact(600)",
            "none: Deferred (NoTools) Exact(0)",
        ]
    );
}

#[test]
fn a_deferred_auto_server_keeps_its_eager_tools() {
    let mut setup = setup(&[("a", Preload::Auto, 4, 100), ("b", Preload::Auto, 5, 100)]);
    setup.connections[1] = setup.connections[1]
        .clone()
        .with_eager_tool(ToolName::new("t3").unwrap());
    let surface = setup.resolve(&budget(800));
    let b = surface.server("b").unwrap();
    assert_eq!((b.shape, b.why), (Shape::Deferred, Why::OverBudget));
    assert_eq!(b.eager, [ToolName::new("t3").unwrap()]);
    let names: Vec<&str> = surface.tools().iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"b__t3"), "{names:?}");
    assert!(names.contains(&"a__t0"), "{names:?}");
}

#[test]
fn a_gateway_counts_the_whole_definition_its_client_receives() {
    // Two servers of 400 tokens as a model sees them; b's tools also carry an output
    // schema, which an MCP client of a gateway receives with every listing.
    let mut setup = setup(&[("a", Preload::Auto, 4, 100), ("b", Preload::Auto, 4, 100)]);
    let output: psych_types::JsonObject = serde_json::from_value(
        serde_json::json!({"type": "object", "description": "x".repeat(400)}),
    )
    .unwrap();
    let mut tools = setup.catalogs[1].tools.to_vec();
    for tool in &mut tools {
        tool.output_schema = Some(output.clone());
    }
    setup.catalogs[1].tools = tools.into();
    assert_eq!(
        decisions(&setup.resolve(&budget(1_000))),
        ["a: Direct (Size) Exact(400)", "b: Direct (Size) Exact(400)"]
    );
    let whole = Settings::builder()
        .auto_budget(Budget::Tokens(1_000))
        .cost_basis(CostBasis::Definition)
        .build()
        .unwrap();
    let surface = setup.resolve(&whole);
    let [a, b] = surface.servers() else {
        panic!("two servers")
    };
    // The whole definition of a's tool: `{"name":"t0","description":"x…","inputSchema":…}`.
    assert!(
        matches!(a.cost, Cost::Exact(tokens) if tokens > 400 && tokens < 500),
        "{a:?}"
    );
    assert_eq!((a.shape, a.why), (Shape::Direct, Why::Size));
    assert!(b.cost.tokens() > 800, "{b:?}");
    assert_eq!((b.shape, b.why), (Shape::Deferred, Why::OverBudget));
}

/// A server the tool cap defers gets its eager tools as any deferred server does, as many
/// as the cap has room for once the Surface fits (before, none: only servers deferred
/// before the cap was enforced had theirs).
#[test]
fn a_server_deferred_for_the_tool_cap_keeps_the_eager_tools_there_is_room_for() {
    // x is deferred (so the meta tools are there); a and c are search pairs (their index
    // does not fit a facade), 2 tools each; c names two eager tools.
    let mut setup = setup(&[
        ("a", Preload::Eager, 3, 10),
        ("c", Preload::Eager, 4, 10),
        ("x", Preload::Deferred, 3, 10),
    ]);
    setup.connections[1] = setup.connections[1]
        .clone()
        .with_eager_tool(ToolName::new("t1").unwrap())
        .with_eager_tool(ToolName::new("t2").unwrap());
    let with_cap = |cap: usize| {
        let settings = Settings::builder()
            .facade_max_index_tokens(1)
            .tool_cap(cap)
            .build()
            .unwrap();
        setup.resolve(&settings)
    };
    // 2 + 2 + 3 meta + orientation = 8 over a cap of 7: c (the larger) is deferred, which
    // leaves room for one of its eager tools; with a cap of 8 nothing is deferred.
    for (cap, eager) in [(7, vec!["t1"]), (6, vec![])] {
        let surface = with_cap(cap);
        let c = surface.server("c").unwrap();
        assert_eq!(
            (c.shape, c.why),
            (Shape::Deferred, Why::ToolCap),
            "cap {cap}"
        );
        let names: Vec<&str> = c.eager.iter().map(ToolName::as_str).collect();
        assert_eq!(names, eager, "cap {cap}");
        assert!(surface.tools().len() <= cap);
    }
    let surface = with_cap(7);
    let names: Vec<&str> = surface.tools().iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"c__t1"), "{names:?}");
    assert_eq!(names.len(), 7, "{names:?}");
    assert_eq!(with_cap(8).server("c").unwrap().shape, Shape::SearchPair);
}

/// A deferred server whose eager set the cap dropped whole gets back as many of them as
/// the room left holds, rather than none.
#[test]
fn eager_tools_the_cap_dropped_come_back_as_far_as_there_is_room() {
    let mut setup = setup(&[
        ("a", Preload::Eager, 3, 10),
        ("x", Preload::Deferred, 3, 10),
    ]);
    for tool in ["t0", "t1", "t2"] {
        setup.connections[1] = setup.connections[1]
            .clone()
            .with_eager_tool(ToolName::new(tool).unwrap());
    }
    let settings = Settings::builder()
        .facade_max_index_tokens(1)
        .tool_cap(6)
        .build()
        .unwrap();
    // a is deferred too; 3 eager + 3 meta + orientation is 7, over 6: x's set is dropped
    // (4 left), and 2 of its 3 come back.
    let surface = setup.resolve(&settings);
    let x = surface.server("x").unwrap();
    let names: Vec<&str> = x.eager.iter().map(ToolName::as_str).collect();
    assert_eq!(names, ["t0", "t1"]);
    assert_eq!(surface.tools().len(), 6);
    assert_eq!(surface.server("a").unwrap().why, Why::ToolCap);
}
