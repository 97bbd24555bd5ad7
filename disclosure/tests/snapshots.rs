//! The exact bytes the model gets, reviewed as snapshots: the Surface of the fixture
//! catalogues under each shape, the deferred lines, the meta tools, and the orientation
//! payload (default and verbose).
//!
//! Psych's own tool definitions (meta tools, facades, search pairs, orientation) are shown
//! whole; a direct tool, which is the server's own definition under its exposed name, is
//! shown as its name, size and first description line.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::fmt::Write;

use crate::common::{Setup, fixture_setup, tool_bytes};
use psych_disclosure::{Exposed, OrientationContext, Settings, Surface, orientation};
use psych_types::Preload;
use serde_json::json;

/// The Surface as reviewable text.
fn render(surface: &Surface) -> String {
    let mut out = String::from("servers:\n");
    for view in surface.servers() {
        writeln!(
            out,
            "  {}: {:?} ({:?}), {} permitted, {:?} tokens, eager {:?}",
            view.server,
            view.shape,
            view.why,
            view.permitted,
            view.cost,
            view.eager.iter().map(|t| t.as_str()).collect::<Vec<_>>()
        )
        .unwrap();
    }
    writeln!(out, "tools ({}):", surface.tools().len()).unwrap();
    for tool in surface.tools() {
        match surface.exposed(tool.name.as_str()) {
            Some(Exposed::Direct { target }) => writeln!(
                out,
                "  {} -> {target}, {} bytes: {}",
                tool.name,
                tool_bytes(tool),
                tool.description_or_empty().lines().next().unwrap_or("")
            )
            .unwrap(),
            other => {
                let json = serde_json::json!({
                    "name": tool.name.as_str(),
                    "description": tool.description_or_empty(),
                    "input_schema": tool.input_schema,
                });
                writeln!(
                    out,
                    "  {} ({other:?}, {} bytes):\n{}",
                    tool.name,
                    tool_bytes(tool),
                    serde_json::to_string_pretty(&json).unwrap()
                )
                .unwrap();
            }
        }
    }
    writeln!(out, "deferred lines:").unwrap();
    for line in surface.deferred_lines() {
        writeln!(out, "  {line}").unwrap();
    }
    out
}

fn check(name: &str, setup: &Setup, settings: &Settings) {
    let surface = setup.resolve(settings);
    insta::assert_snapshot!(name, render(&surface));
}

#[test]
fn auto_defaults() {
    check(
        "surface_auto_defaults",
        &fixture_setup(Preload::Auto),
        &Settings::default(),
    );
}

#[test]
fn every_server_direct() {
    let settings = Settings::builder()
        .direct_max_tools(1_000)
        .direct_max_tokens(u64::MAX)
        .tool_cap(1_000)
        .build()
        .unwrap();
    check("surface_direct", &fixture_setup(Preload::Eager), &settings);
}

#[test]
fn every_server_direct_under_the_default_cap() {
    let settings = Settings::builder()
        .direct_max_tools(1_000)
        .direct_max_tokens(u64::MAX)
        .build()
        .unwrap();
    check(
        "surface_direct_capped",
        &fixture_setup(Preload::Eager),
        &settings,
    );
}

#[test]
fn every_server_a_facade() {
    let settings = Settings::builder().direct_max_tools(0).build().unwrap();
    check("surface_facade", &fixture_setup(Preload::Eager), &settings);
}

#[test]
fn every_server_a_search_pair() {
    let settings = Settings::builder()
        .direct_max_tools(0)
        .facade_max_index_tokens(0)
        .build()
        .unwrap();
    check(
        "surface_search_pair",
        &fixture_setup(Preload::Eager),
        &settings,
    );
}

#[test]
fn every_server_deferred_with_eager_tools() {
    let mut setup = fixture_setup(Preload::Deferred);
    setup.connections[0] = setup.connections[0]
        .clone()
        .with_eager_tool("get_me".parse().unwrap())
        .with_eager_tool("not_a_tool".parse().unwrap());
    check("surface_deferred", &setup, &Settings::default());
}

fn context() -> OrientationContext {
    OrientationContext {
        tenant: json!({"id": "t-42", "business_name": "Acme Plumbing", "timezone": "Europe/Paris"}),
        user: json!({"persona": "operator"}),
        conventions: json!({
            "branches": "Open pull requests against main; never push to main.",
            "long_rule": "Always ".repeat(120),
        }),
        operational_state: json!({"open_incidents": 2, "on_call": "dana"}),
    }
}

#[test]
fn orientation_default_and_verbose() {
    let setup = fixture_setup(Preload::Auto);
    let surface = setup.resolve(&Settings::default());
    for (name, verbose) in [
        ("orientation_default", false),
        ("orientation_verbose", true),
    ] {
        let payload = orientation(&surface, &setup.live(), &context(), verbose);
        let value = serde_json::to_value(&payload).unwrap();
        insta::assert_snapshot!(name, serde_json::to_string_pretty(&value).unwrap());
    }
}
