//! Helpers the catalogue's tests and benches share: the real fixture catalogues, and lists of
//! any size built from them.

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "shared by several test binaries, each using a part; a test fails loudly on bad data"
)]

use std::path::PathBuf;

use psych_types::{ToolDefinition, ToolList, ToolName};

/// The `shared/fixtures/catalogs` folder beside the checkout (or `$PSYCH_FIXTURES/catalogs`).
pub fn catalogs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir).join("catalogs");
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures/catalogs"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures/catalogs above {}", manifest.display()))
}

/// One fixture catalogue's tools, by file name (`"github.tools.json"`, …).
pub fn catalogue(file: &str) -> Vec<ToolDefinition> {
    let text = std::fs::read_to_string(catalogs_dir().join(file)).unwrap();
    serde_json::from_str::<ToolList>(&text).unwrap().tools
}

/// `n` distinct tools: the fixture tools in turn, the k-th renamed `<name>.<k>`.
pub fn tools(n: usize) -> Vec<ToolDefinition> {
    let base = fixture_tools();
    (0..n)
        .map(|k| {
            let mut tool = base[k % base.len()].clone();
            tool.name = ToolName::new(format!("{}.{k}", tool.name)).unwrap();
            tool
        })
        .collect()
}

/// Every tool of the six fixture catalogues (306), in file order.
pub fn fixture_tools() -> Vec<ToolDefinition> {
    let mut out = Vec::new();
    for file in [
        "github.tools.json",
        "github.tools.full.json",
        "notion.tools.json",
        "playwright.tools.json",
        "server-filesystem.tools.json",
        "server-memory.tools.json",
    ] {
        out.extend(catalogue(file));
    }
    out
}
