//! psych-mcp's generated catalogues (the `psych` command's embedded servers) measured against
//! the real ones in `shared/fixtures/catalogs/`: the share of tools with `$ref`, `anyOf` or
//! `oneOf`, enums and non-ASCII text, nesting depth, description lengths and bytes per tool,
//! side by side in one snapshot; each kind compared with the server it stands for. Then
//! every generated schema goes through the parts that consume it: disclosure's guard
//! compiles it and checks arguments with it, and the surfaces it makes render into
//! requests both providers accept (the rule checker of psych-prompt-assembly's tests).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::fmt::Write as _;

use psych_disclosure::{Inputs, Live, Settings, Surface, Validation, Validators, Verdict, resolve};
use psych_elision::Estimator;
use psych_test_server::{SyntheticKind, synthetic_catalog};
use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, Preload, ServerCatalog, ServerHealth,
    ServerId, ToolDefinition,
};
use serde_json::{Value, json};

use crate::common;
use crate::common::fixture_tools;

use psych_test_support::rules;

/// The embedded servers of the `psych` command: kind and size (psych-cli's `setup.rs`).
const EMBEDDED: [(SyntheticKind, usize); 5] = [
    (SyntheticKind::Notes, 9),
    (SyntheticKind::Files, 14),
    (SyntheticKind::Wiki, 24),
    (SyntheticKind::Forge, 117),
    (SyntheticKind::Suite, 480),
];

/// The real catalogue each kind stands for (suite: all of them).
fn real_of(kind: SyntheticKind) -> &'static [&'static str] {
    match kind {
        SyntheticKind::Notes => &["server-memory"],
        SyntheticKind::Files => &["server-filesystem"],
        SyntheticKind::Wiki => &["notion"],
        SyntheticKind::Forge => &["github"],
        _ => &ALL_REAL,
    }
}

const ALL_REAL: [&str; 5] = [
    "github",
    "notion",
    "playwright",
    "server-filesystem",
    "server-memory",
];

fn real(name: &str) -> Vec<ToolDefinition> {
    fixture_tools(&format!("{name}.tools.json"))
}

fn has_key(value: &Value, keys: &[&str]) -> bool {
    match value {
        Value::Object(map) => {
            keys.iter().any(|k| map.contains_key(*k)) || map.values().any(|v| has_key(v, keys))
        }
        Value::Array(items) => items.iter().any(|v| has_key(v, keys)),
        _ => false,
    }
}

/// Levels of `properties`/`items` below `schema`; `anyOf`/`oneOf`/`allOf` branches and
/// `$defs` entries at the same level; `$ref` not followed.
fn depth(schema: &Value, at: usize) -> usize {
    let mut deepest = at;
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for prop in props.values() {
            deepest = deepest.max(depth(prop, at + 1));
        }
    }
    if let Some(items) = schema.get("items").filter(|v| v.is_object()) {
        deepest = deepest.max(depth(items, at + 1));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            deepest = deepest.max(depth(branch, at));
        }
    }
    if let Some(defs) = schema.get("$defs").and_then(Value::as_object) {
        for def in defs.values() {
            deepest = deepest.max(depth(def, at));
        }
    }
    deepest
}

/// The figures of one catalogue (per mille shares, so they compare as integers).
#[derive(Debug)]
struct Figures {
    tools: usize,
    refs: usize,
    any_of: usize,
    enums: usize,
    non_ascii: usize,
    depths: [usize; 5],
    /// Description characters at the 10th, 50th and 90th percentile, and the longest.
    description: [usize; 4],
    mean_bytes: usize,
}

impl Figures {
    fn of(tools: &[ToolDefinition]) -> Self {
        let n = tools.len();
        let schemas: Vec<Value> = tools
            .iter()
            .map(|t| Value::Object(t.input_schema.clone()))
            .collect();
        let count = |f: &dyn Fn(usize) -> bool| (0..n).filter(|i| f(*i)).count();
        let mut lengths: Vec<usize> = tools
            .iter()
            .map(|t| t.description_or_empty().chars().count())
            .collect();
        lengths.sort_unstable();
        let pct = |p: usize| lengths[(p * (n - 1) + 50) / 100];
        let mut depths = [0; 5];
        for schema in &schemas {
            depths[depth(schema, 0).min(4)] += 1;
        }
        let bytes: usize = tools
            .iter()
            .map(|t| serde_json::to_vec(t).unwrap().len())
            .sum();
        Self {
            tools: n,
            refs: count(&|i| has_key(&schemas[i], &["$ref"])),
            any_of: count(&|i| has_key(&schemas[i], &["anyOf", "oneOf"])),
            enums: count(&|i| has_key(&schemas[i], &["enum"])),
            non_ascii: count(&|i| !serde_json::to_string(&tools[i]).unwrap().is_ascii()),
            depths,
            description: [pct(10), pct(50), pct(90), lengths[n - 1]],
            mean_bytes: bytes / n,
        }
    }

