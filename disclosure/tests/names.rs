//! Name tricks: case variants, Unicode look-alikes, `server__tool` smuggled into a tool
//! name, dotted, empty and over-long names. Each is refused or mapped exactly, never to the
//! wrong tool.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::HashSet;

use crate::common::{Setup, catalog};
use psych_disclosure::{CALL_TOOL, Exposed, Refusal, Settings, Validators, Verdict};
use psych_types::{
    ConnectionSpec, PermissionGrant, Preload, ServerId, ToolDefinition, ToolName, ToolRef,
};
use serde_json::json;

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition::new(
        ToolName::new(name).unwrap(),
        format!("The tool {name}"),
        serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
    )
}

/// Servers and tools chosen to collide every way the naming scheme allows.
fn tricky() -> Setup {
    let long_a = format!("{}a", "x".repeat(127));
    let long_b = format!("{}b", "x".repeat(127));
    let servers: Vec<(&str, Vec<String>)> = vec![
        (
            "s",
            vec![
                "get_me".into(),
                "Get_Me".into(),
                "GET_ME".into(),
                "a.b".into(),
                "a_b".into(),
                "x__y".into(),
                long_a,
                long_b,
            ],
        ),
        ("s__x", vec!["y".into()]),
        ("psych", vec!["list_tools".into(), "call_tool".into()]),
        ("psych_call_tool", vec!["t".into()]),
    ];
    let mut setup = Setup {
        connections: Vec::new(),
        catalogs: Vec::new(),
        grant: PermissionGrant::none(),
    };
    for (server, tools) in servers {
        let id = ServerId::new(server).unwrap();
        let mut tools: Vec<_> = tools.iter().map(|t| tool(t)).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        setup.catalogs.push(catalog(server, tools));
        setup
            .connections
            .push(ConnectionSpec::new(id.clone()).with_preload(Preload::Eager));
        setup.grant = std::mem::take(&mut setup.grant).allow_server(id);
    }
    setup
}

fn settings() -> Settings {
    Settings::builder().direct_max_tools(100).build().unwrap()
}

#[test]
fn every_name_is_safe_unique_and_maps_back_to_its_own_pair() {
    let setup = tricky();
    let surface = setup.resolve(&settings());
    let mut lower = HashSet::new();
    let mut pairs = HashSet::new();
    for t in surface.tools() {
        let name = t.name.as_str();
        assert!(
            !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{name}"
        );
        assert!(
            lower.insert(name.to_ascii_lowercase()),
            "{name} collides ignoring case"
        );
        if let Some(Exposed::Direct { target }) = surface.exposed(name) {
            assert!(pairs.insert(target.clone()));
            // The definition is the target's own, under the exposed name.
            assert_eq!(
                t.description_or_empty(),
                format!("The tool {}", target.tool)
            );
            assert_eq!(surface.direct_name(target), Some(name));
        }
    }
    // Every permitted pair is exposed directly, exactly once.
    assert_eq!(pairs.len(), 12);
    assert_eq!(surface.permitted().len(), 12);
}

#[test]
fn the_names_are_these() {
    let setup = tricky();
    let surface = setup.resolve(&settings());
    let table: Vec<String> = surface
        .names()
        .map(|(name, exposed)| format!("{name} -> {exposed:?}"))
        .collect();
    insta::assert_snapshot!("tricky_names", table.join("\n"));
}

#[test]
fn variants_look_alikes_and_smuggled_names_are_refused_or_exact() {
    let setup = tricky();
    let surface = setup.resolve(&settings());
    let live = setup.live();
    let validators = Validators::new();
    let call = |name: &str| surface.guard(name, &json!({}), &live, &validators);
    // Case variants and look-alikes of an exposed name are not exposed names.
    for name in [
        "s__get_me",
        "S__get_me",
        "s__GET_me",
        "s__get_mе",
        "ｓ__get_me",
        "",
        "s__get_me ",
        &"s".repeat(65),
    ] {
        assert_eq!(
            call(name),
            Verdict::Refused(Refusal::UnknownName { name: name.into() }),
            "{name:?}"
        );
    }
    // Exact names reach exactly their own tool.
    let get_me = ToolRef::parse("s", "get_me").unwrap();
    let hashed = surface.direct_name(&get_me).unwrap().to_owned();
    assert!(
        hashed.starts_with("s__get_me_"),
        "{hashed}: case variants all get hashed names"
    );
    for (name, pair) in [
        (hashed.as_str(), ("s", "get_me")),
        ("s__a_b", ("s", "a_b")),
        ("psych__call_tool", ("psych", "call_tool")),
    ] {
        match call(name) {
            Verdict::Forward(f) => assert_eq!(f.target, ToolRef::parse(pair.0, pair.1).unwrap()),
            other => panic!("{name}: {other:?}"),
        }
    }
    // The ambiguous `s__x__y` is neither (s, x__y) nor (s__x, y): both are hashed.
    assert!(surface.exposed("s__x__y").is_none());
}

#[test]
fn meta_calls_take_the_pair_literally() {
    let mut setup = tricky();
    for connection in &mut setup.connections {
        connection.preload = Preload::Deferred;
    }
    let surface = setup.resolve(&settings());
    let live = setup.live();
    let validators = Validators::new();
    let call = |server: &str, tool: &str| {
        surface.guard(
            CALL_TOOL,
            &json!({"server": server, "tool": tool}),
            &live,
            &validators,
        )
    };
    let target = |v: Verdict| match v {
        Verdict::Forward(f) => f.target.to_string(),
        Verdict::Refused(r) => r.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(target(call("s", "x__y")), "s/x__y");
    assert_eq!(target(call("s__x", "y")), "s__x/y");
    assert_eq!(
        target(call("s", "x")),
        "tool \"x\" is not available on server s"
    );
    assert_eq!(target(call("s__x__y", "")), "unknown server \"s__x__y\"");
    assert_eq!(target(call("s", "get_me")), "s/get_me");
    assert_eq!(target(call("s", "Get_Me")), "s/Get_Me");
    assert_eq!(
        target(call("s", "get_mе")),
        "tool \"get_mе\" is not available on server s"
    );
    assert_eq!(target(call("S", "get_me")), "unknown server \"S\"");
    assert_eq!(
        target(call("s", "")),
        "tool \"\" is not available on server s"
    );
    let long = "x".repeat(200);
    assert_eq!(
        target(call("s", &long)),
        format!("tool \"{long}\" is not available on server s")
    );
    assert_eq!(target(call("s", "a.b")), "s/a.b");
}
