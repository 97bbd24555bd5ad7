//! What provider-native deferral reads from a Surface: the deferred tools under qualified
//! names unique across the whole Surface, their definitions, the tools sent beside them,
//! the search over them, and a loaded tool's call guarded like a direct one.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common::Setup;
use psych_disclosure::{Exposed, Live, Refusal, Settings, Surface, Validators, Verdict};
use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, Preload, ServerCatalog, ServerHealth,
    ServerId, ToolDefinition, ToolName, ToolRef,
};
use serde_json::json;

fn tool(name: &str, description: &str, required: &str) -> ToolDefinition {
    ToolDefinition::new(
        ToolName::new(name).unwrap(),
        description,
        serde_json::from_value(json!({
            "type": "object",
            "properties": {required: {"type": "string"}},
            "required": [required],
        }))
        .unwrap(),
    )
}

fn id(s: &str) -> ServerId {
    ServerId::new(s).unwrap()
}

fn catalog(server: &str, tools: Vec<ToolDefinition>) -> ServerCatalog {
    let mut tools = tools;
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    ServerCatalog {
        server: id(server),
        version: CatalogVersion(1),
        tools: tools.into(),
        health: ServerHealth::default(),
    }
}

/// `crm` is deferred (one tool eager, one outside the grant); `a__b` is direct with a tool
/// `c`, whose natural name `a__b__c` is also the deferred `a`/`b__c`'s; `a` is deferred.
fn world() -> Setup {
    let crm = vec![
        tool("create_contact", "Create a contact in the CRM.", "email"),
        tool(
            "export_invoice",
            "Export an invoice as a PDF.",
            "invoice_id",
        ),
        tool("delete_everything", "Delete every record.", "confirm"),
        tool("get_me", "The signed-in user.", "fields"),
    ];
    let connections = vec![
        ConnectionSpec::new(id("crm"))
            .with_preload(Preload::Deferred)
            .with_eager_tool(ToolName::new("get_me").unwrap()),
        ConnectionSpec::new(id("a__b")).with_preload(Preload::Eager),
        ConnectionSpec::new(id("a")).with_preload(Preload::Deferred),
    ];
    let catalogs = vec![
        catalog("crm", crm),
        catalog("a__b", vec![tool("c", "Direct c.", "x")]),
        catalog("a", vec![tool("b__c", "Deferred b__c.", "y")]),
    ];
    let grant = PermissionGrant::none()
        .allow_tool(ToolRef::parse("crm", "create_contact").unwrap())
        .allow_tool(ToolRef::parse("crm", "export_invoice").unwrap())
        .allow_tool(ToolRef::parse("crm", "get_me").unwrap())
        .allow_server(id("a__b"))
        .allow_server(id("a"));
    Setup {
        connections,
        catalogs,
        grant,
    }
}

fn deferred_name<'s>(surface: &'s Surface, server: &str, tool: &str) -> &'s str {
    surface
        .deferred_names()
        .find(|(_, t)| t.server.as_str() == server && t.tool.as_str() == tool)
        .map(|(name, _)| name)
        .unwrap()
}

#[test]
fn deferred_tools_are_the_permitted_ones_under_names_unique_across_the_surface() {
    let world = world();
    let surface = world.resolve(&Settings::default());
    let pairs: Vec<String> = surface
        .deferred_names()
        .map(|(_, t)| t.to_string())
        .collect();
    // Not the tool outside the grant, not the eager tool (direct already).
    assert_eq!(
        pairs,
        ["a/b__c", "crm/create_contact", "crm/export_invoice"]
    );
    assert!(surface.exposed("crm__get_me").is_some());
    assert_eq!(surface.exposed("crm__delete_everything"), None);
    // The direct `a__b`/`c` and the deferred `a`/`b__c` both want `a__b__c`: both hashed.
    let direct = surface
        .direct_name(&ToolRef::parse("a__b", "c").unwrap())
        .unwrap();
    let deferred = deferred_name(&surface, "a", "b__c");
    assert_ne!(direct, deferred);
    assert!(direct.starts_with("a__b__c_") && deferred.starts_with("a__b__c_"));
    // Every name, tools and deferred alike, unique ignoring ASCII case.
    let mut all: Vec<String> = surface
        .names()
        .map(|(n, _)| n.to_ascii_lowercase())
        .chain(
            surface
                .deferred_names()
                .map(|(n, _)| n.to_ascii_lowercase()),
        )
        .collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count);
    // Deferred names resolve, and are none of the tools.
    assert_eq!(
        surface.exposed("crm__export_invoice"),
        Some(&Exposed::Deferred {
            target: ToolRef::parse("crm", "export_invoice").unwrap()
        })
    );
    assert!(
        surface
            .tools()
            .iter()
            .all(|t| t.name.as_str() != "crm__export_invoice")
    );
}