    fn share(&self, count: usize) -> usize {
        count * 1000 / self.tools
    }

    fn row(&self, name: &str) -> String {
        let pc = |count: usize| format!("{:.1}%", count as f64 * 100.0 / self.tools as f64);
        let depths: Vec<String> = self.depths.iter().map(|d| pc(*d)).collect();
        let [p10, p50, p90, max] = self.description;
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {p50} ({p10}–{p90}), max {max} | {} |",
            self.tools,
            pc(self.refs),
            pc(self.any_of),
            pc(self.enums),
            pc(self.non_ascii),
            depths.join(" / "),
            self.mean_bytes
        )
    }
}

fn within(what: &str, generated: usize, real: usize, tolerance: usize) {
    assert!(
        generated.abs_diff(real) <= tolerance,
        "{what}: generated {generated}, real {real} (tolerance {tolerance})"
    );
}

#[test]
fn generated_catalogues_have_the_figures_of_the_real_ones() {
    let mut table = String::from(
        "| catalogue | tools | $ref | anyOf/oneOf | enum | non-ASCII | depth 0/1/2/3/4 | description chars: median (p10–p90) | bytes/tool |\n\
         |---|---:|---:|---:|---:|---:|---|---|---:|\n",
    );
    for name in ALL_REAL {
        writeln!(table, "{}", Figures::of(&real(name)).row(name)).unwrap();
    }
    let all: Vec<ToolDefinition> = ALL_REAL.iter().flat_map(|name| real(name)).collect();
    writeln!(table, "{}", Figures::of(&all).row("all real")).unwrap();
    let mut compared = Vec::new();
    for (kind, size) in EMBEDDED {
        let generated = Figures::of(&synthetic_catalog(kind, size));
        writeln!(
            table,
            "{}",
            generated.row(&format!("generated {}", kind.name()))
        )
        .unwrap();
        compared.push((kind, size, generated));
    }
    // Printed first, so a figure out of bounds shows beside all the others.
    println!("{table}");
    for (kind, size, generated) in compared {
        let real: Vec<ToolDefinition> = real_of(kind).iter().flat_map(|n| real(n)).collect();
        let real = Figures::of(&real);
        let what = |figure: &str| format!("{} {figure}", kind.name());
        // Shares within 10 points (a handful of tools on the small servers), the median
        // description within a third, the longest within half, bytes per tool within 40%.
        let slack = 100.max(1000 / size);
        within(
            &what("$ref"),
            generated.share(generated.refs),
            real.share(real.refs),
            slack,
        );
        within(
            &what("anyOf"),
            generated.share(generated.any_of),
            real.share(real.any_of),
            slack,
        );
        within(
            &what("enum"),
            generated.share(generated.enums),
            real.share(real.enums),
            slack,
        );
        within(
            &what("non-ASCII"),
            generated.share(generated.non_ascii),
            real.share(real.non_ascii),
            slack,
        );
        within(
            &what("median description"),
            generated.description[1],
            real.description[1],
            real.description[1] / 3,
        );
        within(
            &what("longest description"),
            generated.description[3],
            real.description[3],
            real.description[3] / 2,
        );
        within(
            &what("bytes per tool"),
            generated.mean_bytes,
            real.mean_bytes,
            real.mean_bytes * 2 / 5,
        );
        let deepest = |f: &Figures| f.depths.iter().rposition(|d| *d > 0).unwrap();
        within(&what("deepest"), deepest(&generated), deepest(&real), 1);
    }
    insta::assert_snapshot!(table);
}

/// Arguments that meet the schema's `required` list with values of the declared types.
fn arguments(schema: &psych_types::JsonObject) -> Value {
    let mut args = serde_json::Map::new();
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let value = match schema["properties"][name]["type"].as_str() {
            Some("integer" | "number") => json!(3),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("x-1"),
        };
        args.insert(name.to_owned(), value);
    }
    Value::Object(args)
}

