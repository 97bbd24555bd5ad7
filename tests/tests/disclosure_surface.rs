//! psych-disclosure's Surface plugged into psych-prompt-assembly, with psych-elision's real
//! token estimator: every shape of the fixture catalogues renders for both providers (the
//! exposed names pass the provider name rule, the deferred lines go in zone 1 as capability
//! notes), and a disconnect does not change a byte of the request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_disclosure::{Inputs, Settings, Shape, Surface, resolve};
use psych_elision::Estimator;
use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, Preload, Reachability, ServerCatalog,
    ServerHealth, ServerId,
};

use crate::common;
use crate::common::fixture_tools;

fn setup(
    preload: Preload,
    reachability: Reachability,
) -> (Vec<ConnectionSpec>, Vec<ServerCatalog>, PermissionGrant) {
    let fixtures = [
        ("github", "github.tools.json"),
        ("notion", "notion.tools.json"),
        ("playwright", "playwright.tools.json"),
        ("filesystem", "server-filesystem.tools.json"),
        ("memory", "server-memory.tools.json"),
    ];
    let mut connections = Vec::new();
    let mut catalogs = Vec::new();
    let mut grant = PermissionGrant::none();
    for (server, file) in fixtures {
        let id = ServerId::new(server).unwrap();
        let mut tools = fixture_tools(file);
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        catalogs.push(ServerCatalog {
            server: id.clone(),
            version: CatalogVersion(1),
            tools: tools.into(),
            health: ServerHealth {
                reachability: reachability.clone(),
                ..ServerHealth::default()
            },
        });
        connections.push(
            ConnectionSpec::new(id.clone())
                .with_description(format!("The {server} server."))
                .with_preload(preload),
        );
        grant = grant.allow_server(id);
    }
    (connections, catalogs, grant)
}

fn surface(preload: Preload, reachability: Reachability, settings: &Settings) -> Surface {
    let (connections, catalogs, grant) = setup(preload, reachability);
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    resolve(&inputs, settings, &Estimator::new()).unwrap()
}

/// The request bodies of a one-message conversation over `surface`.
fn render(surface: &Surface) -> (String, String) {
    common::render(surface, "Open an issue about the flaky test.")
}

#[test]
fn every_shape_renders_for_both_providers() {
    let up = || Reachability::Reachable;
    let shapes = [
        (Preload::Auto, Settings::default()),
        (
            Preload::Eager,
            Settings::builder().direct_max_tools(0).build().unwrap(),
        ),
        (
            Preload::Eager,
            Settings::builder()
                .direct_max_tools(0)
                .facade_max_index_tokens(0)
                .build()
                .unwrap(),
        ),
        (Preload::Deferred, Settings::default()),
        (
            Preload::Eager,
            Settings::builder()
                .direct_max_tools(1_000)
                .direct_max_tokens(u64::MAX)
                .build()
                .unwrap(),
        ),
    ];
    for (preload, settings) in shapes {
        let surface = surface(preload, up(), &settings);
        let (anthropic, openai) = render(&surface);
        for tool in surface.tools() {
            let needle = format!("\"name\":\"{}\"", tool.name);
            assert!(anthropic.contains(&needle), "{needle}");
            assert!(openai.contains(&needle), "{needle}");
        }
        for line in surface.deferred_lines() {
            assert!(anthropic.contains(line.as_str()), "{line}");
        }
    }
}

#[test]
fn the_real_estimator_makes_the_same_auto_decisions_as_the_test_stand_in() {
    let surface = surface(Preload::Auto, Reachability::Reachable, &Settings::default());
    let shapes: Vec<(&str, Shape)> = surface
        .servers()
        .iter()
        .map(|v| (v.server.as_str(), v.shape))
        .collect();
    assert_eq!(
        shapes,
        [
            ("filesystem", Shape::Direct),
            ("github", Shape::Deferred),
            ("memory", Shape::Direct),
            ("notion", Shape::Deferred),
            ("playwright", Shape::Direct),
        ]
    );
}

#[test]
fn a_disconnect_does_not_change_a_byte_of_the_request() {
    let settings = Settings::default();
    let before = render(&surface(Preload::Auto, Reachability::Reachable, &settings));
    let after = render(&surface(
        Preload::Auto,
        Reachability::Unreachable {
            reason: "exited with status 1".into(),
        },
        &settings,
    ));
    assert_eq!(before, after);
}