#[test]
fn definitions_and_the_tools_beside_them() {
    let world = world();
    let surface = world.resolve(&Settings::default());
    let deferred = surface.deferred_tools();
    let names: Vec<&str> = deferred.iter().map(|t| t.name.as_str()).collect();
    let expected: Vec<&str> = surface.deferred_names().map(|(n, _)| n).collect();
    assert_eq!(names, expected);
    let export = deferred
        .iter()
        .find(|t| t.name.as_str() == "crm__export_invoice")
        .unwrap();
    assert_eq!(export.description_or_empty(), "Export an invoice as a PDF.");
    assert_eq!(export.input_schema["required"], json!(["invoice_id"]));
    // The meta tools are left out natively; everything else stays.
    let native: Vec<String> = surface
        .native_tools()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        surface
            .tools()
            .iter()
            .any(|t| t.name.as_str() == "psych_call_tool")
    );
    assert!(
        native
            .iter()
            .all(|n| !n.starts_with("psych_") || n == "psych_orientation")
    );
    assert!(native.iter().any(|n| n == "crm__get_me"));
    assert_eq!(native.len() + 3, surface.tools().len());
}

#[test]
fn a_loaded_tool_is_guarded_like_a_direct_one() {
    let world = world();
    let surface = world.resolve(&Settings::default());
    let live = world.live();
    let validators = Validators::new();
    let name = "crm__export_invoice";
    let verdict = surface.guard(name, &json!({"invoice_id": "inv-7"}), &live, &validators);
    let Verdict::Forward(forward) = verdict else {
        panic!("forwarded: {verdict:?}")
    };
    assert_eq!(forward.target.to_string(), "crm/export_invoice");
    // Arguments are validated against the tool's own schema.
    let Verdict::Refused(Refusal::InvalidArguments { errors, .. }) =
        surface.guard(name, &json!({"invoice_id": 7}), &live, &validators)
    else {
        panic!("invalid arguments")
    };
    assert_eq!(errors[0].path, "/invoice_id");
    // A tool outside the grant has no name at all.
    assert!(matches!(
        surface.guard(
            "crm__delete_everything",
            &json!({"confirm": "y"}),
            &live,
            &validators
        ),
        Verdict::Refused(Refusal::UnknownName { .. })
    ));
    // Permission is re-checked at call time: revoked since resolution, refused now, and
    // the search no longer names it.
    let revoked = PermissionGrant::none()
        .allow_tool(ToolRef::parse("crm", "create_contact").unwrap())
        .allow_server(id("a"));
    let now = Live {
        grant: &revoked,
        catalogs: &world.catalogs,
    };
    assert!(matches!(
        surface.guard(name, &json!({"invoice_id": "inv-7"}), &now, &validators),
        Verdict::Refused(Refusal::NotAvailable { .. })
    ));
    assert_eq!(
        surface.search_deferred("export invoice pdf", &live, 5),
        ["crm__export_invoice"]
    );
    assert!(
        surface
            .search_deferred("export invoice pdf", &now, 5)
            .is_empty()
    );
    assert_eq!(
        surface.search_deferred("contact", &now, 5),
        ["crm__create_contact"]
    );
    // A query nothing matches says so.
    let (names, note) = surface.search_deferred_noted("bake a chocolate cake", &live, 5);
    assert!(names.is_empty());
    assert_eq!(
        note.as_deref(),
        Some("No tool matches \"bake a chocolate cake\". Try other words.")
    );
    assert_eq!(
        surface
            .search_deferred_noted("export invoice pdf", &live, 5)
            .1,
        None
    );
}