/// The embedded servers as catalogues, connections and a grant for all of them.
fn embedded(preload: Preload) -> (Vec<ConnectionSpec>, Vec<ServerCatalog>, PermissionGrant) {
    let mut connections = Vec::new();
    let mut catalogs = Vec::new();
    let mut grant = PermissionGrant::none();
    for (kind, size) in EMBEDDED {
        let id = ServerId::new(kind.name()).unwrap();
        let mut tools = synthetic_catalog(kind, size);
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        catalogs.push(ServerCatalog {
            server: id.clone(),
            version: CatalogVersion(1),
            tools: tools.into(),
            health: ServerHealth::default(),
        });
        connections.push(
            ConnectionSpec::new(id.clone())
                .with_description(format!("The {} server.", kind.name()))
                .with_preload(preload),
        );
        grant = grant.allow_server(id);
    }
    (connections, catalogs, grant)
}

#[test]
fn every_generated_schema_compiles_and_checks_arguments() {
    let (connections, catalogs, grant) = embedded(Preload::Deferred);
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = resolve(&inputs, &Settings::default(), &Estimator::new()).unwrap();
    let live = Live {
        grant: &grant,
        catalogs: &catalogs,
    };
    let validators = Validators::new();
    let mut refused = 0;
    for catalog in &catalogs {
        for tool in catalog.tools.iter() {
            let call = |arguments: Value| json!({"server": catalog.server.as_str(), "tool": tool.name.as_str(), "arguments": arguments});
            let good = arguments(&tool.input_schema);
            match surface.guard("psych_call_tool", &call(good.clone()), &live, &validators) {
                Verdict::Forward(forward) => assert_eq!(
                    forward.validation,
                    Validation::Checked,
                    "{}/{}",
                    catalog.server,
                    tool.name
                ),
                other => panic!("{}/{} {good}: {other:?}", catalog.server, tool.name),
            }
            // A required argument of the wrong type is refused: the schema is enforced.
            if let Some((name, _)) = good.as_object().unwrap().iter().next() {
                let mut bad = good.clone();
                bad[name] = json!({"not": "this"});
                let verdict = surface.guard("psych_call_tool", &call(bad), &live, &validators);
                assert!(
                    matches!(verdict, Verdict::Refused(_)),
                    "{}/{}: {verdict:?}",
                    catalog.server,
                    tool.name
                );
                refused += 1;
            }
        }
    }
    assert!(refused > 600, "{refused} tools have a required argument");
}

/// The request bodies of a one-message conversation over `surface`.
fn render(surface: &Surface) -> (String, String) {
    common::render(surface, "Find last week's invoices.")
}

#[test]
fn every_generated_tool_renders_into_requests_both_providers_accept() {
    // Each kind alone as direct tools (suite in slices under the 128-tool cap), then all
    // five as the `psych` command resolves them.
    let direct = Settings::builder()
        .direct_max_tools(1_000)
        .direct_max_tokens(u64::MAX)
        .build()
        .unwrap();
    let (connections, catalogs, grant) = embedded(Preload::Eager);
    let mut rendered_tools = 0;
    for (connection, catalog) in connections.iter().zip(&catalogs) {
        for slice in catalog.tools.chunks(100) {
            let catalogs = [ServerCatalog {
                tools: slice.to_vec().into(),
                ..catalog.clone()
            }];
            let inputs = Inputs {
                connections: std::slice::from_ref(connection),
                catalogs: &catalogs,
                grant: &grant,
            };
            let surface = resolve(&inputs, &direct, &Estimator::new()).unwrap();
            let (anthropic, openai) = render(&surface);
            assert_eq!(rules::check_anthropic_body(&anthropic, true), Ok(()));
            assert_eq!(rules::check_openai_body(&openai), Ok(()));
            for tool in slice {
                let needle = format!("\"name\":\"{}__{}\"", catalog.server, tool.name);
                assert!(anthropic.contains(&needle), "{needle}");
                rendered_tools += 1;
            }
        }
    }
    assert_eq!(rendered_tools, 644);

    let (connections, catalogs, grant) = embedded(Preload::Auto);
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = resolve(&inputs, &Settings::default(), &Estimator::new()).unwrap();
    let (anthropic, openai) = render(&surface);
    assert_eq!(rules::check_anthropic_body(&anthropic, true), Ok(()));
    assert_eq!(rules::check_openai_body(&openai), Ok(()));
}
